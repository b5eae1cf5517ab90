"""Cross-checks lowbit's safetensors reader and writer against PyPI's `safetensors` package.

Files written by safetensors.numpy are read by `lowbit inspect --json`; files written by lowbit
(`lowbit quantize`, which copies every tensor it does not quantize) are read back by
safetensors.numpy and compared bit for bit. The CLI is found through LOWBIT_CLI (default
build-cpu/lowbit); the tests skip when it is missing.
"""

import json
import os
import struct
import subprocess

import numpy as np
import pytest

from conftest import lowbit_cli

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def run(*args, ok=True):
    p = subprocess.run([lowbit_cli(), *args], capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "not implemented on the CPU yet" in p.stderr:
        pytest.skip(f"lowbit built without the linear CPU backend: {p.stderr.strip()}")
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def inspect(path):
    return json.loads(run("inspect", "--json", str(path)).stdout)


def sample_tensors(rng):
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2, 2)).astype(np.float64),
        "i8": rng.integers(-128, 127, (4, 4), dtype=np.int8),
        "u8": rng.integers(0, 255, (9,), dtype=np.uint8),
        "i16": rng.integers(-1000, 1000, (3,), dtype=np.int16),
        "i32": rng.integers(-(2**31), 2**31 - 1, (2, 3), dtype=np.int32),
        "i64": np.arange(6, dtype=np.int64).reshape(1, 6),
        "u64": np.array([2**64 - 1, 0], dtype=np.uint64),
        "bool": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "layer.weight": rng.standard_normal((16, 64)).astype(np.float32),
    }


DTYPE_NAMES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int16): "I16",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint64): "U64",
    np.dtype(np.bool_): "BOOL",
}


def test_lowbit_reads_safetensors_files(tmp_path):
    rng = np.random.default_rng(1)
    tensors = sample_tensors(rng)
    path = tmp_path / "py.safetensors"
    safetensors_numpy.save_file(tensors, str(path), metadata={"format": "np", "note": "x y"})
    info = inspect(path)
    assert info["metadata"] == {"format": "np", "note": "x y"}
    assert info["file_bytes"] == os.path.getsize(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert info["header_bytes"] == n
    got = {t["name"]: t for t in info["tensors"]}
    assert set(got) == set(tensors)
    for name, arr in tensors.items():
        t = got[name]
        assert t["dtype"] == DTYPE_NAMES[arr.dtype], name
        assert t["shape"] == list(arr.shape), name
        assert t["bytes"] == arr.nbytes, name
        assert t["data_offsets"] == header[name]["data_offsets"], name
    assert info["totals"]["bytes"] == sum(a.nbytes for a in tensors.values())
    # lowbit lists tensors in data order.
    offsets = [t["data_offsets"][0] for t in info["tensors"]]
    assert offsets == sorted(offsets)


def test_lowbit_rejects_corrupted_files(tmp_path):
    path = tmp_path / "ok.safetensors"
    safetensors_numpy.save_file({"a": np.ones((4, 4), np.float32)}, str(path))
    data = path.read_bytes()
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[:-3])
    p = run("inspect", str(bad), ok=False)
    assert p.returncode != 0
    assert "truncated.safetensors" in p.stderr and "'a'" in p.stderr
    bad.write_bytes(data[:5])
    p = run("inspect", str(bad), ok=False)
    assert p.returncode != 0 and "8-byte header length" in p.stderr


def test_safetensors_reads_lowbit_copies(tmp_path):
    rng = np.random.default_rng(2)
    tensors = sample_tensors(rng)
    src = tmp_path / "in.safetensors"
    dst = tmp_path / "out.safetensors"
    safetensors_numpy.save_file(tensors, str(src), metadata={"k": "v"})
    # Nothing matches the include glob: every tensor is copied unchanged through lowbit's writer.
    run("quantize", str(src), "-o", str(dst), "--qtype", "convrot8", "--include", "no-such-*")
    back = safetensors_numpy.load_file(str(dst))
    assert set(back) == set(tensors)
    for name, arr in tensors.items():
        assert back[name].dtype == arr.dtype, name
        assert back[name].shape == arr.shape, name
        assert back[name].tobytes() == arr.tobytes(), name
    with open(dst, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert (8 + n) % 8 == 0
    assert header["__metadata__"]["k"] == "v"


def test_safetensors_reads_lowbit_quantized_files(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    b = rng.standard_normal((32,)).astype(np.float32)
    src = tmp_path / "in.safetensors"
    safetensors_numpy.save_file({"lin.weight": w, "lin.bias": b}, str(src))
    dst = tmp_path / "comfy.safetensors"
    run("quantize", str(src), "-o", str(dst), "--qtype", "convrotcomfyw4a4", "--format", "comfy")
    back = safetensors_numpy.load_file(str(dst))
    assert back["lin.weight"].dtype == np.int8 and back["lin.weight"].shape == (32, 128)
    assert back["lin.weight_scale"].dtype == np.float32 and back["lin.weight_scale"].shape == (32,)
    conf = json.loads(bytes(back["lin.comfy_quant"]).decode())
    assert conf == {"format": "convrot_w4a4", "convrot_groupsize": 256}
    assert back["lin.bias"].tobytes() == b.tobytes()
    # Decode comfy's layout here (low nibble = even column, signed 4-bit), undo the rotation
    # with an independently built regular-Hadamard matrix, and compare with the original.
    packed = back["lin.weight"].view(np.uint8).astype(np.int32)
    lo = packed & 0xF
    hi = packed >> 4
    codes = np.empty((32, 256), np.int32)
    codes[:, 0::2] = np.where(lo >= 8, lo - 16, lo)
    codes[:, 1::2] = np.where(hi >= 8, hi - 16, hi)
    assert codes.min() >= -7 and codes.max() <= 7
    r4 = 0.5 * np.array([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], np.float64)
    r = r4
    for _ in range(3):
        r = np.kron(r, r4)
    w_rot_deq = codes * back["lin.weight_scale"][:, None].astype(np.float64)
    w_deq = w_rot_deq @ r  # R is symmetric and its own inverse
    rel = np.linalg.norm(w_deq - w) / np.linalg.norm(w)
    assert rel < 0.2, rel  # 4-bit per-row on Gaussian weights: about 0.1

    dst2 = tmp_path / "lowbit.safetensors"
    run("quantize", str(src), "-o", str(dst2), "--qtype", "convrot8")
    back2 = safetensors_numpy.load_file(str(dst2))
    marker = json.loads(bytes(back2["lin.lowbit_quant"]).decode())
    assert marker["qtype"] == "convrot8"
    assert marker["rot"] == 256 and marker["bits"] == 8
    info = inspect(dst2)
    assert [(l["prefix"], l["qtype"]) for l in info["layers"]] == [("lin.", "convrot8")]


def test_sharded_checkpoints_through_the_cli(tmp_path):
    """Shards written by safetensors.numpy with a diffusers-style index: `lowbit inspect` lists
    them; `lowbit quantize` into an index writes shards that safetensors.numpy reads back, each
    tensor copied or quantized in its own shard and listed there by the new index; into one file
    it writes what quantizing the merged file writes."""
    rng = np.random.default_rng(11)
    shards = {
        "diffusion_pytorch_model-00001-of-00002.safetensors": {
            "blocks.0.attn.to_q.weight": rng.standard_normal((32, 256)).astype(np.float32),
            "blocks.0.attn.to_k.bias": rng.standard_normal((32,)).astype(np.float32)},
        "diffusion_pytorch_model-00002-of-00002.safetensors": {
            "blocks.0.attn.to_k.weight": rng.standard_normal((32, 256)).astype(np.float32),
            "blocks.0.attn.to_q.bias": rng.standard_normal((32,)).astype(np.float32),
            "scale_shift_table": rng.standard_normal((1, 6, 64)).astype(np.float32)},
    }
    src, out = tmp_path / "transformer", tmp_path / "q"
    src.mkdir()
    out.mkdir()
    weight_map, merged = {}, {}
    for name, tensors in shards.items():
        safetensors_numpy.save_file(tensors, str(src / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
        merged.update(tensors)
    index = {"metadata": {"total_size": sum(v.nbytes for v in merged.values())},
             "weight_map": weight_map}
    (src / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))

    info = inspect(src)
    assert sorted(info["shards"]) == sorted(str(src / n) for n in shards)
    assert {t["name"]: t["shard"] for t in info["tensors"]} == weight_map
    assert info["totals"]["tensors"] == len(weight_map)

    out_index = out / "diffusion_pytorch_model.safetensors.index.json"
    p = run("quantize", str(src), "-o", str(out_index), "--qtype", "convrot8", "-q")
    assert "2 layers quantized" in p.stdout and "2 shards" in p.stdout
    new_index = json.loads(out_index.read_text())
    seen = {}
    for name in shards:
        back = safetensors_numpy.load_file(str(out / name))
        seen.update({k: name for k in back})
        for k, v in back.items():
            if k in shards[name] and not k.endswith(".weight"):
                assert v.tobytes() == shards[name][k].tobytes(), k  # copied byte for byte
    assert new_index["weight_map"] == seen
    assert seen["blocks.0.attn.to_k.weight_scale"] == seen["blocks.0.attn.to_k.lowbit_quant"] \
        == "diffusion_pytorch_model-00002-of-00002.safetensors"
    sizes = sum(v.nbytes for name in shards
                for v in safetensors_numpy.load_file(str(out / name)).values())
    assert new_index["metadata"]["total_size"] == sizes
    layers = inspect(out_index)["layers"]
    assert sorted(l["prefix"] for l in layers) == ["blocks.0.attn.to_k.", "blocks.0.attn.to_q."]

    one = tmp_path / "one.safetensors"
    run("quantize", str(src / "diffusion_pytorch_model.safetensors.index.json"), "-o", str(one),
        "--qtype", "convrot8", "-q")
    ref_src, ref = tmp_path / "merged.safetensors", tmp_path / "ref.safetensors"
    safetensors_numpy.save_file(merged, str(ref_src))
    run("quantize", str(ref_src), "-o", str(ref), "--qtype", "convrot8", "-q")
    a, b = safetensors_numpy.load_file(str(one)), safetensors_numpy.load_file(str(ref))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    # Back to full precision, shard by shard: the original names in the original shards, the
    # copies exact, the restored weights within convrot8's error of the originals.
    restored = tmp_path / "restored"
    restored.mkdir()
    p = run("dequantize", str(out_index), "-o", str(restored / "model.safetensors.index.json"),
            "--dtype", "f32")
    assert "2 layers restored" in p.stdout
    assert json.loads((restored / "model.safetensors.index.json").read_text())["weight_map"] \
        == weight_map
    for name, tensors in shards.items():
        back = safetensors_numpy.load_file(str(restored / name))
        assert back.keys() == tensors.keys()
        for k, v in tensors.items():
            if k.endswith(".weight"):
                assert back[k].dtype == np.float32 and back[k].shape == v.shape
                assert np.linalg.norm(back[k] - v) / np.linalg.norm(v) < 0.02, k
            else:
                assert back[k].tobytes() == v.tobytes(), k
    # Output shards onto the input's own: refused, the input untouched.
    p = run("quantize", str(src), "-o", str(src / "x.safetensors.index.json"), "--qtype",
            "convrot8", ok=False)
    assert p.returncode != 0 and "is an input shard" in p.stderr
    assert sorted(os.listdir(src)) == sorted([*shards, "diffusion_pytorch_model.safetensors.index.json"])
