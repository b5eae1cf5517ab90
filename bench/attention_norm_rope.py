#!/usr/bin/env python3
"""The attention block of a DiT as users run it: q / k RMSNorm (a learned weight per head dim),
RoPE, then attention -- torch eager with SDPA (cuDNN, bf16) against lowbit's one call with the
norm and rotation fused into its quantization passes (lowbit.torch.attention's q_norm_weight /
k_norm_weight / q_rope / k_rope), and the half-way form (torch's norm and rope, then lowbit's
attention without them).

Configurations: Flux (1, 24 heads, 4608 tokens, D 128; Flux's rotary table (1, 1, N, 64, 2, 2),
interleaved pairs, passed to lowbit as pe.transpose(1, 2)), the same at 16384 tokens (a larger
image), Qwen-Image-like joint attention (segmented norms: the text tokens' and the image tokens'
own weights, lowbit's weight rows), a video DiT shape (1, 40 heads, 32760 tokens, split-half
(cos, sin) table), and Wan 2.1 14B 720p's block (40 heads, 32760 tokens: q / k RMSNorm over all
heads (RMSNorm(5120) before the head split; lowbit's norm_scope="token") and the complex rotary
on pairs (2p, 2p + 1)). Times: the median of CUDA-event timings with an L2 flush before each call
(bench/_torch_timing.py). Accuracy: each path's output against the fp32 chain (F.rms_norm, the
rotation and SDPA's math backend in fp32), cos and relative L1, on N(0, 1) inputs.

    PYTHONPATH=.gpu/py python3 bench/attention_norm_rope.py [--iters 20] [--json out.json]
"""
import math
import sys

import _torch_timing  # (bench/_torch_timing.py)

# (name, heads, tokens, D, table: "flux" (2 x 2, interleaved), "split" ((cos, sin), halves) or
#  "complex" ((cos, sin), interleaved: Wan's freqs), text tokens with their own norm weights
#  (0: one weight), norm scope: "head" (per-head RMSNorm) or "token" (over all heads: Wan))
CONFIGS = [
    ("Flux 1024^2 (24 heads, 4608 tokens)", 24, 4608, 128, "flux", 0, "head"),
    ("Flux 2048^2 (24 heads, 16384 tokens)", 24, 16384, 128, "flux", 0, "head"),
    ("joint text + image, segmented norms", 24, 4608, 128, "flux", 512, "head"),
    ("video DiT (40 heads, 32760 tokens)", 40, 32760, 128, "split", 0, "head"),
    ("Wan 14B 720p, norm over all heads", 40, 32760, 128, "complex", 0, "token"),
]


def main() -> int:
    args = _torch_timing.script_args(__doc__, iters=20, warmup=3)
    if _torch_timing.unavailable("attention_norm_rope.py", lowbit=True):
        return 2
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import lowbit.torch as lt

    dev = torch.device("cuda")
    time_ms = _torch_timing.timer(args)

    def tables(n, d, kind):
        pos = torch.arange(n, device=dev, dtype=torch.float64)[:, None]
        ang = pos * 10000.0 ** (-torch.arange(d // 2, device=dev, dtype=torch.float64) / (d // 2))
        c, s = ang.cos().float(), ang.sin().float()
        if kind == "flux":  # (1, 1, N, D/2, 2, 2): Flux's pe
            return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)[None, None]
        return torch.stack([c, s], -1)[None, :, None]  # (1, N, 1, D/2, 2)

    def rope_torch(x, pe, kind):  # x (B, H, N, D); in x's dtype, as model code runs it
        if kind == "flux":
            x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
            return (pe[..., 0] * x_[..., 0] + pe[..., 1] * x_[..., 1]).reshape(x.shape).type_as(x)
        c, s = pe[0, :, 0, :, 0], pe[0, :, 0, :, 1]  # (N, D/2)
        if kind == "complex":  # Wan's rope_apply: (x_2p + i x_2p+1) * (cos + i sin)
            x_ = x.float().reshape(*x.shape[:-1], -1, 2)
            x0, x1 = x_[..., 0], x_[..., 1]
            return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2).type_as(x)
        x1, x2 = x.float().chunk(2, -1)
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1).type_as(x)

    def norm_torch(x, w, rows, scope="head"):  # rows: (N) indices into w (R, D) or None
        if scope == "token":  # over all heads of a token (Wan's WanRMSNorm(dim)), w (H*D)
            b, h, n, d = x.shape
            y = F.rms_norm(x.transpose(1, 2).reshape(b, n, h * d), (h * d,), w, 1e-6)
            return y.reshape(b, n, h, d).transpose(1, 2)
        if rows is None:
            return F.rms_norm(x, (x.shape[-1],), w, 1e-6)
        return F.rms_norm(x, (x.shape[-1],), None, 1e-6) * w[rows][None, None].to(x.dtype)

    rows_out = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'configuration':40} {'path':44} {'ms':>8} {'x torch':>8}  accuracy vs fp32")
    for (name, h, n, d, kind, text, scope) in CONFIGS:
        g = torch.Generator(device=dev).manual_seed(1234)
        q, k, v = (torch.randn(1, h, n, d, device=dev, dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        nw = 2 if text else 1
        wd = h * d if scope == "token" else d
        w_q = (1 + 0.3 * torch.randn(nw, wd, device=dev, generator=g)).bfloat16()
        w_k = (1 + 0.3 * torch.randn(nw, wd, device=dev, generator=g)).bfloat16()
        rows = None
        if text:  # the first `text` tokens use row 1 (the text stream's norm), the rest row 0
            rows = (torch.arange(n, device=dev) < text).to(torch.int32)
        wq, wk = (w_q, w_k) if text else (w_q[0], w_k[0])
        pe = tables(n, d, kind)
        lt_table = pe.transpose(1, 2) if kind == "flux" else pe
        inter = kind in ("flux", "complex")

        def torch_chain():
            qn = rope_torch(norm_torch(q, wq, rows, scope), pe, kind)
            kn = rope_torch(norm_torch(k, wk, rows, scope), pe, kind)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qn, kn, v)

        def half_way():
            qn = rope_torch(norm_torch(q, wq, rows, scope), pe, kind)
            kn = rope_torch(norm_torch(k, wk, rows, scope), pe, kind)
            return lt.attention(qn, kn, v, layout="HND")

        def fused():
            return lt.attention(q, k, v, layout="HND", q_norm_weight=wq, k_norm_weight=wk,
                                q_weight_rows=rows, k_weight_rows=rows, q_rope=lt_table,
                                k_rope=lt_table, rope_interleaved=inter, norm_scope=scope)

        def attention_only():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v)

        # fp32 reference of the whole block
        qf = rope_torch(norm_torch(q.float(), wq.float(), rows, scope), pe, kind)
        kf = rope_torch(norm_torch(k.float(), wk.float(), rows, scope), pe, kind)
        ref = torch.empty(1, h, n, d, device=dev)
        with sdpa_kernel(SDPBackend.MATH):
            step = 4 if n <= 16384 else 1  # the math backend's n x n fp32 scores per head
            for i in range(0, h, step):
                ref[:, i:i + step] = F.scaled_dot_product_attention(
                    qf[:, i:i + step], kf[:, i:i + step], v[:, i:i + step].float())
        del qf, kf

        paths = [("torch RMSNorm + RoPE + SDPA cuDNN (bf16)", torch_chain),
                 ("torch RMSNorm + RoPE + lowbit attention", half_way),
                 ("lowbit one call, norm + rope fused", fused),
                 ("(SDPA cuDNN alone, no norm / rope)", attention_only)]
        base = None
        for label, fn in paths:
            out = fn()
            t = time_ms(fn)
            if base is None:
                base = t
            acc = ""
            if not label.startswith("("):
                o = out.float()
                cos = F.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()
                rel = ((o - ref).abs().sum() / ref.abs().sum()).item()
                acc = f"cos {cos:.5f}, rel L1 {rel:.4f}"
            print(f"{name:40} {label:44} {t:8.4f} {base / t:7.2f}x  {acc}")
            rows_out.append({"config": name, "path": label, "ms": t, "x_torch": base / t,
                             "accuracy": acc})
            del out
        del q, k, v, ref
        torch.cuda.empty_cache()
    _torch_timing.write_json(args, rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
