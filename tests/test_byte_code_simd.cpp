// The vector kernel of the FP8 and int8 rows against their scalar
// references, bit for bit, at every SIMD level this CPU runs: codes, scales
// and the index of the first non-finite weight, on random weights and on
// inputs chosen to break a careless implementation (ties at the E4M3 and
// integer rounding steps, zero rows and blocks, W subnormals, quotients at
// +-448 and +-127.5, negative-only rows, -0.0, NaN and infinities at many
// positions, widths that leave vector tails).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/fp8.hpp"
#include "ctquant/scheme/int8.hpp"
#include "scheme/byte_code_simd.hpp"
#include "simd/simd.hpp"
#include "scheme_test_support.hpp"

namespace ctquant::test {
namespace {

using detail::ByteCode;
using S = QuantArgs::Strategy;

constexpr DType kFloatTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

struct Code {
  ByteCode code;
  const SchemeFamily* family;
  const char* name;
};
const Code kCodes[] = {{ByteCode::kE4M3, &kFloatQuantizedFamily, "e4m3"},
                       {ByteCode::kInt8, &kIntQuantizedFamily, "int8"}};

QuantArgs args_for(ByteCode code, S strategy) {
  QuantArgs a;
  a.type = code == ByteCode::kE4M3 ? QuantArgs::Type::kFloat : QuantArgs::Type::kInt;
  a.num_bits = 8;
  a.symmetric = true;
  a.strategy = strategy;
  a.group_size = 0;
  if (strategy == S::kBlock) a.block = {128, 128};
  return a;
}

// The strategies each code's row takes (int8 has no blocks).
std::vector<S> strategies(ByteCode code) {
  if (code == ByteCode::kE4M3) return {S::kChannel, S::kBlock, S::kTensor};
  return {S::kChannel, S::kTensor};
}

// Raw weights of one dtype, set by value (rounded to the dtype) or by bits.
struct Weights {
  DType dtype{};
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::vector<std::byte> bytes;

  Weights(DType t, std::uint64_t r, std::uint64_t c)
      : dtype(t), rows(r), cols(c), bytes(r * c * element_size(t)) {}
  void set_bits(std::uint64_t i, std::uint32_t bits) {
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &bits, 4);
    } else {
      const auto b = static_cast<std::uint16_t>(bits);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  void set(std::uint64_t i, float v) {
    switch (dtype) {
      case DType::kBF16:
        set_bits(i, float_to_bf16(v));
        break;
      case DType::kF16:
        set_bits(i, float_to_f16(v));
        break;
      default:
        set_bits(i, std::bit_cast<std::uint32_t>(v));
    }
  }
  void set(std::uint64_t r, std::uint64_t c, float v) { set(r * cols + c, v); }
};

// The levels this build has kernels for and this CPU runs.
std::vector<detail::SimdLevel> runnable_levels() {
  std::vector<detail::SimdLevel> out;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    if (level.supported) out.push_back(level);
  }
  return out;
}

// Runs the reference and the vector kernel at every runnable level over w
// (one chunk, and chunks of one block row for blocks) and expects the same
// bytes and the same first bad index.
void expect_levels_match(const Code& code, S strategy, const Weights& w, const std::string& what) {
  const QuantArgs args = args_for(code.code, strategy);
  const SchemeFamily& family = *code.family;
  const FamilyOutput ref = run_family(family, family.quantize_ref, args, w.dtype, w.rows, w.cols,
                                      w.bytes, 0, std::byte{0xCD});
  for (const detail::SimdLevel& level : runnable_levels()) {
    detail::ByteCodeKernel* kernel = detail::byte_code_kernel(level);
    ASSERT_NE(kernel, nullptr) << level.name;
    const AnyKernel at_level = [&](const QuantArgs& a, const KernelIo& io) {
      return kernel(code.code, a, io);
    };
    for (const std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{1}}) {
      const FamilyOutput out = run_family(family, at_level, args, w.dtype, w.rows, w.cols, w.bytes,
                                          chunk, std::byte{0xAB});
      const std::string label = fmt::format("{} {} {} strategy {} {}x{} {} chunk {}", level.name,
                                            code.name, dtype_tag(w.dtype), strategy_name(strategy),
                                            w.rows, w.cols, what, chunk);
      ASSERT_EQ(out.bad, ref.bad) << label;
      if (ref.bad) continue;  // outputs unspecified
      for (std::size_t i = 0; i < ref.tensors.size(); ++i) {
        ASSERT_EQ(first_difference(out.tensors[i], ref.tensors[i]), "")
            << label << " tensor " << ref.specs[i].suffix;
      }
    }
  }
}

TEST(ByteCodeSimd, LevelsAreReported) {
  // Not a comparison: says which levels the other tests ran at.
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    std::printf("level %s: %s\n", level.name, level.supported ? "runs here" : "not on this CPU");
    EXPECT_EQ(detail::byte_code_kernel(level) != nullptr, level.supported) << level.name;
  }
}

// Random rows of many widths (vector tails of every length), with a zero
// row, a negative-only row and an outlier row.
TEST(ByteCodeSimd, RandomWeightsEveryWidth) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const Code& code : kCodes) {
    for (const DType t : kFloatTypes) {
      for (const std::uint64_t cols :
           {1u, 3u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 33u, 100u, 128u, 129u, 256u, 300u, 384u}) {
        Weights w(t, 6, cols);
        for (std::uint64_t r = 0; r < w.rows; ++r) {
          for (std::uint64_t c = 0; c < cols; ++c) {
            const float v = normal(rng);
            w.set(r, c, r == 1 ? 0.0f : r == 2 ? -std::fabs(v) : r == 3 && c == cols / 2 ? 3.0f : v);
          }
        }
        for (const S strategy : strategies(code.code)) {
          expect_levels_match(code, strategy, w, "random");
        }
      }
    }
  }
}

// 128x128 blocks with ragged edges: 300 rows (a partial bottom block row),
// widths that are and are not multiples of 128, an all-zero block.
TEST(ByteCodeSimd, BlocksWithRaggedEdges) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const DType t : kFloatTypes) {
    for (const std::uint64_t cols : {128u, 256u, 200u, 72u}) {
      Weights w(t, 300, cols);
      for (std::uint64_t r = 0; r < w.rows; ++r) {
        for (std::uint64_t c = 0; c < cols; ++c) {
          w.set(r, c, (r >= 128 && r < 256 && c < 128) ? 0.0f : normal(rng));
        }
      }
      expect_levels_match(kCodes[0], S::kBlock, w, "ragged blocks");
    }
  }
}

// Rows whose amax makes the scale exactly 1 (E4M3: amax 448; int8: amax
// 127.5), so each quotient is the weight: the ties of schemes.md 2.1 and
// the half-integers of round half to even, at every lane position.
TEST(ByteCodeSimd, TiesAtEveryRoundingStep) {
  const std::vector<float> e4m3_ties = {1.0625f, 1.1875f, 232.0f,  0x1p-10f, -0x1p-10f,
                                        0.9375f * 0x1p-6f, 3.0f * 0x1p-10f, 464.0f * 0.5f,
                                        -1.0625f, -232.0f, 0.0f, -0.0f, 448.0f, -448.0f,
                                        7.5f * 0x1p-9f, 17.0f};
  const std::vector<float> int_ties = {0.5f,   1.5f,    2.5f,  -0.5f, -1.5f,  126.5f, -126.5f,
                                       127.5f, -127.5f, 64.5f, -0.0f, 0.0f,   3.5f,   -2.5f,
                                       100.5f, 0.25f};
  for (const Code& code : kCodes) {
    const std::vector<float>& ties = code.code == ByteCode::kE4M3 ? e4m3_ties : int_ties;
    const float amax = code.code == ByteCode::kE4M3 ? 448.0f : 127.5f;
    for (const DType t : kFloatTypes) {
      for (const std::uint64_t cols : {17u, 64u, 128u}) {
        Weights w(t, 4, cols);
        for (std::uint64_t r = 0; r < w.rows; ++r) {
          for (std::uint64_t c = 0; c < cols; ++c) w.set(r, c, ties[(c + r * 5) % ties.size()]);
          w.set(r, r, r % 2 == 0 ? amax : -amax);  // the row's amax, so s = 1
        }
        for (const S strategy : strategies(code.code)) {
          expect_levels_match(code, strategy, w, "ties");
        }
        // The reference itself gives the spec's answers (scale 1).
        const FamilyOutput ref = run_family(*code.family, code.family->quantize_ref,
                                            args_for(code.code, S::kChannel), t, w.rows, cols,
                                            w.bytes);
        EXPECT_EQ(load_as_float(t, ref.tensors[1].data()), 1.0f);
      }
    }
  }
}

// Subnormal weights of each dtype (tiny rows: subnormal scales too, or the
// eps scale), quotients at the clamp, -0.0 everywhere.
TEST(ByteCodeSimd, SubnormalsClampAndNegativeZero) {
  for (const Code& code : kCodes) {
    for (const DType t : kFloatTypes) {
      const std::uint32_t sub_max = t == DType::kF32 ? 0x007FFFFFu : t == DType::kBF16 ? 0x7Fu : 0x3FFu;
      const std::uint32_t sign = t == DType::kF32 ? 0x80000000u : 0x8000u;
      Weights w(t, 5, 40);
      for (std::uint64_t c = 0; c < 40; ++c) {
        const std::uint32_t m = 1 + static_cast<std::uint32_t>(c * 2654435761u % sub_max);
        w.set_bits(0 * 40 + c, c % 3 == 0 ? m | sign : m);             // subnormals only
        w.set_bits(1 * 40 + c, sign);                                  // -0.0 row
        w.set(2, c, c % 2 == 0 ? 448.0f : std::nextafter(448.0f, 0.0f));  // near the clamp
        w.set(3, c, -1.0f - static_cast<float>(c) / 64);                // negative only
        w.set_bits(4 * 40 + c, c == 39 ? 1u : 0u);                      // one subnormal
      }
      for (const S strategy : strategies(code.code)) {
        expect_levels_match(code, strategy, w, "subnormals");
      }
    }
  }
}

// A NaN or an infinity at many positions (and two of them): the first one
// in row-major order is reported by every kernel.
TEST(ByteCodeSimd, NonFiniteAtEveryPosition) {
  for (const Code& code : kCodes) {
    for (const DType t : kFloatTypes) {
      const std::uint64_t rows = 3;
      const std::uint64_t cols = 37;
      for (std::uint64_t pos = 0; pos < rows * cols; pos += 5) {
        for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::infinity()}) {
          Weights w(t, rows, cols);
          for (std::uint64_t i = 0; i < rows * cols; ++i) w.set(i, 0.01f * static_cast<float>(i % 7));
          w.set(pos, bad);
          if (pos + 40 < rows * cols) w.set(pos + 40, std::numeric_limits<float>::infinity());
          for (const S strategy : strategies(code.code)) {
            expect_levels_match(code, strategy, w, fmt::format("non-finite at {}", pos));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ctquant::test
