#!/usr/bin/env python3
"""Host (CPU) time per call of lowbit.torch's LowbitLinear against its pieces and F.linear.

  PYTHONPATH=build-sm90/python python3 bench/python_host_overhead.py [--device cuda] [--profile]

A decode step calls every layer once with M = 1: where the host needs longer per call than the
GPU, the GPU waits and the host time is the step's time. Prints the wall-clock time per call of
N calls enqueued back to back (then one synchronize), for: F.linear (bf16), LowbitLinear in
no_grad and with autograd, the op's implementation (lowbit.torch._IMPL["linear"]), the custom op,
the bare _lowbit forward on fresh DLPack capsules, decode_attention (int4 cache) and sageattn at
small shapes (GPU time included: compare with the GPU benchmarks); --profile adds cProfile's top
entries of LowbitLinear.
"""
import argparse
import cProfile
import pstats
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lowbit
import lowbit.torch as lt


def lowbit_module(family):
    return lowbit._require(family, "bench/python_host_overhead.py")


def per_call_us(fn, device, n=2000):
    for _ in range(min(50, n)):
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
    # decode_attention over an int4 cache (B 1, L 4096 on CUDA, Hkv 8, G 4, D 128) and sageattn
    # (1, 8, 256, 128): the other per-step ops of a decode / small-shape call.
    b, L, hkv, g, d = (1, 4096, 8, 4, 128) if a.device == "cuda" else (1, 64, 2, 2, 64)
    k4 = lt.quantize_kv(torch.randn(b, L, hkv, d, device=a.device), "int4", 4)
    qd = torch.randn(b, 1, hkv, g, d, device=a.device,
                     dtype=torch.float16 if a.device == "cuda" else torch.float32)
    sl = torch.full((b,), L, dtype=torch.int32, device=a.device)
    q = torch.randn(1, 8, 256, 128 if a.device == "cuda" else 64, device=a.device, dtype=dt)
    n = 500 if a.device == "cuda" else 5  # (the CPU oracle's attention takes ~0.1 s a call)
    with torch.no_grad():
        t_dec = per_call_us(lambda: lt.decode_attention(qd, k4, k4, sl), a.device, n)
        t_att = per_call_us(lambda: lt.sageattn(q, q, q), a.device, n)
    # The same calls' C++ part alone (session 20): the library entry points on fresh capsules
    # with the plan, workspace and outputs made beforehand, so that the Python wrappers' share
    # is the difference.
    md = lowbit_module("decode")
    qd5 = qd.contiguous()
    plan = lt._run(md.plan_decode, dev, lt._make_cache(md, k4, k4, sl, None, 0, None, None, "int4",
                                                       4), 1, hkv * g, d)
    wsd = lt._aligned_bytes(max(1, plan.workspace_bytes), dev)
    outd = torch.empty_like(qd5)
    ma = lowbit_module("attention")
    qn = q.transpose(1, 2)
    outa = torch.empty_like(q)
    opts = dict(sm_scale=0.0, causal="none", pv="fp8", smooth_k=True, smooth_v=False)
    wsa = lt._aligned_bytes(max(1, ma.attention_workspace_bytes(lt.to_lowbit(qn), lt.to_lowbit(qn),
                                                                **opts)), dev)
    with torch.no_grad():
        t_dec_cpp = per_call_us(lambda: lt._run(
            md.decode_attention, dev, lt.to_lowbit(qd5),
            lt._make_cache(md, k4, k4, sl, None, 0, None, None, "int4", 4), plan,
            lt.to_lowbit(wsd), lt.to_lowbit(outd)), a.device, n)
        t_att_cpp = per_call_us(lambda: lt._run(
            ma.attention, dev, lt.to_lowbit(qn), lt.to_lowbit(qn), lt.to_lowbit(qn),
            lt.to_lowbit(outa.transpose(1, 2)), workspace=lt.to_lowbit(wsa), **opts), a.device, n)
    print(f"  {'decode_attention int4 g4 B1 L' + str(L):40s} {t_dec:8.1f}")
    print(f"  {'  its C++ call (plan, workspace made)':40s} {t_dec_cpp:8.1f}")
    print(f"  {'sageattn ' + str(tuple(q.shape)):40s} {t_att:8.1f}")
    print(f"  {'  its C++ attention() (workspace made)':40s} {t_att_cpp:8.1f}")
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
