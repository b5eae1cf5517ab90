// The streaming decode kernel's 4-bit table lookup (src/cuda/linear_lut.h) replayed on the host
// against the CPU oracle's unpacking (SPEC §3.3): packed convrotint4 words (u = c + 7, nibble j =
// code j) folded through a group ratio, and comfy int4 bytes (low nibble first, two's complement).
// The host prmt follows the documented __byte_perm semantics (selector nibble & 7), so a lookup
// that relied on prmt's sign-replicate bit (round 1's bug) fails here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "lowbit/dtype.h"
#include "src/cpu/linear_kernels.h"
#include "src/cuda/linear_lut.h"

using lowbit::cuda::linear::comfy_lut;
using lowbit::cuda::linear::lut4;
using lowbit::cuda::linear::lut_prmt;
using lowbit::cuda::linear::lut_word;

namespace {

uint32_t pack4(int a, int b, int c, int d) {
  return (static_cast<uint32_t>(a) & 0xffu) | ((static_cast<uint32_t>(b) & 0xffu) << 8) |
         ((static_cast<uint32_t>(c) & 0xffu) << 16) | ((static_cast<uint32_t>(d) & 0xffu) << 24);
}

int8_t byte_of(uint32_t w, int b) { return static_cast<int8_t>((w >> (8 * b)) & 0xffu); }

}  // namespace

TEST(LinearLut, PrmtHandVectors) {
  EXPECT_EQ(lut_prmt(0x33221100u, 0x77665544u, 0x3210u), 0x33221100u);
  EXPECT_EQ(lut_prmt(0x33221100u, 0x77665544u, 0x7654u), 0x77665544u);
  EXPECT_EQ(lut_prmt(0x33221100u, 0x77665544u, 0x0415u), 0x00441155u);
  // Selector bit 3 is ignored (documented semantics): 9 reads byte 1, no sign replication.
  EXPECT_EQ(lut_prmt(0x8000u, 0u, 0x9u), 0x80u);
}

TEST(LinearLut, IdentityTableEveryNibble) {
  // Table entry e = e: the lookup returns the nibbles themselves, for all 65536 selectors.
  const uint32_t lut[4] = {0x03020100u, 0x07060504u, 0x0b0a0908u, 0x0f0e0d0cu};
  for (uint32_t s = 0; s < 65536; ++s) {
    const uint32_t r = lut4(s | 0xabcd0000u, lut);  // upper bits ignored
    for (int b = 0; b < 4; ++b) ASSERT_EQ((r >> (8 * b)) & 0xffu, (s >> (4 * b)) & 0xfu) << s;
  }
}

TEST(LinearLut, PackedInt4MatchesCpuUnpackAndFold) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ratio_dist(0.05f, 127.f / 7.f);
  for (int trial = 0; trial < 200; ++trial) {
    // One 32-column run of a weight row: 16 bytes = 4 words of 8 codes in [-7, 7].
    int8_t codes[32];
    for (auto& c : codes) c = static_cast<int8_t>(static_cast<int>(rng() % 15) - 7);
    uint8_t packed[16];
    lowbit::cpu::convrot::pack_bits(codes, 32, 4, packed);
    int8_t unpacked[32];
    lowbit::cpu::convrot::unpack_bits(packed, 32, 4, unpacked);
    const float ratio = trial == 0 ? 1.f : ratio_dist(rng);
    // The kernel's table: entry u (u = 0..15) = fold(u - 7), lanes tid4 = 0..3 own 4 entries.
    uint32_t lut[4];
    for (int t = 0; t < 4; ++t)
      lut[t] = pack4(lowbit::cpu::convrot::fold_code(4 * t - 7, ratio),
                     lowbit::cpu::convrot::fold_code(4 * t - 6, ratio),
                     lowbit::cpu::convrot::fold_code(4 * t - 5, ratio),
                     lowbit::cpu::convrot::fold_code(4 * t - 4, ratio));
    for (int j = 0; j < 4; ++j) {
      uint32_t word;
      std::memcpy(&word, packed + 4 * j, 4);  // little-endian, as the kernel's 16-byte load
      uint32_t b0, b1;
      lut_word(word, lut, &b0, &b1);
      for (int b = 0; b < 4; ++b) {
        ASSERT_EQ(byte_of(b0, b), lowbit::cpu::convrot::fold_code(unpacked[8 * j + b], ratio));
        ASSERT_EQ(byte_of(b1, b), lowbit::cpu::convrot::fold_code(unpacked[8 * j + 4 + b], ratio));
        ASSERT_EQ(unpacked[8 * j + b], codes[8 * j + b]);
      }
    }
  }
}

TEST(LinearLut, ComfyInt4MatchesSignedNibbles) {
  std::mt19937 rng(11);
  uint32_t lut[4];
  comfy_lut(lut);
  for (int trial = 0; trial < 1000; ++trial) {
    const uint32_t word = static_cast<uint32_t>(rng());
    uint32_t b0, b1;
    lut_word(word, lut, &b0, &b1);
    for (int c = 0; c < 8; ++c) {  // column c: byte c / 2 of the word, low nibble first
      const uint8_t byte = static_cast<uint8_t>(word >> (8 * (c / 2)));
      const uint8_t nib = (c % 2) ? byte >> 4 : byte & 15u;
      const int8_t want = lowbit::cpu::convrot::signed_nibble(nib);
      ASSERT_EQ(byte_of(c < 4 ? b0 : b1, c % 4), want) << word << " column " << c;
    }
  }
  // Hand vector: nibbles 8, 15, 0, 7 (columns 0..3) -> -8, -1, 0, 7.
  uint32_t b0, b1;
  lut_word(0x0000'70f8u, lut, &b0, &b1);
  EXPECT_EQ(b0, 0x0700fff8u);
  EXPECT_EQ(b1, 0u);
}

// NVFP4 (sessions 17-18): the table-free e2m1 value (the GPU dequantization kernels) and the
// f16x2 pairs of the decode GEMV, against the CPU oracle's dt::e2m1_to_f32 for every code / byte.
TEST(LinearLut, E2m1Fp32BitsEveryCode) {
  for (uint32_t c = 0; c < 16; ++c) {
    const float want = lowbit::dt::e2m1_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(lowbit::cuda::linear::e2m1_f32_bits(c), lowbit::dt::f32_bits(want)) << "code " << c;
  }
  // Bits above the nibble are ignored only through the callers' masks: 8 is -0 (sign bit only).
  EXPECT_EQ(lowbit::cuda::linear::e2m1_f32_bits(8u), 0x80000000u);
  EXPECT_EQ(lowbit::cuda::linear::e2m1_f32_bits(7u), 0x40c00000u);   // 6
  EXPECT_EQ(lowbit::cuda::linear::e2m1_f32_bits(9u), 0xbf000000u);   // -0.5
}

TEST(LinearLut, E2m1QuadF16EveryPairOfBytes) {
  auto f16 = [](uint32_t code) {
    return static_cast<uint32_t>(lowbit::dt::f32_to_f16(lowbit::dt::e2m1_to_f32(static_cast<uint8_t>(code))));
  };
  for (uint32_t v = 0; v < 65536; ++v) {
    uint32_t h01 = 0, h23 = 0;
    lowbit::cuda::linear::e2m1x4_f16x2(v | 0xabcd0000u, &h01, &h23);  // high bits ignored
    ASSERT_EQ(h01, f16(v & 15u) | f16((v >> 4) & 15u) << 16) << "codes " << v;
    ASSERT_EQ(h23, f16((v >> 8) & 15u) | f16(v >> 12) << 16) << "codes " << v;
  }
  // Hand vectors: codes 1, 2, 8, 15 = (0.5, 1.0, -0, -6) -> f16 0x3800, 0x3c00, 0x8000, 0xc600.
  uint32_t h01 = 0, h23 = 0;
  lowbit::cuda::linear::e2m1x4_f16x2(0xf821u, &h01, &h23);
  EXPECT_EQ(h01, 0x3c003800u);
  EXPECT_EQ(h23, 0xc6008000u);
}

TEST(LinearLut, E2m1OctE4m3EveryCodeAtEveryPosition) {
  // e2m1x8_e4m3: each code's e4m3 byte is the code's value x 2^-6, exactly; even columns in
  // *even (byte j = column 2 j), odd ones in *odd, whatever the other nibbles hold.
  for (uint32_t code = 0; code < 16; ++code) {
    const float want = lowbit::dt::e2m1_to_f32(static_cast<uint8_t>(code)) * 0x1p-6f;
    for (int col = 0; col < 8; ++col) {
      for (uint32_t fill : {0x00000000u, 0xffffffffu, 0x9a5c3e71u}) {
        const uint32_t word = (fill & ~(15u << (4 * col))) | code << (4 * col);
        uint32_t even = 0, odd = 0;
        lowbit::cuda::linear::e2m1x8_e4m3(word, &even, &odd);
        const uint32_t bytes = col % 2 ? odd : even;
        const uint8_t b = static_cast<uint8_t>(bytes >> (8 * (col / 2)));
        const float got = lowbit::dt::e4m3_to_f32(b);
        ASSERT_EQ(got, want) << "code " << code << " column " << col << " fill " << fill;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << "code " << code;
      }
    }
  }
  // Hand vector: codes 1, 2, 8, 15, 6, 0, 9, 7 (0.5, 1, -0, -6, 4, 0, -0.5, 6) ->
  // x 2^-6 in e4m3: 0x04 (2^-7), 0x08, 0x80, 0x9c | 0x18, 0x00, 0x84, 0x1c.
  uint32_t even = 0, odd = 0;
  lowbit::cuda::linear::e2m1x8_e4m3(0x7906f821u, &even, &odd);
  EXPECT_EQ(even, 0x84188004u);  // columns 0, 2, 4, 6: codes 1, 8, 6, 9
  EXPECT_EQ(odd, 0x1c009c08u);   // columns 1, 3, 5, 7: codes 2, 15, 0, 7
}
