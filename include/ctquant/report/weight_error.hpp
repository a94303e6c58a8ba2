// The weight error of the quantized modules (scheme/quant_error.hpp) as
// reports give it: JSON for the quantize report and `inspect --errors
// --json`, text for the summary on stderr and `inspect --errors`, and
// `--observer auto`'s comparison of min-max, MSE and refit scales.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/exec/executor.hpp"
#include "ctquant/exec/observer_choice.hpp"
#include "ctquant/plan/bit_allocation.hpp"
#include "ctquant/plan/plan.hpp"

namespace ctquant {

// The weight error of the quantized modules (quant_error.hpp), as the
// quantize report and `inspect --errors --json` give it:
// {"rel_frobenius", "max_abs_error"} over all of them (their sums in plan
// order; null when there are none) and "modules": one {"module", "scheme"
// (its group's name), "shape" [rows, cols], "rel_frobenius",
// "max_abs_error"} per module, in plan order. Non-finite figures are null.
nlohmann::json weight_error_json(const QuantizePlan& plan, const std::vector<ModuleError>& errors);

// The figure over all modules and the `count` modules with the largest
// relative error (largest first; NaN counts as largest), one line each, for
// the summary on stderr ("weight error ... largest:" then the modules): ""
// when there are no modules.
std::string render_worst_errors(const QuantizePlan& plan, const std::vector<ModuleError>& errors,
                                std::size_t count = 5);

// Every module's figures as a table (plan order), for `inspect --errors`.
std::string render_weight_error_table(const QuantizePlan& plan,
                                      const std::vector<ModuleError>& errors);

// --observer auto's choice (exec/observer_choice.hpp) for the report:
// {"modules", "modules_using_mse", "modules_using_refit",
// "rel_frobenius_minmax", "rel_frobenius_chosen" (over all modules, in plan
// order), "change" (chosen / min-max - 1), "per_module": one {"module",
// "scheme" (its group in plan), "observer" (the one its scales come from),
// "mse_observer" (null when none was measured), "not_measured" (why, or
// null), "refit_not_measured" (why refit was not measured, or null),
// "rel_frobenius_minmax", "rel_frobenius_mse", "rel_frobenius_refit",
// "max_abs_error_minmax", "max_abs_error_mse", "max_abs_error_refit",
// "change" (MSE / min-max - 1), "change_refit" (refit / min-max - 1)} per
// module, in plan order}. Non-finite or absent figures are null.
nlohmann::json observer_choice_json(const QuantizePlan& plan, const ObserverChoices& choices);

// The summary line of --observer auto for stderr: how many modules use the
// MSE and the refit scales and the weight error over all modules with
// min-max and as chosen, then the modules whose error changed most (count
// of them), one line each.
std::string render_observer_choice(const QuantizePlan& plan, const ObserverChoices& choices,
                                   std::size_t count = 5);

// --target-bits and --more-bits layers (plan/bit_allocation.hpp) for the
// report: {"rule", "target_bits" (null for --more-bits), "n_layers" and
// "layers" (--more-bits layers; null otherwise), "bits_per_weight" (as
// chosen), "bits_per_weight_given" (every module at the given scheme),
// "params", "bytes", "modules_upgraded", "weighted_error_given" and
// "weighted_error_chosen" (--target-bits: sum of rel^2 * params over
// sum of params; null otherwise), "options": one {"scheme", "weights",
// "modules"} per option, "per_module": one {"module", "scheme" (its
// option), "params", "bytes", "bits_per_weight", "rel_frobenius" (object:
// option name -> the measured figure, --target-bits only)} per module, in
// plan order}.
nlohmann::json bit_allocation_json(const QuantizePlan& plan, const BitAllocation& allocation);

// The summary of the allocation for stderr: the rule, the bits per weight
// achieved and given, how many modules each option took, then each raised
// module with its option (at most `count` lines, then how many more).
std::string render_bit_allocation(const QuantizePlan& plan, const BitAllocation& allocation,
                                  std::size_t count = 20);

}  // namespace ctquant
