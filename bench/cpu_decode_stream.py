#!/usr/bin/env python3
"""CPU decode: a stream of linear layers whose weights do not fit in the caches, one layer after the
other as a model's decode step calls them, torch's bf16 nn.Linear against lowbit's LowbitLinear.

  PYTHONPATH=build/python python3 bench/cpu_decode_stream.py [--dim 4096] [--layers 48] [--rows 1,16]

Each qtype quantizes the same `layers` bf16 layers of dim x dim; a pass calls every layer once on
an M x dim bf16 input; the figure is the median over `--repeats` passes of the pass time / layers.
GB/s counts the weight bytes the layer reads (bf16 2 bytes a weight; lowbit: the packed codes and
scales, and the 2-, 3- and 4-bit rows' fold tables). The stream's weights must exceed the last-level cache, else the numbers are
cache speeds (the default: 1.6 GB of bf16 weights, 0.4 GB of 4-bit codes).
"""
import argparse
import statistics
import time

import torch

import lowbit
import lowbit.torch as lt


def packed_bytes(layer, dim):
    """The bytes one LowbitLinear reads per call: its packed parts (and the CPU GEMV's prebuilt
    fold tables: convrotint4 16 bytes a group of 128, convrotint2 / convrotint3 4 / 8)."""
    table = {"convrotint4": 16, "convrotint3": 8, "convrotint2": 4}.get(layer.qtype, 0)
    return layer._layer.to_packed().storage_bytes + dim * (dim // 128) * table


def time_per_layer(layers, x, repeats):
    with torch.no_grad():
        for layer in layers:  # warm-up pass
            layer(x)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for layer in layers:
                layer(x)
            times.append((time.perf_counter() - t0) / len(layers))
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--qtypes", default="convrot8,convrotint4,convrotcomfyw4a4,convrotfp8,convrot4")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    base = [torch.nn.Linear(args.dim, args.dim).to(torch.bfloat16) for _ in range(args.layers)]
    inputs = {m: torch.randn(m, args.dim, dtype=torch.bfloat16) for m in rows}
    print(f"lowbit {lowbit.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.layers} layers {args.dim} -> {args.dim}, bf16 in and out; ms per layer "
          f"(median of {args.repeats} passes)")
    print(f"{'layer':<18} {'rows':>4} {'ms':>8} {'GB/s':>7} {'x torch bf16':>13}")
    bf16_bytes = args.dim * args.dim * 2
    ref = {}
    for m in rows:
        ref[m] = time_per_layer(base, inputs[m], args.repeats)
        print(f"{'torch bf16':<18} {m:>4} {ref[m]:>8.3f} {bf16_bytes / ref[m] / 1e6:>7.1f} {1.0:>12.2f}x")
    for q in args.qtypes.split(","):
        layers = [lt.LowbitLinear.from_linear(layer, q) for layer in base]
        nbytes = packed_bytes(layers[0], args.dim)
        for m in rows:
            t = time_per_layer(layers, inputs[m], args.repeats)
            print(f"{q:<18} {m:>4} {t:>8.3f} {nbytes / t / 1e6:>7.1f} {ref[m] / t:>12.2f}x")
        del layers


if __name__ == "__main__":
    main()
