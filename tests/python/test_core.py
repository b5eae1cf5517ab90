"""lowbit core through Python: dtype conversions against independent numpy references and hand
vectors, zero-copy views (writes land in the caller's array, strides honoured), errors raised as
lowbit.Error with the library's message."""
import re

import numpy as np
import pytest

import lowbit
from lowbit import _lowbit

RNG = np.random.default_rng(20261129)


# ---- independent references (numpy only) -----------------------------------------------------

def ref_f32_to_bf16_bits(x):
    """Round-to-nearest-even of fp32 bits to bf16 bits; any NaN -> the canonical 0x7FFF (the
    GPU's cvt rule, include/lowbit/dtype.h)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = np.where(nan, 0x7FFF, rounded)
    return out.astype(np.uint16)


def minifloat_table(exp_bits, man_bits, bias, fn):
    """Values of every code of a sign/exponent/mantissa format (fn: e4m3fn's NaN-only top)."""
    vals = np.zeros(256, np.float64)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> man_bits) & ((1 << exp_bits) - 1)
        m = c & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if fn and e == top and m == (1 << man_bits) - 1:
            v = np.nan
        elif not fn and e == top:
            v = np.inf if m == 0 else np.nan
        elif e == 0:
            v = m * 2.0 ** (1 - bias - man_bits)
        else:
            v = (1 + m / 2 ** man_bits) * 2.0 ** (e - bias)
        vals[c] = s * v
    return vals


E4M3 = minifloat_table(4, 3, 7, fn=True)
E5M2 = minifloat_table(5, 2, 15, fn=False)


def ref_encode_saturating(x, table):
    """Nearest finite code by exhaustive search, ties to the even code, sign kept; any NaN ->
    0x7F."""
    finite = [c for c in range(128) if np.isfinite(table[c])]
    mags = np.array([table[c] for c in finite])
    out = np.zeros(x.shape, np.uint8)
    for i, v in np.ndenumerate(x.astype(np.float64)):
        sign = 0x80 if np.signbit(v) else 0
        if np.isnan(v):
            out[i] = 0x7F
            continue
        a = abs(v)
        if a >= mags.max():  # saturating: beyond the largest finite value (inf too) -> max
            out[i] = finite[int(np.argmax(mags))] | sign
            continue
        d = np.abs(mags - a)
        best = np.flatnonzero(d == d.min())
        codes = [finite[b] for b in best]
        even = [c for c in codes if c % 2 == 0]
        out[i] = (even[0] if even else codes[0]) | sign
    return out


def exact_midpoints(table, max_code):
    mags = np.array([table[c] for c in range(max_code + 1)])
    return ((mags[:-1] + mags[1:]) / 2).astype(np.float32)


def convert_new(src, dtype, src_dtype=None):
    return lowbit.convert(src, dtype=dtype, src_dtype=src_dtype)


# ---- basics ----------------------------------------------------------------------------------

def test_version_and_build_info():
    assert re.fullmatch(r"\d+\.\d+\.\d+", lowbit.__version__)
    assert lowbit.version() == lowbit.__version__
    info = lowbit.build_info()
    assert "C++17" in info
    n = lowbit.cuda_device_count()
    assert n >= 0
    if n == 0:
        assert lowbit.cuda_unavailable_reason() != ""
        with pytest.raises(lowbit.Error):
            lowbit.cuda_device_info(0)
    else:
        assert lowbit.cuda_device_info(0)["multiprocessors"] > 0


def test_has_reports_families():
    assert lowbit.has("core")
    for fam in lowbit.FAMILIES:
        assert isinstance(lowbit.has(fam), bool)
    with pytest.raises(ValueError):
        lowbit.has("nonsense")


def test_error_is_valueerror_with_library_message():
    a = np.zeros((3, 4), np.float32)
    dst = np.full((3, 5), 7, np.float32)
    with pytest.raises(lowbit.Error) as info:
        lowbit.convert(a, dst)
    e = info.value
    assert isinstance(e, ValueError)
    assert e.op == "convert" and e.argument == "dst"
    assert str(e).startswith("convert: dst: ")
    assert "(3, 4)" in str(e) and "(3, 5)" in str(e)
    assert np.all(dst == 7), "nothing may be written on an argument error"


# ---- dtype conversions -------------------------------------------------------------------------

def test_bf16_hand_vectors():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.0, np.inf, -np.inf,
                  3.4028235e38, 0.0, -0.0], np.float32)
    want = np.array([0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F80, 0xFF80, 0x7F80, 0x0000, 0x8000],
                    np.uint16)
    np.testing.assert_array_equal(convert_new(x, "bf16"), want)
    nan = np.array([0x7FC00000, 0xFFC00000, 0x7F800001], np.uint32).view(np.float32)
    np.testing.assert_array_equal(convert_new(nan, "bf16"), [0x7FFF] * 3)  # canonical NaN


def test_bf16_round_trip_vs_numpy_reference():
    x = (RNG.standard_normal(4099) * np.exp(RNG.uniform(-30, 30, 4099))).astype(np.float32)
    bits = convert_new(x, "bf16")
    np.testing.assert_array_equal(bits, ref_f32_to_bf16_bits(x))
    back = convert_new(bits, "f32", src_dtype="bf16")
    np.testing.assert_array_equal(back.view(np.uint32), bits.astype(np.uint32) << 16)


def test_f16_vs_numpy():
    x = np.concatenate([
        (RNG.standard_normal(3001) * np.exp(RNG.uniform(-20, 12, 3001))).astype(np.float32),
        np.array([65504, 65519, 65520, 1e6, -1e6, 2 ** -24, 2 ** -25, 3 * 2 ** -25, 2 ** -26,
                  np.inf, -np.inf, 0.0, -0.0], np.float32)])
    h = convert_new(x, "f16")
    assert h.dtype == np.float16
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(h.view(np.uint16), want.view(np.uint16))
    back = convert_new(h, "f32")
    np.testing.assert_array_equal(back, h.astype(np.float32))
    nan = np.array([0x7FC00000, 0xFFC00000], np.uint32).view(np.float32)
    np.testing.assert_array_equal(convert_new(nan, "f16").view(np.uint16), [0x7FFF] * 2)


@pytest.mark.parametrize("name,table,max_code", [("e4m3", E4M3, 0x7E), ("e5m2", E5M2, 0x7B)])
def test_fp8_decode_all_codes(name, table, max_code):
    codes = np.arange(256, dtype=np.uint8)
    with np.errstate(invalid="ignore"):  # some e5m2 NaN codes decode to signalling NaNs
        got = convert_new(codes, "f32", src_dtype=name).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(table))
    ok = ~np.isnan(table)
    np.testing.assert_array_equal(got[ok], table[ok])


@pytest.mark.parametrize("name,table,max_code", [("e4m3", E4M3, 0x7E), ("e5m2", E5M2, 0x7B)])
def test_fp8_encode_vs_exhaustive_search(name, table, max_code):
    maxv = table[max_code]
    x = np.concatenate([
        (RNG.standard_normal(1500) * np.exp(RNG.uniform(-12, 12, 1500))).astype(np.float32),
        exact_midpoints(table, max_code), -exact_midpoints(table, max_code),
        np.array([maxv, maxv * 1.1, 1e30, -1e30, np.inf, -np.inf, np.nan, 0.0, -0.0],
                 np.float32)])
    got = convert_new(x, name)
    np.testing.assert_array_equal(got, ref_encode_saturating(x, table))


def test_e4m3_hand_vectors():
    x = np.array([1.0, 448.0, 500.0, np.inf, -np.inf, 2 ** -9, 2 ** -10, 3 * 2 ** -10, 1.0625,
                  1.1875, -0.0], np.float32)
    want = [0x38, 0x7E, 0x7E, 0x7E, 0xFE, 0x01, 0x00, 0x02, 0x38, 0x3A, 0x80]
    np.testing.assert_array_equal(convert_new(x, "e4m3"), np.array(want, np.uint8))
    nan = np.array([0x7FC00000, 0xFFC00000], np.uint32).view(np.float32)
    np.testing.assert_array_equal(convert_new(nan, "e4m3"), [0x7F, 0x7F])


def test_fp8_through_fp8_to_bf16_and_f16():
    codes = np.arange(256, dtype=np.uint8)
    for name, table in (("e4m3", E4M3), ("e5m2", E5M2)):
        h = np.zeros(256, np.float16)
        lowbit.convert(lowbit.typed(codes, name), h)
        ok = np.isfinite(table)
        np.testing.assert_array_equal(h[ok].astype(np.float64), table[ok])
        b = lowbit.convert(codes, dtype="bf16", src_dtype=name)
        np.testing.assert_array_equal(b[ok], ref_f32_to_bf16_bits(table[ok].astype(np.float32)))


def test_e2m1_packed_hand_vectors():
    # SPEC 3.4: index = number of boundaries {0.25,0.75,1.25,1.75,2.5,3.5,5} strictly below |x|.
    x = np.array([0.25, 0.26, 0.75, 0.76, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 100.0, -1.0, 0.0, -6.0],
                 np.float32)
    idx = [0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 7, 2 | 8, 0, 7 | 8]
    packed = convert_new(x, "e2m1x2")
    assert packed.shape == (7,) and packed.dtype == np.uint8
    want = [idx[2 * i] | (idx[2 * i + 1] << 4) for i in range(7)]
    np.testing.assert_array_equal(packed, np.array(want, np.uint8))
    mags = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    back = convert_new(packed, "f32", src_dtype="e2m1x2")
    codes = np.array(idx)
    np.testing.assert_array_equal(back, np.where(codes & 8, -1, 1) * mags[codes & 7])


def test_i4_packed_and_i8_hand_vectors():
    x = np.array([0.5, 1.5, 2.5, -8.5, 7.6, np.nan, 1.0, -1.0], np.float32)
    q = [0, 2, 2, -8, 7, 0, 1, -1]
    packed = convert_new(x, "i4x2")
    want = [(q[2 * i] & 0xF) | ((q[2 * i + 1] & 0xF) << 4) for i in range(4)]
    np.testing.assert_array_equal(packed, np.array(want, np.uint8))
    np.testing.assert_array_equal(convert_new(packed, "f32", src_dtype="i4x2"),
                                  np.array(q, np.float32))
    y = np.array([0.5, 1.5, -2.5, 200.0, -200.0, np.nan, 126.5], np.float32)
    np.testing.assert_array_equal(convert_new(y, "i8"), np.array([0, 2, -2, 127, -128, 0, 126],
                                                                 np.int8))
    # int8 storage holds the packed int4 codes of ComfyUI checkpoints just as well as uint8.
    signed = packed.view(np.int8)
    np.testing.assert_array_equal(convert_new(signed, "f32", src_dtype="i4x2"),
                                  np.array(q, np.float32))


# ---- zero copy and strides ---------------------------------------------------------------------

def test_inspect_is_zero_copy_and_strides_in_elements():
    a = np.zeros((5, 6, 8), np.float32)
    info = lowbit.inspect(a)
    assert info["data"] == a.ctypes.data
    assert info["shape"] == (5, 6, 8) and info["strides"] == (48, 8, 1)
    v = a[1:, ::2, 3:]
    info = lowbit.inspect(v)
    assert info["data"] == v.ctypes.data == a.ctypes.data + (48 + 3) * 4
    assert info["shape"] == (4, 3, 5) and info["strides"] == (48, 16, 1)
    t = lowbit.inspect(a.transpose(2, 0, 1))
    assert t["strides"] == (1, 48, 8)
    p = lowbit.inspect(lowbit.typed(np.zeros((4, 3), np.uint8)[::2], "e2m1x2"))
    assert p["shape"] == (2, 6) and p["strides"] == (12, 1) and p["dtype"] == "e2m1x2"
    b = lowbit.inspect(lowbit.typed(np.zeros((2, 3), np.uint16), "bf16"))
    assert b["dtype"] == "bf16" and b["describe"] == "(2, 3) bf16 cpu"


def test_writes_land_in_callers_strided_view():
    src = RNG.standard_normal((6, 5)).astype(np.float32)
    big = np.full((8, 16), 7.0, np.float16)
    view = big[1:7, 2:12:2]
    out = lowbit.convert(src, view)
    assert out is view
    np.testing.assert_array_equal(big[1:7, 2:12:2], src.astype(np.float16))
    mask = np.ones(big.shape, bool)
    mask[1:7, 2:12:2] = False
    assert np.all(big[mask] == 7.0), "elements outside the view were written"


def test_strided_and_transposed_inputs():
    base = RNG.standard_normal((7, 9, 4)).astype(np.float32)
    for src in (base[::2, 1::3], base.transpose(1, 0, 2), base[:, :, 1], base[:, ::-1]):
        out = convert_new(src, "bf16")
        np.testing.assert_array_equal(out, ref_f32_to_bf16_bits(np.ascontiguousarray(src)))


def test_typed_output_is_written_in_place():
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    store = np.zeros((3, 8), np.uint16)
    ret = lowbit.convert(x, lowbit.typed(store, "bf16"))
    assert ret is store
    np.testing.assert_array_equal(store, ref_f32_to_bf16_bits(x))
    cols = np.zeros((3, 4, 2), np.uint8)
    lowbit.convert(x.reshape(3, 4, 2)[:, :, :], lowbit.typed(cols, "e4m3"))
    np.testing.assert_array_equal(cols.ravel(), ref_encode_saturating(x.ravel(), E4M3))


def test_threads_argument_gives_same_bits():
    x = RNG.standard_normal(10001).astype(np.float32)
    a = lowbit.convert(x, dtype="e5m2", threads=1)
    b = lowbit.convert(x, dtype="e5m2", threads=2)
    np.testing.assert_array_equal(a, b)


# ---- argument errors -----------------------------------------------------------------------------

def test_errors_name_the_argument():
    x = np.zeros((2, 4), np.float32)
    cases = [
        (lambda: lowbit.convert(x, lowbit.typed(np.zeros((2, 4), np.float32), "bf16")), "dst",
         "16-bit integer storage"),
        (lambda: lowbit.convert(x, lowbit.typed(np.zeros((2, 4), np.uint8)[:, ::2], "e2m1x2")),
         "dst", "contiguous innermost"),
        (lambda: lowbit.convert(np.zeros((1,) * 7, np.float32), np.zeros((1,) * 7, np.float32)),
         "src", "at most 6 dimensions"),
        (lambda: lowbit.convert(np.zeros(4, bool), np.zeros(4, np.float32)), "src", "bool"),
        (lambda: lowbit.convert([1.0, 2.0], np.zeros(2, np.float32)), "src", "list"),
        (lambda: lowbit.convert(x, np.zeros((2, 4), np.int32)), "dst", "dtype pair"),
    ]
    for fn, arg, fragment in cases:
        with pytest.raises(lowbit.Error) as info:
            fn()
        assert info.value.argument == arg, str(info.value)
        assert fragment in str(info.value), str(info.value)


def test_read_only_output_rejected_read_only_input_accepted():
    x = np.arange(4, dtype=np.float32)
    x.setflags(write=False)
    out = convert_new(x, "f16")
    np.testing.assert_array_equal(out, x.astype(np.float16))
    ro = np.zeros(4, np.float16)
    ro.setflags(write=False)
    with pytest.raises(lowbit.Error, match="writable"):
        lowbit.convert(x, ro)


def test_bad_dtype_name():
    with pytest.raises(lowbit.Error, match="expected one of"):
        lowbit.typed(np.zeros(2, np.uint8), "fp7")
    assert lowbit.typed(np.zeros(2, np.uint16), "bfloat16").dtype == lowbit.DType.bf16
    assert lowbit.typed(np.zeros(2, np.uint8), lowbit.DType.e4m3).dtype == lowbit.DType.e4m3


def test_empty_storage_shapes():
    assert lowbit.empty((3, 8), "e2m1x2").shape == (3, 4)
    assert lowbit.empty((3, 8), "bf16").dtype == np.uint16
    with pytest.raises(lowbit.Error, match="even innermost"):
        lowbit.empty((3, 7), "i4x2")


def test_missing_family_raises_clear_error():
    for name, family in lowbit._FAMILY_OF.items():
        if lowbit.has(family):
            assert getattr(lowbit, name) is getattr(_lowbit, name)
        else:
            with pytest.raises(NotImplementedError, match=f"no {family} module"):
                getattr(lowbit, name)
            assert not hasattr(lowbit, name)
