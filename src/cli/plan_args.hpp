// The options every planning command shares (private to src/cli): what
// to plan (scheme, groups, ignore list, targets, recipe, observer), a
// Hugging Face revision, verbosity; and the plan options they resolve to.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ctquant/plan/optimize.hpp"
#include "ctquant/plan/recipe.hpp"

namespace ctquant::cli {

// Options shared by quantize and inspect: what to plan.
struct PlanArgs {
  std::optional<std::string> scheme;    // unset: the recipe's, else W4A16
  std::optional<long long> group_size;  // unset: the scheme's own
  std::vector<std::string> ignore;
  std::vector<std::string> targets;
  std::vector<std::string> scheme_for;  // PATTERN=PRESET
  std::string quantization_config;      // a QuantizationConfig JSON file
  bool no_default_ignore = false;
  bool quantize_vision = false;
  unsigned tp = 1;
  std::string recipe;                        // --recipe FILE, or empty
  std::optional<std::string> observer;       // --observer NAME
  std::vector<std::string> observer_kwargs;  // --observer-kwarg KEY=VALUE
  // A converted input's converter targets and ignore list (docs/converters.md).
  std::vector<std::string> convert_targets;
  std::vector<std::string> convert_ignore;
  std::string transform;                     // --transform NAME (transform/transform.hpp)
  bool optimize = false;                     // --optimize (plan/optimize.hpp)
};

// Two floats are at most 2^32 units in the last place apart (verify
// --scale-ulp).
constexpr long long kMaxScaleUlp = 1LL << 32;

// A check that an option's text is a whole number in [min, max], written in
// decimal, with a message that says so (CLI11 puts the option name before
// it). CLI11's own checks print float ranges and wrap negative numbers into
// unsigned options.
CLI::Validator whole_number(long long min, long long max);

// A check that a path argument is not empty (`ctquant quantize A ""`): an
// empty path names no file, and std::filesystem would report it as
// "cannot make absolute path: Invalid argument". CLI11 puts the option
// name before the message; the run ends with exit status 2.
CLI::Validator non_empty_path();

// Adds the plan options to a command; the options added, in order.
std::vector<CLI::Option*> add_plan_options(CLI::App* app, PlanArgs& args);

// The plan options of a run: the recipe read (if any), merged with the
// command line, and what the planner gets.
struct ResolvedPlan {
  std::unique_ptr<ctquant::RecipeSpec> recipe;
  ctquant::EffectiveRecipe effective;
  ctquant::PlanOptions options;
  std::vector<ctquant::OptimizeChoice> optimized;  // --optimize: one per group
};

// Reads the recipe, merges it with the command line. Throws what
// parse_recipe, resolve_recipe and plan_options_for throw.
ResolvedPlan resolve_plan(const PlanArgs& args);

// --revision REV of a Hugging Face repository id.
void add_revision_option(CLI::App* app, std::optional<std::string>& revision);

// -q, --quiet (verbosity -1) and -v, --verbose (1).
void add_verbosity_flags(CLI::App* app, int& verbosity);

}  // namespace ctquant::cli
