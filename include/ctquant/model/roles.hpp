// Module roles: what each weight of a checkpoint is to vLLM, decided from
// the tensor headers and config.json only.
//
// analyze_roles() gives every 2-D weight (a module's `.weight`, or another
// 2-D parameter) and every 3-D expert tensor a role (a Linear vLLM builds
// with the quantization config, an expert of a fused MoE layer, stacked
// experts, an embedding, an output head, a router, a shared-expert gate, a
// module vLLM builds as a plain torch Linear, a draft module that must stay
// in 16 bits), the component it belongs to (language model, vision or audio
// tower, multimodal projector, MTP layer, draft model), how vLLM builds it
// (quantizable, quantized only when a target names it, or always 16-bit),
// the names vLLM and transformers give it, and what ctquant does with it by
// default (quantize, keep in 16 bits, or refuse to write it).
//
// The per-family knowledge is the family table (families.hpp): each row
// matches config.json's `architectures` or `model_type` and names the vLLM
// model file (path and commit) it was read from. A checkpoint whose
// architecture no row matches gets roles from name and shape rules only, and
// RoleAnalysis::fallback says so.
//
// default_ignore_entries() turns the modules kept in 16 bits into the ignore
// entries written to config.json, each with its reason: literal names where
// the checkpoint, vLLM and transformers agree on a name, otherwise anchored
// `re:` entries checked to match every such module under all three names and
// no other module.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/model/families.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

enum class Component : std::uint8_t {
  kLanguage,   // the language model
  kVision,     // vision tower
  kAudio,      // audio tower
  kProjector,  // multimodal projector
  kMtp,        // multi-token-prediction layer
  kDraft,      // a speculative-decoding draft model (EAGLE, DFlash)
};

// What ctquant does with the module when no option says otherwise.
enum class DefaultAction : std::uint8_t {
  kQuantize,  // packed
  kKeep,      // kept in 16 bits and named in the written ignore list
  kRefuse,    // cannot be written loadably (stacked experts vLLM reads only per expert)
};

// Whether a weight of this role is a linear layer's (counted in
// QuantizePlan::linear_params): not an embedding, output head, norm or raw
// parameter.
inline bool is_linear_weight_role(ModuleRole role) {
  return role != ModuleRole::kEmbedding && role != ModuleRole::kHead &&
         role != ModuleRole::kNorm && role != ModuleRole::kParameter;
}

const char* role_name(ModuleRole role);
const char* component_name(Component component);
const char* vllm_build_name(VllmBuild build);
const char* default_action_name(DefaultAction action);

// Sizes read from config.json (top level, or text_config for multimodal
// models; vision sizes from vision_config).
struct ModelDims {
  std::optional<std::uint64_t> vocab;
  std::optional<std::uint64_t> draft_vocab;
  std::optional<std::uint64_t> hidden;
  std::optional<std::uint64_t> intermediate;      // dense MLP
  std::optional<std::uint64_t> moe_intermediate;  // one expert (the row's intermediate_key)
  std::optional<std::uint64_t> experts;           // num_experts / num_local_experts / n_routed_experts
  std::optional<std::uint64_t> layers;            // num_hidden_layers
  std::uint64_t nextn_layers = 0;                 // num_nextn_predict_layers
  bool tied = false;                              // tie_word_embeddings (top level or text_config)
  std::optional<std::uint64_t> vision_hidden;
  std::optional<std::uint64_t> vision_intermediate;
};

// One 3-D stacked-experts tensor [E, a, b], what the planner needs to split
// it into experts.{e}.gate_proj/up_proj/down_proj or to keep it.
struct StackedExperts {
  std::string tensor;     // "model.layers.0.mlp.experts.gate_up_proj"
  std::string moe_layer;  // "model.layers.0.mlp.experts" (checkpoint name)
  enum class Kind : std::uint8_t { kGateUp, kDown, kUnknown } kind = Kind::kUnknown;
  std::uint64_t experts = 0;       // E (dim 0)
  std::uint64_t intermediate = 0;  // I of one expert (0: unknown)
  std::uint64_t hidden = 0;        // H (0: unknown)
  // kOutIn: [E, out_features, in_features]; kInOut: [E, in_features, out_features].
  enum class Orientation : std::uint8_t { kOutIn, kInOut, kUnknown } orientation =
      Orientation::kUnknown;
  // How the orientation is known: the dims alone (they differ), the other
  // stacked tensor of the same layer, the family's documented layout.
  enum class Proof : std::uint8_t { kShape, kSibling, kFamily, kNone } proof = Proof::kNone;
  bool interleaved = false;       // gate/up alternate along out_features (gpt-oss)
  bool interleave_known = false;  // the family says which
  bool vllm_loads_stacked = false;
  bool vllm_loads_per_expert = true;
  std::string problem;  // why the dims do not fit the config ("" when they do)
};

const char* orientation_name(StackedExperts::Orientation orientation);
const char* proof_name(StackedExperts::Proof proof);

// The role of one weight.
struct ModuleInfo {
  std::string module;  // checkpoint module name (a stacked tensor: its tensor name)
  std::string tensor;  // the tensor the role is about
  std::vector<std::uint64_t> shape;
  ModuleRole role = ModuleRole::kLinear;
  Component component = Component::kLanguage;
  VllmBuild build = VllmBuild::kQuantizable;
  DefaultAction action = DefaultAction::kQuantize;
  std::string reason;  // "router: vLLM builds ReplicatedLinear(quant_config=None)"
  std::string source;  // "vllm/model_executor/models/mixtral.py@f0e26957" ("" for generic rules)
  // vLLM's names: the name the ignore list is tested against (a shard of a
  // fused layer keeps its own name), the layer vLLM builds (the fused name,
  // or the MoE layer whose experts.0.*_proj names vLLM probes).
  std::string vllm_name;
  std::string vllm_layer;
  std::string hf_name;  // transformers' module name
  std::optional<std::size_t> stacked;  // index into RoleAnalysis::stacked
  const char* entry = nullptr;         // the family's spelling of its ignore entry, if any
  std::size_t rule = SIZE_MAX;         // the row rule that decided the role (SIZE_MAX: generic)
};

struct RoleOptions {
  bool quantize_vision = false;  // vision/audio towers and projectors are quantized too
};

struct RoleAnalysis {
  const FamilyRow* family = nullptr;  // nullptr: no row matched
  std::string architecture;           // config.json architectures[0] ("" when none)
  std::string model_type;
  // Set when no row matched: roles come from name and shape rules.
  std::string fallback;
  ModelDims dims;
  std::vector<ModuleInfo> modules;  // in checkpoint order
  std::vector<StackedExperts> stacked;
  // A draft whose vLLM class numbers its decoder layers after the target's
  // (FamilyRow::layers_after_target): vLLM's names of layers.N are
  // model.layers.{N + vllm_layer_offset}, the offset config.json's
  // num_target_layers (top level or under the row's config key). Without
  // it those names are not known: vllm_layers_unknown says why ("" when
  // they are known), and the modules keep the unshifted names.
  std::optional<std::uint64_t> vllm_layer_offset;
  std::string vllm_layers_unknown;

  const ModuleInfo* find(std::string_view module) const;
  // The family's description for the plan: "Qwen3-MoE (vllm/.../qwen3_moe.py@2e0831b0)".
  std::string family_text() const;

  std::map<std::string, std::size_t, std::less<>> index;  // module -> position in modules
};

// Throws Error{kBadInput} when config.json's tie_word_embeddings (top level
// or text_config) is present but not a JSON boolean: transformers 5 refuses
// such a config (its strict config classes, configuration_utils.py), vLLM
// and transformers 4 read it with Python truthiness ("false" is true).
void check_tie_flag(const std::optional<nlohmann::json>& config);

// Roles of the weights of a checkpoint: every 2-D tensor and every 3-D
// tensor of an `experts` module, from headers and config.json only. Throws
// what check_tie_flag throws.
RoleAnalysis analyze_roles(const Checkpoint& checkpoint, const RoleOptions& options = {});

// The same from config.json and a list of (tensor name, shape): every 2-D
// tensor and every 3-D expert tensor of the list gets a role. A packed
// module of a written checkpoint is given as its `M.weight` with its
// unpacked shape.
RoleAnalysis analyze_roles(
    const std::optional<nlohmann::json>& config,
    const std::vector<std::pair<std::string, std::vector<std::uint64_t>>>& tensors,
    const RoleOptions& options = {});

// One entry of the default ignore list.
struct DefaultIgnoreEntry {
  std::string entry;
  std::string reason;                // "output head: vLLM builds ParallelLMHead ..."
  std::vector<std::string> modules;  // checkpoint modules it keeps
};

// The ignore entry for an output head the checkpoint does not hold
// ("lm_head", transformers' name of the head module), or nullopt: for a
// tied model (tie_word_embeddings, top level or text_config) without an
// lm_head tensor, and with `drafts` for a draft without one (served with its
// target's head). transformers builds lm_head as a Linear all the same (a
// draft: in the class of its model_type, without the draft's own modeling
// code) after compressed-tensors has converted the targeted Linear layers,
// so the entry must keep it out of the targets: a tied head then fails to
// tie, a draft's to decompress (docs/loadability.md). The default list has
// the tied model's entry; a draft's default list stays the reference
// recipe's, and L1 does not call a given draft entry pointless.
std::optional<std::string> absent_head_entry(const RoleAnalysis& roles, bool drafts);

// The ignore entries that keep every module whose action is kKeep, in a
// fixed role order (the tied head's entry, heads, embeddings, routers,
// shared-expert gates, plain modules, draft modules, stacked experts,
// towers and projectors). Each
// entry matches its modules under their checkpoint, vLLM and transformers
// names (and, for MoE layers, vLLM's experts.0.{gate,up,down}_proj probes)
// and no other module of the checkpoint under any of those names.
std::vector<DefaultIgnoreEntry> default_ignore_entries(const RoleAnalysis& roles);

// The narrowest ignore entries that keep exactly `modules` (checkpoint
// names): one `re:` entry per name template (layer numbers as \d+) when it
// matches no other module, otherwise each name in every form vLLM and
// transformers use. For lint fixes.
std::vector<std::string> narrow_ignore_entries(const RoleAnalysis& roles,
                                               const std::vector<std::string>& modules);

// The targets entries of a config group that takes exactly `modules`
// (checkpoint names), for the groups --observer auto, --target-bits and
// --more-bits split, module by module in the order given: the name where
// the checkpoint, vLLM and transformers agree on it (an anchored `re:`
// entry where vLLM's name mapping would rewrite the literal); where they
// differ, one anchored `re:` entry matching every form of the name and no
// other module (`re:^(model\.)?fc$` for a DFlash draft's fc, which vLLM
// builds as model.fc), else each form as such a literal; an expert of a
// MoE layer, each of its forms (its own name, vLLM's experts.0 probes of
// its layer, transformers' name); a module without a role (a split expert
// projection), its name as given. Duplicates are written once.
//
// vLLM tests targets as it tests ignore entries (check_equal_or_regex_match
// on its own names, shard by shard for a fused layer: find_matched_target
// and _match_fused_layer in
// vllm/model_executor/layers/quantization/compressed_tensors/utils.py
// @008014e8; a MoE layer by its experts.0 probes); compressed-tensors'
// match_name (src/compressed_tensors/utils/match.py@ac8e2ba8), which
// transformers applies, matches the same entries on transformers' names
// (re.match for `re:`, else the exact name). The vLLM names are the role analysis's
// (ModuleInfo::vllm_name: a DFlash draft's modules carry the `model.` prefix
// its model class adds, vllm/model_executor/models/laguna_dflash.py and
// qwen3_dflash.py).
std::vector<std::string> exact_target_entries(const RoleAnalysis& roles,
                                              const std::vector<std::string>& modules);

// Every name form of a module: checkpoint, vLLM (the name ignore is tested
// on; for MoE layers the three experts.0 probes), transformers.
std::vector<std::string> name_forms(const ModuleInfo& module);

}  // namespace ctquant
