#!/usr/bin/env python3
"""lowbit.torch.attention (the one call: prologue, V quantization, INT8 attention) against torch's
scaled_dot_product_attention (cuDNN, flash and memory-efficient backends, bf16) at configurations outside issue 4's
shapes: cross-attention to a short text sequence (Wan's 512 T5 tokens), grouped-query attention
(an LLM prefill, Hq 32 / Hkv 8, causal), chunked prefill (1024 new queries against 16384 keys,
bottom-right causal), the HND layout, a short image sequence and D 64 with several batch items.

TOPS = 4 * B * Hq * Nq * Nk * D / time (causal: the visible pairs only), median of CUDA-event
timings with an L2 flush before each timed call. Accuracy: lowbit's output against fp32 SDPA
(cos, relative L1) on the same inputs, N(0, 1) q / k / v.

    PYTHONPATH=.gpu/py python3 bench/attention_variants.py [--iters 20] [--json out.json]
"""
import sys

import _torch_timing  # (bench/_torch_timing.py)

# (name, B, Nq, Nk, Hq, Hkv, D, causal, layout)
CONFIGS = [
    ("Wan cross-attention (512 text keys)", 1, 32760, 512, 40, 40, 128, "none", "NHD"),
    ("Flux self-attention (reference)", 1, 4608, 4608, 24, 24, 128, "none", "NHD"),
    ("GQA prefill 32 / 8 heads, causal", 1, 8192, 8192, 32, 8, 128, "bottom_right", "NHD"),
    ("chunked prefill 1024 x 16384, GQA 32 / 8, causal", 1, 1024, 16384, 32, 8, 128,
     "bottom_right", "NHD"),
    ("HND layout", 1, 4096, 4096, 24, 24, 128, "none", "HND"),
    ("short image sequence, B 2", 2, 1024, 1024, 24, 24, 128, "none", "NHD"),
    ("D 64, B 4", 4, 4096, 4096, 16, 16, 64, "none", "NHD"),
]


def visible_pairs(nq, nk, causal):
    if causal == "none":
        return nq * nk
    # bottom-right: query i sees keys j <= i + (nk - nq)
    off = nk - nq
    return sum(max(0, min(nk, i + off + 1)) for i in range(nq))


def main() -> int:
    args = _torch_timing.script_args(__doc__, iters=20, warmup=3)
    if _torch_timing.unavailable("attention_variants.py", lowbit=True):
        return 2
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import lowbit.torch as lt

    dev = torch.device("cuda")
    time_ms = _torch_timing.timer(args)

    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'configuration':52} {'path':16} {'ms':>8} {'TOPS':>7} {'vs best SDPA':>12}  accuracy")
    for (name, b, nq, nk, hq, hkv, d, causal, layout) in CONFIGS:
        g = torch.Generator(device=dev).manual_seed(1234)
        if layout == "NHD":
            q = torch.randn(b, nq, hq, d, device=dev, dtype=torch.bfloat16, generator=g)
            k = torch.randn(b, nk, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn(b, nk, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
            qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (B, H, N, D) views
        else:
            q = torch.randn(b, hq, nq, d, device=dev, dtype=torch.bfloat16, generator=g)
            k = torch.randn(b, hkv, nk, d, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn(b, hkv, nk, d, device=dev, dtype=torch.bfloat16, generator=g)
            qh, kh, vh = q, k, v
        ops = 4.0 * b * hq * d * visible_pairs(nq, nk, causal)
        mask = None
        if causal != "none":
            i = torch.arange(nq, device=dev)[:, None]
            j = torch.arange(nk, device=dev)[None, :]
            mask = j <= i + (nk - nq)
        gqa = hq != hkv

        def sdpa(backend):
            kw = {"enable_gqa": True} if gqa else {}
            with sdpa_kernel(backend):
                if causal == "none":
                    return F.scaled_dot_product_attention(qh, kh, vh, **kw)
                if nq == nk:
                    return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, **kw)
                return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, **kw)

        results = {}
        for label, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                               ("SDPA flash", SDPBackend.FLASH_ATTENTION),
                               ("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                sdpa(backend)
                results[label] = time_ms(lambda: sdpa(backend))
            except Exception as e:  # a backend that refuses the configuration
                results[label] = None
                print(f"{name:52} {label:16} {'-':>8}  ({str(e).splitlines()[0][:60]})")
        out = lt.attention(q, k, v, layout=layout, causal=causal)
        results["lowbit fp8 PV"] = time_ms(lambda: lt.attention(q, k, v, layout=layout,
                                                                causal=causal))
        # accuracy against fp32 SDPA (math backend) on the same inputs
        with sdpa_kernel(SDPBackend.MATH):
            kw = {"enable_gqa": True} if gqa else {}
            ref = F.scaled_dot_product_attention(qh.float(), kh.float(), vh.float(),
                                                 attn_mask=mask, **kw)
        o = out.float() if layout == "HND" else out.float().transpose(1, 2)
        cos = torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()
        rel = ((o - ref).abs().sum() / ref.abs().sum()).item()
        sdpa_times = [t for lab, t in results.items() if lab.startswith("SDPA") and t]
        best = min(sdpa_times) if sdpa_times else None
        for label, t in results.items():
            if t is None:
                continue
            acc = f"cos {cos:.5f}, rel L1 {rel:.4f}" if label.startswith("lowbit") else ""
            ratio = f"{best / t:.2f}x" if best else "-"
            print(f"{name:52} {label:16} {t:8.4f} {ops / t / 1e9:7.1f} {ratio:>12}  {acc}")
            rows.append({"config": name, "path": label, "ms": t, "tops": ops / t / 1e9,
                         "vs_best_sdpa": best / t if best else None,
                         "accuracy": acc})
        del q, k, v, out, ref, o
        torch.cuda.empty_cache()
    _torch_timing.write_json(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
