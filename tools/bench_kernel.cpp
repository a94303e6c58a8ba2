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
// per-tensor) and W8A8, and the microscale rows (NVFP4A16, MXFP4A16,
// MXFP8A16), each as reference and fast path, on the same blocks.
//
// Each thread quantizes its own block of kRows x kCols weights (about the
// executor's chunk: 3 MiB of BF16), so the working set is what a worker
// sees. bytes_per_second is input bytes over wall time, summed over the
// threads; the per_core counter divides it by the thread count. Names are
// SCHEME/DTYPE/PATH/real_time/threads:N.
//
//   ctquant_bench_kernel [--benchmark_filter=REGEX] [--benchmark_repetitions=N]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/fp8.hpp"
#include "ctquant/scheme/int8.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/kernel_simd.hpp"
#include "scheme/simd.hpp"

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

// What a benchmark runs: the reference, quantize_block() (the best level
// this CPU has), the vector kernel quantize_block() runs at one level of
// simd_levels(), or the Highway kernel at that level (hwy_<level>: on x86-64
// it differs from the hand-written kernel quantize_block() runs).
struct Path {
  enum class Kind { kReference, kFast, kLevel, kHwyLevel } kind = Kind::kFast;
  ctquant::detail::SimdLevel level;
};

void run_kernel(benchmark::State& state, DType dtype, int num_bits, std::uint64_t group_size,
                const Path& path) {
  if ((path.kind == Path::Kind::kLevel || path.kind == Path::Kind::kHwyLevel) &&
      !path.level.supported) {
    state.SkipWithError("this CPU does not run this level");
    return;
  }
  const ctquant::QuantScheme scheme{"bench", num_bits, true, group_size};
  const std::vector<std::byte> weights =
      make_weights(dtype, 1234u + static_cast<std::uint32_t>(state.thread_index()));
  const std::size_t esize = static_cast<std::size_t>(ctquant::dtype_bits(dtype) / 8);
  const std::uint64_t n_groups = kCols / scheme.effective_group_size(kCols);
  std::vector<std::uint32_t> packed(kRows * ctquant::packed_words_per_row(kCols, num_bits));
  std::vector<std::byte> scale(kRows * n_groups * esize);
  const ctquant::KernelBlock block{
      dtype, kRows, kCols, weights.data(), packed.data(), scale.data(), nullptr};
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
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * weights.size()));
  state.counters["per_core"] =
      benchmark::Counter(static_cast<double>(state.iterations() * weights.size()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
  state.SetLabel(path.kind == Path::Kind::kFast        ? ctquant::kernel_path_name()
                 : path.kind == Path::Kind::kReference ? "reference"
                 : path.kind == Path::Kind::kHwyLevel  ? "highway"
                                                       : path.level.name);
}

void register_kernel(const std::string& scheme_name, DType dtype, int num_bits,
                     std::uint64_t group_size, const std::string& path_name, const Path& path) {
  const std::string name =
      scheme_name + "/" + std::string(ctquant::dtype_tag(dtype)) + "/" + path_name;
  benchmark::RegisterBenchmark(name.c_str(), run_kernel, dtype, num_bits, group_size, path)
      ->UseRealTime()
      ->Threads(1)
      ->Threads(2);
}

// Every level of simd_levels() (and, where quantize_block() runs
// hand-written kernels, the Highway kernel at the same level).
void register_levels(const std::string& scheme_name, DType dtype, int num_bits,
                     std::uint64_t group_size) {
  for (const ctquant::detail::SimdLevel& level : ctquant::detail::simd_levels()) {
    register_kernel(scheme_name, dtype, num_bits, group_size, level.name,
                    Path{Path::Kind::kLevel, level});
    if (ctquant::detail::simd_hand_written()) {
      register_kernel(scheme_name, dtype, num_bits, group_size,
                      std::string("hwy_") + level.name, Path{Path::Kind::kHwyLevel, level});
    }
  }
}

// W4A16 for every dtype on every path; W8A16 for every dtype at every level;
// W8A16 and channel-wise W4A16 (BF16) on the fast path.
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
}

// ---- rows with one code byte per weight: FP8 (float-quantized) and int8
// (int-quantized), through their SchemeFamily kernels, as the executor
// calls them. Same weights and block size as above.

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

void family_kernel(benchmark::State& state, const ctquant::SchemeFamily* family,
                   ctquant::QuantArgs args, DType dtype, bool reference) {
  const std::vector<std::byte> weights =
      make_weights(dtype, 1234u + static_cast<std::uint32_t>(state.thread_index()));
  const std::vector<ctquant::OutputTensorSpec> specs = family->outputs(args, dtype, kRows, kCols);
  std::vector<std::vector<std::byte>> out;
  ctquant::KernelIo io;
  io.dtype = dtype;
  io.n_rows = kRows;
  io.n_cols = kCols;
  io.weight = weights.data();
  io.tensor_amax = 0.1f;
  std::size_t k = 0;
  for (const ctquant::OutputTensorSpec& spec : specs) {
    if (spec.fill != ctquant::OutputTensorSpec::Fill::kRows) continue;
    out.emplace_back(spec.bytes_before(kRows));
    io.out[k++] = out.back().data();
  }
  const ctquant::KernelFn kernel = reference ? family->quantize_ref : family->quantize;
  for (auto _ : state) {
    const auto bad = kernel(args, io);
    benchmark::DoNotOptimize(bad);
    benchmark::DoNotOptimize(out.front().data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * weights.size()));
  state.counters["per_core"] =
      benchmark::Counter(static_cast<double>(state.iterations() * weights.size()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
  state.SetLabel(reference ? "reference" : "fast");
}

using T8 = ctquant::QuantArgs::Type;
using S8 = ctquant::QuantArgs::Strategy;

#define CTQUANT_ROW_BENCH(name, family, type, strategy, dtype, reference)                    \
  BENCHMARK_CAPTURE(family_kernel, name, &family, byte_code_args(type, strategy), dtype, \
                    reference)                                                           \
      ->UseRealTime()                                                                    \
      ->Threads(1)

CTQUANT_ROW_BENCH(FP8_DYNAMIC_bf16_reference, ctquant::kFloatQuantizedFamily, T8::kFloat,
                  S8::kChannel, DType::kBF16, true);
CTQUANT_ROW_BENCH(FP8_DYNAMIC_bf16, ctquant::kFloatQuantizedFamily, T8::kFloat, S8::kChannel,
                  DType::kBF16, false)->Threads(2);
CTQUANT_ROW_BENCH(FP8_DYNAMIC_f16, ctquant::kFloatQuantizedFamily, T8::kFloat, S8::kChannel,
                  DType::kF16, false);
CTQUANT_ROW_BENCH(FP8_DYNAMIC_f32, ctquant::kFloatQuantizedFamily, T8::kFloat, S8::kChannel,
                  DType::kF32, false);
CTQUANT_ROW_BENCH(FP8_BLOCK_bf16_reference, ctquant::kFloatQuantizedFamily, T8::kFloat,
                  S8::kBlock, DType::kBF16, true);
CTQUANT_ROW_BENCH(FP8_BLOCK_bf16, ctquant::kFloatQuantizedFamily, T8::kFloat, S8::kBlock,
                  DType::kBF16, false);
CTQUANT_ROW_BENCH(FP8_tensor_bf16, ctquant::kFloatQuantizedFamily, T8::kFloat, S8::kTensor,
                  DType::kBF16, false);
CTQUANT_ROW_BENCH(W8A8_bf16_reference, ctquant::kIntQuantizedFamily, T8::kInt, S8::kChannel,
                  DType::kBF16, true);
CTQUANT_ROW_BENCH(W8A8_bf16, ctquant::kIntQuantizedFamily, T8::kInt, S8::kChannel, DType::kBF16,
                  false);
CTQUANT_ROW_BENCH(W8A8_f16, ctquant::kIntQuantizedFamily, T8::kInt, S8::kChannel, DType::kF16,
                  false);

// ---- microscale rows: NVFP4A16, MXFP4A16, MXFP8A16 ----
//
// The same blocks through a registry row: quantize_ref (the reference) or
// quantize (the best vector level this CPU runs). NVFP4 gets a fixed
// tensor amax, as the executor's pre-pass would pass in.

void run_microscale(benchmark::State& state, const char* format, DType dtype, bool fast) {
  const ctquant::SchemeFamily* family = ctquant::family_by_format(format);
  const ctquant::QuantArgs args = family->presets.front().weights;
  const std::vector<std::byte> weights =
      make_weights(dtype, 1234u + static_cast<std::uint32_t>(state.thread_index()));
  std::vector<std::vector<std::byte>> outputs;
  ctquant::KernelIo io;
  io.dtype = dtype;
  io.n_rows = kRows;
  io.n_cols = kCols;
  io.weight = weights.data();
  io.tensor_amax = 0.1f;
  for (const ctquant::OutputTensorSpec& spec : family->outputs(args, dtype, kRows, kCols)) {
    if (spec.fill != ctquant::OutputTensorSpec::Fill::kRows) continue;
    outputs.emplace_back(spec.byte_size());
    io.out[outputs.size() - 1] = outputs.back().data();
  }
  const ctquant::KernelFn kernel = fast ? family->quantize : family->quantize_ref;
  for (auto _ : state) {
    const auto bad = kernel(args, io);
    benchmark::DoNotOptimize(bad);
    benchmark::DoNotOptimize(outputs.front().data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * weights.size()));
  state.counters["per_core"] =
      benchmark::Counter(static_cast<double>(state.iterations() * weights.size()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
  state.SetLabel(fast ? "fast" : "reference");
}

// NVFP4A16/BF16/fast and so on, on one and two threads.
const bool kMicroscaleRegistered = [] {
  const struct {
    const char* preset;
    const char* format;
  } rows[] = {{"NVFP4A16", "nvfp4-pack-quantized"},
              {"MXFP4A16", "mxfp4-pack-quantized"},
              {"MXFP8A16", "mxfp8-quantized"}};
  for (const auto& row : rows) {
    for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (const bool fast : {false, true}) {
        const std::string name = std::string(row.preset) + "/" +
                                 std::string(ctquant::dtype_tag(dtype)) +
                                 (fast ? "/fast" : "/reference");
        benchmark::RegisterBenchmark(name.c_str(), run_microscale, row.format, dtype, fast)
            ->UseRealTime()
            ->Threads(1)
            ->Threads(2);
      }
    }
  }
  return true;
}();

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
