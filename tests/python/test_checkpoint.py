"""lowbit's checkpoint module through Python: the memory-mapped safetensors reader (numpy views,
no copy), quantize_checkpoint in lowbit and ComfyUI formats, and loading the layers back as
PackedWeight equal to quantizing the weight directly."""
import json
import struct

import numpy as np
import pytest

import lowbit
from conftest import linear_cpu_backend_missing

pytestmark = [
    pytest.mark.skipif(not lowbit.has("checkpoint"), reason="no checkpoint module in build"),
]
RNG = np.random.default_rng(9)
FILE_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
               np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.int64): "I64"}


def write_safetensors(path, tensors, metadata=None):
    """A minimal safetensors writer (8-byte header length, JSON header, data)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": FILE_DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_reader_views_and_errors(tmp_path):
    w = RNG.standard_normal((4, 6)).astype(np.float32)
    ids = np.arange(5, dtype=np.int64)
    path = tmp_path / "a.safetensors"
    write_safetensors(path, {"w": w, "ids": ids}, {"who": "test"})
    r = lowbit.SafetensorsReader(str(path))
    assert sorted(r.names()) == ["ids", "w"] and len(r) == 2 and "w" in r
    arr, dtype = r.get("w")
    assert dtype == "F32" and not arr.flags.writeable
    np.testing.assert_array_equal(arr, w)
    np.testing.assert_array_equal(r.get("ids")[0], ids)
    assert r.metadata() == {"who": "test"}
    assert r.info("w") == {"dtype": "F32", "shape": (4, 6), "nbytes": 96}
    with pytest.raises(lowbit.Error):
        r.get("nope")
    with pytest.raises(lowbit.Error):
        lowbit.SafetensorsReader(str(tmp_path / "missing.safetensors"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(lowbit.Error):
        lowbit.SafetensorsReader(str(bad))


@pytest.mark.skipif(bool(linear_cpu_backend_missing()), reason=linear_cpu_backend_missing())
@pytest.mark.parametrize("qtype,fmt", [("convrot8", "lowbit"), ("convrotint4", "lowbit"),
                                       ("convrotcomfyw4a4", "comfy")])
def test_quantize_checkpoint_round_trip(tmp_path, qtype, fmt):
    w = RNG.standard_normal((16, 256)).astype(np.float32)
    src = tmp_path / "in.safetensors"
    write_safetensors(src, {"blk.proj.weight": w, "blk.proj.bias": np.ones(16, np.float32),
                            "blk.norm.weight": np.ones(7, np.float16)})
    out = tmp_path / "out.safetensors"
    dry = lowbit.quantize_checkpoint(str(src), str(out), qtype, format=fmt, dry_run=True)
    assert not out.exists() and dry["files_out"] == []
    calls = []
    report = lowbit.quantize_checkpoint(str(src), str(out), qtype, format=fmt,
                                        progress=lambda *a: calls.append(a))
    assert [(l["quantized"], l["bytes_after"]) for l in dry["layers"]] == \
        [(l["quantized"], l["bytes_after"]) for l in report["layers"]]
    assert calls and calls[-1][0] == calls[-1][1]
    layers = {l["name"]: l for l in report["layers"]}
    assert layers["blk.proj.weight"]["quantized"] and layers["blk.proj.weight"]["qtype"] == qtype
    assert 0 <= layers["blk.proj.weight"]["rel_error"] < 0.2
    r = lowbit.SafetensorsReader(str(out))
    markers = lowbit.find_layer_markers(r)
    assert [(m["prefix"], m["format"]) for m in markers] == [("blk.proj.", fmt)]
    packed = lowbit.load_quantized_layer(r, markers[0])
    want = lowbit.quantize_weight(w, qtype)
    assert packed.qtype == qtype
    for name, arr in want.tensors().items():
        np.testing.assert_array_equal(packed.tensors()[name], arr)
    np.testing.assert_array_equal(r.get("blk.norm.weight")[0], np.ones(7, np.float16))


@pytest.mark.skipif(bool(linear_cpu_backend_missing()), reason=linear_cpu_backend_missing())
def test_lowbit_marker_and_part_dtypes_match_the_quantizers_file(tmp_path):
    """lowbit.lowbit_marker / PackedWeight.dtypes (what lowbit.torch's state_dict writes) agree
    with the file `quantize_checkpoint` writes for the same weight."""
    w = RNG.standard_normal((32, 256)).astype(np.float32)
    src = tmp_path / "in.safetensors"
    write_safetensors(src, {"proj.weight": w.astype(np.float16)})
    for qtype in ("convrot4", "convrotfp8", "convrotint4"):
        out = tmp_path / f"{qtype}.safetensors"
        lowbit.quantize_checkpoint(str(src), str(out), qtype)
        r = lowbit.SafetensorsReader(str(out))
        packed = lowbit.quantize_weight(w.astype(np.float16).astype(np.float32), qtype)
        marker = r.get("proj.lowbit_quant")[0].tobytes().decode("utf-8")
        assert lowbit.lowbit_marker(packed, "F16") == marker
        info = json.loads(marker)
        assert (info["qtype"], info["out_features"], info["in_features"], info["source_dtype"],
                info["version"]) == (qtype, 32, 256, "F16", 1)
        file_dtype = {"i8": "I8", "u8": "U8", "e4m3": "F8_E4M3", "f32": "F32"}
        for part, dtype in packed.dtypes().items():
            name = {"codes": "weight", "scales": "weight_scale"}.get(part, "weight_" + part)
            assert r.get("proj." + name)[1] == file_dtype[dtype], (qtype, part)
    assert packed.dtypes()["ratios"] == "f32"
    with pytest.raises(lowbit.Error, match="source_dtype"):
        lowbit.lowbit_marker(packed, "F33")


@pytest.mark.skipif(bool(linear_cpu_backend_missing()), reason=linear_cpu_backend_missing())
@pytest.mark.parametrize("qtype,fmt", [("convrot8", "lowbit"), ("convrotcomfyw4a4", "comfy")])
def test_dequantize_checkpoint_restores_the_weights(tmp_path, qtype, fmt):
    """dequantize_checkpoint: the restored weight is lowbit.dequantize_weight of the layer (the
    original basis), in the dtype asked for; the other tensors are copied."""
    w = RNG.standard_normal((16, 256)).astype(np.float32)
    src = tmp_path / "in.safetensors"
    write_safetensors(src, {"blk.proj.weight": w, "blk.proj.bias": np.ones(16, np.float32)})
    mid, out = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    lowbit.quantize_checkpoint(str(src), str(mid), qtype, format=fmt)
    calls = []
    rep = lowbit.dequantize_checkpoint(str(mid), str(out), dtype="f32",
                                       progress=lambda *a: calls.append(a))
    assert calls and calls[-1][0] == calls[-1][1]
    assert [(l["name"], l["qtype"], l["dtype"]) for l in rep["layers"]] == \
        [("blk.proj.weight", qtype, "F32")]
    r = lowbit.SafetensorsReader(str(out))
    assert sorted(r.names()) == ["blk.proj.bias", "blk.proj.weight"]
    want = np.zeros((16, 256), np.float32)
    lowbit.dequantize_weight(lowbit.quantize_weight(w, qtype), want)
    np.testing.assert_array_equal(r.get("blk.proj.weight")[0], want)
    assert np.linalg.norm(want - w) / np.linalg.norm(w) < (0.02 if qtype == "convrot8" else 0.2)
    # f16: dequantize_weight rounded to nearest even (numpy's float32 -> float16 rounding).
    lowbit.dequantize_checkpoint(str(mid), str(tmp_path / "h.safetensors"), dtype="f16")
    h, dt = lowbit.SafetensorsReader(str(tmp_path / "h.safetensors")).get("blk.proj.weight")
    assert dt == "F16"
    np.testing.assert_array_equal(h, want.astype(np.float16))
    # The marker's source dtype (F32 here) is the default; a bad dtype names itself.
    lowbit.dequantize_checkpoint(str(mid), str(tmp_path / "s.safetensors"))
    assert lowbit.SafetensorsReader(str(tmp_path / "s.safetensors")).info("blk.proj.weight")[
        "dtype"] == ("F32" if fmt == "lowbit" else "BF16")
    with pytest.raises(lowbit.Error, match="dtype"):
        lowbit.dequantize_checkpoint(str(mid), str(tmp_path / "x.safetensors"), dtype="i8")
    assert not (tmp_path / "x.safetensors").exists()
