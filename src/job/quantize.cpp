#include "ctquant/job/quantize.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ctquant/exec/bit_choice.hpp"
#include "ctquant/exec/observer_choice.hpp"
#include "ctquant/exec/output_dir.hpp"
#include "ctquant/exec/path_policy.hpp"
#include "ctquant/format/config.hpp"
#include "ctquant/job/lint_policy.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/source/hf_cache.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

namespace fs = std::filesystem;

QuantizeOptions default_quantize_options() {
  QuantizeOptions options;
  options.threads = std::max(1u, std::thread::hardware_concurrency());
  return options;
}

namespace {

// Size of a file for the summary; 0 if it cannot be read.
std::uint64_t file_bytes(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : size;
}

std::uint64_t directory_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    if (item.is_regular_file(ec)) total += file_bytes(item.path());
  }
  return total;
}

// A signal that arrives while the checkpoint is opened or planned stops the
// run before anything is written.
constexpr const char* kInterruptedMessage = "interrupted by a signal before OUTPUT was complete";

void check_cancel(const std::atomic<bool>* cancel) {
  if (cancel != nullptr && cancel->load()) {
    throw Error(ErrorKind::kInterrupted, kInterruptedMessage);
  }
}

// Logs the findings that do not stop the run at their severity; throws
// Error{kLint} listing the ones that do (lint_policy.hpp).
void enforce_lint(const std::vector<Finding>& findings, const LintPolicy& policy,
                  const std::shared_ptr<spdlog::logger>& log) {
  const auto blocking = blocking_findings(findings, policy);
  for (const Finding& f : findings) {
    if (std::find(blocking.begin(), blocking.end(), &f) != blocking.end() || !log) continue;
    const std::string text = format_finding(f, 8, /*with_severity=*/false);
    switch (f.severity) {
      case Severity::kError:
        // The user asked for this output: a warning, not an error line in a
        // run that succeeds.
        log->warn("{} (an error that {} lets through: vLLM may refuse this output)", text,
                  policy.allow.contains(f.id) ? "--allow " + f.id : "--allow-unloadable");
        break;
      case Severity::kWarning:
        log->warn("{}", text);
        break;
      case Severity::kInfo:
        log->info("{}", text);
        break;
    }
  }
  if (blocking.empty()) return;
  std::string message = "lint stopped quantize; nothing was written:\n";
  for (const Finding* f : blocking) message += format_finding(*f) + "\n";
  message += lint_stop_advice(blocking, policy);
  throw Error(ErrorKind::kLint, message);
}

// Names what earlier runs that died left beside the paths this run writes
// (a temporary output directory after kill -9 or a second SIGINT, a staging
// directory no process uses), with its size and the command that removes it.
// Never removes anything: the user decides.
void log_leftovers(spdlog::logger& log, const QuantizeOptions& options, const fs::path* stage) {
  std::vector<fs::path> targets = {options.output};
  if (options.report_file) targets.push_back(*options.report_file);
  if (options.recipe_file) targets.push_back(*options.recipe_file);
  for (const fs::path& target : targets) {
    for (const Leftover& l : find_leftovers(target)) {
      log.warn(
          "{} ({}) was left by an earlier ctquant run that did not finish (process {} no "
          "longer runs); ctquant does not remove it: rm -r{} {}",
          l.path.string(), human_bytes(l.bytes), l.pid, l.directory ? "f" : "",
          shell_word(l.path.string()));
    }
  }
  std::error_code ec;
  if (stage != nullptr && fs::is_directory(*stage, ec) && !stage_in_use(*stage)) {
    log.warn(
        "{} ({}) is the staging directory of an earlier --part or --resume run for this OUTPUT, "
        "which no process is using; rerun that command with --resume to finish it, or remove it: "
        "rm -rf {}",
        stage->string(), human_bytes(tree_bytes(*stage)), shell_word(stage->string()));
  }
}

// --observer auto and --target-bits choose for the modules the scheme
// quantizes (a converted module is not requantized): with none there is
// nothing to choose, refused as --more-bits layers refuses it.
void check_plan_quantizes_some(const QuantizePlan& plan, const std::string& option) {
  if (plan.n_quantized > 0) return;
  throw usage_error(fmt::format(
      "{} chooses for the modules the scheme quantizes, and this plan quantizes none{}; run "
      "without it",
      option, plan.n_converted > 0 ? " (its converted modules are not requantized)" : ""));
}

// What --observer auto and --target-bits do before they read the weights:
// the first plan's blocking lint findings stop the run; then the options
// of the measuring (observer_choice.hpp), from the run's.
template <class Lap>
ObserverChoiceOptions start_measuring(const Checkpoint& checkpoint, const QuantizeOptions& options,
                                      const LintOptions& lint, const LintPolicy& policy,
                                      QuantizeSummary& summary, Lap& lap) {
  const std::vector<Finding> first = run_lint(checkpoint, summary.plan, lint);
  if (!blocking_findings(first, policy).empty()) enforce_lint(first, policy, options.logger);
  summary.phases.lint = lap();
  ObserverChoiceOptions measure;
  measure.threads = options.threads;
  measure.chunk_bytes = options.chunk_bytes;
  measure.on_progress = options.on_progress;
  measure.cancel = options.cancel;
  return measure;
}

// --observer auto (observer_choice.hpp): before anything is written, every
// module is measured with min-max, its MSE observer and refit, and the plan is
// made again with the groups split by the observer each module keeps. The
// first plan's blocking lint findings stop the run before the weights are
// read. A dry run does not read the weights: its plan keeps min-max.
template <class Lap>
void choose_observers_for(const Checkpoint& checkpoint, const QuantizeOptions& options,
                          const LintOptions& lint, const LintPolicy& policy,
                          QuantizeSummary& summary, Lap& lap) {
  const auto& log = options.logger;
  check_plan_quantizes_some(summary.plan, "--observer auto");
  if (options.dry_run) {
    if (log) {
      log->info(
          "--observer auto: a dry run does not read the weights, so its plan shows every "
          "group with min-max; the run measures each module with each observer");
    }
    return;
  }
  ObserverChoiceOptions choose = start_measuring(checkpoint, options, lint, policy, summary, lap);
  choose.kwargs = options.auto_observer_kwargs;
  if (log) {
    log->info(
        "--observer auto: measuring the weight error of {} module(s) with min-max, an MSE "
        "observer and refit (each module read about five times)",
        summary.plan.n_quantized);
  }
  summary.observer_choice = choose_observers(checkpoint, summary.plan, choose);
  summary.phases.choose_observer = lap();
  summary.plan = make_plan(
      checkpoint, split_groups_by_observer(options.plan, summary.plan, *summary.observer_choice,
                                           options.auto_observer_kwargs));
  summary.phases.plan += lap();
  check_cancel(options.cancel);
}

// The bit options, checked before INPUT is read (usage errors).
void check_bit_options(const QuantizeOptions& options) {
  if (!options.target_bits && !options.more_bits_layers) return;
  if (options.target_bits && options.more_bits_layers) {
    throw usage_error(
        "--target-bits and --more-bits cannot be combined: each decides which modules get more "
        "bits (by measured weight error, or by llama.cpp's fixed layer rule); give one");
  }
  const char* option = options.target_bits ? "--target-bits" : "--more-bits";
  if (options.auto_observer) {
    throw usage_error(fmt::format(
        "{} cannot be combined with --observer auto: both split the scheme group, by bits and "
        "by observer; give a single observer (e.g. --observer memoryless_mse)",
        option));
  }
  if (options.target_bits) {
    const double b = *options.target_bits;
    if (!std::isfinite(b) || b <= 0 || b > kMaxTargetBits) {
      throw usage_error(fmt::format(
          "--target-bits {}: bits per weight must be above 0 and at most {} (16-bit weights)", b,
          kMaxTargetBits));
    }
  }
  bit_ladder(options.plan, option);
}

// --target-bits and --more-bits layers (bit_allocation.hpp): the plan is
// made again with its group split by the allocation. --target-bits first
// measures every module with each option (the first plan's blocking lint
// findings stop the run before the weights are read); a dry run does not
// read the weights, so its plan keeps the given scheme.
template <class Lap>
void allocate_bits_for(const Checkpoint& checkpoint, const QuantizeOptions& options,
                       const LintOptions& lint, const LintPolicy& policy, QuantizeSummary& summary,
                       Lap& lap) {
  const auto& log = options.logger;
  const char* option = options.target_bits ? "--target-bits" : "--more-bits";
  BitAllocation allocation = start_allocation(summary.plan, bit_ladder(options.plan, option));
  if (options.more_bits_layers) {
    allocate_more_bits(allocation, summary.plan);
  } else {
    check_plan_quantizes_some(summary.plan, fmt::format("--target-bits {}", *options.target_bits));
    check_target_bits(allocation, *options.target_bits);
    if (options.dry_run) {
      if (log) {
        log->info(
            "--target-bits: a dry run does not read the weights, so its plan shows every "
            "module with {}; the run measures each module with each of {} scheme(s)",
            allocation.options.front().name, allocation.options.size());
      }
      return;
    }
    const ObserverChoiceOptions measure =
        start_measuring(checkpoint, options, lint, policy, summary, lap);
    if (log) {
      log->info(
          "--target-bits: measuring the weight error of {} module(s) with each of {} "
          "scheme(s)",
          allocation.modules.size(), allocation.options.size());
    }
    measure_bit_options(checkpoint, summary.plan, allocation, measure);
    summary.phases.choose_bits = lap();
    allocate_bits(allocation, summary.plan, *options.target_bits);
  }
  summary.plan =
      make_plan(checkpoint, split_groups_by_bits(options.plan, summary.plan, allocation));
  summary.phases.plan += lap();
  summary.bit_allocation = std::move(allocation);
  check_cancel(options.cancel);
}

// The groups --observer auto, --target-bits and --more-bits split name
// each module in entries vLLM finds under its own names
// (exact_target_entries, model/roles.hpp). Where vLLM would still not find
// a module, it would build it unquantized beside packed weights: a draft
// whose vLLM layer numbers are not known (RoleAnalysis::vllm_layers_unknown)
// when the split groups name a decoder layer, or any L13 finding on the
// split plan (verify --against-source reports such an output). Refused
// (exit 2, nothing written) unless --allow-unloadable asks for it.
void check_split_groups_found(const QuantizeOptions& options, const LintPolicy& policy,
                              const QuantizeSummary& summary) {
  if (!(options.auto_observer || options.target_bits || options.more_bits_layers) ||
      policy.allow_unloadable) {
    return;
  }
  const char* option = options.auto_observer ? "--observer auto"
                       : options.target_bits ? "--target-bits"
                                             : "--more-bits";
  const RoleAnalysis& roles = summary.plan.roles;
  const bool split = summary.plan.options.groups.size() > options.plan.groups.size();
  if (split && !roles.vllm_layers_unknown.empty()) {
    for (const PlannedModule& m : summary.plan.modules) {
      const ModuleInfo* info = roles.find(m.name);
      if (m.kind != PlannedModule::Kind::kQuantize || info == nullptr ||
          !info->vllm_name.starts_with("model.layers.")) {
        continue;
      }
      throw usage_error(fmt::format(
          "{}: the split groups name the draft's decoder layers by number, and vLLM's numbers "
          "are not known: {}; vLLM would not find '{}' and would build it unquantized beside "
          "packed weights. Nothing was written. Add num_target_layers (the target model's "
          "num_hidden_layers) to config.json, run without the option, or pass "
          "--allow-unloadable to write it anyway",
          option, roles.vllm_layers_unknown, m.name));
    }
  }
  for (const Finding& f : summary.findings) {
    if (f.id != "L13") continue;
    throw usage_error(fmt::format(
        "{}: the split groups name modules vLLM does not find (lint L13: {}); vLLM would "
        "build them unquantized beside packed weights. Nothing was written. Run without the "
        "option, or pass --allow-unloadable to write it anyway",
        option, f.message));
  }
}

// The directories a run creates its files in, checked before INPUT is read
// rather than when the first file is made (after the plan and any
// measuring): OUTPUT's directory, which takes the temporary directory
// renamed into place, and with --part or --resume the staging directory (or
// the directory that would hold it). Exit 1, the operating system's refusal
// a run would meet at the end (cli.md, exit codes); a dry run warns.
void refuse_unwritable_directories(const QuantizeOptions& options, const fs::path& stage) {
  const bool staged = options.part || options.resume;
  for (const std::string& why :
       unwritable_run_directories(options.output, !options.part, staged ? &stage : nullptr)) {
    if (!options.dry_run) throw Error(ErrorKind::kIo, why + ". Nothing was written");
    if (options.logger) options.logger->warn("a run would fail: {}", why);
  }
}

// --transform NAME of a row that mixes rows (rotate), or of any row with
// --observer auto, --target-bits or --more-bits: the rewritten source is
// written beside OUTPUT (a dry run: its headers only, in the temporary
// directory) and quantized as INPUT; it is removed when the run ends.
QuantizeSummary quantize_staged_source(const QuantizeOptions& options,
                                       const Checkpoint& checkpoint) {
  const auto log = options.logger;
  const std::string& name = options.plan.transform;
  if (options.part || options.resume) {
    throw usage_error(fmt::format(
        "--transform {} with {}: not supported yet ({}). Nothing was written. Run it without {}",
        name, options.part ? "--part" : "--resume",
        options.part ? "every part would write the whole rewritten source"
                     : "the rewritten source is written whole by one run and not kept",
        options.part ? "--part" : "--resume"));
  }
  std::shared_ptr<const RewritePlan> rewrite = plan_transform(checkpoint, name);
  const auto inner_options = [&](const fs::path& input) {
    QuantizeOptions inner = options;
    inner.input = input;
    inner.revision.reset();
    inner.plan.transform.clear();
    // What the staged source holds: recorded, never applied (or derived)
    // again by the run that reads it.
    auto held = std::make_shared<RewritePlan>(*rewrite);
    held->staged_source = true;
    inner.staged_rewrite = std::move(held);
    return inner;
  };
  // Plan and lint first, from the rewritten source's headers (sparse files
  // under the temporary directory): whatever they refuse is refused before
  // any value is rewritten. A dry run stops there.
  // Where the rewritten source goes: refused now, before any work, when a
  // run could not write it there; a dry run says so.
  const fs::path dir = staged_source_dir(options.output, name);
  if (const std::string refusal = staged_source_refusal(dir); !refusal.empty()) {
    if (!options.dry_run) {
      // A leftover is a path the run may not write (exit 2, as an OUTPUT
      // that exists); a directory it cannot write in is the operating
      // system's refusal (exit 1, as a plain run's OUTPUT directory).
      std::error_code ec;
      const bool leftover = fs::exists(fs::symlink_status(dir, ec));
      throw Error(leftover ? ErrorKind::kUsage : ErrorKind::kIo,
                  fmt::format("--transform {}: {}. Nothing was written", name, refusal));
    }
    if (log) log->warn("--transform {}: a run would refuse: {}", name, refusal);
  }
  const fs::path headers_dir = temporary_path(
      name, fmt::format("the headers of the source rewritten by --transform {}", name));
  {
    const StagedSource headers(checkpoint, *rewrite, headers_dir, false);
    if (options.dry_run) {
      if (log) {
        log->info("--transform {}: planned from the rewritten source's headers", name);
      }
      return quantize(inner_options(headers.path()));
    }
    QuantizeOptions check = inner_options(headers.path());
    check.dry_run = true;
    check.logger = nullptr;
    check.on_plan = nullptr;
    check.on_progress = nullptr;
    quantize(check);
  }
  // A per-element rewrite's scales, from the weights.
  if (!rewrite->staged_source) rewrite = derive_transform(checkpoint, *rewrite);
  if (options.before_writing) options.before_writing();
  const auto start = std::chrono::steady_clock::now();
  if (log) {
    log->info(
        "--transform {}: writing the rewritten source (INPUT's {} of tensor data) into {}; "
        "removed when the run ends",
        name, human_bytes(checkpoint.total_tensor_bytes()), dir.string());
  }
  const StagedSource staged(checkpoint, *rewrite, dir, true);
  if (log) {
    log->info("--transform {}: {} tensors rewritten in {:.1f} s", name, rewrite->tensors.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  QuantizeOptions inner = inner_options(staged.path());
  QuantizeSummary summary = quantize(inner);
  summary.bytes_in = checkpoint.total_file_bytes();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace

QuantizeSummary quantize(const QuantizeOptions& options) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto lap = [last = start]() mutable {
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - last).count();
    last = now;
    return seconds;
  };
  // Opening, planning, lint and the plan's rendering (on_plan) poll the
  // cancel flag in their loops (util/cancel.hpp); the writing checks it
  // between jobs, phases and files.
  const CancelScope cancel_scope(options.cancel, kInterruptedMessage);
  const auto log = options.logger;
  if (options.threads == 0) throw usage_error("--threads must be at least 1");
  if (options.stage && !options.part && !options.resume) {
    throw usage_error(
        "--stage names the staging directory of --part or --resume; give one of them");
  }
  if (!options.manifest && (options.part || options.resume)) {
    throw usage_error(fmt::format(
        "--no-manifest cannot be used with {}: staged files are checked by their SHA-256 when "
        "parts are finalized or a run is resumed",
        options.part ? "--part" : "--resume"));
  }
  check_plan_options(options.plan);  // usage errors before any file is read
  check_bit_options(options);
  const LintPolicy policy = make_lint_policy(options.strict, options.allow_unloadable,
                                             options.lint_allow, options.lint_error);

  const fs::path input = resolve_checkpoint_input(options.input, options.revision);
  if (log && input != options.input) {
    log->info("{}: the Hugging Face cache snapshot {}", options.input.string(), input.string());
  }
  const bool staged_run = options.part || options.resume;
  const fs::path stage = options.stage.value_or(default_stage_dir(options.output));
  RunPaths paths;
  paths.input = input;
  paths.output = options.output;
  paths.creates_output = !options.part;
  paths.force = options.force;
  if (staged_run) paths.stage = stage;
  paths.stage_named = options.stage.has_value();
  paths.report = options.report_file;
  paths.recipe = options.recipe_file;
  check_run_paths(paths);
  refuse_unwritable_directories(options, stage);
  if (log) log_leftovers(*log, options, staged_run ? nullptr : &stage);
  check_cancel(options.cancel);
  Checkpoint checkpoint =
      open_checkpoint(input, OpenOptions{.follow_links_outside = options.follow_symlinks});
  check_cancel(options.cancel);
  if (log) {
    log->info("{}: {} shard(s), {} tensors, {} bytes of tensor data", options.input.string(),
              checkpoint.shards.size(), checkpoint.tensors.size(), checkpoint.total_tensor_bytes());
  }
  if (log && checkpoint.config_beside_file) {
    log->info("{}: a single .safetensors file; the model's config.json is read from {}",
              options.input.string(), (checkpoint.root / kConfigFileName).string());
  }
  if (log) {
    for (const std::string& entry : checkpoint.skipped_entries) {
      log->warn("{}: {}: not a regular file; not copied to OUTPUT", options.input.string(), entry);
    }
  }
  if (log) {
    // Not part of the checkpoint the index describes: not written (vLLM
    // reads only the files the index lists).
    for (const std::string& name : checkpoint.unlisted_files) {
      log->warn("{}: a .safetensors file {} does not list; not copied to OUTPUT", name,
                kIndexFileName);
    }
    // Tensors of listed shards that weight_map omits are part of the model
    // (vLLM reads every tensor of a listed file): written like any other.
    for (const std::string& line : index_omission_lines(checkpoint)) log->warn("{}", line);
  }
  // A rewrite that mixes rows (rotate) is always staged; a per-element one
  // (balance) when the run measures or splits modules, which must read the
  // weights as rewritten.
  if (!options.plan.transform.empty() &&
      (transform_stages_source(options.plan.transform) || options.auto_observer ||
       options.target_bits || options.more_bits_layers)) {
    return quantize_staged_source(options, checkpoint);
  }
  QuantizeSummary summary;
  summary.phases.open = lap();
  summary.plan = make_plan(checkpoint, options.plan);
  summary.phases.plan = lap();
  // A split with more parts than output shards is refused before anything
  // is measured or written (run_part checks it again).
  if (options.part) check_part_count(summary.plan, *options.part);
  check_cancel(options.cancel);
  LintOptions lint;
  lint.tp = options.tp;
  if (options.auto_observer) choose_observers_for(checkpoint, options, lint, policy, summary, lap);
  if (options.target_bits || options.more_bits_layers) {
    allocate_bits_for(checkpoint, options, lint, policy, summary, lap);
  }
  // The rewrite a staged source holds (quantize_staged_source), recorded
  // for the summary, the report and the dry run's plan.
  if (options.staged_rewrite) summary.plan.rewrite = options.staged_rewrite;
  summary.findings = run_lint(checkpoint, summary.plan, lint);
  summary.phases.lint += lap();
  check_cancel(options.cancel);
  if (options.on_plan) options.on_plan(checkpoint, summary.plan, summary.findings);
  enforce_lint(summary.findings, policy, log);
  check_split_groups_found(options, policy, summary);
  // What --allow L9 lets through would be a quantization_config with no
  // config group: nothing quantized, and an output that vLLM, transformers
  // and ctquant verify all refuse. Only --allow-unloadable, which asks for
  // an output loaders may refuse, writes it.
  if (summary.plan.n_quantized == 0 && summary.plan.n_converted == 0 && !policy.allow_unloadable) {
    throw usage_error(fmt::format(
        "no tensor would be quantized (of {}; lint L9), so there is no scheme group to write: "
        "the output would be a quantization_config with empty config_groups, which vLLM, "
        "transformers and `ctquant verify` refuse; --allow L9 does not write it (nothing was "
        "written). Check INPUT and --ignore / --targets with `ctquant inspect INPUT --plan`",
        plural(summary.plan.decisions.size(), "tensor")));
  }
  summary.tensors_quantized = summary.plan.n_quantized;
  summary.tensors_copied = summary.plan.n_copied;
  summary.tensors_dequantized = summary.plan.n_dequantized;
  summary.tensors_dropped = summary.plan.n_dropped;
  if (log && summary.plan.input_quantization.is_fp8()) {
    log->info(
        "input is {}: FP8 weights are dequantized to BF16 exactly, then quantized or "
        "written as BF16; {} scale and activation tensor(s) dropped",
        summary.plan.input_quantization.describe(), summary.plan.n_dropped);
  }
  summary.bytes_in = checkpoint.total_file_bytes();
  if (checkpoint.has_index) summary.bytes_in += file_bytes(checkpoint.root / kIndexFileName);
  if (checkpoint.config) summary.bytes_in += file_bytes(checkpoint.root / kConfigFileName);
  if (options.dry_run) {
    summary.bytes_out = expected_output_bytes(checkpoint, summary.plan);
    summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return summary;
  }

  if (summary.plan.rewrite) {
    // The transform's scales, from the weights (a read of every weight it
    // rewrites; a few vectors per block in memory).
    summary.plan.rewrite = derive_transform(checkpoint, *summary.plan.rewrite);
    if (log && !summary.plan.rewrite->staged_source) {
      log->info(
          "--transform {}: {} tensors rewritten before quantizing ({} scale vectors)",
          summary.plan.rewrite->transform, summary.plan.rewrite->tensors.size(),
          std::count_if(summary.plan.rewrite->scales.begin(), summary.plan.rewrite->scales.end(),
                        [](const std::vector<double>& t) { return !t.empty(); }));
    }
  }
  if (options.before_writing) options.before_writing();
  ExecuteOptions exec;
  exec.threads = options.threads;
  exec.chunk_bytes = options.chunk_bytes;
  exec.fp8_band_bytes = options.fp8_band_bytes;
  exec.on_progress = options.on_progress;
  exec.cancel = options.cancel;
  exec.fsync = options.fsync;
  if (options.part || options.resume) {
    // Staged as files that survive the process (parts.hpp).
    PartOptions part;
    part.part = options.part.value_or(PartSpec{1, 1});
    part.stage = stage;
    part.resume = options.resume;
    part.logger = log;
    summary.part = run_part(checkpoint, summary.plan, part, exec);
    summary.execute = summary.part->execute;
    summary.phases.stream = summary.execute.seconds_stream;
    summary.phases.flush = summary.execute.seconds_flush;
    if (options.part) {
      summary.bytes_out = summary.part->bytes_assigned;
    } else {
      FinalizeOptions finalize;
      finalize.output = options.output;
      finalize.stage = part.stage;
      finalize.force = options.force;
      finalize.fsync = options.fsync;
      finalize.parts = 1;
      finalize.threads = options.threads;
      finalize.hashed = summary.part->hashed;  // hashed by this run: not read again
      finalize.logger = log;
      finalize.cancel = options.cancel;
      if (options.before_commit) {
        finalize.before_commit = [&](const FinalizeSummary& f) {
          summary.bytes_out = f.bytes;
          summary.output_files = f.manifest;
          summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
          options.before_commit(summary);
        };
      }
      const FinalizeSummary finalized = finalize_parts(finalize);
      summary.bytes_out = finalized.bytes;
      summary.output_files = finalized.manifest;
    }
    summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return summary;
  }

  StagedOutput staged(options.output, input, options.force);
  if (log) log->debug("writing into {}", staged.dir().string());
  // The manifest's digests are computed while the files are written.
  std::optional<WrittenFilesHasher> hasher;
  if (options.manifest) {
    hasher.emplace(staged.dir(), expected_output_files(checkpoint, summary.plan), options.cancel);
    exec.on_written = [&hasher](const fs::path& file, std::uint64_t offset, std::uint64_t length,
                                std::span<const std::byte> bytes) {
      hasher->written(file, offset, length, bytes);
    };
  }
  lap();
  summary.execute = execute_plan(checkpoint, summary.plan, staged.dir(), exec);
  lap();
  if (log) {
    for (const std::string& w : summary.execute.warnings) log->warn("{}", w);
  }
  summary.phases.stream = summary.execute.seconds_stream;
  summary.phases.flush = summary.execute.seconds_flush;
  check_cancel(options.cancel);
  if (hasher) {
    summary.output_files = hasher->finish();
    summary.output_files.push_back(
        write_manifest(staged.dir(), summary.output_files, options.fsync));
    std::sort(summary.output_files.begin(), summary.output_files.end(),
              [](const ManifestEntry& a, const ManifestEntry& b) { return a.name < b.name; });
    summary.phases.manifest = lap();
    if (log) {
      std::uint64_t hashed = 0;
      for (const ManifestEntry& f : summary.output_files) hashed += f.size;
      log->debug("hashed {} output files ({} bytes) for the manifest; {:.3f} s after the flush",
                 summary.output_files.size(), hashed, summary.phases.manifest);
    }
  } else if (log) {
    log->debug("no manifest (--no-manifest): the output files are not hashed");
  }
  if (log) {
    const ExecuteStats& st = summary.execute;
    log->debug(
        "streamed {} bytes in, {} bytes out in {:.3f} s ({:.2f} GB/s of input) on {} "
        "thread(s), kernel {}; flushed to disk in {:.3f} s",
        st.bytes_read, st.bytes_written, st.seconds_stream,
        st.seconds_stream > 0 ? static_cast<double>(st.bytes_read) / st.seconds_stream / 1e9 : 0.0,
        options.threads, kernel_path_name(), st.seconds_flush);
    log->debug(
        "CPU by phase, all threads: read {:.3f} s, FP8 decode {:.3f} s, max|w| {:.3f} s, "
        "quantize {:.3f} s, weight error {:.3f} s, write {:.3f} s, hash {:.3f} s; workers "
        "blocked {:.3f} s",
        st.cpu.read, st.cpu.decode, st.cpu.amax, st.cpu.quantize, st.cpu.error, st.cpu.write,
        st.cpu.on_written, st.cpu.waiting);
    const ExecuteStats::MseRows& mse = st.mse_rows;
    if (mse.cutoff + mse.amax + mse.quantize + mse.reused_amax + mse.reused_quantize > 0) {
      log->debug(
          "MSE search, weight rows: {} by the cutoff pre-pass, {} by the amax pre-pass, {} by "
          "the quantize jobs; {} amax and {} quantize rows took the cutoff pre-pass's ranges "
          "({} bytes kept)",
          mse.cutoff, mse.amax, mse.quantize, mse.reused_amax, mse.reused_quantize, mse.kept_bytes);
    }
  }
  summary.bytes_out = directory_bytes(staged.dir());
  // The last moment a signal can stop the run: after the rename OUTPUT is
  // complete and the run has succeeded.
  check_cancel(options.cancel);
  if (options.before_commit) {
    summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    options.before_commit(summary);
    check_cancel(options.cancel);
  }
  lap();
  if (const std::string left = staged.commit(); !left.empty() && log) log->warn("{}", left);
  summary.phases.commit = lap();
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace ctquant
