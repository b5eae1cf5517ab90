"""Writes a synthetic DiT-like checkpoint for `lowbit quantize` measurements (peak memory, speed).

    python3 tests/python/gen_checkpoint.py OUT.safetensors [--blocks 8] [--dim 2048] [--dtype bf16]

Per block: qkv (3d, d), proj (d, d), fc1 (4d, d), fc2 (d, 4d) linears with biases, two norms;
plus a token embedding (32000, d). Weights are Gaussian with a few outlier input channels
(x20 on 0.5 % of the columns), like the activation-outlier channels of DiT/LLM weights.
Tensors are generated one at a time and written through safetensors' numpy API.
"""
import argparse

import numpy as np
from safetensors.numpy import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    d = a.dim

    def weight(o, k):
        w = rng.standard_normal((o, k), dtype=np.float32) * (1.0 / np.sqrt(k))
        cols = rng.choice(k, max(1, k // 200), replace=False)
        w[:, cols] *= 20.0
        return w

    def cast(x):
        if a.dtype == "f32":
            return x.astype(np.float32)
        if a.dtype == "f16":
            return x.astype(np.float16)
        u = x.astype(np.float32).view(np.uint32)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
        return u.astype(np.uint16)  # stored as BF16 below

    tensors = {"embed.weight": weight(32000, d)}
    for b in range(a.blocks):
        p = f"blocks.{b}."
        for name, (o, k) in {"attn.qkv": (3 * d, d), "attn.proj": (d, d),
                             "mlp.fc1": (4 * d, d), "mlp.fc2": (d, 4 * d)}.items():
            tensors[p + name + ".weight"] = weight(o, k)
            tensors[p + name + ".bias"] = rng.standard_normal(o).astype(np.float32) * 0.02
        tensors[p + "norm1.weight"] = np.ones(d, np.float32)
        tensors[p + "norm2.weight"] = np.ones(d, np.float32)
    out = {k: cast(v) for k, v in tensors.items()}
    save_file(out, a.out, metadata={"generator": "lowbit tests/python/gen_checkpoint.py"})
    if a.dtype == "bf16":  # safetensors.numpy has no bfloat16: patch the header's U16 to BF16
        import json
        import struct
        with open(a.out, "r+b") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            h = f.read(n).decode()
            h2 = h.replace('"dtype":"U16"', '"dtype":"BF16"')
            assert len(h2) == len(h)
            f.seek(8)
            f.write(h2.encode())
        json.loads(h2)


if __name__ == "__main__":
    main()
