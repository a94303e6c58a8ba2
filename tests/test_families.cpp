// Every model family of tests/families.hpp through quantize: each tensor's
// fate, the exit code (the lint findings that stop the run), and the ignore
// list written to config.json, evaluated with vLLM's rules against vLLM's
// module names (vllm_match.hpp): every module vLLM builds quantized must be
// packed, every other one a 16-bit .weight, and vLLM must not raise.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/matcher.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/model/vllm_match.hpp"
#include "ctquant/report/roles_report.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "families.hpp"
#include "test_support.hpp"
#include "verify_test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct FamilyCase {
  Family family;
  // The findings that stop the run (ids, in order); empty: exit 0.
  std::vector<std::string> blocking;
  // The ignore list written to config.json.
  std::vector<std::string> ignore;
  // Fate of every tensor: the first entry (ignore-style: literal or re:)
  // matching the tensor name decides; every tensor must match one.
  std::vector<std::pair<std::string, Fate>> fates;
};

// Shared fate rules: norms, biases and other 1-D tensors are copied.
const std::pair<std::string, Fate> kNormsCopied{"re:.*(norm|bias|sinks|inv_freq|d2t|t2d)$",
                                                Fate::kCopy};
const std::pair<std::string, Fate> kNormWeightsCopied{"re:.*norm[^.]*\\.weight$", Fate::kCopy};

std::vector<FamilyCase> family_cases() {
  const auto Q = Fate::kQuantize;
  const auto C = Fate::kCopy;
  const auto D = Fate::kDrop;
  return {
      {Family::kLlama,
       {},
       {"lm_head", "model.embed_tokens"},
       {kNormWeightsCopied,
        {"re:.*(lm_head|embed_tokens)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      // Tied, no lm_head tensor: the lm_head entry keeps transformers able to
      // tie the head it builds (absent_head_entry).
      {Family::kQwen3Tied,
       {},
       {"lm_head", "model.embed_tokens"},
       {kNormWeightsCopied, {"model.embed_tokens.weight", C}, {"re:.*_proj\\.weight$", Q}}},
      {Family::kQwen3Moe,
       {},
       {"lm_head", "model.embed_tokens", "re:.*mlp.gate$"},
       {kNormWeightsCopied,
        {"re:.*(lm_head|embed_tokens|mlp\\.gate)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      // Stacked experts vLLM's qwen3_moe.py reads per expert: split into
      // experts.{e}.gate_proj/up_proj/down_proj and quantized
      // (Qwen3MoeFused.SplitExpertsAreQuantized writes them).
      {Family::kQwen3MoeFused,
       {},
       {"lm_head", "model.embed_tokens", "re:.*mlp.gate$"},
       {kNormWeightsCopied,
        {"re:.*(lm_head|embed_tokens|mlp\\.gate)\\.weight$", C},
        {"re:.*experts\\.(gate_up|down)_proj$", Fate::kSplit},
        {"re:.*_proj\\.weight$", Q}}},
      {Family::kQwen2MoeShared,
       {},
       {"lm_head", "model.embed_tokens", "re:^model\\.layers\\.\\d+\\.mlp\\.gate$",
        "re:^model\\.layers\\.\\d+\\.mlp\\.shared_expert_gate$"},
       {kNormWeightsCopied,
        kNormsCopied,
        {"re:.*(lm_head|embed_tokens|mlp\\.gate|shared_expert_gate)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      {Family::kMixtral,
       {},
       {"lm_head", "model.embed_tokens", "re:^model\\.layers\\.\\d+\\.block_sparse_moe\\.gate$"},
       {kNormWeightsCopied,
        {"re:.*(lm_head|embed_tokens|block_sparse_moe\\.gate)\\.weight$", C},
        {"re:.*(_proj|w[123])\\.weight$", Q}}},
      // Block FP8: every F8 weight is dequantized, then quantized or (the
      // MTP eh_proj) written as BF16; the scales are dropped.
      {Family::kDeepSeekV3,
       {},
       {"lm_head", "model.layers.2.shared_head.head", "model.embed_tokens",
        "model.layers.2.embed_tokens", "re:^model\\.layers\\.\\d+\\.mlp\\.gate$",
        "model.layers.2.eh_proj"},
       {kNormWeightsCopied,
        {"re:.*(e_score_correction_bias)$", C},
        {"re:.*weight_scale_inv$", D},
        {"re:.*(lm_head|embed_tokens|shared_head\\.head|mlp\\.gate)\\.weight$", C},
        {"model.layers.2.eh_proj.weight", Fate::kDequantize},
        {"re:.*_(proj|mqa)\\.weight$", Q}}},
      {Family::kMistral3,
       {},
       {"re:^(language_model\\.)?lm_head$",
        "re:^(language_model\\.model\\.|model\\.language_model\\.)embed_tokens$",
        "re:^(model\\.)?multi_modal_projector\\..*", "re:^(model\\.)?vision_tower\\..*"},
       {kNormWeightsCopied,
        {"re:^model\\.(vision_tower|multi_modal_projector)\\.", C},
        {"re:.*(lm_head|embed_tokens)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      {Family::kLlavaOld,
       {},
       {"re:^(language_model\\.)?lm_head$",
        "re:^(language_model\\.model\\.|model\\.language_model\\.)embed_tokens$",
        "re:^(model\\.)?multi_modal_projector\\..*", "re:^(model\\.)?vision_tower\\..*"},
       {{"re:^(vision_tower|multi_modal_projector)\\.", C},
        kNormWeightsCopied,
        {"re:.*(lm_head|embed_tokens)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      {Family::kGemma3,
       {},
       {"lm_head", "re:^(language_model\\.model\\.|model\\.language_model\\.)embed_tokens$",
        "re:^(model\\.)?vision_tower\\..*"},
       {{"re:^model\\.(vision_tower|multi_modal_projector)\\.", C},
        kNormWeightsCopied,
        {"re:.*embed_tokens\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      {Family::kQwen25Vl,
       {},
       {"re:^(language_model\\.)?lm_head$",
        "re:^(language_model\\.model\\.|model\\.|model\\.language_model\\.)embed_tokens$",
        "re:^(model\\.)?visual\\..*"},
       {{"re:^visual\\.", C},
        kNormWeightsCopied,
        kNormsCopied,
        {"re:.*(lm_head|embed_tokens)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      // Stacked interleaved experts, read by vLLM's gpt_oss.py only stacked:
      // kept in 16 bits and their MoE layers named in ignore.
      {Family::kGptOss,
       {},
       {"lm_head", "re:^(model\\.embed_tokens|model\\.embedding)$",
        "re:^model\\.layers\\.\\d+\\.mlp\\.router$", "re:^model\\.layers\\.\\d+\\.mlp\\.experts\\..*"},
       {kNormWeightsCopied,
        kNormsCopied,
        {"re:.*experts\\.", C},
        {"re:.*(lm_head|embed_tokens|router)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
      {Family::kEagle3,
       {},
       {"lm_head"},
       {kNormWeightsCopied, kNormsCopied, {"lm_head.weight", C}, {"re:.*(_proj|fc)\\.weight$", Q}}},
      {Family::kMistralConsolidated,
       {},
       {"lm_head", "model.embed_tokens"},
       // The buffer the index omits is part of the model: written.
       {{"model.layers.0.self_attn.rotary_emb.inv_freq", C},
        kNormWeightsCopied,
        {"re:.*(lm_head|embed_tokens)\\.weight$", C},
        {"re:.*_proj\\.weight$", Q}}},
  };
}

const StackedExperts& stacked_of(const RoleAnalysis& roles, const std::string& tensor) {
  for (const StackedExperts& s : roles.stacked) {
    if (s.tensor == tensor) return s;
  }
  throw std::runtime_error("no stacked experts " + tensor);
}

struct Planned {
  Checkpoint checkpoint;
  QuantizePlan plan;
  std::vector<Finding> findings;
};

Planned plan_family(const fs::path& dir, const PlanOptions& options) {
  Planned p{open_checkpoint(dir), {}, {}};
  p.plan = make_plan(p.checkpoint, options);
  p.findings = run_lint(p.checkpoint, p.plan, LintOptions{});
  return p;
}

Planned plan_family(const fs::path& dir) {
  const PlanOptions defaults;
  return plan_family(dir, defaults);
}

std::vector<std::string> blocking_ids(const std::vector<Finding>& findings) {
  std::vector<std::string> ids;
  for (const Finding* f : blocking_findings(findings, false, false)) ids.push_back(f->id);
  return ids;
}

std::string describe(const std::vector<Finding>& findings) {
  std::string text;
  for (const Finding& f : findings) text += format_finding(f) + "\n";
  return text;
}

// vLLM's reading of the written ignore list and targets agrees with every
// module's planned state (packed or 16-bit), and vLLM raises on none.
void expect_vllm_agrees(const Planned& p) {
  std::vector<std::string> targets;
  for (const SchemeGroup& g : p.plan.options.groups) {
    targets.insert(targets.end(), g.targets.begin(), g.targets.end());
  }
  const VllmLoadRules rules(p.plan.roles, p.plan.options.ignore, targets);
  // Packed: a quantized weight, or a split stacked tensor whose per-expert
  // modules are quantized.
  std::map<std::string, bool> packed_of;
  for (const TensorDecision& d : p.plan.decisions) {
    bool packed = d.fate == Fate::kQuantize;
    for (std::size_t i : d.modules) {
      if (d.fate == Fate::kSplit && p.plan.modules[i].kind == PlannedModule::Kind::kQuantize) {
        packed = true;
      }
    }
    packed_of[d.name] = packed;
  }
  for (const ModuleInfo& m : p.plan.roles.modules) {
    if (m.role == ModuleRole::kParameter || m.role == ModuleRole::kNorm) continue;
    SCOPED_TRACE(m.module);
    const bool packed = packed_of[m.tensor];
    const VllmExpectation e = rules.expect(m);
    EXPECT_NE(e.state, VllmExpectation::State::kRefused) << e.why;
    EXPECT_FALSE(e.unmatched) << e.why;
    EXPECT_EQ(e.state == VllmExpectation::State::kPacked, packed)
        << "vLLM: " << expectation_state_name(e.state) << " (" << e.why << ")";
  }
}

void PrintTo(const FamilyCase& c, std::ostream* os) { *os << family_name(c.family); }

class Families : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(Families, FatesExitCodeAndIgnoreListAsVllmReadsIt) {
  const FamilyCase& c = GetParam();
  TempDir tmp;
  write_family(tmp / "in", c.family, /*random=*/false);
  const Planned p = plan_family(tmp / "in");
  EXPECT_EQ(blocking_ids(p.findings), c.blocking) << describe(p.findings);
  EXPECT_EQ(p.plan.options.ignore, c.ignore);
  EXPECT_EQ(p.plan.config["quantization_config"]["ignore"], json(c.ignore));
  EXPECT_EQ(p.plan.n_default_ignore, c.ignore.size());
  std::vector<std::string> entries;
  for (const auto& f : c.fates) entries.push_back(f.first);
  const ModuleMatcher rules(entries, ModuleMatcher::Role::kIgnore);
  for (const TensorDecision& d : p.plan.decisions) {
    const auto i = rules.first_match(d.name);
    ASSERT_TRUE(i.has_value()) << d.name << " has no expected fate";
    EXPECT_EQ(fate_name(d.fate), fate_name(c.fates[*i].second)) << d.name << ": " << d.rule;
  }
  if (c.blocking.empty()) expect_vllm_agrees(p);
  // The run itself: exit 0 with OUTPUT, or Error{kLint} and nothing written.
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  options.dry_run = true;
  if (c.blocking.empty()) {
    EXPECT_NO_THROW(quantize(options));
  } else {
    try {
      quantize(options);
      ADD_FAILURE() << "quantize did not stop";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kLint);
      EXPECT_EQ(exit_status(e.kind()), 1);
    }
  }
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

INSTANTIATE_TEST_SUITE_P(Every, Families, ::testing::ValuesIn(family_cases()),
                         [](const ::testing::TestParamInfo<FamilyCase>& param) {
                           return std::string(family_name(param.param.family));
                         });

// Every family of families.hpp has a case.
TEST(FamiliesCoverage, EveryFamilyHasACase) {
  std::vector<Family> covered;
  for (const FamilyCase& c : family_cases()) covered.push_back(c.family);
  EXPECT_EQ(covered, all_families());
}

// The families that write: OUTPUT verified against INPUT (codes recomputed,
// fates against the written ignore list, loadability: nothing vLLM would
// refuse or read differently).
class FamiliesWritten : public ::testing::TestWithParam<Family> {};

TEST_P(FamiliesWritten, OutputVerifiesAgainstSourceAndLoads) {
  TempDir tmp;
  write_family(tmp / "in", GetParam(), /*random=*/true);
  quantize(test_options(tmp / "in", tmp / "out"));
  const VerifyReport r = verify_against_source(tmp / "out", tmp / "in", VerifyOptions{});
  EXPECT_TRUE(r.same()) << render_verify_text(r);
  EXPECT_TRUE(r.notes.empty()) << render_verify_text(r);
}

INSTANTIATE_TEST_SUITE_P(Every, FamiliesWritten,
                         ::testing::Values(Family::kLlama, Family::kQwen3Tied, Family::kQwen3Moe,
                                           Family::kQwen3MoeFused, Family::kQwen2MoeShared, Family::kMixtral,
                                           Family::kDeepSeekV3, Family::kMistral3,
                                           Family::kGemma3, Family::kQwen25Vl, Family::kGptOss,
                                           Family::kEagle3, Family::kMistralConsolidated),
                         [](const ::testing::TestParamInfo<Family>& param) {
                           return std::string(family_name(param.param));
                         });

// ---- stacked experts: what the planner needs to split or keep them ----

TEST(StackedExperts, Qwen3MoeFusedDimsAndOrientation) {
  TempDir tmp;
  write_family(tmp / "in", Family::kQwen3MoeFused, false);
  const Planned p = plan_family(tmp / "in");
  ASSERT_EQ(p.plan.roles.stacked.size(), 4u);
  const StackedExperts& gate_up =
      stacked_of(p.plan.roles, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(gate_up.moe_layer, "model.layers.0.mlp.experts");
  EXPECT_EQ(gate_up.kind, StackedExperts::Kind::kGateUp);
  EXPECT_EQ(gate_up.experts, 4u);
  EXPECT_EQ(gate_up.intermediate, 128u);
  EXPECT_EQ(gate_up.hidden, 256u);
  // [4, 256, 256]: 2I == H, so the dims alone cannot tell; the layer's
  // down_proj [4, 256, 128] is [E, H, I], out_features first.
  EXPECT_EQ(gate_up.orientation, StackedExperts::Orientation::kOutIn);
  EXPECT_EQ(gate_up.proof, StackedExperts::Proof::kSibling);
  EXPECT_TRUE(gate_up.interleave_known);
  EXPECT_FALSE(gate_up.interleaved);
  EXPECT_FALSE(gate_up.vllm_loads_stacked);
  const StackedExperts& down = stacked_of(p.plan.roles, "model.layers.0.mlp.experts.down_proj");
  EXPECT_EQ(down.kind, StackedExperts::Kind::kDown);
  EXPECT_EQ(down.orientation, StackedExperts::Orientation::kOutIn);
  EXPECT_EQ(down.proof, StackedExperts::Proof::kShape);
  EXPECT_EQ(down.problem, "");
  // inspect says how gate and up share the rows of gate_up_proj only.
  const std::string roles_text = render_roles_text(p.checkpoint, p.plan);
  EXPECT_TRUE(contains(roles_text, "(proven by the layer's other stacked tensor), gate rows then up "
                                   "rows; vLLM loads per-expert tensors"))
      << roles_text;
  EXPECT_TRUE(contains(roles_text, "experts.down_proj (down_proj): E=4, I=128, H=256, orientation "
                                   "[E, out, in] (proven by the dims); vLLM loads"))
      << roles_text;
  // The plan says so, and splits it.
  const ModuleInfo* m = p.plan.roles.find("model.layers.0.mlp.experts.gate_up_proj");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->action, DefaultAction::kQuantize);
  EXPECT_NE(m->reason.find("stacked experts gate_up_proj: E=4, I=128, H=256, orientation [E, out, "
                           "in] (proven by the layer's other stacked tensor)"),
            std::string::npos)
      << m->reason;
  for (const TensorDecision& d : p.plan.decisions) {
    if (d.name == "model.layers.0.mlp.experts.gate_up_proj") {
      EXPECT_EQ(d.fate, Fate::kSplit);
      EXPECT_EQ(d.modules.size(), 8u);
    }
  }
}

TEST(StackedExperts, GptOssDimsOrientationAndInterleave) {
  TempDir tmp;
  write_family(tmp / "in", Family::kGptOss, false);
  const Planned p = plan_family(tmp / "in");
  ASSERT_EQ(p.plan.roles.stacked.size(), 4u);
  const StackedExperts& down = stacked_of(p.plan.roles, "model.layers.0.mlp.experts.down_proj");
  const StackedExperts& gate_up =
      stacked_of(p.plan.roles, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(gate_up.intermediate, 192u);
  // [4, 256, 384]: in_features (H = 256) first, proven by the dims.
  EXPECT_EQ(gate_up.orientation, StackedExperts::Orientation::kInOut);
  EXPECT_EQ(gate_up.proof, StackedExperts::Proof::kShape);
  EXPECT_TRUE(gate_up.interleaved);
  EXPECT_TRUE(gate_up.vllm_loads_stacked);
  EXPECT_EQ(down.orientation, StackedExperts::Orientation::kInOut);  // [E, I, H]
  EXPECT_EQ(down.proof, StackedExperts::Proof::kShape);
  const ModuleInfo* m = p.plan.roles.find("model.layers.1.mlp.experts.down_proj");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->role, ModuleRole::kStackedExperts);
  EXPECT_EQ(m->action, DefaultAction::kKeep);
  EXPECT_EQ(m->vllm_layer, "model.layers.1.mlp.experts");
}

// gpt-oss with --no-default-ignore: the kept stacked experts' MoE layers
// are no longer named, so vLLM's probes would build them quantized (L7),
// and the head, embedding and routers stay right only by section 2.
TEST(StackedExperts, GptOssWithoutDefaultIgnoreIsRefused) {
  TempDir tmp;
  write_family(tmp / "in", Family::kGptOss, false);
  PlanOptions options;
  options.default_ignore = false;
  const Planned p = plan_family(tmp / "in", options);
  const std::vector<std::string> ids = blocking_ids(p.findings);
  EXPECT_NE(std::find(ids.begin(), ids.end(), "L7"), ids.end()) << describe(p.findings);
  EXPECT_NE(std::find(ids.begin(), ids.end(), "L12"), ids.end()) << describe(p.findings);
}

// A Qwen3-MoE checkpoint with transformers-v5 fused experts is written with
// per-expert packed experts.{e}.gate_proj/up_proj/down_proj, which vLLM's
// qwen3_moe.py loads, and verifies as loadable.
TEST(Qwen3MoeFused, SplitExpertsAreQuantized) {
  TempDir tmp;
  write_family(tmp / "in", Family::kQwen3MoeFused, true);
  quantize(test_options(tmp / "in", tmp / "out"));
  const SafetensorsHeader h = read_header(tmp / "out" / "model.safetensors", "out");
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string m = "model.layers." + std::to_string(l) + ".mlp.experts." +
                              std::to_string(e) + "." + proj;
        EXPECT_NE(h.find(m + ".weight_packed"), nullptr) << m;
      }
    }
  }
  const VerifyReport r = verify_against_source(tmp / "out", tmp / "in", VerifyOptions{});
  EXPECT_TRUE(r.same()) << render_verify_text(r);
  EXPECT_TRUE(r.notes.empty()) << render_verify_text(r);
}

// ---- options ----

// --quantize-vision: the towers' Linear layers are quantized; their plain
// modules (Mistral3's patch merger) and embeddings stay named.
TEST(FamilyOptions, QuantizeVisionKeepsPlainModules) {
  TempDir tmp;
  write_family(tmp / "in", Family::kMistral3, false);
  PlanOptions options;
  options.quantize_vision = true;
  const Planned p = plan_family(tmp / "in", options);
  EXPECT_EQ(p.plan.options.ignore,
            (std::vector<std::string>{
                "re:^(language_model\\.)?lm_head$",
                "re:^(language_model\\.model\\.|model\\.language_model\\.)embed_tokens$",
                "re:^(model\\.)?multi_modal_projector\\.patch_merger\\.merging_layer$"}));
  EXPECT_TRUE(blocking_ids(p.findings).empty()) << describe(p.findings);
  expect_vllm_agrees(p);
  for (const TensorDecision& d : p.plan.decisions) {
    if (d.name == "model.vision_tower.transformer.layers.0.attention.q_proj.weight" ||
        d.name == "model.multi_modal_projector.linear_1.weight") {
      EXPECT_EQ(d.fate, Fate::kQuantize) << d.name;
    }
  }
}

// --ignore adds to the default list; --no-default-ignore starts empty, and
// then the modules vLLM loads unquantized would be packed (L12).
TEST(FamilyOptions, IgnoreAddsAndNoDefaultIgnoreStartsEmpty) {
  TempDir tmp;
  write_family(tmp / "in", Family::kQwen2MoeShared, false);
  PlanOptions options;
  options.ignore = {"re:.*layers\\.1\\.mlp\\.shared_expert\\..*", "lm_head"};
  const Planned p = plan_family(tmp / "in", options);
  ASSERT_EQ(p.plan.options.ignore.size(), 5u);
  EXPECT_EQ(p.plan.options.ignore.back(), "re:.*layers\\.1\\.mlp\\.shared_expert\\..*");
  EXPECT_EQ(p.plan.n_default_ignore, 4u);
  EXPECT_EQ(p.plan.ignore_reasons.back(), "--ignore");
  EXPECT_TRUE(blocking_ids(p.findings).empty()) << describe(p.findings);
  expect_vllm_agrees(p);

  PlanOptions none;
  none.default_ignore = false;
  const Planned q = plan_family(tmp / "in", none);
  EXPECT_TRUE(q.plan.options.ignore.empty());
  // The head, the routers and the shared-expert gates would be packed.
  EXPECT_EQ(blocking_ids(q.findings), (std::vector<std::string>{"L12", "L12", "L12"}))
      << describe(q.findings);
  const auto l10 = std::find_if(q.findings.begin(), q.findings.end(), [](const Finding& f) {
    return f.id == "L12" && f.message.find("router") != std::string::npos;
  });
  ASSERT_NE(l10, q.findings.end());
  EXPECT_NE(l10->message.find("2 routers model.layers.0.mlp.gate, model.layers.1.mlp.gate would "
                              "be packed"),
            std::string::npos)
      << l10->message;
  EXPECT_EQ(l10->fix,
            "keep them in 16 bits: --ignore 're:^model\\.layers\\.\\d+\\.mlp\\.gate$' (the default "
            "ignore list has them; --no-default-ignore dropped it)");
}

// `--ignore lm_head` on a checkpoint whose head is language_model.lm_head:
// the hint says so and gives the entry that matches both names.
TEST(FamilyOptions, LmHeadEntryOnPrefixedHeadGetsTheMatchingForm) {
  TempDir tmp;
  write_family(tmp / "in", Family::kLlavaOld, false);
  PlanOptions options;
  options.ignore = {"lm_head", "language_model.model.layers.0.mlp.down_proj.weight"};
  const Planned p = plan_family(tmp / "in", options);
  std::vector<const Finding*> l1;
  for (const Finding& f : p.findings) {
    if (f.id == "L1") l1.push_back(&f);
  }
  ASSERT_EQ(l1.size(), 2u) << describe(p.findings);
  EXPECT_EQ(l1[0]->message,
            "ignore entry 'lm_head' matched 0 modules: this checkpoint's module is "
            "'language_model.lm_head'");
  EXPECT_EQ(l1[0]->fix,
            "use --ignore 're:^(language_model\\.)?lm_head$' instead (matches the checkpoint's "
            "and vLLM's names)");
  EXPECT_EQ(l1[1]->message,
            "ignore entry 'language_model.model.layers.0.mlp.down_proj.weight' matched 0 "
            "modules: 'language_model.model.layers.0.mlp.down_proj.weight' names a tensor of "
            "module 'language_model.model.layers.0.mlp.down_proj'; entries name modules");
  // The module's entry as vLLM matches it too; the plain module name would
  // then fail L2.
  EXPECT_EQ(l1[1]->fix,
            "use --ignore "
            "'re:^(language_model\\.model\\.|model\\.language_model\\.)layers\\.0\\.mlp\\.down_"
            "proj$' instead");
}

// Writes every family into $CTQUANT_FAMILIES_DIR/<name> (random weights),
// for inspecting them by hand or loading the outputs in transformers:
//   CTQUANT_FAMILIES_DIR=/tmp/families build/tests/ctquant_tests
//     --gtest_also_run_disabled_tests --gtest_filter='FamiliesTool.DISABLED_WriteToDirectory'
TEST(FamiliesTool, DISABLED_WriteToDirectory) {
  const char* dir = std::getenv("CTQUANT_FAMILIES_DIR");
  ASSERT_NE(dir, nullptr) << "set CTQUANT_FAMILIES_DIR";
  for (Family f : all_families()) write_family(fs::path(dir) / family_name(f), f, true);
}

}  // namespace
}  // namespace ctquant::test
