#include "ctquant/exec/executor.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/config.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "exec/jobs.hpp"
#include "exec/phase_times.hpp"
#include "exec/value_checks.hpp"
#include "exec/write_queue.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;

namespace {

using detail::Buffers;
using detail::Job;
using detail::ModuleRun;
using detail::OutputSet;
using detail::Phase;

constexpr std::uint64_t kCopyJobBytes = 64u << 20;
// How far ahead of the workers, and how often, the input is read into the
// page cache. Workers read one file at interleaved offsets, which the
// kernel's own read-ahead does not recognise as sequential.
constexpr std::uint64_t kReadAheadBytes = 128u << 20;
constexpr std::chrono::milliseconds kReadAheadInterval{20};

class Executor {
 public:
  Executor(const Checkpoint& checkpoint, const QuantizePlan& plan, const fs::path& out_dir,
           const ExecuteOptions& options)
      : ckpt_(checkpoint),
        plan_(plan),
        out_dir_(out_dir),
        options_(options),
        queue_(
            options.fsync, [this](std::size_t job) { job_written(job); },
            [this](std::size_t job, std::exception_ptr e) { record_error(job, e); }, failed_,
            [this](const OutputFile& file, std::uint64_t offset, std::uint64_t length,
                   std::span<const std::byte> bytes) {
              report_written(file, offset, length, bytes);
            },
            times_) {}

  ExecuteStats run() {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    build_jobs();
    check_cancel();
    open_outputs();
    if (!observe_jobs_.empty()) {
      run_jobs(observe_jobs_, ProgressPhase::kMseCutoff);
      for (const auto& m : modules_) {
        if (m->observer.mse && !m->cutoff_settled) m->cutoff = mse_cutoff(m->observer, m->improved);
        if (!searches_every_candidate(*m)) m->searched_ranges.clear();
      }
    }
    if (!amax_jobs_.empty()) {
      run_jobs(amax_jobs_, ProgressPhase::kAmax);
      reduce_amax_sets();
      collect_amax_warnings();
      // Modules of another part's files: no quantize job takes their ranges.
      for (const auto& m : modules_) {
        if (!shard_selected(m->shard)) m->searched_ranges.clear();
      }
    }
    write_whole_tensors();
    run_jobs(jobs_, ProgressPhase::kWrite);
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
    stats.warnings = warnings_;
    stats.cpu.read = times_.seconds(Phase::kRead);
    stats.cpu.decode = times_.seconds(Phase::kDecode);
    stats.cpu.amax = times_.seconds(Phase::kAmax);
    stats.cpu.quantize = times_.seconds(Phase::kQuantize);
    stats.cpu.error = times_.seconds(Phase::kError);
    stats.cpu.write = times_.seconds(Phase::kWrite);
    stats.cpu.on_written = times_.seconds(Phase::kReport);
    stats.cpu.waiting = times_.waiting_seconds();
    stats.module_errors = module_errors();
    stats.mse_rows.cutoff = mse_rows_.cutoff.load();
    stats.mse_rows.amax = mse_rows_.amax.load();
    stats.mse_rows.quantize = mse_rows_.quantize.load();
    stats.mse_rows.reused_amax = mse_rows_.reused_amax.load();
    stats.mse_rows.reused_quantize = mse_rows_.reused_quantize.load();
    stats.mse_rows.kept_bytes = searched_bytes_.load();
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
  bool shard_selected(std::size_t shard) const { return selected(plan_.shards[shard].file_name); }

  // ---- the job list ----

  // Rows per job of a module: about chunk_bytes of loaded rows, a multiple
  // of the family's row alignment.
  std::uint64_t rows_per_job(const ModuleRun& m) const {
    const std::uint64_t align =
        m.family != nullptr ? std::max<std::uint64_t>(1, m.family->row_alignment(*m.args)) : 1;
    const std::uint64_t row_bytes = std::max<std::uint64_t>(1, m.rows.row_bytes());
    const std::uint64_t n = std::max<std::uint64_t>(1, options_.chunk_bytes / row_bytes);
    return std::max(align, n / align * align);
  }

  // Grows the per-worker buffers for rows [r0, r1) of module m.
  void note_rows(const ModuleRun& m, std::uint64_t r0, std::uint64_t r1) {
    max_in_bytes_ = std::max(max_in_bytes_, (r1 - r0) * m.rows.row_bytes());
    max_job_rows_ = std::max(max_job_rows_, r1 - r0);
    max_fp8_scale_bytes_ = std::max(max_fp8_scale_bytes_, m.rows.scale_bytes(r0, r1));
    if (m.family == nullptr) return;
    if (m.rows.is_fp8()) {
      max_band_bytes_ = std::max(
          max_band_bytes_, std::min(r1 - r0, job_runner_.fp8_band_rows(m)) * m.rows.row_bytes());
    }
    for (std::size_t i = 0; i < m.row_outputs.size(); ++i) {
      const OutputTensorSpec& spec = m.specs[m.row_outputs[i]];
      max_out_bytes_[i] =
          std::max(max_out_bytes_[i], spec.bytes_before(r1) - spec.bytes_before(r0));
    }
    max_scratch_bytes_ =
        std::max(max_scratch_bytes_, m.family->scratch_bytes(*m.args, r1 - r0, m.rows.cols()));
  }

  void add_copy_jobs(std::size_t s, const PlannedTensor& t, const SafetensorsFile* in,
                     std::uint64_t in_offset, std::size_t module) {
    std::uint64_t pos = 0;
    do {
      const std::uint64_t end = std::min(t.byte_size, pos + kCopyJobBytes);
      Job j;
      j.kind = Job::Kind::kCopy;
      j.shard = s;
      j.tensor = &t;
      j.module = module;
      j.begin = pos;
      j.end = end;
      j.input_bytes = end - pos;
      j.last_of_tensor = end == t.byte_size;
      j.in_file = in;
      j.in_offset = in_offset;
      jobs_.push_back(j);
      pos = end;
    } while (pos < t.byte_size);
  }

  // An output tensor of a converted module: a renamed tensor of codes is
  // copied as bytes; any other (a float scale renamed, or made from its
  // inputs) is one job that reads its inputs whole and checks that its
  // values are finite (check_converted_values).
  void add_convert_job(std::size_t s, const PlannedTensor& t) {
    const ConvertedTensor& c = plan_.converted[t.converted].outputs[*t.output];
    const DType in_dtype = c.inputs.empty() ? c.dtype : ckpt_.entry(c.inputs[0]).dtype;
    if (c.op == kRenameOp && !is_quantizable_float(in_dtype) && !is_fp8(in_dtype)) {
      const SafetensorsFile& in = ckpt_.shards[c.inputs[0].shard];
      if (t.byte_size > 0) {
        add_copy_jobs(s, t, &in, in.header().data_start + ckpt_.entry(c.inputs[0]).begin, 0);
      }
      return;
    }
    Job j;
    j.kind = Job::Kind::kConvert;
    j.shard = s;
    j.tensor = &t;
    j.module = t.converted;
    j.last_of_tensor = true;
    for (const TensorLocation& at : c.inputs) j.input_bytes += ckpt_.entry(at).byte_size();
    if (!c.inputs.empty()) {
      const SafetensorsFile& in = ckpt_.shards[c.inputs[0].shard];
      j.in_file = &in;
      j.in_offset = in.header().data_start + ckpt_.entry(c.inputs[0]).begin;
      j.end = ckpt_.entry(c.inputs[0]).byte_size();
    }
    jobs_.push_back(j);
  }

  void add_row_jobs(std::vector<Job>& jobs, Job::Kind kind, std::size_t s, const PlannedTensor* t,
                    std::size_t mi) {
    const ModuleRun& m = *modules_[mi];
    const std::uint64_t rows = m.rows.rows();
    const std::uint64_t step = rows_per_job(m);
    const std::uint64_t stored_row_bytes = m.rows.stored_range(0, 1).length;
    for (std::uint64_t r = 0; r < rows; r += step) {
      const std::uint64_t end = std::min(rows, r + step);
      Job j;
      j.kind = kind;
      j.shard = s;
      j.tensor = t;
      j.module = mi;
      j.begin = r;
      j.end = end;
      j.input_bytes = (end - r) * stored_row_bytes;
      j.last_of_tensor = end == rows;
      jobs.push_back(j);
      note_rows(m, r, end);
    }
  }

  void build_jobs() {
    for (std::size_t i = 0; i < plan_.modules.size(); ++i) {
      const PlannedModule& pm = plan_.modules[i];
      auto run = std::make_unique<ModuleRun>(ckpt_, pm);
      if (pm.kind == PlannedModule::Kind::kQuantize) {
        const SchemeGroup& g = plan_.group_of(pm);
        run->family = g.family();
        run->args = &g.weights;
        run->specs = run->family->outputs(g.weights, pm.dtype, pm.source.rows, pm.source.cols);
        run->tensors.assign(run->specs.size(), nullptr);
        for (std::size_t o = 0; o < run->specs.size(); ++o) {
          if (run->specs[o].fill == OutputTensorSpec::Fill::kRows) run->row_outputs.push_back(o);
        }
        run->observer = observer_params(g.weights.observer, g.weights.observer_kwargs,
                                        "config group " + g.name + ": weights");
        if (run->observer.mse) {
          const std::uint32_t steps = run->observer.steps();
          run->cutoff = steps == 0 ? 0 : steps - 1;
          // A patience longer than the search never stops it early.
          run->cutoff_settled = run->observer.patience > static_cast<long long>(steps);
        }
      } else {
        run->tensors.assign(1, nullptr);
      }
      modules_.push_back(std::move(run));
    }
    for (std::size_t s = 0; s < plan_.shards.size(); ++s) {
      for (const PlannedTensor& t : plan_.shards[s].tensors) {
        if (t.source == PlannedTensor::Source::kModule) {
          modules_[t.module]->tensors[t.output.value_or(0)] = &t;
        }
      }
    }
    for (std::size_t s = 0; s < plan_.shards.size(); ++s) {
      if (!shard_selected(s)) continue;
      for (const PlannedTensor& t : plan_.shards[s].tensors) {
        if (t.source == PlannedTensor::Source::kCopy) {
          const TensorDecision& d = plan_.decisions[t.decision];
          const SafetensorsFile& in = ckpt_.shards[d.source.shard];
          add_copy_jobs(s, t, &in, in.header().data_start + ckpt_.entry(d.source).begin, 0);
          continue;
        }
        if (t.source == PlannedTensor::Source::kConvert) {
          add_convert_job(s, t);
          continue;
        }
        const ModuleRun& m = *modules_[t.module];
        switch (m.module->kind) {
          case PlannedModule::Kind::kSlice: {
            // A split expert projection kept in 16 bits: its rows are
            // contiguous in the stored tensor, so they are copied as bytes.
            const WeightRows::FileRange r = m.rows.stored_range(0, m.rows.rows());
            if (t.byte_size > 0) add_copy_jobs(s, t, r.file, r.offset, t.module);
            break;
          }
          case PlannedModule::Kind::kDequantize:
            if (t.byte_size > 0) add_row_jobs(jobs_, Job::Kind::kRows, s, &t, t.module);
            break;
          case PlannedModule::Kind::kQuantize:
            // One set of jobs per module, made at its first output tensor.
            if (t.output != m.row_outputs.front()) break;
            if (m.observer.mse && !m.cutoff_settled) {
              add_row_jobs(observe_jobs_, Job::Kind::kObserve, s, nullptr, t.module);
            }
            if (m.module->amax_set) {
              add_row_jobs(amax_jobs_, Job::Kind::kAmax, s, nullptr, t.module);
            }
            add_row_jobs(jobs_, Job::Kind::kQuantize, s, nullptr, t.module);
            break;
        }
      }
    }
    // A run that writes some files only still needs the max |w| of every
    // module that shares an amax with one of its modules, wherever it is.
    for (const std::vector<std::size_t>& set : plan_.amax_sets) {
      const auto in_run = [&](std::size_t mi) { return shard_selected(modules_[mi]->shard); };
      if (std::all_of(set.begin(), set.end(), in_run) ||
          std::none_of(set.begin(), set.end(), in_run)) {
        continue;
      }
      for (const std::size_t mi : set) {
        if (in_run(mi)) continue;
        if (modules_[mi]->observer.mse && !modules_[mi]->cutoff_settled) {
          add_row_jobs(observe_jobs_, Job::Kind::kObserve, modules_[mi]->shard, nullptr, mi);
        }
        add_row_jobs(amax_jobs_, Job::Kind::kAmax, modules_[mi]->shard, nullptr, mi);
      }
    }
    for (const Job& j : observe_jobs_) bytes_total_ += j.input_bytes;
    for (const Job& j : amax_jobs_) bytes_total_ += j.input_bytes;
    for (const Job& j : jobs_) bytes_total_ += j.input_bytes;
  }

  void open_outputs() {
    shard_output_.assign(plan_.shards.size(), 0);
    for (std::size_t s = 0; s < plan_.shards.size(); ++s) {
      const ShardPlan& shard = plan_.shards[s];
      if (!selected(shard.file_name)) continue;
      shard_output_[s] = outputs_.size();
      auto file = std::make_unique<OutputFile>(out_dir_ / shard.file_name, output_fds_);
      file->reserve(shard.file_size);
      const auto header = std::as_bytes(std::span(shard.header));
      file->write_at(0, header);
      report_written(*file, 0, header.size(), header);
      outputs_.push_back(std::move(file));
    }
  }

  // Every module of an amax set gets the set's largest max |w|: fused
  // partners share one global scale (schemes.md 7).
  void reduce_amax_sets() {
    for (const std::vector<std::size_t>& set : plan_.amax_sets) {
      float amax = 0.0f;
      for (const std::size_t mi : set) {
        amax = std::max(amax, std::bit_cast<float>(modules_[mi]->amax_bits.load()));
      }
      for (const std::size_t mi : set) modules_[mi]->set_amax = amax;
    }
  }

  // The weight error of every module this run quantized, in plan order.
  std::vector<ModuleError> module_errors() const {
    std::vector<ModuleError> out;
    for (std::size_t mi = 0; mi < modules_.size(); ++mi) {
      const ModuleRun& m = *modules_[mi];
      if (m.family == nullptr || !shard_selected(m.shard)) continue;
      out.push_back(ModuleError{mi, m.error.total()});
    }
    return out;
  }

  // The families' warnings on the amax of each set this run writes.
  void collect_amax_warnings() {
    for (const std::vector<std::size_t>& set : plan_.amax_sets) {
      const ModuleRun& first = *modules_[set.front()];
      if (first.family == nullptr || first.family->tensor_amax_warning == nullptr) continue;
      if (std::none_of(set.begin(), set.end(),
                       [&](std::size_t mi) { return shard_selected(modules_[mi]->shard); })) {
        continue;
      }
      const std::string why =
          first.family->tensor_amax_warning(*first.args, first.module->dtype, first.set_amax);
      if (why.empty()) continue;
      std::string names;
      for (const std::size_t mi : set) {
        names += fmt::format("{}'{}'", names.empty() ? "" : ", ", modules_[mi]->module->name);
      }
      warnings_.push_back(
          fmt::format("{} {}: {}", set.size() == 1 ? "module" : "modules", names, why));
    }
  }

  // The kWhole outputs (weight_shape, global scales), written once.
  void write_whole_tensors() {
    for (const auto& m : modules_) {
      if (m->family == nullptr || !shard_selected(m->shard)) continue;
      std::size_t whole_index = 0;
      for (std::size_t o = 0; o < m->specs.size(); ++o) {
        if (m->specs[o].fill != OutputTensorSpec::Fill::kWhole) continue;
        const std::vector<std::byte> bytes = m->family->whole_tensor(
            *m->args, m->module->dtype, m->rows.rows(), m->rows.cols(), m->set_amax, whole_index++);
        detail::check_whole_scale(
            m->subject(), m->specs[o], bytes, m->set_amax,
            m->module->amax_set && plan_.amax_sets[*m->module->amax_set].size() > 1);
        const PlannedTensor& t = *m->tensors[o];
        const std::uint64_t at = plan_.shards[m->shard].data_start + t.offset;
        const OutputFile* out = job_runner_.shard_file(m->shard);
        out->write_at(at, bytes);
        report_written(*out, at, bytes.size(), bytes);
        m->whole.push_back(bytes);
      }
    }
  }

  // Whether a module's search runs to its last candidate (mse_cutoff), so
  // that the ranges the cutoff pre-pass chose over every candidate are the
  // ones its amax and quantize jobs would choose.
  static bool searches_every_candidate(const ModuleRun& m) {
    return m.cutoff + 1 >= m.observer.steps();
  }

  // ---- workers ----

  // Runs one job on a worker's buffers (the job kinds in src/exec/jobs.cpp).
  void run_job(std::size_t i, const Job& job, Buffers& buf) {
    switch (job.kind) {
      case Job::Kind::kCopy:
        job_runner_.run_copy_job(i, job, buf);
        break;
      case Job::Kind::kAmax:
        job_runner_.run_amax_job(job, buf);
        job_written(i);
        break;
      case Job::Kind::kObserve:
        job_runner_.run_observe_job(job, buf);
        job_written(i);
        break;
      case Job::Kind::kQuantize:
        job_runner_.run_quantize_job(i, job, buf);
        break;
      case Job::Kind::kRows:
        job_runner_.run_rows_job(i, job, buf);
        break;
      case Job::Kind::kConvert:
        job_runner_.run_convert_job(i, job, buf);
        break;
    }
  }

  // Takes jobs until none is left. between_jobs, when given, is called after
  // each job (the one-thread run reports progress and reads ahead there).
  void worker(const std::function<void()>& between_jobs = {}) {
    Buffers buf;
    buf.input.resize(max_in_bytes_);
    buf.fp8_scale.resize(max_fp8_scale_bytes_);
    buf.band.resize(max_band_bytes_);
    buf.scratch.resize(max_scratch_bytes_);
    buf.row_errors.resize(max_job_rows_);
    for (OutputSet& out : buf.out) {
      for (std::size_t i = 0; i < out.out.size(); ++i) out.out[i].resize(max_out_bytes_[i]);
    }
    // However this returns, buf must not be freed while a write uses it.
    struct ReleaseGuard {
      Executor& executor;
      Buffers& buf;
      ~ReleaseGuard() {
        for (const OutputSet& out : buf.out) executor.queue_.wait_written(out);
        executor.queue_.wait_written(buf.input_write);
      }
    } release_guard{*this, buf};
    const std::vector<Job>& jobs = *current_jobs_;
    for (;;) {
      if (failed_.load(std::memory_order_relaxed)) return;
      if (cancelled()) {
        record_error(jobs.size(), std::make_exception_ptr(interrupted()));
        return;
      }
      const std::size_t i = next_job_.fetch_add(1);
      if (i >= jobs.size()) {
        queue_.drain();
        return;
      }
      try {
        run_job(i, jobs[i], buf);
      } catch (...) {
        record_error(i, std::current_exception());
        return;
      }
      if (between_jobs) between_jobs();
    }
  }

  void job_written(std::size_t job_index) {
    const Job& job = (*current_jobs_)[job_index];
    bytes_done_.fetch_add(job.input_bytes);
    if (job.last_of_tensor) tensors_done_.fetch_add(1);  // a pre-pass's: a module read
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
    return {bytes_done_.load(), phase_.bytes_total, tensors_done_.load(), phase_.tensors_total,
            phase_.phase};
  }

  // The input bytes a job reads: file, file offset, length.
  WeightRows::FileRange input_range(const Job& job) const {
    if (job.kind == Job::Kind::kCopy || job.kind == Job::Kind::kConvert) {
      return {job.in_file, job.in_offset + job.begin, job.end - job.begin};
    }
    return modules_[job.module]->rows.stored_range(job.begin, job.end);
  }

  // Asks the kernel to read the input of the jobs after the workers' current
  // ones, up to kReadAheadBytes ahead (posix_fadvise WILLNEED starts the
  // reads without waiting for them). Advisory; a no-op for cached data.
  void read_ahead() {
    const std::vector<Job>& jobs = *current_jobs_;
    const std::size_t first = std::min(next_job_.load(), jobs.size());
    read_ahead_job_ = std::max(read_ahead_job_, first);
    std::uint64_t ahead = 0;
    for (std::size_t i = first; i < read_ahead_job_; ++i) ahead += jobs[i].input_bytes;
    for (; read_ahead_job_ < jobs.size() && ahead < kReadAheadBytes; ++read_ahead_job_) {
      const WeightRows::FileRange r = input_range(jobs[read_ahead_job_]);
      if (r.file == nullptr) continue;  // a converted tensor made from no input
      try {
        const FdLease fd = r.file->descriptor();
        if (!detail::all_cached(fd->get(), r.offset, r.length)) {
          ::posix_fadvise(fd->get(), static_cast<off_t>(r.offset), static_cast<off_t>(r.length),
                          POSIX_FADV_WILLNEED);
        }
      } catch (const Error&) {
        // Advice only: the job's own read reports a file that cannot be reopened.
      }
      ahead += r.length;
    }
  }

  // Runs a job list, one phase of the progress with its own totals, on the
  // worker threads; rethrows the error of the earliest failing job.
  void run_jobs(const std::vector<Job>& jobs, ProgressPhase phase) {
    current_jobs_ = &jobs;
    phase_ = Progress{.phase = phase};
    for (const Job& j : jobs) phase_.bytes_total += j.input_bytes;
    phase_.tensors_total = static_cast<std::uint64_t>(
        std::count_if(jobs.begin(), jobs.end(), [](const Job& j) { return j.last_of_tensor; }));
    bytes_done_.store(0);
    tensors_done_.store(0);
    next_job_.store(0);
    read_ahead_job_ = 0;
    if (jobs.empty()) return;
    read_ahead();
    const unsigned n_threads =
        std::max(1u, std::min<unsigned>(options_.threads, static_cast<unsigned>(jobs.size())));
    using Clock = std::chrono::steady_clock;
    const auto progress_interval = std::chrono::milliseconds(options_.progress_interval_ms);
    if (n_threads == 1) {
      // One thread: the jobs run on the calling thread, which reads ahead
      // and reports progress between them; no thread is created.
      auto next_progress = Clock::now() + progress_interval;
      worker([&] {
        read_ahead();
        if (options_.on_progress && Clock::now() >= next_progress) {
          options_.on_progress(progress());
          next_progress = Clock::now() + progress_interval;
        }
      });
      finish_jobs();
      return;
    }
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
      } catch (const std::system_error& e) {
        // No thread for this slot: stop the others, wait for them, report.
        record_error(0, std::make_exception_ptr(io_error(fmt::format(
                            "cannot start worker thread {} of {}: {} (--threads 1 runs the "
                            "whole job on the calling thread)",
                            t + 1, n_threads, e.code().message()))));
        std::lock_guard lock(done_mutex);
        running -= n_threads - t;
        break;
      } catch (...) {
        record_error(0, std::current_exception());
        std::lock_guard lock(done_mutex);
        running -= n_threads - t;
        break;
      }
    }
    {
      // While the workers run, this thread reports progress and reads the
      // input ahead of them.
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
    finish_jobs();
  }

  // After the last job: the first error, a cancel, or the final progress.
  void finish_jobs() {
    if (first_error_) std::rethrow_exception(first_error_);
    check_cancel();
    if (options_.on_progress) options_.on_progress(progress());
  }

  // Tells options_.on_written that [offset, offset + length) of file is
  // written; bytes are those bytes when they were written from memory.
  void report_written(const OutputFile& file, std::uint64_t offset, std::uint64_t length,
                      std::span<const std::byte> bytes) const {
    if (options_.on_written) options_.on_written(file.path(), offset, length, bytes);
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

  // ---- the other files ----

  void write_text_file(const std::string& name, const std::string& text) {
    check_cancel();
    auto file = std::make_unique<OutputFile>(out_dir_ / name, output_fds_);
    const auto bytes = std::as_bytes(std::span(text));
    file->write_at(0, bytes);
    report_written(*file, 0, bytes.size(), bytes);
    outputs_.push_back(std::move(file));  // flushed after the shards
  }

  void write_json_files() {
    if (selected(kIndexFileName)) write_text_file(kIndexFileName, dump_json(plan_.index));
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
        report_written(*file, pos, std::min(kCopyJobBytes, size - pos), {});
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
    if (options_.fsync) fsync_directory(out_dir_);
  }

  const Checkpoint& ckpt_;
  const QuantizePlan& plan_;
  const fs::path out_dir_;
  const ExecuteOptions& options_;

  std::vector<std::unique_ptr<ModuleRun>> modules_;  // one per plan module
  std::vector<std::string> warnings_;                // collect_amax_warnings()
  std::vector<Job> observe_jobs_;                    // the MSE cutoff pre-pass
  std::vector<Job> amax_jobs_;  // the pre-pass: max |w| of modules that need it
  std::vector<Job> jobs_;       // everything else, in plan order
  const std::vector<Job>* current_jobs_ = &jobs_;
  // The output files' descriptors: a bounded set, so that a checkpoint of
  // thousands of shards is written within the open-file limit.
  std::shared_ptr<FdPool> output_fds_ = std::make_shared<FdPool>(FdPool::default_capacity());
  std::vector<std::unique_ptr<OutputFile>> outputs_;
  std::vector<std::size_t> shard_output_;  // plan shard -> index into outputs_ (selected shards)
  // Largest per-job buffer sizes, so each thread allocates once.
  std::uint64_t max_in_bytes_ = 0;
  std::uint64_t max_fp8_scale_bytes_ = 0;
  std::uint64_t max_band_bytes_ = 0;
  std::uint64_t max_scratch_bytes_ = 0;
  std::uint64_t max_job_rows_ = 0;
  std::array<std::uint64_t, 4> max_out_bytes_{};
  std::uint64_t bytes_total_ = 0;  // input bytes of every phase
  Progress phase_;                 // the totals of the phase running
  // Bytes of ranges the cutoff pre-pass kept (reserve_searched_bytes), and
  // the rows each pass searched or reused (ExecuteStats::mse_rows).
  std::atomic<std::uint64_t> searched_bytes_{0};
  detail::MseRowCounts mse_rows_;

  std::atomic<std::size_t> next_job_{0};
  std::size_t read_ahead_job_ = 0;  // jobs before this one were read ahead (calling thread only)
  std::atomic<std::uint64_t> bytes_done_{0};
  std::atomic<std::uint64_t> tensors_done_{0};
  std::atomic<bool> failed_{false};
  detail::PhaseTimes times_;
  detail::WriteQueue queue_;
  std::mutex error_mutex_;
  std::exception_ptr first_error_;
  std::size_t first_error_job_ = 0;
  // Runs the jobs (src/exec/jobs.cpp) on the members above, which it refers to.
  detail::JobRunner job_runner_{ckpt_,         modules_, plan_,  options_,  outputs_,
                                shard_output_, times_,   queue_, mse_rows_, searched_bytes_};
};

}  // namespace

ExecuteStats execute_plan(const Checkpoint& checkpoint, const QuantizePlan& plan,
                          const fs::path& out_dir, const ExecuteOptions& options) {
  return Executor(checkpoint, plan, out_dir, options).run();
}

}  // namespace ctquant
