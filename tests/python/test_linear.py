"""lowbit's rotated quantized linear layers through Python (numpy): qtype rules against SPEC
section 3 hand values, the Hadamard rotation against a dense fp64 R_n, the layer against float
references, packed-weight round trips, zero-copy views of the packed parts, errors."""
import numpy as np
import pytest

import lowbit
from conftest import linear_cpu_backend_missing

RNG = np.random.default_rng(3)


pytestmark = pytest.mark.skipif(not lowbit.has("linear"), reason="no linear module in build")
needs_cpu_backend = pytest.mark.skipif(bool(linear_cpu_backend_missing()),
                                       reason=linear_cpu_backend_missing())

R4 = 0.5 * np.array([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], np.float64)


def dense_rotation(n):
    r = np.ones((1, 1))
    while r.shape[0] < n:
        r = np.kron(r, R4)
    return r


def cos(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return a @ b / (np.linalg.norm(a) * np.linalg.norm(b))


def test_qtype_names_and_rules():
    for name in ("convrot8", "convrotint2", "convrotint4", "convrotint8", "convrotbitnet",
                 "convrotcomfyw4a4", "convrot4", "convrotfp8"):
        assert name in lowbit.QTYPES and lowbit.parse_qtype(name) == name
    with pytest.raises(lowbit.Error):
        lowbit.parse_qtype("convrot3")
    assert lowbit.qtype_bits("convrotint3") == 3 and lowbit.qtype_bits("convrot8") == 8
    # rot = min(256, largest power of 4 dividing K)
    assert [lowbit.rotation_block(k) for k in (1024, 256, 64, 48, 32, 8)] == [256, 256, 64, 16,
                                                                             16, 4]
    assert lowbit.can_quantize("convrot8", 32, 64) == (True, "")
    ok, why = lowbit.can_quantize("convrot8", 12, 64)
    assert not ok and why
    ok, why = lowbit.can_quantize("convrotcomfyw4a4", 16, 128)
    assert not ok and why
    assert lowbit.qtype_group("convrotint4", 64) == 64 and lowbit.qtype_group("convrotint4",
                                                                              384) == 128


@needs_cpu_backend
def test_rotation_is_the_fast_kronecker_transform():
    r16 = dense_rotation(16)
    np.testing.assert_allclose(r16 @ r16, np.eye(16), atol=1e-12)  # symmetric, own inverse
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    for block in (16, 64):
        out = np.zeros_like(x)
        lowbit.hadamard_rotate(x, block, out)
        want = (x.astype(np.float64).reshape(5, 64 // block, block) @ dense_rotation(block))
        np.testing.assert_allclose(out, want.reshape(5, 64), rtol=1e-6, atol=1e-6)
    inplace = x.copy()
    lowbit.hadamard_rotate(inplace, 16, inplace)
    ref = np.zeros_like(x)
    lowbit.hadamard_rotate(x, 16, ref)
    np.testing.assert_array_equal(inplace, ref)


@needs_cpu_backend
@pytest.mark.parametrize("qtype,cos_min", [("convrot8", 0.999), ("convrotint8", 0.999),
                                           ("convrotint4", 0.98), ("convrotfp8", 0.995)])
def test_layer_forward_backward_vs_float(qtype, cos_min):
    o, k, m = 32, 64, 9
    w = RNG.standard_normal((o, k)).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    layer = lowbit.QuantizedLinear.quantize(w, qtype)
    assert (layer.qtype, layer.out_features, layer.in_features, layer.device) == (qtype, o, k,
                                                                                  "cpu")
    out = np.zeros((m, o), np.float32)
    layer.forward(x, out, bias=bias)
    assert cos(out, x @ w.T + bias) >= cos_min
    deq = np.zeros((o, k), np.float32)
    layer.dequantize(deq)
    assert cos(deq, w) >= cos_min
    g = RNG.standard_normal((m, o)).astype(np.float32)
    gx = np.zeros((m, k), np.float32)
    layer.backward_input(g, gx)
    np.testing.assert_allclose(gx, g.astype(np.float64) @ deq, rtol=1e-4, atol=1e-4)


@needs_cpu_backend
def test_packed_weight_round_trip_and_views():
    w = RNG.standard_normal((16, 256)).astype(np.float32)
    packed = lowbit.quantize_weight(w, "convrotint4")
    parts = packed.tensors()
    assert set(parts) >= {"codes", "scales", "ratios"}
    assert parts["codes"].shape == (16, 256 // 8 * 4) and parts["codes"].dtype == np.uint8
    # Views into the object, no copy: the same memory on each call.
    assert parts["codes"].ctypes.data == packed.tensors()["codes"].ctypes.data
    copy = lowbit.PackedWeight("convrotint4", 16, 256, {n: a.copy() for n, a in parts.items()})
    for n, a in copy.tensors().items():
        np.testing.assert_array_equal(a, parts[n])
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    y1, y2 = np.zeros((3, 16), np.float32), np.zeros((3, 16), np.float32)
    lowbit.QuantizedLinear.quantize(w, "convrotint4").forward(x, y1)
    lowbit.QuantizedLinear.from_packed(copy).forward(x, y2)
    np.testing.assert_array_equal(y1, y2)
    back = lowbit.QuantizedLinear.from_packed(copy).to_packed()
    np.testing.assert_array_equal(back.tensors()["codes"], parts["codes"])
    with pytest.raises(lowbit.Error) as info:
        lowbit.PackedWeight("convrotint4", 16, 256, {"codes": parts["codes"]})
    assert "scales" in str(info.value)


@needs_cpu_backend
def test_layer_errors_write_nothing():
    layer = lowbit.QuantizedLinear.quantize(RNG.standard_normal((16, 64)).astype(np.float32),
                                            "convrot8")
    out = np.full((4, 16), 5, np.float32)
    with pytest.raises(lowbit.Error) as info:
        layer.forward(np.zeros((4, 48), np.float32), out)
    assert info.value.op.startswith("QuantizedLinear") or "forward" in str(info.value)
    assert np.all(out == 5)
    with pytest.raises(lowbit.Error):
        lowbit.hadamard_rotate(np.zeros((2, 24), np.float32), 16, np.zeros((2, 24), np.float32))
