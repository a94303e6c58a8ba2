// Lint rules that read the module roles (roles.hpp) and vLLM's matching
// rules (vllm_match.hpp): L2, L7, L12, L13, L15, L16 and L17; and L19, the
// checkpoint's config.json that vLLM reads the model from. Private to the
// lint module; each method is the run function of its row of lint_rules()
// (src/lint/lint.cpp), and what it checks is its row of docs/cli.md's lint
// table.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ctquant/lint/lint.hpp"
#include "ctquant/model/vllm_match.hpp"

namespace ctquant::detail {

class RolesLint {
 public:
  RolesLint(const Checkpoint& checkpoint, const QuantizePlan& plan);

  void literal_entries(std::vector<Finding>& out) const;     // L2
  void stacked_experts(std::vector<Finding>& out) const;     // L7
  void unloadable_modules(std::vector<Finding>& out) const;  // L12
  void vllm_expectations(std::vector<Finding>& out) const;   // L13
  void sixteen_bit_share(std::vector<Finding>& out) const;   // L15
  void engine_modules(std::vector<Finding>& out) const;      // L16
  void missing_head(std::vector<Finding>& out) const;        // L17
  void missing_config(std::vector<Finding>& out) const;      // L19
  void missing_layers(std::vector<Finding>& out) const;      // L20

 private:
  struct Mismatch {
    const ModuleInfo* module;
    VllmExpectation expectation;
    bool packed;  // what OUTPUT would hold
  };
  const TensorDecision* decision_of(const ModuleInfo& m) const;
  bool planned_packed(const ModuleInfo& m) const;
  // Modules whose planned state vLLM disagrees with (plain modules, stacked
  // experts and parameters excluded: L12 and L7 report those). Computed
  // once, by the constructor (L2 and L13 both read them).
  std::vector<Mismatch> find_mismatches() const;
  const std::vector<Mismatch>& mismatches() const { return mismatches_; }
  // Literal entries vLLM does not match, each with the modules concerned
  // and whether one of them is a kept module vLLM expects packed.
  struct LiteralMiss {
    std::size_t entry;
    std::vector<const ModuleInfo*> modules;
    bool consequential = false;
  };
  std::vector<LiteralMiss> literal_misses(const std::vector<Mismatch>& mismatches) const;

  const Checkpoint& checkpoint_;
  const QuantizePlan& plan_;
  VllmLoadRules rules_;
  std::unordered_map<std::string, const TensorDecision*> by_tensor_;  // tensors the plan holds
  std::vector<Mismatch> mismatches_;
};

// A hint for an ignore or targets entry that matched nothing: the entry
// names a tensor or a wrapper of a module (`...down_proj.weight`,
// `...q_proj.linear`), or is a module's name without the prefix the
// checkpoint has (`lm_head` for `language_model.lm_head`): what was found,
// the entries to use instead (for ignore, as vLLM matches them too, with the
// rest of the module's fused or MoE layer: keep_entries()) and the fix
// saying so. nullopt otherwise.
struct NearMiss {
  std::string found;
  std::vector<std::string> entries;
  std::string fix;
};
// The module names entry_near_miss looks entries up in, indexed once per
// list of entries (so that a list of N entries costs O(N), not O(N x
// modules)): every module, and every module by each of its dotted suffixes
// ("mlp.down_proj" of "model.layers.0.mlp.down_proj"), in input order.
struct ModuleNameIndex {
  explicit ModuleNameIndex(const std::vector<std::string>& modules);
  std::unordered_map<std::string, std::size_t> position;  // module -> its index
  std::unordered_map<std::string, std::vector<std::string>> by_suffix;
};
std::optional<NearMiss> entry_near_miss(const QuantizePlan& plan, const ModuleNameIndex& modules,
                                        const std::string& entry, const char* option);

// Every targets entry of every scheme group.
std::vector<std::string> all_targets(const PlanOptions& options);

// modules with the other members of the vLLM layers they are part of (the
// shards of a fused layer such as qkv_proj, the experts of a MoE layer):
// keeping one member alone in 16 bits splits the layer, which vLLM refuses
// (L3).
std::vector<std::string> with_layer_members(const RoleAnalysis& roles,
                                            std::vector<std::string> modules);

// The ignore entries that keep modules in 16 bits loadably:
// narrow_ignore_entries() of with_layer_members().
std::vector<std::string> keep_entries(const RoleAnalysis& roles,
                                      const std::vector<std::string>& modules);

// Entries as options: "--ignore 'a' --ignore 'b'".
std::string option_list(const char* option, const std::vector<std::string>& entries);

// keep_entries() as `--ignore 'a' --ignore 'b'`.
std::string ignore_fix(const RoleAnalysis& roles, const std::vector<std::string>& modules);

// The same, also stored as the finding's fix_ignore.
std::string set_ignore_fix(Finding& f, const RoleAnalysis& roles,
                           const std::vector<std::string>& modules);

}  // namespace ctquant::detail
