#!/usr/bin/env python3
"""Times torch's scaled_dot_product_attention for decode on the fp16 KV cache shapes of
`lowbit bench --op decode` (the issue's vendor baseline), on the GPU.

Usage (on the GPU machine):
    build/lowbit bench --op '^decode' --json decode.json
    python3 bench/decode_sdpa.py --lowbit-json decode.json

For each shape (B, L, Hq, Hkv, D) the fp16 cache is laid out as lowbit's contiguous cache
(B, L, Hkv, D); SDPA is timed on it three ways and the fastest counts:
  * gqa-as-rows: q viewed as (B, Hkv, G, D) against k/v (B, Hkv, L, D) (exact for Mq = 1, no
    mask; the cache read once per KV head), on the transposed view of lowbit's layout;
  * the same on a (B, Hkv, L, D)-contiguous copy of the cache (the layout torch prefers);
  * enable_gqa=True with q (B, Hq, 1, D) (torch >= 2.5).
Timing: CUDA events, L2 flushed before each call, median of --iters calls. Bandwidth counts the
K/V bytes (GB/s = 1e9 bytes/s). With --lowbit-json, prints lowbit's int4/fp8/fp16 rows against
the SDPA time of the same shape (the issue's goals: int4 >= 3x, fp8 >= 1.8x faster).
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

from _torch_timing import time_ms  # (bench/_torch_timing.py)

SHAPES = [(64, 8192, 32, 8, 128), (1, 131072, 32, 8, 128), (16, 32768, 64, 8, 128)]
# --serving (session 35): the serving batches of short contexts of `lowbit bench --op
# decode.attention.variants` (its "page 16" rows; SDPA on the contiguous fp16 cache).
SERVING = [(256, 1024, 32, 8, 128), (128, 2048, 32, 8, 128), (512, 512, 32, 8, 128),
           (64, 2048, 32, 32, 128)]


def copy_gbps(iters):
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a), iters)
    return 2 * n / (ms * 1e-3) / 1e9


def sdpa_ms(B, L, Hq, Hkv, D, iters):
    G = Hq // Hkv
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.float16, generator=gen)
    q = torch.randn(B, 1, Hkv, G, D, device="cuda", dtype=torch.float16, generator=gen)
    scale = 1.0 / math.sqrt(D)
    results = {}
    q_rows = q.view(B, Hkv, G, D)  # (B, 1, Hkv, G, D) -> (B, Hkv, G, D)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # (B, Hkv, L, D) views of lowbit's layout
    results["gqa-as-rows, lowbit layout"] = time_ms(
        lambda: F.scaled_dot_product_attention(q_rows, kt, vt, scale=scale), iters)
    kc, vc = kt.contiguous(), vt.contiguous()
    del k, v, kt, vt
    results["gqa-as-rows, (B,H,L,D)"] = time_ms(
        lambda: F.scaled_dot_product_attention(q_rows, kc, vc, scale=scale), iters)
    q_heads = q.view(B, Hq, 1, D)
    try:
        results["enable_gqa"] = time_ms(
            lambda: F.scaled_dot_product_attention(q_heads, kc, vc, scale=scale, enable_gqa=True),
            iters)
    except (TypeError, RuntimeError) as e:  # older torch
        results["enable_gqa"] = float("nan")
        print(f"  enable_gqa unavailable: {e}")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--lowbit-json", help="rows written by `lowbit bench --op decode --json FILE`")
    ap.add_argument("--serving", action="store_true",
                    help="the serving shapes instead of the issue's (decode.attention.variants)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    cgbps = copy_gbps(args.iters)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, copy {cgbps:.0f} GB/s")
    best = {}
    for (B, L, Hq, Hkv, D) in (SERVING if args.serving else SHAPES):
        res = sdpa_ms(B, L, Hq, Hkv, D, args.iters)
        kv_bytes = 2 * B * L * Hkv * D * 2
        name = f"(B={B}, L={L}, Hq={Hq}, Hkv={Hkv}, D={D})"
        for how, ms in res.items():
            gbps = kv_bytes / (ms * 1e-3) / 1e9 if ms == ms else float("nan")
            print(f"{name:42s} SDPA fp16 {how:28s} {ms:9.4f} ms {gbps:8.0f} GB/s "
                  f"({100 * gbps / cgbps:5.1f}% of copy)")
        best[name] = min(ms for ms in res.values() if ms == ms)
        torch.cuda.empty_cache()
    if args.lowbit_json:
        with open(args.lowbit_json) as f:
            data = json.load(f)
        rows = data["rows"] if isinstance(data, dict) and "rows" in data else data
        print("\nlowbit decode vs the fastest SDPA on the same fp16 cache shape")
        for r in rows:
            # The variants' shapes carry " Mq=N[ page P]" after the head layout: Mq 1 only.
            shape, _, rest = r.get("shape", "").partition(" Mq=")
            if r.get("family") != "decode" or shape not in best or (rest and rest[:2] != "1 "
                                                                        and rest != "1"):
                continue
            sdpa = best[shape]
            ms = float(r["ms"])
            print(f"{r['shape']:42s} {r['op']:40s} {ms:9.4f} ms  SDPA {sdpa:9.4f} ms  "
                  f"speedup {sdpa / ms:5.2f}x")


if __name__ == "__main__":
    main()
