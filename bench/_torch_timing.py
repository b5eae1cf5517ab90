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
