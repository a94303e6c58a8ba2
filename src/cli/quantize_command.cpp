#include "cli/quantize_command.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/output.hpp"
#include "cli/process.hpp"
#include "ctquant/exec/output_dir.hpp"
#include "ctquant/job/progress.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/job/report.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/report/weight_error.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/source/hf_cache.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/escape.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant::cli {

namespace {

// The groups that quantized something, "W4A16" or "attention + mlp".
// The groups that quantized something; with --optimize, the observers
// they were written with ("W4A16 with memoryless_mse by --optimize"; the
// groups --target-bits splits off keep the chosen observer).
std::string scheme_names(const ctquant::QuantizePlan& plan,
                         const std::vector<ctquant::OptimizeChoice>& optimized) {
  std::string out;
  std::vector<std::string> observers;
  for (std::size_t g = 0; g < plan.options.groups.size(); ++g) {
    if (plan.group_modules[g] == 0) continue;
    const ctquant::SchemeGroup& group = plan.options.groups[g];
    out += (out.empty() ? "" : " + ") + group.name;
    if (std::find(observers.begin(), observers.end(), group.weights.observer) == observers.end()) {
      observers.push_back(group.weights.observer);
    }
  }
  if (out.empty()) return "none";
  if (!optimized.empty()) {
    out += observers == std::vector<std::string>{"memoryless_minmax"}
               ? ", min-max kept by --optimize"
               : " with " + ctquant::join(observers, 8) + " by --optimize";
  }
  return out;
}

ctquant::ProgressMode progress_mode(const QuantizeArgs& args, int verbosity) {
  if (args.progress) return *ctquant::progress_mode_by_name(*args.progress);  // checked by CLI11
  if (verbosity < 0) return ctquant::ProgressMode::kNone;
  return ::isatty(STDERR_FILENO) == 1 ? ctquant::ProgressMode::kBar : ctquant::ProgressMode::kPlain;
}

}  // namespace

void add_quantize_options(CLI::App* quantize, QuantizeArgs& q, int& verbosity) {
  quantize
      ->add_option("INPUT", q.input,
                   "Checkpoint directory, a .safetensors file, or ORG/NAME in the Hugging Face "
                   "cache")
      ->required()
      ->check(non_empty_path());
  quantize->add_option("OUTPUT", q.output, "Output directory (created; must not exist)")
      ->required()
      ->check(non_empty_path());
  add_revision_option(quantize, q.revision);
  add_plan_options(quantize, q.plan);
  quantize
      ->add_option(
          "--target-bits", q.target_bits,
          "B: raise the modules whose weight error drops most per extra byte to W8A16 or a smaller "
          "group size while the quantized modules average at most B bits per weight (codes, "
          "scales, "
          "zero points); measured before writing (docs/observers.md)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // CLI11 leaves an empty value unset and reads 1e400 as inf.
            char* end = nullptr;
            const double b = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
            if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(b)) {
              return "expected a finite number of bits per weight, e.g. 5";
            }
            return "";
          },
          "B"));
  quantize
      ->add_option("--more-bits", q.more_bits,
                   "layers: llama.cpp's use_more_bits rule, down_proj at W8A16 in the first and "
                   "last eighth of the decoder layers and every third between (data-free)")
      ->check(CLI::IsMember({"layers"}));
  quantize->add_option("--threads", q.threads, "Worker threads (default: all cores)")
      ->check(CLI::Range(1u, 1024u));
  quantize->add_flag("--force", q.force,
                     "Replace an existing OUTPUT once the new one is complete; only an empty "
                     "directory or one of regular files with a .safetensors file");
  quantize->add_flag("--no-sync", q.no_sync,
                     "Do not fsync the output before renaming it into place (faster; after a "
                     "power loss OUTPUT may exist with lost data)");
  quantize->add_flag("--no-manifest", q.no_manifest,
                     "Do not hash the output files or write ctquant-manifest.json (saves about "
                     "0.7 s of one core per GB written; not with --part, --resume or a report)");
  quantize->add_flag("--follow-symlinks", q.follow_symlinks,
                     "Read files that symbolic links in INPUT point to outside it (a Hugging "
                     "Face cache snapshot); refused by default");
  quantize->add_flag("--dry-run", q.dry_run,
                     "Plan and lint, print the plan on stdout; write nothing");
  quantize->add_flag("--allow-unloadable", q.allow_unloadable,
                     "Write even when lint finds errors (a checkpoint vLLM may refuse)");
  quantize->add_flag("--strict", q.strict, "Lint warnings stop the run too");
  quantize
      ->add_option("--allow", q.lint_allow,
                   "RULE (repeatable, or RULE,RULE): findings of this lint rule (L1..L19) never "
                   "stop the run, under --strict too, as -Wno-error=RULE does; an error rule so "
                   "named is let through as --allow-unloadable does, for that rule only")
      ->delimiter(',')
      ->allow_extra_args(false);
  quantize
      ->add_option("--error", q.lint_error,
                   "RULE (repeatable, or RULE,RULE): findings of this lint rule always stop the "
                   "run, warnings and infos too, as -Werror=RULE does")
      ->delimiter(',')
      ->allow_extra_args(false);
  quantize->add_option_function<std::string>(
      "--part", [&q](const std::string& value) { q.part = value; },
      "I/N: write only part I of N (from 1) into the staging directory; `ctquant finalize "
      "OUTPUT` assembles the parts");
  quantize->add_option_function<std::string>(
      "--stage", [&q](const std::string& value) { q.stage = value; },
      "Staging directory of --part and --resume (default .OUTPUT.ctquant-parts beside OUTPUT)");
  quantize->add_flag("--resume", q.resume,
                     "Keep the files an earlier, interrupted run of the same plan finished "
                     "(sha256 checked) and write the rest; without --part, stage the run so "
                     "that it can be resumed");
  quantize->add_option("--write-recipe", q.write_recipe,
                       "Write the effective recipe (llm-compressor YAML) to FILE after the run");
  quantize->add_option("--report", q.report,
                       "Write the run report (JSON, docs/report.md) to FILE after the run");
  quantize->add_flag("--json", q.json,
                     "Print the run report (JSON) on stdout; the summary stays on stderr");
  quantize
      ->add_option_function<std::string>(
          "--progress", [&q](const std::string& value) { q.progress = value; },
          "Progress on stderr: bar (a redrawn line), plain (a line every 5 s or 10%), none; "
          "default bar on a terminal, plain otherwise")
      ->check(CLI::IsMember({"plain", "bar", "none"}));
  add_verbosity_flags(quantize, verbosity);
}

int run_quantize(const QuantizeArgs& args, int verbosity, const std::vector<std::string>& argv) {
  ctquant::QuantizeOptions options = ctquant::default_quantize_options();
  options.input = args.input;
  options.revision = args.revision;
  options.output = args.output;
  if (!args.report.empty()) options.report_file = args.report;
  if (!args.write_recipe.empty()) options.recipe_file = args.write_recipe;
  const ResolvedPlan resolved = resolve_plan(args.plan);
  options.plan = resolved.options;
  options.auto_observer = resolved.effective.observer == std::string(ctquant::kAutoObserver);
  options.auto_observer_kwargs = resolved.effective.observer_kwargs;
  options.tp = args.plan.tp;
  options.target_bits = args.target_bits;
  options.more_bits_layers = args.more_bits.has_value();
  if (args.threads > 0) options.threads = args.threads;
  options.force = args.force;
  options.follow_symlinks = args.follow_symlinks;
  options.fsync = !args.no_sync;
  options.manifest = !args.no_manifest;
  options.dry_run = args.dry_run;
  options.allow_unloadable = args.allow_unloadable;
  options.strict = args.strict;
  options.lint_allow = args.lint_allow;
  options.lint_error = args.lint_error;
  options.logger = make_logger(verbosity);
  // Until quantize() creates its first directory a signal ends the process
  // at once: opening, planning and lint write nothing (process.hpp).
  on_signal_exit_at_once("interrupted by a signal before OUTPUT was complete",
                         "; nothing was written");
  options.cancel = cancel_flag();
  options.before_writing = [] { on_signal_cancel(); };
  if (args.part) options.part = ctquant::parse_part(*args.part);
  if (args.stage) options.stage = *args.stage;
  options.resume = args.resume;
  const bool want_report = args.json || !args.report.empty();
  if (args.no_manifest && want_report) {
    throw ctquant::usage_error(fmt::format(
        "--no-manifest cannot be used with {}: the report lists the SHA-256 of every output file",
        args.json ? "--json" : "--report"));
  }
  nlohmann::json plan_report;
  options.on_plan = [&](const ctquant::Checkpoint& checkpoint, const ctquant::QuantizePlan& plan,
                        const std::vector<ctquant::Finding>& findings) {
    if (args.dry_run && !args.json) {
      // The findings themselves are logged on stderr, as in a real run.
      print_text_report(
          ctquant::render_plan_text(checkpoint, plan) +
          ctquant::render_recipe_origins(resolved.effective, plan.options.default_ignore) +
          fmt::format("lint: {}{}\n", ctquant::findings_summary(findings),
                      findings.empty() ? "" : " (each on stderr)"));
    }
    if (want_report) plan_report = ctquant::report_plan_json(checkpoint, plan);
  };
  options.logger->debug("{}", ctquant::render_recipe_origins(resolved.effective));
  for (const std::string& note : ctquant::take_observer_notes()) options.logger->info("{}", note);
  for (const std::string& line : resolved.effective.overridden) options.logger->info("{}", line);
  if (!resolved.effective.ignore_dropped.empty()) {
    options.logger->warn("{}", resolved.effective.ignore_dropped);
  }
  for (const std::string& line : ctquant::render_optimize(resolved.optimized)) {
    options.logger->info("{}", line);
  }
  // An observer warning (kwargs that make the search cost much more, or
  // leave most quantization levels unused) stops the run under --strict,
  // as lint warnings do (exit 1), before anything is read.
  const std::vector<std::string> observer_warnings = ctquant::take_observer_warnings();
  if (args.strict && !observer_warnings.empty()) {
    throw ctquant::Error(
        ctquant::ErrorKind::kLint,
        fmt::format("{}\n--strict makes warnings stop the run, and nothing was written: change "
                    "the observer kwargs, or run without --strict",
                    fmt::join(observer_warnings, "\n")));
  }
  for (const std::string& w : observer_warnings) options.logger->warn("{}", w);

  using Clock = std::chrono::steady_clock;
  const auto clock_start = Clock::now();
  ctquant::ProgressReporter progress(
      progress_mode(args, verbosity),
      [](std::string_view control, std::string_view text) {
        // The bar's own carriage return and erase-line pass as they are;
        // the text is escaped like every line that may name an input.
        const std::string escaped = std::string(control) + ctquant::escape_for_terminal(text);
        std::fwrite(escaped.data(), 1, escaped.size(), stderr);
        std::fflush(stderr);
      },
      [clock_start] { return std::chrono::duration<double>(Clock::now() - clock_start).count(); },
      stderr_columns());
  options.on_progress = [&progress](const ctquant::Progress& p) { progress.update(p); };

  // --write-recipe and --report are written into temporary files before
  // OUTPUT is renamed into place (before_commit), and renamed into place
  // after it: a report or recipe that cannot be written leaves no OUTPUT
  // that a retry would find in its way. A dry run or a --part run commits
  // no OUTPUT; they are written after it.
  std::optional<nlohmann::json> report;
  std::vector<std::unique_ptr<ctquant::StagedFile>> side_files;
  bool side_files_made = false;
  const auto make_side_files = [&](const ctquant::QuantizeSummary& summary) {
    on_signal_cancel();  // the side files are written from here on
    side_files_made = true;
    const std::string recipe_text = ctquant::recipe_yaml(resolved.effective, summary.plan);
    if (!args.write_recipe.empty()) {
      side_files.push_back(std::make_unique<ctquant::StagedFile>(
          args.write_recipe, recipe_text, options.fsync, "--write-recipe " + args.write_recipe));
    }
    if (!want_report) return;
    ctquant::QuantizeReportInput input;
    input.argv = argv;
    input.options = &options;
    input.recipe = &resolved.effective;
    input.recipe_yaml = recipe_text;
    input.summary = &summary;
    input.plan = plan_report;
    const auto hash_start = Clock::now();
    input.input_files = ctquant::hash_input_files(
        ctquant::resolve_checkpoint_input(options.input, options.revision), options.follow_symlinks,
        options.threads);
    input.seconds_hash_inputs = std::chrono::duration<double>(Clock::now() - hash_start).count();
    input.peak_rss_bytes = ctquant::peak_rss_bytes();
    report = ctquant::quantize_report_json(input);
    if (!args.report.empty()) {
      side_files.push_back(std::make_unique<ctquant::StagedFile>(
          args.report, report->dump(2) + "\n", options.fsync, "--report " + args.report));
    }
  };
  options.before_commit = make_side_files;
  const ctquant::QuantizeSummary summary = [&] {
    try {
      return ctquant::quantize(options);
    } catch (...) {
      progress.finish();
      throw;
    }
  }();
  progress.finish();
  if (!side_files_made) make_side_files(summary);
  for (const auto& file : side_files) file->commit();
  if (args.json) {
    try {
      print_json_report(*report);
    } catch (const ctquant::Error& e) {
      if (summary.part || args.dry_run) throw;
      throw ctquant::io_error(
          fmt::format("{} (OUTPUT {} was written and is complete; its report "
                      "is not printed)",
                      e.what(), args.output));
    }
  }
  if (verbosity >= 0) {
    const double ratio = summary.bytes_out == 0 ? 0.0
                                                : static_cast<double>(summary.bytes_in) /
                                                      static_cast<double>(summary.bytes_out);
    const std::string fp8 =
        summary.tensors_dequantized + summary.tensors_dropped == 0
            ? std::string()
            : fmt::format(", {} FP8 written as BF16, {} scale/activation dropped",
                          summary.tensors_dequantized, summary.tensors_dropped);
    if (summary.part && options.part) {
      std::fprintf(stderr,
                   "ctquant: part %s done: %zu of %zu file(s) written, %zu kept; %s; %.2f s\n",
                   ctquant::part_name(*options.part).c_str(), summary.part->files_written,
                   summary.part->files_assigned, summary.part->files_kept,
                   ctquant::human_bytes(summary.part->bytes_assigned).c_str(), summary.seconds);
      return 0;
    }
    // What share of the linear layers' weight parameters is quantized (lint
    // L15 says why when it is low).
    const std::uint64_t linear = summary.plan.linear_params;
    const std::string share =
        linear == 0
            ? std::string()
            : fmt::format("; {:.1f}% of linear weight parameters quantized",
                          100.0 * static_cast<double>(summary.plan.linear_params_quantized) /
                              static_cast<double>(linear));
    // Modules converted from another tool's format (source/converter.hpp).
    std::string done;
    if (summary.plan.source_format) {
      done = fmt::format("{} modules converted ({}, lossless: no requantization), ",
                         summary.plan.n_converted, summary.plan.source_format->converter->name);
    }
    if (summary.tensors_quantized > 0 || done.empty()) {
      done +=
          fmt::format("{} tensors quantized ({}{}), ", summary.tensors_quantized,
                      scheme_names(summary.plan, resolved.optimized),
                      summary.plan.rewrite ? ", transform " + summary.plan.rewrite->transform : "");
    }
    std::fprintf(stderr, "ctquant: %s %s%zu copied%s%s; %s in, %s out, ratio %.2fx; %.2f s\n",
                 args.dry_run ? "dry run:" : "done:", done.c_str(), summary.tensors_copied,
                 fp8.c_str(), share.c_str(), ctquant::human_bytes(summary.bytes_in).c_str(),
                 ctquant::human_bytes(summary.bytes_out).c_str(), ratio, summary.seconds);
    // The weight error of the modules with the largest one (quant_error.hpp).
    const std::string errors =
        ctquant::render_worst_errors(summary.plan, summary.execute.module_errors);
    if (!errors.empty()) print_stderr("ctquant: " + errors);
    if (summary.bit_allocation) {
      print_stderr("ctquant: " +
                   ctquant::render_bit_allocation(summary.plan, *summary.bit_allocation));
    }
    if (summary.observer_choice) {
      print_stderr("ctquant: " +
                   ctquant::render_observer_choice(summary.plan, *summary.observer_choice));
    }
  }
  return 0;
}

}  // namespace ctquant::cli
