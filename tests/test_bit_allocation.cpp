// --target-bits and --more-bits layers (plan/bit_allocation.hpp,
// exec/bit_choice.hpp): the ladder, llama.cpp's layer rule, the greedy
// allocation on hand-set errors, and runs on a small Llama whose values are
// chosen: the bits per weight written, the groups, fused units, the report,
// verify --against-source, and the refused inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/plan/bit_allocation.hpp"
#include "ctquant/util/error.hpp"
#include "fake_checkpoint.hpp"
#include "families.hpp"
#include "json_schema.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using json = nlohmann::json;
using test::expect_message;
using test::TempDir;
namespace fs = std::filesystem;

json llama_config(std::uint64_t layers) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"tie_word_embeddings", false},
          {"num_hidden_layers", layers},
          {"hidden_size", 128},
          {"intermediate_size", 256},
          {"vocab_size", 64}};
}

std::vector<test::FakeSpec> llama_specs(std::uint64_t layers) {
  std::vector<test::FakeSpec> specs{{"model.embed_tokens.weight", {64, 128}},
                                    {"model.norm.weight", {128}},
                                    {"lm_head.weight", {64, 128}}};
  for (std::uint64_t i = 0; i < layers; ++i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      specs.push_back({l + "self_attn." + p + ".weight", {128, 128}});
    }
    specs.push_back({l + "mlp.gate_proj.weight", {256, 128}});
    specs.push_back({l + "mlp.up_proj.weight", {256, 128}});
    specs.push_back({l + "mlp.down_proj.weight", {128, 256}});
    specs.push_back({l + "input_layernorm.weight", {128}});
    specs.push_back({l + "post_attention_layernorm.weight", {128}});
  }
  return specs;
}

const std::string kOutlier = "model.layers.1.self_attn.o_proj";

// A Llama of `layers` layers with normal weights (std 0.02), except
// kOutlier: every row has one value of 0.5 in column 0, so that its scale
// group's 4-bit steps are 25 times coarser and its error is the largest.
void write_llama(const fs::path& dir, std::uint64_t layers) {
  std::vector<test::FakeTensor> tensors;
  std::uint32_t seed = 7;
  for (const test::FakeSpec& s : llama_specs(layers)) {
    if (s.shape.size() != 2) {
      tensors.push_back(test::FakeTensor{
          s.name, s.dtype, s.shape, test::float_bytes(s.dtype, std::vector<float>(s.shape[0], 1))});
      continue;
    }
    std::mt19937 rng(seed++);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> values(s.shape[0] * s.shape[1]);
    for (float& v : values) v = normal(rng);
    if (s.name == kOutlier + ".weight") {
      for (std::uint64_t r = 0; r < s.shape[0]; ++r) values[r * s.shape[1]] = 0.5f;
    }
    tensors.push_back(
        test::FakeTensor{s.name, s.dtype, s.shape, test::float_bytes(s.dtype, values)});
  }
  test::write_checkpoint(dir, tensors, llama_config(layers));
}

QuantizePlan sparse_plan(const TempDir& tmp, std::uint64_t layers, const std::string& scheme) {
  test::write_sparse_checkpoint(tmp / "in", llama_specs(layers), llama_config(layers));
  PlanOptions options;
  options.groups = {preset_group(scheme)};
  return make_plan(open_checkpoint(tmp / "in"), options);
}

// The quantized modules a more-bits allocation raises, by decoder layer.
std::set<std::uint64_t> raised_layers(const QuantizePlan& plan, const BitAllocation& a) {
  std::set<std::uint64_t> out;
  for (const ModuleBits& m : a.modules) {
    if (m.option == 0) continue;
    const std::string& name = plan.modules[m.module].name;
    EXPECT_TRUE(name.ends_with(".mlp.down_proj")) << name;
    out.insert(*decoder_layer(name));
  }
  return out;
}

TEST(MoreBits, LlamaCppRuleFor4And8And32Layers) {
  EXPECT_EQ(more_bits_layers(4), (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(more_bits_layers(8), (std::vector<std::uint64_t>{0, 3, 6, 7}));
  EXPECT_EQ(more_bits_layers(32),
            (std::vector<std::uint64_t>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
}

TEST(MoreBits, RaisesTheDownProjOfExactlyTheRulesLayers) {
  for (const std::uint64_t layers : {4u, 8u, 32u}) {
    SCOPED_TRACE(layers);
    TempDir tmp;
    const QuantizePlan plan = sparse_plan(tmp, layers, "W4A16");
    BitAllocation a = start_allocation(plan, bit_ladder(plan.options, "--more-bits"));
    allocate_more_bits(a, plan);
    EXPECT_EQ(a.n_layers, layers);
    EXPECT_EQ(a.layers, more_bits_layers(layers));
    const std::vector<std::uint64_t> want = more_bits_layers(layers);
    EXPECT_EQ(raised_layers(plan, a), std::set<std::uint64_t>(want.begin(), want.end()));
    EXPECT_EQ(a.options[a.modules[0].option].name, "W4A16");
    EXPECT_EQ(a.modules_upgraded(), want.size());
    // W4A16 4.125 bits, W8A16 8.125 bits (group 128, BF16 scales).
    std::uint64_t bytes = 0;
    for (const ModuleBits& m : a.modules) {
      const bool up = m.option != 0;
      EXPECT_EQ(a.options[m.option].name, up ? "W8A16" : "W4A16");
      EXPECT_EQ(m.bytes[m.option] * 8, m.params * (up ? 65 : 33) / 8);
      bytes += m.bytes[m.option];
    }
    EXPECT_EQ(a.bytes(), bytes);
  }
}

TEST(MoreBits, AMoeLayersExpertsMoveAsOneUnitPerExpertOrStacked) {
  // Qwen3-MoE, 2 layers of 4 experts: the rule picks layer 1; vLLM reads a
  // MoE layer's experts with one scheme, so all of layer 1's expert
  // projections (split from stacked tensors too) go to W8A16.
  for (const test::Family family : {test::Family::kQwen3Moe, test::Family::kQwen3MoeFused}) {
    SCOPED_TRACE(test::family_name(family));
    TempDir tmp;
    test::write_family(tmp / "in", family, false);
    const QuantizePlan plan = make_plan(open_checkpoint(tmp / "in"), PlanOptions{});
    BitAllocation a = start_allocation(plan, bit_ladder(plan.options, "--more-bits"));
    allocate_more_bits(a, plan);
    EXPECT_EQ(a.layers, (std::vector<std::uint64_t>{1}));
    std::size_t experts = 0;
    for (const ModuleBits& m : a.modules) {
      const std::string& name = plan.modules[m.module].name;
      SCOPED_TRACE(name);
      const bool raised = name.starts_with("model.layers.1.mlp.experts.");
      experts += raised ? 1 : 0;
      EXPECT_EQ(a.options[m.option].name, raised ? "W8A16" : "W4A16");
    }
    EXPECT_EQ(experts, 4u * 3u);
    // The units: each layer's experts together, q/k/v together.
    for (const std::vector<std::size_t>& unit : scheme_units(plan)) {
      const std::string& first = plan.modules[unit.front()].name;
      if (first.find(".mlp.experts.") != std::string::npos) {
        EXPECT_EQ(unit.size(), 12u) << first;
      }
      if (first.ends_with("q_proj")) {
        EXPECT_EQ(unit.size(), 3u) << first;
      }
    }
  }
}

TEST(DecoderLayer, ReadsTheNumberAfterLayers) {
  EXPECT_EQ(decoder_layer("model.layers.12.mlp.down_proj"), 12u);
  EXPECT_EQ(decoder_layer("layers.3.w2"), 3u);
  EXPECT_EQ(decoder_layer("model.language_model.layers.0.mlp.experts.5.down_proj"), 0u);
  EXPECT_EQ(decoder_layer("model.sublayers.2.fc"), std::nullopt);
  EXPECT_EQ(decoder_layer("model.layers.x.fc"), std::nullopt);
  EXPECT_EQ(decoder_layer("lm_head"), std::nullopt);
}

TEST(BitLadder, W4A16RisesToSmallerGroupsThenW8A16) {
  PlanOptions options;
  const BitLadder ladder = bit_ladder(options, "--target-bits");
  std::vector<std::string> names;
  for (const SchemeGroup& g : ladder.options) names.push_back(g.name);
  EXPECT_EQ(names, (std::vector<std::string>{"W4A16", "W4A16_g64", "W4A16_g32", "W8A16"}));
  EXPECT_EQ(ladder.options[1].weights.group_size, 64u);
  EXPECT_EQ(ladder.options[2].weights.group_size, 32u);
  EXPECT_EQ(ladder.options[3].weights, preset_group("W8A16").weights);
  // The asymmetric preset keeps its zero points in the smaller groups.
  options.groups = {preset_group("W4A16_ASYM")};
  const BitLadder asym = bit_ladder(options, "--target-bits");
  ASSERT_EQ(asym.options.size(), 4u);
  EXPECT_FALSE(asym.options[1].weights.symmetric);
  EXPECT_TRUE(asym.options[3].weights.symmetric);
  // W8A16 itself has only its smaller groups above it.
  options.groups = {preset_group("W8A16")};
  names.clear();
  for (const SchemeGroup& g : bit_ladder(options, "--target-bits").options) names.push_back(g.name);
  EXPECT_EQ(names, (std::vector<std::string>{"W8A16", "W8A16_g64", "W8A16_g32"}));
}

TEST(BitLadder, RefusesSchemesThatCannotMixAndSeveralGroups) {
  const auto refused = [](std::vector<SchemeGroup> groups, const std::vector<std::string>& words) {
    PlanOptions options;
    options.groups = std::move(groups);
    try {
      bit_ladder(options, "--target-bits");
      ADD_FAILURE() << "not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      expect_message(e.what(), words);
    }
  };
  refused({preset_group("NVFP4A16")},
          {"--target-bits: scheme NVFP4A16 cannot mix", "nvfp4-pack-quantized", "pack-quantized",
           "mixed-precision"});
  refused({preset_group("FP8_DYNAMIC")}, {"scheme FP8_DYNAMIC cannot mix"});
  SchemeGroup w8_g32 = preset_group("W8A16");
  w8_g32.weights.group_size = 32;
  refused({w8_g32}, {"scheme W8A16 has nothing to raise modules to"});
  SchemeGroup mlp = preset_group("W8A16");
  mlp.targets = {"re:.*mlp.*"};
  refused({mlp, preset_group("W4A16")},
          {"starts from one scheme group", "give 2 (W8A16, W4A16)", "--scheme"});
}

// Hand-set errors: each module's rel^2 is err2 / w2 with w2 = 1.
void set_error(BitAllocation& a, std::size_t slot, std::vector<double> rel2) {
  a.modules[slot].errors.clear();
  for (const double r : rel2) a.modules[slot].errors.push_back(QuantError{r, 1.0, 0.0f, 1});
}

TEST(AllocateBits, TakesTheLargestReductionPerByteFirstAndStaysWithinTheTarget) {
  TempDir tmp;
  const QuantizePlan plan = sparse_plan(tmp, 1, "W4A16");
  BitAllocation a = start_allocation(plan, bit_ladder(plan.options, "--target-bits"));
  // Modules: q, k, v, o (128x128), gate, up (256x128), down (128x256).
  std::map<std::string, std::size_t> slot;
  for (std::size_t i = 0; i < a.modules.size(); ++i) {
    slot[plan.modules[a.modules[i].module].name.substr(15)] = i;
  }
  ASSERT_EQ(slot.size(), 7u);
  // Options: W4A16, _g64, _g32, W8A16. Every module 0.01 -> 0.008 -> 0.006
  // -> 0.0001, except o_proj: 0.04 at W4A16.
  for (const auto& [name, i] : slot) set_error(a, i, {0.01, 0.008, 0.006, 0.0001});
  set_error(a, slot.at("self_attn.o_proj"), {0.04, 0.02, 0.015, 0.0001});
  // Budget for o_proj at g64 and nothing more: 128*128 params, 16/128 more
  // bits each.
  const std::uint64_t base = a.bytes_of(0);
  const std::uint64_t params = a.params();
  const std::uint64_t o_g64 = 128 * 128 / 64 * 2 - 128 * 128 / 128 * 2;  // 256 bytes of scales
  const double target = 8.0 * static_cast<double>(base + o_g64) / static_cast<double>(params);
  allocate_bits(a, plan, target);
  for (const auto& [name, i] : slot) {
    SCOPED_TRACE(name);
    EXPECT_EQ(a.options[a.modules[i].option].name,
              name == "self_attn.o_proj" ? "W4A16_g64" : "W4A16");
  }
  EXPECT_EQ(a.bytes(), base + o_g64);
  EXPECT_EQ(a.bits_per_weight(), target);
  EXPECT_EQ(a.rule, fmt::format("--target-bits {}", target));

  // With room for everything, every unit ends at W8A16, its lowest error:
  // fused q/k/v and gate/up together.
  BitAllocation all = start_allocation(plan, bit_ladder(plan.options, "--target-bits"));
  for (const auto& [name, i] : slot) set_error(all, i, {0.01, 0.008, 0.006, 0.0001});
  allocate_bits(all, plan, 16);
  for (const ModuleBits& m : all.modules) EXPECT_EQ(all.options[m.option].name, "W8A16");
  EXPECT_EQ(all.bits_per_weight(), 8.125);
}

TEST(AllocateBits, FusedModulesMoveTogetherByTheirErrorTogether) {
  TempDir tmp;
  const QuantizePlan plan = sparse_plan(tmp, 1, "W4A16");
  BitAllocation a = start_allocation(plan, bit_ladder(plan.options, "--target-bits"));
  // Only v_proj gains from g64, but q/k/v move as one: the unit's three
  // modules pay for it. o_proj gains less per module but pays for one.
  for (std::size_t i = 0; i < a.modules.size(); ++i) {
    const std::string& name = plan.modules[a.modules[i].module].name;
    if (name.ends_with("v_proj")) {
      set_error(a, i, {0.05, 0.02, 0.02, 0.02});
    } else if (name.ends_with("o_proj")) {
      set_error(a, i, {0.03, 0.015, 0.015, 0.015});
    } else {
      set_error(a, i, {0.01, 0.01, 0.01, 0.01});
    }
  }
  // Room for the q/k/v unit's g64 (3 x 256 bytes) but not for it and o_proj.
  const std::uint64_t target_bytes = a.bytes_of(0) + 3 * 256;
  allocate_bits(a, plan, 8.0 * static_cast<double>(target_bytes) / static_cast<double>(a.params()));
  for (const ModuleBits& m : a.modules) {
    const std::string& name = plan.modules[m.module].name;
    SCOPED_TRACE(name);
    // o_proj: 0.015 * 16384 / 256 per byte = 0.96 > q/k/v: 0.03 * 16384 / 768 = 0.64.
    EXPECT_EQ(a.options[m.option].name, name.ends_with("o_proj") ? "W4A16_g64" : "W4A16");
  }
}

TEST(AllocateBits, RefusesATargetBelowTheGivenSchemeOrAbove16) {
  TempDir tmp;
  const QuantizePlan plan = sparse_plan(tmp, 1, "W4A16");
  BitAllocation a = start_allocation(plan, bit_ladder(plan.options, "--target-bits"));
  try {
    check_target_bits(a, 4.1);
    ADD_FAILURE() << "4.1 bits accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_message(e.what(), {"--target-bits 4.1", "below the 4.1250 bits per weight of W4A16"});
  }
  EXPECT_THROW(check_target_bits(a, 16.5), Error);
  EXPECT_NO_THROW(check_target_bits(a, 4.125));
}

// ---- runs ----

struct BitsRun {
  test::CommandResult result;
  json report;
  json config;
};

BitsRun run_bits(const TempDir& tmp, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"quantize", (tmp / "in").string(), (tmp / "out").string(),
                                   "--report", (tmp / "report.json").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  BitsRun run;
  run.result = test::run_ctquant(args);
  if (run.result.exit_code != 0) return run;
  run.report = test::read_json(tmp / "report.json");
  // The report, bit_allocation included, is what docs/report.schema.json says.
  const json schema = test::read_json(fs::path(CTQUANT_DOCS_DIR) / "report.schema.json");
  for (const std::string& e : test::JsonSchemaValidator(schema).validate(run.report)) {
    ADD_FAILURE() << e;
  }
  run.config = test::read_json(tmp / "out" / "config.json").at("quantization_config");
  return run;
}

// The vLLM layer of a Llama module: q/k/v and gate/up are fused.
std::string unit_of(const std::string& module) {
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    if (module.ends_with(p)) return module.substr(0, module.size() - 6) + "qkv";
  }
  for (const char* p : {"gate_proj", "up_proj"}) {
    if (module.ends_with(p)) return module.substr(0, module.find_last_of('.')) + ".gate_up";
  }
  return module;
}

// Checks what every --target-bits / --more-bits run must hold: the bytes of
// each module's tensors in OUTPUT (but weight_shape) are the report's, the
// bits per weight are theirs, fused units share one scheme, config_groups
// name exactly the modules of each scheme, and verify --against-source
// finds OUTPUT the same as what its config.json plans.
void expect_written_as_reported(const TempDir& tmp, const BitsRun& run) {
  const json& b = run.report.at("bit_allocation");
  const SafetensorsFile file(tmp / "out" / "model.safetensors", "model.safetensors");
  std::map<std::string, std::uint64_t> bytes;
  for (const TensorEntry& e : file.header().tensors) {
    const std::size_t dot = e.name.find_last_of('.');
    if (e.name.substr(dot + 1) == "weight_shape") continue;
    bytes[e.name.substr(0, dot)] += e.byte_size();
  }
  std::uint64_t params = 0;
  std::uint64_t total = 0;
  std::map<std::string, std::set<std::string>> unit_schemes;
  std::map<std::string, std::set<std::string>> by_scheme;
  for (const json& m : b.at("per_module")) {
    const std::string name = m.at("module");
    SCOPED_TRACE(name);
    EXPECT_EQ(bytes.at(name), m.at("bytes").get<std::uint64_t>());
    params += m.at("params").get<std::uint64_t>();
    total += m.at("bytes").get<std::uint64_t>();
    unit_schemes[unit_of(name)].insert(m.at("scheme"));
    by_scheme[m.at("scheme")].insert(name);
  }
  EXPECT_EQ(b.at("params").get<std::uint64_t>(), params);
  EXPECT_EQ(b.at("bytes").get<std::uint64_t>(), total);
  EXPECT_EQ(b.at("bits_per_weight").get<double>(),
            8.0 * static_cast<double>(total) / static_cast<double>(params));
  for (const auto& [unit, schemes] : unit_schemes) EXPECT_EQ(schemes.size(), 1u) << unit;
  const json& groups = run.config.at("config_groups");
  EXPECT_EQ(groups.size(), by_scheme.size());
  for (const auto& [scheme, modules] : by_scheme) {
    EXPECT_EQ(groups.at(scheme).at("targets").get<std::set<std::string>>(), modules) << scheme;
  }
  EXPECT_EQ(run.config.at("format"), "pack-quantized");
  const test::CommandResult v = test::run_ctquant(
      {"verify", (tmp / "out").string(), (tmp / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  expect_message(v.out, {"result: SAME"});
}

TEST(TargetBits, RaisesTheModuleWithTheLargestErrorFirst) {
  TempDir tmp;
  write_llama(tmp / "in", 2);
  // Room for one 128x128 module at group 64 (256 bytes more): the cheapest
  // step, and kOutlier's buys the most.
  const std::uint64_t params = 2 * (4 * 128 * 128 + 3 * 256 * 128);
  const std::uint64_t base = params / 128 * 2 + params / 2;
  const double target = 8.0 * static_cast<double>(base + 256) / static_cast<double>(params);
  const BitsRun run = run_bits(tmp, {"--target-bits", fmt::format("{}", target)});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const json& b = run.report.at("bit_allocation");
  EXPECT_EQ(b.at("bits_per_weight").get<double>(), target);
  EXPECT_EQ(b.at("bits_per_weight_given").get<double>(), 4.125);
  EXPECT_EQ(b.at("modules_upgraded"), 1);
  for (const json& m : b.at("per_module")) {
    EXPECT_EQ(m.at("scheme"), m.at("module") == kOutlier ? "W4A16_g64" : "W4A16") << m.at("module");
  }
  // Its error at W4A16 is the largest of all modules, and the run's figures
  // are those the allocation measured.
  double outlier = 0;
  double others = 0;
  for (const json& m : b.at("per_module")) {
    const double rel = m.at("rel_frobenius").at("W4A16").get<double>();
    (m.at("module") == kOutlier ? outlier : others) =
        std::max(m.at("module") == kOutlier ? outlier : others, rel);
  }
  EXPECT_GT(outlier, 2 * others);
  for (const json& m : run.report.at("weight_error").at("modules")) {
    for (const json& c : b.at("per_module")) {
      if (c.at("module") == m.at("module")) {
        EXPECT_EQ(m.at("rel_frobenius"),
                  c.at("rel_frobenius").at(c.at("scheme").get<std::string>()));
      }
    }
  }
  expect_written_as_reported(tmp, run);
  expect_message(run.result.err,
                 {fmt::format("--target-bits {}: {:.4f} bits per weight over 14 quantized "
                              "module(s) (4.1250 with W4A16 alone); 1 raised: 1 to W4A16_g64",
                              target, target),
                  "W4A16_g64  " + kOutlier, "W4A16 + W4A16_g64"});
}

TEST(TargetBits, FiveBitsStaysWithinAndLowersTheWeightError) {
  TempDir tmp;
  write_llama(tmp / "in", 2);
  const BitsRun run = run_bits(tmp, {"--target-bits", "5"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const json& b = run.report.at("bit_allocation");
  EXPECT_LE(b.at("bits_per_weight").get<double>(), 5.0);
  EXPECT_GT(b.at("bits_per_weight").get<double>(), 4.125);
  EXPECT_EQ(b.at("target_bits"), 5.0);
  EXPECT_LT(b.at("weighted_error_chosen").get<double>(),
            b.at("weighted_error_given").get<double>());
  for (const json& m : b.at("per_module")) {
    if (m.at("module") == kOutlier) {
      EXPECT_NE(m.at("scheme"), "W4A16");
    }
  }
  expect_written_as_reported(tmp, run);
}

TEST(TargetBits, WrittenRecipeReproducesTheAllocationWithoutMeasuring) {
  TempDir tmp;
  write_llama(tmp / "in", 2);
  const BitsRun run =
      run_bits(tmp, {"--target-bits", "4.6", "--write-recipe", (tmp / "recipe.yaml").string()});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const test::CommandResult again =
      test::run_ctquant({"quantize", (tmp / "in").string(), (tmp / "again").string(), "--recipe",
                         (tmp / "recipe.yaml").string()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.err.find("--target-bits"), std::string::npos) << again.err;
  EXPECT_EQ(test::read_file(tmp / "again" / "model.safetensors"),
            test::read_file(tmp / "out" / "model.safetensors"));
  EXPECT_EQ(test::read_json(tmp / "again" / "config.json"),
            test::read_json(tmp / "out" / "config.json"));
}

TEST(MoreBits, EightLayersWriteTheRulesDownProjAtW8A16) {
  TempDir tmp;
  write_llama(tmp / "in", 8);
  const BitsRun run = run_bits(tmp, {"--more-bits", "layers"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const json& b = run.report.at("bit_allocation");
  EXPECT_EQ(b.at("layers"), json::array({0, 3, 6, 7}));
  EXPECT_EQ(b.at("n_layers"), 8);
  std::set<std::string> want;
  for (const int l : {0, 3, 6, 7}) want.insert(fmt::format("model.layers.{}.mlp.down_proj", l));
  EXPECT_EQ(run.config.at("config_groups").at("W8A16").at("targets").get<std::set<std::string>>(),
            want);
  expect_written_as_reported(tmp, run);
  expect_message(run.result.err, {"--more-bits layers (llama.cpp's use_more_bits, 8 layers: 0, "
                                  "3, 6, 7)",
                                  "4 raised: 4 to W8A16"});
}

TEST(MoreBits, DryRunShowsTheSplitGroups) {
  TempDir tmp;
  write_llama(tmp / "in", 4);
  const test::CommandResult r =
      test::run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "--more-bits",
                         "layers", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.out, {"W8A16", "model.layers.2.mlp.down_proj", "model.layers.3.mlp.down_proj"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(BitOptions, BadInputIsAUsageErrorNamingTheReasonAndWritesNothing) {
  TempDir tmp;
  write_llama(tmp / "in", 2);
  test::write_json(tmp / "two.json", {{"config_groups",
                                       {{"a",
                                         {{"targets", {"re:.*mlp.*"}},
                                          {"weights",
                                           {{"num_bits", 8},
                                            {"type", "int"},
                                            {"symmetric", true},
                                            {"strategy", "group"},
                                            {"group_size", 128}}}}},
                                        {"b",
                                         {{"targets", {"Linear"}},
                                          {"weights",
                                           {{"num_bits", 4},
                                            {"type", "int"},
                                            {"symmetric", true},
                                            {"strategy", "group"},
                                            {"group_size", 128}}}}}}}});
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"--target-bits", "4"}, {"--target-bits 4: below the 4.1250 bits per weight of W4A16"}},
      {{"--target-bits", "17"}, {"--target-bits 17", "at most 16"}},
      {{"--target-bits", ""}, {"--target-bits: expected a finite number of bits per weight"}},
      {{"--target-bits", "1e400"}, {"--target-bits: expected a finite number of bits per weight"}},
      {{"--target-bits", "5x"}, {"--target-bits: expected a finite number of bits per weight"}},
      {{"--scheme", "NVFP4A16", "--target-bits", "5"},
       {"--target-bits: scheme NVFP4A16 cannot mix", "mixed-precision"}},
      {{"--scheme", "W8A16", "--more-bits", "layers"},
       {"--more-bits layers: scheme W8A16 has no W8A16 above it"}},
      {{"--target-bits", "5", "--more-bits", "layers"},
       {"--target-bits and --more-bits cannot be combined"}},
      {{"--target-bits", "5", "--observer", "auto"},
       {"--target-bits cannot be combined with --observer auto"}},
      {{"--target-bits", "5", "--quantization-config", (tmp / "two.json").string()},
       {"--target-bits starts from one scheme group", "give 2 (a, b)"}},
      {{"--more-bits", "blocks"}, {"--more-bits", "layers"}},
  };
  for (const auto& [extra, words] : cases) {
    SCOPED_TRACE(fmt::format("{}", fmt::join(extra, " ")));
    std::vector<std::string> args = {"quantize", (tmp / "in").string(), (tmp / "out").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const test::CommandResult r = test::run_ctquant(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, words);
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
}

// The bundled DFlash draft (DFlashLagunaForCausalLM: its modules have no
// `model.` prefix, which vLLM's model class adds), copied into dir with
// config.json's architecture set and, unless keep_target_layers,
// dflash_config.num_target_layers removed.
void copy_dflash(const fs::path& dir, const std::string& architecture,
                 bool keep_target_layers = true) {
  test::copy_dir(test::golden_dir() / "dflash-bf16-sharded" / "input", dir);
  json config = test::read_json(dir / "config.json");
  config["architectures"] = {architecture};
  if (!keep_target_layers) config["dflash_config"].erase("num_target_layers");
  test::write_file(dir / "config.json", config.dump(2));
}

// What a DFlash run with split groups must hold: no L13 finding, and
// verify --against-source finds OUTPUT the same as its config.json plans.
void expect_dflash_split_verifies(const TempDir& tmp, const BitsRun& run) {
  EXPECT_EQ(run.result.err.find("L13"), std::string::npos) << run.result.err;
  const test::CommandResult v = test::run_ctquant(
      {"verify", (tmp / "out").string(), (tmp / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  expect_message(v.out, {"result: SAME"});
}

// The bundled DFlash draft's quantized modules but layers.1.mlp.down_proj,
// each by an entry matching its checkpoint name and vLLM's (model.fc;
// gate/up also vLLM's fused gate_up_proj, which the role table's drafts
// build), in plan order.
json dflash_targets_but_layer_1_down_proj() {
  return json::array({"re:^(model\\.)?fc$", "re:^(model\\.)?layers\\.0\\.mlp\\.down_proj$",
                      "re:^(layers\\.0\\.mlp\\.gate_proj|model\\.layers\\.0\\.mlp\\.gate_proj|"
                      "model\\.layers\\.0\\.mlp\\.gate_up_proj)$",
                      "re:^(layers\\.0\\.mlp\\.up_proj|model\\.layers\\.0\\.mlp\\.gate_up_proj|"
                      "model\\.layers\\.0\\.mlp\\.up_proj)$",
                      "re:^(model\\.)?layers\\.0\\.self_attn\\.o_proj$",
                      "re:^(layers\\.1\\.mlp\\.gate_proj|model\\.layers\\.1\\.mlp\\.gate_proj|"
                      "model\\.layers\\.1\\.mlp\\.gate_up_proj)$",
                      "re:^(layers\\.1\\.mlp\\.up_proj|model\\.layers\\.1\\.mlp\\.gate_up_proj|"
                      "model\\.layers\\.1\\.mlp\\.up_proj)$",
                      "re:^(model\\.)?layers\\.1\\.self_attn\\.o_proj$"});
}

TEST(TargetBits, SplitsADflashDraftIntoGroupsVllmFinds) {
  // Each module is named by an entry that matches both the checkpoint's
  // name (transformers, ctquant) and vLLM's model.-prefixed one.
  TempDir tmp;
  copy_dflash(tmp / "in", "DFlashLagunaForCausalLM");
  const BitsRun run = run_bits(tmp, {"--target-bits", "5"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const json& groups = run.config.at("config_groups");
  EXPECT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups.at("W4A16_g32").at("targets"), dflash_targets_but_layer_1_down_proj());
  EXPECT_EQ(groups.at("W8A16").at("targets"),
            json::array({"re:^(model\\.)?layers\\.1\\.mlp\\.down_proj$"}));
  expect_dflash_split_verifies(tmp, run);
}

TEST(MoreBits, RaisesTheDownProjOfADflashDraftsOwnLayers) {
  // The draft's decoder layers are layers.N (component draft): llama.cpp's
  // rule for 2 layers picks layer 1.
  TempDir tmp;
  copy_dflash(tmp / "in", "DFlashLagunaForCausalLM");
  const BitsRun run = run_bits(tmp, {"--more-bits", "layers"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const json& b = run.report.at("bit_allocation");
  EXPECT_EQ(b.at("layers"), json::array({1}));
  EXPECT_EQ(b.at("n_layers"), 2);
  const json& groups = run.config.at("config_groups");
  EXPECT_EQ(groups.at("W8A16").at("targets"),
            json::array({"re:^(model\\.)?layers\\.1\\.mlp\\.down_proj$"}));
  EXPECT_EQ(groups.at("W4A16").at("targets"), dflash_targets_but_layer_1_down_proj());
  expect_dflash_split_verifies(tmp, run);
}

TEST(MoreBits, NamesAQwen3DflashDraftsLayersAfterTheTargetsAsVllmDoes) {
  // vLLM builds DFlashDraftModel with qwen3_dflash.py, whose layer N is
  // model.layers.{N + the target's layers} (num_target_layers: 8).
  TempDir tmp;
  copy_dflash(tmp / "in", "DFlashDraftModel");
  const BitsRun run = run_bits(tmp, {"--more-bits", "layers"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_EQ(
      run.config.at("config_groups").at("W8A16").at("targets"),
      json::array(
          {"re:^(layers\\.1\\.|model\\.layers\\.1\\.|model\\.layers\\.9\\.)mlp\\.down_proj$"}));
  expect_dflash_split_verifies(tmp, run);
}

TEST(MoreBits, RefusesSplitGroupsVllmCannotFindOnAQwen3DflashDraftWithoutTargetLayers) {
  // Without num_target_layers vLLM's numbers of the draft's layers are
  // unknown: a group naming layers.1 would match nothing in vLLM.
  TempDir tmp;
  copy_dflash(tmp / "in", "DFlashDraftModel", /*keep_target_layers=*/false);
  const test::CommandResult r = test::run_ctquant(
      {"quantize", (tmp / "in").string(), (tmp / "out").string(), "--more-bits", "layers"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"--more-bits: the split groups name the draft's decoder layers by "
                         "number, and vLLM's numbers are not known",
                         "qwen3_dflash.py", "no num_target_layers", "'layers.0.mlp.down_proj'",
                         "Nothing was written", "--allow-unloadable"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

}  // namespace
}  // namespace ctquant
