// Private to verify --against-source: one chunk of rows of a quantized
// module's stored outputs against the bytes quantize writes for them
// (recomputed from the source by the family's kernel), and the stored
// scales that break the rule of scheme/scale_check.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ctquant/scheme/scheme.hpp"

namespace ctquant::detail {

// A group whose codes, scale or zero point differ from what quantize
// writes: its row, its column of groups and, for codes, the first
// differing column.
struct Mismatch {
  std::uint64_t row = 0;
  std::uint64_t group_col = 0;
  std::optional<std::uint64_t> col;
};

// What differs in a chunk's outputs.
struct OutputDiff {
  std::vector<Mismatch> mismatches;
  std::uint64_t accepted_scales = 0;  // within --scale-ulp
  std::uint64_t max_scale_ulp = 0;
};

// Rows [r0, r0 + n) of the kRows output s of a module with cols columns and
// scale groups of scale_rows x scale_cols: stored (as OUTPUT holds them)
// against ref (what quantize writes), both the bytes of those rows. Codes
// are compared as integers (the first differing column of each group),
// float scales in ulps (at most scale_ulp accepted and counted), zero points
// as unpacked integers; each differing group added to diff.
void diff_rows_output(const OutputTensorSpec& s, std::span<const std::byte> stored,
                      std::span<const std::byte> ref, std::uint64_t r0, std::uint64_t n,
                      std::uint64_t cols, std::uint64_t scale_rows, std::uint64_t scale_cols,
                      std::uint64_t scale_ulp, OutputDiff& diff);

// Stored scales that are not finite and non-zero: how many, and the first
// (its spec, element of the tensor and value as text).
struct BadScales {
  std::uint64_t count = 0;
  const OutputTensorSpec* spec = nullptr;
  std::uint64_t element = 0;
  std::string value;
};

// The scales of `spec` (kScale, kGlobalScale; other kinds are skipped) in
// `bytes`, which start at byte `first` of the tensor, that break the rule,
// added to `bad`.
void count_bad_scales(const OutputTensorSpec& spec, std::uint64_t first,
                      std::span<const std::byte> bytes, BadScales& bad);

}  // namespace ctquant::detail
