// Lint rules on hand-made checkpoints (headers at real model shapes, sparse
// data), the rule table against docs/cli.md, the blocking policy, and lint
// inside quantize and the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ctquant/job/quantize.hpp"
#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "fake_checkpoint.hpp"
#include "families.hpp"
#include "golden_support.hpp"
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

Linted lint_layout(const std::vector<FakeSpec>& specs, const json& config,
                   std::vector<std::string> ignore, std::vector<std::string> targets = {"Linear"},
                   unsigned tp = 1) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), specs, config);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  PlanOptions options;
  options.ignore = std::move(ignore);
  options.default_ignore = false;  // each rule is tested on the list given
  options.groups.front().targets = std::move(targets);
  Linted out;
  out.plan = make_plan(checkpoint, options);
  out.findings = run_lint(checkpoint, out.plan, LintOptions{tp});
  // Every case a lint test builds also checks that its fixes pass lint.
  expect_fixes_pass_lint(checkpoint, options, out.findings, tp);
  return out;
}

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
const json kDFlashConfig = {{"architectures", {"DFlashLagunaForCausalLM"}},
                            {"model_type", "laguna"},
                            {"dflash_config", {{"block_size", 16}}}};

// One Mixtral decoder layer: a router and one expert.
std::vector<FakeSpec> mixtral_layer() {
  return {{"model.layers.0.input_layernorm.weight", {4096}},
          {"model.layers.0.block_sparse_moe.gate.weight", {8, 4096}},
          {"model.layers.0.block_sparse_moe.experts.0.w1.weight", {14336, 4096}},
          {"model.layers.0.block_sparse_moe.experts.0.w2.weight", {4096, 14336}},
          {"model.layers.0.block_sparse_moe.experts.0.w3.weight", {14336, 4096}}};
}

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

// A DFlash draft layer as stored (no `model.` prefix, fused qkv_proj).
std::vector<FakeSpec> dflash_layers() {
  std::vector<FakeSpec> specs{{"fc.weight", {3072, 9216}}, {"norm.weight", {3072}}};
  for (const std::string l : {"layers.0.", "layers.1."}) {
    specs.push_back({l + "self_attn.qkv_proj.weight", {11264, 3072}});
    specs.push_back({l + "self_attn.o_proj.weight", {3072, 9216}});
    specs.push_back({l + "mlp.gate_proj.weight", {12288, 3072}});
    specs.push_back({l + "mlp.up_proj.weight", {12288, 3072}});
    specs.push_back({l + "mlp.down_proj.weight", {3072, 12288}});
  }
  return specs;
}

// ---- L1 ----

TEST(LintL1, MixtralLayerCountsEachIgnoreEntry) {
  const Linted r = lint_layout(mixtral_layer(), kLlamaConfig, {"lm_head", "re:.*gate"});
  ASSERT_EQ(r.plan.ignore_matches.size(), 2u);
  EXPECT_TRUE(r.plan.ignore_matches[0].empty());
  EXPECT_EQ(r.plan.ignore_matches[1],
            std::vector<std::string>{"model.layers.0.block_sparse_moe.gate"});
  // lm_head matched nothing (L1); and re:.*gate, a prefix of vLLM's
  // experts.0.gate_proj probe but not of its up/down probes, makes vLLM
  // refuse the MoE layer (L13).
  ASSERT_EQ(r.findings.size(), 2u);
  const Finding& f = r.findings[0];
  EXPECT_EQ(f.id, "L1");
  EXPECT_EQ(f.severity, Severity::kWarning);
  EXPECT_TRUE(contains(f.message, "ignore entry 'lm_head' matched 0 modules"));
  EXPECT_TRUE(contains(f.message, "no module name contains 'lm_head'"));
  const Finding& moe = r.findings[1];
  EXPECT_EQ(moe.id, "L13");
  EXPECT_EQ(moe.severity, Severity::kError);
  EXPECT_TRUE(contains(moe.message, "All MoE projections need to have same quantization scheme"))
      << moe.message;
  EXPECT_TRUE(contains(moe.message,
                       "'model.layers.0.block_sparse_moe.experts.0.gate_proj' ignored by "
                       "'re:.*gate'"))
      << moe.message;
}

// --target-bits and --observer auto name a Mixtral layer's experts in
// targets together with vLLM's probes of the layer (experts.0.gate_proj,
// up_proj, down_proj: names the checkpoint, which calls them w1 / w3 / w2,
// does not have). vLLM reads those entries, so L1 says nothing of them; a
// misspelt name beside them still gets its warning.
TEST(LintL1, MixtralProbeNamesInTargetsAreNotUnmatched) {
  const std::string e = "model.layers.0.block_sparse_moe.experts.0.";
  const Linted r = lint_layout(
      mixtral_layer(), kLlamaConfig, {"re:.*block_sparse_moe[.]gate$"},
      {e + "w1", e + "gate_proj", e + "up_proj", e + "down_proj", e + "w2", e + "w3", e + "w4"});
  const auto l1 = with_id(r.findings, "L1");
  ASSERT_EQ(l1.size(), 1u);
  EXPECT_TRUE(contains(l1[0].message, "targets entry '" + e + "w4' matched 0 modules"))
      << l1[0].message;
  EXPECT_TRUE(with_id(r.findings, "L13").empty());
}

TEST(LintL1, LlamaLayerGateRegexAlsoCatchesGateProj) {
  const Linted r = lint_layout(llama_layer(), kLlamaConfig, {"lm_head", "re:.*gate"});
  EXPECT_TRUE(r.plan.ignore_matches[0].empty());
  EXPECT_EQ(r.plan.ignore_matches[1], std::vector<std::string>{"model.layers.0.mlp.gate_proj"});
  // The plan records which entry took gate_proj out.
  const auto d = std::find_if(
      r.plan.decisions.begin(), r.plan.decisions.end(),
      [](const TensorDecision& t) { return t.name == "model.layers.0.mlp.gate_proj.weight"; });
  ASSERT_NE(d, r.plan.decisions.end());
  EXPECT_EQ(d->fate, Fate::kCopy);
  EXPECT_EQ(d->rule, "ignored by 're:.*gate'");
  // L8 explains the prefix match, L3 reports the split gate/up pair.
  const auto l8 = with_id(r.findings, "L8");
  ASSERT_EQ(l8.size(), 1u);
  EXPECT_EQ(l8[0].severity, Severity::kInfo);
  EXPECT_EQ(l8[0].tensors, std::vector<std::string>{"model.layers.0.mlp.gate_proj.weight"});
  EXPECT_EQ(l8[0].fix, "if you meant whole names, write --ignore 're:.*gate$' instead");
  ASSERT_EQ(with_id(r.findings, "L3").size(), 1u);
}

TEST(LintL1, NearMissForLiteralWithModelPrefix) {
  const Linted r =
      lint_layout(dflash_layers(), kDFlashConfig,
                  {"model.layers.0.self_attn.qkv_proj", "re:.*layers\\.1\\.self_attn\\.qkv_proj$"});
  const auto l1 = with_id(r.findings, "L1");
  ASSERT_EQ(l1.size(), 1u);
  EXPECT_EQ(l1[0].severity, Severity::kWarning);
  EXPECT_TRUE(contains(l1[0].message,
                       "near misses (names containing 'qkv_proj'): "
                       "layers.0.self_attn.qkv_proj, layers.1.self_attn.qkv_proj"));
  EXPECT_EQ(l1[0].fix,
            "the names differ by a prefix: use --ignore 're:.*layers\\.0\\.self_attn\\.qkv_proj$' "
            "instead");
  EXPECT_EQ(l1[0].tensors, (std::vector<std::string>{"layers.0.self_attn.qkv_proj.weight",
                                                     "layers.1.self_attn.qkv_proj.weight"}));
}

TEST(LintL1, EntryMatchingOnlyAnEmbeddingIsInfo) {
  std::vector<FakeSpec> specs = llama_layer();
  specs.push_back({"model.embed_tokens.weight", {32000, 2048}});
  const Linted r = lint_layout(specs, kLlamaConfig, {"model.embed_tokens"});
  const auto l1 = with_id(r.findings, "L1");
  ASSERT_EQ(l1.size(), 1u);
  EXPECT_EQ(l1[0].severity, Severity::kInfo);
  EXPECT_EQ(l1[0].tensors, std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_TRUE(contains(l1[0].message, "embedding"));
}

TEST(LintL1, TargetEntryThatMatchesNothing) {
  const Linted r = lint_layout(llama_layer(), kLlamaConfig, {}, {"re:.*attention\\.wq$"});
  const auto l1 = with_id(r.findings, "L1");
  ASSERT_EQ(l1.size(), 1u);
  EXPECT_TRUE(contains(l1[0].message, "targets entry 're:.*attention\\.wq$' matched 0 modules"));
  EXPECT_EQ(r.plan.target_matches, std::vector<std::vector<std::vector<std::string>>>{{{}}});
}

// The default ignore entries are made from the modules they keep: L1 never
// reports them. A given entry that matches nothing still gets the warning.
TEST(LintL1, DefaultEntriesAreNotReported) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), dflash_layers(), kDFlashConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  PlanOptions options;
  options.ignore = {"output_head"};
  const QuantizePlan plan = make_plan(checkpoint, options);
  EXPECT_EQ(plan.options.ignore, (std::vector<std::string>{"re:.*qkv_proj$", "output_head"}));
  EXPECT_EQ(plan.n_default_ignore, 1u);
  const auto l1 = with_id(run_lint(checkpoint, plan, LintOptions{}), "L1");
  ASSERT_EQ(l1.size(), 1u);
  EXPECT_EQ(l1[0].severity, Severity::kWarning);
  EXPECT_TRUE(contains(l1[0].message, "ignore entry 'output_head' matched 0 modules"))
      << l1[0].message;
}

// The default targets ({"Linear"}) are never reported by L1, even with
// nothing to match; L9 reports an input with nothing to quantize.
TEST(LintL1, DefaultTargetsAreNotReported) {
  const Linted r = lint_layout({{"model.norm.weight", {2048}}}, kLlamaConfig, {});
  EXPECT_TRUE(with_id(r.findings, "L1").empty());
  ASSERT_EQ(with_id(r.findings, "L9").size(), 1u);
}

// ---- L2 ----

// A draft's names get "model." in vLLM and its entries are not mapped: a
// literal taken from the checkpoint leaves the module kept here but packed
// in vLLM's eyes. The fix matches both names.
TEST(LintL2, LiteralEntryInDFlashDraftGetsAnchoredRegex) {
  const Linted r = lint_layout(dflash_layers(), kDFlashConfig,
                               {"layers.0.self_attn.qkv_proj", "layers.1.self_attn.qkv_proj"});
  const auto l2 = with_id(r.findings, "L2");
  ASSERT_EQ(l2.size(), 2u);
  EXPECT_EQ(l2[0].severity, Severity::kError);
  EXPECT_EQ(l2[0].tensors, std::vector<std::string>{"layers.0.self_attn.qkv_proj.weight"});
  EXPECT_TRUE(contains(l2[0].message, "the module is 'model.layers.0.self_attn.qkv_proj'"))
      << l2[0].message;
  EXPECT_EQ(l2[0].fix, "use --ignore 're:^(model\\.)?layers\\.0\\.self_attn\\.qkv_proj$' instead");
  EXPECT_TRUE(with_id(r.findings, "L4").empty());   // both qkv_proj kept here
  EXPECT_TRUE(with_id(r.findings, "L13").empty());  // L2 explains them
  // The fix clears it.
  const Linted fixed = lint_layout(dflash_layers(), kDFlashConfig,
                                   {"re:^(model\\.)?layers\\.0\\.self_attn\\.qkv_proj$",
                                    "re:^(model\\.)?layers\\.1\\.self_attn\\.qkv_proj$"});
  EXPECT_TRUE(blocking_findings(fixed.findings, false, false).empty());
}

// The fix matches the module under both names and no other module (re:.*fc$
// would also take layers.0.mlp.fc).
TEST(LintL2, FixMatchesBothNamesAndNothingElse) {
  std::vector<FakeSpec> specs = dflash_layers();
  specs.push_back({"layers.0.mlp.fc.weight", {3072, 3072}});
  const Linted r = lint_layout(specs, kDFlashConfig, {"re:.*qkv_proj$", "fc"});
  const auto l2 = with_id(r.findings, "L2");
  ASSERT_EQ(l2.size(), 1u);
  EXPECT_EQ(l2[0].severity, Severity::kError);
  EXPECT_EQ(l2[0].fix, "use --ignore 're:^(model\\.)?fc$' instead");
}

// A literal vLLM does not match but another entry covers in vLLM: info.
TEST(LintL2, CoveredByAnotherEntryIsInfo) {
  const Linted r = lint_layout(dflash_layers(), kDFlashConfig,
                               {"layers.0.self_attn.qkv_proj", "re:.*qkv_proj$"});
  const auto l2 = with_id(r.findings, "L2");
  ASSERT_EQ(l2.size(), 1u);
  EXPECT_EQ(l2[0].severity, Severity::kInfo);
  EXPECT_EQ(l2[0].fix, "none needed; remove the entry to silence this");
}

TEST(LintL2, NotRaisedWhenNamesAlreadyCarryModelPrefix) {
  const Linted r = lint_layout(llama_layer(), kLlamaConfig, {"model.layers.0.mlp.down_proj"});
  EXPECT_TRUE(with_id(r.findings, "L2").empty());
}

TEST(LintL2, UnprefixedLayersCountAsPrefixedAtLoad) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), llama_layer("layers.0."), kLlamaConfig);
  EXPECT_TRUE(names_prefixed_at_load(open_checkpoint(dir.path())));
  test::TempDir dir2;
  test::write_sparse_checkpoint(dir2.path(), llama_layer(), kLlamaConfig);
  EXPECT_FALSE(names_prefixed_at_load(open_checkpoint(dir2.path())));
}

// ---- L3 ----

TEST(LintL3, QkvSplitAcrossLayersIsOneError) {
  std::vector<FakeSpec> specs = llama_layer("model.layers.0.");
  const auto layer1 = llama_layer("model.layers.1.");
  specs.insert(specs.end(), layer1.begin(), layer1.end());
  const Linted r = lint_layout(specs, kLlamaConfig, {"re:.*v_proj$"});
  const auto l3 = with_id(r.findings, "L3");
  ASSERT_EQ(l3.size(), 1u);
  EXPECT_EQ(l3[0].severity, Severity::kError);
  EXPECT_EQ(l3[0].tensors.size(), 6u);
  EXPECT_TRUE(contains(l3[0].message, "fused layer qkv_proj is split in 2 blocks"));
  EXPECT_TRUE(contains(l3[0].message, "k_proj, q_proj quantized but v_proj not"));
  EXPECT_TRUE(contains(l3[0].message, "ignored by 're:.*v_proj$'"));
  // Keeping the groups whole takes exactly their members.
  EXPECT_TRUE(contains(
      l3[0].fix, "--ignore 're:^model\\.layers\\.\\d+\\.self_attn\\.(k_proj|q_proj|v_proj)$'"))
      << l3[0].fix;
}

TEST(LintL3, GateUpSplitIsError) {
  const Linted r = lint_layout(llama_layer(), kLlamaConfig, {"re:.*up_proj$"});
  const auto l3 = with_id(r.findings, "L3");
  ASSERT_EQ(l3.size(), 1u);
  EXPECT_EQ(l3[0].tensors, (std::vector<std::string>{"model.layers.0.mlp.gate_proj.weight",
                                                     "model.layers.0.mlp.up_proj.weight"}));
  EXPECT_TRUE(contains(l3[0].message, "fused layer gate_up_proj"));
}

TEST(LintL3, ExpertsOfOneLayerSplitIsError) {
  std::vector<FakeSpec> specs = mixtral_layer();
  for (const std::string w : {"w1", "w2", "w3"}) {
    specs.push_back({"model.layers.0.block_sparse_moe.experts.1." + w + ".weight",
                     w == "w2" ? std::vector<std::uint64_t>{4096, 14336}
                               : std::vector<std::uint64_t>{14336, 4096}});
  }
  const Linted r = lint_layout(specs, kLlamaConfig, {"re:.*gate$", "re:.*experts\\.1\\."});
  const auto l3 = with_id(r.findings, "L3");
  ASSERT_EQ(l3.size(), 1u);
  EXPECT_EQ(l3[0].tensors.size(), 6u);
  EXPECT_TRUE(contains(l3[0].message,
                       "the experts of 1 MoE layer "
                       "(model.layers.0.block_sparse_moe.experts) are split: 3 "
                       "expert weights quantized one way, 3 not"));
}

// Every member quantized, but by two scheme groups (--scheme-for targets
// that take q_proj apart): the fix is one scheme for all of them, not an
// ignore entry to narrow (nothing is ignored).
TEST(LintL3, QkvSplitBetweenTwoSchemesNamesTheGroups) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), llama_layer(), kLlamaConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  PlanOptions options;
  options.default_ignore = false;
  options.groups.clear();
  add_scheme_group(options, scheme_for_group("re:.*q_proj$=W8A16"));
  SchemeGroup rest = preset_group("W4A16");
  rest.targets = {"Linear"};
  add_scheme_group(options, rest);
  const QuantizePlan plan = make_plan(checkpoint, options);
  const auto l3 = with_id(run_lint(checkpoint, plan, LintOptions{1}), "L3");
  ASSERT_EQ(l3.size(), 1u);
  EXPECT_EQ(l3[0].fix,
            "give them one scheme (the targets of the groups W4A16, W8A16 take k_proj, v_proj "
            "apart from q_proj: make one group's targets take all of them) or keep them all "
            "in 16 bits (--ignore 're:^model\\.layers\\.0\\.self_attn\\.(k_proj|q_proj|"
            "v_proj)$')");
  EXPECT_FALSE(contains(l3[0].fix, "narrow the ignore entry"));
}

TEST(LintL3, WholeGroupIgnoredIsFine) {
  const Linted r = lint_layout(llama_layer(), kLlamaConfig, {"re:.*[qkv]_proj$"});
  EXPECT_TRUE(with_id(r.findings, "L3").empty());
}

// ---- L4 ----

TEST(LintL4, DFlashDraftWithQuantizedQkvIsError) {
  const Linted r = lint_layout(dflash_layers(), kDFlashConfig, {});
  const auto l4 = with_id(r.findings, "L4");
  ASSERT_EQ(l4.size(), 1u);
  EXPECT_EQ(l4[0].severity, Severity::kError);
  EXPECT_EQ(l4[0].tensors, (std::vector<std::string>{"layers.0.self_attn.qkv_proj.weight",
                                                     "layers.1.self_attn.qkv_proj.weight"}));
  EXPECT_EQ(l4[0].fix, "--ignore 're:.*qkv_proj$'");
}

TEST(LintL4, DFlashConfigAloneIdentifiesTheDraft) {
  const json config = {{"architectures", {"LagunaForCausalLM"}}, {"dflash_config", json::object()}};
  EXPECT_EQ(with_id(lint_layout(dflash_layers(), config, {}).findings, "L4").size(), 1u);
  EXPECT_TRUE(with_id(lint_layout(dflash_layers(), kLlamaConfig, {}).findings, "L4").empty());
  EXPECT_TRUE(
      with_id(lint_layout(dflash_layers(), config, {"re:.*qkv_proj$"}).findings, "L4").empty());
}

// A draft stored with separate q/k/v projections: vLLM fuses them into the
// qkv_proj it reads raw, so all three must stay 16-bit, and the fix covers
// q_proj, k_proj, v_proj and a fused qkv_proj alike.
TEST(LintL4, DFlashDraftWithSeparateQkvIsError) {
  std::vector<FakeSpec> specs{{"fc.weight", {3072, 9216}}};
  for (const std::string p : {"q_proj", "k_proj", "v_proj"}) {
    specs.push_back({"layers.0.self_attn." + p + ".weight", {3072, 3072}});
  }
  specs.push_back({"layers.0.self_attn.o_proj.weight", {3072, 3072}});
  const Linted r = lint_layout(specs, kDFlashConfig, {});
  const auto l4 = with_id(r.findings, "L4");
  ASSERT_EQ(l4.size(), 1u);
  EXPECT_EQ(l4[0].severity, Severity::kError);
  EXPECT_EQ(l4[0].tensors, (std::vector<std::string>{"layers.0.self_attn.q_proj.weight",
                                                     "layers.0.self_attn.k_proj.weight",
                                                     "layers.0.self_attn.v_proj.weight"}));
  EXPECT_EQ(l4[0].fix, "--ignore 're:.*[qkv]_proj$'");
  EXPECT_TRUE(contains(l4[0].message, "3 tensors would be quantized")) << l4[0].message;
  // The fix it suggests clears it, and leaves o_proj quantized.
  const Linted fixed = lint_layout(specs, kDFlashConfig, {"re:.*[qkv]_proj$"});
  EXPECT_TRUE(with_id(fixed.findings, "L4").empty());
  EXPECT_EQ(fixed.plan.ignore_matches[0].size(), 3u);
}

// ---- L5 ----

TEST(LintL5, RouterShapeNoTensorParallelDegreeWorks) {
  std::vector<FakeSpec> specs = {{"model.layers.0.mlp.gate.weight", {60, 2048}},
                                 {"model.layers.0.mlp.shared_expert.up_proj.weight", {5632, 2048}}};
  const Linted r = lint_layout(specs, kLlamaConfig, {});
  const auto l5 = with_id(r.findings, "L5");
  ASSERT_EQ(l5.size(), 1u);
  EXPECT_EQ(l5[0].severity, Severity::kWarning);
  EXPECT_EQ(l5[0].tensors, std::vector<std::string>{"model.layers.0.mlp.gate.weight"});
  EXPECT_TRUE(contains(l5[0].message, "[60, 2048] (column-parallel"));
  EXPECT_TRUE(contains(l5[0].message, "out_features 60 per shard is not a multiple of 64"));
  // A warning: only releases before the padding refuse it, and it says so.
  EXPECT_TRUE(contains(l5[0].message, "older vLLM releases' pack-quantized kernels"));
  EXPECT_TRUE(contains(l5[0].message, "(current vLLM pads these shapes and runs them)"));
  EXPECT_TRUE(contains(l5[0].message, "TP degrees these releases run: none of 1, 2, 4, 8"));
  // Exactly this module, not every module called gate.
  EXPECT_EQ(l5[0].fix, "keep it in 16 bits: --ignore 'model.layers.0.mlp.gate'");
}

TEST(LintL5, TensorParallelSplitsOutOrInFeatures) {
  // k_proj is column-parallel: 256 / 8 = 32 rows per shard. down_proj is
  // row-parallel: 5632 / 8 = 704 columns per shard, not a multiple of 128.
  EXPECT_TRUE(
      with_id(lint_layout(llama_layer(), kLlamaConfig, {}, {"Linear"}, 4).findings, "L5").empty());
  const auto l5 =
      with_id(lint_layout(llama_layer(), kLlamaConfig, {}, {"Linear"}, 8).findings, "L5");
  ASSERT_EQ(l5.size(), 3u);
  EXPECT_EQ(l5[0].tensors, std::vector<std::string>{"model.layers.0.self_attn.k_proj.weight"});
  EXPECT_TRUE(contains(l5[0].message, "out_features 32 per shard is not a multiple of 64"));
  EXPECT_TRUE(contains(l5[0].message, "TP degrees these releases run: 1, 2, 4"));
  // k_proj is fused with q_proj and v_proj: the fix keeps the whole group.
  EXPECT_EQ(l5[0].fix,
            "keep it with the rest of the fused group (q_proj, v_proj) in 16 bits: --ignore "
            "'re:^model\\.layers\\.0\\.self_attn\\.(k_proj|q_proj|v_proj)$', or serve with "
            "--tp 1 or 2 or 4");
  EXPECT_EQ(l5[1].tensors, std::vector<std::string>{"model.layers.0.self_attn.v_proj.weight"});
  EXPECT_EQ(l5[2].tensors, std::vector<std::string>{"model.layers.0.mlp.down_proj.weight"});
  EXPECT_TRUE(contains(l5[2].message, "(row-parallel, split along in_features)"));
  EXPECT_TRUE(contains(l5[2].message, "in_features 704 per shard is not a multiple of 128"));
  // 704 is not a multiple of the group size either: vLLM refuses that shard.
  EXPECT_TRUE(contains(l5[2].message,
                       "in_features 704 per shard is not a multiple of the group "
                       "size 128"));
  EXPECT_EQ(l5[2].severity, Severity::kError);
  EXPECT_TRUE(contains(l5[2].message, "vLLM's pack-quantized kernels"));
  EXPECT_FALSE(contains(l5[2].message, "older"));
  EXPECT_EQ(l5[0].severity, Severity::kWarning);
}

// Following the L5 fix for a member of a fused group must not lead into an
// L3 error (a split group).
TEST(LintL5, FixForFusedMemberKeepsTheGroupWhole) {
  const auto l5 =
      with_id(lint_layout(llama_layer(), kLlamaConfig, {}, {"Linear"}, 8).findings, "L5");
  ASSERT_GE(l5.size(), 2u);
  const std::string fix = l5[1].fix;  // v_proj's
  const std::string entry =
      fix.substr(fix.find('\'') + 1, fix.find('\'', fix.find('\'') + 1) - fix.find('\'') - 1);
  EXPECT_EQ(entry, "re:^model\\.layers\\.0\\.self_attn\\.(k_proj|q_proj|v_proj)$");
  const Linted fixed = lint_layout(llama_layer(), kLlamaConfig, {entry}, {"Linear"}, 8);
  EXPECT_TRUE(with_id(fixed.findings, "L3").empty());
  const auto l5_after = with_id(fixed.findings, "L5");
  ASSERT_EQ(l5_after.size(), 1u);
  EXPECT_EQ(l5_after[0].tensors, std::vector<std::string>{"model.layers.0.mlp.down_proj.weight"});
  // down_proj is in no fused group: its fix names it alone.
  EXPECT_TRUE(contains(l5_after[0].fix, "--ignore 'model.layers.0.mlp.down_proj'"))
      << l5_after[0].fix;
}

// FP8_BLOCK follows vLLM's validate_fp8_block_shape (fp8_utils.py): at tp 1
// only the non-last partitions of a merged layer need out_features a multiple
// of 128 (q and k of qkv, gate of gate_up); at tp > 1 every column shard does;
// DeepSeek's kv_a_proj_with_mqa (576 rows, the last partition of a merged
// layer that is never split) is never checked.
TEST(LintL5, Fp8BlockChecksMergedPartitionsAndSplitShards) {
  const std::vector<FakeSpec> specs = {
      {"model.layers.0.self_attn.q_proj.weight", {320, 256}},
      {"model.layers.0.self_attn.k_proj.weight", {256, 256}},
      {"model.layers.0.self_attn.v_proj.weight", {80, 256}},
      {"model.layers.0.mlp.gate_proj.weight", {256, 256}},
      {"model.layers.0.mlp.up_proj.weight", {200, 256}},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", {576, 256}},
  };
  const auto l5_at = [&](unsigned tp) {
    test::TempDir dir;
    test::write_sparse_checkpoint(dir.path(), specs, kLlamaConfig);
    const Checkpoint checkpoint = open_checkpoint(dir.path());
    PlanOptions options;
    options.groups = {preset_group("FP8_BLOCK")};
    options.ignore = {};
    const QuantizePlan plan = make_plan(checkpoint, options);
    std::vector<std::string> tensors;
    for (const Finding& f : with_id(run_lint(checkpoint, plan, LintOptions{tp}), "L5")) {
      EXPECT_EQ(f.severity, Severity::kError) << f.message;
      tensors.insert(tensors.end(), f.tensors.begin(), f.tensors.end());
    }
    std::sort(tensors.begin(), tensors.end());
    return tensors;
  };
  EXPECT_EQ(l5_at(1), std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight"});
  // tp 2: q 160, v 40 and up 100 rows per shard; k and gate 128.
  EXPECT_EQ(l5_at(2), (std::vector<std::string>{"model.layers.0.mlp.up_proj.weight",
                                                "model.layers.0.self_attn.q_proj.weight",
                                                "model.layers.0.self_attn.v_proj.weight"}));
}

TEST(LintL5, IgnoredTensorsAreNotChecked) {
  const Linted r = lint_layout({{"model.layers.0.mlp.gate.weight", {60, 2048}}}, kLlamaConfig,
                               {"re:.*mlp\\.gate$"});
  EXPECT_TRUE(with_id(r.findings, "L5").empty());
}

// ---- L9 ----

TEST(LintL9, NothingQuantizedIsError) {
  // Every 2-D weight ignored: the output would be the input plus a config.
  const Linted r = lint_layout(llama_layer(), kLlamaConfig, {"re:.*"});
  const auto l9 = with_id(r.findings, "L9");
  ASSERT_EQ(l9.size(), 1u);
  EXPECT_EQ(l9[0].severity, Severity::kError);
  EXPECT_TRUE(contains(l9[0].message, "no tensor would be quantized (of 9 tensors)"))
      << l9[0].message;
  EXPECT_TRUE(with_id(lint_layout(llama_layer(), kLlamaConfig, {}).findings, "L9").empty());
}

// ---- L14 ----

// The fixture model_free_ptq wrote: each expert's gate_proj and up_proj got
// their own NVFP4 global scale; vLLM's MoE method reads the gate's for both.
TEST(LintL14, Nvfp4ExpertGateAndUpWithTheirOwnGlobalScalesWarn) {
  const test::GoldenCase moe = test::find_case("qwen3moe-fused-bf16-nvfp4a16");
  const Checkpoint checkpoint = open_checkpoint(test::input_of(moe));
  const QuantizePlan plan = make_plan(checkpoint, test::plan_of(moe));
  const auto l14 = with_id(run_lint(checkpoint, plan, {}), "L14");
  ASSERT_EQ(l14.size(), 1u);
  EXPECT_EQ(l14[0].severity, Severity::kWarning);
  ASSERT_EQ(l14[0].tensors.size(), 8u);
  EXPECT_EQ(l14[0].tensors[0], "model.layers.0.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(l14[0].tensors[1], "model.layers.0.mlp.experts.0.up_proj.weight");
  EXPECT_EQ(l14[0].tensors[7], "model.layers.0.mlp.experts.3.up_proj.weight");
  EXPECT_TRUE(contains(l14[0].message,
                       "4 pairs of modules that vLLM fuses into one layer (MoE "
                       "experts) get their own NVFP4 global scales"))
      << l14[0].message;
  EXPECT_TRUE(
      contains(l14[0].message, "w13_weight_global_scale[:, 0] in compressed_tensors_moe.py"))
      << l14[0].message;
  EXPECT_FALSE(contains(l14[0].message, "dense layers")) << l14[0].message;
  // A warning: quantize still writes the output model_free_ptq writes.
  EXPECT_TRUE(blocking_findings(run_lint(checkpoint, plan, {}), false, false).empty());

  // Dense gate/up and q/k/v share one scale: nothing to say.
  const test::GoldenCase dense = test::find_case("llama-bf16-nvfp4a16");
  const Checkpoint dense_checkpoint = open_checkpoint(test::input_of(dense));
  EXPECT_TRUE(
      with_id(run_lint(dense_checkpoint, make_plan(dense_checkpoint, test::plan_of(dense)), {}),
              "L14")
          .empty());
  // Partners in different shards still share.
  const test::GoldenCase sharded = test::find_case("sharded-bf16-nvfp4a16");
  const Checkpoint sharded_checkpoint = open_checkpoint(test::input_of(sharded));
  EXPECT_TRUE(with_id(run_lint(sharded_checkpoint,
                               make_plan(sharded_checkpoint, test::plan_of(sharded)), {}),
                      "L14")
                  .empty());
  // A scheme without a global scale: nothing to say.
  const test::GoldenCase w4 = test::find_case("qwen3moe-fused-bf16-w4a16");
  const Checkpoint w4_checkpoint = open_checkpoint(test::input_of(w4));
  EXPECT_TRUE(
      with_id(run_lint(w4_checkpoint, make_plan(w4_checkpoint, test::plan_of(w4)), {}), "L14")
          .empty());
}

// ---- L10 ----

// vLLM's Marlin WNA16 kernels run group sizes -1 (channel-wise), 32, 64 and
// 128 (vllm/model_executor/layers/quantization/utils/marlin_utils.py,
// MARLIN_SUPPORTED_GROUP_SIZES). Every size here divides both in_features
// of the layer (2048, 5632), so only L10 can object.
TEST(LintL10, GroupSizesMarlinDoesNotRunAreErrors) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), llama_layer(), kLlamaConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  const auto lint_with = [&](long long group_size) {
    PlanOptions options;
    options.default_ignore = false;
    apply_group_size(options.groups.front(), group_size);
    const QuantizePlan plan = make_plan(checkpoint, options);
    return with_id(run_lint(checkpoint, plan, LintOptions{}), "L10");
  };
  for (const long long g : {16LL, 256LL, 512LL}) {
    SCOPED_TRACE(g);
    const auto l10 = lint_with(g);
    ASSERT_EQ(l10.size(), 1u);
    EXPECT_EQ(l10[0].severity, Severity::kError);
    EXPECT_EQ(l10[0].tensors.size(), 7u);  // every quantized weight of the layer
    EXPECT_TRUE(contains(l10[0].message, fmt::format("group size {} is not one vLLM's Marlin "
                                                     "kernels run (channel-wise, 32, 64, 128)",
                                                     g)))
        << l10[0].message;
    EXPECT_TRUE(contains(l10[0].fix, "--group-size 32, 64 or 128, or -1")) << l10[0].fix;
    EXPECT_EQ(blocking_findings(l10, false, false).size(), 1u);
    EXPECT_TRUE(blocking_findings(l10, false, true).empty());  // --allow-unloadable
  }
  for (const long long g : {-1LL, 32LL, 64LL, 128LL}) {
    SCOPED_TRACE(g);
    EXPECT_TRUE(lint_with(g).empty());
  }
}

// 3- and 2-bit codes: no group size makes vLLM run them (Marlin takes 4 and
// 8), so the fix names the code width and --allow L10, not a group size.
TEST(LintL10, CodesOtherThanFourAndEightBitsNameTheWidth) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), llama_layer(), kLlamaConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  for (const int bits : {2, 3}) {
    SCOPED_TRACE(bits);
    PlanOptions options;
    options.default_ignore = false;
    options.groups.front().weights.num_bits = bits;
    const QuantizePlan plan = make_plan(checkpoint, options);
    const auto l10 = with_id(run_lint(checkpoint, plan, LintOptions{}), "L10");
    ASSERT_EQ(l10.size(), 1u);
    EXPECT_TRUE(contains(l10[0].message,
                         fmt::format("vLLM has no weight-only kernel for {}-bit integer codes "
                                     "(Marlin: 4, 8)",
                                     bits)))
        << l10[0].message;
    EXPECT_EQ(l10[0].fix, fmt::format("use 4- or 8-bit codes (num_bits 4 or 8, e.g. --scheme "
                                      "W4A16 or W8A16); {}-bit codes load in transformers "
                                      "through compressed-tensors, not in vLLM: pass --allow L10 "
                                      "to write them anyway",
                                      bits));
  }
}

// ---- L6 ----

TEST(LintL6, TiedEmbeddingsWithQuantizedLmHeadIsError) {
  json config = kLlamaConfig;
  config["tie_word_embeddings"] = true;
  std::vector<FakeSpec> specs = llama_layer();
  specs.push_back({"model.embed_tokens.weight", {32000, 2048}});
  specs.push_back({"lm_head.weight", {32000, 2048}});
  const auto l6 = with_id(lint_layout(specs, config, {"model.embed_tokens"}).findings, "L6");
  ASSERT_EQ(l6.size(), 1u);
  EXPECT_EQ(l6[0].severity, Severity::kError);
  EXPECT_EQ(l6[0].tensors, std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(l6[0].fix, "--ignore 'lm_head' (the default ignore list has it)");
  EXPECT_TRUE(with_id(lint_layout(specs, config, {"lm_head"}).findings, "L6").empty());
  EXPECT_TRUE(
      with_id(lint_layout(specs, kLlamaConfig, {"model.embed_tokens"}).findings, "L6").empty());
}

TEST(LintL6, TextConfigTieCounts) {
  const json config = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                       {"text_config", {{"tie_word_embeddings", true}}}};
  const auto l6 = with_id(
      lint_layout({{"language_model.lm_head.weight", {1024, 256}}}, config, {}).findings, "L6");
  ASSERT_EQ(l6.size(), 1u);
  // The entry for this head under the checkpoint's and vLLM's names.
  EXPECT_EQ(l6[0].fix,
            "--ignore 're:^(language_model\\.)?lm_head$' (the default ignore list has it)");
}

// ---- L7 ----

// Stacked experts of a family whose vLLM loader reads experts one by one:
// ctquant does not split them, and no ignore entry makes the copy loadable.
TEST(LintL7, StackedExpertsVllmReadsPerExpertAreRefused) {
  std::vector<FakeSpec> specs = llama_layer();
  specs.push_back({"model.layers.0.mlp.experts.gate_up.weight", {8, 1024, 2048}});
  const auto l7 = with_id(lint_layout(specs, kLlamaConfig, {}).findings, "L7");
  ASSERT_EQ(l7.size(), 1u);
  EXPECT_EQ(l7[0].severity, Severity::kError);
  EXPECT_EQ(l7[0].tensors, std::vector<std::string>{"model.layers.0.mlp.experts.gate_up.weight"});
  EXPECT_TRUE(contains(l7[0].message, "model.layers.0.mlp.experts.gate_up.weight [8, 1024, 2048]"))
      << l7[0].message;
  EXPECT_TRUE(
      contains(l7[0].message, "Llama's vLLM loader reads the experts of a layer per expert"))
      << l7[0].message;
  EXPECT_TRUE(contains(l7[0].fix, "no ignore entry makes this loadable"));
  EXPECT_EQ(with_id(lint_layout(specs, kLlamaConfig, {"re:.*\\.gate_up$"}).findings, "L7").size(),
            1u);
}

// ---- policy ----

TEST(LintPolicy, BlockingFindings) {
  const auto finding = [](const char* id, Severity severity) {
    Finding f;
    f.id = id;
    f.severity = severity;
    return f;
  };
  const std::vector<Finding> findings = {finding("L1", Severity::kWarning),
                                         finding("L4", Severity::kError),
                                         finding("L8", Severity::kInfo)};
  const auto ids = [&](bool strict, bool allow) {
    std::vector<std::string> out;
    for (const Finding* f : blocking_findings(findings, strict, allow)) out.push_back(f->id);
    return out;
  };
  EXPECT_EQ(ids(false, false), std::vector<std::string>{"L4"});
  EXPECT_EQ(ids(true, false), (std::vector<std::string>{"L1", "L4"}));
  EXPECT_TRUE(ids(false, true).empty());
  EXPECT_EQ(ids(true, true), std::vector<std::string>{"L1"});
}

TEST(LintPolicy, RejectsZeroTensorParallelDegree) {
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), llama_layer(), kLlamaConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  const PlanOptions defaults;
  const QuantizePlan plan = make_plan(checkpoint, defaults);
  try {
    run_lint(checkpoint, plan, LintOptions{0});
    FAIL() << "expected a usage error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  }
}

// ---- inside quantize ----

// A small DFlash-style draft with real values and Marlin-friendly shapes.
std::vector<FakeSpec> small_dflash() {
  return {{"fc.weight", {256, 384}},
          {"layers.0.self_attn.qkv_proj.weight", {384, 256}},
          {"layers.0.self_attn.o_proj.weight", {256, 256}},
          {"norm.weight", {256}}};
}

QuantizeOptions small_options(const fs::path& in, const fs::path& out) {
  QuantizeOptions o = default_quantize_options();
  o.input = in;
  o.output = out;
  o.threads = 2;
  o.fsync = false;
  o.plan.ignore = {};
  o.plan.default_ignore = false;  // the draft's qkv_proj is then quantized (L4)
  return o;
}

bool has_temp_sibling(const fs::path& dir) {
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().filename().string().find(".ctquant-tmp-") != std::string::npos) return true;
  }
  return false;
}

TEST(QuantizeLint, ErrorStopsTheRunAndWritesNothing) {
  test::TempDir dir;
  test::write_random_checkpoint(dir / "in", small_dflash(), kDFlashConfig);
  QuantizeOptions o = small_options(dir / "in", dir / "out");
  std::size_t plans_seen = 0;
  o.on_plan = [&](const Checkpoint&, const QuantizePlan&, const std::vector<Finding>& f) {
    ++plans_seen;
    EXPECT_EQ(with_id(f, "L4").size(), 1u);
  };
  try {
    quantize(o);
    FAIL() << "expected a lint error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kLint);
    EXPECT_TRUE(contains(e.what(), "L4 error: DFlash draft"));
    EXPECT_TRUE(contains(e.what(), "fix: --ignore 're:.*qkv_proj$'"));
    EXPECT_TRUE(contains(e.what(), "--allow-unloadable"));
  }
  EXPECT_EQ(plans_seen, 1u);
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(has_temp_sibling(dir.path()));
}

TEST(QuantizeLint, DryRunStopsOnErrorsToo) {
  test::TempDir dir;
  test::write_random_checkpoint(dir / "in", small_dflash(), kDFlashConfig);
  QuantizeOptions o = small_options(dir / "in", dir / "out");
  o.dry_run = true;
  try {
    quantize(o);
    FAIL() << "expected a lint error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kLint);
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(QuantizeLint, AllowUnloadableWritesAnyway) {
  test::TempDir dir;
  test::write_random_checkpoint(dir / "in", small_dflash(), kDFlashConfig);
  QuantizeOptions o = small_options(dir / "in", dir / "out");
  o.allow_unloadable = true;
  const QuantizeSummary s = quantize(o);
  EXPECT_EQ(with_id(s.findings, "L4").size(), 1u);
  EXPECT_EQ(s.tensors_quantized, 3u);
  EXPECT_TRUE(fs::exists(dir / "out" / "model.safetensors"));
}

TEST(QuantizeLint, StrictTurnsWarningsIntoErrors) {
  test::TempDir dir;
  test::write_random_checkpoint(dir / "in", small_dflash(), kDFlashConfig);
  QuantizeOptions o = small_options(dir / "in", dir / "out");
  o.plan.ignore = {"re:.*qkv_proj$", "output_head"};  // output_head: L1 warning
  o.strict = true;
  try {
    quantize(o);
    FAIL() << "expected a lint error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kLint);
    EXPECT_TRUE(contains(e.what(), "L1 warning: ignore entry 'output_head' matched 0 modules"));
    EXPECT_TRUE(contains(e.what(), "--strict"));
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
  o.strict = false;
  EXPECT_EQ(quantize(o).tensors_quantized, 2u);
}

TEST(QuantizeLintCli, DFlashWithoutQkvIgnoreExitsOneAndWritesNothing) {
  test::TempDir dir;
  const fs::path input = test::golden_dir() / "dflash-bf16-sharded" / "input";
  const auto r = test::run_ctquant(
      {"quantize", input.string(), (dir / "out").string(), "--no-default-ignore"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty());
  EXPECT_TRUE(contains(r.err, "L4 error: DFlash draft"));
  EXPECT_TRUE(contains(r.err, "fix: --ignore 're:.*qkv_proj$'"));
  EXPECT_TRUE(contains(r.err, "warning: L5:"));  // g_proj [4, 256], reported but not blocking
  EXPECT_FALSE(fs::exists(dir / "out"));

  const auto allowed = test::run_ctquant({"quantize", input.string(), (dir / "out").string(),
                                          "--no-default-ignore", "--allow-unloadable", "-q"});
  EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_TRUE(fs::exists(dir / "out" / "model.safetensors.index.json"));
}

// With no options the draft's default ignore list keeps qkv_proj and g_proj
// in 16 bits: the golden case's own list.
TEST(QuantizeLintCli, DFlashDefaultsKeepQkvAndGProj) {
  test::TempDir dir;
  const fs::path input = test::golden_dir() / "dflash-bf16-sharded" / "input";
  const auto r = test::run_ctquant({"quantize", input.string(), (dir / "out").string(), "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const json qc = test::read_json(dir / "out" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], json({"re:.*qkv_proj$", "re:.*g_proj$"}));
}

TEST(QuantizeLintCli, StrictAndTensorParallelFlags) {
  test::TempDir dir;
  const fs::path input = test::golden_dir() / "dflash-bf16-sharded" / "input";
  const std::vector<std::string> base = {"quantize",    input.string(),   (dir / "out").string(),
                                         "--ignore",    "re:.*qkv_proj$", "--ignore",
                                         "re:.*g_proj$"};
  // fc [256, 768] is row-parallel: 768 / 4 = 192 columns per shard.
  std::vector<std::string> tp4 = base;
  tp4.insert(tp4.end(), {"--tp", "4", "--strict", "--dry-run"});
  const auto r = test::run_ctquant(tp4);
  EXPECT_EQ(r.exit_code, 1);
  // 192 is not a multiple of the group size 128 either: an error.
  EXPECT_TRUE(contains(r.err, "L5 error: vLLM's pack-quantized kernels"));
  EXPECT_TRUE(contains(r.err, "fc.weight"));
  std::vector<std::string> tp2 = base;
  tp2.insert(tp2.end(), {"--tp", "2", "--strict", "--dry-run"});
  // Shapes run at tp 2; under --strict only L16 stops it (fc packed, which
  // older SGLang releases cannot load).
  const auto r2 = test::run_ctquant(tp2);
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_TRUE(contains(r2.err, "L16 warning: DFlash fc would be packed")) << r2.err;
  EXPECT_FALSE(contains(r2.err, "L5")) << r2.err;
  tp2.erase(std::find(tp2.begin(), tp2.end(), "--strict"));
  EXPECT_EQ(test::run_ctquant(tp2).exit_code, 0);
}

// ---- fixes pass lint ----

// Lints `dir` with options and checks every fix (expect_fixes_pass_lint);
// options that make_plan refuses for this checkpoint are skipped.
void check_fixes(const fs::path& dir, const PlanOptions& options, unsigned tp,
                 const std::string& what) {
  SCOPED_TRACE(what);
  const Checkpoint checkpoint = open_checkpoint(dir);
  QuantizePlan plan;
  try {
    plan = make_plan(checkpoint, options);
  } catch (const Error&) {
    return;
  }
  expect_fixes_pass_lint(checkpoint, options, run_lint(checkpoint, plan, LintOptions{tp}), tp);
}

// Options that provoke findings with fixes on any checkpoint: no default
// list, a tensor name, an unprefixed module name, one member of a fused
// group, one expert, an unanchored pattern, a TP degree the shapes do not
// split into.
void check_fixes_with_provocations(const fs::path& dir, const PlanOptions& base,
                                   const std::string& what) {
  const Checkpoint checkpoint = open_checkpoint(dir);
  std::string linear;  // a quantized module
  std::string q_proj;
  std::string expert;
  QuantizePlan plan;
  try {
    plan = make_plan(checkpoint, base);
  } catch (const Error&) {
    return;  // a case ctquant refuses (SKIP_UNLESS_SUPPORTED in test_golden.cpp)
  }
  for (const PlannedModule& m : plan.modules) {
    if (m.kind != PlannedModule::Kind::kQuantize) continue;
    if (linear.empty()) linear = m.name;
    if (q_proj.empty() && m.name.ends_with(".q_proj")) q_proj = m.name;
    if (expert.empty() && m.name.find(".experts.") != std::string::npos) expert = m.name;
  }
  check_fixes(dir, base, 1, what + ", as given");
  check_fixes(dir, base, 3, what + ", --tp 3");
  PlanOptions no_default = base;
  no_default.default_ignore = false;
  check_fixes(dir, no_default, 1, what + ", --no-default-ignore");
  const auto with_entry = [&](const std::string& entry) {
    PlanOptions o = base;
    o.ignore.push_back(entry);
    check_fixes(dir, o, 1, what + ", --ignore '" + entry + "'");
  };
  if (!linear.empty()) {
    with_entry(linear + ".weight");
    with_entry(linear.substr(linear.rfind('.') + 1));
  }
  if (!q_proj.empty()) with_entry(q_proj);
  if (!expert.empty()) with_entry(expert);
  with_entry("re:.*gate");
}

// A fix's machine form changes the options as the command line would: the
// removed entry goes, added entries are appended once, options are set.
TEST(LintFixes, ApplyFixChangesTheOptionsAsTheCommandLineWould) {
  PlanOptions given;
  given.ignore = {"lm_head", "re:.*gate"};
  Finding f;
  f.id = "L8";
  f.fix_removes = "re:.*gate";
  f.fix_ignore = {"re:.*gate$", "lm_head"};
  f.fix_options = {"--quantize-vision"};
  EXPECT_TRUE(has_fix(f));
  const PlanOptions fixed = apply_fix(given, f);
  EXPECT_EQ(fixed.ignore, (std::vector<std::string>{"lm_head", "re:.*gate$"}));
  EXPECT_TRUE(fixed.quantize_vision);
  Finding targets;
  targets.id = "L1";
  targets.fix_removes = "Linaer";
  targets.fix_removes_target = true;
  targets.fix_targets = {"Linear"};
  given.groups.front().targets = {"Linaer", "re:.*mlp.*"};
  EXPECT_EQ(apply_fix(given, targets).groups.front().targets,
            (std::vector<std::string>{"re:.*mlp.*", "Linear"}));
  EXPECT_FALSE(has_fix(Finding{}));
  Finding unknown;
  unknown.id = "L15";
  unknown.fix_options = {"--no-such-option"};
  EXPECT_THROW(apply_fix(given, unknown), std::logic_error);
}

// Every fix lint prints, applied as the command line would apply it, passes
// lint: on every golden input with its case's options and with options that
// provoke findings, and on every model family (the cases the lint tests
// build check their own fixes the same way, in lint_layout).
TEST(LintFixes, EveryFixPassesLintOnGoldenInputsAndFamilies) {
  for (const test::GoldenCase& c : test::golden_cases()) {
    check_fixes_with_provocations(test::input_of(c), test::plan_of(c), "golden " + c.name);
  }
  for (const test::Family family : test::all_families()) {
    test::TempDir dir;
    test::write_family(dir.path(), family, /*random=*/false);
    check_fixes_with_provocations(dir.path(), PlanOptions{},
                                  std::string("family ") + test::family_name(family));
  }
}

// Regression: an ignore entry naming a tensor got the plain module name as
// its first fix, which L2 then refused in a DFlash draft (vLLM prefixes the
// names with model.); the fix is now the entry vLLM matches too.
TEST(LintL1, TensorNameFixIsAnEntryVllmMatchesToo) {
  const Linted r = lint_layout(dflash_layers(), kDFlashConfig,
                               {"re:.*qkv_proj$", "layers.0.mlp.down_proj.weight"});
  const auto l1 = with_id(r.findings, "L1");
  ASSERT_EQ(l1.size(), 1u);
  EXPECT_EQ(l1[0].fix_removes, "layers.0.mlp.down_proj.weight");
  ASSERT_EQ(l1[0].fix_ignore.size(), 1u);
  EXPECT_NE(l1[0].fix_ignore[0], "layers.0.mlp.down_proj");
  EXPECT_EQ(l1[0].fix, "use --ignore '" + l1[0].fix_ignore[0] + "' instead");
  const Linted fixed =
      lint_layout(dflash_layers(), kDFlashConfig, {"re:.*qkv_proj$", l1[0].fix_ignore[0]});
  EXPECT_TRUE(with_id(fixed.findings, "L2").empty());
  EXPECT_TRUE(with_id(fixed.findings, "L1").empty());
}

// Regression: L5's fix for experts kept only the experts whose shape vLLM
// cannot run, which split the MoE layer (L3) and disagreed with vLLM's
// experts.0 probes (L13); it now keeps every expert of the layer.
TEST(LintL5, ExpertFixKeepsEveryExpertOfTheLayer) {
  std::vector<FakeSpec> specs = {{"model.layers.0.mlp.gate.weight", {4, 2048}},
                                 {"model.layers.0.self_attn.o_proj.weight", {2048, 2048}}};
  for (int e = 0; e < 4; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    specs.push_back({p + "gate_proj.weight", {768, 2048}});
    specs.push_back({p + "up_proj.weight", {768, 2048}});
    specs.push_back({p + "down_proj.weight", {2048, 768}});
  }
  json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                 {"model_type", "qwen3_moe"},
                 {"num_experts", 4},
                 {"hidden_size", 2048},
                 {"moe_intermediate_size", 768},
                 {"tie_word_embeddings", false}};
  // 768 / 8 = 96 columns of down_proj per shard: not a multiple of the group size.
  const Linted r = lint_layout(specs, config, {"re:.*mlp\\.gate$"}, {"Linear"}, 8);
  const auto l5 = with_id(r.findings, "L5");
  ASSERT_FALSE(l5.empty());
  const Finding* down = nullptr;
  for (const Finding& f : l5) {
    if (f.severity == Severity::kError) down = &f;
  }
  ASSERT_NE(down, nullptr);
  EXPECT_TRUE(contains(down->fix, "with every expert of 1 MoE layer")) << down->fix;
  std::vector<std::string> ignore = {"re:.*mlp\\.gate$"};
  ignore.insert(ignore.end(), down->fix_ignore.begin(), down->fix_ignore.end());
  const Linted fixed = lint_layout(specs, config, ignore, {"Linear"}, 8);
  EXPECT_TRUE(with_id(fixed.findings, "L3").empty());
  EXPECT_TRUE(with_id(fixed.findings, "L13").empty());
  EXPECT_TRUE(blocking_findings(fixed.findings, false, false).empty());
}

// Regression: L13 asks for an entry that keeps an empty weight (written as it
// is) unquantized in vLLM; L1 then called that entry pointless. An entry
// that keeps a module vLLM would build quantized is not reported.
TEST(LintL1, EntryKeepingAnEmptyWeightFromVllmIsNotPointless) {
  std::vector<FakeSpec> specs = llama_layer();
  specs.push_back({"model.layers.0.mlp.extra_proj.weight", {0, 2048}});
  const Linted r = lint_layout(specs, kLlamaConfig, {});
  const auto l13 = with_id(r.findings, "L13");
  ASSERT_EQ(l13.size(), 1u);
  ASSERT_EQ(l13[0].fix_ignore.size(), 1u);
  const Linted fixed = lint_layout(specs, kLlamaConfig, l13[0].fix_ignore);
  EXPECT_TRUE(with_id(fixed.findings, "L1").empty());
  EXPECT_TRUE(with_id(fixed.findings, "L13").empty());
}

// ---- tied heads ----

// A family checkpoint planned and linted with the default ignore list (or
// the options given).
Linted lint_family(test::Family family, PlanOptions options = {}, unsigned tp = 1) {
  test::TempDir dir;
  test::write_family(dir.path(), family, /*random=*/false);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  Linted out;
  out.plan = make_plan(checkpoint, options);
  out.findings = run_lint(checkpoint, out.plan, LintOptions{tp});
  expect_fixes_pass_lint(checkpoint, options, out.findings, tp);
  return out;
}

// Regression: a tied Qwen3 without an lm_head tensor got no lm_head entry, and
// transformers 5.12 + compressed-tensors 0.18 failed to load the output
// (AttributeError: Linear has no attribute 'weight'). The default list has it
// first, with its reason; lint says nothing about it.
TEST(DefaultIgnore, TiedModelWithoutHeadTensorGetsLmHeadEntry) {
  const Linted r = lint_family(test::Family::kQwen3Tied);
  ASSERT_GE(r.plan.options.ignore.size(), 2u);
  EXPECT_EQ(r.plan.options.ignore[0], "lm_head");
  EXPECT_TRUE(contains(r.plan.ignore_reasons[0], "AttributeError: Linear has no attribute"));
  EXPECT_EQ(r.plan.options.ignore[1], "model.embed_tokens");
  EXPECT_TRUE(r.findings.empty()) << render_findings_text(r.findings);
  // An untied model keeps its own head's entry only.
  const Linted llama = lint_family(test::Family::kLlama);
  EXPECT_EQ(
      std::count(llama.plan.options.ignore.begin(), llama.plan.options.ignore.end(), "lm_head"), 1);
}

// Without the default list the missing entry is a warning whose fix, given
// as --ignore, is not then called an entry that matched nothing (L1).
TEST(LintL6, TiedModelWithoutLmHeadEntryWarnsForTransformers) {
  PlanOptions options;
  options.default_ignore = false;
  const Linted r = lint_family(test::Family::kQwen3Tied, options);
  const auto l6 = with_id(r.findings, "L6");
  ASSERT_EQ(l6.size(), 1u);
  EXPECT_EQ(l6[0].severity, Severity::kWarning);
  EXPECT_TRUE(contains(l6[0].message, "AttributeError: Linear has no attribute 'weight'"));
  EXPECT_EQ(l6[0].fix_ignore, std::vector<std::string>{"lm_head"});
  options.ignore = {"lm_head"};
  const Linted fixed = lint_family(test::Family::kQwen3Tied, options);
  EXPECT_TRUE(with_id(fixed.findings, "L6").empty());
  EXPECT_TRUE(with_id(fixed.findings, "L1").empty());
  EXPECT_TRUE(with_id(fixed.findings, "L2").empty());
}

// ---- L15: what stays in 16 bits ----

// Regression: gpt-oss's stacked experts stay in BF16 (vLLM reads them only
// stacked) and a W4A16 run said so only in info lines; most of the model's
// linear weights are there, so it is a warning naming why and that no
// option changes it.
TEST(LintL15, GptOssStackedExpertsKeptInSixteenBitsWarn) {
  const Linted r = lint_family(test::Family::kGptOss);
  const auto l15 = with_id(r.findings, "L15");
  ASSERT_EQ(l15.size(), 1u);
  EXPECT_EQ(l15[0].severity, Severity::kWarning);
  EXPECT_LT(r.plan.linear_params_quantized * 2, r.plan.linear_params);
  EXPECT_TRUE(contains(l15[0].message, "below 80%")) << l15[0].message;
  EXPECT_TRUE(contains(l15[0].message, "the experts of 2 MoE layers stay in 16 bits as a whole"))
      << l15[0].message;
  EXPECT_TRUE(contains(l15[0].message, "no option changes it")) << l15[0].message;
  EXPECT_TRUE(contains(l15[0].message, "model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_FALSE(has_fix(l15[0]));
  // --strict stops the run on it.
  EXPECT_EQ(blocking_findings(r.findings, true, false).size(), 1u);
}

// Ignore entries that keep most of a dense model: the fix is to remove them.
TEST(LintL15, IgnoreEntriesKeepingMostWeightsWarnWithTheEntry) {
  const Linted r = lint_layout(llama_layer(), kLlamaConfig, {"re:.*mlp\\..*"});
  const auto l15 = with_id(r.findings, "L15");
  ASSERT_EQ(l15.size(), 1u);
  EXPECT_TRUE(contains(l15[0].message, "your ignore entry 're:.*mlp\\..*'")) << l15[0].message;
  EXPECT_EQ(l15[0].fix_removes, "re:.*mlp\\..*");
  EXPECT_EQ(l15[0].fix, "remove the ignore entry 're:.*mlp\\..*'");
  // A default dense run quantizes every linear weight: nothing to say.
  EXPECT_TRUE(with_id(lint_family(test::Family::kLlama).findings, "L15").empty());
}

// Regression: on a DFlash draft whose fc is about 7% of its linear weights
// (the Laguna layout), L16's fix (keep fc in 16 bits) dropped the share
// under 80% and L15 then said to remove that entry: under --strict no
// command passed. A module kept for the engines as L16 advises is not
// counted against the share.
TEST(LintL15, DraftFcKeptAsL16AdvisesPassesStrict) {
  const Linted packed = lint_layout(dflash_layers(), kDFlashConfig, {"re:.*qkv_proj$"});
  const auto l16 = with_id(packed.findings, "L16");
  ASSERT_EQ(l16.size(), 1u);
  EXPECT_TRUE(with_id(packed.findings, "L15").empty());
  PlanOptions options = packed.plan.options;
  options = apply_fix(options, l16[0]);
  std::vector<std::string> ignore = options.ignore;
  ASSERT_EQ(ignore.size(), 2u);
  const Linted fixed = lint_layout(dflash_layers(), kDFlashConfig, ignore);
  // fc is now 16-bit: below 80% of all linear weights, not of the others.
  EXPECT_LT(fixed.plan.linear_params_quantized * 10, fixed.plan.linear_params * 8);
  EXPECT_TRUE(with_id(fixed.findings, "L16").empty());
  EXPECT_TRUE(with_id(fixed.findings, "L15").empty());
  EXPECT_TRUE(blocking_findings(fixed.findings, true, false).empty());
  // The same share kept by an entry of another kind is still a warning.
  const Linted other = lint_layout(dflash_layers(), kDFlashConfig,
                                   {"re:.*qkv_proj$", "re:.*layers\\.0\\.mlp\\.down_proj$"});
  EXPECT_EQ(with_id(other.findings, "L15").size(), 1u);
}

// A vision tower kept by default: the option that changes it is
// --quantize-vision.
TEST(LintL15, KeptVisionTowerNamesQuantizeVision) {
  // The tower and projector of this layout are about a third of its linear
  // weights.
  const Linted r = lint_family(test::Family::kQwen25Vl);
  const auto l15 = with_id(r.findings, "L15");
  ASSERT_EQ(l15.size(), 1u);
  EXPECT_TRUE(contains(l15[0].message, "--quantize-vision quantizes vision and audio towers"))
      << l15[0].message;
  EXPECT_EQ(l15[0].fix_options, std::vector<std::string>{"--quantize-vision"});
  PlanOptions vision;
  vision.quantize_vision = true;
  EXPECT_TRUE(with_id(lint_family(test::Family::kQwen25Vl, vision).findings, "L15").empty());
}

// ---- L16: draft modules each engine builds differently ----

TEST(LintL16, Eagle3FcPackedNamesVllmAndSglang) {
  const Linted r = lint_family(test::Family::kEagle3);
  const auto l16 = with_id(r.findings, "L16");
  ASSERT_EQ(l16.size(), 1u);
  EXPECT_EQ(l16[0].severity, Severity::kWarning);
  EXPECT_EQ(l16[0].tensors, std::vector<std::string>{"fc.weight"});
  EXPECT_TRUE(contains(l16[0].message, "vllm/model_executor/models/llama_eagle3.py"));
  EXPECT_TRUE(contains(l16[0].message, "python/sglang/srt/models/llama_eagle3.py"));
  EXPECT_TRUE(contains(l16[0].message, "random initial values"));
  PlanOptions fixed;
  fixed.ignore = l16[0].fix_ignore;
  EXPECT_TRUE(with_id(lint_family(test::Family::kEagle3, fixed).findings, "L16").empty());
}

TEST(LintL16, DFlashFcAndMtpFcPackedNameTheEngines) {
  const Linted dflash = lint_layout(dflash_layers(), kDFlashConfig, {"re:.*qkv_proj$"});
  const auto l16 = with_id(dflash.findings, "L16");
  ASSERT_EQ(l16.size(), 1u);
  EXPECT_TRUE(contains(l16[0].message, "DFlash fc would be packed (fc)"));
  EXPECT_TRUE(contains(l16[0].message, "qwen3_dflash.py"));
  EXPECT_TRUE(contains(l16[0].message, "python/sglang/srt/models/dflash.py"));
  // Qwen3-Next's MTP layer: vLLM packs mtp.fc, SGLang reads a plain Linear.
  const Linted mtp = lint_layout(
      {{"mtp.fc.weight", {2048, 4096}}, {"model.layers.0.mlp.down_proj.weight", {2048, 2048}}},
      json{{"architectures", {"Qwen3NextForCausalLM"}}, {"model_type", "qwen3_next"}}, {});
  const auto mtp16 = with_id(mtp.findings, "L16");
  ASSERT_EQ(mtp16.size(), 1u);
  EXPECT_TRUE(contains(mtp16[0].message, "MTP fc would be packed (mtp.fc)"));
  EXPECT_TRUE(contains(mtp16[0].message, "qwen3_next_mtp.py"));
}

// DFlash2's selector and convolution projections are read as 16-bit
// tensors by the engines that run them: kept by default, warned when packed.
TEST(LintL16, DFlash2SelectorKeptByDefaultAndWarnedWhenPacked) {
  std::vector<FakeSpec> specs = dflash_layers();
  specs.push_back({"candidate_selector.hidden_projection.weight", {256, 3072}});
  specs.push_back({"layers.0.attention_conv.kernel_projection.weight", {384, 3072}});
  test::TempDir dir;
  test::write_sparse_checkpoint(dir.path(), specs, kDFlashConfig);
  const Checkpoint checkpoint = open_checkpoint(dir.path());
  const QuantizePlan plan = make_plan(checkpoint, PlanOptions{});
  for (const TensorDecision& d : plan.decisions) {
    if (d.name.find("projection") != std::string::npos) {
      EXPECT_NE(d.fate, Fate::kQuantize) << d.name;
    }
  }
  // fc is packed by default (L16 says what each engine does with it); the
  // selector and convolution projections are not.
  const auto by_default = with_id(run_lint(checkpoint, plan, {}), "L16");
  ASSERT_EQ(by_default.size(), 1u);
  EXPECT_EQ(by_default[0].tensors, std::vector<std::string>{"fc.weight"});
  const Linted packed = lint_layout(specs, kDFlashConfig, {"re:.*qkv_proj$"});
  const auto l16 = with_id(packed.findings, "L16");
  ASSERT_EQ(l16.size(), 2u);
  EXPECT_TRUE(contains(l16[1].message, "DFlash2 candidate selector"));
  EXPECT_TRUE(contains(l16[1].message, "xllm/python/models/qwen3_dflash2.py"));
  EXPECT_EQ(l16[1].tensors.size(), 2u);
}

// ---- L17: an untied config without a head ----

TEST(LintL17, UntiedConfigWithoutHeadTensorWarnsAndStrictStops) {
  std::vector<FakeSpec> model = llama_layer();
  model.push_back({"model.embed_tokens.weight", {32000, 2048}});
  const Linted r = lint_layout(model, kLlamaConfig, {});
  const auto l17 = with_id(r.findings, "L17");
  ASSERT_EQ(l17.size(), 1u);
  EXPECT_EQ(l17[0].severity, Severity::kWarning);
  EXPECT_TRUE(contains(l17[0].message, "tie_word_embeddings: false"));
  EXPECT_TRUE(contains(l17[0].message, "uninitialised head"));
  EXPECT_FALSE(blocking_findings(r.findings, true, false).empty());
  // With a head, or tied, or a draft: nothing.
  std::vector<FakeSpec> with_head = model;
  with_head.push_back({"lm_head.weight", {32000, 2048}});
  EXPECT_TRUE(with_id(lint_layout(with_head, kLlamaConfig, {"lm_head"}).findings, "L17").empty());
  json tied = kLlamaConfig;
  tied["tie_word_embeddings"] = true;
  EXPECT_TRUE(with_id(lint_layout(model, tied, {}).findings, "L17").empty());
  // A sample of some layers (no embedding either) is not a model missing its head.
  EXPECT_TRUE(with_id(lint_layout(llama_layer(), kLlamaConfig, {}).findings, "L17").empty());
  EXPECT_TRUE(
      with_id(lint_layout(dflash_layers(), kDFlashConfig, {"re:.*qkv_proj$"}).findings, "L17")
          .empty());
}

// ---- L20 ----

// config.json declares 4 layers and the checkpoint holds layers 0 and 2
// with the embedding: a warning naming 1 and 3; --strict stops. All four
// layers, or a sample without the embedding, or no num_hidden_layers:
// nothing.
TEST(LintL20, DeclaredLayersWithoutTensorsWarnAndStrictStops) {
  std::vector<FakeSpec> model = llama_layer("model.layers.0.");
  for (const FakeSpec& s : llama_layer("model.layers.2.")) model.push_back(s);
  model.push_back({"model.embed_tokens.weight", {32000, 2048}});
  model.push_back({"lm_head.weight", {32000, 2048}});
  json config = kLlamaConfig;
  config["num_hidden_layers"] = 4;
  const Linted r = lint_layout(model, config, {"lm_head"});
  const auto l20 = with_id(r.findings, "L20");
  ASSERT_EQ(l20.size(), 1u);
  EXPECT_EQ(l20[0].severity, Severity::kWarning);
  EXPECT_TRUE(contains(l20[0].message,
                       "config.json says num_hidden_layers 4, but the checkpoint "
                       "holds no tensor of 2 of them (layers 1, 3)"))
      << l20[0].message;
  EXPECT_TRUE(contains(l20[0].message, "uninitialised"));
  EXPECT_FALSE(blocking_findings(r.findings, true, false).empty());
  config["num_hidden_layers"] = 3;
  for (const FakeSpec& s : llama_layer("model.layers.1.")) model.push_back(s);
  EXPECT_TRUE(with_id(lint_layout(model, config, {"lm_head"}).findings, "L20").empty());
  config["num_hidden_layers"] = 8;
  EXPECT_TRUE(with_id(lint_layout(llama_layer(), config, {}).findings, "L20").empty());
  EXPECT_TRUE(with_id(lint_layout(model, kLlamaConfig, {"lm_head"}).findings, "L20").empty());
}

// ---- the rule table ----

// docs/cli.md's lint table: each row's id, severity column and anchor.
struct CliLintRow {
  std::string severities;
  std::string anchor;
};

std::map<std::string, CliLintRow> cli_lint_rows(const std::string& markdown) {
  static const std::regex row(R"re(^\| (?:<a id="([^"]*)"></a>)?(L[0-9]+) \| ([^|]+) \|)re");
  std::map<std::string, CliLintRow> out;
  std::istringstream in(markdown);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, row)) continue;
    const std::string id = m[2];
    EXPECT_FALSE(out.contains(id)) << id << " twice in docs/cli.md";
    out[id] = CliLintRow{m[3], m[1]};
  }
  return out;
}

std::string severities_text(const LintRule& rule) {
  return rule.also ? fmt::format("{} / {}", severity_name(rule.severity), severity_name(*rule.also))
                   : std::string(severity_name(rule.severity));
}

const std::string& cli_md() {
  static const std::string text = test::read_file(fs::path(CTQUANT_DOCS_DIR) / "cli.md");
  return text;
}

TEST(LintRuleTable, IdsAndSeveritiesAreThoseOfCliMd) {
  const std::map<std::string, CliLintRow> rows = cli_lint_rows(cli_md());
  ASSERT_EQ(rows.size(), 20u) << "docs/cli.md's lint table";
  std::set<std::string> ids;
  for (const LintRule& rule : lint_rules()) {
    EXPECT_TRUE(ids.insert(std::string(rule.id)).second) << rule.id << " twice in the table";
    const auto it = rows.find(std::string(rule.id));
    ASSERT_NE(it, rows.end()) << rule.id << " is not in docs/cli.md's lint table";
    EXPECT_EQ(it->second.severities, severities_text(rule)) << rule.id;
  }
  std::set<std::string> documented;
  for (const auto& [id, row] : rows) documented.insert(id);
  EXPECT_EQ(ids, documented);
}

TEST(LintRuleTable, EachAnchorIsItsRuleRowInCliMd) {
  const std::map<std::string, CliLintRow> rows = cli_lint_rows(cli_md());
  for (const LintRule& rule : lint_rules()) {
    SCOPED_TRACE(std::string(rule.id));
    EXPECT_FALSE(rule.title.empty());
    EXPECT_NE(rule.run, nullptr);
    ASSERT_TRUE(rows.contains(std::string(rule.id)));
    EXPECT_EQ(rows.at(std::string(rule.id)).anchor, rule.anchor);
    // The anchor exists once in the whole document.
    const std::string tag = fmt::format("id=\"{}\"", rule.anchor);
    const std::size_t first = cli_md().find(tag);
    EXPECT_NE(first, std::string::npos);
    EXPECT_EQ(cli_md().find(tag, first + 1), std::string::npos);
  }
}

// The table parser reads rows with and without an anchor, and the severity
// column as written.
TEST(LintRuleTable, CliRowsParseWithTheirAnchors) {
  const auto rows = cli_lint_rows(
      "| id | severity | finding | fix |\n|---|---|---|---|\n"
      "| <a id=\"lint-l2\"></a>L2 | error / info | a | b |\n| L9 | error | c | d |\n");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows.at("L2").severities, "error / info");
  EXPECT_EQ(rows.at("L2").anchor, "lint-l2");
  EXPECT_EQ(rows.at("L9").severities, "error");
  EXPECT_EQ(rows.at("L9").anchor, "");
}

}  // namespace
}  // namespace ctquant
