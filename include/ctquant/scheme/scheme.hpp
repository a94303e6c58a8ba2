// Output schemes: what a quantized module becomes, one registry row per
// compressed-tensors format family.
//
// A *scheme* is compressed-tensors' QuantizationScheme reduced to what
// decides bytes and config: the weights' QuantizationArgs (QuantArgs) and
// the input activations block written to config.json (dynamic only; ctquant
// never writes activation scales). A *family* (SchemeFamily) is everything
// ctquant knows about one output format: the format string compressed-tensors
// infers for the scheme, the tensors written per module, the kernels that
// compute them, the decoder verify uses, and the shape rule of the vLLM
// kernel that serves it. kSchemeFamilies lists the rows in compressed-tensors'
// format priority (compressed-tensors `compressors/format.py`,
// `COMPRESSION_FORMAT_PRIORITY`; docs/schemes.md section 1.1), so the
// first row whose `writes` accepts a scheme is the format the reference
// would infer. The presets (W4A16, FP8_DYNAMIC, NVFP4A16, ...) are a
// separate table (kPresets) of QuantizationScheme values, as in
// compressed-tensors `quantization/quant_scheme.py`.
//
// The planner, executor, lint, verify, inspect and CLI consult these tables
// and never switch on a family. A new family is one file under src/scheme/
// defining its row, plus its line in kSchemeFamilies.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"

namespace ctquant {

// compressed-tensors QuantizationArgs of the weights (`quant_args.py`), the
// fields that decide bytes or are written to config.json.
struct QuantArgs {
  enum class Type : std::uint8_t { kInt, kFloat };
  enum class Strategy : std::uint8_t { kTensor, kChannel, kGroup, kBlock, kTensorGroup };

  Type type = Type::kInt;
  int num_bits = 4;
  bool symmetric = true;
  Strategy strategy = Strategy::kGroup;
  std::uint64_t group_size = 128;            // kGroup and kTensorGroup: columns per group
  std::array<std::uint64_t, 2> block{0, 0};  // kBlock: [rows, cols] of a block
  // kF8_E4M3 (NVFP4) or kU8 (MX exponents); nullopt: scales in the weight's
  // dtype (every other format, schemes.md section 3.5).
  std::optional<DType> scale_dtype;
  // The weight observer as config.json records it (scheme/observer.hpp:
  // memoryless_minmax, static_minmax, memoryless_mse, nvfp4_expanded_mse)
  // and its observer_kwargs object.
  std::string observer = "memoryless_minmax";
  nlohmann::json observer_kwargs = nlohmann::json::object();

  // Columns one scale covers along in_features for a weight of n_cols
  // columns: the group size, the block width, or n_cols (tensor, channel).
  std::uint64_t scale_cols(std::uint64_t n_cols) const;
  // Rows one scale covers: the block height, R for tensor, else 1.
  std::uint64_t scale_rows(std::uint64_t n_rows) const;

  bool operator==(const QuantArgs&) const = default;
};

const char* strategy_name(QuantArgs::Strategy strategy);  // "tensor", "channel", ...

// One output tensor of a quantized module [R, C].
//
// kRows tensors are filled chunk by chunk: rows [r0, r1) of the weight (r0 a
// multiple of the family's row_alignment, r1 too or R) produce the bytes
// [bytes_before(r0), bytes_before(r1)) of the tensor, where
// bytes_before(r) = ceil(r * units_num / units_den) * bytes_per_unit: the
// tensor is a sequence of units (rows of it) and each weight row adds
// units_num / units_den of a unit. Rows of codes and per-row scales: 1/1; a
// 128x128 block scale grid: 1/128 (one grid row per 128 weight rows); b-bit
// zero points packed along dim 0: b/32 (one int32 row per 32/b weight rows).
// kWhole tensors (weight_shape, a global scale) are written once, from
// SchemeFamily::whole_tensor.
struct OutputTensorSpec {
  enum class Fill : std::uint8_t { kRows, kWhole };
  // What the tensor holds, for verify's comparisons and messages: codes are
  // compared as integers, scales in ulps of their dtype (float dtypes).
  enum class Kind : std::uint8_t { kCodes, kScale, kZeroPoint, kGlobalScale, kShape };

  std::string suffix;  // parameter name: "weight_packed", "weight_scale", ...
  DType dtype = DType::kU8;
  std::vector<std::uint64_t> shape;
  Fill fill = Fill::kRows;
  Kind kind = Kind::kCodes;
  std::uint64_t units_num = 1;
  std::uint64_t units_den = 1;
  std::uint64_t bytes_per_unit = 0;
  // Bits of one logical element (4 for packed FP4 or int4 codes, 8 for FP8
  // codes, the dtype's width for scales), so verify can turn a byte offset
  // into [row, column] of the logical matrix of shape_elements.
  int element_bits = 8;
  std::uint64_t elements_per_unit = 0;

  std::uint64_t byte_size() const;  // product of shape times the dtype's bytes
  std::uint64_t bytes_before(std::uint64_t weight_row) const {
    return (weight_row * units_num + units_den - 1) / units_den * bytes_per_unit;
  }
};

// The memory a kernel reads and writes for one chunk of rows of a weight.
struct KernelIo {
  DType dtype = DType::kBF16;  // of the weight: BF16, F16 or F32
  std::uint64_t n_rows = 0;    // rows in this chunk
  std::uint64_t n_cols = 0;    // columns of the weight (whole rows only)
  std::uint64_t row_begin = 0; // the chunk's first row within the weight
  const std::byte* weight = nullptr;  // n_rows * n_cols elements of dtype, row-major
  // For families with needs_tensor_amax: max |w| over the module (or the
  // fused set it shares a global scale with), exactly as stored in dtype.
  float tensor_amax = 0.0f;
  // The observer's range per scale group of the chunk (scheme/observer.hpp
  // observe_ranges: lo, hi, values of dtype, groups row-major), or null:
  // min-max, each group's own min and max. Kernels take the scale from it.
  const float* ranges = nullptr;
  // One pointer per kRows output tensor, in the order outputs() lists them:
  // where the bytes for rows [row_begin, row_begin + n_rows) go.
  std::array<std::byte*, 4> out{};
  // scratch_bytes(args, n_rows, n_cols) bytes of scratch memory.
  std::span<std::byte> scratch;
};

// Kernels do not allocate or throw. They return the index (row * n_cols +
// col, within the chunk) of the first NaN or infinity, in which case the
// outputs are unspecified, or nullopt when every element was finite.
using KernelFn = std::optional<std::uint64_t> (*)(const QuantArgs& args, const KernelIo& io);

// The inverse, for verify: the values the stored outputs of rows [row_begin,
// row_begin + n_rows) stand for, as float (codes times scales, in the order
// the reference's decompressor applies them). `in` points at the chunk's
// bytes of each kRows output, as KernelIo::out does; whole tensors are in
// `whole` (a global scale), in outputs() order among the kWhole tensors.
struct DequantIo {
  DType dtype = DType::kBF16;  // of the original weight (the scale dtype of W-scaled formats)
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  std::uint64_t row_begin = 0;
  std::array<const std::byte*, 4> in{};
  std::array<const std::byte*, 2> whole{};
  float* values = nullptr;  // n_rows * n_cols
};
using DequantFn = void (*)(const QuantArgs& args, const DequantIo& io);
// The same for rows [r0, r1) of the chunk io describes (0 <= r0 < r1 <=
// io.n_rows; io.values is not used): (r1 - r0) * n_cols floats into values,
// equal to what dequantize gives for those rows (a NaN where it gives a
// NaN), by vector code. The weight error of every module is computed from
// it band by band, right after the kernel (quant_error.hpp).
using DequantRowsFn = void (*)(const QuantArgs& args, const DequantIo& io, std::uint64_t r0,
                               std::uint64_t r1, float* values);

// A compressed-tensors preset scheme (`quantization/quant_scheme.py`): its
// name as `--scheme` takes it, the weights' args and the input activations
// block config.json gets ("" for null; JSON text otherwise: always dynamic,
// since model_free_ptq cannot calibrate activations, schemes.md section 10).
// A preset that model_free_ptq refuses (NVFP4: its input activations need a
// calibrated global scale) is listed with `refused`, why, so that asking for
// it says so rather than "unknown".
struct Preset {
  std::string_view name;
  QuantArgs weights;
  std::string_view input_activations;
  std::string_view refused{};  // "" for a preset ctquant writes
};

// How a layer is split across tensor-parallel ranks, for the vLLM shape rules:
// kColumn, its output features are split (or, as vLLM's FP8 block check
// treats it, it is a non-last partition of a merged layer); kRow, its input
// features are split; kReplicated, neither (a layer at tp 1 that vLLM does
// not check as a split or merged partition).
enum class Parallel : std::uint8_t { kColumn, kRow, kReplicated };

// One reason vLLM's kernel for a family cannot run a shard of a layer.
struct ShapeProblem {
  bool unloadable = true;  // current vLLM refuses it; false: only some releases or GPUs do
  std::string what;        // e.g. "in_features 96 per shard is not a multiple of 128"
};

struct SchemeFamily {
  std::string_view id;       // short name used in messages and docs: "int-packed", "nvfp4"
  std::string_view format;   // compressed-tensors format written: "pack-quantized", ...
  std::string_view summary;  // one line for --help and docs/cli.md
  std::span<const Preset> presets;  // the presets whose format is this family's

  // Format inference, schemes.md section 1.1: true when compressed-tensors
  // would compress these weight args (with or without input activations)
  // into this family's format. Rows are tried in kSchemeFamilies order.
  bool (*writes)(const QuantArgs& args, bool has_input_activations);
  // Whether ctquant implements these args (a family may write a format for
  // args it does not cover, e.g. a bit width); "" when it does, otherwise
  // why not.
  std::string (*supports)(const QuantArgs& args);
  // Why a weight [rows, cols] cannot be quantized with args, as the
  // reference refuses it (group size not dividing in_features, FP8 block
  // with in_features not a multiple of 128, ...), written to follow
  // "tensor 'x' [R, C] ": "has in_features 100, not a multiple of the group
  // size 128"; "" when it can.
  std::string (*refuse)(const QuantArgs& args, std::uint64_t rows, std::uint64_t cols);
  // The tensors written for module M (`M.<suffix>`), `M.weight` replaced.
  std::vector<OutputTensorSpec> (*outputs)(const QuantArgs& args, DType weight_dtype,
                                           std::uint64_t rows, std::uint64_t cols);
  // The bytes of kWhole output `index` (in outputs() order) of a weight
  // [rows, cols] whose amax (or fused set amax) is tensor_amax.
  std::vector<std::byte> (*whole_tensor)(const QuantArgs& args, DType weight_dtype,
                                         std::uint64_t rows, std::uint64_t cols,
                                         float tensor_amax, std::size_t index);
  // Row chunks start at multiples of this (1, 8 for packed zero points, the
  // block height for block scales).
  std::uint64_t (*row_alignment)(const QuantArgs& args);
  // A pre-pass computes max |w| over each module before its rows are
  // quantized (NVFP4 global scales, per-tensor FP8 scales).
  bool (*needs_tensor_amax)(const QuantArgs& args);
  // For families with needs_tensor_amax: why a module (or fused set) whose
  // largest |w| is tensor_amax loses most of its precision under the
  // reference's rule, written to follow "module 'x': " (the NVFP4 global
  // scale of an F16 set overflowing F16), or "" when it does not. Null: the
  // family has no such case.
  std::string (*tensor_amax_warning)(const QuantArgs& args, DType weight_dtype,
                                     float tensor_amax) = nullptr;
  // Scratch memory a kernel call needs for a chunk.
  std::uint64_t (*scratch_bytes)(const QuantArgs& args, std::uint64_t n_rows, std::uint64_t n_cols);
  KernelFn quantize_ref;  // the scalar reference: reads like the spec
  KernelFn quantize;      // the fast path: same bytes for every input
  DequantFn dequantize;
  DequantRowsFn dequantize_rows = nullptr;  // null: quant_error.hpp runs dequantize
  // Whether vLLM has a kernel for these args at all (bit width, group size,
  // symmetry): "" when it has, otherwise why not. Lint reports it as a
  // finding that stops the run.
  std::string (*vllm_args_rule)(const QuantArgs& args);
  // vLLM's kernel shape rule for one tensor-parallel shard [rows, cols] of a
  // layer split as `parallel` (rows = out_features, cols = in_features of
  // the shard): each problem, with whether vLLM refuses to load it
  // (unloadable) or only older releases do.
  std::vector<ShapeProblem> (*vllm_shape_rule)(const QuantArgs& args, std::uint64_t rows,
                                               std::uint64_t cols, Parallel parallel);
  std::string_view vllm_source;  // the vLLM file(s) the rule was read from

  // The questions lint and verify ask about a format, answered by its row
  // (they never compare a family's id or format string):
  //
  // Whether vLLM serves the partners it fuses into one layer (an expert's
  // gate/up or w1/w3, a shared expert's gate/up, MLA's q_a_proj and
  // kv_a_proj_with_mqa) with one global scale, one partner's, without
  // requantizing the others (NVFP4: compressed_tensors_w4a4_nvfp4.py for
  // dense layers, the NVFP4 method of compressed_tensors_moe.py for experts).
  // Lint L14 warns where such partners were written with their own.
  bool vllm_one_global_scale = false;
  // Whether each quantized module of this format records its weight's shape
  // as M.weight_shape (pack-quantized); verify's loadability check requires
  // the tensor beside every M.weight_packed of such a format.
  bool writes_weight_shape = false;
  // Whether vLLM serves integer weights without input activations from this
  // format (pack-quantized, as CompressedTensorsWNA16; compressed_tensors.py
  // sends other formats to a float scheme whose weights.type == FLOAT
  // assertion fails). verify's loadability check reports a group that does
  // otherwise.
  bool vllm_int_weight_only = false;
};

}  // namespace ctquant
