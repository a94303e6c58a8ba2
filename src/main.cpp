// ctquant command-line front end: CLI11 options -> one library call.
//
// Exit codes (docs/cli.md): 0 success, 1 failure (bad input, I/O, full disk,
// interrupted), 2 usage error, 3 verification found differences.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ctquant/error.hpp"
#include "ctquant/kernel.hpp"
#include "ctquant/quantize.hpp"

namespace {

std::atomic<bool> g_cancel{false};

extern "C" void on_signal(int) { g_cancel.store(true); }

void install_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // A file size limit (RLIMIT_FSIZE) must surface as EFBIG, a clean "no
  // space" error, not as a signal that kills the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
}

std::string human_bytes(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::shared_ptr<spdlog::logger> make_logger(int verbosity) {
  auto logger = spdlog::stderr_logger_st("ctquant");
  logger->set_pattern("ctquant: %l: %v");
  logger->set_level(verbosity < 0 ? spdlog::level::err
                                  : verbosity > 0 ? spdlog::level::debug : spdlog::level::info);
  return logger;
}

// Prints an error on stderr, first erasing the progress line a terminal may show.
void print_error(const char* message) {
  const char* erase_line = ::isatty(STDERR_FILENO) == 1 ? "\r\033[K" : "";
  std::fprintf(stderr, "%sctquant: error: %s\n", erase_line, message);
}

struct QuantizeArgs {
  std::string input;
  std::string output;
  std::string scheme = "W4A16";
  std::optional<long long> group_size;  // unset: the scheme's own
  std::vector<std::string> ignore;
  std::vector<std::string> targets;
  unsigned threads = 0;
  bool force = false;
  bool dry_run = false;
};

int run_quantize(const QuantizeArgs& args, int verbosity) {
  ctquant::QuantizeOptions options = ctquant::default_quantize_options();
  options.input = args.input;
  options.output = args.output;
  const auto scheme = ctquant::scheme_by_name(args.scheme);
  if (!scheme) {
    throw ctquant::usage_error(fmt::format(
        "--scheme {}: unknown scheme (known: W4A16, W4A16_ASYM, W8A16)", args.scheme));
  }
  options.plan.scheme = *scheme;
  if (!args.group_size) {
    // The scheme's own group size.
  } else if (*args.group_size == -1) {
    options.plan.scheme.group_size = 0;  // channel-wise
  } else if (*args.group_size > 0) {
    options.plan.scheme.group_size = static_cast<std::uint64_t>(*args.group_size);
  } else {
    throw ctquant::usage_error(fmt::format(
        "--group-size {}: expected a positive number of columns, or -1 for channel-wise",
        *args.group_size));
  }
  if (!args.ignore.empty()) options.plan.ignore = args.ignore;
  if (!args.targets.empty()) options.plan.targets = args.targets;
  if (args.threads > 0) options.threads = args.threads;
  options.force = args.force;
  options.dry_run = args.dry_run;
  options.logger = make_logger(verbosity);
  options.cancel = &g_cancel;

  const bool show_progress = verbosity >= 0 && ::isatty(STDERR_FILENO) == 1;
  if (show_progress) {
    options.on_progress = [](const ctquant::Progress& p) {
      const double pct = p.bytes_total == 0 ? 100.0 : 100.0 * static_cast<double>(p.bytes_done) /
                                                          static_cast<double>(p.bytes_total);
      std::fprintf(stderr, "\r\033[Kctquant: %5.1f%%  %s of %s  %llu/%llu tensors", pct,
                   human_bytes(p.bytes_done).c_str(), human_bytes(p.bytes_total).c_str(),
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
    std::fprintf(stderr,
                 "ctquant: %s %zu tensors quantized (%s), %zu copied; %s in, %s out, ratio "
                 "%.2fx; %.2f s\n",
                 args.dry_run ? "dry run:" : "done:", summary.tensors_quantized,
                 options.plan.scheme.name.c_str(), summary.tensors_copied,
                 human_bytes(summary.bytes_in).c_str(), human_bytes(summary.bytes_out).c_str(),
                 ratio, summary.seconds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  install_signal_handlers();
  CLI::App app{"ctquant: quantize safetensors checkpoints to compressed-tensors pack-quantized "
               "W4A16 for vLLM"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ctquant 0.1.0"));
  int verbosity = 0;

  QuantizeArgs q;
  CLI::App* quantize = app.add_subcommand(
      "quantize", "Quantize a checkpoint to a pack-quantized checkpoint (RTN, data-free)");
  quantize->add_option("INPUT", q.input, "Checkpoint directory or a .safetensors file")
      ->required();
  quantize->add_option("OUTPUT", q.output, "Output directory (created; must not exist)")
      ->required();
  quantize->add_option("--scheme", q.scheme, "W4A16 (int4 symmetric g128), W4A16_ASYM, W8A16")
      ->capture_default_str();
  long long group_size = 0;
  CLI::Option* group_size_option =
      quantize->add_option("--group-size", group_size,
                           "Columns per group (default: the scheme's, 128); -1 for channel-wise");
  quantize->add_option("--ignore", q.ignore,
                       "Module to leave unquantized (repeatable): a name, or re:PATTERN matched "
                       "like Python re.match; default lm_head")
      ->allow_extra_args(false);
  quantize->add_option("--targets", q.targets,
                       "Modules to quantize (repeatable): Linear (all), a name or re:PATTERN")
      ->allow_extra_args(false);
  quantize->add_option("--threads", q.threads, "Worker threads (default: all cores)")
      ->check(CLI::Range(1u, 1024u));
  quantize->add_flag("--force", q.force, "Replace an existing OUTPUT once the new one is complete");
  quantize->add_flag("--dry-run", q.dry_run, "Plan and report; write nothing");
  quantize->add_flag_function("-q,--quiet", [&](std::int64_t) { verbosity = -1; },
                              "Print errors only");
  quantize->add_flag_function("-v,--verbose", [&](std::int64_t) { verbosity = 1; },
                              "Print debug detail");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  if (group_size_option->count() > 0) q.group_size = group_size;

  try {
    if (quantize->parsed()) return run_quantize(q, verbosity);
  } catch (const ctquant::Error& e) {
    print_error(e.what());
    return ctquant::exit_status(e.kind());
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
  return 0;
}
