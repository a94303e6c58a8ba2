// The targets of a quantization_config's scheme groups, indexed once, and
// the group each reader gives a module that the targets of several groups
// match. quantize (make_plan), lint (L1, L11) and verify --against-source
// resolve targets with this one class.
//
// Three rules decide it; they agree when a module is matched by the targets
// of one group only, and may differ otherwise:
//
//  - model_free_ptq, and ctquant's plan (schemes.md 9.3): the first group,
//    in the order given, with a matching target (an exact name, a `re:`
//    pattern by Python's re.match, or "Linear", which takes every module).
//    llm-compressor src/llmcompressor/entrypoints/model_free/process.py
//    (_match_tensors_to_schemes: "Iterates config groups in order. A tensor
//    matched by an earlier group is not re-yielded for later groups"; its
//    match_quantizable_tensors treats "Linear" in targets as every module),
//    llm-compressor@ab1ba3effcafc15746cd6d6ca24cba3f7bd7a582.
//  - compressed-tensors, which transformers loads the output with:
//    quantization/lifecycle/apply.py apply_quantization_config builds
//    target_to_scheme over config_groups in config.json's order (a target
//    listed again by a later group becomes that group's), then takes the
//    first of match_targets(name, module, targets) (utils/match.py): the
//    targets sorted by ("re:" in target, target), those whose name matches
//    first (so an exact name before any pattern, patterns in text order),
//    then class names ("Linear" for every Linear).
//    compressed-tensors@ac8e2ba82f4e0d5eaa40069f8fc642738f124cd4.
//  - vLLM: compressed_tensors.py keys target_scheme_map by target, first
//    seen first across config_groups in config.json's order (a repeat in a
//    later group takes that group's scheme), and find_matched_target
//    (compressed_tensors/utils.py@008014e8503b206a8ae3eb9d17fd46b48b8d2606)
//    takes the first target in that order equal to the layer name or whose
//    `re:` pattern matches it, then the first whose text is a
//    case-insensitive substring of the layer's class name ("Linear" of
//    every *Linear class), then the targets of a fused layer's shards.
//    resolve() takes the layer to be the module itself; vllm_fused_group()
//    is the fused layer's answer (the plan asks it for q/k/v and gate/up);
//    how vLLM probes MoE layers is lint L13's (model/vllm_match.hpp).
//
// ctquant writes config.json with sorted keys (dump_json), as the reference
// does, and nlohmann::json reads an object in key order: both readers see
// the groups in name order, which is the order used for them here.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctquant/format/matcher.hpp"

namespace ctquant {

// A group and one of its targets entries.
struct TargetHit {
  std::size_t group = 0;
  std::size_t entry = 0;  // index into the group's targets
};

// The group each rule gives one module (nullopt: no target matches it).
struct GroupResolution {
  std::optional<std::size_t> model_free;          // the first group given (ctquant, model_free_ptq)
  std::optional<std::size_t> compressed_tensors;  // transformers' loader
  std::optional<std::size_t> vllm;
  bool agree() const { return model_free == compressed_tensors && model_free == vllm; }
};

class GroupTargets {
 public:
  // targets[g] and names[g]: group g's targets entries and config_groups
  // key, in the order given. Throws Error{kUsage} for invalid entries
  // (ModuleMatcher).
  GroupTargets(const std::vector<std::vector<std::string>>& targets,
               const std::vector<std::string>& names);

  // Every (group, entry) whose entry matches module: group by group in the
  // given order, entries in order. Literal entries are found in a hash
  // table, so the cost is that of the `re:` entries, not of the lists.
  // Throws Error{kUsage} when a pattern cannot be evaluated (ModuleMatcher).
  std::vector<TargetHit> matches(std::string_view module) const;
  // The first of matches(): model_free_ptq's group and its entry.
  std::optional<TargetHit> first_match(std::string_view module) const;
  // The group each reader gives module.
  GroupResolution resolve(std::string_view module) const;
  // vLLM's group for a layer it fuses from several modules (q/k/v into
  // qkv_proj): find_matched_target on the fused name, then the class name,
  // then _match_fused_layer, which needs every shard (in vLLM's shard
  // order) matched by a target and takes the first shard's.
  std::optional<std::size_t> vllm_fused_group(std::string_view fused_layer,
                                              const std::vector<std::string>& shards) const;

  std::size_t n_groups() const { return names_.size(); }

 private:
  std::optional<std::size_t> compressed_tensors_group(std::string_view module,
                                                      const std::vector<std::size_t>& hit) const;
  std::optional<std::size_t> vllm_name_group(const std::vector<std::size_t>& hit) const;
  std::optional<std::size_t> vllm_group(const std::vector<std::size_t>& hit) const;

  std::vector<std::string> names_;
  std::vector<TargetHit> flat_;  // flat entry index -> (group, entry)
  ModuleMatcher matcher_;        // every entry of every group, group by group
  // Per flat entry: the group the readers give its text (the last group in
  // name order listing it), its rank in compressed-tensors' sort, and in
  // vLLM's first-seen order.
  std::vector<std::size_t> reader_group_;
  std::vector<std::size_t> ct_rank_;
  std::vector<std::size_t> vllm_rank_;
  // The class-name targets: compressed-tensors' "Linear" and vLLM's first
  // literal that is a case-insensitive substring of "linear".
  std::optional<std::size_t> ct_class_group_;
  std::optional<std::size_t> vllm_class_group_;
};

}  // namespace ctquant
