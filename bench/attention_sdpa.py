#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention (cuDNN and flash backends, bf16) at the
shapes of lowbit's attention bench rows, so the vendor baselines come from the same machine and
run as `lowbit bench --op attention`.

TOPS = 4 * B * H * N^2 * D / time (causal counts half), median of CUDA-event timings with an L2
flush before each timed call. Shapes are (B, H, N, D); tensors are (B, H, N, D) bf16 N(0, 1).

    python3 bench/attention_sdpa.py [--iters 30] [--warmup 5] [--json out.json]
"""
import sys

import _torch_timing  # (bench/_torch_timing.py)

SHAPES = [(1, 40, 32760, 128), (2, 24, 16384, 128), (1, 24, 4096, 64),
          (1, 24, 4608, 128),  # Flux (session 19: attention.prefill's row of it)
          (1, 24, 4096, 256), (1, 24, 16384, 256)]  # the last two: attention.d256 (issue 4)


def main() -> int:
    args = _torch_timing.script_args(__doc__, iters=30, warmup=5)
    if _torch_timing.unavailable("attention_sdpa.py", lowbit=False):
        return 2
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda")
    time_ms = _torch_timing.timer(args)

    backends = [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'backend':8} {'shape (B, H, N, D)':24} {'causal':7} {'ms':>9} {'TFLOPS':>8}")
    for (b, h, n, d) in SHAPES:
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        for causal in (False, True):
            flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
            for name, backend in backends:
                try:
                    with sdpa_kernel([backend]):
                        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                except RuntimeError as e:
                    print(f"{name:8} {str((b, h, n, d)):24} {str(causal):7} unavailable: {e}".splitlines()[0])
                    continue
                tflops = flops / (ms * 1e-3) / 1e12
                rows.append({"backend": name, "shape": [b, h, n, d], "causal": causal, "ms": ms,
                             "tflops": tflops})
                print(f"{name:8} {str((b, h, n, d)):24} {str(causal):7} {ms:9.3f} {tflops:8.1f}")
        del q, k, v
        torch.cuda.empty_cache()
    _torch_timing.write_json(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
