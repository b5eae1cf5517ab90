#!/usr/bin/env python3
"""GPU check of lowbit's Python layer (run on the H200 with torch and a CUDA build of lowbit).

  PYTHONPATH=build-sm90/python python3 bench/python_gpu_check.py [--quick] [--json OUT.json]

Sections (each reports pass/fail and never stops the others):
  attention  lowbit.torch.sageattn (fp8 PV and 16-bit PV) vs F.scaled_dot_product_attention:
             accuracy against an fp32 reference (SPEC section 2 targets) and time against SDPA
             on bf16 (median of CUDA-event timings, inputs re-used, warm-up first).
  linear     LowbitLinear (convrot8, convrotint4, convrotfp8) vs F.linear: accuracy against
             F.linear in fp32 and time against F.linear in bf16, prefill and decode shapes.
  decode     lowbit.torch.decode_attention over an int4 cache vs an fp32 reference.
  stream     ops enqueued on a side stream (torch.cuda.current_stream) give the same result.
  compile    torch.compile(fullgraph=True) (inductor) of a block using sageattn + LowbitLinear:
             no graph break, same result as eager.
  graphs     CUDA-graph capture of sageattn / LowbitLinear / decode_attention / attention with
             segmented norms (check_weight_rows=False) (torch.cuda.graph).
Exit status 0 when every check passed. `--device cpu --quick` is a dry run of the script itself on
a machine without a GPU (stream and graphs skipped, torch.compile with the aot_eager backend).
"""
import argparse
import faulthandler
import json
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

import lowbit
import lowbit.torch as lt

faulthandler.enable()  # a crash in native code prints the Python stack of the op that crashed
RESULTS = []


def step(what):
    """Names the op about to run (so a native crash is attributable in the log)."""
    print(f"  .. {what}", flush=True)


def record(section, name, ok, **fields):
    row = {"section": section, "name": name, "ok": bool(ok), **fields}
    RESULTS.append(row)
    extras = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in fields.items())
    print(f"[{'PASS' if ok else 'FAIL'}] {section}: {name} {extras}", flush=True)


def section(fn):
    def run(args):
        try:
            fn(args)
        except Exception as e:  # report and go on with the other sections
            record(fn.__name__, "exception", False, error=f"{type(e).__name__}: {e}")
            traceback.print_exc()
    run.__name__ = fn.__name__
    return run


def cycle(fns):
    """One callable that calls fns[0], fns[1], ... in turn, one per call."""
    state = [0]

    def call():
        fns[state[0] % len(fns)]()
        state[0] += 1
    return call


def median_ms(fn, iters, warmup=5, reps=10):
    """Median over `iters` samples of the time per call of `reps` calls enqueued back to back
    between two CUDA events (the host runs ahead of the GPU as in a model; a single call between
    events would also count the host's time before the first kernel, tens of us for an eager
    Python call, as GPU time)."""
    if not torch.cuda.is_available():  # --device cpu dry run: wall clock
        times = []
        for _ in range(max(1, iters // 10)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def accuracy(out, ref):
    a, b = out.double().flatten(), ref.double().flatten()
    cos = (a @ b / (a.norm() * b.norm())).item()
    rel_l1 = ((a - b).abs().sum() / b.abs().sum()).item()
    return cos, rel_l1


@section
def attention(args):
    shapes = [(1, 24, 4096, 128), (2, 16, 2048, 64)] if not args.quick else [(1, 8, 1024, 128)]
    if args.device == "cpu":
        shapes = [(1, 2, 128, 64)]
    for (b, h, n, d) in shapes:
        for causal in (False, True):
            q, k, v = (torch.randn(b, h, n, d, device=args.device, dtype=torch.bfloat16)
                       for _ in range(3))
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                 is_causal=causal)
            t_sdpa = median_ms(lambda: F.scaled_dot_product_attention(q, k, v,
                                                                      is_causal=causal),
                               args.iters)
            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            for accum, pv, cos_min, l1_max in (("fp32+fp32", "fp8", 0.9995, 0.02),
                                               ("fp32", "f16", 0.9999, 0.012)):
                step(f"sageattn {tuple(q.shape)} causal={causal} pv={pv}")
                out = lt.sageattn(q, k, v, is_causal=causal, pv_accum_dtype=accum)
                cos, l1 = accuracy(out, ref)
                t = median_ms(lambda: lt.sageattn(q, k, v, is_causal=causal,
                                                  pv_accum_dtype=accum), args.iters)
                record("attention", f"B{b} H{h} N{n} D{d} causal={causal} pv={pv}",
                       cos >= cos_min and l1 <= l1_max, cos=cos, rel_l1=l1, ms=t,
                       sdpa_ms=t_sdpa, speedup=t_sdpa / t, tflops=flops / t / 1e9)
            # The building-block path (default) against the one-call lowbit::attention.
            for pv in ("fp8", "f16"):
                a = lt.attention(q, k, v, layout="HND", causal="top_left" if causal else "none",
                                 pv=pv, impl="parts")
                lib = lambda: lt.attention(q, k, v, layout="HND", pv=pv, impl="library",  # noqa
                                           causal="top_left" if causal else "none")
                diff = (a.float() - lib().float()).abs().max().item()
                record("attention", f"parts vs library B{b} H{h} N{n} D{d} causal={causal} "
                       f"pv={pv}", diff <= 2e-2, max_abs_diff=diff,
                       library_ms=median_ms(lib, args.iters))
            # NHD layout and LSE on the fp8 path.
            qn, kn, vn = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            out, lse = lt.sageattn(qn, kn, vn, tensor_layout="NHD", is_causal=causal,
                                   return_lse=True)
            cos, l1 = accuracy(out.transpose(1, 2), ref)
            s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
            if causal:
                s = s.masked_fill(torch.ones(n, n, device=args.device,
                                             dtype=torch.bool).triu(1), float("-inf"))
            lse_err = (lse - torch.logsumexp(s, -1)).abs().max().item()
            record("attention", f"NHD+lse B{b} H{h} N{n} D{d} causal={causal}",
                   cos >= 0.9995 and lse_err < 0.05, cos=cos, lse_max_err=lse_err)


@section
def linear(args):
    shapes = [(4096, 3072, 3072), (16, 4096, 4096), (1, 5120, 13824)]
    if args.quick:
        shapes = [(512, 1024, 1024), (4, 1024, 1024)]
    if args.device == "cpu":
        shapes = [(32, 256, 64)]
    for (m, k, o) in shapes:
        # Timed calls cycle through `copies` layers of distinct weights, so that the 4-bit ones
        # (k o / 2 bytes each) span ~4x the 60 MB L2 and no call finds its weight there.
        copies = 1 if args.device == "cpu" else max(1, math.ceil(240e6 / (k * o / 2)))
        lins = [nn.Linear(k, o, device=args.device, dtype=torch.bfloat16) for _ in range(copies)]
        lin = lins[0]
        x = torch.randn(m, k, device=args.device, dtype=torch.bfloat16)
        ref = F.linear(x.float(), lin.weight.float(), lin.bias.float())
        t_ref = median_ms(cycle([lambda l=l: F.linear(x, l.weight, l.bias) for l in lins]),
                          args.iters)
        for qtype, cos_min in (("convrot8", 0.999), ("convrotint4", 0.99),
                               ("convrotfp8", 0.998)):
            ok, why = lowbit.can_quantize(qtype, o, k)
            if not ok:
                record("linear", f"{qtype} M{m} K{k} O{o}", True, skipped=why)
                continue
            step(f"LowbitLinear {qtype} M{m} K{k} O{o}")
            layers = [lt.LowbitLinear.from_linear(l, qtype) for l in lins]
            out = layers[0](x)
            cos, l1 = accuracy(out, ref)
            with torch.no_grad():  # inference (with grad: LowbitLinear's autograd.Function)
                t = median_ms(cycle([lambda q=q: q(x) for q in layers]), args.iters)
            del layers
            record("linear", f"{qtype} M{m} K{k} O{o}", cos >= cos_min, cos=cos, rel_l1=l1,
                   ms=t, f_linear_bf16_ms=t_ref, speedup=t_ref / t, layers=copies)
        del lins, lin
    # Session 18: a layer quantized on the CPU and moved by .to(device) runs the same packed
    # weight as one uploaded there; its state_dict (CPU tensors, lowbit checkpoint format) loads
    # back on the device with the same output.
    step("LowbitLinear .to(device) and state_dict")
    lin = nn.Linear(1024, 256)
    model = nn.Sequential(lt.LowbitLinear.from_linear(lin, "convrotint4")).to(args.device)
    twin = lt.LowbitLinear.from_packed(model[0].packed(), lin.bias, args.device)
    x = torch.randn(8, 1024, device=args.device)
    moved_ok = model[0].device.type == torch.device(args.device).type and \
        torch.equal(model(x), twin(x))
    again = nn.Sequential(lt.LowbitLinear.from_linear(nn.Linear(1024, 256), "convrot8"))
    again.load_state_dict(model.state_dict())
    again.to(args.device)
    record("linear", "LowbitLinear .to(device) and state_dict round trip",
           moved_ok and torch.equal(again(x), model(x)), device=args.device)


@section
def decode(args):
    b, length, hkv, g, d = (8, 8192, 8, 4, 128) if not args.quick else (2, 1024, 2, 4, 128)
    if args.device == "cpu":
        b, length, hkv, g, d = 1, 200, 2, 2, 128
    kf = torch.randn(b, length, hkv, d, device=args.device)
    vf = torch.randn(b, length, hkv, d, device=args.device)
    for n_groups in (1, 4):
        step(f"quantize_kv + decode_attention int4 groups={n_groups}")
        k4, v4 = lt.quantize_kv(kf, "int4", n_groups), lt.quantize_kv(vf, "int4", n_groups)
        seq_len = torch.full((b,), length, dtype=torch.int32, device=args.device)
        q = torch.randn(b, 1, hkv, g, d, device=args.device, dtype=torch.float16)
        out = lt.decode_attention(q, k4, v4, seq_len)
        qr = q.float().reshape(b, 1, hkv * g, d).transpose(1, 2)
        kr = kf.transpose(1, 2).repeat_interleave(g, 1)
        vr = vf.transpose(1, 2).repeat_interleave(g, 1)
        ref = F.scaled_dot_product_attention(qr, kr, vr).transpose(1, 2).reshape(q.shape)
        cos, l1 = accuracy(out, ref)
        t = median_ms(lambda: lt.decode_attention(q, k4, v4, seq_len), args.iters)
        kv_bytes = 2 * k4.numel() * 4
        record("decode", f"int4 groups={n_groups} B{b} L{length} Hkv{hkv} G{g} D{d}",
               cos >= (0.995 if n_groups == 4 else 0.99), cos=cos, rel_l1=l1, ms=t,
               kv_gb_per_s=kv_bytes / t / 1e6)


@section
def stream(args):
    q, k, v = (torch.randn(1, 8, 512, 128, device=args.device, dtype=torch.float16)
               for _ in range(3))
    want = lt.sageattn(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.cuda._sleep(10_000_000)  # keep the side stream busy: a wrong stream shows
        got = lt.sageattn(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    record("stream", "sageattn on a side stream", torch.equal(got, want))


@section
def compile(args):
    torch._dynamo.reset()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32  # lowbit linear: f32 on CPU

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(1024, 3072, device=args.device, dtype=dtype)
            self.proj = nn.Linear(1024, 1024, device=args.device, dtype=dtype)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 8, 128).unbind(2)
            o = lt.sageattn(q, k, v, tensor_layout="NHD")
            return self.proj(o.reshape(b, n, 1024))

    block = Block()
    lt.quantize_linear_(block, "convrot8")
    x = torch.randn(2, 256, 1024, device=args.device, dtype=dtype)
    compiled = torch.compile(block, fullgraph=True,
                             backend="inductor" if args.device == "cuda" else "aot_eager")
    with torch.no_grad():  # inference: sageattn is forward-only, as SageAttention's
        eager = block(x)
        got = compiled(x)
    err = (got.float() - eager.float()).abs().max().item()
    record("compile", "fullgraph=True inductor: sageattn + LowbitLinear", err < 1e-2,
           max_abs_diff=err)


@section
def graphs(args):
    q, k, v = (torch.randn(1, 8, 512, 128, device=args.device, dtype=torch.bfloat16)
               for _ in range(3))
    lin = lt.LowbitLinear.from_linear(nn.Linear(1024, 1024, device=args.device,
                                                dtype=torch.bfloat16), "convrot8")
    x = torch.randn(16, 1024, device=args.device, dtype=torch.bfloat16)
    kf = torch.randn(2, 1024, 2, 128, device=args.device)
    k4 = lt.quantize_kv(kf, "int4", 4)
    seq_len = torch.full((2,), 1000, dtype=torch.int32, device=args.device)
    qd = torch.randn(2, 1, 2, 4, 128, device=args.device, dtype=torch.float16)
    # joint attention's segmented q / k norms, weight rows unchecked (nothing read back)
    w2 = 1 + 0.1 * torch.randn(2, 128, device=args.device)
    rows = (torch.arange(512, device=args.device) >= 77).to(torch.int32)
    joint = dict(layout="HND", q_norm_weight=w2, k_norm_weight=w2, q_weight_rows=rows,
                 k_weight_rows=rows, check_weight_rows=False)
    for name, fn in (("sageattn", lambda: lt.sageattn(q, k, v)),
                     ("attention, segmented norms", lambda: lt.attention(q, k, v, **joint)),
                     ("LowbitLinear", lambda: lin(x)),
                     ("decode_attention", lambda: lt.decode_attention(qd, k4, k4, seq_len))):
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn()
            graph.replay()
            torch.cuda.synchronize()
            ok = torch.equal(out, fn())
            record("graphs", f"capture + replay {name}", ok)
        except Exception as e:
            record("graphs", f"capture + replay {name}", False, error=f"{type(e).__name__}: {e}")
            torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes only")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--only", nargs="*", help="sections to run")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    if args.device == "cpu":
        sections = [attention, linear, decode, compile]
        for s in sections:
            if not args.only or s.__name__ in args.only:
                s(args)
        failed = [r for r in RESULTS if not r["ok"]]
        print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed (cpu dry run)")
        return 1 if failed else 0
    if not torch.cuda.is_available() or lowbit.cuda_device_count() == 0:
        print(f"no CUDA: torch {torch.cuda.is_available()}, lowbit: "
              f"{lowbit.cuda_unavailable_reason() or lowbit.build_info()}")
        return 2
    info = lowbit.cuda_device_info(0)
    print(f"lowbit {lowbit.__version__} ({lowbit.build_info()}), torch {torch.__version__}, "
          f"{info['name']} sm_{info['sm'][0]}{info['sm'][1]}", flush=True)
    sections = [attention, linear, decode, stream, graphs, compile]  # compile (slowest) last
    for s in sections:
        if args.only and s.__name__ not in args.only:
            continue
        s(args)
    failed = [r for r in RESULTS if not r["ok"]]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info, "torch": torch.__version__, "results": RESULTS}, f,
                      indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
