// `--observer auto`: choose, module by module, among the scales of min-max
// (the default observer), of an MSE observer (scheme/observer.hpp) and of
// refit (scheme/refit.hpp) by their weight error, before the run writes
// anything.
//
// choose_observers() reads every module the plan quantizes, quantizes it in
// memory once with min-max and once with each of the other two its scheme
// can take, chunk by chunk exactly as the executor would (the MSE search's
// cutoff pre-pass, the fused set's max |w| or chosen ranges for a global
// scale, the family's kernel), and measures each result with the shared
// error function (quant_error.hpp: the same figures as the run report,
// `verify --against-source` and `inspect --errors`). A module keeps the
// scales with the lowest ||W - Q||, another observer's only when strictly
// lower than min-max's (a tie between the MSE observer and refit keeps the
// MSE observer, which the library reproduces). The modules vLLM builds as
// one layer (the shards of a fused q/k/v or gate/up, the experts of a MoE
// layer: ModuleInfo::vllm_layer) and those that share a global scale are
// decided together, by their error together: vLLM reads such a layer with
// one config group. The MSE observer is nvfp4_expanded_mse for NVFP4
// (strategy tensor_group) and memoryless_mse otherwise; the run's
// --observer-kwarg values go to whichever of the MSE observer and refit
// takes them (split_auto_kwargs).
//
// split_groups_by_observer() then writes the choice into the plan's scheme
// groups, as compressed-tensors expresses it: one config group per
// observer. A group whose modules all keep min-max is unchanged; one whose
// modules all chose one other observer keeps its name and targets with that
// observer; a group whose modules differ becomes one group per observer
// whose targets name exactly its modules ("NAME" with min-max,
// "NAME_<observer>" with the others), each module by an entry that matches
// its checkpoint, vLLM and transformers names and no other module
// (exact_target_entries, model/roles.hpp: `re:^(model\.)?fc$` for a DFlash
// draft's fc), so that compressed-tensors, vLLM and ctquant's own planner
// assign every module the same way whatever the order of the groups (names
// and patterns take precedence over class names in compressed-tensors
// `match_targets` and vLLM `find_matched_target`, and the lists are
// disjoint).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/exec/executor.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/quant_error.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

inline constexpr const char* kAutoObserver = "auto";

struct ObserverChoiceOptions {
  unsigned threads = 1;                  // modules measured at once (>= 1)
  std::uint64_t chunk_bytes = 4u << 20;  // rows read at a time, as ExecuteOptions
  // The --observer-kwarg values, an object: each goes to the MSE observer
  // or to refit, whichever takes it (split_auto_kwargs).
  nlohmann::json kwargs = nlohmann::json::object();
  // Called from the calling thread about every 200 ms and at the end with
  // the input bytes read so far (each module is read once per observer).
  std::function<void(const Progress&)> on_progress;
  const std::atomic<bool>* cancel = nullptr;  // set: throws Error{kInterrupted}
};

// One quantized module of the plan.
struct ModuleObserverChoice {
  std::size_t module = 0;    // index into QuantizePlan::modules
  std::string mse_observer;  // the MSE observer measured; "" when none was
  std::string not_measured;  // why no MSE observer was measured ("" when one was)
  bool refit_measured = false;
  std::string refit_not_measured;  // why refit was not measured ("" when it was)
  QuantError minmax;               // weight error with min-max scales
  QuantError mse;                  // with the MSE observer's scales (when measured)
  QuantError refit;                // with refit's scales (when measured)
  // The observer whose scales the module (with the rest of its layer)
  // keeps: "memoryless_minmax", mse_observer or "refit".
  std::string chosen = "memoryless_minmax";

  bool use_mse() const { return !mse_observer.empty() && chosen == mse_observer; }
  bool use_refit() const { return chosen == kRefitObserver; }
  // The weight error with the scales kept.
  const QuantError& chosen_error() const { return use_mse() ? mse : use_refit() ? refit : minmax; }
};

// Every quantized module of the plan, in plan order.
struct ObserverChoices {
  std::vector<ModuleObserverChoice> modules;

  std::size_t modules_using_mse() const;
  std::size_t modules_using_refit() const;
  // The weight error over all modules with min-max scales, and with the
  // scales chosen (quant_error.hpp step 6, modules in plan order).
  QuantError total_minmax() const;
  QuantError total_chosen() const;
};

// The MSE observer --observer auto measures for a group's weights:
// nvfp4_expanded_mse for strategy tensor_group (NVFP4), memoryless_mse
// otherwise.
std::string auto_mse_observer(const QuantArgs& weights);

// Measures and decides (see above). The plan's groups must use min-max.
// Throws Error{kBadInput} for a weight element that is not finite (as the
// run itself would), Error{kUsage} for --observer-kwarg values the MSE
// observer or refit refuses, Error{kInterrupted} on cancel, Error{kIo} on a read
// error.
ObserverChoices choose_observers(const Checkpoint& checkpoint, const QuantizePlan& plan,
                                 const ObserverChoiceOptions& options);

// `given` (the options the plan was made from) with its groups split as
// described above; plan is make_plan(checkpoint, given).
// kwargs: the --observer-kwarg values (split_auto_kwargs gives each
// observer its own).
PlanOptions split_groups_by_observer(const PlanOptions& given, const QuantizePlan& plan,
                                     const ObserverChoices& choices, const nlohmann::json& kwargs);

// One measurement for measure_errors: the modules of a set that shares a
// global scale (QuantizePlan::amax_sets), or one module, quantized with
// `weights` by `family` (null: the family of the modules' group).
struct ErrorMeasure {
  std::vector<std::size_t> modules;  // indices into QuantizePlan::modules
  QuantArgs weights;
  const SchemeFamily* family = nullptr;
};

// Each measurement's weight errors (one per module of it, in its order),
// quantized in memory chunk by chunk as choose_observers does, on
// options.threads threads; progress in `phase`. Throws what
// choose_observers throws (Error{kUsage} for observer_kwargs its observer
// refuses, before any weight is read).
std::vector<std::vector<QuantError>> measure_errors(const Checkpoint& checkpoint,
                                                    const QuantizePlan& plan,
                                                    const std::vector<ErrorMeasure>& measures,
                                                    const ObserverChoiceOptions& options,
                                                    ProgressPhase phase);

}  // namespace ctquant
