// Private to the executor: the values it refuses while it quantizes, each
// thrown as Error{kBadInput} naming the file, the tensor, the element or
// scale group and the rule (the run then removes its temporary directory:
// no OUTPUT). Kernels never throw; they report (KernelIo: the first value
// that is not finite) or write scales the executor checks right after them
// (scheme/scale_check.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "ctquant/source/converter.hpp"
#include "ctquant/source/weight_rows.hpp"

namespace ctquant::detail {

// A weight element that is not finite: `bad` indexes `data`, the loaded
// rows from row_begin on (section 3 of the format spec).
[[noreturn]] void throw_weight_not_finite(const WeightRows& rows, std::uint64_t row_begin,
                                          std::uint64_t bad, const std::byte* data);
// An FP8 element whose dequantized value is not finite (section 6).
[[noreturn]] void throw_fp8_not_finite(const WeightRows& rows, std::uint64_t row_begin,
                                       std::uint64_t bad);

// A converted module's float values (source/converter.hpp): every input
// tensor of output tensor t of a float dtype (AWQ scales, ModelOpt
// weight_scale, weight_scale_2) and t's own bytes `out` when t is a float
// tensor must be finite; nothing is requantized, so a NaN or infinity here
// would reach vLLM as it stands and make every weight of its group NaN.
// Throws Error{kBadInput} naming the shard, the tensor, the element and
// the module.
void check_converted_values(const Checkpoint& checkpoint, const ConvertedModule& m,
                            const ConvertedTensor& t,
                            std::span<const std::span<const std::byte>> inputs,
                            std::span<const std::byte> out);

// A quantized module as the scale messages name it.
struct ScaleSubject {
  const WeightRows& rows;
  const std::string& module;  // its name: its outputs are `module.<suffix>`
  const QuantArgs& args;
  const ObserverParams& observer;
  const OutputTensorSpec* scale = nullptr;  // its kRows scale tensor, if it has one
};

// The observer's ranges of rows [row_begin, row_begin + n_rows) (weight:
// those rows; ranges in observe_ranges' layout, one per element of the
// kRows scale tensor `m.scale`, which must be set): throws at the first
// group whose range is not finite, which would give it an infinite scale
// (or, under NVFP4, its module a global scale of 0).
void check_observer_ranges(const ScaleSubject& m, std::uint64_t row_begin, std::uint64_t n_rows,
                           const std::byte* weight, const float* ranges);

// The bytes a kernel wrote for rows [row_begin, row_begin + n_rows) of the
// kRows output `spec` (a scale tensor; other kinds are not checked): throws
// at the first scale that is not finite and non-zero. weight: those rows;
// ranges: the observer's, or null.
void check_row_scales(const ScaleSubject& m, const OutputTensorSpec& spec, std::uint64_t row_begin,
                      std::uint64_t n_rows, const std::byte* out, const std::byte* weight,
                      const float* ranges);

// A kWhole output (a global scale, a per-tensor scale) before it is
// written: throws when it is a scale that is not finite and non-zero.
// set_amax: the max |w| it was computed from; shared: whether fused
// partners share it.
void check_whole_scale(const ScaleSubject& m, const OutputTensorSpec& spec,
                       std::span<const std::byte> bytes, float set_amax, bool shared);

}  // namespace ctquant::detail
