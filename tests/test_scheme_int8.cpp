// The int-quantized row (W8A8 / INT8): test vector V5, the kernels on the
// golden cases written by model_free_ptq, shapes, presets and refusals.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/refused_presets.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/scheme/fp8.hpp"
#include "ctquant/scheme/int8.hpp"
#include "scheme_test_support.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

using nlohmann::json;
using S = QuantArgs::Strategy;

const SchemeFamily* const kRows[] = {&kIntQuantizedFamily, &kFloatQuantizedFamily,
                                     &kNaiveQuantizedFamily};
const SchemeFamily& kRow = kIntQuantizedFamily;

QuantArgs int8_args(S strategy) {
  QuantArgs a;
  a.type = QuantArgs::Type::kInt;
  a.num_bits = 8;
  a.symmetric = true;
  a.strategy = strategy;
  a.group_size = 0;
  return a;
}

std::vector<std::int8_t> as_i8(const std::vector<std::byte>& bytes) {
  std::vector<std::int8_t> out;
  for (const std::byte b : bytes) out.push_back(std::bit_cast<std::int8_t>(b));
  return out;
}

// Test vector V5 of schemes.md 12: amax 1.0 gives scale 0x3C01, and the
// quotients 65.488, 67.47, 69.46 are rounded to BF16 (65.5, 67.5, 69.5)
// before rounding half to even: 66, 68, 70.
TEST(Int8Kernel, TestVectorV5DoubleRounding) {
  std::vector<std::uint16_t> w(128, 0x0000);
  w[0] = 0x3f80;
  w[1] = 0x3f04;
  w[2] = 0x3f08;
  w[3] = 0x3f0c;
  std::vector<std::int8_t> codes(128, 0);
  codes[0] = 127;
  codes[1] = 66;
  codes[2] = 68;
  codes[3] = 70;
  for (const KernelFn kernel : {kRow.quantize_ref, kRow.quantize}) {
    const FamilyOutput out =
        run_family(kRow, kernel, int8_args(S::kChannel), DType::kBF16, 1, 128, u16_bytes(w));
    EXPECT_FALSE(out.bad);
    EXPECT_EQ(as_i8(out.tensors[0]), codes);
    EXPECT_EQ(out.tensors[1], u16_bytes({0x3c01}));
  }
  // The scalar pieces say the same.
  EXPECT_EQ(int8_weight_scale(DType::kBF16, 1.0f), bf16_to_float(0x3c01));
  EXPECT_EQ(int8_weight_code(DType::kBF16, 0.515625f, bf16_to_float(0x3c01)), 66);
  // Without the rounding to BF16 the quotient would round to 65.
  EXPECT_EQ(std::nearbyint(0.515625f / bf16_to_float(0x3c01)), 65.0f);
}

// Zero rows get eps(W); the code range is [-128, 127].
TEST(Int8Kernel, ZeroRowsAndTheCodeRange) {
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const FamilyOutput zero = run_family(kRow, kRow.quantize_ref, int8_args(S::kChannel), t, 1, 4,
                                         float_bytes(t, {0.0f, -0.0f, 0.0f, 0.0f}));
    EXPECT_EQ(as_i8(zero.tensors[0]), (std::vector<std::int8_t>{0, 0, 0, 0}));
    EXPECT_EQ(load_as_float(t, zero.tensors[1].data()), dtype_eps(t)) << dtype_tag(t);
  }
  // amax / s is 127.5 before the scale is rounded; BF16 rounds 1 / 127.5
  // up to 0x3C01, so -amax gives -127.007, which rounds to -127. Only
  // quotients beyond -127.5 (a scale rounded down) reach the clamp at -128,
  // and +127 takes 127.5 and above.
  const float s = int8_weight_scale(DType::kBF16, 1.0f);
  EXPECT_GT(s, 1.0f / 127.5f);
  EXPECT_EQ(int8_weight_code(DType::kBF16, -1.0f, s), -127);
  EXPECT_EQ(int8_weight_code(DType::kF32, -1.0f, 1.0f / 127.5f * 0.99f), -128);
  EXPECT_EQ(int8_weight_code(DType::kF32, 1.0f, 1.0f / 127.5f * 0.99f), 127);
}

TEST(Int8Kernel, ReportsTheFirstNonFiniteWeight) {
  std::vector<float> w(3 * 64, 0.25f);
  w[2 * 64 + 1] = -std::numeric_limits<float>::infinity();
  w[1 * 64 + 60] = std::numeric_limits<float>::quiet_NaN();
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const S strategy : {S::kChannel, S::kTensor}) {
      for (const KernelFn kernel : {kRow.quantize_ref, kRow.quantize}) {
        const FamilyOutput out =
            run_family(kRow, kernel, int8_args(strategy), t, 3, 64, float_bytes(t, w));
        ASSERT_TRUE(out.bad.has_value());
        EXPECT_EQ(*out.bad, 64u + 60u) << dtype_tag(t);
      }
    }
  }
}

// The fast path (the W8A16 kernel with the offset removed) against the
// reference on random rows of many widths, including widths it hands back
// to the reference (not a multiple of 4).
TEST(Int8Kernel, FastPathEqualsReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const std::uint64_t cols : {4u, 8u, 12u, 16u, 24u, 100u, 128u, 130u, 512u, 1000u}) {
      const std::uint64_t rows = 7;
      std::vector<float> w(rows * cols);
      for (float& v : w) v = normal(rng);
      for (std::uint64_t c = 0; c < cols; ++c) w[3 * cols + c] = 0.0f;  // a zero row
      for (std::uint64_t c = 0; c < cols; ++c) w[4 * cols + c] = -std::fabs(w[4 * cols + c]);
      const std::vector<std::byte> bytes = float_bytes(t, w);
      for (const S strategy : {S::kChannel, S::kTensor}) {
        const FamilyOutput ref = run_family(kRow, kRow.quantize_ref, int8_args(strategy), t, rows,
                                            cols, bytes, 0, std::byte{0xCD});
        const FamilyOutput fast = run_family(kRow, kRow.quantize, int8_args(strategy), t, rows,
                                             cols, bytes, 2, std::byte{0xAB});
        EXPECT_EQ(ref.tensors, fast.tensors) << dtype_tag(t) << " " << cols;
      }
    }
  }
}

// ---- golden cases written by model_free_ptq ----

class Int8Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8Golden, EveryModuleMatchesExpectedTensorByTensor) {
  EXPECT_EQ(expect_golden_case(GetParam(), kRows), 7u);
}

INSTANTIATE_TEST_SUITE_P(Cases, Int8Golden,
                         ::testing::Values("llama-bf16-w8a8", "llama-f16-w8a8"),
                         golden_case_test_name);

// The golden W8A8 output exercises the clamp at -128 and zero rows.
TEST(Int8Golden, CasesHoldClampedCodesAndEpsScales) {
  const std::string name = "llama-bf16-w8a8";
  const SafetensorsFile expected(golden_dir() / name / "expected" / "model.safetensors", name);
  int clamped = 0;
  int eps_rows = 0;
  for (const GoldenModule& m : golden_modules(name, kRows)) {
    EXPECT_EQ(m.family, &kIntQuantizedFamily);
    const StoredTensor codes = *read_stored(expected, m.module + ".weight");
    for (const std::byte b : codes.bytes) clamped += std::bit_cast<std::int8_t>(b) == -128;
    const StoredTensor scale = *read_stored(expected, m.module + ".weight_scale");
    for (std::size_t i = 0; i < scale.bytes.size(); i += 2) {
      eps_rows += load_as_float(DType::kBF16, scale.bytes.data() + i) == 0x1p-7f;
    }
  }
  EXPECT_GT(clamped, 0);
  EXPECT_GT(eps_rows, 0);
}

// Dequantized golden codes are within half a step of the input (plus the
// rounding of the product to W).
TEST(Int8Dequantize, GoldenOutputsDecodeCloseToTheInput) {
  for (const std::string name : {"llama-bf16-w8a8", "llama-f16-w8a8"}) {
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
      io.values = values.data();
      m.family->dequantize(m.args, io);
      const std::size_t esize = element_size(w.dtype);
      for (std::uint64_t r = 0; r < rows; ++r) {
        const float s = load_as_float(w.dtype, scale.bytes.data() + r * esize);
        for (std::uint64_t c = 0; c < cols; ++c) {
          const float x = load_as_float(w.dtype, w.bytes.data() + (r * cols + c) * esize);
          const float v = values[r * cols + c];
          const float q = static_cast<float>(std::bit_cast<std::int8_t>(codes.bytes[r * cols + c]));
          ASSERT_EQ(v, round_to_dtype(w.dtype, q * s));
          ASSERT_LE(std::fabs(v - x), s * 0.5f + s / 128 + std::fabs(v) / 128)
              << "row " << r << " column " << c;
        }
      }
    }
  }
}

// ---- shapes, presets, format inference, refusals ----

TEST(Int8Outputs, WeightAndScaleShapes) {
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::vector<OutputTensorSpec> channel =
        kRow.outputs(int8_args(S::kChannel), t, 4096, 14336);
    ASSERT_EQ(channel.size(), 2u);
    EXPECT_EQ(channel[0].suffix, "weight");
    EXPECT_EQ(channel[0].dtype, DType::kI8);
    EXPECT_EQ(channel[0].shape, (std::vector<std::uint64_t>{4096, 14336}));
    EXPECT_EQ(channel[1].suffix, "weight_scale");
    EXPECT_EQ(channel[1].dtype, t);
    EXPECT_EQ(channel[1].shape, (std::vector<std::uint64_t>{4096, 1}));
    const std::vector<OutputTensorSpec> tensor = kRow.outputs(int8_args(S::kTensor), t, 64, 128);
    EXPECT_EQ(tensor[1].shape, std::vector<std::uint64_t>{1});
    EXPECT_EQ(tensor[1].fill, OutputTensorSpec::Fill::kWhole);
  }
  EXPECT_TRUE(kRow.needs_tensor_amax(int8_args(S::kTensor)));
  EXPECT_FALSE(kRow.needs_tensor_amax(int8_args(S::kChannel)));
  EXPECT_EQ(kRow.row_alignment(int8_args(S::kChannel)), 1u);
}

// compressed-tensors quant_scheme.py INT8_W8A8 under both names, and the
// input activations model_free_ptq writes for it.
TEST(Int8Presets, W8A8AndInt8) {
  ASSERT_EQ(kRow.presets.size(), 2u);
  for (const Preset& p : kRow.presets) {
    EXPECT_EQ(p.weights, int8_args(S::kChannel)) << p.name;
    EXPECT_EQ(json::parse(p.input_activations),
              read_json(golden_dir() / "llama-bf16-w8a8" / "expected" / "config.json")
                  .at("quantization_config").at("config_groups").at("W8A8")
                  .at("input_activations"));
    EXPECT_EQ(activation_args_json(json::parse(p.input_activations), "W8A8"),
              json::parse(p.input_activations));
    EXPECT_EQ(quant_args_json(p.weights),
              read_json(golden_dir() / "llama-bf16-w8a8" / "expected" / "config.json")
                  .at("quantization_config").at("config_groups").at("W8A8").at("weights"));
    EXPECT_EQ(find_preset(p.name), &p);
  }
  EXPECT_EQ(kRow.presets[0].name, "W8A8");
  EXPECT_EQ(kRow.presets[1].name, "INT8");
}

// compressors/format.py rule 4: integer weights with input activations are
// int-quantized whatever their width; without them pack-quantized wins.
TEST(Int8Format, IntQuantizedNeedsInputActivations) {
  EXPECT_TRUE(kRow.writes(int8_args(S::kChannel), true));
  EXPECT_FALSE(kRow.writes(int8_args(S::kChannel), false));
  QuantArgs w4 = int8_args(S::kGroup);
  w4.num_bits = 4;
  w4.group_size = 128;
  EXPECT_TRUE(kRow.writes(w4, true));
  QuantArgs fp8 = int8_args(S::kChannel);
  fp8.type = QuantArgs::Type::kFloat;
  EXPECT_FALSE(kRow.writes(fp8, true));
  EXPECT_EQ(kRow.format, "int-quantized");
}

// W4A8 and the other sub-8-bit int-quantized schemes are written by
// model_free_ptq but not loadable on NVIDIA GPUs by vLLM: refused, with the
// reason, as args and as presets.
TEST(Int8Supports, RefusesWhatVllmCannotServeOnGpus) {
  EXPECT_EQ(kRow.supports(int8_args(S::kChannel)), "");
  EXPECT_EQ(kRow.supports(int8_args(S::kTensor)), "");
  QuantArgs w4 = int8_args(S::kGroup);
  w4.num_bits = 4;
  w4.group_size = 128;
  expect_message(kRow.supports(w4), {"4-bit", "CPU and XPU", "W4A16"});
  QuantArgs group8 = int8_args(S::kGroup);
  group8.group_size = 128;
  expect_message(kRow.supports(group8), {"\"group\"", "per-channel or per-tensor"});
  QuantArgs asym = int8_args(S::kChannel);
  asym.symmetric = false;
  expect_message(kRow.supports(asym), {"asymmetric"});
  QuantArgs fp8 = int8_args(S::kChannel);
  fp8.type = QuantArgs::Type::kFloat;
  expect_message(kRow.supports(fp8), {"float weights"});
  for (const char* name : {"W4A8", "w4afp8", "W4A4", "W2A8", "W7A8"}) {
    const RefusedPreset* p = refused_preset(name);
    ASSERT_NE(p, nullptr) << name;
    expect_message(std::string(p->reason), {"int-quantized", "NVIDIA GPUs", "W4A16"});
  }
  EXPECT_EQ(refused_preset("W8A8"), nullptr);
  expect_message(std::string(refused_preset("UNQUANTIZED")->reason), {"no weight quantization"});
  EXPECT_EQ(kRow.refuse(int8_args(S::kChannel), 3, 5), "");
  EXPECT_TRUE(kRow.vllm_shape_rule(int8_args(S::kChannel), 3, 5, Parallel::kRow).empty());
  EXPECT_EQ(kRow.vllm_args_rule(int8_args(S::kTensor)), "");
}

}  // namespace
}  // namespace ctquant::test
