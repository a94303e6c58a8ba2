// ctquant command-line front end: CLI11 options -> one library call.
//
// Exit codes (docs/cli.md): 0 success, 1 failure (bad input, I/O, full disk,
// interrupted), 2 usage error, 3 verification found differences.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ctquant/util/error.hpp"
#include "ctquant/util/escape.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/source/hf_cache.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/exec/quantize.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/registry.hpp"
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
  std::optional<std::string> scheme;    // unset: W4A16
  std::optional<long long> group_size;  // unset: the scheme's own
  std::vector<std::string> ignore;
  std::vector<std::string> targets;
  std::vector<std::string> scheme_for;  // PATTERN=PRESET
  std::string quantization_config;      // a QuantizationConfig JSON file
  unsigned tp = 1;
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
        return fmt::format("{} is not a whole number from {} to {}", text, min, max);
      },
      "INT", "whole_number");
}

std::vector<CLI::Option*> add_plan_options(CLI::App* app, PlanArgs& args) {
  std::vector<CLI::Option*> options;
  options.push_back(app->add_option_function<std::string>(
      "--scheme", [&args](const std::string& value) { args.scheme = value; },
      "Preset scheme (default W4A16): " + ctquant::preset_names()));
  options.push_back(app->add_option_function<long long>(
                           "--group-size",
                           [&args](const long long& value) { args.group_size = value; },
                           "Columns per group (default: the scheme's, 128); -1 for channel-wise")
                        ->check(whole_number(-1, kMaxGroupSizeOption)));
  options.push_back(app->add_option("--ignore", args.ignore,
                                    "Module to leave unquantized (repeatable): a name, or "
                                    "re:PATTERN matched like Python re.match; default lm_head")
                        ->allow_extra_args(false));
  options.push_back(
      app->add_option("--targets", args.targets,
                      "Modules to quantize (repeatable): Linear (all), a name or re:PATTERN")
          ->allow_extra_args(false));
  options.push_back(app->add_option("--scheme-for", args.scheme_for,
                                    "PATTERN=PRESET (repeatable): modules matching PATTERN (a "
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
  return options;
}

// Appends group g, merging it into an earlier group of the same name (one
// config_groups key per preset).
void add_group(ctquant::PlanOptions& options, ctquant::SchemeGroup g) {
  for (ctquant::SchemeGroup& existing : options.groups) {
    if (existing.name == g.name) {
      existing.targets.insert(existing.targets.end(), g.targets.begin(), g.targets.end());
      return;
    }
  }
  options.groups.push_back(std::move(g));
}

ctquant::PlanOptions to_plan_options(const PlanArgs& args) {
  ctquant::PlanOptions options;
  if (!args.quantization_config.empty()) {
    for (const auto& [given, flag] :
         {std::pair{args.scheme.has_value(), "--scheme"},
          std::pair{args.group_size.has_value(), "--group-size"},
          std::pair{!args.targets.empty(), "--targets"},
          std::pair{!args.scheme_for.empty(), "--scheme-for"}}) {
      if (given) {
        throw ctquant::usage_error(fmt::format(
            "{} does not apply with --quantization-config: the config's groups say which "
            "scheme each module gets (write it into the config instead)",
            flag));
      }
    }
    options = ctquant::read_quantization_config(args.quantization_config);
    // --ignore adds to the config's own list, as model_free_ptq's ignore= does.
    options.ignore.insert(options.ignore.end(), args.ignore.begin(), args.ignore.end());
    return options;
  }
  options.groups.clear();
  for (const std::string& spec : args.scheme_for) {
    const auto eq = spec.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      throw ctquant::usage_error(fmt::format(
          "--scheme-for '{}': expected PATTERN=PRESET, e.g. 're:.*self_attn.*=W8A16'", spec));
    }
    ctquant::SchemeGroup g = ctquant::preset_group(spec.substr(eq + 1));
    g.targets = {spec.substr(0, eq)};
    add_group(options, std::move(g));
  }
  ctquant::SchemeGroup main = ctquant::preset_group(args.scheme.value_or("W4A16"));
  if (args.group_size) {
    using S = ctquant::QuantArgs::Strategy;
    if (main.weights.type != ctquant::QuantArgs::Type::kInt ||
        (main.weights.strategy != S::kGroup && main.weights.strategy != S::kChannel)) {
      throw ctquant::usage_error(fmt::format(
          "--group-size applies to the integer presets; {} has a fixed layout", main.name));
    }
    if (*args.group_size == -1) {
      main.weights.strategy = S::kChannel;
      main.weights.group_size = 0;
    } else if (*args.group_size > 0) {
      main.weights.strategy = S::kGroup;
      main.weights.group_size = static_cast<std::uint64_t>(*args.group_size);
    } else {
      throw ctquant::usage_error(fmt::format(
          "--group-size {}: expected a positive number of columns, or -1 for channel-wise",
          *args.group_size));
    }
    // A preset changed is a scheme object to compressed-tensors, which names
    // its group "config_group_0" (schemes.md 9.1) -- unless it is the preset.
    if (main.weights != ctquant::preset_group(main.name).weights) main.name = "config_group_0";
  }
  if (!args.targets.empty()) main.targets = args.targets;
  add_group(options, std::move(main));
  if (!args.ignore.empty()) options.ignore = args.ignore;
  return options;
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

void write_stdout(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
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
  bool follow_symlinks = false;
  bool dry_run = false;
  bool allow_unloadable = false;
  bool strict = false;
  std::optional<std::string> part;
  std::optional<std::string> stage;
  bool resume = false;
};

int run_quantize(const QuantizeArgs& args, int verbosity) {
  ctquant::QuantizeOptions options = ctquant::default_quantize_options();
  options.input = args.input;
  options.revision = args.revision;
  options.output = args.output;
  options.plan = to_plan_options(args.plan);
  options.tp = args.plan.tp;
  if (args.threads > 0) options.threads = args.threads;
  options.force = args.force;
  options.follow_symlinks = args.follow_symlinks;
  options.fsync = !args.no_sync;
  options.dry_run = args.dry_run;
  options.allow_unloadable = args.allow_unloadable;
  options.strict = args.strict;
  options.logger = make_logger(verbosity);
  options.cancel = &g_cancel;
  if (args.part) options.part = ctquant::parse_part(*args.part);
  if (args.stage) options.stage = *args.stage;
  options.resume = args.resume;
  if (args.dry_run) {
    options.on_plan = [](const ctquant::Checkpoint& checkpoint, const ctquant::QuantizePlan& plan,
                         const std::vector<ctquant::Finding>&) {
      print_text_report(ctquant::render_plan_text(checkpoint, plan));
    };
  }

  const bool show_progress = verbosity >= 0 && ::isatty(STDERR_FILENO) == 1;
  if (show_progress) {
    options.on_progress = [](const ctquant::Progress& p) {
      const double pct = p.bytes_total == 0 ? 100.0
                                            : 100.0 * static_cast<double>(p.bytes_done) /
                                                  static_cast<double>(p.bytes_total);
      std::fprintf(stderr, "\r\033[Kctquant: %5.1f%%  %s of %s  %llu/%llu tensors", pct,
                   ctquant::human_bytes(p.bytes_done).c_str(),
                   ctquant::human_bytes(p.bytes_total).c_str(),
                   static_cast<unsigned long long>(p.tensors_done),
                   static_cast<unsigned long long>(p.tensors_total));
      std::fflush(stderr);
    };
  }
  const ctquant::QuantizeSummary summary = ctquant::quantize(options);
  if (show_progress) std::fprintf(stderr, "\r\033[K");
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
    std::fprintf(stderr,
                 "ctquant: %s %zu tensors quantized (%s), %zu copied%s; %s in, %s out, ratio "
                 "%.2fx; %.2f s\n",
                 args.dry_run ? "dry run:" : "done:", summary.tensors_quantized,
                 scheme_names(summary.plan).c_str(), summary.tensors_copied, fp8.c_str(),
                 ctquant::human_bytes(summary.bytes_in).c_str(),
                 ctquant::human_bytes(summary.bytes_out).c_str(), ratio, summary.seconds);
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
};

int run_inspect(const InspectArgs& args, bool plan_requested) {
  ctquant::InspectOptions options;
  options.plan = args.show_plan || plan_requested;
  if (options.plan) options.plan_options = to_plan_options(args.plan);
  options.lint.tp = args.plan.tp;
  const ctquant::InspectReport report = ctquant::inspect_checkpoint(
      ctquant::resolve_checkpoint_input(args.input, args.revision), options);
  if (args.json) {
    print_json_report(ctquant::inspect_json(report));
  } else {
    print_text_report(ctquant::render_inspect_text(report));
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
  std::uint64_t scale_ulp = 0;
  bool json = false;
};

int run_verify(const VerifyArgs& args, int verbosity) {
  ctquant::VerifyOptions options;
  options.scale_ulp = args.scale_ulp;
  options.logger = make_logger(verbosity);
  const std::filesystem::path reference =
      ctquant::resolve_checkpoint_input(args.reference, args.revision);
  const ctquant::VerifyReport report =
      args.against_source ? ctquant::verify_against_source(args.output, reference, options)
                          : ctquant::verify_checkpoints(args.output, reference, options);
  if (args.json) {
    print_json_report(ctquant::verify_json(report));
  } else {
    print_text_report(ctquant::render_verify_text(report));
  }
  return report.same() ? 0 : ctquant::exit_status(ctquant::ErrorKind::kDifferent);
}

}  // namespace

int main(int argc, char** argv) {
  install_signal_handlers();
  raise_open_file_limit();
  CLI::App app{
      "ctquant: quantize safetensors checkpoints to compressed-tensors pack-quantized "
      "W4A16 for vLLM"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ctquant 0.1.0"));
  int verbosity = 0;

  QuantizeArgs q;
  CLI::App* quantize = app.add_subcommand(
      "quantize", "Quantize a checkpoint to a pack-quantized checkpoint (RTN, data-free)");
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
  add_verbosity_flags(quantize, verbosity);

  FinalizeArgs fin;
  CLI::App* finalize = app.add_subcommand(
      "finalize", "Assemble OUTPUT from the parts written by quantize --part I/N");
  finalize->add_option("OUTPUT", fin.output, "Output directory (created; must not exist)")
      ->required();
  finalize->add_option_function<std::string>(
      "--stage", [&fin](const std::string& value) { fin.stage = value; },
      "Staging directory the parts wrote into (default .OUTPUT.ctquant-parts beside OUTPUT)");
  finalize->add_flag("--force", fin.force,
                     "Replace an existing OUTPUT, as quantize --force does");
  finalize->add_flag("--no-sync", fin.no_sync,
                     "Do not fsync OUTPUT's directory before and after the rename");
  add_verbosity_flags(finalize, verbosity);

  InspectArgs in;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "List a checkpoint's tensors; with quantize options, print the plan and lint");
  inspect
      ->add_option("INPUT", in.input,
                   "Checkpoint directory, a .safetensors file, or ORG/NAME in the Hugging Face "
                   "cache")
      ->required();
  add_revision_option(inspect, in.revision);
  const std::vector<CLI::Option*> inspect_plan_options = add_plan_options(inspect, in.plan);
  inspect->add_flag("--plan", in.show_plan,
                    "Print the plan and lint findings for the default (or given) options");
  inspect->add_flag("--json", in.json, "Print a JSON report instead of text");
  add_verbosity_flags(inspect, verbosity);

  VerifyArgs ver;
  CLI::App* verify = app.add_subcommand(
      "verify",
      "Compare OUTPUT with a golden checkpoint (exit 0 same, 3 different), or with its source");
  verify->add_option("OUTPUT", ver.output, "Checkpoint directory or .safetensors file to check")
      ->required();
  verify
      ->add_option("GOLDEN", ver.reference,
                   "Golden checkpoint; with --against-source, the INPUT it was made from")
      ->required();
  add_revision_option(verify, ver.revision);
  verify->add_flag("--against-source", ver.against_source,
                   "Unpack, recompute and dequantize every packed weight from the source INPUT");
  verify
      ->add_option("--scale-ulp", ver.scale_ulp,
                   "Accept scales that differ by up to N units in the last place")
      ->check(whole_number(0, kMaxScaleUlp))
      ->capture_default_str();
  verify->add_flag("--json", ver.json, "Print a JSON report instead of text");
  add_verbosity_flags(verify, verbosity);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty()) {
      message = fmt::format("unknown command '{}' (commands: quantize, finalize, inspect, verify)",
                            argv[1]);
    }
    print_error(message + "\nRun with --help for more information.");
    return ctquant::exit_status(ctquant::ErrorKind::kUsage);
  }

  try {
    if (quantize->parsed()) return run_quantize(q, verbosity);
    if (finalize->parsed()) return run_finalize(fin, verbosity);
    if (inspect->parsed()) {
      const bool plan_requested =
          std::any_of(inspect_plan_options.begin(), inspect_plan_options.end(),
                      [](const CLI::Option* o) { return o->count() > 0; });
      return run_inspect(in, plan_requested);
    }
    if (verify->parsed()) return run_verify(ver, verbosity);
  } catch (const ctquant::Error& e) {
    if (e.kind() == ctquant::ErrorKind::kInterrupted && quantize->parsed() &&
        (q.part || q.resume)) {
      print_error(fmt::format("{} ({}); the files finished so far are kept in the staging "
                              "directory: rerun the same command with --resume to go on",
                              e.what(), signal_name(g_signal.load())));
    } else if (e.kind() == ctquant::ErrorKind::kInterrupted) {
      print_error(
          fmt::format("{} ({}); OUTPUT was not written and the temporary directory was "
                      "removed",
                      e.what(), signal_name(g_signal.load())));
    } else {
      print_error(e.what());
    }
    return ctquant::exit_status(e.kind());
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
  return 0;
}
