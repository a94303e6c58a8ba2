// ctquant_bench_kernel: Google Benchmark micro-benchmark of the RTN kernel
// (widen to float, group absolute maximum, scale, quantize, pack), the
// scalar reference beside the AVX2 code and the fast path (AVX-512 where the
// CPU has it), for BF16, F16 and F32 weights, on one and two threads; and of
// the FP8 (FP8_DYNAMIC, FP8_BLOCK, per-tensor) and W8A8 rows' kernels,
// reference and fast path; and of the microscale rows (NVFP4A16, MXFP4A16,
// MXFP8A16), their reference and their fast path, on the same blocks.
//
// Each thread quantizes its own block of kRows x kCols weights (about the
// executor's chunk: 3 MiB of BF16), so the working set is what a worker
// sees. bytes_per_second is input bytes over wall time, summed over the
// threads; the per_core counter divides it by the thread count.
//
//   ctquant_bench_kernel [--benchmark_filter=REGEX] [--benchmark_repetitions=N]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
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

namespace {

using ctquant::DType;

constexpr std::uint64_t kRows = 512;
constexpr std::uint64_t kCols = 3072;

// kFast is quantize_block() (the best level this CPU has); kAvx2 forces the
// AVX2 code, to compare it with AVX-512 where the CPU has both.
enum class Path { kReference, kAvx2, kFast };

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

template <DType T, Path P>
void quantize_block(benchmark::State& state, int num_bits, std::uint64_t group_size) {
  const ctquant::QuantScheme scheme{"bench", num_bits, true, group_size};
  const std::vector<std::byte> weights =
      make_weights(T, 1234u + static_cast<std::uint32_t>(state.thread_index()));
  const std::size_t esize = static_cast<std::size_t>(ctquant::dtype_bits(T) / 8);
  const std::uint64_t n_groups = kCols / scheme.effective_group_size(kCols);
  std::vector<std::uint32_t> packed(kRows * ctquant::packed_words_per_row(kCols, num_bits));
  std::vector<std::byte> scale(kRows * n_groups * esize);
  const ctquant::KernelBlock block{
      T, kRows, kCols, weights.data(), packed.data(), scale.data(), nullptr};
  for (auto _ : state) {
    const auto bad = P == Path::kFast   ? ctquant::quantize_block(scheme, block)
                     : P == Path::kAvx2 ? ctquant::detail::quantize_block_simd_at(
                                              ctquant::detail::SimdLevel::kAvx2, scheme, block)
                                        : ctquant::quantize_block_ref(scheme, block);
    benchmark::DoNotOptimize(bad);
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * weights.size()));
  state.counters["per_core"] =
      benchmark::Counter(static_cast<double>(state.iterations() * weights.size()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
  state.SetLabel(P == Path::kFast   ? ctquant::kernel_path_name()
                 : P == Path::kAvx2 ? "avx2"
                                    : "reference");
}

template <DType T, Path P>
void BM_W4A16(benchmark::State& state) {
  quantize_block<T, P>(state, 4, 128);
}
template <DType T, Path P>
void BM_W8A16(benchmark::State& state) {
  quantize_block<T, P>(state, 8, 128);
}
template <DType T, Path P>
void BM_W4A16_Channel(benchmark::State& state) {
  quantize_block<T, P>(state, 4, 0);
}

#define CTQUANT_KERNEL_BENCH(fn, dtype, path) \
  BENCHMARK_TEMPLATE(fn, dtype, path)->UseRealTime()->Threads(1)->Threads(2)

CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kBF16, Path::kReference);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kBF16, Path::kAvx2);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kBF16, Path::kFast);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kF16, Path::kReference);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kF16, Path::kAvx2);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kF16, Path::kFast);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kF32, Path::kReference);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kF32, Path::kAvx2);
CTQUANT_KERNEL_BENCH(BM_W4A16, DType::kF32, Path::kFast);
CTQUANT_KERNEL_BENCH(BM_W8A16, DType::kBF16, Path::kFast);
CTQUANT_KERNEL_BENCH(BM_W4A16_Channel, DType::kBF16, Path::kFast);

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

BENCHMARK_MAIN();
