// `ctquant quantize` (private to src/cli): its options and the run, one
// call of quantize() (job/quantize.hpp) with the progress, the report and
// recipe files and the summary around it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/plan_args.hpp"

namespace ctquant::cli {

// The options of `ctquant quantize`, as parsed.
struct QuantizeArgs {
  std::string input;
  std::optional<std::string> revision;
  std::string output;
  PlanArgs plan;
  unsigned threads = 0;
  bool force = false;
  bool no_sync = false;
  bool no_manifest = false;
  bool follow_symlinks = false;
  bool dry_run = false;
  bool allow_unloadable = false;
  bool strict = false;
  std::vector<std::string> lint_allow;  // --allow RULE
  std::vector<std::string> lint_error;  // --error RULE
  std::optional<std::string> part;
  std::optional<std::string> stage;
  bool resume = false;
  std::string write_recipe;             // --write-recipe FILE
  std::string report;                   // --report FILE
  bool json = false;                    // --json: the report on stdout
  std::optional<std::string> progress;  // --progress plain|bar|none
  std::optional<double> target_bits;    // --target-bits B
  std::optional<std::string> more_bits;  // --more-bits layers
};

// Adds quantize's options to its command; -q and -v set verbosity.
void add_quantize_options(CLI::App* quantize, QuantizeArgs& args, int& verbosity);

// Runs quantize; its exit status (0), or throws ctquant::Error. argv goes
// into the run report.
int run_quantize(const QuantizeArgs& args, int verbosity, const std::vector<std::string>& argv);

}  // namespace ctquant::cli
