#!/usr/bin/env python3
"""Host (CPU) time per call of lowbit.torch's LowbitLinear against its pieces and F.linear.

  PYTHONPATH=build-sm90/python python3 bench/python_host_overhead.py [--device cuda] [--profile]

A decode step calls every layer once with M = 1: where the host needs longer per call than the
GPU, the GPU waits and the host time is the step's time. Prints the wall-clock time per call of
N calls enqueued back to back (then one synchronize), for: F.linear (bf16), LowbitLinear in
no_grad and with autograd, the op's implementation (lowbit.torch._IMPL["linear"]), and the bare
_lowbit forward on fresh DLPack capsules; --profile adds cProfile's top entries.
"""
import argparse
import cProfile
import pstats
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lowbit.torch as lt


def per_call_us(fn, device, n=2000):
    for _ in range(50):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="1,5120,13824" if torch.cuda.is_available() else "1,256,64")
    ap.add_argument("--qtype", default="convrotint4")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    m, k, o = (int(v) for v in a.shape.split(","))
    dt = torch.bfloat16 if a.device == "cuda" else torch.float32
    lin = nn.Linear(k, o, device=a.device, dtype=dt)
    layer = lt.LowbitLinear.from_linear(lin, a.qtype)
    x = torch.randn(m, k, device=a.device, dtype=dt)
    out = torch.empty(m, o, device=a.device, dtype=dt)
    ql = lt._layer(layer._handle)
    stream = torch.cuda.current_stream().cuda_stream if a.device == "cuda" else 0
    dev = torch.device(a.device)
    rows = [("F.linear bf16", lambda: F.linear(x, lin.weight, lin.bias))]
    with torch.no_grad():
        rows.append(("LowbitLinear, no_grad", lambda: layer(x)))
    rows += [
        ("LowbitLinear, autograd", lambda: layer(x)),
        ("op implementation (_IMPL)", lambda: lt._IMPL["linear"](x, layer._handle, layer.bias, o)),
        ("custom op (torch.ops.lowbit.linear)",
         lambda: torch.ops.lowbit.linear(x, layer._handle, layer.bias, o)),
        ("_run(forward) on fresh capsules", lambda: lt._run(
            ql.forward, dev, lt.to_lowbit(x), lt.to_lowbit(out), bias=lt.to_lowbit(layer.bias))),
        ("forward on fresh capsules, stream given", (lambda: ql.forward(
            lt.to_lowbit(x), lt.to_lowbit(out), bias=lt.to_lowbit(layer.bias), stream=stream))),
    ]
    print(f"{a.qtype} {m}x{k}->{o} on {a.device}: host time per call, us")
    for name, fn in rows:
        if name == "LowbitLinear, no_grad":
            with torch.no_grad():
                t = per_call_us(fn, a.device)
        else:
            t = per_call_us(fn, a.device)
        print(f"  {name:40s} {t:8.1f}")
    if a.profile:
        with torch.no_grad():
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                layer(x)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
