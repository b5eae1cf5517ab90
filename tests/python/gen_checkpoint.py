"""Writes a synthetic DiT-like checkpoint for `lowbit quantize` measurements (peak memory, speed).

    python3 tests/python/gen_checkpoint.py OUT.safetensors [--blocks 8] [--dim 2048] [--dtype bf16]

Per block: qkv (3d, d), proj (d, d), fc1 (4d, d), fc2 (d, 4d) linears with biases, two norms;
plus a token embedding (32000, d). Weights are Gaussian with a few outlier input channels
(x20 on 0.5 % of the columns), like the activation-outlier channels of DiT/LLM weights.
Tensors are generated and written one at a time (bf16 rounded to nearest even).
"""
import argparse
import json
import struct

import numpy as np


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

    shapes = {"embed.weight": (32000, d)}
    for b in range(a.blocks):
        p = f"blocks.{b}."
        for name, (o, k) in {"attn.qkv": (3 * d, d), "attn.proj": (d, d),
                             "mlp.fc1": (4 * d, d), "mlp.fc2": (d, 4 * d)}.items():
            shapes[p + name + ".weight"] = (o, k)
            shapes[p + name + ".bias"] = (o,)
        shapes[p + "norm1.weight"] = (d,)
        shapes[p + "norm2.weight"] = (d,)
    # Weights in the chosen dtype, biases and norms f32; header first, then one tensor at a time.
    wdt = {"bf16": ("BF16", 2), "f16": ("F16", 2), "f32": ("F32", 4)}[a.dtype]
    header, off = {"__metadata__": {"generator": "lowbit tests/python/gen_checkpoint.py"}}, 0
    for name, shp in shapes.items():
        dt = wdt if len(shp) == 2 else ("F32", 4)
        n = int(np.prod(shp)) * dt[1]
        header[name] = {"dtype": dt[0], "shape": list(shp), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shp in shapes.items():
            if len(shp) == 2:
                f.write(cast(weight(*shp)).tobytes())
            elif name.endswith("bias"):
                f.write((rng.standard_normal(shp[0]) * 0.02).astype(np.float32).tobytes())
            else:
                f.write(np.ones(shp, np.float32).tobytes())


if __name__ == "__main__":
    main()
