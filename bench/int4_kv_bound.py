#!/usr/bin/env python3
"""How accurate can an int4 KV cache in xformers' layout be? (CPU, numpy; docs/decode.md)

The layout fixes the decoder: value = code * scale + shift, codes 0..15, scale and shift fp16,
one (scale, shift) per group of D / n_groups elements. SPEC §4 fixes lowbit's quantizer (min/max
range). This script measures, on N(0, 1) K / V with D = 128, the decode-attention output cosine
against fp32 for that quantizer and for quantizers that search the (scale, shift) of each group
for the least squared error while writing the same layout, up to an exhaustive-looking search
(a grid of shrunk / shifted ranges, each refined by least-squares refits of scale and shift). The
search is the format's bound, not a kernel: it is what any quantizer of this layout can reach.

  python3 bench/int4_kv_bound.py [--groups 4] [--keys 4096] [--trials 4] [--seed 0]
"""
import argparse

import numpy as np


def f16(a):
    return a.astype(np.float16).astype(np.float32)


def codes_of(x, scale, shift):
    safe = np.where(scale == 0, 1, scale)
    return np.where(scale == 0, 0, np.clip(np.floor((x - shift) / safe + 0.5), 0, 15))


def quantize_minmax(x, ng):
    """SPEC §4: scale = fp16((max - min) / 15), shift = fp16(min)."""
    g = x.reshape(x.shape[0], ng, -1)
    lo, hi = g.min(-1, keepdims=True), g.max(-1, keepdims=True)
    scale, shift = f16((hi - lo) / 15), f16(lo)
    return (codes_of(g, scale, shift) * scale + shift).reshape(x.shape)


def quantize_search(x, ng, shrinks, offsets, refits):
    """Least squared error over candidate ranges, each refined by `refits` least-squares fits."""
    g = x.reshape(x.shape[0], ng, -1)
    n = g.shape[-1]
    lo, hi = g.min(-1, keepdims=True), g.max(-1, keepdims=True)
    mid, half = (hi + lo) / 2, (hi - lo) / 2
    best, best_err = None, None
    for a in shrinks:
        for b in offsets:
            scale = f16(2 * half * a / 15)
            shift = f16(mid - half * a + b * half * a)
            c = codes_of(g, scale, shift)
            for _ in range(refits):
                # x ~ c * scale + shift in the least-squares sense, then the codes again
                sc, scc = c.sum(-1, keepdims=True), (c * c).sum(-1, keepdims=True)
                sx, scx = g.sum(-1, keepdims=True), (c * g).sum(-1, keepdims=True)
                det = n * scc - sc * sc
                ok = det > 0
                safe = np.where(ok, det, 1)
                scale = f16(np.where(ok, (n * scx - sc * sx) / safe, scale))
                shift = f16(np.where(ok, (sx - scale * sc) / n, shift))
                c = codes_of(g, scale, shift)
            y = c * scale + shift
            err = ((y - g) ** 2).sum(-1, keepdims=True)
            if best is None:
                best, best_err = y, err
            else:
                take = err < best_err
                best, best_err = np.where(take, y, best), np.where(take, err, best_err)
    return best.reshape(x.shape)


def attention(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[-1])
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    D, G = 128, 4
    rng = np.random.default_rng(args.seed)
    quantizers = {
        "SPEC min/max": lambda x: quantize_minmax(x, args.groups),
        "least squares (5 refits)": lambda x: quantize_search(x, args.groups, [1.0], [0.0], 5),
        "grid 21 x 7 + 2 refits": lambda x: quantize_search(
            x, args.groups, np.linspace(0.6, 1.0, 21), np.linspace(-0.15, 0.15, 7), 2),
        "grid 41 x 25 + 3 refits": lambda x: quantize_search(
            x, args.groups, np.linspace(0.5, 1.0, 41), np.linspace(-0.4, 0.4, 25), 3),
    }
    cos = {name: [] for name in quantizers}
    rmse = {name: [] for name in quantizers}
    for _ in range(args.trials):
        q = rng.standard_normal((G, D)).astype(np.float32)
        k = rng.standard_normal((args.keys, D)).astype(np.float32)
        v = rng.standard_normal((args.keys, D)).astype(np.float32)
        exact = attention(q, k, v)
        for name, quant in quantizers.items():
            kq, vq = quant(k), quant(v)
            cos[name].append(cosine(exact, attention(q, kq, vq)))
            rmse[name].append(float(np.sqrt(((kq - k) ** 2).mean())))
    print(f"int4, {args.groups} groups, D {D}, G {G}, {args.keys} keys, {args.trials} trials "
          "(N(0, 1) q, K, V; output cos vs fp32)")
    print(f"{'quantizer':28s} {'rms error':>10s} {'cos mean':>9s} {'cos min':>9s} {'cos max':>9s}")
    for name in quantizers:
        c = np.array(cos[name])
        print(f"{name:28s} {np.mean(rmse[name]):10.5f} {c.mean():9.5f} {c.min():9.5f} {c.max():9.5f}")


if __name__ == "__main__":
    main()
