#!/usr/bin/env python3
"""Times lowbit.torch.attention_varlen on packed batches of sequences against one
lowbit.torch.attention call per sequence (its form before session 50) and, where every length is
equal, against lowbit.torch.attention on the same (B, N, H, D) batch; torch's SDPA (cuDNN,
bf16) on that batch, and SDPA on a nested jagged batch of the sequences (bf16; any lengths), for
scale. Since session 51 sequences of distinct lengths run as padded buckets on CUDA.

Sequences have queries = keys, H 24, D 128, bf16 N(0, 1), fp8 P.V; median of CUDA-event timings
with an L2 flush before each timed call; TOPS = 4 H D sum(N^2) / time.

    python3 bench/attention_varlen.py [--iters 20] [--warmup 3] [--json out.json]
"""
import sys

import _torch_timing  # (bench/_torch_timing.py)

H, D = 24, 128
SETS = [("64 x 256", [256] * 64), ("16 x 1024", [1024] * 16),
        ("4 x 4608 (Flux 1024^2, batch 4)", [4608] * 4),
        ("4 x 4096 + 8 x 1024 + 16 x 256", [4096] * 4 + [1024] * 8 + [256] * 16),
        ("64 distinct lengths 192..318", [192 + 2 * i for i in range(64)]),
        ("16 distinct lengths 960..1110", [960 + 10 * i for i in range(16)])]


def main() -> int:
    args = _torch_timing.script_args(__doc__, iters=20, warmup=3)
    if _torch_timing.unavailable("attention_varlen.py"):
        return 2
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import lowbit.torch as lt

    dev = torch.device("cuda")
    time_ms = _torch_timing.timer(args)
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'sequences':34} {'form':44} {'ms':>9} {'TOPS':>7} {'x':>6}")
    for what, lens in SETS:
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(cu[-1], H, D, device=dev, dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        ops = 4.0 * H * D * sum(n * n for n in lens)

        def each():  # one call a sequence (the wrapper's loop before session 50)
            out = torch.empty_like(q)
            for a, z in zip(cu, cu[1:]):
                out[a:z] = lt.attention(q[None, a:z], k[None, a:z], v[None, a:z])[0]
            return out

        forms = [("one attention() a sequence (before)", each),
                 ("attention_varlen", lambda: lt.attention_varlen(q, k, v, cu, cu))]
        offsets = torch.tensor(cu, device=dev, dtype=torch.int64)

        def sdpa_jagged():  # torch's varlen: SDPA on (B, H, j, D) nested jagged views
            qn, kn, vn = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)
                          for t in (q, k, v))
            return F.scaled_dot_product_attention(qn, kn, vn)
        forms.append(("torch SDPA on a nested jagged batch (bf16)", sdpa_jagged))
        if len(set(lens)) == 1:
            b, n = len(lens), lens[0]
            qb, kb, vb = (t.view(b, n, H, D) for t in (q, k, v))
            forms.append(("attention() on the (B, N, H, D) batch", lambda: lt.attention(qb, kb, vb)))
            qs, ks, vs = (t.transpose(1, 2) for t in (qb, kb, vb))

            def sdpa():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(qs, ks, vs)
            forms.append(("torch SDPA cuDNN bf16 on the batch", sdpa))
        base = None
        for name, fn in forms:
            try:
                ms = time_ms(fn)
            except (RuntimeError, TypeError, ValueError) as e:  # (NotImplementedError too)
                print(f"{what:34} {name:44} unavailable: {e}".splitlines()[0])
                continue
            base = base or ms
            tops = ops / (ms * 1e-3) / 1e12
            rows.append({"sequences": what, "form": name, "ms": ms, "tops": tops})
            print(f"{what:34} {name:44} {ms:9.4f} {tops:7.1f} {base / ms:5.2f}x")
        del q, k, v
        torch.cuda.empty_cache()
    _torch_timing.write_json(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
