// ctquant command-line front end: CLI11 options -> one library call.
//
// Exit codes (docs/cli.md): 0 success, 1 failure (bad input, I/O, full disk,
// interrupted), 2 usage error, 3 verification found differences.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/exec/output_dir.hpp"
#include "ctquant/job/progress.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/job/report.hpp"
#include "ctquant/plan/recipe.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/source/hf_cache.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/escape.hpp"
#include "ctquant/util/text.hpp"
#include "ctquant/util/version.hpp"
#include "ctquant/verify/errors.hpp"
#include "ctquant/verify/verify.hpp"

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<int> g_signal{0};

extern "C" void on_signal(int signal_number) {
  g_signal.store(signal_number);
  g_cancel.store(true);
}

// SIGINT, SIGTERM and SIGHUP ask the run to stop: the library polls the
// cancel flag between jobs and phases, removes the temporary directory and
// throws Error{kInterrupted}. SA_RESETHAND: a second signal ends the process
// at once (the temporary directory may then be left, recognisable by name).
void install_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    // A signal the parent ignores stays ignored (nohup, `cmd &` in a script).
    struct sigaction previous {};
    if (sigaction(signal_number, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) {
      continue;
    }
    sigaction(signal_number, &action, nullptr);
  }
  // A file size limit (RLIMIT_FSIZE) must surface as EFBIG, a clean "no
  // space" error, not as a signal that kills the process mid-write; a closed
  // stderr pipe must not kill it before it has cleaned up either.
  std::signal(SIGXFSZ, SIG_IGN);
  std::signal(SIGPIPE, SIG_IGN);
}

// Raises the soft limit on open files to the hard limit. ctquant keeps a
// bounded number of shards open (FdPool), sized from this limit: the common
// soft limit of 1024 would otherwise make a checkpoint of thousands of shards
// reopen files more often than it needs to.
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);  // best effort: the pools adapt to what is in force
}

const char* signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

// Writes each formatted log line to stderr with escape_for_terminal applied:
// log lines name tensors, modules and files taken from input files (lint
// findings, their fixes, warnings), which must not drive the terminal.
class EscapingStderrSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    const std::string text =
        ctquant::escape_for_terminal(std::string_view(formatted.data(), formatted.size()));
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

std::shared_ptr<spdlog::logger> make_logger(int verbosity) {
  auto logger = std::make_shared<spdlog::logger>("ctquant", std::make_shared<EscapingStderrSink>());
  logger->set_pattern("ctquant: %l: %v");
  logger->set_level(verbosity < 0   ? spdlog::level::err
                    : verbosity > 0 ? spdlog::level::debug
                                    : spdlog::level::info);
  return logger;
}

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
  std::string recipe;  // --recipe FILE, or empty
  std::optional<std::string> observer;        // --observer NAME
  std::vector<std::string> observer_kwargs;  // --observer-kwarg KEY=VALUE
};

// Larger group sizes than any tensor's in_features are refused by the plan
// anyway; the bound keeps out-of-range numbers a usage error.
constexpr long long kMaxGroupSizeOption = 1LL << 32;
// Two floats are at most 2^32 units in the last place apart.
constexpr long long kMaxScaleUlp = 1LL << 32;

// A check that an option's text is a whole number in [min, max], written in
// decimal, with a message that says so (CLI11 puts the option name before
// it). CLI11's own checks print float ranges and wrap negative numbers into
// unsigned options.
CLI::Validator whole_number(long long min, long long max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        const std::string digits = !text.empty() && text[0] == '-' ? text.substr(1) : text;
        const bool well_formed =
            !digits.empty() && digits.size() <= 18 &&
            std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
        const long long value = well_formed ? std::stoll(text) : 0;
        if (well_formed && value >= min && value <= max) return {};
        if (!well_formed) return fmt::format("{} is not a whole number", text);
        return fmt::format("{} is out of range: expected a whole number from {} to {}", text, min,
                           max);
      },
      "INT", "whole_number");
}

std::vector<CLI::Option*> add_plan_options(CLI::App* app, PlanArgs& args) {
  std::vector<CLI::Option*> options;
  options.push_back(app->add_option_function<std::string>(
      "--scheme", [&args](const std::string& value) { args.scheme = value; },
      "Preset scheme (default W4A16): " + ctquant::preset_names() +
          ". What each writes and needs (in_features a multiple of 16 for NVFP4A16, 32 for the "
          "MX presets): docs/cli.md, docs/microscale.md, docs/fp8-int8.md; presets that need "
          "calibration data (NVFP4, FP8 static) are refused with the reason"));
  options.push_back(
      app->add_option_function<long long>(
             "--group-size", [&args](const long long& value) { args.group_size = value; },
             "Columns per group of W4A16, W4A16_ASYM and W8A16 (default 128); -1 for "
             "channel-wise, the only value W8A8 takes; the float presets have a fixed layout")
          ->check(whole_number(-1, kMaxGroupSizeOption)));
  options.push_back(app->add_option("--ignore", args.ignore,
                                    "Module to leave unquantized (repeatable): a name, or "
                                    "re:PATTERN matched like Python re.match; added to the "
                                    "default ignore list")
                        ->allow_extra_args(false));
  options.push_back(app->add_flag("--no-default-ignore", args.no_default_ignore,
                                  "Start from an empty ignore list instead of the default one "
                                  "(heads, embeddings, routers, plain layers, towers)"));
  options.push_back(app->add_flag("--quantize-vision", args.quantize_vision,
                                  "Quantize vision/audio towers and projectors too (kept in 16 "
                                  "bits by default)"));
  options.push_back(
      app->add_option("--targets", args.targets,
                      "Modules to quantize (repeatable): Linear (all), a name or re:PATTERN")
          ->allow_extra_args(false));
  options.push_back(app->add_option("--scheme-for", args.scheme_for,
                                    "PATTERN=PRESET[@OBSERVER] (repeatable): modules matching PATTERN (a "
                                    "name or re:PATTERN) get PRESET; tried in the order given, "
                                    "before --scheme, which takes the rest")
                        ->allow_extra_args(false));
  options.push_back(app->add_option("--quantization-config", args.quantization_config,
                                    "A compressed-tensors QuantizationConfig JSON file "
                                    "(config_groups, ignore), as model_free_ptq's config= takes")
                        ->check(CLI::ExistingFile));
  options.push_back(app->add_option("--tp", args.tp,
                                    "Tensor-parallel degree the checkpoint will be served with, "
                                    "for the Marlin shape check (lint L5)")
                        ->check(CLI::Range(1u, 1024u))
                        ->capture_default_str());
  options.push_back(app->add_option_function<std::string>(
      "--observer", [&args](const std::string& value) { args.observer = value; },
      "Weight observer of every group (default memoryless_minmax, model_free_ptq's): "
      "memoryless_mse (search of shrunk ranges for the lowest |Q - W|^2.4), nvfp4_expanded_mse "
      "(also wider ranges; for NVFP4); mse runs as memoryless_mse; auto: per module, min-max or "
      "the MSE observer, whichever gives the lower weight error (reads the weights about four "
      "times); docs/observers.md"));
  options.push_back(app->add_option("--observer-kwarg", args.observer_kwargs,
                                    "KEY=VALUE (repeatable): an observer_kwargs entry of "
                                    "--observer (with auto: of its MSE observer): maxshrink, "
                                    "grid, norm, patience, expand")
                        ->allow_extra_args(false));
  options.push_back(app->add_option("--recipe", args.recipe,
                                    "llm-compressor recipe YAML with a data-free "
                                    "QuantizationModifier (scheme or config_groups, targets, "
                                    "ignore); options given here override it"));
  return options;
}

// The plan options of a run: the recipe read (if any), merged with the
// command line, and what the planner gets.
struct ResolvedPlan {
  std::unique_ptr<ctquant::RecipeSpec> recipe;
  ctquant::EffectiveRecipe effective;
  ctquant::PlanOptions options;
};

ResolvedPlan resolve_plan(const PlanArgs& args) {
  ResolvedPlan plan;
  if (!args.recipe.empty()) {
    plan.recipe = std::make_unique<ctquant::RecipeSpec>(ctquant::parse_recipe(args.recipe));
  }
  ctquant::CommandLinePlan cli;
  cli.scheme = args.scheme;
  cli.group_size = args.group_size;
  cli.ignore = args.ignore;
  cli.targets = args.targets;
  cli.scheme_for = args.scheme_for;
  cli.quantization_config = args.quantization_config;
  cli.observer = args.observer;
  cli.observer_kwargs = args.observer_kwargs;
  plan.effective = ctquant::resolve_recipe(plan.recipe.get(), cli);
  plan.options = ctquant::plan_options_for(plan.effective);
  // The given entries add to the module roles' default list (plan.hpp).
  plan.options.default_ignore = !args.no_default_ignore;
  plan.options.quantize_vision = args.quantize_vision;
  return plan;
}

void add_revision_option(CLI::App* app, std::optional<std::string>& revision) {
  app->add_option_function<std::string>(
      "--revision", [&revision](const std::string& value) { revision = value; },
      "With a Hugging Face repository id (ORG/NAME): the branch, tag or commit hash of the cached "
      "snapshot to read (default main)");
}

void add_verbosity_flags(CLI::App* app, int& verbosity) {
  app->add_flag_function(
      "-q,--quiet", [&](std::int64_t) { verbosity = -1; }, "Print errors only");
  app->add_flag_function(
      "-v,--verbose", [&](std::int64_t) { verbosity = 1; }, "Print debug detail");
}

// The one place ctquant writes to stdout (reports, plans, JSON). The write
// is checked: a full disk, /dev/full or a closed pipe is Error{kIo} (exit
// 1), never a silent empty file.
void write_stdout(const std::string& text) {
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), stdout) == text.size();
  if (!written || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const int error = errno;
    std::clearerr(stdout);
    throw ctquant::io_error(fmt::format("cannot write to standard output: {}",
                                        error != 0 ? std::strerror(error) : "write failed"));
  }
}

// Prints a text report (inventory, plan, lint findings, verify report) on
// stdout, escaped: the names in it come from input files and must not drive
// the terminal.
void print_text_report(const std::string& text) {
  write_stdout(ctquant::escape_for_terminal(text));
}

// Prints a JSON report on stdout as it is: dump() writes every control
// character as a \uXXXX escape and throws on text that is not UTF-8.
void print_json_report(const nlohmann::json& report) { write_stdout(report.dump(2) + "\n"); }

// Prints an error on stderr, first erasing the progress line a terminal may
// show; the message is escaped, since it names files and tensors.
void print_error(const std::string& message) {
  std::string text = ::isatty(STDERR_FILENO) == 1 ? "\r\033[K" : "";
  text += "ctquant: error: ";
  text += ctquant::escape_for_terminal(message);
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stderr);
}

// The exit status of --help and --version (written by CLI11 on std::cout):
// 1 when stdout could not take the text.
int checked_stdout(int status) {
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    print_error(fmt::format("cannot write to standard output: {}", std::strerror(errno)));
    return 1;
  }
  return status;
}

// The groups that quantized something, "W4A16" or "attention + mlp".
std::string scheme_names(const ctquant::QuantizePlan& plan) {
  std::string out;
  for (std::size_t g = 0; g < plan.options.groups.size(); ++g) {
    if (plan.group_modules[g] == 0) continue;
    out += (out.empty() ? "" : " + ") + plan.options.groups[g].name;
  }
  return out.empty() ? "none" : out;
}

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
  std::optional<std::string> part;
  std::optional<std::string> stage;
  bool resume = false;
  std::string write_recipe;  // --write-recipe FILE
  std::string report;        // --report FILE
  bool json = false;         // --json: the report on stdout
  std::optional<std::string> progress;  // --progress plain|bar|none
};

namespace fs = std::filesystem;

ctquant::ProgressMode progress_mode(const QuantizeArgs& args, int verbosity) {
  if (args.progress) return *ctquant::progress_mode_by_name(*args.progress);  // checked by CLI11
  if (verbosity < 0) return ctquant::ProgressMode::kNone;
  return ::isatty(STDERR_FILENO) == 1 ? ctquant::ProgressMode::kBar : ctquant::ProgressMode::kPlain;
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
  if (args.threads > 0) options.threads = args.threads;
  options.force = args.force;
  options.follow_symlinks = args.follow_symlinks;
  options.fsync = !args.no_sync;
  options.manifest = !args.no_manifest;
  options.dry_run = args.dry_run;
  options.allow_unloadable = args.allow_unloadable;
  options.strict = args.strict;
  options.logger = make_logger(verbosity);
  options.cancel = &g_cancel;
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
      print_text_report(ctquant::render_plan_text(checkpoint, plan) +
                        ctquant::render_recipe_origins(resolved.effective) +
                        fmt::format("lint: {}{}\n", ctquant::findings_summary(findings),
                                    findings.empty() ? "" : " (each on stderr)"));
    }
    if (want_report) plan_report = ctquant::report_plan_json(checkpoint, plan);
  };
  options.logger->debug("{}", ctquant::render_recipe_origins(resolved.effective));
  for (const std::string& note : ctquant::take_observer_notes()) options.logger->info("{}", note);

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
      [clock_start] { return std::chrono::duration<double>(Clock::now() - clock_start).count(); });
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
      throw ctquant::io_error(fmt::format("{} (OUTPUT {} was written and is complete; its report "
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
        linear == 0 ? std::string()
                    : fmt::format("; {:.1f}% of linear weight parameters quantized",
                                  100.0 * static_cast<double>(summary.plan.linear_params_quantized) /
                                      static_cast<double>(linear));
    std::fprintf(stderr,
                 "ctquant: %s %zu tensors quantized (%s), %zu copied%s%s; %s in, %s out, ratio "
                 "%.2fx; %.2f s\n",
                 args.dry_run ? "dry run:" : "done:", summary.tensors_quantized,
                 scheme_names(summary.plan).c_str(), summary.tensors_copied, fp8.c_str(),
                 share.c_str(), ctquant::human_bytes(summary.bytes_in).c_str(),
                 ctquant::human_bytes(summary.bytes_out).c_str(), ratio, summary.seconds);
    // The weight error of the modules with the largest one (quant_error.hpp).
    const std::string errors =
        ctquant::render_worst_errors(summary.plan, summary.execute.module_errors);
    if (!errors.empty()) {
      const std::string escaped = ctquant::escape_for_terminal("ctquant: " + errors);
      std::fwrite(escaped.data(), 1, escaped.size(), stderr);
    }
    if (summary.observer_choice) {
      const std::string escaped = ctquant::escape_for_terminal(
          "ctquant: " + ctquant::render_observer_choice(summary.plan, *summary.observer_choice));
      std::fwrite(escaped.data(), 1, escaped.size(), stderr);
    }
  }
  return 0;
}

struct FinalizeArgs {
  std::string output;
  std::optional<std::string> stage;
  bool force = false;
  bool no_sync = false;
};

int run_finalize(const FinalizeArgs& args, int verbosity) {
  ctquant::FinalizeOptions options;
  options.output = args.output;
  if (args.stage) options.stage = *args.stage;
  options.force = args.force;
  options.fsync = !args.no_sync;
  options.logger = make_logger(verbosity);
  options.cancel = &g_cancel;
  const ctquant::FinalizeSummary summary = ctquant::finalize_parts(options);
  if (verbosity >= 0) {
    std::fprintf(stderr, "ctquant: done: %s from %u part(s): %zu file(s), %s\n",
                 args.output.c_str(), summary.parts, summary.files,
                 ctquant::human_bytes(summary.bytes).c_str());
  }
  return 0;
}

struct InspectArgs {
  std::string input;
  std::optional<std::string> revision;
  PlanArgs plan;
  bool show_plan = false;
  bool json = false;
  bool errors = false;
  std::optional<std::string> source;
};

// inspect --errors OUTPUT --source INPUT: the weight error of every
// quantized module of OUTPUT (verify/errors.hpp).
int run_inspect_errors(const InspectArgs& args, bool plan_requested,
                       const std::vector<std::string>& argv) {
  if (!args.source) {
    throw ctquant::usage_error(
        "--errors needs --source INPUT: the checkpoint OUTPUT was quantized from");
  }
  if (plan_requested) {
    throw ctquant::usage_error(
        "--errors takes the scheme groups and ignore list from OUTPUT's config.json: give no "
        "--plan or quantize options");
  }
  const ctquant::CheckpointErrors errors = ctquant::checkpoint_errors(
      ctquant::resolve_checkpoint_input(args.input, args.revision),
      ctquant::resolve_checkpoint_input(*args.source, std::nullopt));
  if (args.json) {
    print_json_report(
        ctquant::with_envelope(ctquant::checkpoint_errors_json(errors), "inspect", argv));
  } else {
    print_text_report(ctquant::render_checkpoint_errors_text(errors));
  }
  return 0;
}

int run_inspect(const InspectArgs& args, bool plan_requested,
                const std::vector<std::string>& argv) {
  if (args.errors) return run_inspect_errors(args, plan_requested || args.show_plan, argv);
  if (args.source) {
    throw ctquant::usage_error("--source is the INPUT of --errors: give --errors too");
  }
  ctquant::InspectOptions options;
  options.plan = args.show_plan || plan_requested;
  std::optional<ResolvedPlan> resolved;
  if (options.plan) {
    resolved = resolve_plan(args.plan);
    options.plan_options = resolved->options;
  }
  options.lint.tp = args.plan.tp;
  const ctquant::InspectReport report = ctquant::inspect_checkpoint(
      ctquant::resolve_checkpoint_input(args.input, args.revision), options);
  if (args.json) {
    nlohmann::json doc = ctquant::with_envelope(ctquant::inspect_json(report), "inspect", argv);
    // The plan with each tensor's scheme and output shard, as quantize reports it.
    if (report.plan) doc["plan"] = ctquant::report_plan_json(report.checkpoint, *report.plan);
    doc["recipe"] = resolved ? ctquant::effective_recipe_json(resolved->effective) : nlohmann::json();
    print_json_report(doc);
  } else {
    std::string text = ctquant::render_inspect_text(report);
    if (resolved) text += ctquant::render_recipe_origins(resolved->effective);
    print_text_report(text);
  }
  if (report.plan_error) {
    print_error(*report.plan_error);
    return ctquant::exit_status(ctquant::ErrorKind::kBadInput);
  }
  return 0;
}

struct VerifyArgs {
  std::string output;
  std::string reference;
  std::optional<std::string> revision;
  bool against_source = false;
  bool manifest = false;
  std::uint64_t scale_ulp = 0;
  unsigned threads = 0;  // 0: all cores
  bool json = false;
};

int run_verify(const VerifyArgs& args, int verbosity, const std::vector<std::string>& argv) {
  if (args.manifest) {
    if (!args.reference.empty() || args.against_source) {
      throw ctquant::usage_error(
          "--manifest checks OUTPUT against its own manifest: give no GOLDEN or INPUT, and no "
          "--against-source");
    }
    const ctquant::ManifestCheck check = ctquant::check_manifest(
        args.output,
        args.threads > 0 ? args.threads : std::max(1u, std::thread::hardware_concurrency()));
    if (args.json) {
      print_json_report(
          ctquant::with_envelope(ctquant::manifest_check_json(check), "verify", argv));
    } else {
      print_text_report(ctquant::render_manifest_check_text(check));
    }
    return check.ok() ? 0 : ctquant::exit_status(ctquant::ErrorKind::kDifferent);
  }
  if (args.reference.empty()) {
    throw ctquant::usage_error(
        "verify needs GOLDEN (or, with --against-source, INPUT), or --manifest");
  }
  ctquant::VerifyOptions options;
  options.scale_ulp = args.scale_ulp;
  options.threads = args.threads;
  options.logger = make_logger(verbosity);
  const std::filesystem::path reference =
      ctquant::resolve_checkpoint_input(args.reference, args.revision);
  const ctquant::VerifyReport report =
      args.against_source ? ctquant::verify_against_source(args.output, reference, options)
                          : ctquant::verify_checkpoints(args.output, reference, options);
  if (args.json) {
    print_json_report(ctquant::with_envelope(ctquant::verify_json(report), "verify", argv));
  } else {
    print_text_report(ctquant::render_verify_text(report));
  }
  return report.same() ? 0 : ctquant::exit_status(ctquant::ErrorKind::kDifferent);
}

// Everything the command line fills in: the options of every command (only
// the chosen one's are set), the shared verbosity and argv for the reports.
struct CommandLine {
  std::vector<std::string> argv;
  int verbosity = 0;
  QuantizeArgs quantize;
  FinalizeArgs finalize;
  InspectArgs inspect;
  std::vector<CLI::Option*> inspect_plan_options;  // given: inspect prints the plan
  VerifyArgs verify;
};

void add_quantize_options(CLI::App* quantize, CommandLine& line) {
  QuantizeArgs& q = line.quantize;
  quantize
      ->add_option("INPUT", q.input,
                   "Checkpoint directory, a .safetensors file, or ORG/NAME in the Hugging Face "
                   "cache")
      ->required();
  quantize->add_option("OUTPUT", q.output, "Output directory (created; must not exist)")
      ->required();
  add_revision_option(quantize, q.revision);
  add_plan_options(quantize, q.plan);
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
  add_verbosity_flags(quantize, line.verbosity);
}

void add_finalize_options(CLI::App* finalize, CommandLine& line) {
  FinalizeArgs& fin = line.finalize;
  finalize->add_option("OUTPUT", fin.output, "Output directory (created; must not exist)")
      ->required();
  finalize->add_option_function<std::string>(
      "--stage", [&fin](const std::string& value) { fin.stage = value; },
      "Staging directory the parts wrote into (default .OUTPUT.ctquant-parts beside OUTPUT)");
  finalize->add_flag("--force", fin.force,
                     "Replace an existing OUTPUT, as quantize --force does");
  finalize->add_flag("--no-sync", fin.no_sync,
                     "Do not fsync OUTPUT's directory before and after the rename");
  add_verbosity_flags(finalize, line.verbosity);
}

void add_inspect_options(CLI::App* inspect, CommandLine& line) {
  InspectArgs& in = line.inspect;
  inspect
      ->add_option("INPUT", in.input,
                   "Checkpoint directory, a .safetensors file, or ORG/NAME in the Hugging Face "
                   "cache")
      ->required();
  add_revision_option(inspect, in.revision);
  line.inspect_plan_options = add_plan_options(inspect, in.plan);
  inspect->add_flag("--plan", in.show_plan,
                    "Print the plan and lint findings for the default (or given) options");
  inspect->add_flag("--json", in.json, "Print a JSON report instead of text");
  inspect->add_flag("--errors", in.errors,
                    "With --source INPUT: the weight error ||W-Q||/||W|| and max |W-Q| of every "
                    "quantized module of this checkpoint against the INPUT it was made from");
  inspect->add_option_function<std::string>(
      "--source", [&in](const std::string& value) { in.source = value; },
      "The checkpoint INPUT was quantized from (for --errors)");
  add_verbosity_flags(inspect, line.verbosity);
}

void add_verify_options(CLI::App* verify, CommandLine& line) {
  VerifyArgs& ver = line.verify;
  verify->add_option("OUTPUT", ver.output, "Checkpoint directory or .safetensors file to check")
      ->required();
  verify->add_option("GOLDEN", ver.reference,
                     "Golden checkpoint; with --against-source, the INPUT it was made from");
  add_revision_option(verify, ver.revision);
  verify->add_flag("--against-source", ver.against_source,
                   "Re-derive every quantized weight (codes, scales, zero points) from the source INPUT");
  verify->add_flag("--manifest", ver.manifest,
                   "Re-hash OUTPUT's files against its ctquant-manifest.json (exit 0 same, 3 "
                   "different, 1 no manifest)");
  verify
      ->add_option("--scale-ulp", ver.scale_ulp,
                   "Accept scales that differ by up to N units in the last place")
      ->check(whole_number(0, kMaxScaleUlp))
      ->capture_default_str();
  verify
      ->add_option("--threads", ver.threads,
                   "Threads reading and comparing at once (default: all cores); the report is "
                   "the same for every count")
      ->check(CLI::Range(1u, 1024u));
  verify->add_flag("--json", ver.json, "Print a JSON report instead of text");
  add_verbosity_flags(verify, line.verbosity);
}

// One command of ctquant. The table below drives the parsing, the dispatch,
// the command list of --help and of the unknown-command error, and the man
// page: the build lists the commands with `ctquant --list-subcommands` and
// adds each one's --help to ctquant(1) (CMakeLists.txt).
struct Subcommand {
  const char* name;
  const char* help;  // the one line --help lists
  void (*add_options)(CLI::App* command, CommandLine& line);
  int (*run)(const CommandLine& line);
};

const Subcommand kSubcommands[] = {
    {"quantize", "Quantize a checkpoint to a compressed-tensors checkpoint (RTN, data-free)",
     add_quantize_options,
     [](const CommandLine& line) { return run_quantize(line.quantize, line.verbosity, line.argv); }},
    {"finalize", "Assemble OUTPUT from the parts written by quantize --part I/N",
     add_finalize_options,
     [](const CommandLine& line) { return run_finalize(line.finalize, line.verbosity); }},
    {"inspect", "List a checkpoint's tensors; with quantize options, print the plan and lint",
     add_inspect_options,
     [](const CommandLine& line) {
       const bool plan_requested =
           std::any_of(line.inspect_plan_options.begin(), line.inspect_plan_options.end(),
                       [](const CLI::Option* o) { return o->count() > 0; });
       return run_inspect(line.inspect, plan_requested, line.argv);
     }},
    {"verify",
     "Compare OUTPUT with a golden checkpoint (exit 0 same, 3 different), or with its source",
     add_verify_options,
     [](const CommandLine& line) { return run_verify(line.verify, line.verbosity, line.argv); }},
};

// The hidden `ctquant --list-subcommands`: the command names, one a line,
// for the build's man page step.
constexpr std::string_view kListSubcommands = "--list-subcommands";

int list_subcommands() {
  std::string names;
  for (const Subcommand& command : kSubcommands) names += std::string(command.name) + "\n";
  try {
    write_stdout(names);
  } catch (const ctquant::Error& e) {
    print_error(e.what());
    return ctquant::exit_status(e.kind());
  }
  return 0;
}

// The top-level description, footer and --version of ctquant.
void describe_ctquant(CLI::App& app) {
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 success (verify: the checkpoints are equivalent); 1 failure (bad input, "
      "lint findings that stop quantize, I/O error, no space left, interrupted by a signal); 2 "
      "usage error (an option, or a path the run must not write: docs/cli.md); 3 verify found "
      "differences.\nEach command's options: ctquant COMMAND --help. Documentation: docs/cli.md.");
  app.set_version_flag("--version", std::string("ctquant ") + ctquant::ctquant_version());
}

void add_subcommands(CLI::App& app, CommandLine& line) {
  for (const Subcommand& command : kSubcommands) {
    command.add_options(app.add_subcommand(command.name, command.help), line);
  }
}

// Parses argv into line; the exit status when that ends the run (--help,
// --version, a usage error), nothing when a command is to run.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return checked_stdout(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return checked_stdout(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return checked_stdout(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty()) {
      std::string names;
      for (const Subcommand& command : kSubcommands) {
        names += (names.empty() ? "" : ", ") + std::string(command.name);
      }
      message = fmt::format("unknown command '{}' (commands: {})", argv[1], names);
    }
    print_error(message + "\nRun with --help for more information.");
    return ctquant::exit_status(ctquant::ErrorKind::kUsage);
  }
  return std::nullopt;
}

// The message of an error that ends a command, with what a signal left.
std::string error_message(const ctquant::Error& e, const CommandLine& line) {
  if (e.kind() != ctquant::ErrorKind::kInterrupted) return e.what();
  // --part and --resume are quantize's: set only when quantize runs.
  if (line.quantize.part || line.quantize.resume) {
    return fmt::format("{} ({}); the files finished so far are kept in the staging "
                       "directory: rerun the same command with --resume to go on",
                       e.what(), signal_name(g_signal.load()));
  }
  return fmt::format("{} ({}); OUTPUT was not written and the temporary directory was "
                     "removed",
                     e.what(), signal_name(g_signal.load()));
}

// Runs the one command parse_command_line found; its exit status.
int run_subcommand(const CLI::App& app, const CommandLine& line) {
  const std::string name = app.get_subcommands().front()->get_name();
  const Subcommand& command = *std::find_if(
      std::begin(kSubcommands), std::end(kSubcommands),
      [&name](const Subcommand& c) { return name == c.name; });
  try {
    return command.run(line);
  } catch (const ctquant::Error& e) {
    print_error(error_message(e, line));
    return ctquant::exit_status(e.kind());
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  install_signal_handlers();
  raise_open_file_limit();
  if (argc == 2 && argv[1] == kListSubcommands) return list_subcommands();
  CLI::App app{
      "ctquant: quantize safetensors checkpoints to compressed-tensors checkpoints for vLLM "
      "(int, FP8, NVFP4 and MX schemes; data-free RTN)"};
  describe_ctquant(app);
  CommandLine line;
  line.argv.assign(argv, argv + argc);
  add_subcommands(app, line);
  if (const std::optional<int> status = parse_command_line(app, argc, argv)) return *status;
  return run_subcommand(app, line);
}
