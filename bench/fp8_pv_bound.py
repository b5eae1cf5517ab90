#!/usr/bin/env python3
"""How accurate can fp8 (e4m3) P·V attention be? (CPU, numpy; docs/attention.md)

SPEC §2's fp8 P·V mode rounds V per channel to e4m3 (scale max|v| / 448 over the tokens of a
head) and P = exp(S - m) to e4m3 with the static offset 448. This script computes attention on
N(0, 1) q, k, v in fp64 and the same attention with only those roundings applied (no int8 q / k,
no kernel), so what it prints is the bound of the number format itself: no fp8-P·V kernel of
this arithmetic can be more accurate on this data. Variants round only P, only V, or normalize by
the row sums of the rounded P.

  python3 bench/fp8_pv_bound.py [--tokens 4096] [--rows 256] [--trials 3] [--seed 0]
"""
import argparse

import numpy as np


def round_e4m3(x):
    """Round to the nearest e4m3fn value (ties to even), saturating at 448."""
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-300))), -6.0)  # subnormals below 2^-6
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    D = 128
    rng = np.random.default_rng(args.seed)
    stats = {}
    for _ in range(args.trials):
        q = rng.standard_normal((args.rows, D))
        k = rng.standard_normal((args.tokens, D))
        v = rng.standard_normal((args.tokens, D))
        s = q @ k.T / np.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        rowsum = p.sum(-1, keepdims=True)
        exact = p @ v / rowsum
        v_scale = np.abs(v).max(0, keepdims=True) / 448
        v8 = round_e4m3(v / v_scale) * v_scale
        p8 = round_e4m3(p * 448) / 448
        variants = {
            "P and V e4m3 (SPEC fp8 P.V)": p8 @ v8 / rowsum,
            "P e4m3 only": p8 @ v / rowsum,
            "V e4m3 only": p @ v8 / rowsum,
            "P and V e4m3, sums of e4m3 P": p8 @ v8 / p8.sum(-1, keepdims=True),
        }
        for name, out in variants.items():
            cos = float((exact * out).sum() / np.linalg.norm(exact) / np.linalg.norm(out))
            l1 = float(np.abs(exact - out).sum() / np.abs(exact).sum())
            stats.setdefault(name, []).append((cos, l1))
    print(f"D {D}, {args.rows} query rows, {args.tokens} keys, {args.trials} trials, N(0, 1); "
          "vs fp64 attention")
    print(f"{'rounding':32s} {'cos':>8s} {'rel L1':>8s}")
    for name, rows in stats.items():
        a = np.array(rows)
        print(f"{name:32s} {a[:, 0].mean():8.5f} {a[:, 1].mean():8.4f}")


if __name__ == "__main__":
    main()
