// The dtype table and the exact BF16 / F16 / F32 conversions (dtype.hpp).
//
// Expected values come from the IEEE-754 definitions, not from the code under
// test: decoded values from the exponent/mantissa formula with std::ldexp, and
// rounded values from a double-precision reference that divides by the
// target's quantum and rounds half to even with std::nearbyint (exact, since
// every float is a double and the quantum is a power of two).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ctquant/format/dtype.hpp"

namespace ctquant {
namespace {

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// Value of a BF16 bit pattern: 1 sign, 8 exponent (bias 127), 7 fraction bits.
double bf16_value(std::uint16_t b) {
  const int sign = (b >> 15) != 0 ? -1 : 1;
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  if (e == 0xFF) return m == 0 ? sign * HUGE_VAL : std::nan("");
  if (e == 0) return sign * std::ldexp(m, -133);  // subnormal: m * 2^-126 * 2^-7
  return sign * std::ldexp(128 + m, e - 127 - 7);
}

// Value of an IEEE binary16 bit pattern: 1 sign, 5 exponent (bias 15), 10 fraction bits.
double f16_value(std::uint16_t b) {
  const int sign = (b >> 15) != 0 ? -1 : 1;
  const int e = (b >> 10) & 0x1F;
  const int m = b & 0x3FF;
  if (e == 0x1F) return m == 0 ? sign * HUGE_VAL : std::nan("");
  if (e == 0) return sign * std::ldexp(m, -24);  // subnormal: m * 2^-14 * 2^-10
  return sign * std::ldexp(1024 + m, e - 15 - 10);
}

// The value a finite float rounds to in a binary format with `fraction_bits`
// fraction bits, smallest normal exponent `min_exp`, round-to-nearest-even;
// `overflow` is the smallest magnitude that rounds to infinity (the largest
// finite value plus half its quantum).
double reference_round(float x, int fraction_bits, int min_exp, double overflow) {
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= overflow) return std::copysign(HUGE_VAL, x);
  int e = 0;
  std::frexp(ax, &e);  // ax in [2^(e-1), 2^e)
  const int binade = std::max(e - 1, min_exp);
  const double quantum = std::ldexp(1.0, binade - fraction_bits);
  return std::copysign(std::nearbyint(ax / quantum) * quantum, x);
}

double reference_bf16(float x) {
  return reference_round(x, 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -8), 127));
}
double reference_f16(float x) { return reference_round(x, 10, -14, 65520.0); }

// Calls visit with the float bit patterns to sweep: a stride through all 2^32 patterns, plus, for
// every upper half, the low halves around the BF16 rounding boundary, and for
// F16 the patterns whose 13 dropped bits are exactly a tie.
template <typename Visit>
void for_each_sweep_pattern(Visit visit) {
  for (std::uint64_t u = 0; u < (1ull << 32); u += 509) visit(static_cast<std::uint32_t>(u));
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      visit(hi << 16 | lo);
    }
  }
  for (std::uint32_t top = 0; top < (1u << 19); ++top) {
    visit(top << 13 | 0x1000u);
    visit(top << 13 | 0x0FFFu);
  }
}

TEST(DTypeConvert, Bf16ToFloatMatchesFormulaForAllPatterns) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double expected = bf16_value(bits);
    const float got = bf16_to_float(bits);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << std::hex << b;
      ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << std::hex << b;
    }
  }
}

TEST(DTypeConvert, F16ToFloatMatchesFormulaForAllPatterns) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double expected = f16_value(bits);
    const float got = f16_to_float(bits);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << std::hex << b;
      ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << std::hex << b;
    }
  }
}

// Every BF16 and F16 pattern survives 16 -> float -> 16 unchanged; NaN
// patterns come back as NaN (the payload need not survive).
TEST(DTypeConvert, Bf16RoundTripsForAllPatterns) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const std::uint16_t back = float_to_bf16(bf16_to_float(bits));
    if (std::isnan(bf16_value(bits))) {
      EXPECT_TRUE(std::isnan(bf16_value(back))) << std::hex << b << " -> " << back;
      EXPECT_EQ(back & 0x8000, bits & 0x8000);
    } else {
      ASSERT_EQ(back, bits) << std::hex << b;
    }
  }
}

TEST(DTypeConvert, F16RoundTripsForAllPatterns) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const std::uint16_t back = float_to_f16(f16_to_float(bits));
    if (std::isnan(f16_value(bits))) {
      EXPECT_TRUE(std::isnan(f16_value(back))) << std::hex << b << " -> " << back;
      EXPECT_EQ(back & 0x8000, bits & 0x8000);
    } else {
      ASSERT_EQ(back, bits) << std::hex << b;
    }
  }
}

TEST(DTypeConvert, FloatToBf16MatchesReferenceRounding) {
  std::uint64_t wrong = 0;
  std::uint32_t first_wrong = 0;
  for_each_sweep_pattern([&](std::uint32_t u) {
    const float x = from_bits(u);
    if (std::isnan(x)) return;
    const std::uint16_t got = float_to_bf16(x);
    if (bf16_value(got) != reference_bf16(x) || ((got & 0x8000) != 0) != std::signbit(x)) {
      if (wrong++ == 0) first_wrong = u;
    }
  });
  EXPECT_EQ(wrong, 0u) << "first wrong float bits 0x" << std::hex << first_wrong;
}

TEST(DTypeConvert, FloatToF16MatchesReferenceRounding) {
  std::uint64_t wrong = 0;
  std::uint32_t first_wrong = 0;
  for_each_sweep_pattern([&](std::uint32_t u) {
    const float x = from_bits(u);
    if (std::isnan(x)) return;
    const std::uint16_t got = float_to_f16(x);
    if (f16_value(got) != reference_f16(x) || ((got & 0x8000) != 0) != std::signbit(x)) {
      if (wrong++ == 0) first_wrong = u;
    }
  });
  EXPECT_EQ(wrong, 0u) << "first wrong float bits 0x" << std::hex << first_wrong;
}

// Hand-picked BF16 cases. BF16 keeps the top 16 bits of a float; the low 16
// bits decide the rounding, 0x8000 being the exact tie.
TEST(DTypeConvert, FloatToBf16TiesAndEdges) {
  // 1 + 2^-8 lies halfway between 1.0 (0x3F80) and 1 + 2^-7 (0x3F81): even.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3*2^-8 lies halfway between 0x3F81 and 0x3F82: even is 0x3F82.
  EXPECT_EQ(float_to_bf16(1.0f + 0x3p-8f), 0x3F82);
  // Just above the tie rounds up.
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bf16(-(1.0f + 0x1p-8f)), 0xBF80);
  // Subnormal BF16 (unit 2^-133): half a unit goes to 0, one and a half to 2.
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000u)), 0x0000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(float_to_bf16(from_bits(0x00008001u)), 0x0001);
  EXPECT_EQ(float_to_bf16(0x1p-133f), 0x0001);
  // Overflow: the largest BF16 is 0x7F7F; FLT_MAX and the tie above 0x7F7F
  // (odd) round to infinity, just below the tie stays finite.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(float_to_bf16(HUGE_VALF), 0x7F80);
  EXPECT_EQ(float_to_bf16(-HUGE_VALF), 0xFF80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  // NaN stays NaN, including a signalling NaN whose payload sits in the low
  // 16 bits (plain truncation would turn it into infinity).
  EXPECT_EQ(float_to_bf16(from_bits(0x7FC00000u)) & 0x7FC0, 0x7FC0);
  EXPECT_TRUE(std::isnan(bf16_value(float_to_bf16(from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_value(float_to_bf16(from_bits(0xFF800001u)))));
}

// Hand-picked F16 cases: unit of the subnormals 2^-24, normals from 2^-14,
// largest finite 65504, quantum 32 between 32768 and 65536.
TEST(DTypeConvert, FloatToF16TiesSubnormalsAndOverflow) {
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);                // 0.5 unit: tie, even is 0
  EXPECT_EQ(float_to_f16(from_bits(0x33000001u)), 0x0001);  // just above 2^-25
  EXPECT_EQ(float_to_f16(0x3p-25f), 0x0002);                // 1.5 units: even is 2
  EXPECT_EQ(float_to_f16(0x5p-25f), 0x0002);                // 2.5 units: even is 2
  EXPECT_EQ(float_to_f16(0x7p-25f), 0x0004);                // 3.5 units: even is 4
  EXPECT_EQ(float_to_f16(-0x3p-25f), 0x8002);
  // 2^-14 - 2^-25 = 1023.5 units: tie between 0x03FF and 0x0400 (2^-14), even is 0x0400.
  EXPECT_EQ(float_to_f16(0x1p-14f - 0x1p-25f), 0x0400);
  // 1022.5 units: even is 1022.
  EXPECT_EQ(float_to_f16(0x1p-14f - 0x3p-25f), 0x03FE);
  EXPECT_EQ(float_to_f16(0x1p-14f), 0x0400);
  // Normal ties: 1 + 2^-11 between 0x3C00 and 0x3C01, 1 + 3*2^-11 between 0x3C01 and 0x3C02.
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(float_to_f16(1.0f + 0x3p-11f), 0x3C02);
  // Overflow: 65504 is 0x7BFF; 65520 is halfway to 65536 and rounds to
  // infinity; 65519.99f (the float 65519.98828125) stays 65504.
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_f16(-65520.0f), 0xFC00);
  EXPECT_EQ(float_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(float_to_f16(HUGE_VALF), 0x7C00);
  EXPECT_EQ(float_to_f16(-HUGE_VALF), 0xFC00);
  EXPECT_EQ(float_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(float_to_f16(-1e-10f), 0x8000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(f16_value(float_to_f16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(f16_value(float_to_f16(from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(f16_value(float_to_f16(from_bits(0xFFC00000u)))));
}

TEST(DTypeConvert, RoundToDtype) {
  EXPECT_EQ(round_to_dtype(DType::kBF16, 1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(round_to_dtype(DType::kBF16, 1.0f + 0x3p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(round_to_dtype(DType::kF16, 1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(round_to_dtype(DType::kF16, 65520.0f), HUGE_VALF);
  EXPECT_EQ(round_to_dtype(DType::kF16, 0x3p-25f), 0x1p-23f);
  // F32: unchanged, subnormals included.
  EXPECT_EQ(bits_of(round_to_dtype(DType::kF32, from_bits(0x3F800001u))), 0x3F800001u);
  EXPECT_EQ(bits_of(round_to_dtype(DType::kF32, from_bits(0x00000001u))), 0x00000001u);
}

TEST(DTypeConvert, LoadAsFloatReadsLittleEndian) {
  const unsigned char bf16[2] = {0xC0, 0x3F};             // 0x3FC0 = 1.5
  const unsigned char f16[2] = {0x00, 0x3E};              // 0x3E00 = 1.5
  const unsigned char f32[4] = {0x01, 0x00, 0x80, 0x3F};  // 0x3F800001 = 1 + 2^-23
  EXPECT_EQ(load_as_float(DType::kBF16, bf16), 1.5f);
  EXPECT_EQ(load_as_float(DType::kF16, f16), 1.5f);
  EXPECT_EQ(load_as_float(DType::kF32, f32), 1.0f + 0x1p-23f);
}

// eps(T) of section 3 step 3, as float bit patterns and as T's own bits:
// 2^-7 = 0x3C000000 (BF16 0x3C00), 2^-10 = 0x3A800000 (F16 0x1400),
// 2^-23 = 0x34000000.
TEST(DTypeConvert, EpsBitPatterns) {
  EXPECT_EQ(bits_of(dtype_eps(DType::kBF16)), 0x3C000000u);
  EXPECT_EQ(bits_of(dtype_eps(DType::kF16)), 0x3A800000u);
  EXPECT_EQ(bits_of(dtype_eps(DType::kF32)), 0x34000000u);
  EXPECT_EQ(float_to_bf16(dtype_eps(DType::kBF16)), 0x3C00);
  EXPECT_EQ(float_to_f16(dtype_eps(DType::kF16)), 0x1400);
}

// Section 1 of the format spec: every tag and its width in bits.
TEST(DTypeTable, EveryTagOfTheSpec) {
  const std::vector<std::pair<std::string, int>> tags = {
      {"BOOL", 8},    {"U8", 8},          {"I8", 8},          {"F8_E4M3", 8}, {"F8_E5M2", 8},
      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4},      {"F6_E2M3", 6},
      {"F6_E3M2", 6}, {"I16", 16},        {"U16", 16},        {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32},        {"F32", 32},        {"C64", 64},    {"I64", 64},
      {"U64", 64},    {"F64", 64},
  };
  EXPECT_EQ(tags.size(), kDTypeTraits.size());
  for (const auto& [tag, bits] : tags) {
    const auto dtype = dtype_from_tag(tag);
    ASSERT_TRUE(dtype.has_value()) << tag;
    EXPECT_EQ(dtype_tag(*dtype), tag);
    EXPECT_EQ(dtype_bits(*dtype), bits) << tag;
    EXPECT_EQ(is_quantizable_float(*dtype), tag == "BF16" || tag == "F16" || tag == "F32") << tag;
  }
}

TEST(DTypeTable, UnknownTagsAreRejected) {
  for (const char* tag : {"", "bf16", "F8", "FLOAT16", "BF16 ", "I4", "F8_E4M3FN"}) {
    EXPECT_FALSE(dtype_from_tag(tag).has_value()) << "'" << tag << "'";
  }
}

}  // namespace
}  // namespace ctquant
