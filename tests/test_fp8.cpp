// FP8 inputs (section 6 of the format spec): the code decoders against
// independent tables, the row dequantizer, the classification of input
// configs and the scale layouts.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/source/fp8.hpp"
#include "simd/simd.hpp"
#include "source/fp8_simd.hpp"
#include "fp8_tables.hpp"
#include "fp8_test_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using nlohmann::json;
using namespace ctquant::test;

// ================= decoders =================

// got must be NaN where the table says kNaNBits, else the table's bits.
void expect_table_value(float got, std::uint32_t table_bits, unsigned code) {
  if (table_bits == kNaNBits) {
    EXPECT_TRUE(std::isnan(got)) << "code " << code;
  } else {
    EXPECT_EQ(float_bits(got), table_bits) << "code " << code;
  }
}

TEST(Fp8Decode, E4M3EveryCodeMatchesTable) {
  for (unsigned c = 0; c < 256; ++c) {
    const float got = f8_e4m3_to_float(static_cast<std::uint8_t>(c));
    expect_table_value(got, kE4M3FnBits[c], c);
    // The field formula the scalar test helpers use agrees with the table.
    expect_table_value(e4m3_reference(c), kE4M3FnBits[c], c);
  }
  // Anchors of the "fn" variant.
  EXPECT_EQ(f8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(f8_e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(f8_e4m3_to_float(0x01), 0x1p-9f);  // smallest subnormal, not flushed
  EXPECT_EQ(f8_e4m3_to_float(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(f8_e4m3_to_float(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(f8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(float_bits(f8_e4m3_to_float(0x80)), 0x80000000u);  // -0
  EXPECT_TRUE(std::isnan(f8_e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(f8_e4m3_to_float(0xFF)));
  EXPECT_EQ(f8_e4m3_to_float(0x78), 256.0f);  // exponent 15 is a normal exponent here
  int nan_codes = 0;
  for (unsigned c = 0; c < 256; ++c)
    nan_codes += std::isnan(f8_e4m3_to_float(static_cast<std::uint8_t>(c)));
  EXPECT_EQ(nan_codes, 2);
}

TEST(Fp8Decode, E5M2EveryCodeMatchesTable) {
  for (unsigned c = 0; c < 256; ++c) {
    const float got = f8_e5m2_to_float(static_cast<std::uint8_t>(c));
    expect_table_value(got, kE5M2Bits[c], c);
    expect_table_value(e5m2_reference(c), kE5M2Bits[c], c);
    // E5M2 is the upper byte of an IEEE binary16.
    const float half = f16_to_float(static_cast<std::uint16_t>(c << 8));
    if (!std::isnan(half)) {
      EXPECT_EQ(float_bits(got), float_bits(half)) << "code " << c;
    }
  }
  EXPECT_EQ(f8_e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(f8_e5m2_to_float(0x01), 0x1p-16f);
  EXPECT_EQ(f8_e5m2_to_float(0x04), 0x1p-14f);
  EXPECT_EQ(f8_e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(f8_e5m2_to_float(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f8_e5m2_to_float(0xFC), -std::numeric_limits<float>::infinity());
  for (unsigned c : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu, 0xFEu, 0xFFu}) {
    EXPECT_TRUE(std::isnan(f8_e5m2_to_float(static_cast<std::uint8_t>(c)))) << c;
  }
}

TEST(Fp8Decode, LoadAsFloatReadsFp8Elements) {
  const std::byte e4m3{0x7E};
  const std::byte e5m2{0xC0};  // -2
  EXPECT_EQ(load_as_float(DType::kF8_E4M3, &e4m3), 448.0f);
  EXPECT_EQ(load_as_float(DType::kF8_E5M2, &e5m2), -2.0f);
}

// ================= dequantizer =================

// A BF16 scale: code * scale is exact in float32 and rounded once to BF16.
// 1.875 (0x3F) * 1.0078125 = 1.8896484375 = 241.875 BF16 steps of 2^-7: 242.
TEST(Fp8Dequantize, BF16ScaleRoundsExactProductOnce) {
  EXPECT_EQ(dequantize_fp8_value(DType::kF8_E4M3, 0x3F, 1.0078125f), float_to_bf16(1.890625f));
}

// An F32 scale: the float32 product is rounded to float32 first, then to
// BF16 (section 6: round_bf16(float32(fp8) * float32(scale))). For code 0x39
// (1.125) and scale 0x3F6238E4 the exact product 0.99414065480... rounds to
// float32 0.994140625, a BF16 tie that goes to the even 0.9921875 (0x3F7E);
// rounding the exact product straight to BF16 would give 0.99609375 (0x3F7F).
TEST(Fp8Dequantize, F32ScaleRoundsFloat32ProductThenBF16) {
  const float scale = std::bit_cast<float>(0x3F6238E4u);
  EXPECT_EQ(dequantize_fp8_value(DType::kF8_E4M3, 0x39, scale), 0x3F7Eu);
}

// Square weight, asymmetric scales: element [i, j] must take scale
// [i / bh, j / bw], not [j / bw, i / bh].
TEST(Fp8Dequantize, BlockOrientationOnSquareWeight) {
  const std::vector<std::uint8_t> codes(16, 0x38);  // 1.0
  const std::vector<float> grid{1.0f, 2.0f, 4.0f, 8.0f};
  const auto scales = test::float_bytes(DType::kF32, grid);
  const auto in = code_bytes(codes);
  std::vector<std::byte> out(32);
  const Fp8ScaleLayout layout{DType::kF32, 2, 2, 2, 2};
  const Fp8Rows rows{DType::kF8_E4M3, 0, 4, 4, in.data(), scales.data(), out.data()};
  ASSERT_FALSE(dequantize_fp8_rows(layout, rows));
  EXPECT_EQ(bf16_to_float(bf16_at(out, 0 * 4 + 3)), 2.0f);  // row block 0, column block 1
  EXPECT_EQ(bf16_to_float(bf16_at(out, 3 * 4 + 0)), 4.0f);  // row block 1, column block 0
  EXPECT_EQ(bf16_to_float(bf16_at(out, 3 * 4 + 3)), 8.0f);
  EXPECT_EQ(bf16_to_float(bf16_at(out, 1 * 4 + 1)), 1.0f);
}

// A weight of codes [rows, cols] with an F32 scale grid of [bh, bw] blocks
// (partial edge blocks allowed), dequantized in chunks of `chunk` rows in
// the in-place buffer layout the executor uses (codes in the second half),
// must give the reference value of every element.
struct BlockCase {
  std::uint64_t rows, cols, bh, bw;
  std::uint32_t seed;
  float scale_base;
};

void expect_chunked_matches_reference(const BlockCase& b, DType dtype, std::uint64_t chunk) {
  const std::uint64_t grid_rows = (b.rows + b.bh - 1) / b.bh;
  const std::uint64_t grid_cols = (b.cols + b.bw - 1) / b.bw;
  const auto codes = random_codes(dtype, b.rows * b.cols, b.seed);
  const auto grid = distinct_scales(grid_rows * grid_cols, b.scale_base);
  const auto want = reference_dequantize(dtype, codes, b.rows, b.cols, grid, grid_cols, b.bh, b.bw);
  const auto scale_bytes = test::float_bytes(DType::kF32, grid);
  const Fp8ScaleLayout layout{DType::kF32, b.bh, b.bw, grid_rows, grid_cols};
  for (std::uint64_t row_begin = 0; row_begin < b.rows; row_begin += chunk) {
    const std::uint64_t n_rows = std::min(chunk, b.rows - row_begin);
    const std::uint64_t n = n_rows * b.cols;
    std::vector<std::byte> buffer(2 * n);
    for (std::uint64_t i = 0; i < n; ++i) buffer[n + i] = std::byte{codes[row_begin * b.cols + i]};
    const std::uint64_t g0 = layout.grid_row_begin(row_begin);
    const Fp8Rows rows{dtype,        row_begin,         n_rows,
                       b.cols,       buffer.data() + n, scale_bytes.data() + g0 * grid_cols * 4,
                       buffer.data()};
    ASSERT_FALSE(dequantize_fp8_rows(layout, rows));
    for (std::uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bf16_at(buffer, i), want[row_begin * b.cols + i])
          << dtype_tag(dtype) << " chunk " << chunk << " element " << row_begin * b.cols + i;
    }
  }
}

// Partial edge blocks on both axes, chunks that start inside a row block.
TEST(Fp8Dequantize, PartialBlocksChunkedAndInPlace) {
  for (DType dtype : {DType::kF8_E4M3, DType::kF8_E5M2}) {
    expect_chunked_matches_reference({7, 11, 3, 4, 7, 0.01f}, dtype, 2);
  }
}

// Large blocks (at least 2048 elements in a call) go through a table of
// each block's 256 values; small ones element by element. Both must give
// the reference values and report the same first non-finite element.
TEST(Fp8Dequantize, LargeBlocksTabledMatchElementByElement) {
  constexpr std::uint64_t kRows = 70, kCols = 300, kBh = 64, kBw = 128;
  constexpr std::uint64_t kGridRows = 2, kGridCols = 3;
  for (DType dtype : {DType::kF8_E4M3, DType::kF8_E5M2}) {
    // 33-row chunks take the table (33 * 128 elements per block), 1-row
    // chunks the element loop (128).
    for (const std::uint64_t chunk : {std::uint64_t{33}, std::uint64_t{1}}) {
      expect_chunked_matches_reference({kRows, kCols, kBh, kBw, 11, 0.003f}, dtype, chunk);
    }
  }
  // NaN codes at [40, 299] (in the partial last column block) and [41, 5]:
  // the first in row-major order is reported.
  auto codes = random_codes(DType::kF8_E4M3, kRows * kCols, 12);
  codes[40 * kCols + 299] = 0x7F;
  codes[41 * kCols + 5] = 0xFF;
  const auto in = code_bytes(codes);
  const auto scale_bytes =
      test::float_bytes(DType::kF32, distinct_scales(kGridRows * kGridCols, 0.01f));
  std::vector<std::byte> out(2 * kRows * kCols);
  const Fp8ScaleLayout layout{DType::kF32, kBh, kBw, kGridRows, kGridCols};
  EXPECT_EQ(dequantize_fp8_rows(layout, {DType::kF8_E4M3, 0, kRows, kCols, in.data(),
                                         scale_bytes.data(), out.data()}),
            40 * kCols + 299);
}

TEST(Fp8Dequantize, ReportsFirstNonFiniteElement) {
  const Fp8ScaleLayout layout{DType::kF32, 1, 4, 2, 1};
  const auto scales = test::float_bytes(DType::kF32, {1.0f, 1.0f});
  std::vector<std::byte> out(16);
  const auto nan_codes = code_bytes({0x38, 0x38, 0x38, 0x38, 0x38, 0xFF, 0x7F, 0x38});
  EXPECT_EQ(dequantize_fp8_rows(
                layout, {DType::kF8_E4M3, 0, 2, 4, nan_codes.data(), scales.data(), out.data()}),
            5u);
  const auto inf_codes = code_bytes({0x3C, 0x7C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C});
  EXPECT_EQ(dequantize_fp8_rows(
                layout, {DType::kF8_E5M2, 0, 2, 4, inf_codes.data(), scales.data(), out.data()}),
            1u);
  // 448 * 2^120 = 1.75 * 2^128 is beyond the float32 (and BF16) range.
  const auto big = test::float_bytes(DType::kF32, {0x1p120f, 1.0f});
  const auto max_codes = code_bytes({0x38, 0x38, 0x38, 0x7E, 0x38, 0x38, 0x38, 0x38});
  EXPECT_EQ(dequantize_fp8_rows(
                layout, {DType::kF8_E4M3, 0, 2, 4, max_codes.data(), big.data(), out.data()}),
            3u);
}

// ================= input configs =================

// The E4M3 vector kernel at every level this CPU runs, against the scalar
// step bf16(float(code) * scale): every finite code (in the vector body and
// in the tail), scales that give exact, rounded, subnormal and overflowing
// products, non-finite scales (infinities, NaN, a NaN whose payload carries
// into the sign when rounded to BF16), and the index of the first bad value.
TEST(Fp8Dequantize, VectorKernelMatchesTheScalarStepAtEveryLevel) {
  std::vector<std::uint8_t> codes;
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) != 0x7F) codes.push_back(static_cast<std::uint8_t>((c * 37 + repeat) & 0xFF));
    }
  }
  for (std::uint8_t& c : codes) {
    if ((c & 0x7F) == 0x7F) c = 0x7E;  // the largest finite code instead of NaN
  }
  codes.resize(codes.size() + 5, 0x44);  // a tail shorter than any vector
  const float scales[] = {1.0f, 0.5f, 0.0123f, 3.1e-3f, 1e-38f, 1e-42f, 7.5e35f, 2.4e37f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0x7FFFFFFFu)};
  std::size_t levels = 0;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    detail::Fp8DecodeKernel* kernel = detail::fp8_decode_kernel(level);
    if (kernel == nullptr) continue;  // this CPU does not run the level
    ++levels;
    for (const float scale : scales) {
      SCOPED_TRACE(std::string(level.name) + ", scale " + std::to_string(scale));
      std::optional<std::size_t> expected_bad;
      std::vector<std::uint16_t> expected(codes.size());
      for (std::size_t i = 0; i < codes.size(); ++i) {
        expected[i] = float_to_bf16(f8_e4m3_to_float(codes[i]) * scale);
        if (!expected_bad && (expected[i] & 0x7F80u) == 0x7F80u) expected_bad = i;
      }
      std::vector<std::uint16_t> got(codes.size(), 0xABCD);
      const std::optional<std::size_t> bad = kernel(codes.data(), codes.size(), scale, got.data());
      ASSERT_EQ(bad, expected_bad);
      const std::size_t checked = bad ? *bad - *bad % 64 : codes.size();  // before its vector
      for (std::size_t i = 0; i < checked; ++i) {
        ASSERT_EQ(got[i], expected[i]) << "code 0x" << std::hex << int{codes[i]} << " at " << i;
      }
    }
    // A NaN code anywhere is the first bad value.
    for (const std::uint8_t nan : {std::uint8_t{0x7F}, std::uint8_t{0xFF}}) {
      for (const std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{17},
                                   std::size_t{63}, codes.size() - 1}) {
        std::vector<std::uint8_t> with_nan(codes.size(), 0x38);
        with_nan[at] = nan;
        std::vector<std::uint16_t> got(codes.size());
        EXPECT_EQ(kernel(with_nan.data(), with_nan.size(), 1.0f, got.data()), at)
            << level.name << ": NaN code at " << at;
      }
    }
  }
  if (levels == 0) GTEST_SKIP() << "this CPU runs none of the vector levels";
}

// Dequantizing in place through the public entry point (vector kernel for
// E4M3) gives the scalar loops' bytes.
TEST(Fp8Dequantize, VectorPathInPlaceEqualsScalarPath) {
  Fp8ScaleLayout layout;
  layout.dtype = DType::kF32;
  layout.block_rows = 128;
  layout.block_cols = 128;
  layout.grid_rows = 3;
  layout.grid_cols = 3;
  const std::uint64_t n_rows = 300;
  const std::uint64_t n_cols = 300;
  const std::uint64_t n = n_rows * n_cols;
  std::vector<float> scales = {1e-3f, 2.5e-2f, 7e-4f, 1.0f, 3e-5f, 0.125f, 9e-3f, 4e-2f, 6e-1f};
  std::vector<std::byte> scale_bytes(scales.size() * 4);
  std::memcpy(scale_bytes.data(), scales.data(), scale_bytes.size());
  std::vector<std::byte> vector_buf(3 * n);
  std::vector<std::byte> scalar_buf(3 * n);
  for (std::uint64_t i = 0; i < n; ++i) {
    auto code = static_cast<std::uint8_t>((i * 2654435761u) >> 24);
    if ((code & 0x7F) == 0x7F) code = 0x11;
    vector_buf[n + i] = scalar_buf[n + i] = std::byte{code};
  }
  const auto rows_of = [&](std::vector<std::byte>& buf) {
    Fp8Rows rows;
    rows.code_dtype = DType::kF8_E4M3;
    rows.row_begin = 0;
    rows.n_rows = n_rows;
    rows.n_cols = n_cols;
    rows.codes = buf.data() + n;
    rows.scales = scale_bytes.data();
    rows.out = buf.data();
    return rows;
  };
  ASSERT_EQ(dequantize_fp8_rows(layout, rows_of(vector_buf)), std::nullopt);
  ASSERT_EQ(dequantize_fp8_rows_scalar(layout, rows_of(scalar_buf)), std::nullopt);
  EXPECT_EQ(std::memcmp(vector_buf.data(), scalar_buf.data(), 2 * n), 0);
}

TEST(InputQuantization, UnquantizedWithoutQuantizationConfig) {
  EXPECT_EQ(classify_input_quantization(std::nullopt).kind, InputQuantKind::kNone);
  EXPECT_EQ(classify_input_quantization(json{{"model_type", "llama"}}).kind, InputQuantKind::kNone);
}

TEST(InputQuantization, BlockFp8ReadsBlockSize) {
  const InputQuantization q = classify_input_quantization(block_config(128, 64));
  EXPECT_EQ(q.kind, InputQuantKind::kBlockFp8);
  ASSERT_TRUE(q.block_size);
  EXPECT_EQ((*q.block_size)[0], 128u);
  EXPECT_EQ((*q.block_size)[1], 64u);
  EXPECT_EQ(q.scale_param(), "weight_scale_inv");
}

TEST(InputQuantization, CompressedTensorsFloatQuantized) {
  const InputQuantization q = classify_input_quantization(ct_config("channel"));
  EXPECT_EQ(q.kind, InputQuantKind::kCompressedTensorsFp8);
  EXPECT_TRUE(q.per_channel);
  EXPECT_FALSE(q.per_tensor);
  EXPECT_EQ(q.ignore, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(q.scale_param(), "weight_scale");
}

struct RefusedConfig {
  const char* name;
  std::function<json()> config;
  std::vector<std::string> fragments;
};

class InputQuantizationRefuses : public testing::TestWithParam<RefusedConfig> {};

TEST_P(InputQuantizationRefuses, NamesConfigMethodAndFormat) {
  expect_bad_input([&] { classify_input_quantization(GetParam().config()); }, GetParam().fragments);
}

json ct_with(const std::function<void(json&)>& edit) {
  json c = ct_config("channel");
  edit(c["quantization_config"]);
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, InputQuantizationRefuses,
    testing::Values(
        RefusedConfig{"PackQuantized",
                      [] { return ct_with([](json& q) { q["format"] = "pack-quantized"; }); },
                      {"config.json", "\"compressed-tensors\"", "\"pack-quantized\"",
                       "already pack-quantized"}},
        RefusedConfig{"IntQuantized",
                      [] { return ct_with([](json& q) { q["format"] = "int-quantized"; }); },
                      {"config.json", "\"compressed-tensors\"", "\"int-quantized\""}},
        RefusedConfig{"NvFp4",
                      [] { return ct_with([](json& q) { q["format"] = "nvfp4-pack-quantized"; }); },
                      {"config.json", "\"nvfp4-pack-quantized\""}},
        RefusedConfig{"MixedGroups",
                      [] {
                        return ct_with([](json& q) {
                          q["format"] = "mixed-precision";
                          q["config_groups"]["group_1"] = {{"format", "pack-quantized"}};
                        });
                      },
                      {"config.json", "\"mixed-precision\"", "pack-quantized"}},
        RefusedConfig{"GroupFormatDiffers",
                      [] {
                        return ct_with([](json& q) {
                          q["config_groups"]["group_0"]["format"] = "pack-quantized";
                        });
                      },
                      {"config.json", "group \"group_0\"", "\"pack-quantized\""}},
        RefusedConfig{"Frozen",
                      [] { return ct_with([](json& q) { q["quantization_status"] = "frozen"; }); },
                      {"config.json", "quantization_status is \"frozen\""}},
        RefusedConfig{"Asymmetric",
                      [] {
                        return ct_with([](json& q) {
                          q["config_groups"]["group_0"]["weights"]["symmetric"] = false;
                        });
                      },
                      {"config.json", "asymmetric"}},
        RefusedConfig{"IntWeights",
                      [] {
                        return ct_with([](json& q) {
                          q["config_groups"]["group_0"]["weights"]["type"] = "int";
                        });
                      },
                      {"config.json", "type \"int\"", "expected 8-bit float"}},
        RefusedConfig{"GroupStrategy",
                      [] {
                        return ct_with([](json& q) {
                          q["config_groups"]["group_0"]["weights"]["strategy"] = "group";
                        });
                      },
                      {"config.json", "strategy \"group\""}},
        RefusedConfig{"BlockWithoutStructure",
                      [] {
                        return ct_with([](json& q) {
                          q["config_groups"]["group_0"]["weights"]["strategy"] = "block";
                        });
                      },
                      {"config.json", "without a block_structure"}},
        RefusedConfig{"Transforms",
                      [] {
                        return ct_with([](json& q) {
                          q["transform_config"] = {{"config_groups", {{"u", json::object()}}}};
                        });
                      },
                      {"config.json", "transform_config"}},
        RefusedConfig{"Sparse",
                      [] {
                        return ct_with([](json& q) {
                          q["sparsity_config"] = {{"format", "sparse-24-bitmask"}};
                        });
                      },
                      {"config.json", "sparsity_config", "sparse-24-bitmask"}},
        RefusedConfig{
            "Gptq",
            [] {
              return json{{"quantization_config", {{"quant_method", "gptq"}, {"bits", 4}}}};
            },
            {"config.json", "quant_method \"gptq\"", "not converted"}},
        RefusedConfig{"Fp8WithoutBlockSize",
                      [] {
                        return json{{"quantization_config",
                                     {{"quant_method", "fp8"}, {"activation_scheme", "static"}}}};
                      },
                      {"config.json", "quant_method \"fp8\"", "no weight_block_size"}},
        RefusedConfig{"Fp8BadBlockSize",
                      [] {
                        json c = block_config(128, 128);
                        c["quantization_config"]["weight_block_size"] = {128, 0};
                        return c;
                      },
                      {"config.json", "weight_block_size is [128,0]"}},
        RefusedConfig{"NotAnObject",
                      [] {
                        return json{{"quantization_config", "fp8"}};
                      },
                      {"config.json", "quantization_config is a JSON string"}}),
    [](const testing::TestParamInfo<RefusedConfig>& param_info) { return param_info.param.name; });

TEST(Fp8ScaleLayout, CompressedTensorsShapes) {
  InputQuantization q = classify_input_quantization(ct_config("channel"));
  EXPECT_EQ(fp8_scale_layout(q, 6, 10, DType::kBF16, {6, 1}).block_cols, 10u);
  EXPECT_EQ(fp8_scale_layout(q, 6, 10, DType::kF32, {6}).grid_rows, 6u);
  expect_bad_input([&] { fp8_scale_layout(q, 6, 10, DType::kBF16, {1}); },
                   {"scale has shape [1]", "expected [6, 1] or [6]"});
  q = classify_input_quantization(ct_config("tensor"));
  EXPECT_EQ(fp8_scale_layout(q, 6, 10, DType::kF32, {}).block_rows, 6u);
  EXPECT_EQ(fp8_scale_layout(q, 6, 10, DType::kF32, {1}).block_cols, 10u);
  expect_bad_input([&] { fp8_scale_layout(q, 6, 10, DType::kF16, {1}); },
                   {"scale dtype is F16, expected F32 or BF16"});
}

TEST(Fp8ScaleLayout, BlockGridChecksShapeExactly) {
  const InputQuantization q = classify_input_quantization(block_config(2, 3));
  const Fp8ScaleLayout l = fp8_scale_layout(q, 5, 7, DType::kF32, {3, 3});
  EXPECT_EQ(l.block_rows, 2u);
  EXPECT_EQ(l.block_cols, 3u);
  EXPECT_EQ(l.grid_row_begin(3), 1u);
  EXPECT_EQ(l.grid_row_end(5), 3u);
  // Transposed grid of a square weight with non-square blocks: [3, 2] expected.
  EXPECT_EQ(fp8_scale_layout(q, 6, 6, DType::kF32, {3, 2}).grid_cols, 2u);
  expect_bad_input(
      [&] {
        fp8_scale_layout(q, 6, 6, DType::kF32, {2, 3});
      },
      {"scale has shape [2, 3]", "expected [3, 2]", "weight_block_size"});
}

}  // namespace
}  // namespace ctquant
