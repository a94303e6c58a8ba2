#include "ctquant/exec/executor.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/config.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/source/fp8.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/pack.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kCopyJobBytes = 64u << 20;
// When the output is to be flushed at the end, its dirty pages are sent to
// the device after every this many bytes written.
constexpr std::uint64_t kWritebackBytes = 16u << 20;
// How far ahead of the workers, and how often, the input is read into the
// page cache. Workers read one file at interleaved offsets, which the
// kernel's own read-ahead does not recognise as sequential.
constexpr std::uint64_t kReadAheadBytes = 128u << 20;
constexpr std::chrono::milliseconds kReadAheadInterval{20};
// Copied tensors are written in slices of this size, so that quantized
// chunks, which are written first, do not wait long behind them.
constexpr std::uint64_t kCopySliceBytes = 8u << 20;

// The output tensors of one quantized module.
struct QuantizedModule {
  std::size_t shard = 0;  // output shard == input shard
  std::size_t decision = 0;
  const PlannedTensor* packed = nullptr;
  const PlannedTensor* scale = nullptr;
  const PlannedTensor* zero_point = nullptr;
};

struct Job {
  enum class Kind { kCopy, kQuantize, kDequantize } kind = Kind::kCopy;
  std::size_t shard = 0;
  const PlannedTensor* tensor = nullptr;  // kCopy, kDequantize: the output tensor
  std::size_t module = 0;                 // kQuantize: index into modules
  std::uint64_t begin = 0;                // kCopy: byte offset in the tensor; otherwise first row
  std::uint64_t end = 0;                  // kCopy: end byte; otherwise end row
  std::uint64_t input_bytes = 0;
  bool last_of_tensor = false;
};

// Rows per zero-point word boundary: row chunks of asymmetric schemes start at
// multiples of this so each chunk owns whole zero-point words.
std::uint64_t row_alignment(const QuantScheme& scheme) {
  return scheme.symmetric ? 1 : 32 / std::gcd(32, scheme.num_bits);
}

// The dtype a weight's rows have once loaded: BF16 for an FP8 weight (section 6).
DType loaded_dtype(const TensorDecision& d, const TensorEntry& w) {
  return d.fp8 ? DType::kBF16 : w.dtype;
}

// Bytes per row of a weight once loaded into a job's buffer. An FP8 chunk is
// read into the second half of a buffer of BF16 size and dequantized in place.
std::uint64_t loaded_row_bytes(const TensorDecision& d, const TensorEntry& w) {
  return w.shape[1] * static_cast<std::uint64_t>(dtype_bits(loaded_dtype(d, w)) / 8);
}

class Executor {
 public:
  Executor(const Checkpoint& checkpoint, const QuantizePlan& plan, const fs::path& out_dir,
           const ExecuteOptions& options)
      : ckpt_(checkpoint), plan_(plan), out_dir_(out_dir), options_(options) {}

  ExecuteStats run() {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    build_jobs();
    check_cancel();
    open_outputs();
    run_jobs();
    check_cancel();
    write_json_files();
    copy_other_files();
    const auto streamed = Clock::now();
    finish();
    check_cancel();
    ExecuteStats stats;
    stats.seconds_stream = std::chrono::duration<double>(streamed - start).count();
    stats.seconds_flush = std::chrono::duration<double>(Clock::now() - streamed).count();
    stats.bytes_read = bytes_total_;
    for (const ShardPlan& shard : plan_.shards) {
      if (selected(shard.file_name)) stats.bytes_written += shard.file_size;
    }
    return stats;
  }

 private:
  // Whether this run writes the output file `name` (ExecuteOptions::files).
  bool selected(const std::string& name) const {
    return !options_.files || options_.files->count(name) > 0;
  }

  const OutputFile* shard_file(std::size_t shard) const {
    return outputs_[shard_output_[shard]].get();
  }

  void build_jobs() {
    const QuantScheme& scheme = plan_.options.scheme;
    for (std::size_t s = 0; s < plan_.shards.size(); ++s) {
      const ShardPlan& shard = plan_.shards[s];
      if (!selected(shard.file_name)) continue;
      for (const PlannedTensor& t : shard.tensors) {
        switch (t.role) {
          case OutputRole::kCopy: {
            std::uint64_t pos = 0;
            do {
              const std::uint64_t end = std::min(t.byte_size, pos + kCopyJobBytes);
              jobs_.push_back(
                  Job{Job::Kind::kCopy, s, &t, 0, pos, end, end - pos, end == t.byte_size});
              pos = end;
            } while (pos < t.byte_size);
            ++tensors_total_;
            break;
          }
          case OutputRole::kDequantized: {
            const TensorDecision& d = plan_.decisions[t.decision];
            const TensorEntry& w = ckpt_.entry(d.source);
            if (w.byte_size() > 0) {
              const std::uint64_t row_bytes = w.byte_size() / w.shape[0];
              const std::uint64_t buffer_row_bytes = loaded_row_bytes(d, w);
              const std::uint64_t rows_per_job =
                  std::max<std::uint64_t>(1, options_.chunk_bytes / buffer_row_bytes);
              for (std::uint64_t r = 0; r < w.shape[0]; r += rows_per_job) {
                const std::uint64_t end = std::min(w.shape[0], r + rows_per_job);
                jobs_.push_back(Job{Job::Kind::kDequantize, s, &t, 0, r, end, (end - r) * row_bytes,
                                    end == w.shape[0]});
                max_in_bytes_ = std::max(max_in_bytes_, (end - r) * buffer_row_bytes);
                note_fp8_scale_rows(d, r, end);
              }
            }
            ++tensors_total_;
            break;
          }
          case OutputRole::kPacked: {
            QuantizedModule m{s, t.decision, &t, nullptr, nullptr};
            for (const PlannedTensor& o : shard.tensors) {
              if (o.decision != t.decision) continue;
              if (o.role == OutputRole::kScale) m.scale = &o;
              if (o.role == OutputRole::kZeroPoint) m.zero_point = &o;
            }
            modules_.push_back(m);
            const TensorDecision& d = plan_.decisions[t.decision];
            const TensorEntry& w = ckpt_.entry(d.source);
            const std::uint64_t row_bytes = w.byte_size() / w.shape[0];
            // Jobs are sized by the buffer they fill: twice the input for FP8.
            const std::uint64_t buffer_row_bytes = loaded_row_bytes(d, w);
            const std::uint64_t align = row_alignment(scheme);
            std::uint64_t rows_per_job =
                std::max<std::uint64_t>(1, options_.chunk_bytes / buffer_row_bytes);
            rows_per_job = std::max(align, rows_per_job / align * align);
            for (std::uint64_t r = 0; r < w.shape[0]; r += rows_per_job) {
              const std::uint64_t end = std::min(w.shape[0], r + rows_per_job);
              jobs_.push_back(Job{Job::Kind::kQuantize, s, nullptr, modules_.size() - 1, r, end,
                                  (end - r) * row_bytes, end == w.shape[0]});
              const std::uint64_t rows = end - r;
              const std::uint64_t n_groups = w.shape[1] / scheme.effective_group_size(w.shape[1]);
              max_in_bytes_ = std::max(max_in_bytes_, rows * buffer_row_bytes);
              note_fp8_scale_rows(d, r, end);
              max_packed_words_ = std::max(
                  max_packed_words_, rows * packed_words_per_row(w.shape[1], scheme.num_bits));
              max_scale_values_ = std::max(max_scale_values_, rows * n_groups);
              max_zero_point_words_ = std::max(
                  max_zero_point_words_, packed_words_per_row(rows, scheme.num_bits) * n_groups);
            }
            ++tensors_total_;
            break;
          }
          default:
            break;  // scale and zero point are written by the packed jobs; shape below
        }
      }
    }
    for (const Job& j : jobs_) bytes_total_ += j.input_bytes;
  }

  // Grows the per-thread FP8 scale buffer to hold the scale grid rows that
  // weight rows [row_begin, row_end) use.
  void note_fp8_scale_rows(const TensorDecision& d, std::uint64_t row_begin,
                           std::uint64_t row_end) {
    if (!d.fp8) return;
    const Fp8ScaleLayout& layout = d.fp8->layout;
    const std::uint64_t grid_rows = layout.grid_row_end(row_end) - layout.grid_row_begin(row_begin);
    max_fp8_scale_bytes_ =
        std::max(max_fp8_scale_bytes_, grid_rows * layout.scale_bytes_per_grid_row());
  }

  void open_outputs() {
    shard_output_.assign(plan_.shards.size(), 0);
    for (std::size_t s = 0; s < plan_.shards.size(); ++s) {
      const ShardPlan& shard = plan_.shards[s];
      if (!selected(shard.file_name)) continue;
      shard_output_[s] = outputs_.size();
      auto file = std::make_unique<OutputFile>(out_dir_ / shard.file_name, output_fds_);
      file->reserve(shard.file_size);
      file->write_at(0, std::as_bytes(std::span(shard.header)));
      // weight_shape tensors are 16 bytes each: write them now.
      for (const PlannedTensor& t : shard.tensors) {
        if (t.role != OutputRole::kShape) continue;
        const TensorEntry& w = ckpt_.entry(plan_.decisions[t.decision].source);
        const std::int64_t shape[2] = {static_cast<std::int64_t>(w.shape[0]),
                                       static_cast<std::int64_t>(w.shape[1])};
        file->write_at(shard.data_start + t.offset, std::as_bytes(std::span(shape)));
      }
      outputs_.push_back(std::move(file));
    }
  }

  // One set of a quantize job's outputs (packed words, scales, packed zero
  // points), queued for writing and reused once it is written.
  struct OutputBuffers {
    std::vector<std::uint32_t> packed;
    std::vector<std::byte> scale;
    std::vector<std::uint32_t> zero_point_packed;
    bool in_flight = false;  // guarded by write_mutex_
  };

  // Per-worker buffers, sized once for the largest job. Two output sets: the
  // worker quantizes its next chunk while its previous one waits to be written.
  struct Buffers {
    std::vector<std::byte> input;      // a chunk of weight rows, BF16 once an FP8 chunk is loaded
    std::vector<std::byte> fp8_scale;  // the scale grid rows an FP8 chunk uses
    std::vector<std::int8_t> zero_point;
    std::array<OutputBuffers, 2> out;
    std::size_t next_out = 0;
    // Marks `input` as in flight while a dequantize job's BF16 rows are
    // written straight from it (only its in_flight flag is used).
    OutputBuffers input_write;
  };

  // A queued write: the byte ranges of a quantize job's output set, or
  // (buffers == nullptr) a copy of `length` input bytes.
  struct WriteRequest {
    struct Piece {
      std::uint64_t offset = 0;
      std::span<const std::byte> bytes;
    };
    std::size_t job = 0;
    const OutputFile* file = nullptr;
    OutputBuffers* buffers = nullptr;
    std::array<Piece, 3> pieces{};
    std::size_t n_pieces = 0;
    FdLease in_file;  // a copy's input, kept open until the copy is written
    std::uint64_t in_offset = 0;
    std::uint64_t out_offset = 0;
    std::uint64_t length = 0;
  };

  // Output writes go through one queue and are made by one thread at a
  // time, whichever worker holds the write token: a buffered write holds the
  // file's inode lock while it copies, so two workers writing one shard
  // wait on each other in the kernel, and longer still when the holder is
  // preempted. A worker queues its chunk and writes the queue if the write
  // token is free; if not, it goes back to quantizing and the holder writes its chunk.

  // Queues a write, then writes the queue if no other thread is writing.
  void submit(WriteRequest request) {
    std::unique_lock lock(write_mutex_);
    if (request.buffers != nullptr) {
      request.buffers->in_flight = true;
      buffer_writes_.push_back(request);
    } else {
      copies_.push_back(request);
    }
    write_queued(lock);
  }

  // With write_mutex_ held: if no other thread is writing, writes until the
  // queues are empty.
  void write_queued(std::unique_lock<std::mutex>& lock) {
    if (writing_) return;
    writing_ = true;
    while (write_one(lock)) {
    }
    writing_ = false;
    written_cv_.notify_all();
  }

  // With write_mutex_ held: performs one queued write (quantized chunks
  // first, as they hold a worker's buffers; then a slice of a copy),
  // unlocking around the I/O. After a failure it drops the write instead,
  // releasing the buffers. Returns false when the queues are empty.
  bool write_one(std::unique_lock<std::mutex>& lock) {
    if (!buffer_writes_.empty()) {
      const WriteRequest request = buffer_writes_.front();
      buffer_writes_.pop_front();
      lock.unlock();
      if (!failed_.load()) {
        try {
          for (std::size_t p = 0; p < request.n_pieces; ++p) {
            request.file->write_at(request.pieces[p].offset, request.pieces[p].bytes);
            wrote(*request.file, request.pieces[p].bytes.size());
          }
          job_written(request.job);
        } catch (...) {
          record_error(request.job, std::current_exception());
        }
      }
      lock.lock();
      request.buffers->in_flight = false;
      written_cv_.notify_all();
      return true;
    }
    if (!copies_.empty()) {
      WriteRequest& front = copies_.front();
      const WriteRequest slice = front;
      const std::uint64_t n = std::min(front.length, kCopySliceBytes);
      front.in_offset += n;
      front.out_offset += n;
      front.length -= n;
      const bool last = front.length == 0;
      if (last) copies_.pop_front();
      lock.unlock();
      if (!failed_.load()) {
        try {
          slice.file->copy_from(slice.in_file->get(), slice.in_offset, slice.out_offset, n);
          wrote(*slice.file, n);
          if (last) job_written(slice.job);
        } catch (...) {
          record_error(slice.job, std::current_exception());
        }
      }
      lock.lock();
      return true;
    }
    return false;
  }

  // Called by the write-token holder after each write: when the output is to be
  // flushed, starts the write-back of the file every kWritebackBytes, so the
  // device writes while the workers compute and the final fsync waits only
  // for the tail.
  void wrote(const OutputFile& file, std::uint64_t bytes) {
    if (!options_.fsync) return;
    unflushed_bytes_ += bytes;
    if (unflushed_bytes_ < kWritebackBytes) return;
    file.start_writeback(0, 0);
    unflushed_bytes_ = 0;
  }

  // Blocks until `out` is written (or dropped after a failure), so that it
  // can be refilled or freed; writes the queue itself when the write token is free.
  void wait_written(const OutputBuffers& out) {
    std::unique_lock lock(write_mutex_);
    while (out.in_flight) {
      if (writing_) {
        written_cv_.wait(lock);
      } else {
        write_queued(lock);
      }
    }
  }

  // Blocks until every queued write is done, writing them when the write token is free.
  void drain() {
    std::unique_lock lock(write_mutex_);
    for (;;) {
      write_queued(lock);
      if (!writing_ && buffer_writes_.empty() && copies_.empty()) return;
      written_cv_.wait(lock);
    }
  }

  // Loads weight rows [row_begin, row_end) into buf.input: the stored bytes
  // of a BF16/F16/F32 weight, or the BF16 values of an FP8 weight, dequantized
  // in place (section 6). Returns the dtype of the loaded rows. Throws
  // Error{kBadInput} naming file, tensor, row and column for an FP8 value that
  // is not finite once dequantized.
  DType load_rows(const TensorDecision& d, std::uint64_t row_begin, std::uint64_t row_end,
                  Buffers& buf) const {
    const TensorEntry& w = ckpt_.entry(d.source);
    const SafetensorsFile& in = ckpt_.shards[d.source.shard];
    const std::uint64_t n_rows = row_end - row_begin;
    const std::uint64_t n_cols = w.shape[1];
    const std::uint64_t row_bytes = w.byte_size() / w.shape[0];
    if (!d.fp8) {
      in.read(w.begin + row_begin * row_bytes,
              std::span<std::byte>(buf.input.data(), n_rows * row_bytes));
      return w.dtype;
    }
    const Fp8ScaleLayout& layout = d.fp8->layout;
    const std::uint64_t n = n_rows * n_cols;
    in.read(w.begin + row_begin * n_cols, std::span<std::byte>(buf.input.data() + n, n));
    const TensorEntry& scale = ckpt_.entry(d.fp8->scale);
    const std::uint64_t grid_begin = layout.grid_row_begin(row_begin);
    const std::uint64_t grid_bytes =
        (layout.grid_row_end(row_end) - grid_begin) * layout.scale_bytes_per_grid_row();
    ckpt_.shards[d.fp8->scale.shard].read(
        scale.begin + grid_begin * layout.scale_bytes_per_grid_row(),
        std::span<std::byte>(buf.fp8_scale.data(), grid_bytes));
    Fp8Rows rows;
    rows.code_dtype = w.dtype;
    rows.row_begin = row_begin;
    rows.n_rows = n_rows;
    rows.n_cols = n_cols;
    rows.codes = buf.input.data() + n;
    rows.scales = buf.fp8_scale.data();
    rows.out = buf.input.data();
    if (const auto bad = dequantize_fp8_rows(layout, rows)) {
      // The codes at and after the bad element are still in place: the
      // dequantizer stopped before writing over them.
      const std::uint64_t row = row_begin + *bad / n_cols;
      const std::uint64_t col = *bad % n_cols;
      const auto code = std::to_integer<std::uint8_t>(buf.input[n + *bad]);
      const std::uint64_t grid_row = row / layout.block_rows;
      const std::uint64_t grid_col = col / layout.block_cols;
      const std::uint64_t scale_size = static_cast<std::uint64_t>(dtype_bits(layout.dtype) / 8);
      const float s = load_as_float(
          layout.dtype, buf.fp8_scale.data() +
                            ((grid_row - grid_begin) * layout.grid_cols + grid_col) * scale_size);
      const float value = load_as_float(w.dtype, &buf.input[n + *bad]);
      const std::string what =
          std::isnan(value) || std::isinf(value)
              ? fmt::format("is code 0x{:02X}, which is {} in {}", code, value, dtype_tag(w.dtype))
              : fmt::format(
                    "is code 0x{:02X} ({}) times scale {} ('{}' [{}, {}]), which is {} "
                    "in BF16",
                    code, value, s, scale.name, grid_row, grid_col,
                    bf16_to_float(dequantize_fp8_value(w.dtype, code, s)));
      throw bad_input(
          fmt::format("{}: tensor '{}': element [{}, {}] {} (a dequantized weight "
                      "must be finite; section 6 of the format spec)",
                      in.label(), w.name, row, col, what));
    }
    return DType::kBF16;
  }

  // Writes an FP8 weight's rows as BF16 (fate kDequantize). The rows are
  // written from the input buffer itself, so the job waits for its write.
  void run_dequantize_job(std::size_t job_index, const Job& job, Buffers& buf) {
    const TensorDecision& d = plan_.decisions[job.tensor->decision];
    const TensorEntry& w = ckpt_.entry(d.source);
    load_rows(d, job.begin, job.end, buf);
    const std::uint64_t row_bytes = loaded_row_bytes(d, w);
    WriteRequest request;
    request.job = job_index;
    request.file = shard_file(job.shard);
    request.buffers = &buf.input_write;
    request.pieces[request.n_pieces++] = {
        plan_.shards[job.shard].data_start + job.tensor->offset + job.begin * row_bytes,
        std::span<const std::byte>(buf.input.data(), (job.end - job.begin) * row_bytes)};
    submit(request);
    wait_written(buf.input_write);
  }

  void run_quantize_job(std::size_t job_index, const Job& job, Buffers& buf) {
    const QuantScheme& scheme = plan_.options.scheme;
    const QuantizedModule& m = modules_[job.module];
    const TensorDecision& d = plan_.decisions[m.decision];
    const TensorEntry& w = ckpt_.entry(d.source);
    const SafetensorsFile& in = ckpt_.shards[d.source.shard];
    const std::uint64_t n_rows = job.end - job.begin;
    const std::uint64_t n_cols = w.shape[1];
    const DType dtype = load_rows(d, job.begin, job.end, buf);
    const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
    const std::uint64_t n_groups = n_cols / scheme.effective_group_size(n_cols);
    const std::uint64_t words = packed_words_per_row(n_cols, scheme.num_bits);

    OutputBuffers& out = buf.out[buf.next_out];
    buf.next_out = (buf.next_out + 1) % buf.out.size();
    wait_written(out);
    KernelBlock block;
    block.dtype = dtype;
    block.n_rows = n_rows;
    block.n_cols = n_cols;
    block.weight = buf.input.data();
    block.packed = out.packed.data();
    block.scale = out.scale.data();
    block.zero_point = buf.zero_point.data();
    if (const auto bad = quantize_block(scheme, block)) {
      const std::uint64_t row = job.begin + *bad / n_cols;
      const std::uint64_t col = *bad % n_cols;
      const float value = load_as_float(dtype, buf.input.data() + *bad * esize);
      throw bad_input(
          fmt::format("{}: tensor '{}': element [{}, {}] is {} (a weight to be "
                      "quantized must be finite; section 3 of the format spec)",
                      in.label(), w.name, row, col, value));
    }
    const std::uint64_t base = plan_.shards[m.shard].data_start;
    WriteRequest request;
    request.job = job_index;
    request.file = shard_file(m.shard);
    request.buffers = &out;
    request.pieces[request.n_pieces++] = {
        base + m.packed->offset + job.begin * words * 4,
        std::as_bytes(std::span(out.packed.data(), n_rows * words))};
    request.pieces[request.n_pieces++] = {
        base + m.scale->offset + job.begin * n_groups * esize,
        std::span<const std::byte>(out.scale.data(), n_rows * n_groups * esize)};
    if (m.zero_point != nullptr) {
      const std::uint64_t zp_rows = packed_words_per_row(n_rows, scheme.num_bits);
      const std::span<std::uint32_t> packed(out.zero_point_packed.data(), zp_rows * n_groups);
      pack_zero_points(std::span(buf.zero_point.data(), n_rows * n_groups), n_rows, n_groups,
                       scheme.num_bits, packed);
      const std::uint64_t first_word_row = job.begin * scheme.num_bits / 32;
      request.pieces[request.n_pieces++] = {
          base + m.zero_point->offset + first_word_row * n_groups * 4,
          std::as_bytes(std::span<const std::uint32_t>(packed))};
    }
    submit(request);
  }

  void run_copy_job(std::size_t job_index, const Job& job) {
    const TensorDecision& d = plan_.decisions[job.tensor->decision];
    const TensorEntry& src = ckpt_.entry(d.source);
    const SafetensorsFile& in = ckpt_.shards[d.source.shard];
    WriteRequest request;
    request.job = job_index;
    request.file = shard_file(job.shard);
    request.in_file = in.descriptor();
    request.in_offset = in.header().data_start + src.begin + job.begin;
    request.out_offset = plan_.shards[job.shard].data_start + job.tensor->offset + job.begin;
    request.length = job.end - job.begin;
    submit(request);
  }

  void worker() {
    Buffers buf;
    const QuantScheme& scheme = plan_.options.scheme;
    buf.input.resize(max_in_bytes_);
    buf.fp8_scale.resize(max_fp8_scale_bytes_);
    for (OutputBuffers& out : buf.out) {
      out.packed.resize(max_packed_words_);
      out.scale.resize(max_scale_values_ * 4);  // 4 bytes: the widest scale dtype (F32)
      if (!scheme.symmetric) out.zero_point_packed.resize(max_zero_point_words_);
    }
    if (!scheme.symmetric) buf.zero_point.resize(max_scale_values_);
    // However this returns, buf must not be freed while a write uses it.
    struct ReleaseGuard {
      Executor& executor;
      Buffers& buf;
      ~ReleaseGuard() {
        for (const OutputBuffers& out : buf.out) executor.wait_written(out);
        executor.wait_written(buf.input_write);
      }
    } release_guard{*this, buf};
    for (;;) {
      if (failed_.load(std::memory_order_relaxed)) return;
      if (cancelled()) {
        record_error(jobs_.size(), std::make_exception_ptr(interrupted()));
        return;
      }
      const std::size_t i = next_job_.fetch_add(1);
      if (i >= jobs_.size()) {
        drain();
        return;
      }
      const Job& job = jobs_[i];
      try {
        switch (job.kind) {
          case Job::Kind::kCopy:
            run_copy_job(i, job);
            break;
          case Job::Kind::kQuantize:
            run_quantize_job(i, job, buf);
            break;
          case Job::Kind::kDequantize:
            run_dequantize_job(i, job, buf);
            break;
        }
      } catch (...) {
        record_error(i, std::current_exception());
        return;
      }
    }
  }

  void job_written(std::size_t job_index) {
    const Job& job = jobs_[job_index];
    bytes_done_.fetch_add(job.input_bytes);
    if (job.last_of_tensor) tensors_done_.fetch_add(1);
  }

  void record_error(std::size_t job_index, std::exception_ptr error) {
    std::lock_guard lock(error_mutex_);
    if (!first_error_ || job_index < first_error_job_) {
      first_error_ = error;
      first_error_job_ = job_index;
    }
    failed_.store(true);
  }

  Progress progress() const {
    return Progress{bytes_done_.load(), bytes_total_, tensors_done_.load(), tensors_total_};
  }

  // The input bytes a job reads: file, file offset, length.
  struct InputRange {
    const SafetensorsFile* file = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  InputRange input_range(const Job& job) const {
    if (job.kind == Job::Kind::kCopy) {
      const TensorDecision& d = plan_.decisions[job.tensor->decision];
      const SafetensorsFile& in = ckpt_.shards[d.source.shard];
      return {&in, in.header().data_start + ckpt_.entry(d.source).begin + job.begin,
              job.end - job.begin};
    }
    const TensorDecision& d =
        plan_.decisions[job.kind == Job::Kind::kQuantize ? modules_[job.module].decision
                                                         : job.tensor->decision];
    const SafetensorsFile& in = ckpt_.shards[d.source.shard];
    const TensorEntry& w = ckpt_.entry(d.source);
    const std::uint64_t row_bytes = w.byte_size() / w.shape[0];
    return {&in, in.header().data_start + w.begin + job.begin * row_bytes, job.input_bytes};
  }

  // Asks the kernel to read the input of the jobs after the workers' current
  // ones, up to kReadAheadBytes ahead (posix_fadvise WILLNEED starts the
  // reads without waiting for them). Advisory; a no-op for cached data.
  void read_ahead() {
    const std::size_t first = std::min(next_job_.load(), jobs_.size());
    read_ahead_job_ = std::max(read_ahead_job_, first);
    std::uint64_t ahead = 0;
    for (std::size_t i = first; i < read_ahead_job_; ++i) ahead += jobs_[i].input_bytes;
    for (; read_ahead_job_ < jobs_.size() && ahead < kReadAheadBytes; ++read_ahead_job_) {
      const InputRange r = input_range(jobs_[read_ahead_job_]);
      try {
        ::posix_fadvise(r.file->descriptor()->get(), static_cast<off_t>(r.offset),
                        static_cast<off_t>(r.length), POSIX_FADV_WILLNEED);
      } catch (const Error&) {
        // Advice only: the job's own read reports a file that cannot be reopened.
      }
      ahead += r.length;
    }
  }

  void run_jobs() {
    read_ahead();
    const unsigned n_threads =
        std::max(1u, std::min<unsigned>(options_.threads, static_cast<unsigned>(jobs_.size())));
    std::vector<std::thread> threads;
    std::mutex done_mutex;
    std::condition_variable done_cv;
    unsigned running = n_threads;
    for (unsigned t = 0; t < n_threads; ++t) {
      try {
        threads.emplace_back([&] {
          worker();
          std::lock_guard lock(done_mutex);
          --running;
          done_cv.notify_all();
        });
      } catch (...) {
        // No thread for this slot: stop the others, wait for them, report.
        record_error(0, std::current_exception());
        std::lock_guard lock(done_mutex);
        running -= n_threads - t;
        break;
      }
    }
    {
      // While the workers run, this thread reports progress and reads the
      // input ahead of them.
      using Clock = std::chrono::steady_clock;
      const auto progress_interval = std::chrono::milliseconds(options_.progress_interval_ms);
      auto next_progress = Clock::now() + progress_interval;
      std::unique_lock lock(done_mutex);
      while (running > 0) {
        done_cv.wait_for(lock, std::min(kReadAheadInterval, progress_interval));
        if (running == 0) break;
        lock.unlock();
        read_ahead();
        if (options_.on_progress && Clock::now() >= next_progress) {
          options_.on_progress(progress());
          next_progress = Clock::now() + progress_interval;
        }
        lock.lock();
      }
    }
    for (auto& t : threads) t.join();
    if (first_error_) std::rethrow_exception(first_error_);
    check_cancel();
    if (options_.on_progress) options_.on_progress(progress());
  }

  bool cancelled() const { return options_.cancel != nullptr && options_.cancel->load(); }
  static Error interrupted() {
    return Error(ErrorKind::kInterrupted, "interrupted by a signal before OUTPUT was complete");
  }
  // Between phases and files: a signal stops the run before anything more is
  // written, however late it arrives before the rename.
  void check_cancel() const {
    if (cancelled()) throw interrupted();
  }

  void write_text_file(const std::string& name, const std::string& text) {
    check_cancel();
    auto file = std::make_unique<OutputFile>(out_dir_ / name, output_fds_);
    file->write_at(0, std::as_bytes(std::span(text)));
    outputs_.push_back(std::move(file));  // flushed after the shards
  }

  void write_json_files() {
    if (plan_.index && selected(kIndexFileName)) {
      write_text_file(kIndexFileName, dump_json(*plan_.index));
    }
    if (selected(kConfigFileName)) write_text_file(kConfigFileName, dump_json(plan_.config));
  }

  // Files of the input directory other than shards, index and config.json,
  // copied byte for byte. open_checkpoint() listed only regular files inside
  // INPUT; open_input_file() checks again that what is opened is one.
  void copy_other_files() {
    for (const std::string& name : plan_.copied_files) {
      if (!selected(name)) continue;
      check_cancel();
      std::uint64_t size = 0;
      const detail::UniqueFd in = detail::open_input_file(ckpt_.root / name, name, size);
      auto file = std::make_unique<OutputFile>(out_dir_ / name, output_fds_);
      file->reserve(size);
      for (std::uint64_t pos = 0; pos < size; pos += kCopyJobBytes) {
        check_cancel();
        file->copy_from(in.get(), pos, pos, std::min(kCopyJobBytes, size - pos));
      }
      outputs_.push_back(std::move(file));  // flushed after the shards
    }
  }

  void finish() {
    for (auto& file : outputs_) {
      check_cancel();
      if (options_.fsync) file->sync_and_close();
    }
    outputs_.clear();
    if (options_.fsync) {
      const int dir_fd = ::open(out_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dir_fd < 0) {
        throw io_error(
            fmt::format("{}: cannot open to flush: {}", out_dir_.string(), std::strerror(errno)));
      }
      const int rc = ::fsync(dir_fd);
      const int error = errno;
      ::close(dir_fd);
      // Some filesystems cannot fsync a directory (EINVAL); nothing to flush then.
      if (rc != 0 && error != EINVAL) throw_write_error(out_dir_.string(), error);
    }
  }

  const Checkpoint& ckpt_;
  const QuantizePlan& plan_;
  const fs::path out_dir_;
  const ExecuteOptions& options_;

  std::vector<QuantizedModule> modules_;
  std::vector<Job> jobs_;
  // The output files' descriptors: a bounded set, so that a checkpoint of
  // thousands of shards is written within the open-file limit.
  std::shared_ptr<FdPool> output_fds_ = std::make_shared<FdPool>(FdPool::default_capacity());
  std::vector<std::unique_ptr<OutputFile>> outputs_;
  std::vector<std::size_t> shard_output_;  // plan shard -> index into outputs_ (selected shards)
  // Largest per-job buffer sizes, so each thread allocates once.
  std::uint64_t max_in_bytes_ = 0;
  std::uint64_t max_packed_words_ = 0;
  std::uint64_t max_scale_values_ = 0;
  std::uint64_t max_zero_point_words_ = 0;
  std::uint64_t max_fp8_scale_bytes_ = 0;
  std::uint64_t bytes_total_ = 0;
  std::uint64_t tensors_total_ = 0;

  std::atomic<std::size_t> next_job_{0};
  // The write queue (see submit()).
  std::mutex write_mutex_;
  std::condition_variable written_cv_;  // a write finished, or the write token was released
  std::deque<WriteRequest> buffer_writes_;
  std::deque<WriteRequest> copies_;
  bool writing_ = false;               // a thread holds the write token
  std::uint64_t unflushed_bytes_ = 0;  // written since the last write-back (token holder only)
  std::size_t read_ahead_job_ = 0;     // jobs before this one were read ahead (calling thread only)
  std::atomic<std::uint64_t> bytes_done_{0};
  std::atomic<std::uint64_t> tensors_done_{0};
  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;
  std::exception_ptr first_error_;
  std::size_t first_error_job_ = 0;
};

}  // namespace

ExecuteStats execute_plan(const Checkpoint& checkpoint, const QuantizePlan& plan,
                          const fs::path& out_dir, const ExecuteOptions& options) {
  return Executor(checkpoint, plan, out_dir, options).run();
}

}  // namespace ctquant
