// The MX families mxfp4-pack-quantized and mxfp8-quantized (src/scheme/
// mxfp4.cpp, mxfp8.cpp): the E8M0 exponent rule of docs/schemes.md
// section 6.1 (round up from mantissa 1.75, zero groups, F16 underflow), the
// test vector V4 of section 12 byte for byte, the golden MX cases module by
// module, the presets, refusals and vLLM rules, and the fast paths and the
// vector kernels at every level this CPU runs against the references.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "ctquant/format/minifloat.hpp"
#include "microscale_test_support.hpp"
#include "scheme/microscale.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using microscale::kMxfp4Offset;
using microscale::kMxfp8Offset;
using microscale::mx_scale;
using test::hex16;
using test::to_hex;

QuantArgs mx_args(const SchemeFamily& f) { return f.presets[0].weights; }
// The reference, the fast path and the vector kernel at every level this CPU runs.
std::vector<test::KernelPath> paths(const SchemeFamily& f) {
  return test::all_paths(
      f, &f == &kMxfp4Family ? microscale::Format::kMxfp4 : microscale::Format::kMxfp8);
}

// ---- E8M0 exponents (schemes.md 6.1) ----

TEST(MxScale, ExponentOfTheAmaxMinusTheElementOffset) {
  // 0.1875 = 1.5 * 2^-3: no round-up; e = 127 - 3 - 2 = 122 (V4 row 0).
  EXPECT_EQ(mx_scale(DType::kBF16, 0.1875f, kMxfp4Offset).byte, 0x7A);
  EXPECT_EQ(mx_scale(DType::kBF16, 0.1875f, kMxfp4Offset).scale, 0x1p-5f);
  EXPECT_EQ(mx_scale(DType::kBF16, 0.1875f, kMxfp8Offset).byte, 0x74);
  EXPECT_EQ(mx_scale(DType::kBF16, 0.1875f, kMxfp8Offset).scale, 0x1p-11f);
}

TEST(MxScale, MantissaFrom1Point75RoundsTheExponentUp) {
  // 0.21875 = 1.75 * 2^-3 -> 2^-2: e = 123 (V4 row 1 group 1).
  EXPECT_EQ(mx_scale(DType::kBF16, 0.21875f, kMxfp4Offset).byte, 0x7B);
  // The largest BF16 mantissa below 1.75 (1.7421875) does not round up.
  EXPECT_EQ(mx_scale(DType::kBF16, 1.7421875f * 0x1p-3f, kMxfp4Offset).byte, 0x7A);
  // F16 and F32 use the same threshold on their own mantissas.
  EXPECT_EQ(mx_scale(DType::kF16, 1.75f * 0x1p-3f, kMxfp4Offset).byte, 0x7B);
  EXPECT_EQ(mx_scale(DType::kF16, (1.75f - 0x1p-10f) * 0x1p-3f, kMxfp4Offset).byte, 0x7A);
  EXPECT_EQ(mx_scale(DType::kF32, 1.75f * 0x1p-3f, kMxfp4Offset).byte, 0x7B);
  EXPECT_EQ(mx_scale(DType::kF32, std::nextafter(1.75f, 0.0f) * 0x1p-3f, kMxfp4Offset).byte, 0x7A);
}

TEST(MxScale, ZeroGroupGetsByteZeroInBf16AndF32) {
  for (const DType t : {DType::kBF16, DType::kF32}) {
    for (const int offset : {kMxfp4Offset, kMxfp8Offset}) {
      const auto s = mx_scale(t, 0.0f, offset);
      EXPECT_EQ(s.byte, 0) << dtype_tag(t);
      EXPECT_EQ(s.scale, 0x1p-127f) << dtype_tag(t);  // a subnormal of BF16 and F32
    }
  }
}

TEST(MxScale, F16ScalesThatUnderflowBecomeOne) {
  // schemes.md 6.4: a scale 2^(e - 127) that is 0 in F16 becomes eps 1.0,
  // stored as byte 127. For F16 weights that is the zero group and every
  // subnormal amax below 0.75 * 2^-14 (round_to_power_2 gives 0, e = 0).
  EXPECT_EQ(mx_scale(DType::kF16, 0.0f, kMxfp4Offset).byte, 127);
  EXPECT_EQ(mx_scale(DType::kF16, 0.0f, kMxfp4Offset).scale, 1.0f);
  EXPECT_EQ(mx_scale(DType::kF16, 0x1p-20f, kMxfp4Offset).byte, 127);
  EXPECT_EQ(mx_scale(DType::kF16, 0x1p-17f, kMxfp8Offset).byte, 127);
  // A subnormal amax from 0.75 * 2^-14 rounds up to 2^-14: e = 111, scale
  // 2^-16 (an F16 subnormal) is kept.
  EXPECT_EQ(mx_scale(DType::kF16, f16_to_float(0x0300), kMxfp4Offset).byte, 111);
  EXPECT_EQ(mx_scale(DType::kF16, f16_to_float(0x0300), kMxfp4Offset).scale, 0x1p-16f);
  EXPECT_EQ(mx_scale(DType::kF16, f16_to_float(0x02FF), kMxfp4Offset).byte, 127);
  // Under the FP8 offset: e = 105, scale 2^-22.
  EXPECT_EQ(mx_scale(DType::kF16, 0x1p-14f, kMxfp8Offset).byte, 105);
  EXPECT_EQ(mx_scale(DType::kF16, 0x1p-14f, kMxfp8Offset).scale, 0x1p-22f);
}

TEST(MxScale, SubnormalAndHugeAmax) {
  // BF16 subnormal amax: 0 unless its mantissa is >= 96 (then 2^-126).
  EXPECT_EQ(mx_scale(DType::kBF16, bf16_to_float(0x005F), kMxfp4Offset).byte, 0);
  EXPECT_EQ(mx_scale(DType::kBF16, bf16_to_float(0x0060), kMxfp4Offset).byte, 0);  // 127-126-2 < 0
  EXPECT_EQ(mx_scale(DType::kBF16, bf16_to_float(0x0060), kMxfp4Offset).scale, 0x1p-127f);
  EXPECT_EQ(mx_scale(DType::kBF16, 0x1p100f, kMxfp4Offset).byte, 225);
  // Rounding up past the largest exponent: infinite scale, byte 0xFF.
  const auto overflow = mx_scale(DType::kBF16, bf16_to_float(0x7F70), kMxfp4Offset);
  EXPECT_EQ(overflow.byte, 0xFF);
  EXPECT_TRUE(std::isinf(overflow.scale));
}

// ---- V4 (schemes.md 12) ----

std::vector<std::byte> v4_weight() {
  return hex16(
      "bd67 bcbf 3d79 bb2a 3b41 bd15 3cb4 3e40 3d94 3c09 3bf3 3d12 bcb3 3d0f b98f bccf "
      "3bd4 bc81 bd5e bd21 3c5f 3d0c 3bf4 bd5a 3d09 3c13 3b58 bc9f 3c53 3d35 bd5c 3d46 "
      "3cf2 3cd8 bd32 bd11 3c4a 3c49 3bfd 3d07 3d23 3cd2 bc0a 3cac bd33 3d46 3b38 bd1b "
      "bc78 bd35 bc28 bc14 3d21 bd0f 3b6b bba0 bce3 bce5 3d30 3c4f bc2e 3cbc bc91 bcbc "
      "3c97 3bbf bd9f 3cd2 3d19 3c79 3cea 3d1f bb47 3c29 bd04 bcd7 bd34 bd1b 3d0a 3d40 "
      "3b9b 3d1a 3d23 bc74 3d3e 3c2b 3b37 3c97 bc9e bc0d 3dcc bc46 bcaf bc98 bbe0 bcc2 "
      "bcff bd03 bbcd bbd4 3c05 3c8a bc1c 3d3a be60 3ce2 bc87 bc2b bcb8 bce3 3c8d bb57 "
      "3cba bc48 bb7b 3c0a 3a93 bc9d bcc8 bca9 3cbd bd04 bbc6 bc8a 3ca8 bc7e 3d5c 3c90");
}

TEST(MxVectors, V4Mxfp4) {
  for (const test::KernelPath& path : paths(kMxfp4Family)) {
    SCOPED_TRACE(path.name);
    const auto out = test::run_family(kMxfp4Family, mx_args(kMxfp4Family), DType::kBF16, 2, 64,
                                      v4_weight(), 0.0f, path);
    ASSERT_FALSE(out.bad);
    EXPECT_TRUE(out.whole.empty());
    EXPECT_EQ(to_hex(out.rows_outputs[1]), "7a 78 79 7b");
    EXPECT_EQ(to_hex(out.rows_outputs[0]),
              "9c 84 a0 71 14 20 29 a8 90 bb 21 b0 12 90 31 3b 56 ef 33 62 57 5a 7f e1 fc ab e7 "
              "91 ee 37 5b dc "
              "12 3e 24 44 18 bc cd 54 41 a5 15 20 9a a7 ab b9 99 88 10 18 1e 89 99 81 81 08 90 "
              "99 91 98 81 12");
  }
}

TEST(MxVectors, V4Mxfp8) {
  for (const test::KernelPath& path : paths(kMxfp8Family)) {
    SCOPED_TRACE(path.name);
    const auto out = test::run_family(kMxfp8Family, mx_args(kMxfp8Family), DType::kBF16, 2, 64,
                                      v4_weight(), 0.0f, path);
    ASSERT_FALSE(out.bad);
    EXPECT_EQ(to_hex(out.rows_outputs[1]), "74 72 73 75");
    EXPECT_EQ(to_hex(out.rows_outputs[0]),
              "ee e4 70 cb 4c e9 63 7c 71 59 57 69 e3 69 b1 e5 55 e0 ee ea 5e 69 57 ee 69 59 4e "
              "e2 5d 6b ee 6c 77 76 fb f9 6d 6d 68 78 7a 75 e9 73 fb 7c 5c fa f0 fb ea e9 7a f9 "
              "5f e2 f6 f6 7b 6d eb 74 f1 f4 "
              "69 5c fa 6d 72 68 6f 72 d4 63 f0 ed f3 f2 71 74 5a 72 72 e7 74 63 53 69 ea e1 7d "
              "e4 eb ea de ec e0 e0 cd cd 50 59 d2 64 f6 5e d8 d3 dc de 59 c5 5c d4 c8 51 39 da "
              "dc db 5c e0 cc d9 5a d8 66 59");
  }
}

TEST(MxDequantize, CodesTimesPowerOfTwo) {
  const auto out = test::run_family(kMxfp8Family, mx_args(kMxfp8Family), DType::kBF16, 2, 64,
                                    v4_weight(), 0.0f, false);
  std::vector<float> values(128);
  DequantIo io;
  io.n_rows = 2;
  io.n_cols = 64;
  io.in = {out.rows_outputs[0].data(), out.rows_outputs[1].data()};
  io.values = values.data();
  kMxfp8Family.dequantize(mx_args(kMxfp8Family), io);
  // Row 0 column 7 is 0.1875, the group amax: 0.1875 / 2^-11 = 384 (code 0x7c), exact.
  EXPECT_EQ(values[7], 0.1875f);
  // Row 0 column 0 (0xee = -1.75 * 2^6) times 2^-11.
  EXPECT_EQ(values[0], -112.0f * 0x1p-11f);

  const auto fp4 = test::run_family(kMxfp4Family, mx_args(kMxfp4Family), DType::kBF16, 2, 64,
                                    v4_weight(), 0.0f, false);
  io.in = {fp4.rows_outputs[0].data(), fp4.rows_outputs[1].data()};
  kMxfp4Family.dequantize(mx_args(kMxfp4Family), io);
  // Row 0 byte 0x9c: column 0 code 0xc (-2), column 1 code 9 (-0.5), scale 2^-5.
  EXPECT_EQ(values[0], -2.0f * 0x1p-5f);
  EXPECT_EQ(values[1], -0.5f * 0x1p-5f);
  EXPECT_EQ(values[7], 6.0f * 0x1p-5f);  // 0.1875 / 2^-5 = 6
}

TEST(MxKernel, ReturnsTheFirstNonFiniteElement) {
  for (const SchemeFamily* f : {&kMxfp4Family, &kMxfp8Family}) {
    for (const test::KernelPath& path : paths(*f)) {
      std::vector<std::byte> w = v4_weight();
      const std::uint16_t nan = 0x7FC0;
      const std::uint16_t inf = 0xFF80;
      std::memcpy(w.data() + 2 * (64 + 33), &inf, 2);
      std::memcpy(w.data() + 2 * (64 + 40), &nan, 2);
      const auto out = test::run_family(*f, mx_args(*f), DType::kBF16, 2, 64, w, 0.0f, path);
      ASSERT_TRUE(out.bad) << f->id << " " << path.name;
      EXPECT_EQ(*out.bad, 64u + 33u) << f->id << " " << path.name;
    }
  }
}

// ---- the rows' rules and presets ----

TEST(MxFamilies, FormatInferenceFollowsCompressedTensorsPriority) {
  const QuantArgs fp4 = mx_args(kMxfp4Family);
  const QuantArgs fp8 = mx_args(kMxfp8Family);
  EXPECT_TRUE(kMxfp4Family.writes(fp4, false));
  EXPECT_FALSE(kMxfp4Family.writes(fp8, false));
  EXPECT_TRUE(kMxfp8Family.writes(fp8, true));
  EXPECT_FALSE(kMxfp8Family.writes(fp4, false));
  // mxfp8-quantized needs uint8 scales; mxfp4-pack-quantized does not look.
  QuantArgs fp8_no_u8 = fp8;
  fp8_no_u8.scale_dtype.reset();
  EXPECT_FALSE(kMxfp8Family.writes(fp8_no_u8, false));
  QuantArgs fp4_no_u8 = fp4;
  fp4_no_u8.scale_dtype.reset();
  EXPECT_TRUE(kMxfp4Family.writes(fp4_no_u8, false));
  test::expect_message(kMxfp4Family.supports(fp4_no_u8), {"torch.uint8"});
  EXPECT_EQ(kMxfp4Family.supports(fp4), "");
  EXPECT_EQ(kMxfp8Family.supports(fp8), "");
}

TEST(MxFamilies, PresetsWithAndWithoutDynamicMxInputs) {
  ASSERT_EQ(kMxfp4Family.presets.size(), 2u);
  EXPECT_EQ(kMxfp4Family.presets[0].name, "MXFP4A16");
  EXPECT_EQ(kMxfp4Family.presets[0].input_activations, "");
  EXPECT_EQ(kMxfp4Family.presets[1].name, "MXFP4");
  EXPECT_EQ(kMxfp4Family.presets[1].weights, kMxfp4Family.presets[0].weights);
  // schemes.md 6.2 / 6.3: the config group's input_activations, exactly.
  const auto mxfp4_inputs = nlohmann::json::parse(kMxfp4Family.presets[1].input_activations);
  EXPECT_EQ(mxfp4_inputs, nlohmann::json::parse(
                              R"({"actorder": null, "block_structure": null, "dynamic": true,
                                  "group_size": 32, "num_bits": 4, "observer": null,
                                  "observer_kwargs": {}, "scale_dtype": "torch.uint8",
                                  "strategy": "group", "symmetric": true, "type": "float",
                                  "zp_dtype": null})"));
  ASSERT_EQ(kMxfp8Family.presets.size(), 2u);
  EXPECT_EQ(kMxfp8Family.presets[0].name, "MXFP8A16");
  EXPECT_EQ(kMxfp8Family.presets[1].name, "MXFP8");
  EXPECT_EQ(nlohmann::json::parse(kMxfp8Family.presets[1].input_activations).at("num_bits"), 8);
}

TEST(MxFamilies, RefuseInFeaturesNotAMultipleOf32) {
  for (const SchemeFamily* f : {&kMxfp4Family, &kMxfp8Family}) {
    EXPECT_EQ(f->refuse(mx_args(*f), 64, 4096), "") << f->id;
    test::expect_message(f->refuse(mx_args(*f), 64, 4112), {"in_features 4112", "group size 32"});
  }
}

TEST(MxFamilies, OutputsAreCodesAndU8Exponents) {
  const auto fp4 = kMxfp4Family.outputs(mx_args(kMxfp4Family), DType::kBF16, 4096, 4096);
  ASSERT_EQ(fp4.size(), 2u);
  EXPECT_EQ(fp4[0].suffix, "weight_packed");
  EXPECT_EQ(fp4[0].shape, (std::vector<std::uint64_t>{4096, 2048}));
  EXPECT_EQ(fp4[1].suffix, "weight_scale");
  EXPECT_EQ(fp4[1].dtype, DType::kU8);
  EXPECT_EQ(fp4[1].shape, (std::vector<std::uint64_t>{4096, 128}));
  const auto fp8 = kMxfp8Family.outputs(mx_args(kMxfp8Family), DType::kF16, 4096, 4096);
  ASSERT_EQ(fp8.size(), 2u);
  EXPECT_EQ(fp8[0].suffix, "weight");
  EXPECT_EQ(fp8[0].dtype, DType::kF8_E4M3);
  EXPECT_EQ(fp8[0].shape, (std::vector<std::uint64_t>{4096, 4096}));
  EXPECT_EQ(fp8[1].dtype, DType::kU8);
  EXPECT_FALSE(kMxfp4Family.needs_tensor_amax(mx_args(kMxfp4Family)));
}

TEST(MxFamilies, VllmNeedsInFeaturesPerShardAMultipleOf32) {
  for (const SchemeFamily* f : {&kMxfp4Family, &kMxfp8Family}) {
    EXPECT_TRUE(f->vllm_shape_rule(mx_args(*f), 4096, 4096, Parallel::kRow).empty()) << f->id;
    const auto bad = f->vllm_shape_rule(mx_args(*f), 4096, 4080, Parallel::kRow);
    ASSERT_FALSE(bad.empty()) << f->id;
    EXPECT_TRUE(bad[0].unloadable);
    test::expect_message(bad[0].what, {"in_features 4080", "32"});
    EXPECT_EQ(f->vllm_args_rule(mx_args(*f)), "");
  }
}

// ---- golden cases, module by module ----

TEST(MxGolden, Mxfp4EveryModuleMatchesTensorByTensor) {
  const fs::path dir = test::golden_dir() / "llama-bf16-mxfp4a16";
  const auto input = test::read_checkpoint_tensors(dir / "input");
  const auto expected = test::read_checkpoint_tensors(dir / "expected");
  for (const test::KernelPath& path : paths(kMxfp4Family)) {
    for (const std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{5}}) {
      SCOPED_TRACE(fmt::format("{} chunk {}", path.name, chunk));
      const auto check = test::check_golden_modules(kMxfp4Family, mx_args(kMxfp4Family),
                                                    input.tensors, expected, {}, path, chunk);
      EXPECT_EQ(check.modules.size(), 7u);
      EXPECT_TRUE(check.differences.empty())
          << fmt::format("{}", fmt::join(check.differences, "\n"));
    }
  }
}

TEST(MxGolden, Mxfp8EveryModuleMatchesTensorByTensor) {
  const fs::path dir = test::golden_dir() / "llama-bf16-mxfp8a16";
  const auto input = test::read_checkpoint_tensors(dir / "input");
  const auto expected = test::read_checkpoint_tensors(dir / "expected");
  for (const test::KernelPath& path : paths(kMxfp8Family)) {
    for (const std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{5}}) {
      SCOPED_TRACE(fmt::format("{} chunk {}", path.name, chunk));
      const auto check = test::check_golden_modules(kMxfp8Family, mx_args(kMxfp8Family),
                                                    input.tensors, expected, {}, path, chunk);
      EXPECT_EQ(check.modules.size(), 7u);
      EXPECT_TRUE(check.differences.empty())
          << fmt::format("{}", fmt::join(check.differences, "\n"));
    }
  }
}

// ---- vector kernels against the references ----

std::vector<std::byte> store(DType t, const std::vector<float>& values) {
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(t) / 8);
  std::vector<std::byte> out(values.size() * esize);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const std::uint16_t b =
          t == DType::kBF16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

// Per group of 32: an amax across the dtype's exponent range with mantissas
// around the 1.75 round-up, the other elements at E2M1 ties (MXFP4) or
// E4M3 midpoints (MXFP8, subnormal codes included) times the group scale
// and their neighbours, tiny subnormals, -0.0, tiny negatives, all-zero
// groups. Every value is finite (the non-finite cases have their own test).
std::vector<float> adversarial(DType t, int offset, std::uint64_t rows, std::uint64_t cols,
                               std::mt19937& rng) {
  std::uniform_int_distribution<int> exponent(t == DType::kF16 ? -24 : -133,
                                              t == DType::kF16 ? 15 : 120);
  std::uniform_int_distribution<int> pick(0, 255);
  const float mantissas[] = {1.0f, 1.5f, 1.7421875f, 1.75f, 1.875f, 1.99609375f, 1.25f};
  std::vector<float> w(rows * cols, 0.0f);
  for (std::uint64_t g = 0; g < rows * cols / 32; ++g) {
    float* group = w.data() + g * 32;
    if (g % 7 == 0) continue;  // all zero
    const float amax = round_to_dtype(t, std::ldexp(mantissas[g % 7], exponent(rng)));
    group[g % 32] = g % 2 == 0 ? -amax : amax;
    const float scale = mx_scale(t, amax, offset).scale;
    for (int i = 0; i < 32; ++i) {
      if (static_cast<std::uint64_t>(i) == g % 32) continue;
      float q = 0.0f;
      if (offset == kMxfp4Offset) {
        const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 3.0f};
        q = ties[static_cast<std::size_t>(pick(rng)) % 10];
      } else {
        const unsigned c = static_cast<unsigned>(pick(rng)) % 0x7E;
        const float lo = f8_e4m3_to_float(static_cast<std::uint8_t>(c));
        const float hi = f8_e4m3_to_float(static_cast<std::uint8_t>(c + 1));
        q = lo + (hi - lo) / 2;
      }
      float v = round_to_dtype(t, q * scale);
      if (i % 4 == 1) v = round_to_dtype(t, std::nextafter(v, 0.0f));
      if (i % 4 == 2) v = round_to_dtype(t, std::nextafter(v, 1e30f));
      v = std::min(v, amax);
      group[i] = i % 3 == 0 ? -v : v;
    }
    if (g % 5 == 0) {
      group[(g + 1) % 32] = -0.0f;
      group[(g + 2) % 32] = std::max(round_to_dtype(t, -scale * 0.1f), -amax);
      group[(g + 3) % 32] = t == DType::kF16 ? f16_to_float(0x8001) : -0x1p-133f;
      group[(g + 4) % 32] = t == DType::kF16 ? f16_to_float(0x0003) : 0x1p-130f;
    }
  }
  return w;
}

TEST(MxKernel, FastPathsMatchReferencesOnAdversarialAndRandomWeights) {
  std::mt19937 rng(61);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const SchemeFamily* f : {&kMxfp4Family, &kMxfp8Family}) {
    const int offset = f == &kMxfp4Family ? kMxfp4Offset : kMxfp8Offset;
    for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (const std::uint64_t cols : {32u, 96u, 512u, 2080u}) {
        for (int trial = 0; trial < 3; ++trial) {
          const std::vector<std::byte> w = store(t, adversarial(t, offset, 6, cols, rng));
          const auto ref = test::run_family(*f, mx_args(*f), t, 6, cols, w, 0.0f, false);
          for (const test::KernelPath& path : paths(*f)) {
            SCOPED_TRACE(fmt::format("{} {} {} cols {}", f->id, path.name, dtype_tag(t), cols));
            const auto out = test::run_family(*f, mx_args(*f), t, 6, cols, w, 0.0f, path);
            EXPECT_EQ(test::first_difference(out, ref), "");
          }
        }
      }
      std::vector<float> values(5 * 4096);
      for (float& v : values) v = normal(rng);
      const std::vector<std::byte> w = store(t, values);
      const auto ref = test::run_family(*f, mx_args(*f), t, 5, 4096, w, 0.0f, false);
      for (const test::KernelPath& path : paths(*f)) {
        const auto out = test::run_family(*f, mx_args(*f), t, 5, 4096, w, 0.0f, path);
        EXPECT_EQ(test::first_difference(out, ref), "")
            << f->id << " " << path.name << " " << dtype_tag(t);
      }
    }
  }
}

// Every BF16 value of magnitude at most 6 through MXFP4 with scale 1: each
// group of 32 holds 6.0 (its amax: E8M0 byte 127) and 31 swept values, so
// every E2M1 rounding (each tie, each neighbour of a tie, subnormals, -0.0)
// is checked against e2m1_code() at every level, both signs.
TEST(MxKernel, EveryBf16ValueUpToSixGivesTheReferenceE2m1Code) {
  std::vector<float> values;
  std::uint32_t next = 0;
  const std::uint32_t last = 0x40C0;  // 6.0
  while (next <= last) {
    values.push_back(6.0f);
    for (int i = 0; i < 31; ++i) {
      const std::uint32_t bits = std::min(next, last);
      const float v = bf16_to_float(static_cast<std::uint16_t>(bits));
      values.push_back((next + static_cast<std::uint32_t>(i)) % 2 == 0 ? v : -v);
      ++next;
    }
  }
  const std::uint64_t rows = values.size() / 32;
  const std::vector<std::byte> w = store(DType::kBF16, values);
  const auto ref =
      test::run_family(kMxfp4Family, mx_args(kMxfp4Family), DType::kBF16, rows, 32, w, 0.0f, false);
  ASSERT_FALSE(ref.bad);
  // The scale byte of every group is 127 (2^0), so codes are e2m1_code(w).
  ASSERT_EQ(ref.rows_outputs.size(), 2u);
  EXPECT_EQ(std::to_integer<int>(ref.rows_outputs[1][0]), 127);
  EXPECT_EQ(std::to_integer<int>(ref.rows_outputs[1][rows - 1]), 127);
  for (const test::KernelPath& path : paths(kMxfp4Family)) {
    const auto out = test::run_family(kMxfp4Family, mx_args(kMxfp4Family), DType::kBF16, rows, 32,
                                      w, 0.0f, path);
    EXPECT_EQ(test::first_difference(out, ref), "") << path.name;
  }
}

TEST(MxKernel, FastPathsReportTheSameFirstNonFiniteElement) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const SchemeFamily* f : {&kMxfp4Family, &kMxfp8Family}) {
    for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (const std::uint64_t at : {0u, 31u, 32u, 33u, 500u, 2047u}) {
        std::vector<float> values(2 * 1024);
        for (float& v : values) v = normal(rng);
        values[at] = at % 2 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                 : -std::numeric_limits<float>::infinity();
        values[std::min<std::uint64_t>(at + 3, values.size() - 1)] =
            std::numeric_limits<float>::infinity();
        const std::vector<std::byte> w = store(t, values);
        const auto ref = test::run_family(*f, mx_args(*f), t, 2, 1024, w, 0.0f, false);
        ASSERT_TRUE(ref.bad);
        EXPECT_EQ(*ref.bad, at);
        for (const test::KernelPath& path : paths(*f)) {
          const auto out = test::run_family(*f, mx_args(*f), t, 2, 1024, w, 0.0f, path);
          EXPECT_EQ(ref.bad, out.bad)
              << f->id << " " << path.name << " " << dtype_tag(t) << " at " << at;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ctquant
