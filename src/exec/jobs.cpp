// The executor's jobs (src/exec/jobs.hpp): what a worker does with one job
// of each kind.
#include "exec/jobs.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <span>
#include <stdexcept>
#include <utility>

#include "ctquant/util/error.hpp"

namespace ctquant::detail {

// Rows per band of an FP8 module's quantize job: each band is dequantized
// into a buffer of about kFp8BandBytes, which stays in the core's cache,
// and quantized from there (a multiple of the family's row alignment, so
// the kernel gives the same bytes as for the whole job).
std::uint64_t JobRunner::fp8_band_rows(const ModuleRun& m) const {
  const std::uint64_t align = std::max<std::uint64_t>(1, m.family->row_alignment(*m.args));
  const std::uint64_t n = options_.fp8_band_bytes / std::max<std::uint64_t>(1, m.rows.row_bytes());
  return std::max(align, n / align * align);
}

void JobRunner::run_amax_job(const Job& job, Buffers& buf) {
  ModuleRun& m = *modules_[job.module];
  const std::uint64_t n = job.end - job.begin;
  PhaseLap lap(times_);
  load_rows(m, job, buf);
  lap.lap(m.rows.is_fp8() ? Phase::kDecode : Phase::kRead);
  float amax = 0.0f;
  if (const auto bad = max_abs(m.rows.dtype(), buf.input.data(), n * m.rows.cols(), amax)) {
    detail::throw_weight_not_finite(m.rows, job.begin, *bad, buf.input.data());
  }
  if (m.observer.mse) {
    // The global scale comes from the chosen ranges (llm-compressor
    // Observer.get_global_scale over the observers' min/max values).
    const float* ranges = searched_ranges(m, job.begin, n);
    if (ranges != nullptr) {
      mse_rows_.reused_amax += n;
    } else {
      ranges = observe(m, buf, buf.input.data(), job.begin, n);
      mse_rows_.amax += n;
    }
    amax = 0.0f;
    const std::uint64_t groups = observed_groups(*m.args, n, m.rows.cols());
    for (std::uint64_t g = 0; g < groups; ++g) amax = std::max(amax, range_amax(ranges, g));
  }
  lap.lap(Phase::kAmax);
  std::uint32_t seen = m.amax_bits.load();
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(amax);
  while (bits > seen && !m.amax_bits.compare_exchange_weak(seen, bits)) {
  }
}

// The observer's ranges of n rows of a module from row `begin` (its MSE
// search up to the module's cutoff, or refit), in the worker's buffer; a
// range that is not finite stops the run (value_checks.hpp).
const float* JobRunner::observe(const ModuleRun& m, Buffers& buf, const std::byte* weight,
                                std::uint64_t begin, std::uint64_t n,
                                ImprovedSteps* improved) const {
  buf.ranges.resize(2 * observed_groups(*m.args, n, m.rows.cols()));
  ObserveIo io;
  io.dtype = m.rows.dtype();
  io.n_rows = n;
  io.n_cols = m.rows.cols();
  io.weight = weight;
  io.ranges = buf.ranges.data();
  io.tensor_amax = m.set_amax;  // refit refits NVFP4 group scales under the set's global scale
  observe_ranges(*m.args, m.observer, improved != nullptr ? m.observer.steps() : m.cutoff, io,
                 improved);
  detail::check_observer_ranges(m.subject(), begin, n, weight, buf.ranges.data());
  return buf.ranges.data();
}

// The cutoff pre-pass: the candidates that improve some group of this
// chunk, until they settle the module's cutoff. The chunk's chosen ranges
// are kept for its amax and quantize jobs while the budget allows.
void JobRunner::run_observe_job(const Job& job, Buffers& buf) {
  ModuleRun& m = *modules_[job.module];
  if (m.cutoff_settled) return;
  const std::uint64_t n = job.end - job.begin;
  load_rows(m, job, buf);
  float amax = 0.0f;
  if (const auto bad = max_abs(m.rows.dtype(), buf.input.data(), n * m.rows.cols(), amax)) {
    detail::throw_weight_not_finite(m.rows, job.begin, *bad, buf.input.data());
  }
  ImprovedSteps improved;
  observe(m, buf, buf.input.data(), job.begin, n, &improved);
  mse_rows_.cutoff += n;
  std::vector<float> ranges;
  if (options_.reuse_searched_ranges && reserve_searched_bytes(buf.ranges.size() * sizeof(float))) {
    ranges = buf.ranges;
  }
  const std::lock_guard lock(m.improved_mutex);
  m.improved.resize(std::max(m.improved.size(), improved.size()), 0);
  for (std::size_t i = 0; i < improved.size(); ++i) m.improved[i] |= improved[i];
  if (mse_cutoff_settled(m.observer, m.improved)) m.cutoff_settled = true;
  if (!ranges.empty()) m.searched_ranges.emplace(job.begin, std::move(ranges));
}

// Takes `bytes` of the budget for the ranges kept between the passes: at
// most chunk_bytes in all, so memory stays flat however many modules the
// pre-pass searches.
bool JobRunner::reserve_searched_bytes(std::uint64_t bytes) {
  std::uint64_t used = searched_bytes_.load();
  do {
    if (used + bytes > options_.chunk_bytes) return false;
  } while (!searched_bytes_.compare_exchange_weak(used, used + bytes));
  return true;
}

// The ranges the cutoff pre-pass kept for the chunk of n rows from row
// `begin`, or null; valid until the chunk's quantize job takes them.
const float* JobRunner::searched_ranges(ModuleRun& m, std::uint64_t begin, std::uint64_t n) {
  const std::lock_guard lock(m.improved_mutex);
  const auto it = m.searched_ranges.find(begin);
  if (it == m.searched_ranges.end() ||
      it->second.size() != 2 * observed_groups(*m.args, n, m.rows.cols())) {
    return nullptr;
  }
  return it->second.data();
}

// Takes the ranges the cutoff pre-pass kept for the chunk of n rows from
// row `begin` (empty if none), for its quantize job to free.
std::vector<float> JobRunner::take_searched_ranges(ModuleRun& m, std::uint64_t begin,
                                                   std::uint64_t n) {
  const std::lock_guard lock(m.improved_mutex);
  auto node = m.searched_ranges.extract(begin);
  if (node.empty() || node.mapped().size() != 2 * observed_groups(*m.args, n, m.rows.cols())) {
    return {};
  }
  return std::move(node.mapped());
}

// Loads a job's rows; an FP8 value that is not finite once dequantized is
// bad input, named by shard, tensor, row and column (section 6).
void JobRunner::load_rows(const ModuleRun& m, const Job& job, Buffers& buf) const {
  if (const auto bad = m.rows.load(job.begin, job.end, buf.input, buf.fp8_scale)) {
    detail::throw_fp8_not_finite(m.rows, job.begin, *bad);
  }
  // --transform (transform/transform.hpp): the rows as the rewritten source holds them.
  if (plan_.rewrite) {
    if (const TensorRewrite* r = plan_.rewrite->find(plan_.decisions[m.module->decision].name)) {
      apply_rewrite(*plan_.rewrite, *r, m.rows.dtype(), job.begin * m.rows.cols(),
                    (job.end - job.begin) * m.rows.cols(), buf.input.data());
    }
  }
}

void JobRunner::run_quantize_job(std::size_t job_index, const Job& job, Buffers& buf) {
  const ModuleRun& m = *modules_[job.module];
  const std::uint64_t n_rows = job.end - job.begin;
  // Ranges the cutoff pre-pass chose for this chunk, freed with the job.
  const std::vector<float> searched =
      m.observer.mse ? take_searched_ranges(*modules_[job.module], job.begin, n_rows)
                     : std::vector<float>{};
  // A BF16, F16 or F32 chunk is quantized where it is read. An FP8 chunk's
  // codes are read whole and dequantized band by band into a buffer that
  // stays in cache, each band quantized as soon as it is decoded: the
  // chunk is never rewritten as BF16 in memory.
  const bool fp8 = m.rows.is_fp8();
  PhaseLap lap(times_);
  if (fp8) {
    m.rows.read_fp8(job.begin, job.end, buf.input, buf.fp8_scale);
  } else {
    load_rows(m, job, buf);
  }
  lap.lap(Phase::kRead);

  OutputSet& out = buf.out[buf.next_out];
  buf.next_out = (buf.next_out + 1) % buf.out.size();
  queue_.wait_written(out);
  lap.reset();
  const std::uint64_t band_rows = fp8 ? fp8_band_rows(m) : n_rows;
  for (std::uint64_t band = job.begin; band < job.end; band += band_rows) {
    const std::uint64_t band_end = std::min(job.end, band + band_rows);
    const std::byte* weight = buf.input.data();
    if (fp8) {
      if (const auto bad = m.rows.dequantize_fp8_band(job.begin, band, band_end, buf.input.data(),
                                                      buf.fp8_scale.data(), buf.band)) {
        detail::throw_fp8_not_finite(m.rows, band, *bad);
      }
      weight = buf.band.data();
      lap.lap(Phase::kDecode);
    }
    KernelIo io;
    io.dtype = m.rows.dtype();
    io.n_rows = band_end - band;
    io.n_cols = m.rows.cols();
    io.row_begin = band;
    io.weight = weight;
    io.tensor_amax = m.set_amax;
    if (m.observer.chooses_ranges()) {
      if (const auto bad = max_abs(io.dtype, weight, io.n_rows * io.n_cols, io.tensor_amax)) {
        detail::throw_weight_not_finite(m.rows, band, *bad, weight);
      }
      io.tensor_amax = m.set_amax;
      if (!searched.empty()) {
        // A band's groups follow those of the rows before it in the
        // chunk (bands are whole multiples of the row alignment).
        io.ranges = searched.data() + 2 * observed_groups(*m.args, band - job.begin, io.n_cols);
        mse_rows_.reused_quantize += io.n_rows;
      } else {
        io.ranges = observe(m, buf, weight, band, io.n_rows);
        mse_rows_.quantize += io.n_rows;
      }
    }
    for (std::size_t i = 0; i < m.row_outputs.size(); ++i) {
      const OutputTensorSpec& spec = m.specs[m.row_outputs[i]];
      io.out[i] = out.out[i].data() + (spec.bytes_before(band) - spec.bytes_before(job.begin));
    }
    io.scratch = std::span<std::byte>(buf.scratch);
    if (const auto bad = m.family->quantize(*m.args, io)) {
      detail::throw_weight_not_finite(m.rows, band, *bad, weight);
    }
    // Every scale finite and non-zero (scheme/scale_check.hpp), checked
    // while the kernel's bytes are in cache.
    for (std::size_t i = 0; i < m.row_outputs.size(); ++i) {
      detail::check_row_scales(m.subject(), m.specs[m.row_outputs[i]], band, io.n_rows, io.out[i],
                               weight, io.ranges);
    }
    lap.lap(Phase::kQuantize);
    error_rows(m, io, band - job.begin, buf);
    lap.lap(Phase::kError);
  }
  {
    ModuleRun& run = *modules_[job.module];
    const std::lock_guard lock(run.error_mutex);
    run.error.add(job.begin, std::span<const RowError>(buf.row_errors.data(), n_rows));
  }
  const std::uint64_t base = plan_.shards[m.shard].data_start;
  WriteRequest request;
  request.job = job_index;
  request.file = shard_file(m.shard);
  request.buffers = &out;
  for (std::size_t i = 0; i < m.row_outputs.size(); ++i) {
    const std::size_t o = m.row_outputs[i];
    const OutputTensorSpec& spec = m.specs[o];
    const std::uint64_t first = spec.bytes_before(job.begin);
    const std::uint64_t bytes = spec.bytes_before(job.end) - first;
    request.pieces[request.n_pieces++] = {base + m.tensors[o]->offset + first,
                                          std::span<const std::byte>(out.out[i].data(), bytes)};
  }
  queue_.submit(request);
}

// The weight error of the rows the kernel just quantized (quant_error.hpp),
// while they and their outputs are in cache: into buf.row_errors from
// index `first` (the band's first row within the job).
void JobRunner::error_rows(const ModuleRun& m, const KernelIo& io, std::uint64_t first,
                           Buffers& buf) const {
  QuantErrorIo e;
  e.dtype = io.dtype;
  e.n_rows = io.n_rows;
  e.n_cols = io.n_cols;
  e.row_begin = io.row_begin;
  e.weight = io.weight;
  for (std::size_t i = 0; i < e.outputs.size(); ++i) e.outputs[i] = io.out[i];
  for (std::size_t k = 0; k < m.whole.size() && k < e.whole.size(); ++k) {
    e.whole[k] = m.whole[k].data();
  }
  quant_error_rows(*m.family, *m.args, e, std::span(buf.row_errors).subspan(first, io.n_rows),
                   buf.error_values);
}

// Writes a module's rows as 16-bit values (an FP8 weight not quantized,
// dequantized to BF16). The rows are written from the input buffer itself,
// so the job waits for its write.
void JobRunner::run_rows_job(std::size_t job_index, const Job& job, Buffers& buf) {
  const ModuleRun& m = *modules_[job.module];
  PhaseLap lap(times_);
  load_rows(m, job, buf);
  lap.lap(m.rows.is_fp8() ? Phase::kDecode : Phase::kRead);
  const std::uint64_t row_bytes = m.rows.row_bytes();
  WriteRequest request;
  request.job = job_index;
  request.file = shard_file(job.shard);
  request.buffers = &buf.input_write;
  request.pieces[request.n_pieces++] = {
      plan_.shards[job.shard].data_start + job.tensor->offset + job.begin * row_bytes,
      std::span<const std::byte>(buf.input.data(), (job.end - job.begin) * row_bytes)};
  queue_.submit(request);
  queue_.wait_written(buf.input_write);
}

// An output tensor of a converted module (source/converter.hpp): its input
// tensors read whole, the converter's operation, one write. Nothing is
// requantized, so there is no weight error to measure.
void JobRunner::run_convert_job(std::size_t job_index, const Job& job, Buffers& buf) {
  const ConvertedModule& m = plan_.converted[job.module];
  const ConvertedTensor& t = m.outputs[*job.tensor->output];
  PhaseLap lap(times_);
  // The buffers only grow: a resize that grows zero-fills, and the tensors
  // of a module alternate between large (codes) and small (scales).
  auto bytes_of = [](std::vector<std::byte>& b, std::uint64_t size) {
    if (b.size() < size) b.resize(size);
    return std::span<std::byte>(b.data(), size);
  };
  buf.convert_in.resize(std::max(buf.convert_in.size(), t.inputs.size()));
  std::array<std::span<const std::byte>, kMaxConverterInputs> in;
  if (t.inputs.size() > in.size()) throw std::logic_error("converted tensor with too many inputs");
  for (std::size_t i = 0; i < t.inputs.size(); ++i) {
    const TensorEntry& e = checkpoint_.entry(t.inputs[i]);
    const std::span<std::byte> bytes = bytes_of(buf.convert_in[i], e.byte_size());
    checkpoint_.shards[t.inputs[i].shard].read(e.begin, bytes);
    in[i] = bytes;
  }
  lap.lap(Phase::kRead);
  queue_.wait_written(buf.convert_write);
  const std::span<std::byte> out = bytes_of(buf.convert_out, t.byte_size);
  const std::span<const std::span<const std::byte>> inputs(in.data(), t.inputs.size());
  produce_converted(*plan_.source_format->converter, t, inputs, out);
  detail::check_converted_values(checkpoint_, m, t, inputs, out);
  lap.lap(Phase::kQuantize);
  WriteRequest request;
  request.job = job_index;
  request.file = shard_file(job.shard);
  request.buffers = &buf.convert_write;
  request.pieces[request.n_pieces++] = {plan_.shards[job.shard].data_start + job.tensor->offset,
                                        std::span<const std::byte>(out)};
  queue_.submit(request);
  queue_.wait_written(buf.convert_write);
}

void JobRunner::run_copy_job(std::size_t job_index, const Job& job, Buffers& buf) {
  // A tensor --transform rewrites (a norm, a Linear kept in 16 bits) is
  // read, rewritten and written from memory instead of copied.
  const TensorRewrite* rewrite =
      plan_.rewrite ? plan_.rewrite->find(plan_.decisions[job.tensor->decision].name) : nullptr;
  if (rewrite != nullptr) {
    const std::uint64_t size = static_cast<std::uint64_t>(dtype_bits(job.tensor->dtype) / 8);
    buf.rewritten.resize(job.end - job.begin);
    job.in_file->read(job.in_offset - job.in_file->header().data_start + job.begin, buf.rewritten);
    apply_rewrite(*plan_.rewrite, *rewrite, job.tensor->dtype, job.begin / size,
                  (job.end - job.begin) / size, buf.rewritten.data());
    WriteRequest request;
    request.job = job_index;
    request.file = shard_file(job.shard);
    request.buffers = &buf.input_write;
    request.pieces[request.n_pieces++] = {
        plan_.shards[job.shard].data_start + job.tensor->offset + job.begin,
        std::span<const std::byte>(buf.rewritten)};
    queue_.submit(request);
    queue_.wait_written(buf.input_write);
    return;
  }
  WriteRequest request;
  request.job = job_index;
  request.file = shard_file(job.shard);
  request.in_file = job.in_file;
  request.in_offset = job.in_offset + job.begin;
  request.out_offset = plan_.shards[job.shard].data_start + job.tensor->offset + job.begin;
  request.length = job.end - job.begin;
  queue_.submit(request);
}

}  // namespace ctquant::detail
