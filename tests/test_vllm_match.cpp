// vLLM's ignore and targets rules (vllm_match.hpp) on their own: exact
// names or Python re.match after the model's name mapping, fused layers
// shard by shard, MoE layers by their experts.0.*_proj probes, heads and
// embeddings only when a target names them. The module lists are role
// analyses of header-only layouts (no files).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/matcher.hpp"
#include "ctquant/model/roles.hpp"
#include "ctquant/model/vllm_match.hpp"

namespace ctquant {
namespace {

using nlohmann::json;
using State = VllmExpectation::State;
using Tensors = std::vector<std::pair<std::string, std::vector<std::uint64_t>>>;

json config_of(const char* architecture) {
  return json{{"architectures", {architecture}},
              {"hidden_size", 256},
              {"vocab_size", 512},
              {"num_hidden_layers", 1}};
}

Tensors llama_layer(const std::string& prefix) {
  return {{prefix + "model.embed_tokens.weight", {512, 256}},
          {prefix + "model.layers.0.self_attn.q_proj.weight", {256, 256}},
          {prefix + "model.layers.0.self_attn.k_proj.weight", {128, 256}},
          {prefix + "model.layers.0.self_attn.v_proj.weight", {128, 256}},
          {prefix + "model.layers.0.self_attn.o_proj.weight", {256, 256}},
          {prefix + "model.layers.0.mlp.gate_proj.weight", {512, 256}},
          {prefix + "model.layers.0.mlp.up_proj.weight", {512, 256}},
          {prefix + "model.layers.0.mlp.down_proj.weight", {256, 512}},
          {"lm_head.weight", {512, 256}}};
}

State state_of(const RoleAnalysis& roles, const VllmLoadRules& rules, const std::string& module) {
  const ModuleInfo* m = roles.find(module);
  EXPECT_NE(m, nullptr) << module;
  return m == nullptr ? State::kRefused : rules.expect(*m).state;
}

TEST(VllmMatch, FusedLayerShardsMustAllBeIgnoredOrNone) {
  const RoleAnalysis roles = analyze_roles(config_of("LlamaForCausalLM"), llama_layer(""));
  const VllmLoadRules one(roles, {"model.layers.0.self_attn.q_proj"}, {"Linear"});
  const ModuleInfo* q = roles.find("model.layers.0.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->vllm_layer, "model.layers.0.self_attn.qkv_proj");
  const VllmExpectation e = one.expect(*q);
  EXPECT_EQ(e.state, State::kRefused);
  EXPECT_NE(e.why.find("Found a different quantization schemes for ['q_proj', 'k_proj', "
                       "'v_proj'] in model.layers.0.self_attn.qkv_proj"),
            std::string::npos)
      << e.why;
  const VllmLoadRules all(roles, {"re:.*self_attn\\.[qkv]_proj$"}, {"Linear"});
  EXPECT_EQ(state_of(roles, all, "model.layers.0.self_attn.k_proj"), State::kUnquantized);
  EXPECT_EQ(state_of(roles, all, "model.layers.0.self_attn.o_proj"), State::kPacked);
  EXPECT_EQ(state_of(roles, all, "model.layers.0.mlp.gate_proj"), State::kPacked);
}

// should_ignore_layer tests the fused name itself when it is listed verbatim.
TEST(VllmMatch, FusedNameListedVerbatimIsIgnoredWhole) {
  const RoleAnalysis roles = analyze_roles(config_of("LlamaForCausalLM"), llama_layer(""));
  const VllmLoadRules rules(roles, {"model.layers.0.mlp.gate_up_proj"}, {"Linear"});
  EXPECT_EQ(state_of(roles, rules, "model.layers.0.mlp.gate_proj"), State::kUnquantized);
  EXPECT_EQ(state_of(roles, rules, "model.layers.0.mlp.up_proj"), State::kUnquantized);
  EXPECT_EQ(state_of(roles, rules, "model.layers.0.mlp.down_proj"), State::kPacked);
}

// re: entries use re.match: anchored at the start, not at the end.
TEST(VllmMatch, RegexEntriesAreAnchoredAtTheStartOnly) {
  const RoleAnalysis roles = analyze_roles(config_of("LlamaForCausalLM"), llama_layer(""));
  const VllmLoadRules start(roles, {"re:layers\\.0\\.mlp\\.down_proj"}, {"Linear"});
  EXPECT_FALSE(start.ignore_match("model.layers.0.mlp.down_proj"));
  const VllmLoadRules any(roles, {"re:.*mlp\\.down"}, {"Linear"});
  EXPECT_TRUE(any.ignore_match("model.layers.0.mlp.down_proj"));  // a prefix of the name suffices
  EXPECT_EQ(state_of(roles, any, "model.layers.0.mlp.down_proj"), State::kUnquantized);
}

// LLaVA-style models: literal entries are mapped by hf_to_vllm_mapper, so a
// checkpoint name matches; "lm_head" stays "lm_head" and misses vLLM's
// language_model.lm_head, which only a target naming it would quantize.
TEST(VllmMatch, LiteralEntriesAreMappedLikeVllmsModuleNames) {
  Tensors t = llama_layer("");
  for (auto& [name, shape] : t) {
    if (name.starts_with("model.")) name = "model.language_model." + name.substr(6);
  }
  const RoleAnalysis roles = analyze_roles(
      json{{"architectures", {"LlavaForConditionalGeneration"}},
           {"text_config", {{"hidden_size", 256}, {"vocab_size", 512}}}},
      t);
  const ModuleInfo* down = roles.find("model.language_model.layers.0.mlp.down_proj");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->vllm_name, "language_model.model.layers.0.mlp.down_proj");
  EXPECT_EQ(vllm_entry(roles.family, "model.language_model.layers.0.mlp.down_proj"),
            "language_model.model.layers.0.mlp.down_proj");
  const VllmLoadRules rules(roles, {"model.language_model.layers.0.mlp.down_proj", "lm_head"},
                            {"Linear"});
  EXPECT_EQ(rules.expect(*down).state, State::kUnquantized);
  const ModuleInfo* head = roles.find("lm_head");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->vllm_name, "language_model.lm_head");
  EXPECT_FALSE(rules.ignore_match(head->vllm_name));
  EXPECT_EQ(rules.expect(*head).state, State::kUnquantized);  // "Linear" does not name a head
  const VllmLoadRules all(roles, {"lm_head"}, {"re:.*"});
  EXPECT_EQ(all.expect(*head).state, State::kPacked);  // lm_head is not matched, re:.* targets it
  const VllmLoadRules kept(roles, {"re:^(language_model\\.)?lm_head$"}, {"re:.*"});
  EXPECT_EQ(kept.expect(*head).state, State::kUnquantized);
}

Tensors mixtral_layer() {
  Tensors t{{"model.layers.0.block_sparse_moe.gate.weight", {4, 256}}};
  for (int e = 0; e < 4; ++e) {
    const std::string p = "model.layers.0.block_sparse_moe.experts." + std::to_string(e);
    t.push_back({p + ".w1.weight", {128, 256}});
    t.push_back({p + ".w3.weight", {128, 256}});
    t.push_back({p + ".w2.weight", {256, 128}});
  }
  return t;
}

// vLLM decides a MoE layer by <layer>.0.gate_proj/up_proj/down_proj, even
// for Mixtral's w1/w3/w2 experts.
TEST(VllmMatch, MoeLayersAreDecidedByTheirExpertZeroProbes) {
  const json config = {{"architectures", {"MixtralForCausalLM"}},
                       {"hidden_size", 256},
                       {"num_local_experts", 4},
                       {"intermediate_size", 128}};
  const RoleAnalysis roles = analyze_roles(config, mixtral_layer());
  const ModuleInfo* w1 = roles.find("model.layers.0.block_sparse_moe.experts.2.w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->role, ModuleRole::kExpert);
  EXPECT_EQ(w1->vllm_layer, "model.layers.0.block_sparse_moe.experts");
  EXPECT_EQ(VllmLoadRules::moe_probes(w1->vllm_layer),
            (std::vector<std::string>{"model.layers.0.block_sparse_moe.experts.0.gate_proj",
                                      "model.layers.0.block_sparse_moe.experts.0.up_proj",
                                      "model.layers.0.block_sparse_moe.experts.0.down_proj"}));
  // Checkpoint names do not reach the probes.
  const VllmLoadRules by_w(roles, {"re:.*experts\\.\\d+\\.w[123]$"}, {"Linear"});
  EXPECT_EQ(by_w.expect(*w1).state, State::kPacked);
  const VllmLoadRules whole(roles, {"re:.*block_sparse_moe\\.experts\\..*"}, {"Linear"});
  EXPECT_EQ(whole.expect(*w1).state, State::kUnquantized);
  // One probe ignored, two not: vLLM raises.
  const VllmLoadRules one(roles, {"model.layers.0.block_sparse_moe.experts.0.gate_proj"},
                          {"Linear"});
  const VllmExpectation e = one.expect(*w1);
  EXPECT_EQ(e.state, State::kRefused);
  EXPECT_NE(e.why.find("All MoE projections need to have same quantization scheme"),
            std::string::npos);
  // The router is a plain layer whatever the list says.
  const ModuleInfo* gate = roles.find("model.layers.0.block_sparse_moe.gate");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->role, ModuleRole::kRouter);
  EXPECT_EQ(gate->build, VllmBuild::kPlain);
  EXPECT_EQ(by_w.expect(*gate).state, State::kUnquantized);
}

// Drafts take their quantization config from get_draft_quant_config: no
// packed_modules_mapping, no name mapping of entries; the fused qkv_proj is
// tested under its own (prefixed) name.
TEST(VllmMatch, DraftsTestFusedNamesWithoutShardsOrMapping) {
  const json config = {{"architectures", {"DFlashLagunaForCausalLM"}}, {"hidden_size", 256}};
  const Tensors t = {{"layers.0.self_attn.qkv_proj.weight", {384, 256}},
                     {"layers.0.self_attn.o_proj.weight", {256, 256}},
                     {"fc.weight", {256, 768}}};
  const RoleAnalysis roles = analyze_roles(config, t);
  const ModuleInfo* qkv = roles.find("layers.0.self_attn.qkv_proj");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->vllm_name, "model.layers.0.self_attn.qkv_proj");
  const VllmLoadRules regex(roles, {"re:.*qkv_proj$"}, {"Linear"});
  EXPECT_TRUE(regex.packed_modules_mapping().empty());
  EXPECT_EQ(regex.expect(*qkv).state, State::kUnquantized);
  const VllmLoadRules literal(roles, {"layers.0.self_attn.qkv_proj"}, {"Linear"});
  EXPECT_EQ(literal.expect(*qkv).state, State::kPacked);  // vLLM's name has "model."
  EXPECT_EQ(state_of(roles, regex, "fc"), State::kPacked);
}

// The targets of a split config group (exact_target_entries): each module
// by a name vLLM finds and transformers' compressed-tensors too, and no
// other module. A DFlash draft's fc is vLLM's model.fc: one anchored entry
// for both names; a Llama's names agree: the names themselves.
TEST(VllmMatch, ExactTargetEntriesNameEachModuleAsVllmAndTheCheckpointDo) {
  const json config = {{"architectures", {"DFlashLagunaForCausalLM"}}, {"hidden_size", 256}};
  const Tensors t = {{"layers.0.self_attn.o_proj.weight", {256, 256}},
                     {"layers.0.mlp.down_proj.weight", {256, 512}},
                     {"layers.1.mlp.down_proj.weight", {256, 512}},
                     {"fc.weight", {256, 768}}};
  const RoleAnalysis draft = analyze_roles(config, t);
  const std::vector<std::string> entries =
      exact_target_entries(draft, {"fc", "layers.1.mlp.down_proj"});
  EXPECT_EQ(entries, (std::vector<std::string>{"re:^(model\\.)?fc$",
                                               "re:^(model\\.)?layers\\.1\\.mlp\\.down_proj$"}));
  const VllmLoadRules rules(draft, {}, entries);
  EXPECT_EQ(state_of(draft, rules, "fc"), State::kPacked);
  EXPECT_EQ(state_of(draft, rules, "layers.1.mlp.down_proj"), State::kPacked);
  EXPECT_TRUE(rules.expect(*draft.find("layers.0.mlp.down_proj")).unmatched);
  EXPECT_TRUE(rules.expect(*draft.find("layers.0.self_attn.o_proj")).unmatched);
  // The checkpoint's names (what transformers and ctquant's planner match).
  const ModuleMatcher matcher(entries, ModuleMatcher::Role::kTargets);
  EXPECT_TRUE(matcher.first_match("fc").has_value());
  EXPECT_TRUE(matcher.first_match("layers.1.mlp.down_proj").has_value());
  EXPECT_FALSE(matcher.first_match("layers.0.mlp.down_proj").has_value());

  const RoleAnalysis llama = analyze_roles(config_of("LlamaForCausalLM"), llama_layer(""));
  const std::vector<std::string> qkv = {"model.layers.0.self_attn.q_proj",
                                        "model.layers.0.self_attn.k_proj",
                                        "model.layers.0.self_attn.v_proj"};
  EXPECT_EQ(exact_target_entries(llama, qkv), qkv);
  const VllmLoadRules fused(llama, {}, qkv);
  EXPECT_EQ(state_of(llama, fused, "model.layers.0.self_attn.k_proj"), State::kPacked);
}

// vLLM's qwen3_dflash.py (DFlashDraftModel) numbers the draft's layers
// after the target's: layers.N is model.layers.{N + num_target_layers}.
// Without num_target_layers those names are unknown, and a number past 64
// bits is left alone (it threw once).
TEST(VllmMatch, Qwen3DflashLayersAreNumberedAfterTheTargets) {
  const Tensors t = {{"layers.1.mlp.down_proj.weight", {256, 512}},
                     {"layers.99999999999999999999999.mlp.down_proj.weight", {256, 512}},
                     {"fc.weight", {256, 768}}};
  json config = {
      {"architectures", {"DFlashDraftModel"}}, {"hidden_size", 256}, {"num_target_layers", 36}};
  const RoleAnalysis offset = analyze_roles(config, t);
  EXPECT_EQ(offset.vllm_layer_offset, 36u);
  EXPECT_EQ(offset.find("layers.1.mlp.down_proj")->vllm_name, "model.layers.37.mlp.down_proj");
  EXPECT_EQ(offset.find("layers.99999999999999999999999.mlp.down_proj")->vllm_name,
            "model.layers.99999999999999999999999.mlp.down_proj");
  EXPECT_EQ(offset.find("fc")->vllm_name, "model.fc");
  config.erase("num_target_layers");
  const RoleAnalysis unknown = analyze_roles(config, t);
  EXPECT_FALSE(unknown.vllm_layer_offset.has_value());
  EXPECT_NE(unknown.vllm_layers_unknown.find("no num_target_layers"), std::string::npos);
  config["architectures"] = {"DFlashLagunaForCausalLM"};  // laguna_dflash.py: no offset
  const RoleAnalysis laguna = analyze_roles(config, t);
  EXPECT_TRUE(laguna.vllm_layers_unknown.empty());
  EXPECT_EQ(laguna.find("layers.1.mlp.down_proj")->vllm_name, "model.layers.1.mlp.down_proj");
}

// A MoE layer's experts: vLLM decides the layer by its experts.0 probes,
// which Mixtral's checkpoint names (w1/w3/w2) are not; the entries name the
// probes beside the experts.
TEST(VllmMatch, ExactTargetEntriesOfAMoeLayerNameVllmsProbes) {
  const json config = {{"architectures", {"MixtralForCausalLM"}},
                       {"hidden_size", 256},
                       {"num_local_experts", 4},
                       {"intermediate_size", 128}};
  const RoleAnalysis roles = analyze_roles(config, mixtral_layer());
  std::vector<std::string> experts;
  for (int e = 0; e < 4; ++e) {
    for (const char* w : {"w1", "w3", "w2"}) {
      experts.push_back(fmt::format("model.layers.0.block_sparse_moe.experts.{}.{}", e, w));
    }
  }
  const std::vector<std::string> entries = exact_target_entries(roles, experts);
  for (const std::string& e : experts) {
    EXPECT_NE(std::find(entries.begin(), entries.end(), e), entries.end()) << e;
  }
  for (const std::string& probe :
       VllmLoadRules::moe_probes("model.layers.0.block_sparse_moe.experts")) {
    EXPECT_NE(std::find(entries.begin(), entries.end(), probe), entries.end()) << probe;
  }
  EXPECT_EQ(entries.size(), experts.size() + 3);
  const VllmLoadRules rules(roles, {}, entries);
  EXPECT_EQ(state_of(roles, rules, "model.layers.0.block_sparse_moe.experts.2.w1"), State::kPacked);
}

// A quantizable layer neither ignored nor targeted: newer vLLM leaves it
// unquantized, older releases raise; the expectation says so.
TEST(VllmMatch, UntargetedLayersAreFlaggedUnmatched) {
  const RoleAnalysis roles = analyze_roles(config_of("LlamaForCausalLM"), llama_layer(""));
  const VllmLoadRules rules(roles, {}, {"re:.*mlp\\..*"});
  const VllmExpectation o = rules.expect(*roles.find("model.layers.0.self_attn.o_proj"));
  EXPECT_EQ(o.state, State::kUnquantized);
  EXPECT_TRUE(o.unmatched);
  EXPECT_EQ(state_of(roles, rules, "model.layers.0.mlp.down_proj"), State::kPacked);
  // gate_up_proj: both shards match the regex target (_match_fused_layer).
  EXPECT_EQ(state_of(roles, rules, "model.layers.0.mlp.up_proj"), State::kPacked);
}

}  // namespace
}  // namespace ctquant
