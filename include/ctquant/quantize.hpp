// The `quantize` job end to end: open the checkpoint, plan, write the
// output atomically, report.
//
// This is the one library call behind `ctquant quantize`; tests drive it
// without a process. Options start from default_quantize_options().
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>

#include <spdlog/logger.h>

#include "ctquant/executor.hpp"
#include "ctquant/plan.hpp"

namespace ctquant {

struct QuantizeOptions {
  std::filesystem::path input;   // checkpoint directory or .safetensors file
  std::filesystem::path output;  // directory to create (must not exist unless force)
  PlanOptions plan;              // scheme, ignore list, targets
  unsigned threads = 1;          // worker threads (>= 1)
  bool force = false;            // replace an existing OUTPUT once the new one is complete
  bool dry_run = false;          // plan only; write nothing
  bool fsync = true;             // flush files and directories before the rename
  std::uint64_t chunk_bytes = 4u << 20;  // input bytes per quantization job
  // Where log lines go (stderr in the CLI); null means nowhere.
  std::shared_ptr<spdlog::logger> logger;
  std::function<void(const Progress&)> on_progress;  // may be empty
  const std::atomic<bool>* cancel = nullptr;        // set by a signal handler
};

// Defaults: W4A16 (int4, symmetric, group 128), ignore ["lm_head"],
// targets ["Linear"], one thread per core.
QuantizeOptions default_quantize_options();

struct QuantizeSummary {
  std::size_t tensors_quantized = 0;
  std::size_t tensors_copied = 0;
  std::uint64_t bytes_in = 0;   // input files (shards, index, config, others)
  std::uint64_t bytes_out = 0;  // output files
  double seconds = 0;           // wall time of the whole job
  ExecuteStats execute;         // where the writing's time went (zero for a dry run)
  QuantizePlan plan;
};

// Runs the job. Throws ctquant::Error (see error.hpp and plan.hpp/executor.hpp
// for the kinds); on any error OUTPUT does not exist afterwards (or, with
// force, still holds what it held before).
QuantizeSummary quantize(const QuantizeOptions& options);

}  // namespace ctquant
