// The vector kernel against the scalar reference, bit for bit: packed words,
// scales and the index of the first non-finite weight, on random weights and
// on inputs chosen to break a careless implementation (ties after rounding
// to the dtype, zero groups, subnormals, values near the dtype's maximum,
// negative-only groups, NaN and infinities at many positions).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "scheme/kernel_simd.hpp"

namespace ctquant {
namespace detail {
// How gtest prints a level (in parameterized test failures).
void PrintTo(const SimdLevel& level, std::ostream* os) { *os << level.name; }
}  // namespace detail

namespace {

constexpr DType kFloatTypes[] = {DType::kBF16, DType::kF16, DType::kF32};
constexpr int kBitWidths[] = {4, 8};

std::size_t element_bytes(DType dtype) { return static_cast<std::size_t>(dtype_bits(dtype) / 8); }

QuantScheme symmetric_scheme(int bits, std::uint64_t group_size) {
  QuantScheme scheme;
  scheme.name = "test";
  scheme.num_bits = bits;
  scheme.symmetric = true;
  scheme.group_size = group_size;
  return scheme;
}

// Raw bits of one element of dtype (16-bit types in the low half).
struct Weights {
  DType dtype{};
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  std::vector<std::byte> bytes;

  Weights(DType t, std::uint64_t rows, std::uint64_t cols)
      : dtype(t), n_rows(rows), n_cols(cols), bytes(rows * cols * element_bytes(t)) {}

  void set_bits(std::uint64_t i, std::uint32_t bits) {
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &bits, 4);
    } else {
      const auto b = static_cast<std::uint16_t>(bits);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  // Stores value rounded to the dtype (nearest even).
  void set(std::uint64_t i, float value) {
    switch (dtype) {
      case DType::kBF16:
        set_bits(i, float_to_bf16(value));
        break;
      case DType::kF16:
        set_bits(i, float_to_f16(value));
        break;
      default:
        set_bits(i, std::bit_cast<std::uint32_t>(value));
    }
  }
  std::uint64_t size() const { return n_rows * n_cols; }
};

struct Outputs {
  std::optional<std::uint64_t> bad;
  std::vector<std::uint32_t> packed;
  std::vector<std::byte> scale;
  std::vector<std::int8_t> zero_point;  // asymmetric schemes
};

// Which kernel to run: the reference, the public quantize_block(), the
// vector kernel quantize_block() runs at one level of detail::simd_levels(),
// or the Highway kernel at that level (a different kernel on x86-64, where
// quantize_block() runs hand-written ones).
struct Kernel {
  enum class Kind { kReference, kPublic, kLevel, kHwyLevel } kind = Kind::kReference;
  detail::SimdLevel level;

  std::string name() const {
    switch (kind) {
      case Kind::kReference:
        return "reference";
      case Kind::kPublic:
        return std::string("quantize_block (") + kernel_path_name() + ")";
      case Kind::kLevel:
        return level.name;
      default:
        return std::string("highway ") + level.name;
    }
  }
};

Outputs run(const Kernel& kernel, const QuantScheme& scheme, const Weights& w) {
  const std::uint64_t n_groups = w.n_cols / scheme.effective_group_size(w.n_cols);
  const bool reference = kernel.kind == Kernel::Kind::kReference;
  Outputs out;
  // Different fill patterns, so a word one kernel leaves unwritten differs.
  out.packed.assign(w.n_rows * packed_words_per_row(w.n_cols, scheme.num_bits),
                    reference ? 0xCDCDCDCDu : 0xABABABABu);
  out.scale.assign(w.n_rows * n_groups * element_bytes(w.dtype),
                   reference ? std::byte{0xCD} : std::byte{0xAB});
  KernelBlock block;
  block.dtype = w.dtype;
  block.n_rows = w.n_rows;
  block.n_cols = w.n_cols;
  block.weight = w.bytes.data();
  block.packed = out.packed.data();
  block.scale = out.scale.data();
  if (!scheme.symmetric) {
    out.zero_point.assign(w.n_rows * n_groups, static_cast<std::int8_t>(reference ? 0x5A : 0x3C));
    block.zero_point = out.zero_point.data();
  }
  switch (kernel.kind) {
    case Kernel::Kind::kReference:
      out.bad = quantize_block_ref(scheme, block);
      break;
    case Kernel::Kind::kPublic:
      out.bad = quantize_block(scheme, block);
      break;
    case Kernel::Kind::kLevel:
      out.bad = detail::quantize_block_simd_at(kernel.level, scheme, block);
      break;
    case Kernel::Kind::kHwyLevel:
      out.bad = detail::quantize_block_hwy_at(kernel.level, scheme, block);
      break;
  }
  return out;
}

// The vector kernels at one level: what quantize_block() runs there, and
// the Highway kernel when that is a different one.
std::vector<Kernel> kernels_at(const detail::SimdLevel& level) {
  std::vector<Kernel> kernels{Kernel{Kernel::Kind::kLevel, level}};
  if (detail::simd_hand_written()) kernels.push_back(Kernel{Kernel::Kind::kHwyLevel, level});
  return kernels;
}

// The public entry point and the vector kernels at every level this CPU runs.
std::vector<Kernel> fast_kernels() {
  std::vector<Kernel> kernels{Kernel{Kernel::Kind::kPublic, {}}};
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    if (!level.supported) continue;
    for (const Kernel& k : kernels_at(level)) kernels.push_back(k);
  }
  return kernels;
}

std::string describe(const QuantScheme& scheme, const Weights& w, const std::string& what) {
  return fmt::format("{}: {} [{}, {}], {} bits {}, group {}", what, dtype_tag(w.dtype), w.n_rows,
                     w.n_cols, scheme.num_bits, scheme.symmetric ? "symmetric" : "asymmetric",
                     scheme.group_size);
}

// "avx512, avx2" (the levels compiled for this architecture).
std::string level_names() {
  std::string names;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    names += (names.empty() ? "" : ", ") + std::string(level.name);
  }
  return names.empty() ? "none" : names;
}

// Skips the calling test when this CPU has no vector path to test.
#define SKIP_WITHOUT_SIMD()                                                    \
  if (!detail::simd_available())                                               \
  GTEST_SKIP() << "this CPU runs none of the vector levels compiled for it (" \
               << level_names() << ")"

// Every vector kernel must take this case and agree with the reference on
// every output byte (or on the index of the first bad element).
void expect_same_as_given(const QuantScheme& scheme, const Weights& w, const std::string& what) {
  KernelBlock probe;
  probe.dtype = w.dtype;
  probe.n_rows = w.n_rows;
  probe.n_cols = w.n_cols;
  ASSERT_TRUE(detail::simd_supports(scheme, probe)) << describe(scheme, w, what);
  const Outputs ref = run(Kernel{}, scheme, w);
  for (const Kernel& kernel : fast_kernels()) {
    const Outputs fast = run(kernel, scheme, w);
    const std::string label = describe(scheme, w, what) + ", " + kernel.name();
    ASSERT_EQ(ref.bad, fast.bad) << label;
    if (ref.bad) continue;  // outputs are unspecified after a non-finite weight
    for (std::size_t i = 0; i < ref.packed.size(); ++i) {
      ASSERT_EQ(ref.packed[i], fast.packed[i])
          << label << ": packed word " << i << " (row "
          << i / packed_words_per_row(w.n_cols, scheme.num_bits) << ")";
    }
    for (std::size_t i = 0; i < ref.scale.size(); ++i) {
      ASSERT_EQ(ref.scale[i], fast.scale[i]) << label << ": scale byte " << i;
    }
    for (std::size_t i = 0; i < ref.zero_point.size(); ++i) {
      ASSERT_EQ(ref.zero_point[i], fast.zero_point[i]) << label << ": zero point " << i;
    }
  }
}

// The same case with the scheme as given and with its asymmetric twin
// (W4A16 and W4A16_ASYM, W8A16 and 8-bit asymmetric): every data pattern
// below is checked for both.
void expect_same(const QuantScheme& scheme, const Weights& w, const std::string& what) {
  expect_same_as_given(scheme, w, what);
  QuantScheme asymmetric = scheme;
  asymmetric.symmetric = false;
  expect_same_as_given(asymmetric, w, what);
}

// Normal values (std 0.02) with a per-row magnitude spread over 2^-20..2^12
// and rare 20x outliers, rounded to the dtype.
Weights random_weights(DType dtype, std::uint64_t rows, std::uint64_t cols, std::uint32_t seed) {
  Weights w(dtype, rows, cols);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_int_distribution<int> exponent(-20, 12);
  std::uniform_int_distribution<int> one_in(0, 999);
  for (std::uint64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, r == 0 ? 0 : exponent(rng));
    for (std::uint64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * row_scale;
      if (one_in(rng) == 0) v *= 20.0f;
      w.set(r * cols + c, v);
    }
  }
  return w;
}

TEST(KernelSimd, MatchesReferenceOnRandomWeights) {
  SKIP_WITHOUT_SIMD();
  for (const std::uint32_t seed : {1u, 2u, 3u}) {
    for (const DType dtype : kFloatTypes) {
      for (const int bits : kBitWidths) {
        for (const std::uint64_t group : {32u, 64u, 128u, 0u}) {
          const Weights w = random_weights(dtype, 9, 768, seed);
          expect_same(symmetric_scheme(bits, group), w, fmt::format("seed {}", seed));
        }
      }
    }
  }
}

// Every level compiled for this architecture, one test each: a level this
// CPU does not run is reported as skipped (so a missing AVX-512 or SVE level
// is visible in the test report rather than silently not compared); a level
// it runs agrees with the reference bit for bit on random weights. The other
// tests compare every level this CPU runs.
class KernelSimdLevel : public ::testing::TestWithParam<detail::SimdLevel> {};

TEST_P(KernelSimdLevel, MatchesReferenceOnThisCpu) {
  const detail::SimdLevel& level = GetParam();
  if (!level.supported) {
    GTEST_SKIP() << "this CPU does not run " << level.name << " (best level: "
                 << kernel_path_name() << "): the " << level.name
                 << " kernel is not compared with the reference here";
  }
  for (const DType dtype : kFloatTypes) {
    for (const int bits : kBitWidths) {
      for (const std::uint64_t group : {8u, 32u, 128u, 0u}) {
        for (const bool symmetric : {true, false}) {
          const Weights w = random_weights(dtype, 5, 1024, 7);
          QuantScheme scheme = symmetric_scheme(bits, group);
          scheme.symmetric = symmetric;
          const Outputs ref = run(Kernel{}, scheme, w);
          ASSERT_EQ(ref.bad, std::nullopt);
          for (const Kernel& kernel : kernels_at(level)) {
            const Outputs fast = run(kernel, scheme, w);
            const std::string label = describe(scheme, w, kernel.name());
            ASSERT_EQ(fast.bad, std::nullopt) << label;
            EXPECT_EQ(ref.packed, fast.packed) << label;
            EXPECT_EQ(ref.scale, fast.scale) << label;
            EXPECT_EQ(ref.zero_point, fast.zero_point) << label;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, KernelSimdLevel, ::testing::ValuesIn(detail::simd_levels()),
                         [](const ::testing::TestParamInfo<detail::SimdLevel>& param) {
                           return std::string(param.param.name);
                         });
// An architecture without vector levels instantiates none.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KernelSimdLevel);

// The levels compiled for this architecture, best first, and the one the
// public kernel takes: the best level this CPU runs, which kernel_path_name()
// names.
TEST(KernelSimd, PublicKernelTakesTheBestLevelThisCpuRuns) {
  std::vector<std::string> names;
  for (const detail::SimdLevel& level : detail::simd_levels()) names.push_back(level.name);
#if defined(__x86_64__)
  EXPECT_EQ(names, (std::vector<std::string>{"avx512", "avx2"}));
#elif defined(__aarch64__) && !defined(__clang__)
  EXPECT_EQ(names, (std::vector<std::string>{"sve2_128", "sve_256", "sve2", "sve", "neon"}));
#endif
  const detail::SimdLevel* best = nullptr;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    if (level.supported && best == nullptr) best = &level;
  }
  if (best == nullptr) {
    EXPECT_STREQ(kernel_path_name(), "scalar");
    EXPECT_FALSE(detail::simd_available());
    return;
  }
  EXPECT_STREQ(kernel_path_name(), best->name);
  const Weights w = random_weights(DType::kBF16, 5, 1024, 7);
  const QuantScheme scheme = symmetric_scheme(4, 128);
  const Outputs at_best = run(Kernel{Kernel::Kind::kLevel, *best}, scheme, w);
  const Outputs public_kernel = run(Kernel{Kernel::Kind::kPublic, {}}, scheme, w);
  EXPECT_EQ(at_best.packed, public_kernel.packed);
  EXPECT_EQ(at_best.scale, public_kernel.scale);
  expect_same(scheme, w, "best level");
}

// Groups and rows shorter than a vector, or not a multiple of it: groups of
// 8, 24 and 40 end inside a vector of 16 floats (AVX-512, 512-bit SVE) and
// of 32 bytes of codes; the rest of a group is done eight floats (or fewer)
// at a time.
TEST(KernelSimd, MatchesReferenceOnShortGroupsAndRowTails) {
  SKIP_WITHOUT_SIMD();
  for (const DType dtype : kFloatTypes) {
    for (const int bits : kBitWidths) {
      for (const std::uint64_t cols : {8u, 16u, 24u, 40u, 48u, 120u, 200u, 240u, 720u}) {
        for (const std::uint64_t group : {8u, 16u, 24u, 40u, 48u, 0u}) {
          if (group != 0 && cols % group != 0) continue;
          const Weights w = random_weights(dtype, 5, cols, 11);
          expect_same(symmetric_scheme(bits, group), w, "short groups");
        }
      }
    }
  }
}

// Every representable weight between 2^-6 s and 8 s for a few scales s, with
// the group's maximum fixing s: this runs through every value whose quotient
// w / s rounds to a tie (k + 0.5) only after rounding to the dtype, and the
// exact ties w = (k + 0.5) s.
TEST(KernelSimd, MatchesReferenceOnEveryWeightOfAScaleRange) {
  SKIP_WITHOUT_SIMD();
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int bits : kBitWidths) {
      const QuantScheme scheme = symmetric_scheme(bits, 64);
      const float divisor = static_cast<float>(scheme.qmax() - scheme.qmin()) / 2.0f;
      for (const float target_scale : {0.0234375f, 0.01f, 0.3f, 1.7f}) {
        const float amax = round_to_dtype(dtype, target_scale * divisor);
        const float lowest = round_to_dtype(dtype, amax / divisor / 64.0f);
        // All bit patterns from lowest to amax, 63 per group after the maximum.
        const std::uint16_t first =
            dtype == DType::kBF16 ? float_to_bf16(lowest) : float_to_f16(lowest);
        const std::uint16_t last = dtype == DType::kBF16 ? float_to_bf16(amax) : float_to_f16(amax);
        const std::uint64_t count = last - first + 1u;
        const std::uint64_t rows = (count + 62) / 63 * 2;  // positive and negative copies
        Weights w(dtype, rows, 64);
        std::uint16_t bitsval = first;
        for (std::uint64_t r = 0; r < rows; r += 2) {
          for (std::uint64_t c = 0; c < 64; ++c) {
            const std::uint16_t b = c == 0 ? last : bitsval;
            if (c != 0 && bitsval < last) ++bitsval;
            w.set_bits(r * 64 + c, b);
            w.set_bits((r + 1) * 64 + c, b | 0x8000u);
          }
        }
        expect_same(scheme, w, fmt::format("scale range {}", target_scale));
      }
    }
  }
  // F32: exact ties (k + 0.5) s and their neighbours one ulp away.
  for (const int bits : kBitWidths) {
    const QuantScheme scheme = symmetric_scheme(bits, 32);
    Weights w(DType::kF32, 3, 32);
    const float s = 0.013671875f;  // 7 * 2^-9, exact
    const float amax = s * static_cast<float>(scheme.qmax() - scheme.qmin()) / 2.0f;
    for (std::uint64_t r = 0; r < 3; ++r) {
      w.set(r * 32, amax);
      for (std::uint64_t c = 1; c < 32; ++c) {
        const float tie = (static_cast<float>(c % 15) - 7.0f + 0.5f) * s;
        const float v = r == 0 ? tie : std::nextafter(tie, r == 1 ? 1e9f : -1e9f);
        w.set(r * 32 + c, v);
      }
    }
    expect_same(scheme, w, "f32 ties");
  }
}

// The raw bits of a 16-bit float dtype value, and back.
std::uint16_t to_bits16(DType dtype, float value) {
  return dtype == DType::kBF16 ? float_to_bf16(value) : float_to_f16(value);
}
float from_bits16(DType dtype, std::uint16_t bits) {
  return dtype == DType::kBF16 ? bf16_to_float(bits) : f16_to_float(bits);
}

// Weights w whose float quotient w / s is not a half-integer but becomes one,
// k + 0.5, once rounded to the dtype (the case that rounding to T before
// rounding to an integer exists for), and exact ties w = (k + 0.5) s. They are
// searched among all weights below the group maximum for every scale s in
// [2^-6, 2^-5); each group is led by a weight that gives it scale s.
TEST(KernelSimd, MatchesReferenceOnHalfIntegersAfterRoundingToTheDtype) {
  SKIP_WITHOUT_SIMD();
  const auto is_half_integer = [](float x) { return std::fabs(std::fmod(x, 1.0f)) == 0.5f; };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int bits : kBitWidths) {
      const QuantScheme scheme = symmetric_scheme(bits, 32);
      const float divisor = static_cast<float>(scheme.qmax() - scheme.qmin()) / 2.0f;
      std::vector<std::vector<std::uint16_t>> groups;  // [leader, weights...]
      std::size_t n_rounded = 0;
      std::size_t n_exact = 0;
      const std::uint16_t s_first = to_bits16(dtype, 0x1p-6f);
      const std::uint16_t s_last = to_bits16(dtype, 0x1p-5f);
      // Every BF16 scale of the binade; every 13th F16 one (1024 in all).
      const std::uint16_t s_step = dtype == DType::kBF16 ? 1 : 13;
      for (std::uint16_t s_bits = s_first; s_bits < s_last; s_bits += s_step) {
        const float s = from_bits16(dtype, s_bits);
        // A leader a (the group's absolute maximum) with round_T(a / divisor) == s.
        std::optional<std::uint16_t> leader;
        const std::uint16_t a0 = to_bits16(dtype, s * divisor);
        for (std::uint16_t a_bits = a0 - 4; a_bits <= a0 + 4; ++a_bits) {
          if (round_to_dtype(dtype, from_bits16(dtype, a_bits) / divisor) == s) leader = a_bits;
        }
        if (!leader) continue;
        std::vector<std::uint16_t> group{*leader};
        for (std::uint16_t w_bits = to_bits16(dtype, s / 2); w_bits < *leader; ++w_bits) {
          const float q = from_bits16(dtype, w_bits) / s;
          if (!is_half_integer(round_to_dtype(dtype, q))) continue;
          (is_half_integer(q) ? n_exact : n_rounded) += 1;
          group.push_back(w_bits);
          group.push_back(static_cast<std::uint16_t>(w_bits | 0x8000u));
        }
        if (group.size() > 1) groups.push_back(group);
      }
      // The search must find both kinds, or this test would test nothing.
      ASSERT_GE(n_rounded, 20u) << dtype_tag(dtype) << " " << bits << " bits";
      ASSERT_GE(n_exact, 5u) << dtype_tag(dtype) << " " << bits << " bits";
      // One row per group of 32: the leader, then the weights, cycled to fill it.
      Weights w(dtype, groups.size(), 32);
      for (std::size_t r = 0; r < groups.size(); ++r) {
        for (std::size_t c = 0; c < 32; ++c) {
          const std::size_t k = c == 0 ? 0 : 1 + (c - 1) % (groups[r].size() - 1);
          w.set_bits(r * 32 + c, groups[r][k]);
        }
      }
      expect_same(scheme, w,
                  fmt::format("{} rounded and {} exact half-integers", n_rounded, n_exact));
    }
  }
}

TEST(KernelSimd, MatchesReferenceOnZeroGroups) {
  SKIP_WITHOUT_SIMD();
  for (const DType dtype : kFloatTypes) {
    for (const int bits : kBitWidths) {
      Weights w = random_weights(dtype, 4, 256, 5);
      const std::uint32_t negative_zero = dtype == DType::kF32 ? 0x80000000u : 0x8000u;
      for (std::uint64_t c = 0; c < 128; ++c) {
        w.set_bits(c, 0);                                     // row 0, group 0: +0
        w.set_bits(256 + 128 + c, negative_zero);             // row 1, group 1: -0
        w.set_bits(512 + c, c % 2 == 0 ? 0 : negative_zero);  // row 2, group 0: mixed
      }
      for (std::uint64_t c = 0; c < 256; ++c) w.set_bits(768 + c, 0);  // row 3: all zero
      expect_same(symmetric_scheme(bits, 128), w, "zero groups");
      expect_same(symmetric_scheme(bits, 0), w, "zero rows, channel-wise");
    }
  }
}

// Groups made only of subnormal weights (scale subnormal or zero, then eps)
// and normal groups whose scale is subnormal.
TEST(KernelSimd, MatchesReferenceOnSubnormals) {
  SKIP_WITHOUT_SIMD();
  for (const DType dtype : kFloatTypes) {
    for (const int bits : kBitWidths) {
      const std::uint32_t max_subnormal = dtype == DType::kF32    ? 0x007FFFFFu
                                          : dtype == DType::kBF16 ? 0x007Fu
                                                                  : 0x03FFu;
      std::mt19937 rng(21);
      Weights w(dtype, 16, 64);
      for (std::uint64_t r = 0; r < w.n_rows; ++r) {
        // Row r draws its magnitudes from [0, limit]: small limits give
        // scales that round to zero (eps) or to few-bit subnormals.
        const std::uint32_t limit =
            r < 8 ? (1u << r) : (r < 15 ? max_subnormal >> (r - 8) : max_subnormal + 40u);
        std::uniform_int_distribution<std::uint32_t> magnitude(0, limit);
        for (std::uint64_t c = 0; c < w.n_cols; ++c) {
          const std::uint32_t sign =
              (rng() % 2 == 0) ? 0u : (dtype == DType::kF32 ? 0x80000000u : 0x8000u);
          w.set_bits(r * w.n_cols + c, magnitude(rng) | sign);
        }
      }
      for (const std::uint64_t group : {8u, 32u, 64u}) {
        expect_same(symmetric_scheme(bits, group), w, "subnormals");
      }
    }
  }
}

TEST(KernelSimd, MatchesReferenceNearTheDtypeMaximum) {
  SKIP_WITHOUT_SIMD();
  for (const DType dtype : kFloatTypes) {
    for (const int bits : kBitWidths) {
      const std::uint32_t max_bits = dtype == DType::kF32    ? 0x7F7FFFFFu
                                     : dtype == DType::kBF16 ? 0x7F7Fu
                                                             : 0x7BFFu;
      const std::uint32_t sign = dtype == DType::kF32 ? 0x80000000u : 0x8000u;
      Weights w = random_weights(dtype, 4, 128, 8);
      for (std::uint64_t c = 0; c < 128; ++c) {
        w.set_bits(c, max_bits - static_cast<std::uint32_t>(c % 16));            // near +max
        w.set_bits(128 + c, (max_bits - static_cast<std::uint32_t>(c)) | sign);  // near -max
      }
      w.set_bits(256 + 5, max_bits);  // one huge value in a small group
      w.set_bits(384 + 100, max_bits | sign);
      expect_same(symmetric_scheme(bits, 32), w, "near max");
      expect_same(symmetric_scheme(bits, 0), w, "near max, channel-wise");
    }
  }
}

TEST(KernelSimd, MatchesReferenceOnNegativeOnlyGroups) {
  SKIP_WITHOUT_SIMD();
  for (const DType dtype : kFloatTypes) {
    for (const int bits : kBitWidths) {
      Weights w = random_weights(dtype, 6, 128, 13);
      for (std::uint64_t i = 0; i < w.size(); ++i) {
        const float v = load_as_float(dtype, w.bytes.data() + i * element_bytes(dtype));
        w.set(i, -std::fabs(v) - (i % 3 == 0 ? 0.0f : 1e-3f));
      }
      expect_same(symmetric_scheme(bits, 32), w, "negative only");
      expect_same(symmetric_scheme(bits, 128), w, "negative only");
    }
  }
}

// A single NaN or infinity anywhere: both kernels name the same element,
// and with two bad values the first one.
TEST(KernelSimd, ReportsTheSameFirstNonFiniteIndex) {
  SKIP_WITHOUT_SIMD();
  for (const DType dtype : kFloatTypes) {
    const std::vector<std::uint32_t> bad_values =
        dtype == DType::kF32 ? std::vector<std::uint32_t>{0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                                          0xFFC00001u, 0x7F800001u}
        : dtype == DType::kBF16
            ? std::vector<std::uint32_t>{0x7F80u, 0xFF80u, 0x7FC0u, 0xFFC1u, 0x7F81u}
            : std::vector<std::uint32_t>{0x7C00u, 0xFC00u, 0x7E00u, 0xFE01u, 0x7C01u};
    for (const int bits : kBitWidths) {
      for (const std::uint64_t group : {8u, 32u, 128u, 0u}) {
        const QuantScheme scheme = symmetric_scheme(bits, group);
        for (const std::uint64_t pos :
             {0u, 1u, 7u, 8u, 31u, 32u, 127u, 128u, 255u, 256u, 600u, 1023u}) {
          for (const std::uint32_t bad : bad_values) {
            Weights w = random_weights(dtype, 4, 256, 17);
            w.set_bits(pos, bad);
            expect_same(scheme, w, fmt::format("bad value {:#x} at {}", bad, pos));
            // A second bad value later in the same group and in a later row.
            w.set_bits(std::min<std::uint64_t>(pos + 3, w.size() - 1), bad_values[0]);
            w.set_bits(w.size() - 1, bad_values[2]);
            expect_same(scheme, w, fmt::format("two bad values, first at {}", pos));
          }
        }
      }
    }
  }
}

// max_abs (the amax pre-pass of tensor-scale families) against its scalar
// loop: random weights of every dtype and length (vector body and tail), an
// all -0 span, subnormals, and the index of the first NaN or infinity.
TEST(KernelSimd, MaxAbsMatchesReference) {
  for (const DType dtype : kFloatTypes) {
    for (const std::uint64_t cols : {1u, 7u, 8u, 33u, 128u, 1000u}) {
      Weights w = random_weights(dtype, 3, cols, 11);
      float fast = -1.0f;
      float ref = -2.0f;
      ASSERT_EQ(max_abs(dtype, w.bytes.data(), w.size(), fast), std::nullopt);
      ASSERT_EQ(max_abs_ref(dtype, w.bytes.data(), w.size(), ref), std::nullopt);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(fast), std::bit_cast<std::uint32_t>(ref))
          << dtype_tag(dtype) << " [" << cols << "]";
      // -0 everywhere: +0, as the reference's fabs gives.
      for (std::uint64_t i = 0; i < w.size(); ++i) w.set(i, -0.0f);
      ASSERT_EQ(max_abs(dtype, w.bytes.data(), w.size(), fast), std::nullopt);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(fast), 0u);
      // The smallest subnormal of the dtype, negative.
      w.set_bits(w.size() / 2, dtype == DType::kF32 ? 0x80000001u : 0x8001u);
      ASSERT_EQ(max_abs(dtype, w.bytes.data(), w.size(), fast), std::nullopt);
      ASSERT_EQ(max_abs_ref(dtype, w.bytes.data(), w.size(), ref), std::nullopt);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(fast), std::bit_cast<std::uint32_t>(ref));
      EXPECT_GT(fast, 0.0f);
      // NaN then infinity: the first one's index.
      const std::uint32_t inf = dtype == DType::kF32    ? 0xFF800000u
                                : dtype == DType::kBF16 ? 0xFF80u
                                                        : 0xFC00u;
      const std::uint64_t at = w.size() - 1 - w.size() / 3;
      w.set_bits(at, inf | 1u);  // a NaN
      w.set_bits(w.size() - 1, inf);
      EXPECT_EQ(max_abs(dtype, w.bytes.data(), w.size(), fast), at);
      EXPECT_EQ(max_abs_ref(dtype, w.bytes.data(), w.size(), ref), at);
    }
  }
}

// The same comparison at every level this CPU runs (max_abs() takes only
// the best one): the largest magnitude bits of each level equal those of the
// reference's amax, on random weights, -0 spans, subnormals and values at
// the dtype's largest finite magnitude; a NaN or infinity gives bits at or
// above the dtype's exponent mask.
TEST(KernelSimd, MaxMagnitudeBitsAtEveryLevelMatchReference) {
  std::size_t levels_run = 0;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    if (!level.supported) continue;
    ++levels_run;
    for (const DType dtype : kFloatTypes) {
      const std::uint32_t inf = dtype == DType::kF32    ? 0x7F800000u
                                : dtype == DType::kBF16 ? 0x7F80u
                                                        : 0x7C00u;
      const std::uint32_t sign = dtype == DType::kF32 ? 0x80000000u : 0x8000u;
      for (const std::uint64_t cols : {1u, 5u, 16u, 31u, 64u, 257u, 1000u}) {
        Weights w = random_weights(dtype, 3, cols, 23);
        const auto expect_ref = [&](const std::string& what) {
          float ref = -1.0f;
          ASSERT_EQ(max_abs_ref(dtype, w.bytes.data(), w.size(), ref), std::nullopt) << what;
          const auto bits =
              detail::max_magnitude_bits_simd_at(level, dtype, w.bytes.data(), w.size());
          ASSERT_TRUE(bits.has_value()) << level.name;
          float got = 0.0f;
          if (dtype == DType::kF32) {
            got = std::bit_cast<float>(*bits);
          } else if (dtype == DType::kBF16) {
            got = bf16_to_float(static_cast<std::uint16_t>(*bits));
          } else {
            got = f16_to_float(static_cast<std::uint16_t>(*bits));
          }
          EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(ref))
              << level.name << " " << dtype_tag(dtype) << " [" << cols << "] " << what;
        };
        expect_ref("random");
        // The largest finite magnitude, negative, at the last element (the
        // vector tail) and then at the first.
        w.set_bits(w.size() - 1, sign | (inf - 1u));
        expect_ref("-max at the end");
        w.set_bits(0, inf - 1u);
        expect_ref("max at the start");
        // -0 everywhere, then one negative subnormal.
        for (std::uint64_t i = 0; i < w.size(); ++i) w.set(i, -0.0f);
        expect_ref("all -0");
        w.set_bits(w.size() / 2, sign | 1u);
        expect_ref("one subnormal");
        // Infinity: bits at the exponent mask; a NaN: above it.
        w.set_bits(w.size() - 1, sign | inf);
        const auto with_inf =
            detail::max_magnitude_bits_simd_at(level, dtype, w.bytes.data(), w.size());
        ASSERT_TRUE(with_inf.has_value());
        EXPECT_EQ(*with_inf, inf) << level.name << " " << dtype_tag(dtype);
        w.set_bits(0, inf | 1u);
        const auto with_nan =
            detail::max_magnitude_bits_simd_at(level, dtype, w.bytes.data(), w.size());
        ASSERT_TRUE(with_nan.has_value());
        EXPECT_GT(*with_nan, inf) << level.name << " " << dtype_tag(dtype);
      }
    }
  }
  EXPECT_GT(levels_run, 0u);
}

// Cases the vector kernel does not take go to the reference unchanged.
TEST(KernelSimd, LeavesOtherSchemesToTheReference) {
  KernelBlock block;
  block.dtype = DType::kBF16;
  block.n_rows = 2;
  block.n_cols = 128;
  EXPECT_FALSE(detail::simd_supports(QuantScheme{"w3", 3, true, 128}, block));
  EXPECT_FALSE(detail::simd_supports(QuantScheme{"g4", 4, true, 4}, block));
  EXPECT_FALSE(detail::simd_supports(QuantScheme{"g12", 4, true, 12}, block));
  block.dtype = DType::kF8_E4M3;
  EXPECT_FALSE(detail::simd_supports(QuantScheme{"fp8", 4, true, 128}, block));
  block.dtype = DType::kBF16;
  block.n_cols = 12;
  EXPECT_FALSE(detail::simd_supports(QuantScheme{"channel", 4, true, 0}, block));
  block.n_cols = 128;
  EXPECT_EQ(detail::simd_supports(QuantScheme{"W4A16", 4, true, 128}, block),
            detail::simd_available());
  EXPECT_EQ(detail::simd_supports(QuantScheme{"W4A16_ASYM", 4, false, 128}, block),
            detail::simd_available());

  // An asymmetric scheme through the public quantize_block equals the reference.
  const Weights w = random_weights(DType::kBF16, 3, 256, 4);
  const QuantScheme asym{"W4A16_ASYM", 4, false, 128};
  std::vector<std::uint32_t> packed_ref(3 * 32), packed_fast(3 * 32, 1u);
  std::vector<std::byte> scale_ref(3 * 2 * 2), scale_fast(3 * 2 * 2, std::byte{1});
  std::vector<std::int8_t> zp_ref(6), zp_fast(6, 1);
  KernelBlock b{DType::kBF16, 3, 256, w.bytes.data(), packed_ref.data(), scale_ref.data(),
                zp_ref.data()};
  ASSERT_EQ(quantize_block_ref(asym, b), std::nullopt);
  b.packed = packed_fast.data();
  b.scale = scale_fast.data();
  b.zero_point = zp_fast.data();
  ASSERT_EQ(quantize_block(asym, b), std::nullopt);
  EXPECT_EQ(packed_ref, packed_fast);
  EXPECT_EQ(scale_ref, scale_fast);
  EXPECT_EQ(zp_ref, zp_fast);
}

}  // namespace
}  // namespace ctquant
