// vLLM's rules for a compressed-tensors ignore list and targets, applied to
// the modules of a checkpoint: which layers vLLM builds quantized, which it
// leaves unquantized, and which it refuses to load.
//
// The rules are vLLM's, read from vllm-project/vllm:
//   compressed_tensors/utils.py@008014e8503b206a8ae3eb9d17fd46b48b8d2606
//     should_ignore_layer: a layer whose last name component is a key of the
//     model's packed_modules_mapping (and that is not itself listed
//     verbatim) is tested shard by shard, each shard name made by replacing
//     that component; all shards must agree, else vLLM raises "Found a
//     different quantization schemes". Any other layer is tested by name.
//     check_equal_or_regex_match: an entry `re:P` matches when Python's
//     re.match(P, name) does (anchored at the start only); any other entry
//     only the identical name.
//     find_matched_target: the layer name (exact or re:), then the module's
//     class name (case-insensitive substring, so "Linear" takes every
//     *Linear layer), then every shard of a fused layer.
//   compressed_tensors/compressed_tensors_moe/compressed_tensors_moe.py
//     @0043d6b52fdafbbed46c819125a2d582a148e121: a MoE layer is decided by
//     probing <layer>.0.gate_proj, <layer>.0.up_proj and <layer>.0.down_proj
//     (these names whatever the checkpoint calls its experts); the three
//     must agree ("All MoE projections need to have same quantization
//     scheme"); the Linear target covers MoE layers.
//   compressed_tensors.py: ParallelLMHead and VocabParallelEmbedding are
//     quantized only when a target names them ("Linear" is not a substring
//     of their class names).
//   model_loader/utils.py configure_quant_config: literal ignore entries and
//     dotted targets are mapped by the model's hf_to_vllm_mapper
//     (apply_vllm_mapper); `re:` entries are not.
// The names each module has in vLLM come from the role analysis (roles.hpp),
// the packed_modules_mapping from the family table (families.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ctquant/format/matcher.hpp"
#include "ctquant/model/roles.hpp"

namespace ctquant {

// What vLLM does with one module under a given ignore list and targets.
struct VllmExpectation {
  enum class State : std::uint8_t {
    kPacked,       // built quantized: expects weight_packed / weight_scale / weight_shape
    kUnquantized,  // built unquantized: expects a 16-bit .weight
    kRefused,      // vLLM raises while building the layer (mixed shards, MoE probes)
  };
  State state = State::kUnquantized;
  std::string layer;  // the vLLM layer decided: a fused name, a MoE layer, or the module
  std::string why;    // "ignored by 're:...' as 'language_model.lm_head'", vLLM's error, ...
  // A quantizable layer neither ignored nor matched by a target: current
  // vLLM leaves it unquantized, older releases raise "Unable to find matching
  // target".
  bool unmatched = false;
};

const char* expectation_state_name(VllmExpectation::State state);

class VllmLoadRules {
 public:
  // ignore and targets as written in config.json. Throws Error{kUsage} for
  // an entry whose pattern does not compile (ModuleMatcher).
  VllmLoadRules(const RoleAnalysis& roles, std::vector<std::string> ignore,
                std::vector<std::string> targets);
  ~VllmLoadRules();
  VllmLoadRules(VllmLoadRules&&) noexcept;

  // The ignore entries as vLLM holds them (literal entries mapped).
  const std::vector<std::string>& vllm_ignore() const { return ignore_; }
  // The first ignore entry (index into the written list) matching a vLLM
  // name, by check_equal_or_regex_match.
  std::optional<std::size_t> ignore_match(const std::string& vllm_name) const;
  // should_ignore_layer(layer, ignore, packed_modules_mapping). On vLLM's
  // "different quantization schemes" error returns nullopt and sets error.
  std::optional<bool> should_ignore_layer(const std::string& layer, std::string& error) const;
  // The packed_modules_mapping vLLM uses for this checkpoint (fused name ->
  // shard names); empty for drafts.
  const std::map<std::string, std::vector<std::string>>& packed_modules_mapping() const {
    return packed_;
  }
  // The three names vLLM probes for a MoE layer.
  static std::vector<std::string> moe_probes(const std::string& moe_layer);

  // What vLLM does with a module of the role analysis. Not thread-safe:
  // it keeps each MoE layer's answer.
  VllmExpectation expect(const ModuleInfo& module) const;

 private:
  // Whether a target takes a layer (find_matched_target), for a layer of a
  // *Linear class when linear_class.
  std::optional<std::string> matched_target(const std::string& layer, bool linear_class) const;

  std::vector<std::string> written_ignore_;
  std::vector<std::string> ignore_;  // mapped
  std::set<std::string> ignore_literal_;
  std::vector<std::string> targets_;  // mapped
  ModuleMatcher ignore_matcher_;
  ModuleMatcher target_matcher_;
  // The target vLLM's class-name step takes a *Linear layer with (index
  // into targets_), if any.
  std::optional<std::size_t> linear_class_target_;
  std::map<std::string, std::vector<std::string>> packed_;
  // expect()'s answer for each MoE layer, made at its first expert (every
  // expert of a layer gets the layer's answer). Not thread-safe.
  mutable std::unordered_map<std::string, VllmExpectation> moe_layers_;
};

}  // namespace ctquant
