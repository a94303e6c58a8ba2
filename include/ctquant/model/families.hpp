// The model-family table: one row per family of models, each as vLLM builds
// it, read from the vLLM model file the row names (path and commit in
// vllm-project/vllm).
//
// A row matches config.json's `architectures` (exactly, or by a substring)
// or `model_type`, or a config.json key, and says what analyze_roles
// (roles.hpp) needs beyond the generic name and shape rules: name rules
// (first match wins) giving a module its role and how vLLM builds it, the
// model's hf_to_vllm_mapper and load prefix (vLLM's names), whether the
// quantization config vLLM matches ignore with is the model's own, the fused
// groups its packed_modules_mapping lists (fused_groups.hpp), transformers'
// names, and the layout of its MoE experts. docs/loadability.md lists the
// rows with their sources.
//
// Adding a family is one row in make_family_table() (src/model/families.cpp)
// and its fixture in tests/families.cpp (FamiliesCoverage checks that every
// row has one).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/model/fused_groups.hpp"

namespace ctquant {

enum class ModuleRole : std::uint8_t {
  kLinear,            // a Linear vLLM builds with the quantization config
  kExpert,            // one projection of one expert of a fused MoE layer (2-D)
  kStackedExperts,    // every expert of a layer in one 3-D tensor
  kEmbedding,         // token or position embedding (any prefix, or [vocab, hidden])
  kHead,              // output head (`*.lm_head`, MTP `shared_head.head`)
  kRouter,            // MoE router
  kSharedExpertGate,  // gate of a shared expert
  kPlainLinear,       // vLLM builds it as torch.nn.Linear or without the quantization config
  kDraftKeep,         // a draft module vLLM reads as a 16-bit .weight (DFlash qkv_proj)
  kNorm,              // a 2-D weight of a module whose name ends in "norm"
  kParameter,         // a 2-D tensor that is not a module's .weight (a raw nn.Parameter)
};

// How vLLM builds the layer (vllm_roles.md section 0.1).
enum class VllmBuild : std::uint8_t {
  kQuantizable,  // built with the quantization config: packed unless the ignore list matches
  kIfTargeted,   // ParallelLMHead / VocabParallelEmbedding: packed only if a target names it
  kPlain,        // torch.nn.Linear, quant_config=None or a raw parameter: always 16-bit
};

// Extra conditions a name rule can carry.
enum class RuleCondition : std::uint8_t {
  kNone,
  // SigLIP MLP fc1/fc2: vLLM passes the quantization config only when the
  // vision hidden and intermediate sizes are both multiples of 64
  // (siglip.py SiglipMLP); otherwise they are plain layers.
  kSiglipMlpQuantizableIf64,
};

// One name rule of a family row: modules whose checkpoint name matches
// `pattern` (an ignore-style entry: `re:` + Python re.match semantics, or a
// literal) get this role.
struct NameRule {
  const char* pattern;
  ModuleRole role;
  VllmBuild build;
  const char* reason;
  // The ignore entry written for these modules when they are kept, as the
  // family's published recipes spell it; checked like a generated entry and
  // replaced by one when it matches other modules. nullptr: generated.
  const char* entry = nullptr;
  RuleCondition condition = RuleCondition::kNone;
};

// A checkpoint layout of 3-D stacked experts.
enum class StackedLayout : std::uint8_t {
  kNone,
  // transformers v5 Qwen3-MoE / Mixtral: gate_up_proj [E, 2I, H] (gate rows
  // then up rows), down_proj [E, H, I]: out_features first.
  kOutInHalves,
  // gpt-oss: gate_up_proj [E, H, 2I] with gate and up columns interleaved
  // (even gate, odd up), down_proj [E, I, H]: in_features first.
  kInOutInterleaved,
};

// One row of the family table: a model family as vLLM builds it.
struct FamilyRow {
  const char* name;                         // "Qwen3-MoE"
  std::vector<const char*> architectures;   // exact entries of config.json "architectures"
  std::vector<const char*> model_types;     // config.json "model_type"
  const char* architecture_substring;       // or any architecture containing this (nullptr: none)
  const char* config_key;                   // or a config.json holding this key (nullptr: none)
  const char* vllm_file;                    // the vLLM model file the row was read from
  const char* vllm_commit;                  // its commit
  std::vector<NameRule> rules;              // first match wins, before the generic rules
  // hf_to_vllm_mapper: orig_to_new_substr, _prefix, _suffix (tensor names).
  std::vector<std::pair<const char*, const char*>> mapper_substr;
  std::vector<std::pair<const char*, const char*>> mapper_prefix;
  std::vector<std::pair<const char*, const char*>> mapper_suffix;
  // A prefix vLLM's module tree adds to every name outside the mapper
  // (drafts: "model."), except names starting with keep_names_prefix.
  const char* load_prefix = "";
  const char* load_prefix_except = nullptr;
  // Whether the quantization config vLLM matches ignore with is the model's
  // own (apply_vllm_mapper maps literal entries, packed_modules_mapping is
  // set): false for drafts, whose config comes from get_draft_quant_config.
  bool top_level_quant_config = true;
  std::vector<FusedSpec> fused;
  // Draft architectures whose vLLM class numbers the draft's decoder layers
  // after the target's: vLLM builds layers.N as model.layers.{N + T}, T the
  // target's number of layers (RoleAnalysis::vllm_layer_offset).
  std::vector<const char*> layers_after_target;
  // transformers' module names: prefix rewrites, first match wins (an
  // identity rule stops later ones).
  std::vector<std::pair<const char*, const char*>> hf_prefix;
  // MoE: checkpoint names of the per-expert projections, the config key of
  // the expert intermediate size, the stacked layout, and whether vLLM's
  // loader reads the stacked layout (and only it).
  const char* expert_gate = "gate_proj";
  const char* expert_up = "up_proj";
  const char* expert_down = "down_proj";
  const char* intermediate_key = "moe_intermediate_size";
  StackedLayout stacked = StackedLayout::kNone;
  bool vllm_loads_stacked = false;
  bool vllm_loads_per_expert = true;
};

// Every family row, in match order.
const std::vector<FamilyRow>& family_table();

// The row matching config.json, or nullptr: drafts first (an architecture
// substring or a config key: a DFlash draft of a Qwen3 target says
// model_type qwen3), then an exact architecture, then, when config.json
// names no architecture, the model_type.
const FamilyRow* match_family(const std::optional<nlohmann::json>& config);

// The vLLM file a row was read from: "vllm/model_executor/models/mixtral.py@f0e26957".
std::string family_source(const FamilyRow& row);

// The fused groups vLLM lists for a family (llama_fused_groups() without a row).
const std::vector<FusedSpec>& family_fused_groups(const FamilyRow* family);

// vLLM's name of a checkpoint tensor: the row's hf_to_vllm_mapper
// (substring, prefix, suffix rules, longest key first, first hit of each
// kind), then the load prefix. Identity without a row.
std::string vllm_tensor_name(const FamilyRow* family, const std::string& tensor);
// vLLM's name of a checkpoint module (its `.weight` mapped, then cut).
std::string vllm_module_name(const FamilyRow* family, const std::string& module);
// A literal ignore or targets entry as vLLM matches it: mapped by
// apply_vllm_mapper when the row's quantization config is the model's own;
// `re:` entries unchanged.
std::string vllm_entry(const FamilyRow* family, const std::string& entry);
// transformers' module name of a checkpoint module.
std::string hf_module_name(const FamilyRow* family, const std::string& module);

}  // namespace ctquant
