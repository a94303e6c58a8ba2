// Lint rules that read the module roles (roles.hpp) and vLLM's matching
// rules (vllm_match.hpp). Private to the lint module; run_lint() calls them.
//
//   L2  error    a literal ignore entry that vLLM, after mapping it to its
//                own names, does not match for a module it keeps in 16 bits
//                (info when another entry covers the module in vLLM)
//   L7  error    stacked (3-D) experts ctquant cannot write loadably: the
//                family's vLLM loader reads per-expert tensors and they are
//                not split, or they are kept while vLLM's MoE probes say the
//                layer is quantized
//   L12 error    a module vLLM loads unquantized (output head, embedding,
//                router, shared-expert gate, plain nn.Linear) would be packed
//   L13 error    the written ignore list and targets, evaluated as vLLM does
//                on vLLM's names, disagree with what OUTPUT holds (or vLLM
//                raises on them); warning for a quantizable layer matched by
//                neither (older vLLM raises, newer loads it unquantized)
#pragma once

#include <optional>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/vllm_match.hpp"

namespace ctquant::detail {

class RolesLint {
 public:
  RolesLint(const Checkpoint& checkpoint, const QuantizePlan& plan);

  void literal_entries(std::vector<Finding>& out) const;     // L2
  void stacked_experts(std::vector<Finding>& out) const;     // L7
  void unloadable_modules(std::vector<Finding>& out) const;  // L12
  void vllm_expectations(std::vector<Finding>& out) const;   // L13

 private:
  struct Mismatch {
    const ModuleInfo* module;
    VllmExpectation expectation;
    bool packed;  // what OUTPUT would hold
  };
  const TensorDecision* decision_of(const ModuleInfo& m) const;
  bool planned_packed(const ModuleInfo& m) const;
  // Modules whose planned state vLLM disagrees with (plain modules, stacked
  // experts and parameters excluded: L12 and L7 report those).
  std::vector<Mismatch> mismatches() const;
  // Literal entries vLLM does not match, each with the modules concerned
  // and whether one of them is a kept module vLLM expects packed.
  struct LiteralMiss {
    std::size_t entry;
    std::vector<const ModuleInfo*> modules;
    bool consequential = false;
  };
  std::vector<LiteralMiss> literal_misses(const std::vector<Mismatch>& mismatches) const;

  const QuantizePlan& plan_;
  VllmLoadRules rules_;
  std::unordered_map<std::string, const TensorDecision*> by_tensor_;  // tensors the plan holds
};

// A hint for an ignore or targets entry that matched nothing: the entry
// names a tensor or a wrapper of a module (`...down_proj.weight`,
// `...q_proj.linear`), or is a module's name without the prefix the
// checkpoint has (`lm_head` for `language_model.lm_head`). Returns (what was
// found, the fix), or nullopt.
std::optional<std::pair<std::string, std::string>> entry_near_miss(
    const QuantizePlan& plan, const std::vector<std::string>& modules, const std::string& entry,
    const char* option);

// Every targets entry of every scheme group.
std::vector<std::string> all_targets(const PlanOptions& options);

// The ignore entries that keep exactly `modules`, as `--ignore 'a' --ignore
// 'b'` (narrow_ignore_entries()).
std::string ignore_fix(const RoleAnalysis& roles, const std::vector<std::string>& modules);

}  // namespace ctquant::detail
