// The small float encoders of format/minifloat.hpp (docs/schemes.md
// sections 2.1-2.3, 6.1): every E2M1 and E4M3 code, every rounding
// threshold and the sign of zero, against values written out by hand.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/minifloat.hpp"
#include "fp8_tables.hpp"

namespace ctquant {
namespace {

TEST(E2M1, EveryCodeDecodesToItsGridValue) {
  const float expected[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (std::uint8_t c = 0; c < 16; ++c) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(e2m1_to_float(c)),
              std::bit_cast<std::uint32_t>(expected[c]))
        << int{c};
  }
}

TEST(E2M1, EveryGridValueEncodesToItsCode) {
  for (std::uint8_t c = 1; c < 16; ++c) {
    if (c == 8) continue;  // -0.0 encodes as +0 (below)
    EXPECT_EQ(e2m1_code(e2m1_to_float(c)), c) << int{c};
  }
}

TEST(E2M1, TiesRoundToEven) {
  // schemes.md 2.2: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4 (codes 0, 2, 2, 4, 4, 6, 6).
  EXPECT_EQ(e2m1_code(0.25f), 0);
  EXPECT_EQ(e2m1_code(0.75f), 2);
  EXPECT_EQ(e2m1_code(1.25f), 2);
  EXPECT_EQ(e2m1_code(1.75f), 4);
  EXPECT_EQ(e2m1_code(2.5f), 4);
  EXPECT_EQ(e2m1_code(3.5f), 6);
  EXPECT_EQ(e2m1_code(5.0f), 6);
  EXPECT_EQ(e2m1_code(-0.25f), 8);
  EXPECT_EQ(e2m1_code(-0.75f), 10);
  EXPECT_EQ(e2m1_code(-5.0f), 14);
}

TEST(E2M1, NeighboursOfEachThresholdRoundToTheNearerValue) {
  const struct {
    float threshold;
    std::uint8_t below;
    std::uint8_t above;
  } cases[] = {{0.25f, 0, 1}, {0.75f, 1, 2}, {1.25f, 2, 3}, {1.75f, 3, 4},
               {2.5f, 4, 5},  {3.5f, 5, 6},  {5.0f, 6, 7}};
  for (const auto& c : cases) {
    EXPECT_EQ(e2m1_code(std::nextafter(c.threshold, 0.0f)), c.below) << c.threshold;
    EXPECT_EQ(e2m1_code(std::nextafter(c.threshold, 10.0f)), c.above) << c.threshold;
    EXPECT_EQ(e2m1_code(-std::nextafter(c.threshold, 10.0f)), c.above | 8) << c.threshold;
  }
}

TEST(E2M1, LargeValuesSaturateAtSix) {
  EXPECT_EQ(e2m1_code(6.0f), 7);
  EXPECT_EQ(e2m1_code(1e30f), 7);
  EXPECT_EQ(e2m1_code(-7.0f), 15);
}

TEST(E2M1, SignOfZeroFollowsTorchSign) {
  // cast_to_fp4 multiplies by torch.sign: -0.0 gives +0 (code 0), a
  // negative value that rounds to 0 gives -0.0 (code 8).
  EXPECT_EQ(e2m1_code(0.0f), 0);
  EXPECT_EQ(e2m1_code(-0.0f), 0);
  EXPECT_EQ(e2m1_code(-0.1f), 8);
  EXPECT_EQ(e2m1_code(-std::numeric_limits<float>::denorm_min()), 8);
  EXPECT_EQ(e2m1_code(std::numeric_limits<float>::denorm_min()), 0);
}

TEST(E4M3Encode, EveryFiniteCodeRoundTrips) {
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    if ((c & 0x7Fu) == 0x7Fu) continue;  // NaN
    const float v = std::bit_cast<float>(test::kE4M3FnBits[c]);
    EXPECT_EQ(float_to_f8_e4m3(v), code) << c;
  }
}

TEST(E4M3Encode, MidpointsBetweenNeighboursGoToTheEvenCode) {
  // Every pair of adjacent positive codes (c, c + 1): the midpoint goes to
  // the even one, its float neighbours to the nearer one.
  for (unsigned c = 0; c < 0x7E; ++c) {
    const float lo = std::bit_cast<float>(test::kE4M3FnBits[c]);
    const float hi = std::bit_cast<float>(test::kE4M3FnBits[c + 1]);
    const float mid = lo + (hi - lo) / 2;  // exact: both are short binary fractions
    const unsigned even = c % 2 == 0 ? c : c + 1;
    EXPECT_EQ(float_to_f8_e4m3(mid), even) << c;
    EXPECT_EQ(float_to_f8_e4m3(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(float_to_f8_e4m3(std::nextafter(mid, 1000.0f)), c + 1) << c;
    EXPECT_EQ(float_to_f8_e4m3(-mid), even | 0x80u) << c;
  }
}

TEST(E4M3Encode, SpecTies) {
  // schemes.md 2.1: 1.0625 -> 1.0, 1.1875 -> 1.25, 232 -> 224, 2^-10 -> 0,
  // 0.9375 * 2^-6 -> 2^-6.
  EXPECT_EQ(float_to_f8_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_f8_e4m3(1.1875f), 0x3A);
  EXPECT_EQ(float_to_f8_e4m3(232.0f), 0x76);  // 224
  EXPECT_EQ(float_to_f8_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(float_to_f8_e4m3(0.9375f * 0x1p-6f), 0x08);
}

TEST(E4M3Encode, ClampsToPlusMinus448) {
  EXPECT_EQ(float_to_f8_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_f8_e4m3(464.0f), 0x7E);
  EXPECT_EQ(float_to_f8_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_f8_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_f8_e4m3(-1e30f), 0xFE);
}

TEST(E4M3Encode, NegativeZeroAndTinyNegativesKeepTheSign) {
  EXPECT_EQ(float_to_f8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_f8_e4m3(-0x1p-10f), 0x80);
  EXPECT_EQ(float_to_f8_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(float_to_f8_e4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(float_to_f8_e4m3(-0x1p-9f), 0x81);
}

TEST(E4M3Encode, NaNIsCode7F) {
  EXPECT_EQ(float_to_f8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_f8_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
}

TEST(E8M0, BytesArePowersOfTwoWithBias127) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0x7A), 0x1p-5f);
  EXPECT_EQ(e8m0_to_float(254), 0x1p127f);
  EXPECT_EQ(e8m0_to_float(1), 0x1p-126f);
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f);  // a float subnormal, exact
  EXPECT_TRUE(std::isinf(e8m0_to_float(255)));
}

}  // namespace
}  // namespace ctquant
