// The round-to-nearest (RTN) quantization kernel: a block of weight rows in,
// packed integer codes and per-group scales (and zero points) out.
//
// Section 3 of the format spec is the contract, bit for bit: per row and group
// of G consecutive columns, the scale is computed in float32 and rounded to
// the weight's dtype T, every quotient w / s is rounded to T before it is
// rounded to an integer, and ties go to even. quantize_block_ref() is a plain
// loop that reads like the spec; quantize_block() is the fast path (SIMD when
// the CPU has it) and must produce the same bytes for every input, which the
// tests check on random and adversarial data.
//
// Kernels take raw spans, do not allocate and do not throw; the planner checks
// their preconditions once (n_cols % group_size == 0, dtype BF16/F16/F32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ctquant/format/dtype.hpp"

namespace ctquant {

// An integer RTN scheme. W4A16 is num_bits 4, symmetric, group size 128.
struct QuantScheme {
  std::string name = "W4A16";
  int num_bits = 4;           // 2..8
  bool symmetric = true;      // asymmetric schemes also write a zero point
  std::uint64_t group_size = 128;  // columns per group; 0 means one group per row (channel-wise)

  int qmin() const { return -(1 << (num_bits - 1)); }
  int qmax() const { return (1 << (num_bits - 1)) - 1; }
  // Group size for a tensor with n_cols columns.
  std::uint64_t effective_group_size(std::uint64_t n_cols) const {
    return group_size == 0 ? n_cols : group_size;
  }
};


// One block of n_rows full rows of a weight [R, n_cols].
//
// weight:      n_rows * n_cols elements of `dtype`, little-endian, row-major.
// packed:      n_rows * packed_words_per_row(n_cols, num_bits) words; row r's
//              codes q + 2^(b-1) as a dense little-endian bit stream
//              (section 4 of the format spec).
// scale:       n_rows * n_groups elements of `dtype` (raw bytes), row-major.
// zero_point:  asymmetric schemes only: n_rows * n_groups values z (not yet
//              offset by 2^(b-1) nor packed; pack_zero_points() does that).
struct KernelBlock {
  DType dtype = DType::kBF16;
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  const std::byte* weight = nullptr;
  std::uint32_t* packed = nullptr;
  std::byte* scale = nullptr;
  std::int8_t* zero_point = nullptr;
  // Per group (n_rows * n_groups): the observer's lo, hi (values of dtype)
  // the scale is computed from, or null: the group's min and max.
  const float* ranges = nullptr;
};

// 32-bit words per packed row of n_cols codes of num_bits: ceil(n_cols*b/32).
constexpr std::uint64_t packed_words_per_row(std::uint64_t n_cols, int num_bits) {
  return (n_cols * static_cast<std::uint64_t>(num_bits) + 31) / 32;
}

// Scalar reference of section 3. Returns the element index (row * n_cols +
// col, within the block) of the first NaN or infinity, in which case the
// outputs are unspecified; nullopt when every element was finite.
std::optional<std::uint64_t> quantize_block_ref(const QuantScheme& scheme,
                                                const KernelBlock& block);

// Fast path with the same contract and the same output bytes as
// quantize_block_ref(). 4- and 8-bit schemes, symmetric or asymmetric, with
// group sizes that are multiples of 8 run a vector kernel at the best
// instruction set this CPU has (checked once at run time): AVX-512 or AVX2 on
// x86-64, SVE2, SVE or NEON on AArch64; everything else runs the scalar
// reference.
std::optional<std::uint64_t> quantize_block(const QuantScheme& scheme, const KernelBlock& block);

// Name of the code path quantize_block() takes on this CPU for W4A16:
// "avx512", "avx2", "sve2_128", "sve_256", "sve2", "sve", "neon" or "scalar".
const char* kernel_path_name();

}  // namespace ctquant

namespace ctquant {

// max |w| over n elements of a BF16, F16 or F32 weight, exactly as stored
// (the amax families with a tensor-wide scale start from: schemes.md 3.1,
// 5.3). Returns the index of the first NaN or infinity, in which case amax is
// unspecified; nullopt when every element was finite.
// Runs a vector kernel at the best level this CPU has; max_abs_ref() is the
// scalar loop it is tested against.
std::optional<std::uint64_t> max_abs(DType dtype, const std::byte* data, std::uint64_t n,
                                     float& amax);
std::optional<std::uint64_t> max_abs_ref(DType dtype, const std::byte* data, std::uint64_t n,
                                         float& amax);

}  // namespace ctquant
