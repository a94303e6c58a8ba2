// ctquant_bench_kernel: Google Benchmark micro-benchmark of the RTN kernel
// (widen to float, group absolute maximum, scale, quantize, pack): the scalar
// reference, the vector kernel at every level compiled for this
// architecture (avx512, avx2; sve2_128, sve_256, sve2, sve, neon), the
// Highway kernel at the same levels where quantize_block() runs hand-written
// ones instead (hwy_avx512, hwy_avx2 on x86-64), and quantize_block() itself
// (fast), for BF16, F16 and F32 weights, on one and two threads. A level this
// CPU does not run is reported as skipped.
//
// Then the registry rows with their own kernels: FP8 (FP8_DYNAMIC, FP8_BLOCK,
// FP8_TENSOR), W8A8 and the microscale rows (NVFP4A16, MXFP4A16, MXFP8A16),
// each as reference and fast path for every dtype and, for BF16, at every
// level; and the input side: the FP8 E4M3 decode of FP8 inputs and the
// max |w| pre-pass of NVFP4, at every level. Last, the MSE observer's
// search (MseSearch/DTYPE/PATH) at W4A16's args, the refit observer
// (RefitSearch/PRESET/BF16/PATH) at W4A16's and W4A16_ASYM's, and the
// executor's scale check after the fast kernels
// (ScaleCheck/PRESET/BF16/fast+scale_check).
//
// Each thread quantizes its own block of kRows x kCols weights (about the
// executor's chunk: 3 MiB of BF16), so the working set is what a worker
// sees. bytes_per_second is input bytes over wall time, summed over the
// threads; the per_core counter divides it by the thread count. Names are
// SCHEME/DTYPE/PATH/real_time/threads:N.
//
//   ctquant_bench_kernel [--benchmark_filter=REGEX] [--benchmark_repetitions=N]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ctquant/exec/executor.hpp"
#include "ctquant/format/dtype.hpp"
#include "ctquant/format/minifloat.hpp"
#include "ctquant/scheme/fp8.hpp"
#include "ctquant/scheme/int8.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/refit.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/scheme/scale_check.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "ctquant/source/fp8.hpp"
#include "scheme/byte_code_simd.hpp"
#include "scheme/kernel_simd.hpp"
#include "scheme/microscale_simd.hpp"
#include "scheme/observer_steps.hpp"
#include "scheme/refit_steps.hpp"
#include "simd/simd.hpp"
#include "source/fp8_simd.hpp"

namespace {

using ctquant::DType;

constexpr std::uint64_t kRows = 512;
constexpr std::uint64_t kCols = 3072;

std::vector<std::byte> make_weights(DType dtype, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const std::size_t esize = static_cast<std::size_t>(ctquant::dtype_bits(dtype) / 8);
  std::vector<std::byte> bytes(kRows * kCols * esize);
  for (std::size_t i = 0; i < kRows * kCols; ++i) {
    const float v = normal(rng);
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t b =
          dtype == DType::kBF16 ? ctquant::float_to_bf16(v) : ctquant::float_to_f16(v);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  return bytes;
}

// bytes_per_second (bytes per iteration over wall time, summed over the
// threads) and per_core (the same per thread).
void set_rates(benchmark::State& state, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.counters["per_core"] =
      benchmark::Counter(static_cast<double>(state.iterations() * bytes),
                         benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
}

// Marks the benchmark skipped when level is given and this CPU does not run it.
bool skipped(benchmark::State& state, const ctquant::detail::SimdLevel* level) {
  if (level == nullptr || level->supported) return false;
  state.SkipWithError("this CPU does not run this level");
  return true;
}

// The block of weights of the benchmark's thread (a seed per thread).
std::vector<std::byte> thread_weights(const benchmark::State& state, DType dtype) {
  return make_weights(dtype, 1234u + static_cast<std::uint32_t>(state.thread_index()));
}

// What a benchmark runs: the reference, quantize_block() (the best level
// this CPU has), the vector kernel quantize_block() runs at one level of
// simd_levels(), or the Highway kernel at that level (hwy_<level>: on x86-64
// it differs from the hand-written kernel quantize_block() runs).
struct Path {
  enum class Kind { kReference, kFast, kLevel, kHwyLevel } kind = Kind::kFast;
  ctquant::detail::SimdLevel level;
};

void run_kernel(benchmark::State& state, DType dtype, int num_bits, std::uint64_t group_size,
                bool symmetric, const Path& path) {
  if ((path.kind == Path::Kind::kLevel || path.kind == Path::Kind::kHwyLevel) &&
      !path.level.supported) {
    state.SkipWithError("this CPU does not run this level");
    return;
  }
  const ctquant::QuantScheme scheme{"bench", num_bits, symmetric, group_size};
  const std::vector<std::byte> weights = thread_weights(state, dtype);
  const std::size_t esize = static_cast<std::size_t>(ctquant::dtype_bits(dtype) / 8);
  const std::uint64_t n_groups = kCols / scheme.effective_group_size(kCols);
  std::vector<std::uint32_t> packed(kRows * ctquant::packed_words_per_row(kCols, num_bits));
  std::vector<std::byte> scale(kRows * n_groups * esize);
  std::vector<std::int8_t> zero_point(symmetric ? 0 : kRows * n_groups);
  const ctquant::KernelBlock block{dtype,
                                   kRows,
                                   kCols,
                                   weights.data(),
                                   packed.data(),
                                   scale.data(),
                                   symmetric ? nullptr : zero_point.data()};
  for (auto _ : state) {
    std::optional<std::uint64_t> bad;
    switch (path.kind) {
      case Path::Kind::kReference:
        bad = ctquant::quantize_block_ref(scheme, block);
        break;
      case Path::Kind::kFast:
        bad = ctquant::quantize_block(scheme, block);
        break;
      case Path::Kind::kLevel:
        bad = ctquant::detail::quantize_block_simd_at(path.level, scheme, block);
        break;
      case Path::Kind::kHwyLevel:
        bad = ctquant::detail::quantize_block_hwy_at(path.level, scheme, block);
        break;
    }
    benchmark::DoNotOptimize(bad);
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, weights.size());
  state.SetLabel(path.kind == Path::Kind::kFast        ? ctquant::kernel_path_name()
                 : path.kind == Path::Kind::kReference ? "reference"
                 : path.kind == Path::Kind::kHwyLevel  ? "highway"
                                                       : path.level.name);
}

void register_kernel(const std::string& scheme_name, DType dtype, int num_bits,
                     std::uint64_t group_size, const std::string& path_name, const Path& path,
                     bool symmetric = true) {
  const std::string name =
      scheme_name + "/" + std::string(ctquant::dtype_tag(dtype)) + "/" + path_name;
  benchmark::RegisterBenchmark(name.c_str(), run_kernel, dtype, num_bits, group_size, symmetric,
                               path)
      ->UseRealTime()
      ->Threads(1)
      ->Threads(2);
}

// Every level of simd_levels() (and, where quantize_block() runs
// hand-written kernels, the Highway kernel at the same level).
void register_levels(const std::string& scheme_name, DType dtype, int num_bits,
                     std::uint64_t group_size, bool symmetric = true) {
  for (const ctquant::detail::SimdLevel& level : ctquant::detail::simd_levels()) {
    register_kernel(scheme_name, dtype, num_bits, group_size, level.name,
                    Path{Path::Kind::kLevel, level}, symmetric);
    if (ctquant::detail::simd_hand_written()) {
      register_kernel(scheme_name, dtype, num_bits, group_size, std::string("hwy_") + level.name,
                      Path{Path::Kind::kHwyLevel, level}, symmetric);
    }
  }
}

// W4A16 for every dtype on every path; W8A16 for every dtype at every level;
// W4A16_ASYM (BF16, group 128, with zero points) on every path; W8A16,
// channel-wise W4A16 and group-32 W4A16 (BF16) on the fast path.
void register_all() {
  for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    register_kernel("W4A16", dtype, 4, 128, "reference", Path{Path::Kind::kReference, {}});
    register_levels("W4A16", dtype, 4, 128);
    register_kernel("W4A16", dtype, 4, 128, "fast", Path{Path::Kind::kFast, {}});
  }
  for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    register_levels("W8A16", dtype, 8, 128);
  }
  register_kernel("W8A16", DType::kBF16, 8, 128, "fast", Path{Path::Kind::kFast, {}});
  register_kernel("W4A16_Channel", DType::kBF16, 4, 0, "fast", Path{Path::Kind::kFast, {}});
  register_kernel("W4A16_G32", DType::kBF16, 4, 32, "fast", Path{Path::Kind::kFast, {}});
  register_kernel("W4A16_ASYM", DType::kBF16, 4, 128, "reference", Path{Path::Kind::kReference, {}},
                  false);
  register_levels("W4A16_ASYM", DType::kBF16, 4, 128, false);
  register_kernel("W4A16_ASYM", DType::kBF16, 4, 128, "fast", Path{Path::Kind::kFast, {}}, false);
}

// ---- registry rows with their own kernels ----
//
// FP8 (float-quantized: FP8_DYNAMIC per channel, FP8_BLOCK, per tensor),
// W8A8 (int-quantized), NVFP4A16, MXFP4A16 and MXFP8A16, through the calls
// the executor makes: the row's quantize_ref (reference), its quantize
// (fast: the best level this CPU runs) and the vector kernel behind it at
// each level of simd_levels(). Same weights and block size as above; the
// tensor amax of NVFP4 is fixed, as the executor's pre-pass would pass in.

using RowKernel = std::function<std::optional<std::uint64_t>(const ctquant::QuantArgs&,
                                                             const ctquant::KernelIo&)>;

void run_row(benchmark::State& state, const ctquant::SchemeFamily* family,
             const ctquant::QuantArgs& args, DType dtype, const RowKernel& kernel,
             const ctquant::detail::SimdLevel* level) {
  if (skipped(state, level)) return;
  const std::vector<std::byte> weights = thread_weights(state, dtype);
  std::vector<std::vector<std::byte>> outputs;
  ctquant::KernelIo io;
  io.dtype = dtype;
  io.n_rows = kRows;
  io.n_cols = kCols;
  io.weight = weights.data();
  io.tensor_amax = 0.1f;
  for (const ctquant::OutputTensorSpec& spec : family->outputs(args, dtype, kRows, kCols)) {
    if (spec.fill != ctquant::OutputTensorSpec::Fill::kRows) continue;
    outputs.emplace_back(spec.bytes_before(kRows));
    io.out[outputs.size() - 1] = outputs.back().data();
  }
  std::vector<std::byte> scratch(family->scratch_bytes(args, kRows, kCols));
  io.scratch = scratch;
  for (auto _ : state) {
    const auto bad = kernel(args, io);
    benchmark::DoNotOptimize(bad);
    benchmark::DoNotOptimize(outputs.front().data());
    benchmark::ClobberMemory();
  }
  set_rates(state, weights.size());
}

ctquant::QuantArgs byte_code_args(ctquant::QuantArgs::Type type,
                                  ctquant::QuantArgs::Strategy strategy) {
  ctquant::QuantArgs a;
  a.type = type;
  a.num_bits = 8;
  a.symmetric = true;
  a.strategy = strategy;
  a.group_size = 0;
  if (strategy == ctquant::QuantArgs::Strategy::kBlock) a.block = {128, 128};
  return a;
}

void register_row(const std::string& name, const ctquant::SchemeFamily* family,
                  const ctquant::QuantArgs& args, DType dtype, const RowKernel& kernel,
                  const ctquant::detail::SimdLevel* level) {
  benchmark::RegisterBenchmark(name.c_str(), run_row, family, args, dtype, kernel, level)
      ->UseRealTime()
      ->Threads(1)
      ->Threads(2);
}

// SCHEME/DTYPE/reference, SCHEME/DTYPE/fast and, for `per_level` dtypes,
// SCHEME/DTYPE/LEVEL for every level, where at_level gives the row's vector
// kernel at a level.
void register_row_paths(
    const std::string& preset, const ctquant::SchemeFamily* family, const ctquant::QuantArgs& args,
    DType dtype, bool per_level,
    const std::function<RowKernel(const ctquant::detail::SimdLevel&)>& at_level) {
  const std::string prefix = preset + "/" + std::string(ctquant::dtype_tag(dtype)) + "/";
  register_row(prefix + "reference", family, args, dtype, family->quantize_ref, nullptr);
  register_row(prefix + "fast", family, args, dtype, family->quantize, nullptr);
  if (!per_level) return;
  for (const ctquant::detail::SimdLevel& level : ctquant::detail::simd_levels()) {
    register_row(prefix + level.name, family, args, dtype, at_level(level), &level);
  }
}

// ScaleCheck/PRESET/BF16/fast and .../fast+scale_check: the row's fast
// kernel alone, and followed by the check the executor runs on every chunk's
// scales (scheme/scale_check.hpp, first_bad_scale over each scale tensor's
// bytes of the chunk): the pair gives the check's cost in one run.
void register_scale_check() {
  for (const char* name : {"W4A16", "W4A16_ASYM", "NVFP4A16", "MXFP4A16", "FP8_DYNAMIC"}) {
    const ctquant::Preset* preset = ctquant::find_preset(name);
    const ctquant::QuantArgs args = preset->weights;
    const ctquant::SchemeFamily* family =
        ctquant::family_for(args, !preset->input_activations.empty());
    std::vector<ctquant::OutputTensorSpec> rows;
    for (const ctquant::OutputTensorSpec& spec :
         family->outputs(args, DType::kBF16, kRows, kCols)) {
      if (spec.fill == ctquant::OutputTensorSpec::Fill::kRows) rows.push_back(spec);
    }
    const RowKernel checked = [family, rows](const ctquant::QuantArgs& a,
                                             const ctquant::KernelIo& io) {
      const auto bad = family->quantize(a, io);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (!ctquant::holds_scales(rows[i])) continue;
        const auto found = ctquant::first_bad_scale(
            rows[i].dtype, std::span<const std::byte>(io.out[i], rows[i].bytes_before(io.n_rows)));
        benchmark::DoNotOptimize(found);
      }
      return bad;
    };
    const std::string prefix = std::string("ScaleCheck/") + name + "/BF16/";
    register_row(prefix + "fast", family, args, DType::kBF16, family->quantize, nullptr);
    register_row(prefix + "fast+scale_check", family, args, DType::kBF16, checked, nullptr);
  }
}

void register_rows() {
  using T = ctquant::QuantArgs::Type;
  using S = ctquant::QuantArgs::Strategy;
  using ctquant::detail::ByteCode;
  const struct {
    const char* preset;
    ByteCode code;
    ctquant::QuantArgs args;
    const ctquant::SchemeFamily* family;
  } byte_rows[] = {
      {"FP8_DYNAMIC", ByteCode::kE4M3, byte_code_args(T::kFloat, S::kChannel),
       &ctquant::kFloatQuantizedFamily},
      {"FP8_BLOCK", ByteCode::kE4M3, byte_code_args(T::kFloat, S::kBlock),
       &ctquant::kFloatQuantizedFamily},
      {"FP8_TENSOR", ByteCode::kE4M3, byte_code_args(T::kFloat, S::kTensor),
       &ctquant::kFloatQuantizedFamily},
      {"W8A8", ByteCode::kInt8, byte_code_args(T::kInt, S::kChannel),
       &ctquant::kIntQuantizedFamily},
  };
  for (const auto& row : byte_rows) {
    for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      const ByteCode code = row.code;
      register_row_paths(
          row.preset, row.family, row.args, dtype, dtype == DType::kBF16,
          [code](const ctquant::detail::SimdLevel& level) -> RowKernel {
            ctquant::detail::ByteCodeKernel* k = ctquant::detail::byte_code_kernel(level);
            return [k, code](const ctquant::QuantArgs& a, const ctquant::KernelIo& io) {
              return k != nullptr ? k(code, a, io) : std::nullopt;
            };
          });
    }
  }
  const struct {
    const char* preset;
    const char* format;
    ctquant::microscale::Format kernel_format;
  } microscale_rows[] = {{"NVFP4A16", "nvfp4-pack-quantized", ctquant::microscale::Format::kNvfp4},
                         {"MXFP4A16", "mxfp4-pack-quantized", ctquant::microscale::Format::kMxfp4},
                         {"MXFP8A16", "mxfp8-quantized", ctquant::microscale::Format::kMxfp8}};
  for (const auto& row : microscale_rows) {
    const ctquant::SchemeFamily* family = ctquant::family_by_format(row.format);
    const ctquant::QuantArgs args = family->presets.front().weights;
    for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      const ctquant::microscale::Format format = row.kernel_format;
      register_row_paths(row.preset, family, args, dtype, dtype == DType::kBF16,
                         [format](const ctquant::detail::SimdLevel& level) -> RowKernel {
                           const ctquant::microscale::ChunkKernel k =
                               ctquant::microscale::kernel_at(level, format);
                           return [k](const ctquant::QuantArgs&, const ctquant::KernelIo& io) {
                             return k != nullptr ? k(io) : std::nullopt;
                           };
                         });
    }
  }
  register_scale_check();
}

// ---- the input side: FP8 E4M3 decode and the amax pre-pass ----
//
// Fp8Decode/E4M3/PATH: one block of kRows x kCols E4M3 codes with one scale
// to BF16 (the dequantization of an FP8 input's rows), band by band into one
// buffer of the executor's band size: the scalar step (dequantize_fp8_value
// per code, "reference") and the vector kernel at each level; the codes are
// those of normal weights (Fp8Codes::kWeights), and for
// Fp8Decode/E4M3_every_code/PATH every finite code equally often, subnormal
// ones included (the adversarial case). bytes_per_second counts
// the BF16 bytes produced, so it compares
// with the quantize kernels' input rate. MaxAbs/DTYPE/PATH: max |w| of a
// block (the NVFP4 global-scale pre-pass): max_abs_ref ("reference"),
// max_abs ("fast") and the vector code at each level.

// Which E4M3 codes the decode benchmark reads.
enum class Fp8Codes {
  kWeights,   // codes of normal weights with scale amax / 448, as FP8 checkpoints
              // hold them (about 1 in 10^4 a subnormal code)
  kEveryCode  // every finite code equally often (1 in 16 subnormal)
};

void run_fp8_decode(benchmark::State& state, Fp8Codes kind,
                    const ctquant::detail::SimdLevel* level) {
  ctquant::detail::Fp8DecodeKernel* kernel = nullptr;
  if (level != nullptr) {
    kernel = ctquant::detail::fp8_decode_kernel(*level);
    if (kernel == nullptr) {
      state.SkipWithError("this CPU does not run this level");
      return;
    }
  }
  std::mt19937 rng(99u + static_cast<std::uint32_t>(state.thread_index()));
  std::vector<std::uint8_t> codes(kRows * kCols);
  if (kind == Fp8Codes::kWeights) {
    // The quantize benchmarks' weights, as F32, quantized with scale amax / 448.
    const std::vector<std::byte> bytes = make_weights(DType::kF32, 99u);
    std::vector<float> w(codes.size());
    std::memcpy(w.data(), bytes.data(), bytes.size());
    float amax = 0.0f;
    for (const float v : w) amax = std::max(amax, std::abs(v));
    const float scale = amax / 448.0f;
    for (std::size_t i = 0; i < w.size(); ++i) codes[i] = ctquant::float_to_f8_e4m3(w[i] / scale);
  } else {
    for (std::uint8_t& c : codes) {
      c = static_cast<std::uint8_t>(rng());
      if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
    }
  }
  // The executor decodes a chunk band by band into one buffer of
  // ExecuteOptions::fp8_band_bytes that stays in the core's cache, and
  // quantizes each band from there; so does this loop.
  const std::size_t band = ctquant::ExecuteOptions{}.fp8_band_bytes / sizeof(std::uint16_t);
  std::vector<std::uint16_t> out(band);
  const float scale = 0.0123f;
  for (auto _ : state) {
    for (std::size_t b = 0; b < codes.size(); b += band) {
      const std::size_t n = std::min(band, codes.size() - b);
      const std::uint8_t* in = codes.data() + b;
      if (kernel != nullptr) {
        const auto bad = kernel(in, n, scale, out.data());
        benchmark::DoNotOptimize(bad);
      } else {
        for (std::size_t i = 0; i < n; ++i) {
          out[i] = ctquant::dequantize_fp8_value(DType::kF8_E4M3, in[i], scale);
        }
      }
      benchmark::DoNotOptimize(out.data());
      benchmark::ClobberMemory();
    }
  }
  set_rates(state, codes.size() * sizeof(std::uint16_t));
}

void run_max_abs(benchmark::State& state, DType dtype, int path,
                 const ctquant::detail::SimdLevel* level) {
  if (skipped(state, level)) return;
  const std::vector<std::byte> weights = thread_weights(state, dtype);
  const std::uint64_t n = kRows * kCols;
  for (auto _ : state) {
    float amax = 0.0f;
    if (level != nullptr) {
      const auto bits =
          ctquant::detail::max_magnitude_bits_simd_at(*level, dtype, weights.data(), n);
      benchmark::DoNotOptimize(bits);
    } else {
      const auto bad = path == 0 ? ctquant::max_abs_ref(dtype, weights.data(), n, amax)
                                 : ctquant::max_abs(dtype, weights.data(), n, amax);
      benchmark::DoNotOptimize(bad);
    }
    benchmark::DoNotOptimize(amax);
  }
  set_rates(state, weights.size());
}

void register_input_side() {
  const auto add = [](benchmark::internal::Benchmark* b) {
    b->UseRealTime()->Threads(1)->Threads(2);
  };
  for (const auto& [kind, name] : {std::pair{Fp8Codes::kWeights, "Fp8Decode/E4M3/"},
                                   std::pair{Fp8Codes::kEveryCode, "Fp8Decode/E4M3_every_code/"}}) {
    add(benchmark::RegisterBenchmark((std::string(name) + "reference").c_str(), run_fp8_decode,
                                     kind, nullptr));
    for (const ctquant::detail::SimdLevel& level : ctquant::detail::simd_levels()) {
      add(benchmark::RegisterBenchmark((std::string(name) + level.name).c_str(), run_fp8_decode,
                                       kind, &level));
    }
  }
  for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::string prefix = "MaxAbs/" + std::string(ctquant::dtype_tag(dtype)) + "/";
    add(benchmark::RegisterBenchmark((prefix + "reference").c_str(), run_max_abs, dtype, 0,
                                     nullptr));
    add(benchmark::RegisterBenchmark((prefix + "fast").c_str(), run_max_abs, dtype, 1, nullptr));
    for (const ctquant::detail::SimdLevel& level : ctquant::detail::simd_levels()) {
      add(benchmark::RegisterBenchmark((prefix + level.name).c_str(), run_max_abs, dtype, 1,
                                       &level));
    }
  }
}

// The MSE observer's search (observe_ranges) over a block of BF16 or F16
// weights at W4A16's args (int4, symmetric, groups of 128) with
// memoryless_mse's defaults (20 candidates): the scalar reference, or the
// vector search at one level. bytes_per_second counts the input once.
void run_mse_search(benchmark::State& state, DType dtype,
                    const ctquant::detail::SimdLevel* level) {
  if (skipped(state, level)) return;
  ctquant::QuantArgs args;
  args.type = ctquant::QuantArgs::Type::kInt;
  args.num_bits = 4;
  args.symmetric = true;
  args.strategy = ctquant::QuantArgs::Strategy::kGroup;
  args.group_size = 128;
  args.observer = "memoryless_mse";
  const ctquant::ObserverParams params =
      ctquant::observer_params("memoryless_mse", nlohmann::json::object(), "bench");
  // The reference is about 30 times slower: a sixteenth of the block.
  const std::uint64_t rows = level == nullptr ? kRows / 16 : kRows;
  const std::vector<std::byte> weights = thread_weights(state, dtype);
  std::vector<float> ranges(2 * ctquant::observed_groups(args, rows, kCols));
  ctquant::ObserveIo io;
  io.dtype = dtype;
  io.n_rows = rows;
  io.n_cols = kCols;
  io.weight = weights.data();
  io.ranges = ranges.data();
  for (auto _ : state) {
    if (level == nullptr) {
      ctquant::observe_ranges_ref(args, params, params.steps() - 1, io, nullptr);
    } else if (!ctquant::detail::observe_ranges_at(*level, args, params, params.steps() - 1, io,
                                                   nullptr)) {
      state.SkipWithError("the vector search does not cover these args");
      return;
    }
    benchmark::DoNotOptimize(ranges.data());
  }
  set_rates(state, rows * kCols * 2);
}

void register_mse_search() {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const std::string prefix = "MseSearch/" + std::string(ctquant::dtype_tag(dtype)) + "/";
    benchmark::RegisterBenchmark((prefix + "reference").c_str(), run_mse_search, dtype, nullptr)
        ->UseRealTime();
    for (const ctquant::detail::SimdLevel& level : ctquant::detail::simd_levels()) {
      benchmark::RegisterBenchmark((prefix + level.name).c_str(), run_mse_search, dtype, &level)
          ->UseRealTime();
    }
  }
}

// The refit observer (observe_refit) over the same block at W4A16's args
// (symmetric) or W4A16_ASYM's (asymmetric) with its default kwargs: the
// scalar reference, or the vector kernel at one level.
void run_refit_search(benchmark::State& state, DType dtype, bool symmetric,
                      const ctquant::detail::SimdLevel* level) {
  if (skipped(state, level)) return;
  ctquant::QuantArgs args;
  args.type = ctquant::QuantArgs::Type::kInt;
  args.num_bits = 4;
  args.symmetric = symmetric;
  args.strategy = ctquant::QuantArgs::Strategy::kGroup;
  args.group_size = 128;
  args.observer = ctquant::kRefitObserver;
  const ctquant::RefitParams params = ctquant::refit_params(nlohmann::json::object(), "bench");
  const std::uint64_t rows = level == nullptr ? kRows / 16 : kRows;
  const std::vector<std::byte> weights = thread_weights(state, dtype);
  std::vector<float> ranges(2 * ctquant::observed_groups(args, rows, kCols));
  const ctquant::ObserveIo io{dtype, rows, kCols, weights.data(), ranges.data(), 0.0f};
  for (auto _ : state) {
    if (level == nullptr) {
      ctquant::observe_refit_ref(args, params, io);
    } else if (!ctquant::detail::observe_refit_at(*level, args, params, io)) {
      state.SkipWithError("the vector kernel does not cover these args");
      return;
    }
    benchmark::DoNotOptimize(ranges.data());
  }
  set_rates(state, rows * kCols * 2);
}

void register_refit_search() {
  for (const bool symmetric : {true, false}) {
    const std::string prefix =
        std::string("RefitSearch/") + (symmetric ? "W4A16" : "W4A16_ASYM") + "/BF16/";
    benchmark::RegisterBenchmark((prefix + "reference").c_str(), run_refit_search, DType::kBF16,
                                 symmetric, nullptr)
        ->UseRealTime();
    for (const ctquant::detail::SimdLevel& level : ctquant::detail::simd_levels()) {
      benchmark::RegisterBenchmark((prefix + level.name).c_str(), run_refit_search, DType::kBF16,
                                   symmetric, &level)
          ->UseRealTime();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  register_rows();
  register_input_side();
  register_mse_search();
  register_refit_search();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
