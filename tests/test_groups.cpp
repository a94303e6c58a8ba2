// Scheme groups whose targets overlap, and the groups config.json lists:
// the group each reader gives a module (format/targets.hpp), lint L11 on
// overlapping groups, L18 and L1 on entries that match nothing, groups that
// quantize nothing left out of config.json, verify --against-source on
// outputs with several groups, and verify on a config group with format
// null.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/format/targets.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/loadability.hpp"
#include "ctquant/verify/verify.hpp"
#include "fake_checkpoint.hpp"
#include "lint_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_fixes_pass_lint;
using test::FakeSpec;

struct Linted {
  QuantizePlan plan;
  std::vector<Finding> findings;
};

std::vector<Finding> with_id(const std::vector<Finding>& findings, const std::string& id) {
  std::vector<Finding> out;
  std::copy_if(findings.begin(), findings.end(), std::back_inserter(out),
               [&](const Finding& f) { return f.id == id; });
  return out;
}

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

const json kLlamaConfig = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"tie_word_embeddings", false}};

// One Llama decoder layer (TinyLlama shapes).
std::vector<FakeSpec> llama_layer(const std::string& prefix = "model.layers.0.") {
  return {{prefix + "input_layernorm.weight", {2048}},
          {prefix + "self_attn.q_proj.weight", {2048, 2048}},
          {prefix + "self_attn.k_proj.weight", {256, 2048}},
          {prefix + "self_attn.v_proj.weight", {256, 2048}},
          {prefix + "self_attn.o_proj.weight", {2048, 2048}},
          {prefix + "post_attention_layernorm.weight", {2048}},
          {prefix + "mlp.gate_proj.weight", {5632, 2048}},
          {prefix + "mlp.up_proj.weight", {5632, 2048}},
          {prefix + "mlp.down_proj.weight", {2048, 5632}}};
}

// Plans and lints a layout with the given scheme groups.
Linted lint_groups(const std::vector<FakeSpec>& specs, std::vector<SchemeGroup> groups) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), specs, kLlamaConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  PlanOptions options;
  options.groups = std::move(groups);
  options.ignore = {};
  Linted out;
  out.plan = make_plan(checkpoint, options);
  out.findings = run_lint(checkpoint, out.plan, LintOptions{1});
  expect_fixes_pass_lint(checkpoint, options, out.findings, 1);
  return out;
}

SchemeGroup group_for(const std::string& preset, std::vector<std::string> targets) {
  SchemeGroup g = preset_group(preset);
  g.targets = std::move(targets);
  return g;
}

// ---- L11 ----

// Two regex groups overlap on q_proj: ctquant gives it to the first group
// given (W8A16), compressed-tensors to the first pattern in text order
// (W4A16_ASYM); vLLM reads the fused qkv_proj, which only the self_attn
// pattern names: W8A16.
TEST(LintL11, OverlappingRegexGroupsResolveDifferentlyInCompressedTensors) {
  const Linted r = lint_groups(
      llama_layer(), {group_for("W8A16", {"re:.*self_attn\\..*"}),
                      group_for("W4A16_ASYM", {"re:.*q_proj$"}), group_for("W4A16", {"Linear"})});
  const auto l11 = with_id(r.findings, "L11");
  ASSERT_EQ(l11.size(), 1u);
  EXPECT_EQ(l11[0].severity, Severity::kError);
  EXPECT_EQ(l11[0].tensors, std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight"});
  EXPECT_TRUE(contains(l11[0].message,
                       "read as 'W8A16' by ctquant and model_free_ptq (which write it) and "
                       "vLLM, but 'W4A16_ASYM' by compressed-tensors (transformers' loader)"))
      << l11[0].message;
}

// The same overlap on q_proj where the compressed-tensors group is written
// (it quantizes the MLP): the output would be read with a scheme q_proj was
// not written with.
TEST(LintL11, OverlapOnWrittenGroupsIsReadWithAnotherScheme) {
  const Linted r =
      lint_groups(llama_layer(), {group_for("W8A16", {"re:.*self_attn\\..*"}),
                                  group_for("W4A16_ASYM", {"re:.*q_proj$", "re:.*mlp\\..*"}),
                                  group_for("W4A16", {"Linear"})});
  const auto l11 = with_id(r.findings, "L11");
  ASSERT_EQ(l11.size(), 1u);
  EXPECT_EQ(l11[0].tensors, std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight"});
  EXPECT_TRUE(contains(l11[0].message,
                       "read as 'W8A16' by ctquant and model_free_ptq (which write it) and "
                       "vLLM, but 'W4A16_ASYM' by compressed-tensors (transformers' loader)"))
      << l11[0].message;
  EXPECT_TRUE(contains(l11[0].message,
                       "so the output would be read with a scheme its tensors were not written "
                       "with"))
      << l11[0].message;
  EXPECT_EQ(r.plan.group_modules, (std::vector<std::size_t>{4, 3, 0}));
}

// A Linear group given first takes everything here; both readers prefer
// any pattern that matches over the class name, so the MLP would go to
// W8A16.
TEST(LintL11, LinearGroupBeforePatternGroupIsError) {
  const Linted r = lint_groups(
      llama_layer(), {group_for("W4A16", {"Linear"}), group_for("W8A16", {"re:.*mlp\\..*"})});
  const auto l11 = with_id(r.findings, "L11");
  ASSERT_EQ(l11.size(), 1u);
  EXPECT_EQ(l11[0].tensors.size(), 3u);
  EXPECT_TRUE(contains(l11[0].message,
                       "are read as 'W4A16' by ctquant and model_free_ptq (which write it), but "
                       "'W8A16' by compressed-tensors (transformers' loader) and vLLM"))
      << l11[0].message;
  // ctquant would not write W8A16 (it quantizes nothing): said, not
  // "read with a scheme its tensors were not written with".
  EXPECT_TRUE(contains(l11[0].message,
                       "so the config's groups do not say which scheme these modules get: "
                       "quantized with the first group given, they leave 'W8A16' with no module, "
                       "and ctquant would not write it"))
      << l11[0].message;
  // The other order is what vLLM does: no finding.
  const Linted ok = lint_groups(
      llama_layer(), {group_for("W8A16", {"re:.*mlp\\..*"}), group_for("W4A16", {"Linear"})});
  EXPECT_TRUE(with_id(ok.findings, "L11").empty());
  EXPECT_EQ(ok.plan.group_modules, (std::vector<std::size_t>{3, 4}));
}

// ---- the group each reader gives a module ----

TEST(GroupTargets, ReadersTakeAnExactNameBeforeAPatternAndAPatternBeforeLinear) {
  const GroupTargets t({{"re:.*q_proj$"}, {"layers.0.q_proj"}, {"Linear"}}, {"a", "b", "c"});
  // The issue's case: model_free_ptq and vLLM (first target in name order)
  // take the pattern's group; compressed-tensors the exact name's.
  GroupResolution r = t.resolve("layers.0.q_proj");
  EXPECT_EQ(r.model_free, 0u);
  EXPECT_EQ(r.compressed_tensors, 1u);
  EXPECT_EQ(r.vllm, 0u);
  EXPECT_FALSE(r.agree());
  r = t.resolve("layers.1.q_proj");
  EXPECT_TRUE(r.agree());
  EXPECT_EQ(r.model_free, 0u);
  r = t.resolve("layers.0.o_proj");
  EXPECT_TRUE(r.agree());
  EXPECT_EQ(r.model_free, 2u);
  // A module no target names is no group's, for every reader.
  const GroupTargets named({{"x"}}, {"a"});
  EXPECT_TRUE(named.resolve("y").agree());
  EXPECT_FALSE(named.resolve("y").model_free.has_value());
}

TEST(GroupTargets, ReadersTakeTheGroupsInNameOrderAndPatternsInTextOrder) {
  // Given first: z_group. compressed-tensors sorts the patterns by text
  // ("re:.*proj$" < "re:.*q_proj$"): z_group. vLLM takes the first target
  // of the groups in name order: a_group's.
  const GroupTargets t({{"re:.*proj$"}, {"re:.*q_proj$"}}, {"z_group", "a_group"});
  const GroupResolution r = t.resolve("x.q_proj");
  EXPECT_EQ(r.model_free, 0u);
  EXPECT_EQ(r.compressed_tensors, 0u);
  EXPECT_EQ(r.vllm, 1u);
}

TEST(GroupTargets, TargetRepeatedInALaterGroupIsThatGroupsForTheReaders) {
  const GroupTargets t({{"x.q_proj"}, {"x.q_proj"}}, {"a", "b"});
  const GroupResolution r = t.resolve("x.q_proj");
  EXPECT_EQ(r.model_free, 0u);
  EXPECT_EQ(r.compressed_tensors, 1u);
  EXPECT_EQ(r.vllm, 1u);
}

TEST(GroupTargets, VllmReadsAFusedLayerByItsClassBeforeItsShards) {
  // q/k/v named exactly in one group, Linear in another: vLLM's qkv_proj
  // matches no name, and its class (QKVParallelLinear) takes Linear.
  const GroupTargets t({{"l.q_proj", "l.k_proj", "l.v_proj"}, {"Linear"}}, {"a", "b"});
  EXPECT_EQ(t.vllm_fused_group("l.qkv_proj", {"l.q_proj", "l.k_proj", "l.v_proj"}), 1u);
  // Without a class target, the shards decide: every one must match.
  const GroupTargets shards({{"l.q_proj", "l.k_proj", "l.v_proj"}, {"re:.*o_proj$"}}, {"a", "b"});
  EXPECT_EQ(shards.vllm_fused_group("l.qkv_proj", {"l.q_proj", "l.k_proj", "l.v_proj"}), 0u);
  EXPECT_FALSE(shards.vllm_fused_group("l.qkv_proj", {"l.q_proj", "l.k_proj", "l.x_proj"}));
  // A pattern that names the fused layer comes first.
  const GroupTargets pattern({{"Linear"}, {"re:.*self_attn\\..*"}}, {"a", "b"});
  EXPECT_EQ(pattern.vllm_fused_group("m.self_attn.qkv_proj", {"m.self_attn.q_proj"}), 1u);
}

TEST(GroupTargets, ExactNamesAmongAHundredThousandAreLookedUp) {
  std::vector<std::vector<std::string>> targets(2);
  for (int i = 0; i < 100000; ++i) {
    targets[i % 2].push_back(
        fmt::format("model.layers.{}.mlp.experts.{}.down_proj", i / 128, i % 128));
  }
  const GroupTargets t(targets, {"W4A16", "W4A16_memoryless_mse"});
  const auto hits = t.matches("model.layers.781.mlp.experts.31.down_proj");  // i = 99999
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].group, 1u);
  EXPECT_EQ(hits[0].entry, 49999u);
  EXPECT_TRUE(t.resolve("model.layers.781.mlp.experts.31.down_proj").agree());
  EXPECT_TRUE(t.matches("model.layers.781.mlp.experts.31.up_proj").empty());
}

TEST(ModuleMatcher, FirstMatchAndMatchingEntriesMixLiteralsAndPatterns) {
  const ModuleMatcher targets({"re:.*b$", "a.b", "Linear", "a.b"}, ModuleMatcher::Role::kTargets);
  EXPECT_EQ(targets.first_match("a.b"), 0u);
  EXPECT_EQ(targets.matching_entries("a.b"), (std::vector<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(targets.first_match("c"), 2u);
  EXPECT_EQ(targets.matching_entries("c"), (std::vector<std::size_t>{2}));
  // In an ignore list "Linear" is a name like any other.
  const ModuleMatcher ignore({"Linear", "re:^c", "c"}, ModuleMatcher::Role::kIgnore);
  EXPECT_EQ(ignore.first_match("c"), 1u);
  EXPECT_EQ(ignore.matching_entries("c"), (std::vector<std::size_t>{1, 2}));
  EXPECT_FALSE(ignore.first_match("d"));
}

// ---- quantize: overlapping groups, groups that quantize nothing ----

// A small Llama with real values (hidden 128, 2 layers), and config.json.
void write_small_llama(const fs::path& dir) {
  std::vector<FakeSpec> specs{{"model.embed_tokens.weight", {64, 128}},
                              {"model.norm.weight", {128}},
                              {"lm_head.weight", {64, 128}}};
  for (const std::string l : {"model.layers.0.", "model.layers.1."}) {
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      specs.push_back({l + "self_attn." + p + ".weight", {128, 128}});
    }
    specs.push_back({l + "mlp.gate_proj.weight", {256, 128}});
    specs.push_back({l + "mlp.up_proj.weight", {256, 128}});
    specs.push_back({l + "mlp.down_proj.weight", {128, 256}});
    specs.push_back({l + "input_layernorm.weight", {128}});
    specs.push_back({l + "post_attention_layernorm.weight", {128}});
  }
  test::write_random_checkpoint(dir, specs, kLlamaConfig);
}

json int_weights(int bits) {
  return {{"num_bits", bits},
          {"type", "int"},
          {"symmetric", true},
          {"strategy", "group"},
          {"group_size", 128}};
}

TEST(ConfigGroups, OverlappingRegexAndExactGroupsAreRefusedNamingTheModuleAndBothGroups) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  // 4-bit by pattern, 8-bit by exact name, on layer 0's o_proj.
  test::write_json(
      dir / "qc.json",
      {{"config_groups",
        {{"config_group_0", {{"targets", {"re:.*o_proj$"}}, {"weights", int_weights(4)}}},
         {"config_group_1",
          {{"targets", {"model.layers.0.self_attn.o_proj"}}, {"weights", int_weights(8)}}},
         {"config_group_2", {{"targets", {"Linear"}}, {"weights", int_weights(4)}}}}}});
  const auto r = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--quantization-config", (dir / "qc.json").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "L11 error")) << r.err;
  EXPECT_TRUE(contains(r.err, "model.layers.0.self_attn.o_proj")) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "'config_group_0' by ctquant and model_free_ptq (which write it) "
                       "and vLLM, but 'config_group_1' by compressed-tensors"))
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(ConfigGroups, OverlappingGroupsAreAcceptedWhenEveryReaderAgrees) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  // The exact name's group given first: every reader gives it o_proj.
  test::write_json(
      dir / "qc.json",
      {{"config_groups",
        {{"config_group_0",
          {{"targets", {"model.layers.0.self_attn.o_proj"}}, {"weights", int_weights(8)}}},
         {"config_group_1", {{"targets", {"Linear"}}, {"weights", int_weights(4)}}}}}});
  const auto r = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--quantization-config", (dir / "qc.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json groups =
      test::read_json(dir / "out" / "config.json")["quantization_config"]["config_groups"];
  EXPECT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups["config_group_0"]["format"], "pack-quantized");
  const auto v = test::run_ctquant(
      {"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(ConfigGroups, FusedShardsNamedExactlyBesideALinearGroupAreRefused) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  // q/k/v of layer 0 by name in W8A16: vLLM reads qkv_proj by its class,
  // Linear, and so as W4A16.
  const auto r = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--scheme-for", "model.layers.0.self_attn.q_proj=W8A16",
                                    "--scheme-for", "model.layers.0.self_attn.k_proj=W8A16",
                                    "--scheme-for", "model.layers.0.self_attn.v_proj=W8A16"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "L11 error: 3 modules")) << r.err;
  EXPECT_TRUE(contains(r.err, "but 'W4A16' by vLLM")) << r.err;
}

TEST(ConfigGroups, GroupThatQuantizesNothingIsNotWritten) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const auto r = test::run_ctquant(
      {"quantize", (dir / "in").string(), (dir / "out").string(), "--scheme-for", "nomatch=W8A16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "L1: targets entry 'nomatch' matched 0 modules")) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "scheme group 'W8A16' then quantizes no module and is not written "
                       "to config.json"))
      << r.err;
  const json qc = test::read_json(dir / "out" / "config.json")["quantization_config"];
  std::vector<std::string> names;
  for (const auto& [name, group] : qc["config_groups"].items()) {
    names.push_back(name);
    EXPECT_FALSE(group["format"].is_null()) << name;
  }
  EXPECT_EQ(names, std::vector<std::string>{"W4A16"});
  EXPECT_EQ(qc["format"], "pack-quantized");
  // What is written verifies against its source.
  const auto v = test::run_ctquant(
      {"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(ConfigGroups, SchemeForPatternThatMatchesNothingStopsTheRunUnderStrict) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const auto r = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--scheme-for", "nomatch=W8A16", "--strict"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "L1 warning: targets entry 'nomatch' matched 0 modules")) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(ConfigGroups, SchemeForPatternWithoutRePrefixIsAnError) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const auto r = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--scheme-for", ".*o_proj$=W8A16"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "L18 error: targets entry '.*o_proj$'")) << r.err;
  EXPECT_TRUE(contains(r.err, "'re:.*o_proj$'")) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// ---- L18 and L1 on ignore entries ----

TEST(LintL18, IgnoreEntryLikeARegexWithoutRePrefixIsAnErrorShowingTheReForm) {
  test::TempDir dir;
  std::vector<FakeSpec> specs = llama_layer();
  specs.push_back({"model.layers.0.mlp.fc.weight", {2048, 2048}});
  test::write_sparse_checkpoint(dir.path(), specs, kLlamaConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  PlanOptions options;
  options.ignore = {".*fc$"};
  const QuantizePlan plan = make_plan(checkpoint, options);
  const std::vector<Finding> findings = run_lint(checkpoint, plan, LintOptions{1});
  expect_fixes_pass_lint(checkpoint, options, findings, 1);
  const auto l18 = with_id(findings, "L18");
  ASSERT_EQ(l18.size(), 1u);
  EXPECT_EQ(l18[0].severity, Severity::kError);
  EXPECT_TRUE(contains(l18[0].message,
                       "ignore entry '.*fc$' has regular-expression characters "
                       "but no 're:' prefix"));
  EXPECT_TRUE(contains(l18[0].message,
                       "as a pattern ('re:.*fc$') it matches 1 module: "
                       "model.layers.0.mlp.fc"));
  EXPECT_TRUE(contains(l18[0].fix, "--ignore 're:.*fc$'"));
  EXPECT_EQ(l18[0].fix_ignore, std::vector<std::string>{"re:.*fc$"});
  EXPECT_EQ(l18[0].fix_removes, ".*fc$");
  EXPECT_TRUE(with_id(findings, "L1").empty());
}

TEST(LintL18, IgnoreEntryLikeARegexStopsQuantize) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const auto r = test::run_ctquant(
      {"quantize", (dir / "in").string(), (dir / "out").string(), "--ignore", ".*o_proj$"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "L18 error: ignore entry '.*o_proj$'")) << r.err;
  EXPECT_TRUE(contains(r.err, "--ignore 're:.*o_proj$'")) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(LintL1, UnmatchedPlainIgnoreEntryStopsTheRunOnlyUnderStrict) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const auto strict = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                         "--ignore", "nomatch", "--strict"});
  EXPECT_EQ(strict.exit_code, 1) << strict.err;
  EXPECT_TRUE(contains(strict.err, "L1 warning: ignore entry 'nomatch' matched 0 modules"))
      << strict.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
  const auto r = test::run_ctquant(
      {"quantize", (dir / "in").string(), (dir / "out").string(), "--ignore", "nomatch"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// ---- verify ----

TEST(VerifyAgainstSource, SchemeForOutputWithADefaultLinearGroupIsSame) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const auto r = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--scheme-for", "re:.*self_attn\\..*=W8A16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // config.json lists W4A16 (Linear) before W8A16: the readers still give
  // the attention modules W8A16, and so does verify.
  const VerifyReport report = verify_against_source(dir / "out", dir / "in", VerifyOptions{});
  for (const auto& d : report.differences) ADD_FAILURE() << d.tensor << ": " << d.message;
  EXPECT_TRUE(report.same());
  const auto v = test::run_ctquant(
      {"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(VerifyAgainstSource, GroupsTheReadersResolveDifferentlyAreADifference) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  ASSERT_EQ(
      test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string()}).exit_code, 0);
  // A hand-edited config: o_proj of layer 0 by name in W8A16 (an exact name,
  // which compressed-tensors takes) and by pattern in a_group (first in name
  // order, which vLLM takes).
  json config = test::read_json(dir / "out" / "config.json");
  json& groups = config["quantization_config"]["config_groups"];
  groups["a_group"] = groups["W4A16"];
  groups["a_group"]["targets"] = {"re:.*o_proj$"};
  groups["z_group"] = groups["W4A16"];
  groups["z_group"]["targets"] = {"model.layers.0.self_attn.o_proj"};
  test::write_json(dir / "out" / "config.json", config);
  const VerifyReport report = verify_against_source(dir / "out", dir / "in", VerifyOptions{});
  EXPECT_FALSE(report.same());
  const bool named =
      std::any_of(report.differences.begin(), report.differences.end(), [](const auto& d) {
        return contains(d.message,
                        "module 'model.layers.0.self_attn.o_proj' is matched by the targets "
                        "of several config groups") &&
               contains(d.message,
                        "compressed-tensors (transformers) reads it with group 'z_group', "
                        "vLLM with 'a_group'");
      });
  EXPECT_TRUE(named);
}

TEST(VerifyLoadability, GroupWithFormatNullIsANoteNotAJsonError) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  ASSERT_EQ(
      test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string()}).exit_code, 0);
  // What an earlier ctquant (and model_free_ptq) wrote for
  // --scheme-for nomatch=W8A16: a group with format null.
  json config = test::read_json(dir / "out" / "config.json");
  json group = config["quantization_config"]["config_groups"]["W4A16"];
  group["format"] = nullptr;
  group["targets"] = {"nomatch"};
  group["weights"]["num_bits"] = 8;
  config["quantization_config"]["config_groups"]["W8A16"] = group;
  test::write_json(dir / "out" / "config.json", config);
  const VerifyReport report = verify_against_source(dir / "out", dir / "in", VerifyOptions{});
  for (const auto& d : report.differences) ADD_FAILURE() << d.tensor << ": " << d.message;
  const bool noted = std::any_of(report.notes.begin(), report.notes.end(), [](const auto& n) {
    return contains(n.message, "config group 'W8A16' has format null");
  });
  EXPECT_TRUE(noted);
  const auto v = test::run_ctquant(
      {"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  EXPECT_FALSE(contains(v.err, "json.exception")) << v.err;
  // A top-level format null is said as null, not as ''.
  config["quantization_config"]["format"] = nullptr;
  test::write_json(dir / "out" / "config.json", config);
  const VerifyReport null_top = verify_against_source(dir / "out", dir / "in", VerifyOptions{});
  EXPECT_TRUE(std::any_of(null_top.notes.begin(), null_top.notes.end(), [](const auto& n) {
    return contains(n.message, "readers take the top-level format null");
  }));
}

// verify reads each packed module's zero point, format and bit width from
// the group the readers give that module, not from the first group of
// config.json ("W4A16", targets Linear, sorts before "W4A16_ASYM").
TEST(VerifyLoadability, ZeroPointsOfAnAsymmetricSchemeForGroupBesideASymmetricOneAreLoadable) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const std::vector<std::vector<std::string>> runs = {
      {"--scheme-for", "re:.*down_proj$=W4A16_ASYM"},
      {"--scheme", "W8A16", "--scheme-for", "re:.*self_attn.*=W4A16_ASYM"},
      {"--scheme", "FP8_DYNAMIC", "--scheme-for", "re:.*mlp.*=W4A16_ASYM"},
      {"--scheme", "W4A16_ASYM", "--scheme-for", "re:.*mlp.*=NVFP4A16"}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const fs::path out = dir / fmt::format("out{}", i);
    std::vector<std::string> args = {"quantize", (dir / "in").string(), out.string()};
    args.insert(args.end(), runs[i].begin(), runs[i].end());
    const auto q = test::run_ctquant(args);
    ASSERT_EQ(q.exit_code, 0) << q.err;
    const VerifyReport report = verify_against_source(out, dir / "in", VerifyOptions{});
    for (const auto& d : report.differences) {
      ADD_FAILURE() << runs[i].back() << ": " << d.kind << " " << d.tensor << ": " << d.message;
    }
    const auto v =
        test::run_ctquant({"verify", out.string(), (dir / "in").string(), "--against-source"});
    EXPECT_EQ(v.exit_code, 0) << runs[i].back() << "\n" << v.out << v.err;
    // OUTPUT against itself as GOLDEN: codes unpacked with each group's bits.
    const VerifyReport self = verify_checkpoints(out, out, VerifyOptions{});
    EXPECT_TRUE(self.same()) << runs[i].back();
  }
  // A zero point where the module's own group is symmetric is still found.
  const fs::path out = dir / "out0";
  json config = test::read_json(out / "config.json");
  config["quantization_config"]["config_groups"]["W4A16_ASYM"]["weights"]["symmetric"] = true;
  test::write_json(out / "config.json", config);
  const VerifyReport report = verify_against_source(out, dir / "in", VerifyOptions{});
  const bool named =
      std::any_of(report.differences.begin(), report.differences.end(), [](const auto& d) {
        return d.kind == "loadability" &&
               d.tensor == "model.layers.0.mlp.down_proj.weight_zero_point" &&
               contains(d.message, "but the scheme is symmetric");
      });
  EXPECT_TRUE(named);
}

// --allow L9 let a run that quantizes nothing write a quantization_config
// with empty config_groups, which verify and inspect then refused.
TEST(QuantizeNothing, AllowL9DoesNotWriteAConfigWithNoGroup) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  const auto q = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--allow", "L9", "--targets", "nomatch"});
  EXPECT_EQ(q.exit_code, 2) << q.err;
  EXPECT_TRUE(contains(q.err,
                       "no tensor would be quantized (of 21 tensors; lint L9), so there "
                       "is no scheme group to write"))
      << q.err;
  EXPECT_TRUE(contains(q.err, "--allow L9 does not write it (nothing was written)")) << q.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
  const auto d = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                    "--allow", "L9", "--targets", "nomatch", "--dry-run"});
  EXPECT_EQ(d.exit_code, 2) << d.err;
}

// ---- config.json with a repeated key ----

TEST(ConfigJson, RepeatedKeyIsRefusedByQuantizeAndVerifyNamingTheKey) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  ASSERT_EQ(
      test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string()}).exit_code, 0);
  std::string text = test::read_file(dir / "in" / "config.json");
  text.insert(text.find('{') + 1, "\"model_type\": \"mistral\", ");
  test::write_file(dir / "in" / "config.json", text);
  const std::string key = "key 'model_type' appears twice in the top-level object";
  const auto q = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out2").string()});
  EXPECT_EQ(q.exit_code, 1) << q.err;
  EXPECT_TRUE(contains(q.err, "config.json: " + key)) << q.err;
  EXPECT_FALSE(fs::exists(dir / "out2"));
  try {
    open_checkpoint(dir / "in");
    ADD_FAILURE() << "open_checkpoint accepted a repeated key";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_TRUE(contains(e.what(), key)) << e.what();
  }
  // verify --against-source reads INPUT as quantize does: refused alike.
  const auto v = test::run_ctquant(
      {"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 1) << v.out << v.err;
  EXPECT_TRUE(contains(v.err, "config.json: " + key)) << v.err;
  // An OUTPUT whose config.json repeats a key is a difference naming it.
  test::write_file(dir / "out" / "config.json", text);
  const auto o = test::run_ctquant({"verify", (dir / "out").string(), (dir / "out").string()});
  EXPECT_EQ(o.exit_code, 3) << o.out << o.err;
  EXPECT_TRUE(contains(o.out, key)) << o.out;
}

TEST(ConfigJson, RepeatedKeyInOutputsConfigNamesTheFileOnce) {
  test::TempDir dir;
  write_small_llama(dir / "in");
  ASSERT_EQ(
      test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string()}).exit_code, 0);
  std::string text = test::read_file(dir / "out" / "config.json");
  text.insert(text.find('{') + 1, "\"model_type\": \"mistral\", ");
  test::write_file(dir / "out" / "config.json", text);
  const auto v = test::run_ctquant(
      {"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 1) << v.out << v.err;
  EXPECT_TRUE(contains(v.err,
                       "OUTPUT config.json: key 'model_type' appears twice in the "
                       "top-level object (JSON readers keep only the last one); "
                       "--against-source needs the quantization_config quantize writes"))
      << v.err;
  EXPECT_EQ(v.err.find("config.json"), v.err.rfind("config.json")) << v.err;
}

}  // namespace
}  // namespace ctquant
