"""Shared by the torch scripts in bench/: the median of CUDA-event timings of fn(), each timed
call after a flush of the L2 cache (a zero fill of twice its size), after `warmup` untimed calls.
(A module, not a script: scripts/gpu-check skips bench/_*.py.)"""
import statistics


def time_ms(fn, iters, warmup=5):
    import torch
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def script_args(doc, iters=20, warmup=3):
    """The torch scripts' options: --iters, --warmup, --json (the description: doc's first line)."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--iters", type=int, default=iters)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    return ap.parse_args()


def cuda_missing(script, lowbit=True):
    """Why `script` cannot run here ('' when it can): torch with torch.nn.attention (and
    lowbit.torch where `lowbit`) must import and a CUDA device must be present."""
    try:
        import torch
        from torch.nn.attention import sdpa_kernel  # noqa: F401
        if lowbit:
            import lowbit.torch  # noqa: F401
    except ImportError as e:
        what = "torch and lowbit's Python module" if lowbit else "torch with torch.nn.attention"
        return f"{script}: {what} are required ({e})"
    if not torch.cuda.is_available():
        return f"{script}: no CUDA device"
    return ""


def unavailable(script, lowbit=True):
    """cuda_missing's reason for `script`, printed to stderr; True when it cannot run here."""
    import sys
    why = cuda_missing(script, lowbit)
    if why:
        print(why, file=sys.stderr)
    return bool(why)


def write_json(args, rows):
    """The rows as JSON to --json's file, where one was given."""
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def timer(args):
    """time_ms(fn) with the script's --iters / --warmup."""
    return lambda fn: time_ms(fn, args.iters, args.warmup)
