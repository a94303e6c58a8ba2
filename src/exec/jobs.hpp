// Private to the executor (src/exec/executor.cpp): what it knows of each
// planned module while it runs (ModuleRun), its jobs (Job), a worker's
// buffers, and JobRunner, which runs one job of each kind on a worker's
// buffers (src/exec/jobs.cpp): a module's rows read for their max |w| or
// searched for its MSE cutoff, quantized, or written as 16-bit rows; a
// tensor's bytes copied.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "ctquant/exec/executor.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/quant_error.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "exec/phase_times.hpp"
#include "exec/value_checks.hpp"
#include "exec/write_queue.hpp"

namespace ctquant::detail {

// What the executor needs of one planned module while it runs.
struct ModuleRun {
  const PlannedModule* module = nullptr;
  std::size_t shard = 0;
  WeightRows rows;
  // kQuantize: the group's family, args and output tensors.
  const SchemeFamily* family = nullptr;
  const QuantArgs* args = nullptr;
  std::vector<OutputTensorSpec> specs;
  std::vector<const PlannedTensor*> tensors;  // per spec (or the one 16-bit weight)
  std::vector<std::size_t> row_outputs;       // indexes into specs of the kRows outputs
  // Max |w| of the module (pre-pass), as float bits (non-negative floats
  // order as their bits), then of its amax set.
  std::atomic<std::uint32_t> amax_bits{0};
  float set_amax = 0.0f;
  // An MSE observer (scheme/observer.hpp): its parameters, the candidates
  // that improved some group (the cutoff pre-pass), whether more rows can
  // change the cutoff, and the last candidate searched.
  ObserverParams observer;
  std::mutex improved_mutex;
  ImprovedSteps improved;
  std::atomic<bool> cutoff_settled{false};
  std::uint32_t cutoff = 0;
  // The ranges the cutoff pre-pass chose for the chunks it searched, by the
  // chunk's first row (under improved_mutex): when the module's search runs
  // to the last candidate they are the ranges its amax and quantize jobs
  // would choose, which take them instead of searching again; the quantize
  // job frees them.
  std::map<std::uint64_t, std::vector<float>> searched_ranges;
  // kQuantize: the kWhole outputs' bytes (dequantize's `whole`), and the
  // weight error of the rows quantized so far (quant_error.hpp).
  std::vector<std::vector<std::byte>> whole;
  std::mutex error_mutex;
  RowOrderedError error;

  ModuleRun(const Checkpoint& checkpoint, const PlannedModule& m)
      : module(&m), shard(m.shard), rows(checkpoint, m.source) {}

  // kQuantize: the module as the scale checks name it (value_checks.hpp).
  detail::ScaleSubject subject() const {
    const OutputTensorSpec* scale = nullptr;
    for (const std::size_t o : row_outputs) {
      if (specs[o].kind == OutputTensorSpec::Kind::kScale) scale = &specs[o];
    }
    return {rows, module->name, *args, observer, scale};
  }
};

struct Job {
  enum class Kind {
    kCopy,      // bytes [begin, end) of an output tensor copied from its input
    kAmax,      // rows [begin, end) of a module read for its max |w|
    kObserve,   // rows [begin, end) of a module searched for its MSE cutoff
    kQuantize,  // rows [begin, end) of a module quantized
    kRows,      // rows [begin, end) of a module written as 16-bit rows (FP8 dequantized)
    kConvert,   // an output tensor of a converted module, made whole from its inputs
  };
  Kind kind = Kind::kCopy;
  std::size_t shard = 0;
  const PlannedTensor* tensor = nullptr;  // kCopy, kRows
  std::size_t module = 0;  // kAmax, kQuantize, kRows; kCopy of a split slice; kConvert: converted
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t input_bytes = 0;
  bool last_of_tensor = false;
  // kCopy: where the bytes come from; kConvert: its first input (read-ahead).
  const SafetensorsFile* in_file = nullptr;
  std::uint64_t in_offset = 0;  // kCopy: file offset of byte 0 of the output tensor's bytes
};

// One set of a quantize job's outputs, queued for writing and reused once
// it is written.
struct OutputSet : WriteBuffers {
  std::array<std::vector<std::byte>, 4> out;
};

// Per-worker buffers, sized once for the largest job. Two output sets: the
// worker quantizes its next chunk while its previous one waits to be written.
struct Buffers {
  std::vector<std::byte> input;      // a chunk of weight rows (an FP8 chunk as loaded or as codes)
  std::vector<std::byte> band;       // a band of an FP8 chunk's rows, dequantized to BF16
  std::vector<std::byte> fp8_scale;  // the scale grid rows an FP8 chunk uses
  std::vector<std::byte> scratch;    // the kernel's
  std::vector<float> ranges;         // an MSE observer's ranges of a chunk
  std::vector<RowError> row_errors;  // the weight error of a job's rows
  std::vector<float> error_values;   // quant_error_rows' scratch
  std::array<OutputSet, 2> out;
  std::size_t next_out = 0;
  // Marks `input` as in flight while a kRows job's rows are written
  // straight from it.
  WriteBuffers input_write;
  // A kConvert job's input tensors and output tensor, whole.
  std::vector<std::vector<std::byte>> convert_in;
  std::vector<std::byte> convert_out;
  WriteBuffers convert_write;
  // A copied tensor's bytes rewritten by --transform (at most one copy slice).
  std::vector<std::byte> rewritten;
};

// The rows each MSE pass searched or reused (ExecuteStats::mse_rows).
struct MseRowCounts {
  std::atomic<std::uint64_t> cutoff{0}, amax{0}, quantize{0}, reused_amax{0}, reused_quantize{0};
};

// Runs the executor's jobs on a worker's buffers. Holds references to the
// executor's state: its modules, plan, options, output files, phase times,
// write queue and MSE counts. Called from the worker threads; each job
// touches only its own rows, its module's shared fields under their
// mutexes or atomics, and the write queue. Errors: throws the bad-input
// errors of value_checks.hpp (a weight, FP8 value, scale or range that is
// not finite) and the reader's I/O errors.
class JobRunner {
 public:
  JobRunner(const Checkpoint& checkpoint, const std::vector<std::unique_ptr<ModuleRun>>& modules,
            const QuantizePlan& plan, const ExecuteOptions& options,
            const std::vector<std::unique_ptr<OutputFile>>& outputs,
            const std::vector<std::size_t>& shard_output, PhaseTimes& times, WriteQueue& queue,
            MseRowCounts& mse_rows, std::atomic<std::uint64_t>& searched_bytes)
      : checkpoint_(checkpoint),
        modules_(modules),
        plan_(plan),
        options_(options),
        outputs_(outputs),
        shard_output_(shard_output),
        times_(times),
        queue_(queue),
        mse_rows_(mse_rows),
        searched_bytes_(searched_bytes) {}

  // The job kinds (Job::Kind): kAmax, kObserve, kQuantize, kRows, kCopy.
  // job_index names the job to the write queue.
  void run_amax_job(const Job& job, Buffers& buf);
  void run_observe_job(const Job& job, Buffers& buf);
  void run_quantize_job(std::size_t job_index, const Job& job, Buffers& buf);
  void run_rows_job(std::size_t job_index, const Job& job, Buffers& buf);
  void run_copy_job(std::size_t job_index, const Job& job, Buffers& buf);
  void run_convert_job(std::size_t job_index, const Job& job, Buffers& buf);

  // Rows per band of an FP8 module's quantize job.
  std::uint64_t fp8_band_rows(const ModuleRun& m) const;

  // The output file of a plan shard this run writes (once it is open).
  const OutputFile* shard_file(std::size_t shard) const {
    return outputs_[shard_output_[shard]].get();
  }

 private:
  const float* observe(const ModuleRun& m, Buffers& buf, const std::byte* weight,
                       std::uint64_t begin, std::uint64_t n,
                       ImprovedSteps* improved = nullptr) const;
  bool reserve_searched_bytes(std::uint64_t bytes);
  static const float* searched_ranges(ModuleRun& m, std::uint64_t begin, std::uint64_t n);
  static std::vector<float> take_searched_ranges(ModuleRun& m, std::uint64_t begin,
                                                 std::uint64_t n);
  void load_rows(const ModuleRun& m, const Job& job, Buffers& buf) const;
  void error_rows(const ModuleRun& m, const KernelIo& io, std::uint64_t first, Buffers& buf) const;

  const Checkpoint& checkpoint_;
  const std::vector<std::unique_ptr<ModuleRun>>& modules_;  // one per plan module
  const QuantizePlan& plan_;
  const ExecuteOptions& options_;
  const std::vector<std::unique_ptr<OutputFile>>& outputs_;
  const std::vector<std::size_t>& shard_output_;  // plan shard -> index into outputs_
  PhaseTimes& times_;
  WriteQueue& queue_;
  MseRowCounts& mse_rows_;
  // Bytes of ranges the cutoff pre-pass kept (reserve_searched_bytes).
  std::atomic<std::uint64_t>& searched_bytes_;
};

}  // namespace ctquant::detail
