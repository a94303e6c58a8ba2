// Private: the scalar steps of the MSE observer's search that the reference
// and the vector kernel share (src/scheme/observer.cpp,
// src/scheme/observer_simd.cpp): one candidate's scale and zero point
// (compressed-tensors `calculate_qparams`, `quantization/utils/helpers.py`),
// one element's fake quantization (`_quantize_dequantize`,
// `quantization/lifecycle/forward_helpers.py`), PyTorch's pow table and its
// CPU cascade sum (aten/src/ATen/native/cpu/SumKernel.cpp, AVX-512 widths).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <bit>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/minifloat.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/microscale.hpp"

namespace ctquant::detail {

// compressed-tensors `should_generate_mx_scales`: float weights of 4 or 8
// bits in groups of 32 with uint8 scales. NVFP4 (tensor_group) searches
// with scale_dtype cleared, so it never is.
inline bool is_mx(const QuantArgs& a) {
  return a.type == QuantArgs::Type::kFloat && (a.num_bits == 4 || a.num_bits == 8) &&
         a.strategy == QuantArgs::Strategy::kGroup && a.group_size == 32 &&
         a.scale_dtype == DType::kU8;
}

// |x|^norm in W for each magnitude of W (BF16/F16 bits without the sign).
struct PowTable {
  std::array<std::uint16_t, 0x8000> bits{};
  std::array<float, 0x8000> value{};
};
const PowTable& pow_table(DType w, double norm);

// One candidate's qparams: scale s (a value of W), zero point z (asymmetric
// int), the clamp range and the element type.
struct Candidate {
  enum class Kind : std::uint8_t { kInt, kFp8, kFp4 };
  Kind kind = Kind::kInt;
  bool asymmetric = false;
  float s = 1.0f;
  float z = 0.0f;
  float qmin = 0.0f;
  float qmax = 0.0f;
};

inline Candidate candidate(const QuantArgs& args, DType w, float lo, float hi) {
  Candidate c;
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  if (args.type == QuantArgs::Type::kInt) {
    c.kind = Candidate::Kind::kInt;
    c.qmin = -static_cast<float>(1 << (args.num_bits - 1));
    c.qmax = static_cast<float>((1 << (args.num_bits - 1)) - 1);
  } else if (args.num_bits == 8) {
    c.kind = Candidate::Kind::kFp8;
    c.qmin = -448.0f;
    c.qmax = 448.0f;
  } else {
    c.kind = Candidate::Kind::kFp4;
    c.qmin = -6.0f;
    c.qmax = 6.0f;
  }
  const float bit_range = c.qmax - c.qmin;
  if (!args.symmetric) {
    // As the int kernels' asymmetric_scale (kernel_steps.hpp): zero point
    // before the eps substitution; a zero-range group gets z = 0.
    c.asymmetric = true;
    c.s = round_to_dtype(w, round_to_dtype(w, hi - lo) / bit_range);
    if (c.s != 0.0f) {
      const float shifted = round_to_dtype(w, c.qmin - round_to_dtype(w, lo / c.s));
      c.z = std::nearbyint(std::clamp(shifted, c.qmin, c.qmax));
    }
    if (c.s == 0.0f) c.s = dtype_eps(w);
    return c;
  }
  const float amax = std::max(-lo, hi);
  if (is_mx(args)) {
    c.s = microscale::mx_scale(w, amax, args.num_bits == 4 ? microscale::kMxfp4Offset
                                                           : microscale::kMxfp8Offset)
              .scale;
    return c;
  }
  c.s = round_to_dtype(w, amax / (bit_range / 2.0f));
  if (c.s == 0.0f) c.s = dtype_eps(w);
  return c;
}

// The dequantized value of x (a value of W) under candidate c:
// v = round_W(x / s) (+ z, rounded to W), clamped, rounded to the grid
// (int: half to even; FP8 E4M3; FP4 E2M1), times s in W.
inline float fake_quantize(const Candidate& c, const QuantArgs&, DType w, float x) {
  float v = round_to_dtype(w, x / c.s);
  if (c.asymmetric) v = round_to_dtype(w, v + c.z);
  v = std::clamp(v, c.qmin, c.qmax);
  float q = 0.0f;
  switch (c.kind) {
    case Candidate::Kind::kInt:
      q = std::nearbyint(v);
      if (c.asymmetric) return round_to_dtype(w, round_to_dtype(w, q - c.z) * c.s);
      break;
    case Candidate::Kind::kFp8:
      q = f8_e4m3_to_float(float_to_f8_e4m3(v));
      break;
    case Candidate::Kind::kFp4:
      q = e2m1_to_float(e2m1_code(v));
      break;
  }
  return round_to_dtype(w, q * c.s);
}

// ---- PyTorch's CPU sum of a contiguous inner dimension (cascade_sum) ----

// utils::CeilLog2 (aten/src/ATen/native/cpu/utils.h).
inline std::int64_t ceil_log2(std::int64_t x) {
  if (x <= 2) return 1;
  return 64 - std::countl_zero(static_cast<std::uint64_t>(x - 1));
}

// multi_row_sum with nrows = 4 accumulators of type A (a float or a vector
// of 8 floats), load(i, k) giving item 4 i + k of the row.
template <typename A, typename Load>
std::array<A, 4> multi_row_sum(std::int64_t size, const Load& load) {
  constexpr int kLevels = 4;
  const std::int64_t level_power = std::max<std::int64_t>(4, ceil_log2(size) / kLevels);
  const std::int64_t level_step = std::int64_t{1} << level_power;
  const std::int64_t level_mask = level_step - 1;
  std::array<std::array<A, 4>, kLevels> acc{};
  std::int64_t i = 0;
  for (; i + level_step <= size;) {
    for (std::int64_t j = 0; j < level_step; ++j, ++i) {
      for (int k = 0; k < 4; ++k) acc[0][k] += load(i, k);
    }
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < 4; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = A{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i) {
    for (int k = 0; k < 4; ++k) acc[0][k] += load(i, k);
  }
  for (int j = 1; j < kLevels; ++j) {
    for (int k = 0; k < 4; ++k) acc[0][k] += acc[j][k];
  }
  return acc[0];
}

// row_sum: 4 interleaved partial sums of `size` items, then the tail, then
// the partials in order.
template <typename A, typename Load>
A row_sum(std::int64_t size, const Load& load) {
  const std::int64_t size_ilp = size / 4;
  std::array<A, 4> partial =
      multi_row_sum<A>(size_ilp, [&](std::int64_t i, int k) { return load(4 * i + k); });
  for (std::int64_t i = size_ilp * 4; i < size; ++i) partial[0] += load(i);
  for (int k = 1; k < 4; ++k) partial[0] += partial[k];
  return partial[0];
}

// The float lanes of PyTorch's vectors when it sums: 8. SumKernel.cpp
// registers sum_stub with REGISTER_DISPATCH, which on x86-64 gives the
// AVX-512 build no kernel (aten/src/ATen/native/DispatchStub.h: "dispatches
// an AVX512 kernel to nullptr"), so an AVX-512 CPU runs the AVX2 kernel:
// Vectorized<float> holds 8 floats, Vectorized<BFloat16> and <Half> 16
// elements (the DEFAULT build has the same 32-byte vectors).
inline constexpr std::size_t kSumLanes = 8;

template <typename T>
struct Lanes {
  std::array<T, kSumLanes> v{};
  Lanes& operator+=(const Lanes& o) {
    for (std::size_t l = 0; l < kSumLanes; ++l) v[l] += o.v[l];
    return *this;
  }
};

// The sum of n values of W, leaf(k) giving value k as a T (a float, or a
// SumSymbol recording the additions), in the order `torch.sum` adds them
// over the last, contiguous dimension on an x86-64 CPU (vectorized_inner_sum
// in SumKernel.cpp with the vector widths above). n >= the vector width
// (16 elements for BF16 and F16, 8 for F32): the row as vectors summed by
// row_sum, each vector loaded as 8 float lanes (BF16 and F16:
// InnerSumCastLoadPolicy's load_to_float gives elements 0-7 and 8-15 as two
// float vectors and adds them, so lane l is element l plus element l + 8;
// F32: one element per lane), then 0 plus the scalar tail, then the 8 lanes
// in order; shorter rows: row_sum over the scalars. Not rounded to W.
template <typename T, typename Leaf>
T torch_sum_order(DType w, std::size_t n, const Leaf& leaf) {
  const std::int64_t width = w == DType::kF32 ? kSumLanes : 2 * kSumLanes;
  if (static_cast<std::int64_t>(n) < width) {
    return row_sum<T>(static_cast<std::int64_t>(n),
                      [&](std::int64_t item) { return leaf(static_cast<std::size_t>(item)); });
  }
  const std::int64_t vec_size = static_cast<std::int64_t>(n) / width;
  const Lanes<T> lanes = row_sum<Lanes<T>>(vec_size, [&](std::int64_t item) {
    Lanes<T> out;
    const auto base = static_cast<std::size_t>(item * width);
    for (std::size_t l = 0; l < kSumLanes; ++l) {
      out.v[l] = leaf(base + l);
      if (w != DType::kF32) out.v[l] += leaf(base + kSumLanes + l);
    }
    return out;
  });
  T acc{};
  for (auto k = static_cast<std::size_t>(vec_size * width); k < n; ++k) acc += leaf(k);
  for (std::size_t l = 0; l < kSumLanes; ++l) acc += lanes.v[l];
  return acc;
}

// The sum of n values of W (as floats), rounded to W, as torch.sum gives it.
inline float torch_sum(DType w, const float* x, std::size_t n) {
  return round_to_dtype(w, torch_sum_order<float>(w, n, [&](std::size_t k) { return x[k]; }));
}

// The additions of torch_sum_order as a program over slots: slots 0 .. n-1
// hold the values, each step writes slots[dst] = slots[a] + slots[b] (a
// first, as the float additions), the result is slots[result] (-1: zero).
// Additions of a zero are dropped: 0 + x and x + 0 are x for the
// non-negative values summed here.
struct SumStep {
  std::uint32_t dst = 0;
  std::uint32_t a = 0;
  std::uint32_t b = 0;
};
struct SumProgram {
  std::vector<SumStep> steps;
  std::uint32_t slots = 0;
  std::int64_t result = -1;
};
const SumProgram& torch_sum_program(DType w, std::size_t n);

// The scale groups of a chunk and how to read one.
struct GroupLayout {
  QuantArgs::Strategy strategy{};
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  std::uint64_t group = 0;  // group: columns per group; block: height
  std::uint64_t width = 0;  // block width
  std::uint64_t per_row = 0;  // groups along a row (group) or block columns
  std::uint64_t n_groups = 0;

  // The group's values as floats, in the library's flattened order.
  void gather(std::uint64_t g, const std::byte* weight, std::size_t esize, DType w,
              std::vector<float>& x) const {
    const auto at = [&](std::uint64_t r, std::uint64_t c) {
      return load_as_float(w, weight + (r * n_cols + c) * esize);
    };
    if (strategy == QuantArgs::Strategy::kBlock) {
      const std::uint64_t r0 = g / per_row * group;
      const std::uint64_t c0 = g % per_row * width;
      x.assign(group * width, 0.0f);
      for (std::uint64_t r = r0; r < std::min(r0 + group, n_rows); ++r) {
        for (std::uint64_t c = c0; c < std::min(c0 + width, n_cols); ++c) {
          x[(r - r0) * width + (c - c0)] = at(r, c);
        }
      }
      return;
    }
    const std::uint64_t r = g / per_row;
    const std::uint64_t c0 = g % per_row * group;
    x.resize(group);
    for (std::uint64_t c = 0; c < group; ++c) x[c] = at(r, c0 + c);
  }
};

inline GroupLayout group_layout(const QuantArgs& args, std::uint64_t n_rows,
                                std::uint64_t n_cols) {
  GroupLayout l;
  l.strategy = args.strategy;
  l.n_rows = n_rows;
  l.n_cols = n_cols;
  switch (args.strategy) {
    case QuantArgs::Strategy::kGroup:
    case QuantArgs::Strategy::kTensorGroup:
      l.group = args.group_size;
      l.per_row = n_cols / args.group_size;
      l.n_groups = n_rows * l.per_row;
      break;
    case QuantArgs::Strategy::kBlock:
      l.group = args.block[0];
      l.width = args.block[1];
      l.per_row = (n_cols + args.block[1] - 1) / args.block[1];
      l.n_groups = (n_rows + args.block[0] - 1) / args.block[0] * l.per_row;
      break;
    default:  // channel (tensor is refused for MSE; min-max treats it per row)
      l.group = n_cols;
      l.per_row = 1;
      l.n_groups = n_rows;
      break;
  }
  return l;
}

struct SimdLevel;

// Whether the vector search at `level` computes BF16 |x|^norm from tables
// in vector registers (observer_simd.cpp, PowRegTables) rather than a
// gather from pow_table: `used` when the level has that path and, for every
// finite BF16 magnitude it does not flag (`flagged` of them, which take
// pow_table), it gives pow_table's value.
struct PowRegCheck {
  bool used = false;
  std::uint32_t flagged = 0;
};
PowRegCheck pow_reg_check_at(const SimdLevel& level, double norm);

// The vector search (observer_simd.cpp) at `level`; false when it does not
// cover these args or this dtype (F32, channel and block strategies) or the
// CPU lacks the level: the caller then runs observe_ranges_ref.
bool observe_ranges_at(const SimdLevel& level, const QuantArgs& args,
                       const ObserverParams& params, std::uint32_t cutoff, const ObserveIo& io,
                       ImprovedSteps* improved);

// The int codes, scales and zero points of n_rows rows of integer weights
// whose groups of `group` columns (the whole row for channel) take the
// observer's ranges, by vector code at `level`: the bytes quantize_block_ref
// gives with KernelBlock::ranges. Exactly one of codes (one int8 per
// weight, not packed) and packed (4- or 8-bit codes packed into int32 words,
// section 4, packed_words_per_row words per row) is given. False when the
// level or the args are not covered (group a multiple of 16 and dividing
// n_cols; packed: 4 or 8 bits).
bool int_codes_from_ranges_at(const SimdLevel& level, const QuantArgs& args, DType w,
                              std::uint64_t n_rows, std::uint64_t n_cols, std::uint64_t group,
                              const std::byte* weight, const float* ranges, std::int8_t* codes,
                              std::uint32_t* packed, std::byte* scale, std::int8_t* zero_point);

}  // namespace ctquant::detail
