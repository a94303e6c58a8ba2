// The `quantize` job end to end: open the checkpoint, plan, lint, write the
// output atomically, report.
//
// Lint (lint.hpp) runs after planning and before anything is written:
// findings that stop the run (errors unless allow_unloadable, warnings under
// strict, each rule's findings as lint_allow and lint_error say:
// lint_policy.hpp) make quantize() throw Error{kLint} listing them, with no
// OUTPUT created; the other findings go to the logger at their severity.
//
// This is the one library call behind `ctquant quantize`; tests drive it
// without a process. Options start from default_quantize_options().
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/logger.h>

#include "ctquant/exec/executor.hpp"
#include "ctquant/exec/manifest.hpp"
#include "ctquant/exec/observer_choice.hpp"
#include "ctquant/exec/parts.hpp"
#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/bit_allocation.hpp"
#include "ctquant/plan/plan.hpp"

namespace ctquant {

struct QuantizeSummary;

struct QuantizeOptions {
  // Checkpoint directory or .safetensors file, or a Hugging Face repository
  // id ORG/NAME looked up in the local hub cache (resolve_checkpoint_input).
  std::filesystem::path input;
  std::optional<std::string> revision;  // of a repository id; default "main"
  std::filesystem::path output;         // directory to create (must not exist unless force)
  PlanOptions plan;                     // scheme, ignore list, targets
  unsigned threads = 1;                 // worker threads (>= 1)
  bool force = false;            // replace a checkpoint-like OUTPUT once the new one is complete
  bool follow_symlinks = false;  // read files that links in INPUT point to outside it
  bool dry_run = false;          // plan and lint only; write nothing
  bool fsync = true;             // flush files and directories before the rename
  // Hash every output file while it is written and write the manifest
  // (exec/manifest.hpp). Off: no SHA-256 (about 0.7 s of one core per GB
  // written with SHA extensions) and no kManifestFileName; refused with part,
  // resume (their files are checked by digest) and by the CLI with a report.
  bool manifest = true;
  std::uint64_t chunk_bytes = 4u << 20;       // input bytes per quantization job
  std::uint64_t fp8_band_bytes = 256u << 10;  // ExecuteOptions::fp8_band_bytes
  // --observer auto (observer_choice.hpp): every module measured with
  // min-max, its MSE observer and refit (observer_kwargs
  // auto_observer_kwargs, an object or null, split between them) before
  // anything is written; each keeps the scales with the lowest weight
  // error. The plan's groups must use min-max.
  bool auto_observer = false;
  nlohmann::json auto_observer_kwargs;
  // --target-bits B (plan/bit_allocation.hpp, exec/bit_choice.hpp): every
  // module measured with each scheme of the bit ladder before anything is
  // written, the modules that buy the most weight error per byte raised
  // while the bits per weight stay <= B. Not with more_bits_layers nor
  // auto_observer; the plan must have one group that can mix.
  std::optional<double> target_bits;
  // --more-bits layers: down_proj of llama.cpp's use_more_bits layers at
  // W8A16 (with the rest of its unit), data-free.
  bool more_bits_layers = false;
  // Lint (lint.hpp): which findings stop the run, and the TP degree L5 checks.
  bool allow_unloadable = false;  // lint errors do not stop the run
  bool strict = false;            // lint warnings stop the run too
  // Rule by rule (lint_policy.hpp): ids ("L16", or "L15,L16") whose findings
  // never stop the run (--allow), and ids whose findings always do (--error).
  std::vector<std::string> lint_allow;
  std::vector<std::string> lint_error;
  unsigned tp = 1;  // tensor-parallel degree for the Marlin shape check (L5)
  // Where log lines go (stderr in the CLI); null means nowhere.
  std::shared_ptr<spdlog::logger> logger;
  std::function<void(const Progress&)> on_progress;  // may be empty
  // Called once the plan and its lint findings are ready, before lint can
  // stop the run (the CLI prints the plan here under --dry-run). May be empty.
  std::function<void(const Checkpoint&, const QuantizePlan&, const std::vector<Finding>&)> on_plan;
  // Set by a signal handler: polled while the checkpoint is opened, planned
  // and linted (util/cancel.hpp) and between the jobs, phases and files of
  // the writing.
  const std::atomic<bool>* cancel = nullptr;
  // Called once, on the calling thread, just before the run creates its
  // first file or directory (the temporary OUTPUT directory, or the staging
  // directory of part and resume); not for a dry run, nor when lint or
  // another error stops the run before. Until then the run has written
  // nothing (the CLI's signal handler ends the process at once); from then
  // on a signal must set cancel, so that the run cleans up. May be empty.
  std::function<void()> before_writing;
  // A run split across processes (parts.hpp): write only this part's files
  // into the staging directory, and leave OUTPUT to finalize_parts().
  std::optional<PartSpec> part;
  // Where parts (and a --resume run) stage their files; unset:
  // default_stage_dir(output).
  std::optional<std::filesystem::path> stage;
  // Keep the files an earlier run of the same plan finished (sha256
  // checked). Without part: a one-process run that stages as part 1/1, keeps
  // the staging directory when it fails or is interrupted, and finalizes
  // OUTPUT itself.
  bool resume = false;
  // Files the caller writes for this run (the CLI's --report and
  // --write-recipe): checked with OUTPUT and the stage by the path policy
  // (path_policy.hpp) before INPUT is read, and named when an earlier run
  // left a temporary file beside them. quantize() does not write them.
  std::optional<std::filesystem::path> report_file;
  std::optional<std::filesystem::path> recipe_file;
  // Called once every file of OUTPUT is written and flushed and its manifest
  // made, just before the rename that commits OUTPUT, with the summary so far
  // (counts, output files and digests, bytes, times). The CLI writes the
  // report and the recipe into temporary files here, so that a failure to
  // write them leaves no OUTPUT behind; an exception thrown here stops the
  // run as any error does. Not called for a dry run or a --part run, which
  // commit no OUTPUT. May be empty.
  std::function<void(const QuantizeSummary&)> before_commit;
  // Set by quantize() itself for a transform that writes its rewritten
  // source first (transform/transform.hpp, staged_source: rotate): the run
  // reads that source as INPUT and this is the rewrite it records in the
  // summary, the report and the dry run's plan (nothing to apply).
  std::shared_ptr<const RewritePlan> staged_rewrite;
};

// Defaults: W4A16 (int4, symmetric, group 128), ignore ["lm_head"],
// targets ["Linear"], one thread per core.
QuantizeOptions default_quantize_options();

// Wall time of each phase of quantize(), in seconds.
struct PhaseTimes {
  double open = 0;             // list the input, read and validate every header
  double plan = 0;             // make_plan (twice with --observer auto, --target-bits, --more-bits)
  double choose_observer = 0;  // --observer auto: measuring every module with each observer
  double choose_bits = 0;      // --target-bits: measuring every module with each option
  double lint = 0;             // run_lint
  double stream = 0;           // execute_plan's jobs: read, quantize, write (page cache)
  double flush = 0;            // execute_plan's fsync of every file (0 with fsync off)
  double manifest = 0;         // hash every output file, write the manifest
  double commit = 0;           // rename into place
};

struct QuantizeSummary {
  std::size_t tensors_quantized = 0;
  std::size_t tensors_copied = 0;
  std::size_t tensors_dequantized = 0;  // FP8 weights written as BF16
  std::size_t tensors_dropped = 0;      // FP8 scales and activation parameters not written
  std::uint64_t bytes_in = 0;           // input files (shards, index, config, others)
  std::uint64_t bytes_out = 0;          // output files
  double seconds = 0;                   // wall time of the whole job
  ExecuteStats execute;                 // where the writing's time went (zero for a dry run)
  PhaseTimes phases;
  // Every file of OUTPUT with its size and SHA-256, sorted by name, the
  // manifest (kManifestFileName) included; empty for a dry run and without
  // QuantizeOptions::manifest.
  std::vector<ManifestEntry> output_files;
  QuantizePlan plan;
  std::vector<Finding> findings;    // every lint finding, blocking or not
  std::optional<PartSummary> part;  // a part's or a --resume run's files (kept, written)
  // --observer auto (not for a dry run): each module's errors and choice,
  // for the plan before the groups were split (the modules are the same, in
  // the same order, as plan's).
  std::optional<ObserverChoices> observer_choice;
  // --target-bits (not for a dry run) and --more-bits layers: each module's
  // option, for the plan before the group was split (same modules, same
  // order as plan's).
  std::optional<BitAllocation> bit_allocation;
};

// Runs the job. OUTPUT gets a manifest (exec/manifest.hpp) of its files,
// hashed while they are written (WrittenFilesHasher), unless
// options.manifest is off.
// Throws ctquant::Error (see error.hpp and plan.hpp/executor.hpp
// for the kinds; Error{kLint} when lint findings stop the run, also under
// dry_run); on any error OUTPUT does not exist afterwards (or, with force,
// still holds what it held before). With dry_run, bytes_out is the expected
// output size and nothing is created. With part, only that part's files are
// written, into the staging directory, and bytes_out counts them; with
// resume, run_part() and finalize_parts() throw what they throw, and the
// staging directory is kept on error.
QuantizeSummary quantize(const QuantizeOptions& options);

}  // namespace ctquant
