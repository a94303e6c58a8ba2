// `--optimize`: for each scheme group, the weight observer docs/accuracy.md
// measured best for that scheme, at the same size.
//
// The choice is a table (src/plan/optimize.cpp, kOptimizeRows), one row per
// scheme measured, each citing its measurement: the mean KL divergence of
// the quantized models of tools/accuracy/ (llama-h128, qwen3-h128) against
// their source on held-out text, with paired bootstrap intervals
// (docs/accuracy.md "Results"). A row's observer is the lowest KLD on both
// models; where the models disagree, refit (never worse than
// `--observer refit` alone). Schemes without a row keep min-max, the
// library's default, and say so. The bits per weight never change (that is
// `--target-bits`); only the observer written in each group's weights
// (config.json `observer`) does, so vLLM reads the output as any other.
#pragma once

#include <string>
#include <vector>

#include "ctquant/plan/plan.hpp"

namespace ctquant {

// What --optimize chose for one scheme group.
struct OptimizeChoice {
  std::string group;     // config_groups key
  std::string observer;  // written into the group's weights
  std::string evidence;  // the measurement behind it, or why min-max is kept
};

// Sets the weight observer of every group of options by the table, and
// returns one choice per group, in group order. The groups' observers must
// be the default (memoryless_minmax, empty kwargs): a run that names an
// observer (--observer, a recipe's weight_observer, a config file's) is
// refused by the caller (Error{kUsage}), not overridden.
std::vector<OptimizeChoice> apply_optimize(PlanOptions& options);

// One line per choice, for the run's info output: "--optimize: group
// 'W4A16' weights with memoryless_mse (EVIDENCE)".
std::vector<std::string> render_optimize(const std::vector<OptimizeChoice>& choices);

}  // namespace ctquant
