// Reading the rows of a 2-D weight as quantize sees them, shared by the
// executor and verify --against-source.
//
// The input formats (section 6 of the format spec) differ only in how a
// weight's rows become values: plain BF16, F16 or F32 rows are read as
// stored; FP8 rows (block FP8 `weight_scale_inv`, compressed-tensors
// float-quantized `weight_scale`; which one the checkpoint is comes from
// classify_input_quantization in fp8.hpp) are read with the scale grid rows
// they use and dequantized in place to BF16 with dequantize_fp8_rows(). A
// weight is a WeightSource: all of a 2-D tensor, or one expert projection of
// a stacked 3-D tensor (its rows are contiguous in the [E * R, C] view).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/source/fp8.hpp"

namespace ctquant {

// Where an FP8 weight's scale is and how it covers the weight (section 6).
// For one expert of a stacked 3-D FP8 tensor, the expert's own [R, C] weight
// and scale grid: view_first_row is the flattened row [E*R, C] where the
// expert starts, grid_first_row the scale grid row [E*gR, gC] where its grid
// starts.
struct Fp8Source {
  TensorLocation scale;
  Fp8ScaleLayout layout;
  std::uint64_t view_first_row = 0;
  std::uint64_t grid_first_row = 0;
};

// A 2-D weight [rows, cols] read from an input tensor: all of a 2-D tensor,
// or rows [row_begin, row_begin + rows) of a stacked 3-D tensor viewed as
// [E * R, C] (one expert's gate, up or down projection).
struct WeightSource {
  TensorLocation tensor;
  std::uint64_t row_begin = 0;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  // An FP8 weight: its rows are dequantized to BF16 (section 6) when loaded.
  std::optional<Fp8Source> fp8;
};

class WeightRows {
 public:
  // Refers to checkpoint and source, which must outlive it.
  WeightRows(const Checkpoint& checkpoint, const WeightSource& source);

  // The dtype of the loaded rows: the stored one, BF16 for FP8.
  DType dtype() const;
  std::uint64_t row_bytes() const;  // of a loaded row
  std::uint64_t rows() const { return source_.rows; }
  std::uint64_t cols() const { return source_.cols; }
  bool is_fp8() const { return source_.fp8.has_value(); }

  // Bytes of the scale grid rows that weight rows [row_begin, row_end) use
  // (0 unless FP8): the size `scales` must have for load().
  std::uint64_t scale_bytes(std::uint64_t row_begin, std::uint64_t row_end) const;

  // The file and byte range of the stored rows [row_begin, row_end), for
  // read-ahead.
  struct FileRange {
    const SafetensorsFile* file = nullptr;  // of the checkpoint
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  FileRange stored_range(std::uint64_t row_begin, std::uint64_t row_end) const;

  // Loads rows [row_begin, row_end) into out (at least
  // (row_end - row_begin) * row_bytes() bytes). An FP8 chunk's codes are read
  // into the second half of out and dequantized in place; its scale grid rows
  // are read into scales (scale_bytes(...) bytes). Returns the index within
  // the chunk of the first FP8 value that is not finite once dequantized
  // (section 6; out is then unspecified), nullopt otherwise. Throws
  // Error{kIo} when a read fails.
  std::optional<std::uint64_t> load(std::uint64_t row_begin, std::uint64_t row_end,
                                    std::span<std::byte> out, std::span<std::byte> scales) const;

  // The two steps of load() for an FP8 weight, for a caller that dequantizes
  // a chunk band by band into a cache-sized buffer instead of in place.
  // read_fp8() reads the codes of rows [row_begin, row_end) into codes
  // ((row_end - row_begin) * cols() bytes) and their scale grid rows into
  // scales (scale_bytes(row_begin, row_end) bytes); throws Error{kIo}.
  // dequantize_fp8_band() turns rows [band_begin, band_end) of that chunk
  // (row_begin <= band_begin < band_end <= row_end) into BF16 in out
  // ((band_end - band_begin) * row_bytes() bytes), the same bits load()
  // gives; it returns the index within the band of the first value that is
  // not finite, nullopt otherwise. Both require is_fp8().
  void read_fp8(std::uint64_t row_begin, std::uint64_t row_end, std::span<std::byte> codes,
                std::span<std::byte> scales) const;
  std::optional<std::uint64_t> dequantize_fp8_band(std::uint64_t row_begin,
                                                   std::uint64_t band_begin,
                                                   std::uint64_t band_end,
                                                   const std::byte* codes,
                                                   const std::byte* scales,
                                                   std::span<std::byte> out) const;

  // "shard: tensor 'name': element [i, j]" (for a split expert, the element
  // of the stored 3-D tensor, [e, i, j]) of the weight's row and column,
  // for messages.
  std::string element(std::uint64_t row, std::uint64_t col) const;
  // Why the FP8 value at [row, col] is not finite: "is code 0x7F, which is
  // nan in F8_E4M3", or its code times its scale. Reads the element again.
  std::string describe_fp8(std::uint64_t row, std::uint64_t col) const;

 private:
  const Checkpoint& checkpoint_;
  const WeightSource& source_;
};

}  // namespace ctquant
