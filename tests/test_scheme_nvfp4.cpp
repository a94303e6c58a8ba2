// The nvfp4-pack-quantized family (src/scheme/nvfp4.cpp) and the fused sets
// that share its global scale (scheme/fused_sets.hpp): the test vectors V1
// and V2 of docs/schemes.md section 12 byte for byte, the global
// scale rules of section 5.3 (F16 overflow to 1.0), the golden NVFP4 cases
// module by module, model_free's fused-set grouping and its refusals, and
// the fast path and the vector kernel at every level this CPU runs against
// the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/minifloat.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/refused_presets.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/scheme/fused_sets.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "microscale_test_support.hpp"
#include "scheme/microscale.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::hex16;
using test::hex8;
using test::to_hex;

const SchemeFamily& family() { return kNvfp4Family; }
QuantArgs nvfp4() { return family().presets[0].weights; }
// The reference, the fast path and the vector kernel at every level this CPU runs.
std::vector<test::KernelPath> paths() {
  return test::all_paths(family(), microscale::Format::kNvfp4);
}

std::string f32_hex(const std::vector<std::byte>& bytes) {
  std::uint32_t u = 0;
  std::memcpy(&u, bytes.data(), 4);
  return fmt::format("{:08x}", u);
}

// ---- global scale (schemes.md 5.3 step 2) ----

TEST(Nvfp4GlobalScale, Bf16IsRoundedReciprocalTimes2688RoundedAgain) {
  // V1: amax 0.115234375 -> rbf16(1 / amax) = 8.6875, rbf16(8.6875 * 2688) = 23296.
  EXPECT_EQ(microscale::nvfp4_global_scale(DType::kBF16, 0.115234375f), 23296.0f);
  // F32: r32(1 / amax) * 2688 rounded to float32.
  EXPECT_EQ(microscale::nvfp4_global_scale(DType::kF32, 0.115234375f),
            (1.0f / 0.115234375f) * 2688.0f);
}

TEST(Nvfp4GlobalScale, F16OverflowFallsBackToOne) {
  // llama-f16-nvfp4a16: amax 0.03 -> 2688 / amax overflows F16 -> 1.0;
  // amax 0.042 -> 64000 (f16 values of the fixture's amax).
  EXPECT_EQ(microscale::nvfp4_global_scale(DType::kF16, f16_to_float(float_to_f16(0.03f))), 1.0f);
  EXPECT_EQ(microscale::nvfp4_global_scale(DType::kF16, f16_to_float(float_to_f16(0.042f))),
            64000.0f);
}

TEST(Nvfp4GlobalScale, AllZeroWeightGetsOne) {
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    EXPECT_EQ(microscale::nvfp4_global_scale(t, 0.0f), 1.0f) << dtype_tag(t);
  }
}

TEST(Nvfp4GroupScale, ZeroGroupGetsByte20) {
  EXPECT_EQ(microscale::nvfp4_group_scale(DType::kBF16, 23296.0f, 0.0f), 0x20);
  // gs * s <= 2^-10 rounds to FP8 zero and becomes 0.125 too.
  EXPECT_EQ(microscale::nvfp4_group_scale(DType::kBF16, 1.0f, 0x1p-10f * 6.0f), 0x20);
  EXPECT_EQ(microscale::nvfp4_group_scale(DType::kBF16, 1.0f, 0x1p-9f * 6.0f), 0x01);
}

TEST(Nvfp4GroupScale, LargeProductsClampTo448) {
  EXPECT_EQ(microscale::nvfp4_group_scale(DType::kBF16, 1e6f, 1.0f), 0x7E);
}

// ---- test vectors (schemes.md 12) ----

constexpr const char* kV1Row0 =
    "b8d2 8000 bc4d bcb2 3d2e 3d0e bc81 bdd9 3c84 bd81 3c8f 3c7c 3bc4 3d7d 3d65 bc4b "
    "bd8b bdae 3ce8 3d23 3cf5 bd9f bc8c 3dbe 3d1a bcf0 bc0e 3c16 3d8e 3da2 3d42 bd2d";
constexpr const char* kV1Row1 =
    "bcfb 3acf bcca 3c4c 3cb4 3bb8 3d03 3cb5 bba8 3d22 bc6d 3b2c 3cd6 3dec bd96 bda2 "
    "0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000";

std::vector<std::byte> v1_weight() {
  std::vector<std::byte> w = hex16(kV1Row0);
  const std::vector<std::byte> row1 = hex16(kV1Row1);
  w.insert(w.end(), row1.begin(), row1.end());
  return w;
}

TEST(Nvfp4Vectors, V1UnfusedLinear) {
  const std::vector<std::byte> w = v1_weight();
  const float amax = test::weight_amax(DType::kBF16, w);
  EXPECT_EQ(amax, 0.115234375f);
  for (const test::KernelPath& path : paths()) {
    SCOPED_TRACE(path.name);
    const test::KernelOutput out =
        test::run_family(family(), nvfp4(), DType::kBF16, 2, 32, w, amax, path);
    ASSERT_FALSE(out.bad);
    EXPECT_EQ(to_hex(out.rows_outputs[1]), "7d 7b 7e 20");
    EXPECT_EQ(to_hex(out.rows_outputs[0]),
              "08 a9 44 fa e2 22 51 95 fe 54 f4 7a c4 19 76 d5 "
              "0b 1b 12 23 49 0a 73 ee 00 00 00 00 00 00 00 00");
    ASSERT_EQ(out.whole.size(), 1u);
    EXPECT_EQ(f32_hex(out.whole[0]), "46b60000");  // 23296.0
  }
}

TEST(Nvfp4Vectors, V2FusedQkvShareOneGlobalScale) {
  const std::map<std::string, std::vector<std::byte>> weights = {
      {"model.layers.0.self_attn.q_proj.weight",
       hex16("bac9 3bec bc80 3abc 3c5a bbbc 3d05 bd03 ba87 bbc9 3ba3 bb92 3c96 3b86 3c3c 3c08 "
             "3bab 3c99 bc29 bd07 3cab 3c2b bb5b 3a8b 3c39 3d39 3d19 bcc4 3ca3 3c16 3d48 bb40")},
      {"model.layers.0.self_attn.k_proj.weight",
       hex16("bcc3 bc70 bc8f 3c8f 3af3 bb5e 3cb0 bd32 bc5e 3be8 3bd4 3d0c bd44 3b51 3d07 3d28")},
      {"model.layers.0.self_attn.v_proj.weight",
       hex16("bb95 3cb5 bb77 babc 3bd4 bcbf 3c50 bb23 3c1d bc53 bc87 3c08 bc09 bbae 3c5e 3c62")},
  };
  std::vector<std::string> names;
  for (const auto& [name, w] : weights) names.push_back(name);
  const FusedSets sets = fused_sets(names);
  ASSERT_EQ(sets.sets.size(), 1u);
  EXPECT_EQ(sets.sets[0], (std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight",
                                                    "model.layers.0.self_attn.k_proj.weight",
                                                    "model.layers.0.self_attn.v_proj.weight"}));
  float set_amax = 0.0f;
  for (const std::string& name : sets.sets[0]) {
    set_amax = std::max(set_amax, test::weight_amax(DType::kBF16, weights.at(name)));
  }
  const struct {
    const char* name;
    std::uint64_t rows;
    const char* scale;
    const char* packed;
  } expected[] = {
      {"model.layers.0.self_attn.q_proj.weight", 2, "79 7e",
       "39 1d a5 f7 a8 a2 25 34 41 eb 35 09 73 d6 24 97"},
      {"model.layers.0.self_attn.k_proj.weight", 1, "7e", "cd 4c 90 f5 2b 62 1f 76"},
      {"model.layers.0.self_attn.v_proj.weight", 1, "75", "7a 9a f3 95 d5 4e bc 66"},
  };
  for (const test::KernelPath& path : paths()) {
    for (const auto& e : expected) {
      SCOPED_TRACE(fmt::format("{} {}", e.name, path.name));
      const test::KernelOutput out = test::run_family(family(), nvfp4(), DType::kBF16, e.rows, 16,
                                                      weights.at(e.name), set_amax, path);
      ASSERT_FALSE(out.bad);
      EXPECT_EQ(f32_hex(out.whole[0]), "47570000");  // 55040.0
      EXPECT_EQ(to_hex(out.rows_outputs[1]), e.scale);
      EXPECT_EQ(to_hex(out.rows_outputs[0]), e.packed);
    }
  }
  // v_proj alone would get 115712.0 and scale 7e (schemes.md 12, derived).
  const std::vector<std::byte>& v = weights.at("model.layers.0.self_attn.v_proj.weight");
  const test::KernelOutput alone = test::run_family(family(), nvfp4(), DType::kBF16, 1, 16, v,
                                                    test::weight_amax(DType::kBF16, v), false);
  EXPECT_EQ(f32_hex(alone.whole[0]), "47e20000");  // 115712.0
  EXPECT_EQ(to_hex(alone.rows_outputs[1]), "7e");
}

TEST(Nvfp4Kernel, ReturnsTheFirstNonFiniteElement) {
  for (const test::KernelPath& path : paths()) {
    for (const std::uint16_t bad :
         {std::uint16_t{0x7FC0}, std::uint16_t{0x7F80}, std::uint16_t{0xFF80}}) {
      std::vector<std::byte> w = v1_weight();
      std::memcpy(w.data() + 2 * (32 + 21), &bad, 2);  // row 1, column 21
      std::memcpy(w.data() + 2 * (32 + 30), &bad, 2);
      const test::KernelOutput out =
          test::run_family(family(), nvfp4(), DType::kBF16, 2, 32, w, 0.1f, path);
      ASSERT_TRUE(out.bad) << path.name << " " << bad;
      EXPECT_EQ(*out.bad, 32u + 21u) << bad;
    }
  }
}

TEST(Nvfp4Dequantize, CodesTimesScaleOverGlobalScale) {
  const std::vector<std::byte> w = v1_weight();
  const test::KernelOutput out =
      test::run_family(family(), nvfp4(), DType::kBF16, 2, 32, w, 0.115234375f, false);
  std::vector<float> values(64);
  DequantIo io;
  io.dtype = DType::kBF16;
  io.n_rows = 2;
  io.n_cols = 32;
  io.in = {out.rows_outputs[0].data(), out.rows_outputs[1].data()};
  io.whole = {out.whole[0].data()};
  io.values = values.data();
  family().dequantize(nvfp4(), io);
  // Row 0 byte 0x08: column 0 is code 8 (-0.0), column 1 code 0 (+0.0);
  // byte 0xa9: -0.5 and -1.0 times 416 (scale 0x7d) / 23296.
  const float divisor = 416.0f / 23296.0f;
  EXPECT_EQ(std::bit_cast<std::uint32_t>(values[0]), 0x80000000u);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(values[1]), 0u);
  EXPECT_EQ(values[2], -0.5f * divisor);
  EXPECT_EQ(values[3], -1.0f * divisor);
  // Row 1, group 1 (all zero, scale 0x20): zeros.
  for (int c = 48; c < 64; ++c) EXPECT_EQ(values[c], 0.0f);
  // Every value is within half an FP4 step (at most 1.0 * divisor) of the input.
  for (int i = 0; i < 64; ++i) {
    const float x = load_as_float(DType::kBF16, w.data() + 2 * i);
    const float d = microscale::nvfp4_divisor(
        std::to_integer<std::uint8_t>(out.rows_outputs[1][static_cast<std::size_t>(i / 16)]),
        23296.0f);
    EXPECT_LE(std::fabs(values[i] - x), d) << i;
  }
}

// ---- the row's rules ----

TEST(Nvfp4Family, RefusesInFeaturesNotAMultipleOf16) {
  EXPECT_EQ(family().refuse(nvfp4(), 64, 128), "");
  test::expect_message(family().refuse(nvfp4(), 64, 72), {"in_features 72", "group size 16"});
}

TEST(Nvfp4Family, WritesFp4GroupsOf16AndSupportsOnlyTheNvfp4Args) {
  EXPECT_TRUE(family().writes(nvfp4(), false));
  EXPECT_EQ(family().supports(nvfp4()), "");
  QuantArgs group = nvfp4();
  group.strategy = QuantArgs::Strategy::kGroup;
  EXPECT_TRUE(family().writes(group, false));  // compressed-tensors picks the format...
  test::expect_message(family().supports(group), {"tensor_group"});  // ...ctquant refuses it
  QuantArgs fp8_scales_missing = nvfp4();
  fp8_scales_missing.scale_dtype.reset();
  test::expect_message(family().supports(fp8_scales_missing), {"float8_e4m3fn"});
  QuantArgs g32 = nvfp4();
  g32.group_size = 32;
  EXPECT_FALSE(family().writes(g32, false));
  ASSERT_EQ(family().presets.size(), 2u);
  EXPECT_EQ(family().presets[0].name, "NVFP4A16");
  EXPECT_EQ(family().presets[0].input_activations, "");
  EXPECT_EQ(family().presets[0].refused, "");
  EXPECT_EQ(family().presets[1].name, "NVFP4");
  test::expect_message(std::string(family().presets[1].refused),
                       {"Model Free PTQ cannot calibrate activations", "NVFP4A16"});
}

// The NVFP4 (W4A4) refusal has one home, its preset in this row: the
// refused-preset list does not repeat it, and --scheme NVFP4 says it.
TEST(Nvfp4Family, RefusedNvfp4PresetIsExplainedByItsRowOnly) {
  EXPECT_EQ(refused_preset("NVFP4"), nullptr);
  const Preset* p = find_preset("nvfp4");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->refused, family().presets[1].refused);
  try {
    preset_group("NVFP4");
    ADD_FAILURE() << "NVFP4 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    test::expect_message(e.what(), {"scheme 'NVFP4' is not written", std::string(p->refused)});
  }
}

TEST(Nvfp4Family, OutputsPackedCodesFp8ScalesAndAGlobalScale) {
  const auto specs = family().outputs(nvfp4(), DType::kBF16, 4096, 14336);
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].suffix, "weight_packed");
  EXPECT_EQ(specs[0].dtype, DType::kU8);
  EXPECT_EQ(specs[0].shape, (std::vector<std::uint64_t>{4096, 7168}));
  EXPECT_EQ(specs[0].bytes_before(3), 3u * 7168u);
  EXPECT_EQ(specs[1].suffix, "weight_scale");
  EXPECT_EQ(specs[1].dtype, DType::kF8_E4M3);
  EXPECT_EQ(specs[1].shape, (std::vector<std::uint64_t>{4096, 896}));
  EXPECT_EQ(specs[2].suffix, "weight_global_scale");
  EXPECT_EQ(specs[2].dtype, DType::kF32);
  EXPECT_EQ(specs[2].shape, (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(specs[2].fill, OutputTensorSpec::Fill::kWhole);
  EXPECT_TRUE(family().needs_tensor_amax(nvfp4()));
}

TEST(Nvfp4Family, VllmNeedsInFeaturesPerShardAMultipleOf16) {
  EXPECT_TRUE(family().vllm_shape_rule(nvfp4(), 4096, 4096, Parallel::kColumn).empty());
  // down_proj 14336 split over 3 ranks is not whole; 14336 / 7 = 2048 is.
  const auto bad = family().vllm_shape_rule(nvfp4(), 4096, 4104, Parallel::kRow);
  ASSERT_FALSE(bad.empty());
  EXPECT_TRUE(bad[0].unloadable);
  test::expect_message(bad[0].what, {"in_features 4104", "16"});
  // Not a Marlin tile: only old releases fail.
  const auto tile = family().vllm_shape_rule(nvfp4(), 96, 4096, Parallel::kColumn);
  ASSERT_EQ(tile.size(), 1u);
  EXPECT_FALSE(tile[0].unloadable);
  EXPECT_EQ(family().vllm_args_rule(nvfp4()), "");
}

// ---- fused sets (schemes.md 7) ----

std::vector<std::string> names_of(const std::vector<std::vector<std::string>>& sets) {
  std::vector<std::string> out;
  for (const auto& s : sets) out.push_back(fmt::format("{}", fmt::join(s, " + ")));
  return out;
}

TEST(FusedSets, QkvAndGateUpOfEachLayerInNaturalOrder) {
  const std::vector<std::string> names = {
      "model.layers.10.self_attn.q_proj.weight", "model.layers.10.self_attn.k_proj.weight",
      "model.layers.10.self_attn.v_proj.weight", "model.layers.2.self_attn.v_proj.weight",
      "model.layers.2.self_attn.k_proj.weight",  "model.layers.2.self_attn.q_proj.weight",
      "model.layers.2.self_attn.o_proj.weight",  "model.layers.2.mlp.up_proj.weight",
      "model.layers.2.mlp.gate_proj.weight",     "model.layers.2.mlp.down_proj.weight",
      "model.layers.2.input_layernorm.weight",   "lm_head.weight"};
  const FusedSets sets = fused_sets(names);
  EXPECT_EQ(names_of(sets.sets),
            (std::vector<std::string>{
                "model.layers.2.self_attn.q_proj.weight + model.layers.2.self_attn.k_proj.weight "
                "+ model.layers.2.self_attn.v_proj.weight",
                "model.layers.10.self_attn.q_proj.weight + "
                "model.layers.10.self_attn.k_proj.weight + "
                "model.layers.10.self_attn.v_proj.weight",
                "model.layers.2.mlp.gate_proj.weight + model.layers.2.mlp.up_proj.weight"}));
  EXPECT_TRUE(sets.incomplete.empty());
}

TEST(FusedSets, SplitExpertsSharedExpertsAndDeepseekMlaAreNotFused) {
  const std::vector<std::string> names = {
      "model.layers.0.mlp.experts.0.gate_proj.weight",
      "model.layers.0.mlp.experts.0.up_proj.weight",
      "model.layers.0.mlp.shared_experts.gate_proj.weight",
      "model.layers.0.mlp.shared_experts.up_proj.weight",
      "model.layers.0.feed_forward.gate_proj.weight",
      "model.layers.0.feed_forward.up_proj.weight",
      "model.layers.0.self_attn.q_a_proj.weight",
      "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
      "layers.0.attention.wq.weight",
      "layers.0.attention.wk.weight",
      "layers.0.attention.wv.weight",
  };
  const FusedSets sets = fused_sets(names);
  EXPECT_TRUE(sets.sets.empty()) << fmt::format("{}", fmt::join(names_of(sets.sets), "; "));
}

TEST(FusedSets, MistralMlaAndMixtralExpertsAreFused) {
  const std::vector<std::string> names = {
      "layers.0.attention.wq_a.weight",
      "layers.0.attention.wkv_a_with_mqa.weight",
      "model.layers.0.block_sparse_moe.experts.1.w1.weight",
      "model.layers.0.block_sparse_moe.experts.1.w2.weight",
      "model.layers.0.block_sparse_moe.experts.1.w3.weight",
      "model.layers.0.block_sparse_moe.experts.0.w3.weight",
      "model.layers.0.block_sparse_moe.experts.0.w1.weight",
  };
  const FusedSets sets = fused_sets(names);
  EXPECT_EQ(names_of(sets.sets),
            (std::vector<std::string>{
                "layers.0.attention.wq_a.weight + layers.0.attention.wkv_a_with_mqa.weight",
                "model.layers.0.block_sparse_moe.experts.0.w1.weight + "
                "model.layers.0.block_sparse_moe.experts.0.w3.weight",
                "model.layers.0.block_sparse_moe.experts.1.w1.weight + "
                "model.layers.0.block_sparse_moe.experts.1.w3.weight"}));
}

TEST(FusedSets, IncompleteSetsAreReported) {
  const std::vector<std::string> names = {"model.layers.3.self_attn.k_proj.weight",
                                          "model.layers.3.self_attn.v_proj.weight"};
  const FusedSets sets = fused_sets(names);
  EXPECT_TRUE(sets.sets.empty());
  ASSERT_EQ(sets.incomplete.size(), 1u);
  EXPECT_EQ(sets.incomplete[0],
            (std::vector<std::string>{"", "model.layers.3.self_attn.k_proj.weight",
                                      "model.layers.3.self_attn.v_proj.weight"}));
}

TEST(FusedSets, SlotFilledTwiceBeforeTheSetCompletesIsRefused) {
  // schemes.md 7.3: a job holding layer 10's k/v (q elsewhere), then layer 11's k_proj.
  const std::vector<std::string> names = {"model.layers.10.self_attn.k_proj.weight",
                                          "model.layers.10.self_attn.v_proj.weight",
                                          "model.layers.11.self_attn.k_proj.weight"};
  try {
    fused_sets(names);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    test::expect_message(e.what(), {R"(Matched a re:.*(attn|attention)\.k_proj\.weight$ twice)",
                                    "(model.layers.10.self_attn.k_proj.weight, "
                                    "model.layers.11.self_attn.k_proj.weight)"});
  }
}

TEST(FusedSets, NaturalOrderComparesDigitRunsAsNumbers) {
  // Layer 9 sorts before layer 10 (as text it would not), so each set is
  // complete before the next starts.
  std::vector<std::string> names;
  for (const int layer : {10, 9, 100, 11}) {
    for (const char* p : {"gate_proj", "up_proj"}) {
      names.push_back(fmt::format("model.layers.{}.mlp.{}.weight", layer, p));
    }
  }
  const FusedSets sets = fused_sets(names);
  ASSERT_EQ(sets.sets.size(), 4u);
  EXPECT_EQ(sets.sets[0][0], "model.layers.9.mlp.gate_proj.weight");
  EXPECT_EQ(sets.sets[1][0], "model.layers.10.mlp.gate_proj.weight");
  EXPECT_EQ(sets.sets[2][0], "model.layers.11.mlp.gate_proj.weight");
  EXPECT_EQ(sets.sets[3][0], "model.layers.100.mlp.gate_proj.weight");
}

TEST(FusedPartners, PrimariesFetchTheirPartners) {
  EXPECT_EQ(fused_partners("model.layers.0.self_attn.q_proj.weight"),
            (std::vector<std::string>{"model.layers.0.self_attn.k_proj.weight",
                                      "model.layers.0.self_attn.v_proj.weight"}));
  EXPECT_EQ(fused_partners("model.layers.0.feed_forward.gate_proj.weight"),
            (std::vector<std::string>{"model.layers.0.feed_forward.up_proj.weight"}));
  EXPECT_EQ(fused_partners("layers.0.attn.wq_a.weight"),
            (std::vector<std::string>{"layers.0.attn.wkv_a_with_mqa.weight"}));
  EXPECT_EQ(fused_partners("model.layers.0.mlp.experts.3.w1.weight"),
            (std::vector<std::string>{"model.layers.0.mlp.experts.3.w3.weight"}));
  // Split experts and cross_attn q_proj fetch nothing; nor does a partner.
  EXPECT_TRUE(fused_partners("model.layers.0.mlp.experts.3.gate_proj.weight").empty());
  EXPECT_TRUE(fused_partners("model.layers.0.cross_attn.q_proj.weight").empty());
  EXPECT_TRUE(fused_partners("model.layers.0.self_attn.k_proj.weight").empty());
  EXPECT_TRUE(fused_partners("q_proj.weight").empty());
}

TEST(MicroscaleJobs, PartnersMoveIntoTheJobOfTheirPrimary) {
  const auto weight_map =
      test::input_weight_map(test::golden_dir() / "sharded-bf16-nvfp4a16" / "input");
  const auto jobs = microscale_job_names(weight_map);
  ASSERT_EQ(jobs.size(), 3u);
  const auto& first = jobs.at("model-00001-of-00003.safetensors");
  for (const char* moved :
       {"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.1.mlp.up_proj.weight"}) {
    EXPECT_NE(std::find(first.begin(), first.end(), moved), first.end()) << moved;
    const auto& third = jobs.at("model-00003-of-00003.safetensors");
    EXPECT_EQ(std::find(third.begin(), third.end(), moved), third.end()) << moved;
  }
}

TEST(MicroscaleJobs, MissingPartnersAndPartnerOnlyShardsLeaveSmallerSets) {
  // model_free_ptq refuses both layouts; the jobs hold what exists.
  const std::vector<std::pair<std::string, std::string>> no_w3 = {
      {"model.layers.0.mlp.experts.0.w1.weight", "a.safetensors"}};
  EXPECT_EQ(microscale_job_names(no_w3),
            (std::map<std::string, std::vector<std::string>>{
                {"a.safetensors", {"model.layers.0.mlp.experts.0.w1.weight"}}}));
  const std::vector<std::pair<std::string, std::string>> partner_only = {
      {"model.layers.0.self_attn.q_proj.weight", "a.safetensors"},
      {"model.layers.0.self_attn.k_proj.weight", "b.safetensors"},
      {"model.layers.0.self_attn.v_proj.weight", "b.safetensors"}};
  EXPECT_EQ(
      microscale_job_names(partner_only),
      (std::map<std::string, std::vector<std::string>>{
          {"a.safetensors",
           {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight"}}}));
}

// ---- the plan's amax sets ----

// Each amax set of a plan as the sorted names of its modules.
std::set<std::vector<std::string>> amax_sets(const std::string& golden_case,
                                             const PlanOptions& options) {
  const QuantizePlan plan =
      make_plan(open_checkpoint(test::golden_dir() / golden_case / "input"), options);
  std::set<std::vector<std::string>> out;
  for (const std::vector<std::size_t>& set : plan.amax_sets) {
    std::vector<std::string> names;
    for (const std::size_t m : set) names.push_back(plan.modules[m].name);
    std::sort(names.begin(), names.end());
    out.insert(names);
  }
  return out;
}

PlanOptions nvfp4_options(std::vector<std::string> ignore) {
  PlanOptions o;
  o.groups = {preset_group("NVFP4A16")};
  o.ignore = std::move(ignore);
  return o;
}

TEST(Nvfp4Plan, FusedPartnersInOtherShardsShareOneAmax) {
  const auto sets =
      amax_sets("sharded-bf16-nvfp4a16", nvfp4_options({"lm_head", "model.embed_tokens"}));
  std::set<std::vector<std::string>> expected;
  for (const std::string l : {"0", "1"}) {
    const std::string p = "model.layers." + l + ".";
    expected.insert({p + "self_attn.k_proj", p + "self_attn.q_proj", p + "self_attn.v_proj"});
    expected.insert({p + "mlp.gate_proj", p + "mlp.up_proj"});
    expected.insert({p + "self_attn.o_proj"});
    expected.insert({p + "mlp.down_proj"});
  }
  EXPECT_EQ(sets, expected);
}

TEST(Nvfp4Plan, SplitExpertsEachHaveTheirOwnAmax) {
  const auto sets = amax_sets("qwen3moe-fused-bf16-nvfp4a16",
                              nvfp4_options({"lm_head", "model.embed_tokens", "re:.*mlp.gate$"}));
  const std::string p = "model.layers.0.";
  EXPECT_TRUE(
      sets.contains({p + "self_attn.k_proj", p + "self_attn.q_proj", p + "self_attn.v_proj"}));
  for (int e = 0; e < 4; ++e) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const std::string m = fmt::format("{}mlp.experts.{}.{}", p, e, proj);
      EXPECT_TRUE(sets.contains({m})) << m;
    }
  }
  EXPECT_EQ(sets.size(), 1u + 1u + 12u);  // q/k/v, o_proj, the experts
}

TEST(Nvfp4Plan, OnlyQuantizedNvfp4MembersShareTheAmax) {
  // k_proj ignored: q and v still share one amax (model_free fuses the
  // quantized members of a complete set).
  const auto ignored = amax_sets("llama-bf16-nvfp4a16",
                                 nvfp4_options({"lm_head", "model.embed_tokens", "re:.*k_proj$"}));
  EXPECT_TRUE(
      ignored.contains({"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"}));
  // gate/up under W4A16: no amax at all; q/k/v under NVFP4 still share one.
  PlanOptions mixed;
  SchemeGroup attention = preset_group("NVFP4A16");
  attention.name = "attention";
  attention.targets = {"re:.*self_attn.*"};
  SchemeGroup mlp = preset_group("W4A16");
  mlp.name = "mlp";
  mlp.targets = {"re:.*mlp.*"};
  mixed.groups = {attention, mlp};
  mixed.ignore = {"lm_head", "model.embed_tokens"};
  EXPECT_EQ(amax_sets("llama-bf16-nvfp4a16", mixed),
            (std::set<std::vector<std::string>>{
                {"model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.q_proj",
                 "model.layers.0.self_attn.v_proj"},
                {"model.layers.0.self_attn.o_proj"}}));
}

// ---- golden cases, module by module ----

// Every quantized module's tensor_amax: max |w| over the members of its
// fused set that are quantized (schemes.md 5.3, 7), sets computed per
// model_free job after the MoE split.
std::map<std::string, float> fused_amax(const fs::path& input_dir,
                                        const std::map<std::string, test::Tensor>& raw,
                                        const std::map<std::string, test::Tensor>& split,
                                        const std::set<std::string>& quantized) {
  std::map<std::string, float> amax;
  for (const std::string& m : quantized) {
    const test::Tensor& w = split.at(m + ".weight");
    amax[m] = test::weight_amax(w.dtype, w.data);
  }
  const auto module_of = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  for (const auto& [shard, names] : microscale_job_names(test::input_weight_map(input_dir))) {
    std::map<std::string, test::Tensor> job;
    for (const std::string& n : names) job.emplace(n, raw.at(n));
    test::split_moe_experts(job);
    std::vector<std::string> job_names;
    for (const auto& [n, t] : job) job_names.push_back(n);
    for (const std::vector<std::string>& set : fused_sets(job_names).sets) {
      float shared = 0.0f;
      for (const std::string& n : set) {
        if (quantized.count(module_of(n)) != 0) shared = std::max(shared, amax.at(module_of(n)));
      }
      for (const std::string& n : set) {
        if (quantized.count(module_of(n)) != 0) amax[module_of(n)] = shared;
      }
    }
  }
  return amax;
}

struct GoldenCase {
  const char* name;
  std::size_t modules;
};
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }

class Nvfp4Golden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Nvfp4Golden, EveryModuleMatchesTensorByTensor) {
  const fs::path dir = test::golden_dir() / GetParam().name;
  const test::CheckpointTensors input = test::read_checkpoint_tensors(dir / "input");
  std::map<std::string, test::Tensor> split = input.tensors;
  test::split_moe_experts(split);
  const test::CheckpointTensors expected = test::read_checkpoint_tensors(dir / "expected");
  std::set<std::string> quantized;
  for (const auto& [name, t] : expected.tensors) {
    if (name.ends_with(".weight_scale")) quantized.insert(name.substr(0, name.size() - 13));
  }
  const auto amax = fused_amax(dir / "input", input.tensors, split, quantized);
  for (const test::KernelPath& path : paths()) {
    for (const std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{3}}) {
      SCOPED_TRACE(fmt::format("{} chunk {}", path.name, chunk));
      const test::GoldenCheck check =
          test::check_golden_modules(family(), nvfp4(), split, expected, amax, path, chunk);
      EXPECT_EQ(check.modules.size(), GetParam().modules);
      EXPECT_TRUE(check.differences.empty())
          << fmt::format("{}", fmt::join(check.differences, "\n"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Nvfp4Golden,
                         ::testing::Values(GoldenCase{"llama-bf16-nvfp4a16", 7},
                                           GoldenCase{"llama-f16-nvfp4a16", 14},
                                           GoldenCase{"sharded-bf16-nvfp4a16", 14},
                                           GoldenCase{"qwen3moe-fused-bf16-nvfp4a16", 16}),
                         [](const auto& param_info) {
                           std::string n = param_info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(Nvfp4GoldenScales, F16SetsGetOneAnd64000AndExpertsTheirOwnScale) {
  // The fixtures' global scales, read back: llama-f16 layer 0 q/k/v share
  // 1.0 (F16 overflow), layer 1 q/k/v share 64000.
  const test::CheckpointTensors f16 =
      test::read_checkpoint_tensors(test::golden_dir() / "llama-f16-nvfp4a16" / "expected");
  const auto gs = [&](const test::CheckpointTensors& c, const std::string& m) {
    float v = 0.0f;
    std::memcpy(&v, c.tensors.at(m + ".weight_global_scale").data.data(), 4);
    return v;
  };
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    EXPECT_EQ(gs(f16, fmt::format("model.layers.0.self_attn.{}", p)), 1.0f) << p;
    EXPECT_EQ(gs(f16, fmt::format("model.layers.1.self_attn.{}", p)), 64000.0f) << p;
  }
  const test::CheckpointTensors moe = test::read_checkpoint_tensors(
      test::golden_dir() / "qwen3moe-fused-bf16-nvfp4a16" / "expected");
  std::set<float> expert_scales;
  for (int e = 0; e < 4; ++e) {
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      expert_scales.insert(gs(moe, fmt::format("model.layers.0.mlp.experts.{}.{}", e, p)));
    }
  }
  EXPECT_GT(expert_scales.size(), 1u);  // not one shared value
}

// ---- vector kernels against the reference ----

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

// Weights built to hit every rounding threshold: per group, one element at
// the group amax and the others at tie * divisor for each E2M1 tie (and
// their neighbours in W), all-zero groups, -0.0, tiny negatives, subnormal
// scales (gs * s below 2^-6) and values at the FP8 scale limit.
std::vector<float> adversarial(DType t, std::uint64_t rows, std::uint64_t cols, float tensor_amax,
                               std::mt19937& rng) {
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> w(rows * cols, 0.0f);
  const float gs = microscale::nvfp4_global_scale(t, tensor_amax);
  for (std::uint64_t g = 0; g < rows * cols / 16; ++g) {
    float* group = w.data() + g * 16;
    const int kind = static_cast<int>(g % 6);
    if (kind == 0) continue;  // all zero
    // The group amax, from the tensor amax down to tiny fractions of it.
    float amax =
        round_to_dtype(t, tensor_amax * std::ldexp(unit(rng) + 0.5f, -static_cast<int>(g % 24)));
    amax = std::min(amax, tensor_amax);
    if (g == 0) amax = tensor_amax;
    group[0] = kind % 2 == 0 ? -amax : amax;
    const float divisor = microscale::nvfp4_divisor(microscale::nvfp4_group_scale(t, gs, amax), gs);
    for (int i = 1; i < 16; ++i) {
      const float tie = ties[static_cast<std::size_t>(i) % 8] * divisor;
      float v = round_to_dtype(t, tie);
      if (kind == 3) v = std::nextafter(v, 0.0f);
      if (kind == 4) v = std::nextafter(v, 1e30f);
      v = round_to_dtype(t, std::min(v, amax));
      group[i] = i % 3 == 0 ? -v : v;
    }
    if (kind == 5) {
      group[1] = -0.0f;
      group[2] = -round_to_dtype(t, divisor * 0.1f);  // tiny negative: nibble 8
      group[3] = round_to_dtype(t, -1e-30f);
    }
  }
  return w;
}

TEST(Nvfp4Kernel, FastPathMatchesReferenceOnAdversarialAndRandomWeights) {
  std::mt19937 rng(20260822);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const float tensor_amax : {0.1f, 3.0f, 0.03f, 1e-3f, 6e4f, 1e-30f}) {
      if (t == DType::kF16 && (tensor_amax > 6e4f || tensor_amax < 1e-7f)) continue;
      const float a = round_to_dtype(t, tensor_amax);
      for (const std::uint64_t cols : {16u, 48u, 256u, 1040u}) {
        const std::uint64_t rows = 5;
        std::vector<float> values = adversarial(t, rows, cols, a, rng);
        const std::vector<std::byte> w = store(t, values);
        const auto ref = test::run_family(family(), nvfp4(), t, rows, cols, w, a, false);
        for (const test::KernelPath& path : paths()) {
          SCOPED_TRACE(fmt::format("{} {} amax {} cols {}", path.name, dtype_tag(t), a, cols));
          const auto out = test::run_family(family(), nvfp4(), t, rows, cols, w, a, path);
          EXPECT_EQ(test::first_difference(out, ref), "");
        }
      }
    }
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<float> values(7 * 4096);
      for (float& v : values) v = normal(rng);
      const std::vector<std::byte> w = store(t, values);
      const float a = test::weight_amax(t, w);
      const auto ref = test::run_family(family(), nvfp4(), t, 7, 4096, w, a, false);
      for (const test::KernelPath& path : paths()) {
        const auto out = test::run_family(family(), nvfp4(), t, 7, 4096, w, a, path);
        EXPECT_EQ(test::first_difference(out, ref), "") << path.name << " " << dtype_tag(t);
      }
    }
  }
}

TEST(Nvfp4Kernel, FastPathReportsTheSameFirstNonFiniteElement) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const std::uint64_t at : {0u, 15u, 16u, 17u, 250u, 1023u, 4095u}) {
      for (const float bad :
           {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            -std::numeric_limits<float>::infinity()}) {
        std::vector<float> values(4 * 1024);
        for (float& v : values) v = normal(rng);
        values[at] = bad;
        values[std::min<std::uint64_t>(at + 40, values.size() - 1)] = bad;
        const std::vector<std::byte> w = store(t, values);
        const auto ref = test::run_family(family(), nvfp4(), t, 4, 1024, w, 0.1f, false);
        ASSERT_TRUE(ref.bad);
        EXPECT_EQ(*ref.bad, at);
        for (const test::KernelPath& path : paths()) {
          const auto out = test::run_family(family(), nvfp4(), t, 4, 1024, w, 0.1f, path);
          EXPECT_EQ(ref.bad, out.bad) << path.name << " " << dtype_tag(t) << " at " << at;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ctquant
