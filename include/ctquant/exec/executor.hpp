// Executes a QuantizePlan: streams tensor data from the input shards to the
// output shards with a fixed memory budget.
//
// Each output shard is created with its planned size and its header is
// written first. The work is then a list of jobs in plan order: byte ranges
// of copied tensors (copy_file_range, no user-space buffer) and row chunks of
// quantized weights (read into a per-thread buffer of about chunk_bytes,
// quantized by quantize_block(), written with pwrite at the offsets the plan
// fixed). A chunk of an FP8 weight is read as codes with the scale rows it
// needs and dequantized to BF16 (section 6 of the format spec): band by band
// into a cache-sized buffer (fp8_band_bytes), each band quantized at once, or
// in place when the plan keeps the module unquantized and writes it as BF16. Worker threads take jobs from a shared
// counter, so the output bytes never depend on the thread count; the error
// of the earliest failing job is the one reported. The writes go through one
// queue and are made by one worker at a time, so that workers do not wait on
// each other in the kernel's per-file lock; each worker has two output
// buffers and quantizes its next chunk while the last one waits to be
// written. A module searched by an MSE observer whose patience can stop
// the search early is first searched chunk by chunk until its cutoff is
// known (mse_cutoff); when the search turns out to run to the last
// candidate, the ranges that pre-pass chose for a chunk are the chunk's
// ranges, and its amax and quantize jobs take them instead of searching
// again (kept up to chunk_bytes in all, each freed by its quantize job).
// Memory is about threads * 1.5 * chunk_bytes whatever the model size.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/quant_error.hpp"

namespace ctquant {

// What a progress update counts. Writing reads every input tensor once
// (kWrite). Before it, modules whose MSE observer's patience can stop the
// search early are searched for their cutoff (kMseCutoff), and modules whose
// family needs max |w| first (NVFP4 global scales, per-tensor FP8 scales)
// are read for it (kAmax); --observer auto measures every module with both
// observers before anything is written (kChooseObserver,
// observer_choice.hpp); --target-bits measures every module with each
// scheme it may get (kChooseBits, bit_choice.hpp). Each phase reports its
// own totals, from zero.
enum class ProgressPhase { kWrite, kMseCutoff, kAmax, kChooseObserver, kChooseBits };

struct Progress {
  std::uint64_t bytes_done = 0;   // input tensor bytes the phase consumed so far
  std::uint64_t bytes_total = 0;  // input tensor bytes the phase reads in all
  // kWrite: output tensors written (each copied tensor, each module's
  // weight); the other phases: modules read.
  std::uint64_t tensors_done = 0;
  std::uint64_t tensors_total = 0;
  ProgressPhase phase = ProgressPhase::kWrite;
};

struct ExecuteOptions {
  // Worker threads. With 1 the jobs run on the calling thread and no thread
  // is created.
  unsigned threads = 1;
  // Bytes of weight rows per quantization or dequantization job, as loaded
  // (BF16 for an FP8 weight); at least one row.
  std::uint64_t chunk_bytes = 4u << 20;
  // BF16 bytes of an FP8 chunk dequantized at a time before its quantization
  // (a band: a multiple of the family's row alignment, at least one); small
  // enough to stay in the core's cache. Output bytes do not depend on it.
  std::uint64_t fp8_band_bytes = 256u << 10;
  // Called from the calling thread about every progress_interval_ms while
  // workers run (with one thread: between jobs, at most that often), and
  // once at the end. May be empty.
  std::function<void(const Progress&)> on_progress;
  unsigned progress_interval_ms = 200;
  // When it becomes true the run stops and throws Error{kInterrupted}.
  const std::atomic<bool>* cancel = nullptr;
  bool fsync = true;  // flush every file and the directory before returning
  // Let amax and quantize jobs take the ranges the MSE cutoff pre-pass
  // chose for their chunk when the search runs to the last candidate (the
  // same ranges). Off: every job searches again. The bytes are the same
  // either way.
  bool reuse_searched_ranges = true;
  // The output files to write, by name (shards, the index, config.json,
  // copied files); unset: every file of the plan. A part of a run split
  // across processes writes its own files only (parts.hpp).
  std::optional<std::set<std::string>> files;
  // Called after each write into out_dir returns, with the file, the byte
  // range [offset, offset + length) now in it and, when they were written
  // from memory, those bytes (valid during the call only; empty for ranges
  // copied with copy_file_range), by the thread that wrote them: the calling
  // thread or a worker. Calls come from several workers at once (no write
  // is waiting on a call but the one it reports: the next write is made
  // meanwhile). Every byte of every output file is reported once. May be
  // empty. An exception it throws fails the run as a write error would.
  // Lets a caller hash the files while they are written, from the core's
  // cache (exec/manifest.hpp, WrittenFilesHasher).
  std::function<void(const std::filesystem::path& file, std::uint64_t offset,
                     std::uint64_t length, std::span<const std::byte> bytes)>
      on_written;
};

// The weight error of one quantized module (quant_error.hpp), computed
// chunk by chunk right after its kernel: the same figures for every thread
// count and chunk size.
struct ModuleError {
  std::size_t module = 0;  // index into QuantizePlan::modules
  QuantError error;
};

// Where the time of execute_plan() went, for logs and benchmarks.
struct ExecuteStats {
  double seconds_stream = 0;        // jobs: reading, quantizing, writing (page cache)
  double seconds_flush = 0;         // fsync of every file and the directory (0 without fsync)
  std::uint64_t bytes_read = 0;     // input tensor bytes
  std::uint64_t bytes_written = 0;  // output shard bytes
  // CPU seconds of all threads by phase (thread CPU clocks, so time spent
  // runnable but not running on a busy machine is not counted), and the
  // wall seconds workers spent blocked, waiting for the write token or for
  // their output buffers to be written. An FP8 chunk's read is `read`, its
  // dequantization `decode` (a 16-bit chunk written as such: all `decode`).
  struct Cpu {
    double read = 0;        // input rows read from the page cache
    double decode = 0;      // FP8 codes dequantized to BF16
    double amax = 0;        // max |w| of the pre-pass (its reads are `read`)
    double quantize = 0;    // the families' kernels
    double error = 0;       // the weight error of each module (module_errors)
    double write = 0;       // pwrite and copy_file_range of the output
    double on_written = 0;  // ExecuteOptions::on_written (the manifest's hashing)
    double waiting = 0;     // wall seconds, summed over workers
  } cpu;
  // What the data made of a tensor-wide scale, one line per module or fused
  // set written ("module 'x': ..." or "modules 'a', 'b': ..."; the family's
  // tensor_amax_warning): the output is what the reference writes, but
  // loses most of the weights' precision.
  std::vector<std::string> warnings;
  // The weight error of every module quantized into the files written, in
  // plan order.
  std::vector<ModuleError> module_errors;
  // Rows of weights an MSE observer searched, by pass (an FP8 chunk's
  // bands count once each), and the rows whose amax or quantize job took
  // the ranges the cutoff pre-pass chose instead of searching again.
  struct MseRows {
    std::uint64_t cutoff = 0;    // the cutoff pre-pass
    std::uint64_t amax = 0;      // the amax pre-pass (NVFP4 global scales)
    std::uint64_t quantize = 0;  // the quantize jobs
    std::uint64_t reused_amax = 0;
    std::uint64_t reused_quantize = 0;
    // Bytes of ranges the cutoff pre-pass kept for the later passes (at
    // most chunk_bytes).
    std::uint64_t kept_bytes = 0;
  } mse_rows;
};

// Writes every file of the plan (or the ones options.files names) into
// out_dir, an existing directory that does not hold them: the shards, the
// index, config.json and the copied files. Throws
// Error{kBadInput} for a non-finite weight, or an FP8 weight whose
// dequantized value is not finite (naming shard, tensor, row and column), Error{kNoSpace}/Error{kIo} for write failures, Error{kInterrupted}
// on cancel. On error, files already written to out_dir are left for the
// caller to remove.
ExecuteStats execute_plan(const Checkpoint& checkpoint, const QuantizePlan& plan,
                          const std::filesystem::path& out_dir, const ExecuteOptions& options);

}  // namespace ctquant
