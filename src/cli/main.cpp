// ctquant command-line front end: CLI11 options -> one library call.
//
// Exit codes (docs/cli.md): 0 success, 1 failure (bad input, I/O, full disk,
// interrupted), 2 usage error, 3 verification found differences.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/output.hpp"
#include "cli/plan_args.hpp"
#include "cli/process.hpp"
#include "cli/quantize_command.hpp"
#include "ctquant/exec/manifest.hpp"
#include "ctquant/exec/parts.hpp"
#include "ctquant/job/report.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/source/hf_cache.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "ctquant/util/version.hpp"
#include "ctquant/verify/errors.hpp"
#include "ctquant/verify/verify.hpp"

namespace {

using namespace ctquant::cli;  // NOLINT: the CLI's own private helpers

struct FinalizeArgs {
  std::string output;
  std::optional<std::string> stage;
  bool force = false;
  bool no_sync = false;
  unsigned threads = 0;  // 0: all cores
};

int run_finalize(const FinalizeArgs& args, int verbosity) {
  ctquant::FinalizeOptions options;
  options.output = args.output;
  if (args.stage) options.stage = *args.stage;
  options.force = args.force;
  options.fsync = !args.no_sync;
  options.threads =
      args.threads > 0 ? args.threads : std::max(1u, std::thread::hardware_concurrency());
  options.logger = make_logger(verbosity);
  options.cancel = cancel_flag();
  const ctquant::FinalizeSummary summary = ctquant::finalize_parts(options);
  if (verbosity >= 0) {
    std::fprintf(stderr, "ctquant: done: %s from %u part(s): %zu file(s), %s\n",
                 args.output.c_str(), summary.parts, summary.files,
                 ctquant::human_bytes(summary.bytes).c_str());
  }
  return 0;
}

// A signal that came while a run wrote its temporary files and polled
// nothing more: the run finished and removed them; it ends as interrupted.
void throw_if_interrupted() {
  if (cancel_flag()->load()) {
    throw ctquant::Error(ctquant::ErrorKind::kInterrupted, "interrupted by a signal");
  }
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
  // A rotated output's INPUT is rewritten again under the temporary
  // directory: from then on a signal sets the flag, and the run removes it.
  const ctquant::CheckpointErrors errors =
      ctquant::checkpoint_errors(ctquant::resolve_checkpoint_input(args.input, args.revision),
                                 ctquant::resolve_checkpoint_input(*args.source, std::nullopt),
                                 4u << 20, cancel_flag(), [] { on_signal_cancel(); });
  throw_if_interrupted();
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
    if (report.plan) {
      doc["plan"] = ctquant::report_plan_json(report.checkpoint, *report.plan);
      doc["transform"] = ctquant::transform_json(*report.plan);
    }
    doc["recipe"] =
        resolved ? ctquant::effective_recipe_json(resolved->effective) : nlohmann::json();
    print_json_report(doc);
  } else {
    std::string text = ctquant::render_inspect_text(report);
    if (resolved) {
      text += ctquant::render_recipe_origins(
          resolved->effective, report.plan ? report.plan->options.default_ignore : true);
    }
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
  // A rotated output's INPUT is rewritten again under the temporary
  // directory: from then on a signal sets the flag, and the run removes it.
  options.cancel = cancel_flag();
  options.before_writing = [] { on_signal_cancel(); };
  const std::filesystem::path reference =
      ctquant::resolve_checkpoint_input(args.reference, args.revision);
  const ctquant::VerifyReport report =
      args.against_source ? ctquant::verify_against_source(args.output, reference, options)
                          : ctquant::verify_checkpoints(args.output, reference, options);
  throw_if_interrupted();
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

void add_finalize_options(CLI::App* finalize, CommandLine& line) {
  FinalizeArgs& fin = line.finalize;
  finalize->add_option("OUTPUT", fin.output, "Output directory (created; must not exist)")
      ->required()
      ->check(non_empty_path());
  finalize->add_option_function<std::string>(
      "--stage", [&fin](const std::string& value) { fin.stage = value; },
      "Staging directory the parts wrote into (default .OUTPUT.ctquant-parts beside OUTPUT)");
  finalize->add_flag("--force", fin.force, "Replace an existing OUTPUT, as quantize --force does");
  finalize->add_flag("--no-sync", fin.no_sync,
                     "Do not fsync OUTPUT's directory before and after the rename");
  finalize
      ->add_option("--threads", fin.threads,
                   "Staged files hashed at once to check their sha256 (default: all cores)")
      ->check(CLI::Range(1u, 1024u));
  add_verbosity_flags(finalize, line.verbosity);
}

void add_inspect_options(CLI::App* inspect, CommandLine& line) {
  InspectArgs& in = line.inspect;
  inspect
      ->add_option("INPUT", in.input,
                   "Checkpoint directory, a .safetensors file, or ORG/NAME in the Hugging Face "
                   "cache")
      ->required()
      ->check(non_empty_path());
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
      ->required()
      ->check(non_empty_path());
  verify
      ->add_option("GOLDEN", ver.reference,
                   "Golden checkpoint; with --against-source, the INPUT it was made from")
      ->check(non_empty_path());
  add_revision_option(verify, ver.revision);
  verify->add_flag(
      "--against-source", ver.against_source,
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
     [](CLI::App* command, CommandLine& line) {
       add_quantize_options(command, line.quantize, line.verbosity);
     },
     [](const CommandLine& line) {
       return run_quantize(line.quantize, line.verbosity, line.argv);
     }},
    {"finalize", "Assemble OUTPUT from the parts written by quantize --part I/N",
     add_finalize_options,
     [](const CommandLine& line) { return run_finalize(line.finalize, line.verbosity); }},
    {"inspect", "List a checkpoint's tensors; with quantize options, print the plan and lint",
     add_inspect_options,
     [](const CommandLine& line) {
       on_signal_exit_at_once("interrupted by a signal", "");  // inspect writes nothing
       const bool plan_requested =
           std::any_of(line.inspect_plan_options.begin(), line.inspect_plan_options.end(),
                       [](const CLI::Option* o) { return o->count() > 0; });
       return run_inspect(line.inspect, plan_requested, line.argv);
     }},
    {"verify",
     "Compare OUTPUT with a golden checkpoint (exit 0 same, 3 different), or with its source",
     add_verify_options,
     [](const CommandLine& line) {
       on_signal_exit_at_once("interrupted by a signal", "");  // verify writes nothing
       return run_verify(line.verify, line.verbosity, line.argv);
     }},
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
  // verify and inspect write no OUTPUT: only the rewritten INPUT of a
  // rotated output, removed by then (their message is the plain one).
  if (std::string_view(e.what()) == "interrupted by a signal") {
    return fmt::format("{} ({}); the temporary files were removed", e.what(),
                       signal_name(caught_signal()));
  }
  // --part and --resume are quantize's: set only when quantize runs.
  if (line.quantize.part || line.quantize.resume) {
    return fmt::format(
        "{} ({}); the files finished so far are kept in the staging "
        "directory: rerun the same command with --resume to go on",
        e.what(), signal_name(caught_signal()));
  }
  return fmt::format(
      "{} ({}); OUTPUT was not written and the temporary directory was "
      "removed",
      e.what(), signal_name(caught_signal()));
}

// Runs the one command parse_command_line found; its exit status.
int run_subcommand(const CLI::App& app, const CommandLine& line) {
  const std::string name = app.get_subcommands().front()->get_name();
  const Subcommand& command =
      *std::find_if(std::begin(kSubcommands), std::end(kSubcommands),
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
