// The RTN kernel (kernel.hpp) on hand-made groups, section 3 of the format
// spec. Every test runs against quantize_block_ref (the scalar reference) and
// quantize_block (the fast path). The expected codes and scales are worked
// out by hand in the comments; none is computed by the code under test.
//
// Notation: BF16 has 8 significant bits, so between 2^k and 2^(k+1) its step
// is 2^(k-7); F16 has 11 significant bits (step 2^(k-10)). "u" is the
// smallest BF16 subnormal 2^-133. Codes are shown before the +2^(b-1) offset
// of the packed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "ctquant/scheme/kernel.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using test::float_bytes;
using test::u16_bytes;

using KernelFn = std::optional<std::uint64_t> (*)(const QuantScheme&, const KernelBlock&);

// A kernel entry point and its name (for test names).
struct KernelPath {
  const char* name;
  KernelFn fn;
};
void PrintTo(const KernelPath& path, std::ostream* os) { *os << path.name; }

QuantScheme w4(std::uint64_t group_size) { return QuantScheme{"W4A16", 4, true, group_size}; }
QuantScheme w8(std::uint64_t group_size) { return QuantScheme{"W8A16", 8, true, group_size}; }
QuantScheme w4_asym(std::uint64_t group_size) {
  return QuantScheme{"W4A16_ASYM", 4, false, group_size};
}

struct KernelOutput {
  std::optional<std::uint64_t> bad;  // first non-finite element, if any
  std::vector<std::uint32_t> packed;
  std::vector<int> codes;                 // decoded from packed, n_rows * n_cols
  std::vector<std::uint32_t> scale_bits;  // raw bits of each scale (16 or 32 wide)
  std::vector<int> zero_points;           // asymmetric only
};

// Code i of a packed row, read independently of unpack_codes(): the b bits
// starting at bit i*b of the row's little-endian bit stream, minus 2^(b-1).
int code_at(const std::uint32_t* row_words, std::uint64_t n_words, int b, std::uint64_t i) {
  const std::uint64_t bit = i * static_cast<std::uint64_t>(b);
  const std::uint64_t w = bit / 32;
  std::uint64_t both = row_words[w];
  if (w + 1 < n_words) both |= static_cast<std::uint64_t>(row_words[w + 1]) << 32;
  const auto raw = static_cast<int>((both >> (bit % 32)) & ((1u << b) - 1u));
  return raw - (1 << (b - 1));
}

KernelOutput run(KernelFn fn, const QuantScheme& scheme, DType dtype, std::uint64_t n_rows,
                 std::uint64_t n_cols, const std::vector<std::byte>& weight) {
  const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
  EXPECT_EQ(weight.size(), n_rows * n_cols * esize);
  const std::uint64_t n_groups = n_cols / scheme.effective_group_size(n_cols);
  const std::uint64_t words = packed_words_per_row(n_cols, scheme.num_bits);
  KernelOutput out;
  out.packed.assign(n_rows * words, 0xDEADBEEFu);
  std::vector<std::byte> scale(n_rows * n_groups * esize, std::byte{0xAB});
  std::vector<std::int8_t> zero_point(n_rows * n_groups, 99);
  KernelBlock block;
  block.dtype = dtype;
  block.n_rows = n_rows;
  block.n_cols = n_cols;
  block.weight = weight.data();
  block.packed = out.packed.data();
  block.scale = scale.data();
  block.zero_point = scheme.symmetric ? nullptr : zero_point.data();
  out.bad = fn(scheme, block);
  for (std::uint64_t r = 0; r < n_rows; ++r) {
    for (std::uint64_t c = 0; c < n_cols; ++c) {
      out.codes.push_back(code_at(out.packed.data() + r * words, words, scheme.num_bits, c));
    }
  }
  for (std::uint64_t i = 0; i < n_rows * n_groups; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, scale.data() + i * esize, esize);  // little-endian host
    out.scale_bits.push_back(bits);
    if (!scheme.symmetric) out.zero_points.push_back(zero_point[i]);
  }
  return out;
}

class Kernel : public ::testing::TestWithParam<KernelPath> {
 protected:
  KernelOutput quantize(const QuantScheme& scheme, DType dtype, std::uint64_t n_rows,
                        std::uint64_t n_cols, const std::vector<std::byte>& weight) {
    return run(GetParam().fn, scheme, dtype, n_rows, n_cols, weight);
  }
};

// An all-zero group has s = 0, so s becomes eps(T): BF16 2^-7 = 0x3C00,
// F16 2^-10 = 0x1400, F32 2^-23 = 0x34000000. Every code is 0 (0 / eps,
// -0 / eps = -0, rounds to 0). The second group [7.5, 0...] has s = 1.
TEST_P(Kernel, AllZeroGroupGetsEpsScale) {
  const std::vector<float> row = {0, -0.0f, 0, 0, 0, 0, -0.0f, 0, 7.5f, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<int> codes = {0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0};
  const auto bf16 = quantize(w4(8), DType::kBF16, 1, 16, float_bytes(DType::kBF16, row));
  EXPECT_EQ(bf16.bad, std::nullopt);
  EXPECT_EQ(bf16.scale_bits, (std::vector<std::uint32_t>{0x3C00, 0x3F80}));
  EXPECT_EQ(bf16.codes, codes);
  const auto f16 = quantize(w4(8), DType::kF16, 1, 16, float_bytes(DType::kF16, row));
  EXPECT_EQ(f16.scale_bits, (std::vector<std::uint32_t>{0x1400, 0x3C00}));
  EXPECT_EQ(f16.codes, codes);
  const auto f32 = quantize(w4(8), DType::kF32, 1, 16, float_bytes(DType::kF32, row));
  EXPECT_EQ(f32.scale_bits, (std::vector<std::uint32_t>{0x34000000u, 0x3F800000u}));
  EXPECT_EQ(f32.codes, codes);
}

// Group [7.5, 2.5, 3.5, -0.5, 0.5, 1.5, -2.5, -1.5]: a = 7.5, s = 7.5 / 7.5 = 1
// (0x3F80), so v = w exactly and every v is a tie: 7.5 clamps to 7;
// 2.5 -> 2, 3.5 -> 4, -0.5 -> -0 = 0, 0.5 -> 0, 1.5 -> 2, -2.5 -> -2, -1.5 -> -2.
// Packed (code + 8): 15, 10, 12, 8, 8, 10, 6, 6, nibble k at bits 4k:
// 0x66A88CAF.
TEST_P(Kernel, TiesRoundHalfToEvenAndClampAtSeven) {
  const std::vector<float> row = {7.5f, 2.5f, 3.5f, -0.5f, 0.5f, 1.5f, -2.5f, -1.5f};
  const auto out = quantize(w4(8), DType::kBF16, 1, 8, float_bytes(DType::kBF16, row));
  EXPECT_EQ(out.bad, std::nullopt);
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3F80}));
  EXPECT_EQ(out.codes, (std::vector<int>{7, 2, 4, 0, 0, 2, -2, -2}));
  EXPECT_EQ(out.packed, (std::vector<std::uint32_t>{0x66A88CAFu}));
}

// Negative-only group [-7.5, -1, -3, -0.25, -6.5, -4.5, -0.5, -7]: hi = max(max, 0)
// = 0, lo = -7.5, a = 7.5, s = 1. -7.5 is the tie between -8 and -7: even is
// -8, inside [-8, 7]. -0.25 -> 0, -6.5 -> -6, -4.5 -> -4, -0.5 -> 0.
// Second group, a dominant negative extreme [-15, 14, 3, 5, -1, 0, 1, 13]:
// a = |lo| = 15, s = 15 / 7.5 = 2 (0x4000); v = w / 2: -7.5 -> -8, 7 -> 7,
// 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, 0, 0.5 -> 0, 6.5 -> 6.
TEST_P(Kernel, NegativeExtremeGivesMinusEight) {
  const std::vector<float> row = {-7.5f, -1, -3, -0.25f, -6.5f, -4.5f, -0.5f, -7,
                                  -15,   14, 3,  5,      -1,    0,     1,     13};
  const auto out = quantize(w4(8), DType::kBF16, 1, 16, float_bytes(DType::kBF16, row));
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3F80, 0x4000}));
  EXPECT_EQ(out.codes, (std::vector<int>{-8, -1, -3, 0, -6, -4, 0, -7,  //
                                         -8, 7, 2, 2, 0, 0, 0, 6}));
}

// Section 3 step 4: the quotient w / s is rounded to T before it is rounded
// to an integer. Two BF16 groups built so that this changes codes:
//
// Group 1 [5, 1, -5, 0, 2, -1, 0, 0]: a = 5, 5 / 7.5 = 0.6666..; BF16 step in
// [0.5, 1) is 2^-8 and 0.6666.. = 170.67 * 2^-8, so s = 171 * 2^-8 =
// 0.66796875 = 0x3F2B. Then
//   1 / s = 256/171 = 1.49708 = 191.63 * 2^-7 -> BF16 1.5 (192 * 2^-7), a tie -> 2
//     (float-exact: 1.497 -> 1);
//   -5 / s = -7.48538 = -239.53 * 2^-5 -> BF16 -7.5, a tie -> -8 (float-exact: -7);
//   5 / s -> 7.5 -> clamp 7; 2 / s = 2.99415 -> BF16 3.0 -> 3; -1 / s -> -1.5 -> -2.
// Group 2 [5.25, 1.75, -1.75, 0, ...]: 5.25 / 7.5 = 0.7 = 179.2 * 2^-8, s =
// 179 * 2^-8 = 0.69921875 = 0x3F33; 1.75 / s = 2.50279 = 320.36 * 2^-7 -> BF16
// 2.5, a tie -> 2 (float-exact: 3); -1.75 -> -2 (float-exact: -3); 5.25 / s =
// 7.508 -> BF16 7.5 -> 7.
TEST_P(Kernel, QuotientIsRoundedToBf16BeforeRounding) {
  const std::vector<float> row = {5, 1, -5, 0, 2, -1, 0, 0, 5.25f, 1.75f, -1.75f, 0, 0, 0, 0, 0};
  const std::vector<int> expected = {7, 2, -8, 0, 3, -2, 0, 0,  //
                                     7, 2, -2, 0, 0, 0,  0, 0};
  const auto out = quantize(w4(8), DType::kBF16, 1, 16, float_bytes(DType::kBF16, row));
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3F2B, 0x3F33}));
  EXPECT_EQ(out.codes, expected);
  // The construction discriminates: rounding the float quotient directly
  // (skipping the BF16 step) gives other codes for 1, -5, -1, 1.75, -1.75.
  const float s[2] = {0.66796875f, 0.69921875f};
  std::vector<int> naive;
  for (std::size_t c = 0; c < row.size(); ++c) {
    naive.push_back(static_cast<int>(std::nearbyint(std::clamp(row[c] / s[c / 8], -8.0f, 7.0f))));
  }
  EXPECT_EQ(naive, (std::vector<int>{7, 1, -7, 0, 3, -1, 0, 0, 7, 3, -3, 0, 0, 0, 0, 0}));
}

// BF16 subnormals (unit u = 2^-133) are real values: group [15u, 5u, 7u, -15u,
// u, 3u, -9u, 0] has a = 15u, s = 15u / 7.5 = 2u, a subnormal scale (bits
// 0x0002), and v = w / 2u: 7.5 -> 7, 2.5 -> 2, 3.5 -> 4, -7.5 -> -8, 0.5 -> 0,
// 1.5 -> 2, -4.5 -> -4, 0. Flushing subnormals to zero would give s = eps
// and all codes 0. Second group: subnormal weights beside a normal maximum
// [1.875, u, -u, 0x007F (largest subnormal), 0, 0, 0, 0]: s = 0.25 (0x3E80),
// 1.875 / 0.25 = 7.5 -> 7, the subnormals divide to tiny values -> 0.
TEST_P(Kernel, SubnormalWeightsAndScale) {
  const std::vector<std::uint16_t> bits = {0x000F, 0x0005, 0x0007, 0x800F, 0x0001, 0x0003,
                                           0x8009, 0x0000, 0x3FF0, 0x0001, 0x8001, 0x007F,
                                           0x0000, 0x0000, 0x0000, 0x0000};
  const auto out = quantize(w4(8), DType::kBF16, 1, 16, u16_bytes(bits));
  EXPECT_EQ(out.bad, std::nullopt);
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x0002, 0x3E80}));
  EXPECT_EQ(out.codes, (std::vector<int>{7, 2, 4, -8, 0, 2, -4, 0,  //
                                         7, 0, 0, 0, 0, 0, 0, 0}));
}

// A NaN or an infinity anywhere returns the element index (row * n_cols + col
// within the block) of the first one in row-major order.
TEST_P(Kernel, NonFiniteReturnsFirstBadIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(std::string(dtype_tag(dtype)));
    std::vector<float> w(2 * 16, 0.5f);
    w[1 * 16 + 3] = nan;   // index 19
    w[1 * 16 + 12] = inf;  // later, in another group
    EXPECT_EQ(quantize(w4(8), dtype, 2, 16, float_bytes(dtype, w)).bad, 19u);

    std::fill(w.begin(), w.end(), 0.5f);
    w[0 * 16 + 9] = -inf;  // index 9, second group of row 0
    w[1 * 16 + 0] = nan;
    EXPECT_EQ(quantize(w4(8), dtype, 2, 16, float_bytes(dtype, w)).bad, 9u);

    std::fill(w.begin(), w.end(), 0.5f);
    w[31] = inf;  // the very last element
    EXPECT_EQ(quantize(w4(8), dtype, 2, 16, float_bytes(dtype, w)).bad, 31u);
    EXPECT_EQ(quantize(w4_asym(8), dtype, 2, 16, float_bytes(dtype, w)).bad, 31u);
    EXPECT_EQ(quantize(w4(0), dtype, 2, 16, float_bytes(dtype, w)).bad, 31u);
  }
  // F16 overflow is infinity in the file: 0x7C00 at index 2 is found.
  const auto f16 =
      quantize(w4(8), DType::kF16, 1, 8, u16_bytes({0x3C00, 0x3C00, 0x7C00, 0x7E00, 0, 0, 0, 0}));
  EXPECT_EQ(f16.bad, 2u);
}

// F16: the quotient is rounded to F16 (step 2^-9 in [2, 4)). Group [3, 1, -3,
// 0, ...]: 3 / 7.5 = 0.4 = 1638.4 * 2^-12, so s = 1638 * 2^-12 = 0.39990234375
// = 1.599609375 * 2^-2: F16 exponent 13, fraction 614 -> 0x3666. 1 / s =
// 2.50061 = 1280.31 * 2^-9 -> F16 2.5, a tie -> 2 (float-exact: 3); 3 / s =
// 7.5018 -> F16 7.5 -> clamp 7; -3 / s -> -7.5 -> -8.
// Second group, F16 subnormals (unit 2^-24): [15, 5, -7, 0...] units: s =
// 2 units = 0x0002; v = 7.5 -> 7, 2.5 -> 2, -3.5 -> -4.
TEST_P(Kernel, F16QuotientRoundingAndSubnormals) {
  const std::vector<std::uint16_t> bits = {
      0x4200, 0x3C00, 0xC200, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000,  // 3, 1, -3, 0...
      0x000F, 0x0005, 0x8007, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000};
  const auto out = quantize(w4(8), DType::kF16, 1, 16, u16_bytes(bits));
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3666, 0x0002}));
  EXPECT_EQ(out.codes, (std::vector<int>{7, 2, -8, 0, 0, 0, 0, 0,  //
                                         7, 2, -4, 0, 0, 0, 0, 0}));
}

// F32: scales are F32 and no extra rounding applies. Group [3.75, 1.25, -3.75,
// 0.75, 1.25 + 2^-22, 0, 0, 0]: s = 3.75 / 7.5 = 0.5 (0x3F000000); 1.25 / 0.5 =
// 2.5 -> 2; -7.5 -> -8; 1.5 -> 2; (1.25 + 2^-22) / 0.5 = 2.5 + 2^-21, not a tie
// in F32 -> 3 (rounded to BF16 it would be the tie 2.5 -> 2).
TEST_P(Kernel, F32ScaleAndNoDtypeRounding) {
  const std::vector<float> row = {3.75f, 1.25f, -3.75f, 0.75f, 1.25f + 0x1p-22f, 0, 0, 0};
  const auto out = quantize(w4(8), DType::kF32, 1, 8, float_bytes(DType::kF32, row));
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3F000000u}));
  EXPECT_EQ(out.codes, (std::vector<int>{7, 2, -8, 2, 3, 0, 0, 0}));
}

// W8: qmin -128, qmax 127, divisor (127 - -128) / 2 = 127.5; four codes per
// word, code + 128 per byte.
// Group 1 [127.5, 2.5, 100.5, -3.5, -127.5, 0, 1, -1]: s = 127.5 / 127.5 = 1;
// codes 127 (clamped), 2, 100, -4, -128 (tie -127.5 -> even -128), 0, 1, -1.
// Bytes FF 82 E4 7C | 00 80 81 7F -> words 0x7CE482FF, 0x7F818000.
// Group 2 [255, 5, -7, 0, 3, 0, 0, 0]: s = 255 / 127.5 = 2 (0x4000); 2.5 -> 2,
// -3.5 -> -4, 1.5 -> 2. Bytes FF 82 7C 80 | 82 80 80 80.
TEST_P(Kernel, EightBitDivisorAndPacking) {
  const std::vector<float> row = {127.5f, 2.5f, 100.5f, -3.5f, -127.5f, 0, 1, -1,
                                  255,    5,    -7,     0,     3,       0, 0, 0};
  const auto out = quantize(w8(8), DType::kBF16, 1, 16, float_bytes(DType::kBF16, row));
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3F80, 0x4000}));
  EXPECT_EQ(out.codes, (std::vector<int>{127, 2, 100, -4, -128, 0, 1, -1,  //
                                         127, 2, -4, 0, 2, 0, 0, 0}));
  EXPECT_EQ(out.packed,
            (std::vector<std::uint32_t>{0x7CE482FFu, 0x7F818000u, 0x807C82FFu, 0x80808082u}));
}

// Asymmetric int4 (qmin -8, qmax 7, qmax - qmin = 15):
// Group 1 [-2.25, 5.25, 0, 1.25, -1, 3, 0.5, -0.25]: lo = -2.25, hi = 5.25,
// hi - lo = 7.5, s = 7.5 / 15 = 0.5 (0x3F00); lo / s = -4.5, qmin - (-4.5) =
// -3.5 -> even -4 = z. v = w / s + z: -4.5-4 = -8.5 -> clamp -8; 10.5-4 = 6.5 -> 6;
// -4; 2.5-4 = -1.5 -> -2; -2-4 = -6; 6-4 = 2; 1-4 = -3; -0.5-4 = -4.5 -> -4.
// Group 2, all zero: s = 0 so z = 0, then s = eps = 0x3C00; codes 0.
// Group 3 [0, 15, 1, 14, 7, 8, 3, 12]: lo = 0, hi = 15, s = 1, z = -8 - 0 = -8;
// v = w - 8: -8, 7, -7, 6, -1, 0, -5, 4.
TEST_P(Kernel, AsymmetricScaleAndZeroPoint) {
  const std::vector<float> row = {-2.25f, 5.25f, 0, 1.25f, -1, 3, 0.5f, -0.25f,  //
                                  0,      0,     0, 0,     0,  0, 0,    0,       //
                                  0,      15,    1, 14,    7,  8, 3,    12};
  const auto out = quantize(w4_asym(8), DType::kBF16, 1, 24, float_bytes(DType::kBF16, row));
  EXPECT_EQ(out.bad, std::nullopt);
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3F00, 0x3C00, 0x3F80}));
  EXPECT_EQ(out.zero_points, (std::vector<int>{-4, 0, -8}));
  EXPECT_EQ(out.codes, (std::vector<int>{-8, 6, -4, -2, -6, 2, -3, -4,  //
                                         0,  0, 0,  0,  0,  0, 0,  0,   //
                                         -8, 7, -7, 6,  -1, 0, -5, 4}));
}

// Channel-wise (group_size 0): one scale per row over all 16 columns.
// Row 0 [7.5, 0.75, 1.5, 2.5, 0...] has s = 1: 0.75 -> 1, 1.5 -> 2, 2.5 -> 2
// (grouped by 8 the second half would get its own scale). Row 1 [15, -15, 5, 3,
// 1, 0...] has s = 2 (0x4000): 7.5 -> 7, -7.5 -> -8, 2.5 -> 2, 1.5 -> 2, 0.5 -> 0.
TEST_P(Kernel, ChannelWiseOneScalePerRow) {
  std::vector<float> w(32, 0.0f);
  w[0] = 7.5f;
  w[9] = 0.75f;
  w[10] = 1.5f;
  w[11] = 2.5f;
  w[16] = 15;
  w[17] = -15;
  w[18] = 5;
  w[19] = 3;
  w[20] = 1;
  const auto out = quantize(w4(0), DType::kBF16, 2, 16, float_bytes(DType::kBF16, w));
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3F80, 0x4000}));
  std::vector<int> expected(32, 0);
  expected[0] = 7;
  expected[9] = 1;
  expected[10] = 2;
  expected[11] = 2;
  expected[16] = 7;
  expected[17] = -8;
  expected[18] = 2;
  expected[19] = 2;
  expected[20] = 0;
  EXPECT_EQ(out.codes, expected);
}

// Rows are independent and packed rows are padded to whole words: 3 rows of
// 12 columns (12 * 4 = 48 bits -> 2 words per row), row r holding r + 1 in
// column 0 and zeros elsewhere. Each s = (r + 1) / 7.5 rounded to BF16 and
// the code of the maximum is 7 (v = 7.5 or just below/above it): row 0 s =
// 0.1333.. = 136.53 * 2^-10 -> 137 * 2^-10 = 0x3E09; row 1 s = 0.2666.. =
// 136.53 * 2^-9 -> 0x3E89; row 2 s = 0.4 = 204.8 * 2^-9 -> 205 * 2^-9 = 0x3ECD.
TEST_P(Kernel, RowsArePackedSeparately) {
  std::vector<float> w(36, 0.0f);
  w[0] = 1;
  w[12] = 2;
  w[24] = 3;
  const auto out = quantize(w4(4), DType::kBF16, 3, 12, float_bytes(DType::kBF16, w));
  EXPECT_EQ(out.packed.size(), 6u);
  EXPECT_EQ(out.scale_bits, (std::vector<std::uint32_t>{0x3E09, 0x3C00, 0x3C00, 0x3E89, 0x3C00,
                                                        0x3C00, 0x3ECD, 0x3C00, 0x3C00}));
  // Row words: codes 7, 0 x 11 -> word 0 = 0x8888888F, word 1 = 0x00008888.
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(out.packed[2 * r], 0x8888888Fu) << r;
    EXPECT_EQ(out.packed[2 * r + 1], 0x00008888u) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Kernel,
                         ::testing::Values(KernelPath{"Reference", &quantize_block_ref},
                                           KernelPath{"Fast", &quantize_block}),
                         [](const ::testing::TestParamInfo<KernelPath>& param) {
                           return std::string(param.param.name);
                         });

// quantize_block produces the bytes of quantize_block_ref on random and
// adversarial data (zeros, ties, subnormals, large outliers) for every dtype
// and scheme, over several row counts.
TEST(KernelPaths, FastEqualsReferenceOnRandomData) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_int_distribution<int> pick(0, 9);
  const std::vector<QuantScheme> schemes = {w4(128), w4(32), w4(0), w8(128), w4_asym(128)};
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const QuantScheme& scheme : schemes) {
      for (std::uint64_t n_rows : {1u, 3u, 17u}) {
        const std::uint64_t n_cols = 256;
        std::vector<float> w(n_rows * n_cols);
        for (float& v : w) {
          switch (pick(rng)) {
            case 0:
              v = 0.0f;
              break;
            case 1:
              v = 1e-40f;
              break;  // subnormal in float
            case 2:
              v = std::ldexp(std::nearbyint(normal(rng) * 400) + 0.5f, -6);
              break;  // ties
            case 3:
              v = normal(rng) * 50;
              break;  // outlier
            default:
              v = normal(rng);
          }
        }
        // One all-zero group and one negative-only group.
        std::fill(w.begin(), w.begin() + 32, 0.0f);
        for (std::size_t c = 32; c < 64; ++c) w[c] = -std::fabs(w[c]) - 1e-3f;
        const auto bytes = float_bytes(dtype, w);
        const auto ref = run(&quantize_block_ref, scheme, dtype, n_rows, n_cols, bytes);
        const auto fast = run(&quantize_block, scheme, dtype, n_rows, n_cols, bytes);
        SCOPED_TRACE(std::string(dtype_tag(dtype)) + " " + scheme.name + " g" +
                     std::to_string(scheme.group_size) + " rows " + std::to_string(n_rows));
        EXPECT_EQ(fast.bad, ref.bad);
        EXPECT_EQ(fast.packed, ref.packed);
        EXPECT_EQ(fast.scale_bits, ref.scale_bits);
        EXPECT_EQ(fast.zero_points, ref.zero_points);
      }
    }
  }
}

}  // namespace
}  // namespace ctquant
