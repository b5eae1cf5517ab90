// attention() on CUDA runs the k path on the caller's stream and q's prologue and V's passes on
// side streams beside it (session 21, src/core/stream_fork.h). Its output must be the bits of the
// passes run in sequence, on the legacy default stream and on a caller's own stream, and inside a
// CUDA graph captured on the caller's stream: from a thread that already made its side streams
// (they become branches of the graph) and from a fresh thread whose first call is the captured one
// (no streams can be made then: the passes run in sequence). Skipped without a CUDA device.
#include <gtest/gtest.h>

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lowbit/attention.h"
#include "lowbit/core.h"
#include "lowbit/dtype.h"
#include "lowbit/prologue.h"
#include "lowbit/runtime.h"
#include "src/core/prologue_internal.h"
#include "src/cpu/attention_backend.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace {

#ifdef LOWBIT_WITH_CUDA
using harness::HostTensor;

constexpr int64_t B = 1, N = 1000, Hq = 4, Hkv = 2, D = 128;

struct Problem {
  AttentionOptions options;
  Buffer q, k, v, out, ws;
  size_t ws_bytes = 0;
  TensorView qv, kv, vv, ov;

  explicit Problem(AttentionOptions::PV pv)
      : q(Device::cuda, B * N * Hq * D * 2),
        k(Device::cuda, B * N * Hkv * D * 2),
        v(Device::cuda, B * N * Hkv * D * 2),
        out(Device::cuda, B * N * Hq * D * 2) {
    options.pv = pv;
    qv = make_view(q.data(), DType::bf16, {B, N, Hq, D}, Device::cuda);
    kv = make_view(k.data(), DType::bf16, {B, N, Hkv, D}, Device::cuda);
    vv = make_view(v.data(), DType::bf16, {B, N, Hkv, D}, Device::cuda);
    ov = make_view(out.data(), DType::bf16, {B, N, Hq, D}, Device::cuda);
    std::mt19937_64 rng(21);
    Context ctx;
    for (auto [buf, h] : {std::pair{&q, Hq}, std::pair{&k, Hkv}, std::pair{&v, Hkv}}) {
      HostTensor t(DType::bf16, {B, N, h, D});
      t.fill_normal(rng, 0.3f);  // a mean for the K / V smoothing to remove
      copy_to_device(buf->data(), t.bytes.data(), t.bytes.size(), ctx);
    }
    ws_bytes = attention_workspace_bytes(qv, kv, options);
    ws = Buffer(Device::cuda, ws_bytes);
  }
  void run(Context& ctx) {
    attention(qv, kv, vv, ov, nullptr, options, ws.data(), ws_bytes, ctx);
  }
  std::vector<uint8_t> output(Context& ctx) {
    std::vector<uint8_t> h(out.bytes());
    synchronize(ctx);
    copy_to_host(h.data(), out.data(), h.size(), ctx);
    return h;
  }
  void clear(Context& ctx) {
    device_memset(out.data(), 0, out.bytes(), ctx);
    synchronize(ctx);
  }
};

// Captures fn into a CUDA graph on ctx's stream, then replays the graph `replays` times.
void capture_and_replay(Context& ctx, const std::function<void()>& fn, int replays = 1) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.cuda_stream);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::string error;
  try {
    fn();
  } catch (const Error& e) {
    error = e.what();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(error, "");
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < replays; ++i) ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
// A caller's own non-blocking stream and a Context on it (destroyed with the object).
struct OwnStream {
  cudaStream_t stream = nullptr;
  Context ctx;
  OwnStream() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ctx.cuda_stream = stream;
  }
  ~OwnStream() { cudaStreamDestroy(stream); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
};

void run_captured(Problem& p, Context& ctx) {
  capture_and_replay(ctx, [&] { p.run(ctx); });
}

TEST(AttentionStreams, SideStreamsKeepTheBitsOfTheSerialOrder) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
    SCOPED_TRACE(pv == AttentionOptions::fp8 ? "fp8 P.V" : "16-bit P.V");
    Problem p(pv);
    Context legacy;  // the legacy default stream
    detail::AttentionCudaTuning serial;
    serial.serial_passes = true;
    detail::set_attention_cuda_tuning(serial);
    p.run(legacy);
    detail::set_attention_cuda_tuning({});
    const std::vector<uint8_t> want = p.output(legacy);
    bool nonzero = false;
    for (uint8_t b : want) nonzero |= b != 0;
    ASSERT_TRUE(nonzero);

    p.clear(legacy);
    p.run(legacy);
    EXPECT_EQ(p.output(legacy), want) << "legacy default stream";

    cudaStream_t own = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
    Context ctx;
    ctx.cuda_stream = own;
    p.clear(ctx);
    for (int i = 0; i < 3; ++i) p.run(ctx);  // back to back: each call's passes wait for the last
    EXPECT_EQ(p.output(ctx), want) << "caller's stream";

    p.clear(ctx);
    run_captured(p, ctx);
    EXPECT_EQ(p.output(ctx), want) << "graph captured after eager calls";

    // A fresh host thread: its side streams do not exist yet and cannot be made in a capture.
    std::thread([&] {
      cudaStream_t s2 = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
      Context c2;
      c2.cuda_stream = s2;
      p.clear(c2);
      run_captured(p, c2);
      EXPECT_EQ(p.output(c2), want) << "graph captured by a thread's first call";
      p.clear(c2);
      p.run(c2);  // eager again: now the thread makes its side streams
      EXPECT_EQ(p.output(c2), want) << "the thread's first eager call";
      cudaStreamDestroy(s2);
    }).join();
    cudaStreamDestroy(own);
  }
}

// attention() and attention_varlen() without a workspace make theirs stream-ordered
// (src/core/scratch.h): they return while the stream is still busy (a host function holds it
// until a gate opens, or 20 s pass) and give the workspace overload's bits, also inside a graph
// capture (the allocation and its free become graph nodes).
void hold_stream(void* gate) {
  const auto t0 = std::chrono::steady_clock::now();
  auto* g = static_cast<std::atomic<bool>*>(gate);
  while (!g->load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(AttentionStreams, OwnWorkspaceDoesNotWaitForTheStream) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  OwnStream own_stream;
  cudaStream_t own = own_stream.stream;
  Context& ctx = own_stream.ctx;
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
    SCOPED_TRACE(pv == AttentionOptions::fp8 ? "fp8 P.V" : "16-bit P.V");
    Problem p(pv);
    p.run(ctx);
    const std::vector<uint8_t> want = p.output(ctx);
    // The same problem as one packed sequence.
    const TensorView q3 = make_view(p.q.data(), DType::bf16, {N, Hq, D}, Device::cuda);
    const TensorView k3 = make_view(p.k.data(), DType::bf16, {N, Hkv, D}, Device::cuda);
    const TensorView v3 = make_view(p.v.data(), DType::bf16, {N, Hkv, D}, Device::cuda);
    const TensorView o3 = make_view(p.out.data(), DType::bf16, {N, Hq, D}, Device::cuda);
    const std::vector<int64_t> cu = {0, N};
    for (int form = 0; form < 2; ++form) {
      SCOPED_TRACE(form == 0 ? "attention()" : "attention_varlen()");
      auto call = [&] {
        if (form == 0)
          attention(p.qv, p.kv, p.vv, p.ov, nullptr, p.options, ctx);
        else
          attention_varlen(q3, k3, v3, cu, cu, o3, nullptr, p.options, ctx);
      };
      p.clear(ctx);
      call();  // first use: the pool and the kernels' one-time setup
      EXPECT_EQ(p.output(ctx), want) << "eager";

      p.clear(ctx);
      std::atomic<bool> gate{false};
      ASSERT_EQ(cudaLaunchHostFunc(own, hold_stream, &gate), cudaSuccess);
      const auto t0 = std::chrono::steady_clock::now();
      call();
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const cudaError_t busy = cudaStreamQuery(own);
      gate = true;
      EXPECT_EQ(busy, cudaErrorNotReady) << "the call waited for its stream";
      EXPECT_LT(waited, 10.0) << "the call waited for its stream";
      EXPECT_EQ(p.output(ctx), want) << "queued behind a busy stream";

      p.clear(ctx);
      capture_and_replay(ctx, call, 2);
      EXPECT_EQ(p.output(ctx), want) << "graph replays";
    }
  }
}

// The quantize kernel is launched with programmatic dependent launch (it waits for the kernel
// before it in its stream). A caller whose stream first waits for an event of another stream,
// where x is still being written, must get the codes of the new x: stream A converts a large f32
// tensor into x (~1 ms), stream B (which just ran a quick kernel, done or not yet) waits for A's
// event and quantizes x. Compared with the same quantization after a full synchronization.
TEST(AttentionStreams, QuantizeAfterAnEventWaitReadsTheNewInput) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  const int64_t n = 32768, h = 32, d = 128, count = n * h * d;
  Buffer src(Device::cuda, count * 4), x(Device::cuda, count * 2), codes(Device::cuda, count);
  const int64_t ns = prologue_scale_count(n, ScaleLayout::thread_q, 32);
  Buffer scales(Device::cuda, h * ns * 4);
  Context legacy;
  {
    HostTensor t(DType::f32, {count});
    std::mt19937_64 rng(7);
    t.fill_normal(rng);
    copy_to_device(src.data(), t.bytes.data(), t.bytes.size(), legacy);
  }
  const TensorView sv = make_view(src.data(), DType::f32, {1, n, h, d}, Device::cuda);
  const TensorView xv = make_view(x.data(), DType::bf16, {1, n, h, d}, Device::cuda);
  const TensorView cv = make_view(codes.data(), DType::i8, {1, n, h, d}, Device::cuda);
  const TensorView scv = make_view(scales.data(), DType::f32, {1, h, ns}, Device::cuda);
  // A small quantization for B's "kernel before", on its own buffers (the first rows of x's).
  Buffer small_codes(Device::cuda, 64 * h * d), small_scales(Device::cuda, h * 4 * 4);
  const TensorView small_x = make_view(x.data(), DType::bf16, {1, 64, h, d}, Device::cuda);
  const TensorView small_c = make_view(small_codes.data(), DType::i8, {1, 64, h, d}, Device::cuda);
  const TensorView small_s =
      make_view(small_scales.data(), DType::f32, {1, h, prologue_scale_count(64, ScaleLayout::thread_q, 32)},
                Device::cuda);
  Prologue p;
  p.layout = ScaleLayout::thread_q;
  p.block = 32;
  p.sm_scale = 0.125f;

  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  Context ca, cb;
  ca.cuda_stream = a;
  cb.cuda_stream = b;
  // Trials 0-2: B's previous kernel long done; 3-5: still running when B's wait is queued.
  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    device_memset(x.data(), 0, x.bytes(), legacy);
    device_memset(codes.data(), 0, codes.bytes(), legacy);
    synchronize(legacy);
    norm_rope_quantize(small_x, p, small_c, small_s, cb);  // B's previous kernel
    if (trial < 3) synchronize(cb);
    convert(sv, xv, ca);  // A writes x
    ASSERT_EQ(cudaEventRecord(written, a), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(b, written, 0), cudaSuccess);
    norm_rope_quantize(xv, p, cv, scv, cb);
    synchronize(cb);
    std::vector<uint8_t> got(codes.bytes()), want(codes.bytes());
    copy_to_host(got.data(), codes.data(), got.size(), cb);
    norm_rope_quantize(xv, p, cv, scv, legacy);
    synchronize(legacy);
    copy_to_host(want.data(), codes.data(), want.size(), legacy);
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << "codes differ from the quantization after a full synchronization";
  }
  cudaEventDestroy(written);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// Joint attention's segmented q / k norms (two weight rows: text tokens, then image tokens)
// with check_weight_rows false: no read-back, so the call captures in a CUDA graph, and its
// replays give the bits of the eager call that checks the rows.
TEST(AttentionStreams, UncheckedWeightRowsCaptureInAGraph) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  OwnStream own_stream;
  Context& ctx = own_stream.ctx;
  Problem p(AttentionOptions::fp8);
  Buffer w(Device::cuda, 2 * D * 2), rows(Device::cuda, N * 4);
  {
    std::mt19937_64 rng(5);
    HostTensor wh(DType::bf16, {2, D});
    wh.fill_uniform(rng, 0.25f, 2.f);
    copy_to_device(w.data(), wh.bytes.data(), wh.bytes.size(), ctx);
    std::vector<int32_t> rh(N);
    for (int64_t n = 0; n < N; ++n) rh[n] = n < 77 ? 0 : 1;
    copy_to_device(rows.data(), rh.data(), rh.size() * 4, ctx);
  }
  const TensorView wv = make_view(w.data(), DType::bf16, {2, D}, Device::cuda);
  const TensorView rv = make_view(rows.data(), DType::i32, {N}, Device::cuda);
  Prologue qk;
  qk.norm_weight = &wv;
  qk.weight_rows = &rv;
  p.options.q_prologue = &qk;
  p.options.k_prologue = &qk;
  p.run(ctx);
  const std::vector<uint8_t> want = p.output(ctx);
  qk.check_weight_rows = false;
  for (int form = 0; form < 2; ++form) {
    SCOPED_TRACE(form == 0 ? "caller's workspace" : "own workspace");
    auto call = [&] {
      if (form == 0)
        p.run(ctx);
      else
        attention(p.qv, p.kv, p.vv, p.ov, nullptr, p.options, ctx);
    };
    p.clear(ctx);
    capture_and_replay(ctx, call, 2);
    EXPECT_EQ(p.output(ctx), want) << "graph replays";
  }
}

// A device buffer's bytes, once the work queued on ctx is done.
std::vector<uint8_t> to_host(const Buffer& b, Context& ctx) {
  std::vector<uint8_t> h(b.bytes());
  synchronize(ctx);
  copy_to_host(h.data(), b.data(), h.size(), ctx);
  return h;
}

// A Problem's q, k, v and out as packed (T, H, D) tensors of Tq / Tk rows, and an (Hq, Tq) LSE.
struct Packed {
  TensorView q, k, v, o, lv;
  Buffer lse;
  Packed(Problem& p, int64_t Tq, int64_t Tk) : lse(Device::cuda, Hq * Tq * 4) {
    q = make_view(p.q.data(), DType::bf16, {Tq, Hq, D}, Device::cuda);
    k = make_view(p.k.data(), DType::bf16, {Tk, Hkv, D}, Device::cuda);
    v = make_view(p.v.data(), DType::bf16, {Tk, Hkv, D}, Device::cuda);
    o = make_view(p.out.data(), DType::bf16, {Tq, Hq, D}, Device::cuda);
    lv = make_view(lse.data(), DType::f32, {Hq, Tq}, Device::cuda);
  }
};

// attention_varlen's outputs and LSE with padded buckets (index 0) and with every sequence a call
// of its own (index 1, tuning varlen_unpadded), on p's buffers (the LSE first filled with 0x7f).
void varlen_padded_and_unpadded(Problem& p, Packed& pk, const std::vector<int64_t>& cu_q,
                                const std::vector<int64_t>& cu_k, Context& ctx,
                                std::vector<uint8_t> (&outs)[2], std::vector<uint8_t> (&lses)[2]) {
  for (int unpadded = 0; unpadded < 2; ++unpadded) {
    detail::AttentionCudaTuning t = detail::attention_cuda_tuning();
    t.varlen_unpadded = unpadded == 1;
    detail::set_attention_cuda_tuning(t);
    p.clear(ctx);
    device_memset(pk.lse.data(), 0x7f, pk.lse.bytes(), ctx);
    attention_varlen(pk.q, pk.k, pk.v, cu_q, cu_k, pk.o, &pk.lv, p.options, ctx);
    t.varlen_unpadded = false;
    detail::set_attention_cuda_tuning(t);
    outs[unpadded] = to_host(p.out, ctx);
    lses[unpadded] = to_host(pk.lse, ctx);
  }
}

// attention_varlen on CUDA runs runs of equal lengths as one batched call: every output and LSE
// bit equals attention() on each sequence alone (a run of 3 sequences of 200 queries / keys, a
// run of 2 with no keys, a lone sequence), and equals the call with every sequence on its own
// (tuning varlen_each).
TEST(AttentionCuda, VarlenRunsGiveEachSequenceBits) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  Context ctx;
  const std::vector<int64_t> cu_q = {0, 100, 300, 500, 700, 850, 1000};
  const std::vector<int64_t> cu_k = {0, 150, 350, 550, 750, 750, 750};
  const int64_t Tq = cu_q.back(), Tk = cu_k.back();
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16})
    for (auto causal : {AttentionOptions::none, AttentionOptions::bottom_right}) {
      SCOPED_TRACE(std::string(pv == AttentionOptions::fp8 ? "fp8" : "f16") +
                   (causal == AttentionOptions::none ? "" : " causal"));
      Problem p(pv);
      p.options.causal = causal;
      Packed pk(p, Tq, Tk);
      const TensorView &q = pk.q, &k = pk.k, &v = pk.v, &o = pk.o;
      const Buffer& lse = pk.lse;
      TensorView& lv = pk.lv;
      auto host = [&](const Buffer& b) { return to_host(b, ctx); };
      std::vector<uint8_t> outs[2], lses[2];
      for (int each = 0; each < 2; ++each) {
        detail::AttentionCudaTuning t = detail::attention_cuda_tuning();
        t.varlen_each = each == 1;
        detail::set_attention_cuda_tuning(t);
        p.clear(ctx);
        attention_varlen(q, k, v, cu_q, cu_k, o, &lv, p.options, ctx);
        t.varlen_each = false;
        detail::set_attention_cuda_tuning(t);
        outs[each] = host(p.out);
        lses[each] = host(lse);
      }
      EXPECT_EQ(outs[0], outs[1]) << "runs vs every sequence a call";
      EXPECT_EQ(lses[0], lses[1]) << "runs vs every sequence a call";
      const size_t row = Hq * D * 2;
      for (size_t s = 0; s + 1 < cu_q.size(); ++s) {
        const int64_t q0 = cu_q[s], nq = cu_q[s + 1] - q0, k0 = cu_k[s], nk = cu_k[s + 1] - k0;
        Buffer os(Device::cuda, nq * row), ls(Device::cuda, Hq * nq * 4);
        const auto at = [](const Buffer& b, int64_t rows, size_t bytes) {
          return static_cast<char*>(b.data()) + rows * bytes;
        };
        TensorView lsv = make_view(ls.data(), DType::f32, {1, Hq, nq}, Device::cuda);
        attention(make_view(at(p.q, q0, row), DType::bf16, {1, nq, Hq, D}, Device::cuda),
                  make_view(at(p.k, k0, Hkv * D * 2), DType::bf16, {1, nk, Hkv, D}, Device::cuda),
                  make_view(at(p.v, k0, Hkv * D * 2), DType::bf16, {1, nk, Hkv, D}, Device::cuda),
                  make_view(os.data(), DType::bf16, {1, nq, Hq, D}, Device::cuda), &lsv, p.options,
                  ctx);
        const std::vector<uint8_t> o1 = host(os), l1 = host(ls);
        ASSERT_EQ(std::memcmp(o1.data(), outs[0].data() + q0 * row, o1.size()), 0)
            << "sequence " << s;
        for (int64_t h = 0; h < Hq; ++h)
          ASSERT_EQ(std::memcmp(l1.data() + h * nq * 4, lses[0].data() + (h * Tq + q0) * 4, nq * 4),
                    0)
              << "sequence " << s << " head " << h;
      }
    }
}

// attention_varlen on CUDA runs sequences of distinct lengths as padded buckets (session 51),
// each item read and written at its own packed rows: here a bucket of 5 (lengths 129..270) and
// two sequences of their own (37 and 1 queries). Without the K mean every output and LSE bit
// equals each sequence's own call (per-item counts keep other rows out of every scale and mask
// the padding keys); with it the outputs agree within the K mean's last bits (its fp32 sum order
// follows the padded length). fp8 (once with V's mean) and 16-bit P·V (v gathered into a
// zero-padded copy), no mask
// and both causal alignments, a q / k RMSNorm + RoPE prologue (its table read at each item's
// packed rows; once in Flux's 2 x 2 form, compacted per item by the mean pass).
TEST(AttentionCuda, VarlenPaddedBucketsGiveEachSequence) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  Context ctx;
  const std::vector<int64_t> cu_q = {0, 37, 200, 329, 330, 600, 777, 1000};
  const std::vector<int64_t> cu_k = {0, 45, 185, 314, 331, 581, 780, 1000};
  const int64_t Tq = cu_q.back(), Tk = cu_k.back();
  // RMSNorm weight (D) and a (1, T, 1, D / 2, 2) f32 rotary table over the packed tokens.
  std::mt19937_64 rng(5);
  // (and Flux's (1, T, 1, D / 2, 2, 2) matrix form, which the mean pass compacts per item)
  HostTensor w(DType::f32, {D}), tab(DType::f32, {1, Tq, 1, D / 2, 2}),
      mat(DType::f32, {1, Tq, 1, D / 2, 2, 2});
  w.fill_normal(rng, 1.f, 0.1f);
  tab.fill_normal(rng, 0.f, 0.7f);
  mat.fill_normal(rng, 0.f, 0.7f);
  Buffer wd(Device::cuda, w.bytes.size()), td(Device::cuda, tab.bytes.size()),
      md(Device::cuda, mat.bytes.size());
  copy_to_device(wd.data(), w.bytes.data(), w.bytes.size(), ctx);
  copy_to_device(td.data(), tab.bytes.data(), tab.bytes.size(), ctx);
  copy_to_device(md.data(), mat.bytes.data(), mat.bytes.size(), ctx);
  const TensorView wv = make_view(wd.data(), DType::f32, {D}, Device::cuda);
  Rope rope, rope_mat;
  rope.table = make_view(td.data(), DType::f32, {1, Tq, 1, D / 2, 2}, Device::cuda);
  rope_mat.table = make_view(md.data(), DType::f32, {1, Tq, 1, D / 2, 2, 2}, Device::cuda);
  Prologue pro, pro_mat;
  pro.norm_weight = pro_mat.norm_weight = &wv;
  pro.rope = &rope;
  pro_mat.rope = &rope_mat;
  // (session 52) segmented norm weights: 3 rows (R, D), each packed token naming one (q's and
  // k's indices of their own, as Qwen-Image's text and image tokens), with the rotary table.
  HostTensor ws(DType::f32, {3, D}), rq(DType::i32, {Tq}), rk(DType::i32, {Tk});
  ws.fill_normal(rng, 1.f, 0.2f);
  for (int64_t t = 0; t < Tq; ++t) rq.as<int32_t>()[t] = static_cast<int32_t>((t * 7 / 5) % 3);
  for (int64_t t = 0; t < Tk; ++t) rk.as<int32_t>()[t] = static_cast<int32_t>((t / 11) % 3);
  Buffer wsd(Device::cuda, ws.bytes.size()), rqd(Device::cuda, rq.bytes.size()),
      rkd(Device::cuda, rk.bytes.size());
  copy_to_device(wsd.data(), ws.bytes.data(), ws.bytes.size(), ctx);
  copy_to_device(rqd.data(), rq.bytes.data(), rq.bytes.size(), ctx);
  copy_to_device(rkd.data(), rk.bytes.data(), rk.bytes.size(), ctx);
  const TensorView wsv = make_view(wsd.data(), DType::f32, {3, D}, Device::cuda),
                   rqv = make_view(rqd.data(), DType::i32, {Tq}, Device::cuda),
                   rkv = make_view(rkd.data(), DType::i32, {Tk}, Device::cuda);
  Prologue seg_q, seg_k;
  seg_q.norm_weight = seg_k.norm_weight = &wsv;
  seg_q.weight_rows = &rqv;
  seg_k.weight_rows = &rkv;
  seg_q.rope = seg_k.rope = &rope;
  // (session 52) Wan's norm over all heads of a token (NormScope::token, (H·D) weights) with
  // interleaved (complex) rope: its pre-pass reads each item's rows too.
  HostTensor wtq(DType::f32, {Hq * D}), wtk(DType::f32, {Hkv * D});
  wtq.fill_normal(rng, 1.f, 0.2f);
  wtk.fill_normal(rng, 1.f, 0.2f);
  Buffer wtqd(Device::cuda, wtq.bytes.size()), wtkd(Device::cuda, wtk.bytes.size());
  copy_to_device(wtqd.data(), wtq.bytes.data(), wtq.bytes.size(), ctx);
  copy_to_device(wtkd.data(), wtk.bytes.data(), wtk.bytes.size(), ctx);
  const TensorView wtqv = make_view(wtqd.data(), DType::f32, {Hq * D}, Device::cuda),
                   wtkv = make_view(wtkd.data(), DType::f32, {Hkv * D}, Device::cuda);
  Prologue tok_q, tok_k;
  tok_q.norm_weight = &wtqv;
  tok_k.norm_weight = &wtkv;
  tok_q.norm_scope = tok_k.norm_scope = NormScope::token;
  Rope rope_il = rope;
  rope_il.interleaved = true;
  tok_q.rope = tok_k.rope = &rope_il;
  for (int form = 0; form < 8; ++form) {
    const auto pv = form == 1 ? AttentionOptions::f16 : AttentionOptions::fp8;
    const auto causal = form == 2   ? AttentionOptions::bottom_right
                        : form == 3 ? AttentionOptions::top_left
                                    : AttentionOptions::none;
    for (bool smooth_k : {false, true}) {
      SCOPED_TRACE("form " + std::to_string(form) + (smooth_k ? " smooth_k" : ""));
      Problem p(pv);
      p.options.causal = causal;
      p.options.smooth_k = smooth_k;
      p.options.smooth_v = form == 0;  // (fp8: V's mean from each item's own keys)
      if (form == 4) p.options.q_prologue = p.options.k_prologue = &pro;
      if (form == 5) p.options.q_prologue = p.options.k_prologue = &pro_mat;
      if (form == 6) p.options.q_prologue = &seg_q, p.options.k_prologue = &seg_k;
      if (form == 7) p.options.q_prologue = &tok_q, p.options.k_prologue = &tok_k;
      Packed pk(p, Tq, Tk);
      std::vector<uint8_t> outs[2], lses[2];
      varlen_padded_and_unpadded(p, pk, cu_q, cu_k, ctx, outs, lses);
      if (!smooth_k) {
        EXPECT_EQ(outs[0], outs[1]) << "padded buckets vs every sequence a call";
        EXPECT_EQ(lses[0], lses[1]) << "padded buckets vs every sequence a call";
        continue;
      }
      // The K mean's last bits: a few codes one apart, outputs within bf16 noise.
      size_t far = 0;
      double worst = 0;
      for (size_t i = 0; i < outs[0].size() / 2; ++i) {
        uint16_t a, b;
        std::memcpy(&a, outs[0].data() + 2 * i, 2);
        std::memcpy(&b, outs[1].data() + 2 * i, 2);
        const double x = dt::bf16_to_f32(a), y = dt::bf16_to_f32(b);
        const double d = std::fabs(x - y);
        worst = std::max(worst, d);
        far += d > 2e-2 + 2e-2 * std::fabs(y);
      }
      EXPECT_EQ(far, 0u) << "worst |difference| " << worst;
      for (size_t i = 0; i < lses[0].size() / 4; ++i) {
        float a, b;
        std::memcpy(&a, lses[0].data() + 4 * i, 4);
        std::memcpy(&b, lses[1].data() + 4 * i, 4);
        if (std::isinf(b)) {
          EXPECT_EQ(a, b) << "lse " << i;
        } else {
          EXPECT_NEAR(a, b, 1e-3 + 1e-3 * std::fabs(b)) << "lse " << i;
        }
      }
    }
  }
}

// The short k path (session 52: norm_rope_mean_quantize without norm or rope as one kernel, a CTA
// per (batch, head) holding its rows): its codes and scales are the quantize pass's bits for the
// mean it made (norm_rope_quantize given that mean), for THREAD_K 64, THREAD_Q 32 with sm_scale
// and PER_BLOCK 128, D 64 / 128, bf16 / f16, 300 and 17 tokens; its mean is the fp64 mean within
// fp32 rounding and the two passes' (the path off) within their last bits. Then through
// attention_varlen: with the path on for any head count, padded buckets give every sequence
// the bits of its own call, the K mean included (the kernel adds an item's rows the same way
// padded or not).
TEST(AttentionCuda, ShortKPathCodesFollowItsMean) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  Context ctx;
  std::mt19937_64 rng(52);
  struct Form {
    ScaleLayout layout;
    int block;
    float sm_scale;
    int64_t d, n;
    DType dt;
  };
  const Form forms[] = {{ScaleLayout::thread_k, 64, 1.f, 128, 300, DType::bf16},
                        {ScaleLayout::thread_q, 32, 0.125f, 64, 300, DType::f16},
                        {ScaleLayout::per_block, 128, 1.f, 128, 17, DType::bf16},
                        {ScaleLayout::thread_k, 64, 1.f, 64, 17, DType::f16}};
  for (const Form& f : forms) {
    SCOPED_TRACE(std::to_string(f.d) + " x " + std::to_string(f.n) + " block " +
                 std::to_string(f.block));
    const int64_t Bs = 8, Hs = 24, Ns = f.n, Ds = f.d;  // 192 (batch, head) pairs
    HostTensor xh(f.dt, {Bs, Ns, Hs, Ds});
    xh.fill_normal(rng, 0.3f, 2.f);
    const int64_t ns = scale_count(f.layout, f.block, Ns);
    Buffer x(Device::cuda, xh.bytes.size()), q1(Device::cuda, Bs * Ns * Hs * Ds),
        q2(Device::cuda, Bs * Ns * Hs * Ds), s1(Device::cuda, Bs * Hs * ns * 4),
        s2(Device::cuda, Bs * Hs * ns * 4), m1(Device::cuda, Bs * Hs * Ds * 4),
        m0(Device::cuda, Bs * Hs * Ds * 4), q0(Device::cuda, Bs * Ns * Hs * Ds),
        s0(Device::cuda, Bs * Hs * ns * 4);
    copy_to_device(x.data(), xh.bytes.data(), xh.bytes.size(), ctx);
    const TensorView xv = make_view(x.data(), f.dt, {Bs, Ns, Hs, Ds}, Device::cuda);
    auto codes = [&](Buffer& b) {
      return make_view(b.data(), DType::i8, {Bs, Ns, Hs, Ds}, Device::cuda);
    };
    auto scales = [&](Buffer& b) {
      return make_view(b.data(), DType::f32, {Bs, Hs, ns}, Device::cuda);
    };
    auto means = [&](Buffer& b) {
      return make_view(b.data(), DType::f32, {Bs, Hs, Ds}, Device::cuda);
    };
    Prologue p;
    p.layout = f.layout;
    p.block = f.block;
    p.sm_scale = f.sm_scale;
    norm_rope_mean_quantize(xv, p, means(m1), codes(q1), scales(s1), ctx);
    const TensorView mv = means(m1);
    Prologue pm = p;
    pm.mean = &mv;
    norm_rope_quantize(xv, pm, codes(q2), scales(s2), ctx);
    detail::PrologueCudaTuning t;
    t.short_k_tokens = 0;  // the two passes
    detail::set_prologue_cuda_tuning(t);
    norm_rope_mean_quantize(xv, p, means(m0), codes(q0), scales(s0), ctx);
    detail::set_prologue_cuda_tuning({});
    EXPECT_EQ(to_host(q1, ctx), to_host(q2, ctx)) << "codes";
    EXPECT_EQ(to_host(s1, ctx), to_host(s2, ctx)) << "scales";
    const std::vector<uint8_t> mb = to_host(m1, ctx), m0b = to_host(m0, ctx);
    for (int64_t b = 0; b < Bs; ++b)
      for (int64_t h = 0; h < Hs; ++h)
        for (int64_t c = 0; c < Ds; ++c) {
          double ref = 0;
          for (int64_t n = 0; n < Ns; ++n) ref += xh.get(((b * Ns + n) * Hs + h) * Ds + c);
          ref /= static_cast<double>(Ns);
          float got, two;
          std::memcpy(&got, mb.data() + 4 * ((b * Hs + h) * Ds + c), 4);
          std::memcpy(&two, m0b.data() + 4 * ((b * Hs + h) * Ds + c), 4);
          ASSERT_NEAR(got, ref, 1e-5 + 1e-5 * std::fabs(ref)) << b << " " << h << " " << c;
          ASSERT_NEAR(got, two, 2e-6 + 2e-5 * std::fabs(two)) << b << " " << h << " " << c;
        }
  }
  // attention_varlen's padded buckets through the short paths (any head count).
  detail::PrologueCudaTuning t;
  t.short_k_min_ctas = 1;
  detail::set_prologue_cuda_tuning(t);
  detail::AttentionCudaTuning vt;
  vt.short_v_min_ctas = 1;
  detail::set_attention_cuda_tuning(vt);
  const std::vector<int64_t> cu_q = {0, 37, 200, 329, 330, 600, 777, 1000};
  const std::vector<int64_t> cu_k = {0, 45, 185, 314, 331, 581, 780, 1000};
  for (auto causal : {AttentionOptions::none, AttentionOptions::bottom_right}) {
    Problem p(AttentionOptions::fp8);
    p.options.causal = causal;
    Packed pk(p, cu_q.back(), cu_k.back());
    std::vector<uint8_t> outs[2], lses[2];
    varlen_padded_and_unpadded(p, pk, cu_q, cu_k, ctx, outs, lses);
    EXPECT_EQ(outs[0], outs[1]) << "padded buckets vs every sequence a call";
    EXPECT_EQ(lses[0], lses[1]) << "padded buckets vs every sequence a call";
  }
  detail::set_prologue_cuda_tuning({});
  detail::set_attention_cuda_tuning({});
}

// V to fp8 of short rows in one kernel (session 52, v_short_kernel): the codes and scales of the
// scale pass + codes pass (short_v_tokens 0), bit for bit: D 64 / 128, bf16 / f16, 1 .. 512 keys
// (partial 64-key tiles), 192 (batch, head) pairs, a strided view (V of a fused QKV buffer),
// channels with NaN and +-inf and an all-zero channel.
TEST(AttentionCuda, ShortVKernelGivesThePassesBits) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  Context ctx;
  std::mt19937_64 rng(521);
  for (int64_t d : {64, 128})
    for (int64_t n : {1, 17, 100, 300, 512})
      for (DType dt : {DType::bf16, DType::f16}) {
        SCOPED_TRACE(std::to_string(d) + " x " + std::to_string(n));
        const int64_t Bs = 8, Hs = 24, npad = (n + 63) / 64 * 64;
        HostTensor vh(dt, {Bs, n, 3, Hs, d});  // V = slice 2 of each token's (3, H, D)
        vh.fill_normal(rng, 0.1f, 1.5f);
        vh.set(((0 * n + 0) * 3 + 2) * Hs * d + 5, std::nanf(""));
        vh.set(((1 * n + n / 2) * 3 + 2) * Hs * d + Hs * d - 1, INFINITY);
        for (int64_t t = 0; t < n; ++t) vh.set(((2 * n + t) * 3 + 2) * Hs * d + 7, 0.f);
        Buffer vb(Device::cuda, vh.bytes.size());
        copy_to_device(vb.data(), vh.bytes.data(), vh.bytes.size(), ctx);
        TensorView v = make_view(static_cast<char*>(vb.data()) + 2 * Hs * d * 2, dt, {Bs, n, Hs, d},
                                 Device::cuda);
        v.stride[0] = n * 3 * Hs * d;
        v.stride[1] = 3 * Hs * d;
        std::vector<uint8_t> codes[2], scales[2];
        for (int passes = 0; passes < 2; ++passes) {
          detail::AttentionCudaTuning t;
          if (passes) t.short_v_tokens = 0;
          detail::set_attention_cuda_tuning(t);
          Buffer c(Device::cuda, Bs * Hs * d * npad), sc(Device::cuda, Bs * Hs * d * 4);
          device_memset(c.data(), 0x5a, c.bytes(), ctx);
          quantize_v_fp8(v, make_view(c.data(), DType::e4m3, {Bs, Hs, d, npad}, Device::cuda),
                         make_view(sc.data(), DType::f32, {Bs, Hs, d}, Device::cuda), nullptr, ctx);
          codes[passes] = to_host(c, ctx);
          scales[passes] = to_host(sc, ctx);
        }
        detail::set_attention_cuda_tuning({});
        EXPECT_EQ(codes[0], codes[1]) << "codes";
        EXPECT_EQ(scales[0], scales[1]) << "scales";
      }
}

// attention() with q quantized inside the fp8 kernel (session 57: bf16, D 128, up to 2048 keys;
// session 58: by default, with the next CTAs' q prefetched into L2; session 59: causal calls
// too, the prefetch along their walk; tuning fused_q) gives every output and LSE bit of the call
// with q's own pass (fused_q 1), and leaves the workspace's q codes untouched (so the form really
// ran): 1 .. 1000 queries (partial 64-row CTAs and 32-row scale blocks), 1 .. 2048 keys, GQA, both
// causal alignments, the K and V means on and off, sm_scale default / 0.3 / -0.5, scale_eps 0 with
// an all-zero q row (codes 0 by the zero-scale rule), a huge row, q a strided view of a fused QKV
// buffer, (fused_q 2) 4096 keys, and 2100 keys with fused_q 5 (sessions 58-60's default: past the
// one-consumer kernel q's pass runs). Session 61: past that kernel's keys by default, the
// long-key kernels quantizing q (two consumers at D 128, three at D 64; fused_q 6 without the
// prefetch): causal and not, several waves of CTAs, partial 128- / 192-row CTAs, GQA, a fused
// QKV view; and 16-bit P·V (its TMA-ring kernel, one consumer up to 512 keys at D 128, three
// past them, four at D 64). Also the kernel on q's codes with the grid's heads fastest (tuning
// heads_inner) against the default order, and (session 60) plain round 3 against auto's kernel
// (16-bit P·V: wgmma_r3 is auto's ring kernel); f16 forms as well.
TEST(AttentionCuda, QInTheKernelGivesThePassBits) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  Context ctx;
  std::mt19937_64 rng(57);
  struct Form {
    int64_t b, nq, nkv, hq, hkv;
    AttentionOptions::Causal causal;
    bool smooth_k, smooth_v;
    float sm_scale, scale_eps;
    bool fused_qkv;
    int force;   // tuning fused_q for the fused run (0 default: with the L2 prefetch; 2 forced,
                 // 3 query blocks fastest, 4 no prefetch, 5 one-consumer keys only, 6 no
                 // prefetch on the long-key kernels)
    bool fuses;  // whether the q codes stay unwritten
    int64_t d = 128;
    DType dt = DType::bf16;  // q, k, v and the output (f16 since session 60)
    AttentionOptions::PV pv = AttentionOptions::fp8;  // (16-bit P·V since session 61)
  };
  using C = AttentionOptions;
  const Form forms[] = {
      {1, 1, 1, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 0, true},
      {2, 17, 77, 4, 2, C::none, true, false, 0.f, 1e-7f, false, 0, true},
      {1, 100, 512, 4, 1, C::bottom_right, true, true, 0.3f, 1e-7f, false, 4, true},
      {1, 100, 512, 4, 1, C::bottom_right, true, true, 0.3f, 1e-7f, false, 0, true},
      {2, 1000, 512, 6, 3, C::none, false, false, 0.f, 0.f, false, 0, true},
      {2, 1000, 512, 6, 3, C::none, true, true, 0.f, 1e-7f, false, 3, true},
      {2, 1000, 512, 6, 3, C::none, true, false, 0.f, 1e-7f, true, 4, true},
      {1, 333, 2048, 2, 2, C::top_left, true, false, 0.f, 1e-7f, true, 2, true},
      {1, 130, 300, 2, 2, C::bottom_right, true, true, 0.f, 1e-7f, true, 4, true},
      {3, 700, 1000, 4, 4, C::none, true, true, 0.f, 1e-7f, true, 0, true},
      {1, 200, 128, 2, 2, C::none, true, false, -0.5f, 1e-7f, false, 0, true},
      {1, 64, 2100, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 5, false},
      {1, 257, 4096, 2, 1, C::none, true, false, 0.f, 1e-7f, false, 2, true},
      // (session 61: the long-key kernels; 2100 keys = 17 tiles, the last partial)
      {1, 64, 2100, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 0, true},
      {2, 1000, 2100, 6, 3, C::none, true, true, 0.f, 1e-7f, true, 0, true},
      {1, 777, 3000, 4, 1, C::bottom_right, true, false, 0.3f, 1e-7f, false, 0, true},
      {2, 2500, 2500, 8, 8, C::top_left, true, true, 0.f, 0.f, false, 0, true},
      {1, 4100, 2049, 40, 40, C::none, false, false, -0.5f, 1e-7f, false, 0, true},
      {1, 300, 2200, 2, 2, C::none, true, false, 0.f, 1e-7f, true, 6, true},
      // (session 59: causal by default, the prefetch following the longest-first walk; several
      // head groups and batch items)
      {2, 700, 700, 8, 4, C::bottom_right, true, true, 0.f, 1e-7f, false, 0, true},
      {1, 1000, 1500, 6, 6, C::top_left, true, false, 0.f, 1e-7f, true, 0, true},
      // (D 64 since session 59: up to 1024 keys by default, the 64-byte swizzled Q rows)
      {1, 1, 1, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 0, true, 64},
      {2, 1000, 77, 6, 3, C::none, true, true, 0.f, 1e-7f, true, 0, true, 64},
      {3, 333, 1024, 4, 4, C::none, false, false, 0.3f, 0.f, false, 0, true, 64},
      {2, 700, 700, 8, 4, C::bottom_right, true, true, 0.f, 1e-7f, false, 0, true, 64},
      {1, 130, 300, 2, 2, C::top_left, true, false, -0.5f, 1e-7f, true, 4, true, 64},
      {1, 257, 2048, 2, 1, C::none, true, false, 0.f, 1e-7f, false, 2, true, 64},
      {1, 64, 1100, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 5, false, 64},
      {1, 64, 1100, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 0, true, 64},
      {2, 1000, 1500, 6, 3, C::none, true, true, 0.f, 1e-7f, true, 0, true, 64},
      {1, 2000, 2000, 8, 2, C::bottom_right, true, false, 0.3f, 1e-7f, false, 0, true, 64},
      {1, 4100, 1025, 24, 24, C::none, false, false, 0.f, 0.f, false, 0, true, 64},
      {1, 333, 3000, 2, 2, C::top_left, true, true, 0.f, 1e-7f, true, 6, true, 64},
      // (f16 since session 60: the same kernels as bf16, q read as f16)
      {2, 17, 77, 4, 2, C::none, true, false, 0.f, 1e-7f, false, 0, true, 128, DType::f16},
      {2, 700, 700, 8, 4, C::bottom_right, true, true, 0.f, 1e-7f, false, 0, true, 128, DType::f16},
      {1, 200, 128, 2, 2, C::none, true, false, -0.5f, 1e-7f, true, 4, true, 128, DType::f16},
      {1, 64, 2100, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 5, false, 128, DType::f16},
      {2, 1000, 2100, 6, 3, C::bottom_right, true, true, 0.f, 1e-7f, true, 0, true, 128,
       DType::f16},
      {2, 1000, 77, 6, 3, C::none, true, true, 0.f, 1e-7f, true, 0, true, 64, DType::f16},
      {1, 257, 2048, 2, 1, C::top_left, true, false, 0.3f, 0.f, false, 2, true, 64, DType::f16},
      {1, 64, 4000, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 5, false, 64, DType::f16},
      {1, 700, 4000, 4, 2, C::none, true, true, 0.f, 1e-7f, false, 0, true, 64, DType::f16},
      // (session 61: 16-bit P·V, its TMA-ring kernel quantizing q: one consumer up to 512 keys
      // at D 128, three past them, four at D 64; a negative sm_scale goes into q's scales, so
      // the kernel's kc stay per 64-key half; fused_q 5 keeps q's pass)
      {1, 1, 1, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 0, true, 128, DType::bf16, C::f16},
      {2, 1000, 512, 6, 3, C::none, true, false, 0.f, 1e-7f, true, 0, true, 128, DType::bf16,
       C::f16},
      {2, 700, 700, 8, 4, C::bottom_right, true, false, 0.3f, 1e-7f, false, 0, true, 128,
       DType::bf16, C::f16},
      {1, 300, 2500, 4, 1, C::top_left, false, false, 0.f, 0.f, true, 6, true, 128, DType::bf16,
       C::f16},
      {1, 4100, 1030, 40, 40, C::none, true, false, 0.f, 1e-7f, false, 0, true, 128, DType::bf16,
       C::f16},
      {1, 200, 128, 2, 2, C::none, true, false, -0.5f, 1e-7f, false, 0, true, 128, DType::bf16,
       C::f16},
      {1, 64, 600, 2, 2, C::none, true, false, 0.f, 1e-7f, false, 5, false, 128, DType::bf16,
       C::f16},
      {2, 1000, 77, 6, 3, C::none, true, false, 0.f, 1e-7f, true, 0, true, 128, DType::f16, C::f16},
      {2, 1000, 77, 6, 3, C::none, true, false, 0.f, 1e-7f, true, 0, true, 64, DType::bf16, C::f16},
      {1, 2000, 2000, 8, 2, C::bottom_right, true, false, 0.f, 1e-7f, false, 0, true, 64,
       DType::f16, C::f16},
      {1, 333, 1024, 4, 4, C::top_left, false, false, 0.3f, 0.f, true, 6, true, 64, DType::bf16,
       C::f16},
  };
  for (const Form& f : forms) {
    SCOPED_TRACE("B " + std::to_string(f.b) + " Nq " + std::to_string(f.nq) + " Nkv " +
                 std::to_string(f.nkv) + " Hq " + std::to_string(f.hq) + " Hkv " +
                 std::to_string(f.hkv) + " causal " + std::to_string(f.causal) + " sm " +
                 std::to_string(f.sm_scale) + " D " + std::to_string(f.d) + " " + dtype_name(f.dt) +
                 (f.fused_qkv ? " qkv" : "") + (f.pv == C::f16 ? " 16-bit PV" : ""));
    const int64_t Dq = f.d;
    // q: (B, Nq, Hq, D) alone or slice 0 of each token's (3, Hq, D)
    const int64_t parts = f.fused_qkv ? 3 : 1;
    HostTensor qh(f.dt, {f.b, f.nq, parts, f.hq, Dq});
    qh.fill_normal(rng, 0.2f, 1.f);
    const int64_t row = parts * f.hq * Dq;
    for (int64_t c = 0; c < Dq; ++c) {
      qh.set((0 * f.nq + f.nq / 2) * row + c, 0.f);  // an all-zero row of head 0
      if (f.nq > 3) qh.set((0 * f.nq + 3) * row + (f.hq - 1) * Dq + c, 3e4f * (c % 2 ? 1 : -1));
    }
    HostTensor kh(f.dt, {f.b, f.nkv, f.hkv, Dq}), vh(f.dt, {f.b, f.nkv, f.hkv, Dq});
    kh.fill_normal(rng, 0.3f, 1.f);
    vh.fill_normal(rng, 0.1f, 1.f);
    Buffer qb(Device::cuda, qh.bytes.size()), kb(Device::cuda, kh.bytes.size()),
        vb(Device::cuda, vh.bytes.size()), ob(Device::cuda, f.b * f.nq * f.hq * Dq * 2),
        lb(Device::cuda, f.b * f.hq * f.nq * 4);
    copy_to_device(qb.data(), qh.bytes.data(), qh.bytes.size(), ctx);
    copy_to_device(kb.data(), kh.bytes.data(), kh.bytes.size(), ctx);
    copy_to_device(vb.data(), vh.bytes.data(), vh.bytes.size(), ctx);
    TensorView q = make_view(qb.data(), f.dt, {f.b, f.nq, f.hq, Dq}, Device::cuda);
    q.stride[0] = f.nq * row;
    q.stride[1] = row;
    const TensorView k = make_view(kb.data(), f.dt, {f.b, f.nkv, f.hkv, Dq}, Device::cuda);
    const TensorView v = make_view(vb.data(), f.dt, {f.b, f.nkv, f.hkv, Dq}, Device::cuda);
    const TensorView o = make_view(ob.data(), f.dt, {f.b, f.nq, f.hq, Dq}, Device::cuda);
    TensorView lse = make_view(lb.data(), DType::f32, {f.b, f.hq, f.nq}, Device::cuda);
    AttentionOptions opt;
    opt.pv = f.pv;
    opt.causal = f.causal;
    opt.smooth_k = f.smooth_k;
    opt.smooth_v = f.smooth_v;
    opt.sm_scale = f.sm_scale;
    Prologue qp;
    qp.scale_eps = f.scale_eps;
    opt.q_prologue = &qp;
    const size_t wb = attention_workspace_bytes(q, k, opt);
    Buffer ws(Device::cuda, wb);
    const size_t q_codes = static_cast<size_t>(f.b * f.nq * f.hq * Dq);  // the workspace's first
    std::vector<uint8_t> outs[4], lses[4], codes[4];
    // q in the kernel, q's pass, q's pass + heads_inner, (session 60) q's pass + plain round 3
    // (wgmma_r3 without no_turn: what f16 output ran before)
    for (int pass = 0; pass < 4; ++pass) {
      detail::AttentionCudaTuning t;
      t.fused_q = pass >= 1 ? 1 : f.force;
      t.heads_inner = pass == 2;
      detail::set_attention_cuda_tuning(t);
      device_memset(ws.data(), 0x5a, wb, ctx);
      device_memset(ob.data(), 0, ob.bytes(), ctx);
      device_memset(lb.data(), 0x7f, lb.bytes(), ctx);
      AttentionOptions o_pass = opt;
      if (pass == 3) o_pass.kernel = AttentionOptions::wgmma_r3;
      attention(q, k, v, o, &lse, o_pass, ws.data(), wb, ctx);
      detail::set_attention_cuda_tuning({});
      outs[pass] = to_host(ob, ctx);
      lses[pass] = to_host(lb, ctx);
      codes[pass] = to_host(ws, ctx);
      codes[pass].resize(q_codes);
    }
    bool nonzero = false;
    for (uint8_t x : outs[1]) nonzero |= x != 0;
    EXPECT_TRUE(nonzero);
    EXPECT_EQ(outs[0], outs[1]) << "outputs: q in the kernel vs its pass";
    EXPECT_EQ(lses[0], lses[1]) << "LSE: q in the kernel vs its pass";
    EXPECT_EQ(outs[2], outs[1]) << "outputs: the codes' kernel with the heads fastest";
    EXPECT_EQ(lses[2], lses[1]) << "LSE: the codes' kernel with the heads fastest";
    EXPECT_EQ(outs[3], outs[1]) << "outputs: plain round 3 vs auto's kernel";
    EXPECT_EQ(lses[3], lses[1]) << "LSE: plain round 3 vs auto's kernel";
    const std::vector<uint8_t> untouched(q_codes, 0x5a);
    EXPECT_EQ(codes[0] == untouched, f.fuses) << "the q codes in the workspace";
    EXPECT_NE(codes[1], untouched) << "q's pass wrote no codes";
  }
}

#else
TEST(AttentionStreams, SideStreamsKeepTheBitsOfTheSerialOrder) {
  GTEST_SKIP() << "lowbit was built without its CUDA backend";
}
#endif

}  // namespace
}  // namespace lowbit
