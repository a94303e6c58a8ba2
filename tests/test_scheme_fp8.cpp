// The FP8 rows (float-quantized, naive-quantized): the E4M3 cast, test
// vector V3, the kernels on the golden cases written by model_free_ptq,
// output shapes, presets and refusals.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/minifloat.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/refused_presets.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/scheme/fp8.hpp"
#include "ctquant/scheme/int8.hpp"
#include "scheme_test_support.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

using nlohmann::json;
using S = QuantArgs::Strategy;

// The rows of this project that a golden case may need, in
// compressed-tensors' format priority (schemes.md 1.1).
const SchemeFamily* const kRows[] = {&kIntQuantizedFamily, &kFloatQuantizedFamily,
                                     &kNaiveQuantizedFamily};

const Preset& preset(const SchemeFamily& family, std::string_view name) {
  for (const Preset& p : family.presets) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("no preset " + std::string(name));
}

QuantArgs fp8_args(S strategy) {
  QuantArgs a;
  a.type = QuantArgs::Type::kFloat;
  a.num_bits = 8;
  a.symmetric = true;
  a.strategy = strategy;
  a.group_size = 0;
  if (strategy == S::kBlock) a.block = {128, 128};
  return a;
}

// ---- the E4M3 cast (schemes.md 2.1; float_to_f8_e4m3 of format/minifloat.hpp,
// whose ties, clamp and signs test_minifloat.cpp pins) ----

// The E4M3 code nearest to v by search over every finite code, ties to the
// even code (the one whose mantissa ends in 0); the sign of v kept, also
// for zero. |v| <= 464.
std::uint8_t nearest_e4m3(double v) {
  const double a = std::fabs(v);
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(static_cast<double>(f8_e4m3_to_float(static_cast<std::uint8_t>(c))) - a);
    if (d < best_distance || (d == best_distance && c % 2 == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return static_cast<std::uint8_t>(best | (std::signbit(v) ? 0x80 : 0));
}

// Every BF16 and every F16 value up to 464 in magnitude (the quotients the
// kernels cast), and random floats, against the search above.
TEST(Fp8E4M3Cast, MatchesNearestSearchOnEveryBf16AndF16Value) {
  int checked = 0;
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    for (const float v : {bf16_to_float(static_cast<std::uint16_t>(bits)),
                          f16_to_float(static_cast<std::uint16_t>(bits))}) {
      if (!std::isfinite(v) || std::fabs(v) > 464.0f) continue;
      ASSERT_EQ(float_to_f8_e4m3(v), nearest_e4m3(v)) << v;
      ++checked;
    }
  }
  EXPECT_GT(checked, 80000);
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-14, 8);
  for (int i = 0; i < 100000; ++i) {
    const float v = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 == 0 ? 1.0f : -1.0f);
    if (std::fabs(v) > 464.0f) continue;
    ASSERT_EQ(float_to_f8_e4m3(v), nearest_e4m3(v)) << v;
  }
}

// ---- the kernels ----

std::vector<std::byte> bf16_weight(const std::vector<std::uint16_t>& bits) { return u16_bytes(bits); }

std::vector<std::uint8_t> as_u8(const std::vector<std::byte>& bytes) {
  std::vector<std::uint8_t> out;
  for (const std::byte b : bytes) out.push_back(std::to_integer<std::uint8_t>(b));
  return out;
}

// Test vector V3 of schemes.md 12, byte for byte, with both kernels.
TEST(Fp8Kernel, TestVectorV3) {
  const std::vector<std::uint16_t> w = {
      0xbcfa, 0xbc76, 0xbc56, 0xbd04, 0xbb03, 0xb3d7, 0xbca1, 0xbd04,  //
      0x3c10, 0x3cc0, 0x3d11, 0xbafa, 0x3b37, 0xbd01, 0xbbd2, 0xbbc4,  //
      0x0000, 0x0000, 0x0000, 0x8000, 0x0000, 0x0000, 0x0000, 0x0000};
  const std::vector<std::uint8_t> codes = {
      0xfd, 0xf5, 0xf3, 0xfe, 0xde, 0x81, 0xf8, 0xfe,  //
      0x6e, 0x79, 0x7e, 0xdc, 0x61, 0xfc, 0xea, 0xe9,  //
      0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00};
  const QuantArgs args = preset(kFloatQuantizedFamily, "FP8_DYNAMIC").weights;
  for (const KernelFn kernel : {kFloatQuantizedFamily.quantize_ref, kFloatQuantizedFamily.quantize}) {
    const FamilyOutput out =
        run_family(kFloatQuantizedFamily, kernel, args, DType::kBF16, 3, 8, bf16_weight(w));
    EXPECT_FALSE(out.bad);
    EXPECT_EQ(as_u8(out.tensors[0]), codes);
    EXPECT_EQ(out.tensors[1], u16_bytes({0x3897, 0x38a6, 0x3c00}));
  }
}

// A row whose amax is 448 has scale 1, so every quotient is the weight
// itself: the E4M3 ties of schemes.md 2.1 go through the whole kernel.
TEST(Fp8Kernel, E4M3TiesThroughTheKernel) {
  const std::vector<float> row = {448.0f, 1.0625f, 1.1875f, 232.0f,
                                  0x1p-10f, -0x1p-10f, 0.9375f * 0x1p-6f, -0.0f};
  const std::vector<std::uint8_t> codes = {0x7E, 0x38, 0x3A, 0x76, 0x00, 0x80, 0x08, 0x80};
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const S strategy : {S::kChannel, S::kTensor}) {
      const FamilyOutput out = run_family(kFloatQuantizedFamily, kFloatQuantizedFamily.quantize_ref,
                                          fp8_args(strategy), t, 1, 8, float_bytes(t, row));
      EXPECT_EQ(as_u8(out.tensors[0]), codes) << dtype_tag(t);
      EXPECT_EQ(load_as_float(t, out.tensors[1].data()), 1.0f);
    }
  }
}

// Zero rows get eps(W) as their scale (schemes.md 3.2 step 7), per dtype.
TEST(Fp8Kernel, ZeroRowGetsTheDtypeEps) {
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const FamilyOutput out =
        run_family(kFloatQuantizedFamily, kFloatQuantizedFamily.quantize_ref,
                   fp8_args(S::kChannel), t, 1, 4, float_bytes(t, {0.0f, -0.0f, 0.0f, -0.0f}));
    EXPECT_EQ(as_u8(out.tensors[0]), (std::vector<std::uint8_t>{0x00, 0x80, 0x00, 0x80}));
    EXPECT_EQ(load_as_float(t, out.tensors[1].data()), dtype_eps(t)) << dtype_tag(t);
  }
}

TEST(Fp8Kernel, ReportsTheFirstNonFiniteWeightInRowMajorOrder) {
  // Block strategy visits block (0, 1) before row 1 of block (0, 0); the
  // index reported is still the row-major first.
  std::vector<float> w(2 * 256, 0.5f);
  w[1 * 256 + 3] = std::numeric_limits<float>::infinity();
  w[0 * 256 + 200] = std::numeric_limits<float>::quiet_NaN();
  for (const S strategy : {S::kChannel, S::kBlock, S::kTensor}) {
    for (const KernelFn kernel : {kFloatQuantizedFamily.quantize_ref, kFloatQuantizedFamily.quantize}) {
      const FamilyOutput out = run_family(kFloatQuantizedFamily, kernel, fp8_args(strategy),
                                          DType::kF32, 2, 256, float_bytes(DType::kF32, w));
      ASSERT_TRUE(out.bad.has_value());
      EXPECT_EQ(*out.bad, 200u);
    }
  }
}

// ---- golden cases written by model_free_ptq ----

class Fp8Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8Golden, EveryModuleMatchesExpectedTensorByTensor) {
  EXPECT_GT(expect_golden_case(GetParam(), kRows), 0u);
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8Golden,
                         ::testing::Values("llama-bf16-fp8-dynamic", "llama-f16-fp8-dynamic",
                                           "odd-bf16-fp8-block", "llama-bf16-mixed-fp8-w4",
                                           "llama-bf16-fp8-tensor", "llama-bf16-fp8-weights-only",
                                           "llama-f32-fp8-dynamic", "llama-f16-mixed-int8-fp8-block"),
                         golden_case_test_name);

// The modules each case quantizes with these rows, so a case cannot pass by
// comparing nothing.
TEST(Fp8Golden, CasesCoverTheirModules) {
  EXPECT_EQ(golden_modules("llama-bf16-fp8-dynamic", kRows).size(), 7u);
  EXPECT_EQ(golden_modules("odd-bf16-fp8-block", kRows).size(), 5u);  // o/down_proj ignored
  EXPECT_EQ(golden_modules("llama-bf16-mixed-fp8-w4", kRows).size(), 4u);  // attention only
  const std::vector<GoldenModule> weights_only = golden_modules("llama-bf16-fp8-weights-only", kRows);
  ASSERT_EQ(weights_only.size(), 7u);
  for (const GoldenModule& m : weights_only) EXPECT_EQ(m.family, &kNaiveQuantizedFamily) << m.module;
  int int8_modules = 0;
  int fp8_modules = 0;
  for (const GoldenModule& m : golden_modules("llama-f16-mixed-int8-fp8-block", kRows)) {
    int8_modules += m.family == &kIntQuantizedFamily && m.args.strategy == S::kTensor;
    fp8_modules += m.family == &kFloatQuantizedFamily && m.args.strategy == S::kBlock;
  }
  EXPECT_EQ(int8_modules, 4);
  EXPECT_EQ(fp8_modules, 3);
  for (const GoldenModule& m : golden_modules("llama-bf16-fp8-tensor", kRows)) {
    EXPECT_EQ(m.family, &kFloatQuantizedFamily) << m.module;
    EXPECT_EQ(m.args.strategy, S::kTensor);
  }
}

// The dequantizer inverts the golden codes to within E4M3's precision: half
// a step (1/16 of the value for normal codes, 2^-10 * s for subnormal
// ones) plus the rounding of the product to W. -0.0 codes give -0.0.
TEST(Fp8Dequantize, GoldenOutputsDecodeCloseToTheInput) {
  for (const std::string name : {"llama-bf16-fp8-dynamic", "odd-bf16-fp8-block",
                                 "llama-bf16-fp8-tensor", "llama-f16-fp8-dynamic"}) {
    const SafetensorsFile input(golden_dir() / name / "input" / "model.safetensors", name);
    const SafetensorsFile expected(golden_dir() / name / "expected" / "model.safetensors", name);
    for (const GoldenModule& m : golden_modules(name, kRows)) {
      SCOPED_TRACE(name + ": " + m.module);
      const StoredTensor w = *read_stored(input, m.module + ".weight");
      const StoredTensor codes = *read_stored(expected, m.module + ".weight");
      const StoredTensor scale = *read_stored(expected, m.module + ".weight_scale");
      const std::uint64_t rows = w.shape[0];
      const std::uint64_t cols = w.shape[1];
      std::vector<float> values(rows * cols);
      DequantIo io;
      io.dtype = w.dtype;
      io.n_rows = rows;
      io.n_cols = cols;
      io.in[0] = codes.bytes.data();
      io.in[1] = scale.bytes.data();
      io.whole[0] = scale.bytes.data();
      io.values = values.data();
      m.family->dequantize(m.args, io);
      const std::size_t esize = element_size(w.dtype);
      for (std::uint64_t r = 0; r < rows; ++r) {
        for (std::uint64_t c = 0; c < cols; ++c) {
          const float x = load_as_float(w.dtype, w.bytes.data() + (r * cols + c) * esize);
          const float v = values[r * cols + c];
          std::uint64_t si = 0;
          if (m.args.strategy == S::kChannel) si = r;
          if (m.args.strategy == S::kBlock) si = (r / 128) * scale.shape[1] + c / 128;
          const float s = load_as_float(w.dtype, scale.bytes.data() + si * esize);
          const float bound = std::fabs(x) / 16 + s * 0x1p-10f + std::fabs(v) / 128;
          ASSERT_LE(std::fabs(v - x), bound) << "row " << r << " column " << c;
          if (std::to_integer<int>(codes.bytes[r * cols + c]) == 0x80) {
            EXPECT_TRUE(std::signbit(v) && v == 0.0f);
          }
        }
      }
    }
  }
}

// ---- shapes, presets, format inference, refusals ----

// The shapes of schemes.md 4.1 and 4.2.
TEST(Fp8Outputs, ShapesOfTheSpecExamples) {
  const QuantArgs block = preset(kFloatQuantizedFamily, "FP8_BLOCK").weights;
  const QuantArgs channel = preset(kFloatQuantizedFamily, "FP8_DYNAMIC").weights;
  struct Case {
    QuantArgs args;
    std::uint64_t rows, cols;
    std::vector<std::uint64_t> scale;
  };
  const Case cases[] = {
      {block, 4096, 4096, {32, 32}},   {block, 1024, 4096, {8, 32}},
      {block, 4096, 14336, {32, 112}}, {block, 576, 7168, {5, 56}},
      {block, 320, 256, {3, 2}},       {channel, 4096, 4096, {4096, 1}},
      {channel, 4096, 14336, {4096, 1}}, {fp8_args(S::kTensor), 384, 256, {1}},
  };
  for (const Case& c : cases) {
    for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
      const std::vector<OutputTensorSpec> out = kFloatQuantizedFamily.outputs(c.args, t, c.rows, c.cols);
      ASSERT_EQ(out.size(), 2u);
      EXPECT_EQ(out[0].suffix, "weight");
      EXPECT_EQ(out[0].dtype, DType::kF8_E4M3);
      EXPECT_EQ(out[0].shape, (std::vector<std::uint64_t>{c.rows, c.cols}));
      EXPECT_EQ(out[0].byte_size(), c.rows * c.cols);
      EXPECT_EQ(out[1].suffix, "weight_scale");
      EXPECT_EQ(out[1].dtype, t);
      EXPECT_EQ(out[1].shape, c.scale) << c.rows << "x" << c.cols;
      EXPECT_EQ(out[1].kind, OutputTensorSpec::Kind::kScale);
    }
  }
  // A chunk of rows [r0, r1) fills whole grid rows of a block scale.
  const std::vector<OutputTensorSpec> odd = kFloatQuantizedFamily.outputs(block, DType::kBF16, 320, 256);
  EXPECT_EQ(kFloatQuantizedFamily.row_alignment(block), 128u);
  EXPECT_EQ(odd[1].bytes_before(128), 4u);
  EXPECT_EQ(odd[1].bytes_before(256), 8u);
  EXPECT_EQ(odd[1].bytes_before(320), 12u);
  EXPECT_EQ(kFloatQuantizedFamily.row_alignment(channel), 1u);
  EXPECT_TRUE(kFloatQuantizedFamily.needs_tensor_amax(fp8_args(S::kTensor)));
  EXPECT_FALSE(kFloatQuantizedFamily.needs_tensor_amax(channel));
}

// The presets' args and input activations, as compressed-tensors'
// quant_scheme.py defines them and model_free_ptq writes them (the
// input_activations objects of schemes.md 4.1 and 4.2).
TEST(Fp8Presets, ArgsAndInputActivationsAreTheLibrarys) {
  const Preset& dynamic = preset(kFloatQuantizedFamily, "FP8_DYNAMIC");
  EXPECT_EQ(dynamic.weights, fp8_args(S::kChannel));
  EXPECT_EQ(json::parse(dynamic.input_activations),
            json::parse(R"({"actorder": null, "block_structure": null, "dynamic": true, "group_size": null, "num_bits": 8, "observer": null, "observer_kwargs": {}, "scale_dtype": null, "strategy": "token", "symmetric": true, "type": "float", "zp_dtype": null})"));
  const Preset& block = preset(kFloatQuantizedFamily, "FP8_BLOCK");
  EXPECT_EQ(block.weights, fp8_args(S::kBlock));
  EXPECT_EQ(block.weights.observer, "memoryless_minmax");
  EXPECT_EQ(json::parse(block.input_activations),
            json::parse(R"({"actorder": null, "block_structure": null, "dynamic": true, "group_size": 128, "num_bits": 8, "observer": null, "observer_kwargs": {}, "scale_dtype": null, "strategy": "group", "symmetric": true, "type": "float", "zp_dtype": null})"));
  // The golden fixtures carry the same objects.
  EXPECT_EQ(json::parse(dynamic.input_activations),
            read_json(golden_dir() / "llama-bf16-fp8-dynamic" / "expected" / "config.json")
                .at("quantization_config").at("config_groups").at("FP8_DYNAMIC")
                .at("input_activations"));
  EXPECT_EQ(json::parse(block.input_activations),
            read_json(golden_dir() / "odd-bf16-fp8-block" / "expected" / "config.json")
                .at("quantization_config").at("config_groups").at("FP8_BLOCK")
                .at("input_activations"));
  EXPECT_TRUE(kNaiveQuantizedFamily.presets.empty());
}

// compressors/format.py: float weights with input activations are
// float-quantized, without them naive-quantized (rule 7).
TEST(Fp8Format, FloatQuantizedNeedsInputActivations) {
  const QuantArgs args = fp8_args(S::kChannel);
  EXPECT_TRUE(kFloatQuantizedFamily.writes(args, true));
  EXPECT_FALSE(kFloatQuantizedFamily.writes(args, false));
  EXPECT_TRUE(kNaiveQuantizedFamily.writes(args, false));
  QuantArgs int8 = args;
  int8.type = QuantArgs::Type::kInt;
  EXPECT_FALSE(kFloatQuantizedFamily.writes(int8, true));
  EXPECT_EQ(kFloatQuantizedFamily.format, "float-quantized");
  EXPECT_EQ(kNaiveQuantizedFamily.format, "naive-quantized");
}

TEST(Fp8Supports, RefusesArgsVllmCannotServe) {
  EXPECT_EQ(kFloatQuantizedFamily.supports(fp8_args(S::kChannel)), "");
  EXPECT_EQ(kFloatQuantizedFamily.supports(fp8_args(S::kBlock)), "");
  EXPECT_EQ(kFloatQuantizedFamily.supports(fp8_args(S::kTensor)), "");
  EXPECT_EQ(kNaiveQuantizedFamily.supports(fp8_args(S::kBlock)), "");
  QuantArgs block64 = fp8_args(S::kBlock);
  block64.block = {64, 128};
  expect_message(kFloatQuantizedFamily.supports(block64), {"[64, 128]", "128x128"});
  QuantArgs group = fp8_args(S::kGroup);
  group.group_size = 128;
  expect_message(kFloatQuantizedFamily.supports(group), {"\"group\"", "tensor, channel"});
  QuantArgs asym = fp8_args(S::kChannel);
  asym.symmetric = false;
  expect_message(kFloatQuantizedFamily.supports(asym), {"asymmetric", "symmetric"});
  QuantArgs fp4 = fp8_args(S::kChannel);
  fp4.num_bits = 4;
  expect_message(kNaiveQuantizedFamily.supports(fp4), {"4-bit float", "FP8"});
  QuantArgs int8 = fp8_args(S::kChannel);
  int8.type = QuantArgs::Type::kInt;
  expect_message(kNaiveQuantizedFamily.supports(int8), {"integer", "FP8"});
  QuantArgs scaled = fp8_args(S::kChannel);
  scaled.scale_dtype = DType::kF8_E4M3;
  expect_message(kFloatQuantizedFamily.supports(scaled), {"scale_dtype", "weight's dtype"});
}

// schemes.md 4.2: FP8_BLOCK takes any number of rows but fails at save time
// when in_features is not a multiple of 128; ctquant refuses up front.
TEST(Fp8Refuse, BlockNeedsInFeaturesMultipleOf128) {
  const QuantArgs block = preset(kFloatQuantizedFamily, "FP8_BLOCK").weights;
  EXPECT_EQ(kFloatQuantizedFamily.refuse(block, 320, 256), "");
  EXPECT_EQ(kFloatQuantizedFamily.refuse(block, 80, 7168), "");
  expect_message(kFloatQuantizedFamily.refuse(block, 256, 320),
                 {"in_features 320", "128", "non-contiguous"});
  expect_message(kNaiveQuantizedFamily.refuse(block, 256, 200), {"in_features 200"});
  EXPECT_EQ(kFloatQuantizedFamily.refuse(fp8_args(S::kChannel), 256, 320), "");
  expect_message(kFloatQuantizedFamily.refuse(fp8_args(S::kChannel), 0, 320), {"no elements"});
}

// The problems vLLM's rule finds for a shard, joined, for messages.
std::string shape_problems(const SchemeFamily& family, const QuantArgs& args, std::uint64_t rows,
                           std::uint64_t cols, Parallel parallel) {
  std::string out;
  for (const ShapeProblem& p : family.vllm_shape_rule(args, rows, cols, parallel)) {
    EXPECT_TRUE(p.unloadable) << p.what;
    out += p.what + ";";
  }
  return out;
}

// vLLM fp8_utils.py validate_fp8_block_shape, per shard.
TEST(Fp8VllmRule, BlockShardsMustHoldWholeBlocks) {
  const QuantArgs block = fp8_args(S::kBlock);
  EXPECT_EQ(shape_problems(kFloatQuantizedFamily, block, 4096, 4096, Parallel::kColumn), "");
  expect_message(shape_problems(kFloatQuantizedFamily, block, 320, 4096, Parallel::kColumn),
                 {"out_features 320 per shard", "128"});
  EXPECT_EQ(shape_problems(kFloatQuantizedFamily, block, 320, 4096, Parallel::kRow), "");
  expect_message(shape_problems(kFloatQuantizedFamily, block, 4096, 960, Parallel::kRow),
                 {"in_features 960 per shard"});
  EXPECT_EQ(shape_problems(kFloatQuantizedFamily, fp8_args(S::kChannel), 100, 100, Parallel::kRow),
            "");
  EXPECT_EQ(kFloatQuantizedFamily.vllm_args_rule(fp8_args(S::kTensor)), "");
  EXPECT_NE(kFloatQuantizedFamily.vllm_source.find("fp8_utils.py"), std::string_view::npos);
  EXPECT_NE(kNaiveQuantizedFamily.vllm_source.find("compressed_tensors_w8a16_fp8.py"),
            std::string_view::npos);
}

// The registry tries the rows in compressed-tensors' format priority.
TEST(Fp8Registry, FormatInferenceAndPresetLookup) {
  const QuantArgs channel = fp8_args(S::kChannel);
  EXPECT_EQ(family_for(channel, true), &kFloatQuantizedFamily);
  EXPECT_EQ(family_for(channel, false), &kNaiveQuantizedFamily);
  QuantArgs int8 = channel;
  int8.type = QuantArgs::Type::kInt;
  EXPECT_EQ(family_for(int8, true), &kIntQuantizedFamily);
  EXPECT_EQ(family_by_format("float-quantized"), &kFloatQuantizedFamily);
  EXPECT_EQ(family_by_format("naive-quantized"), &kNaiveQuantizedFamily);
  EXPECT_EQ(find_preset("fp8_dynamic"), &preset(kFloatQuantizedFamily, "FP8_DYNAMIC"));
  EXPECT_EQ(find_preset("FP8_BLOCK"), &preset(kFloatQuantizedFamily, "FP8_BLOCK"));
  EXPECT_EQ(find_preset("FP8"), nullptr);
  EXPECT_NE(preset_names().find("FP8_DYNAMIC, FP8_BLOCK"), std::string::npos);
}

// Each preset's config group is model_free_ptq's as a JSON value (schemes.md
// 4.1, 4.2): the registry's quant_args_json of the weights and the
// activations as the config reader serialises them.
TEST(Fp8Presets, ConfigGroupsEqualTheLibrarys) {
  struct Case {
    const char* preset;
    const char* golden;
  };
  for (const Case c : {Case{"FP8_DYNAMIC", "llama-bf16-fp8-dynamic"},
                       Case{"FP8_BLOCK", "odd-bf16-fp8-block"}}) {
    const json group = read_json(golden_dir() / c.golden / "expected" / "config.json")
                           .at("quantization_config").at("config_groups").at(c.preset);
    const Preset& p = preset(kFloatQuantizedFamily, c.preset);
    EXPECT_EQ(quant_args_json(p.weights), group.at("weights")) << c.preset;
    const json activations = json::parse(p.input_activations);
    EXPECT_EQ(activations, group.at("input_activations")) << c.preset;
    EXPECT_EQ(activation_args_json(activations, c.preset), activations) << c.preset;
    EXPECT_EQ(group.at("format"), kFloatQuantizedFamily.format);
  }
  // Custom groups of the fixtures read back to the same weights objects.
  for (const char* name : {"llama-bf16-fp8-tensor", "llama-bf16-fp8-weights-only",
                           "llama-bf16-mixed-fp8-w4", "llama-f16-mixed-int8-fp8-block"}) {
    const json groups = read_json(golden_dir() / name / "expected" / "config.json")
                            .at("quantization_config").at("config_groups");
    for (const auto& [key, group] : groups.items()) {
      const QuantArgs args = quant_args_from_json(group.at("weights"), key);
      EXPECT_EQ(quant_args_json(args), group.at("weights")) << name << " " << key;
      const SchemeFamily* family = family_for(args, !group.at("input_activations").is_null());
      ASSERT_NE(family, nullptr);
      EXPECT_EQ(group.at("format"), family->format) << name << " " << key;
    }
  }
}

// ---- presets model_free_ptq refuses ----

TEST(RefusedPresets, Fp8StaticActivationsAreRefusedWithTheLibrarysReason) {
  const RefusedPreset* fp8 = refused_preset("fp8");
  ASSERT_NE(fp8, nullptr);
  expect_message(std::string(fp8->reason),
                 {"static", "Model Free PTQ cannot calibrate activations", "FP8_DYNAMIC"});
  EXPECT_EQ(refused_preset("FP8_DYNAMIC"), nullptr);
  EXPECT_EQ(refused_preset("W4A16"), nullptr);
  // NVFP4's refusal is its registry row's (Preset::refused), not listed here again.
  EXPECT_EQ(refused_preset("NVFP4"), nullptr);
  // --scheme FP8 and a config group keyed FP8 say why.
  try {
    preset_group("FP8");
    ADD_FAILURE() << "FP8 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_message(e.what(), {"scheme 'FP8' is not written", "cannot calibrate", "FP8_DYNAMIC"});
  }
  try {
    plan_options_from_config(json::parse(R"({"config_groups": {"FP8": ["Linear"]}})"), "q.json");
    ADD_FAILURE() << "FP8 was accepted";
  } catch (const Error& e) {
    expect_message(e.what(), {"q.json: config_groups.FP8", "not written", "cannot calibrate"});
  }
  // The FP8 preset's own input activations (compressed-tensors
  // quant_scheme.py) are refused by the config reader too.
  const json fp8_inputs = {{"num_bits", 8},     {"type", "float"}, {"strategy", "tensor"},
                           {"symmetric", true}, {"dynamic", false}, {"observer", "static_minmax"}};
  EXPECT_THROW(activation_args_json(fp8_inputs, "FP8.input_activations"), Error);
}

}  // namespace
}  // namespace ctquant::test
