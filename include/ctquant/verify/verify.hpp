// Verification: prove what a checkpoint holds, against a golden checkpoint or
// against the source it was quantized from.
//
// verify_checkpoints() compares OUTPUT with GOLDEN, both checkpoint
// directories (sharded or not) or single .safetensors files: the tensor sets
// per shard file and overall, every tensor's dtype, shape and bytes whichever
// shard holds it (packed weights unpacked to count differing codes, scales
// compared in units in the last place), each index against its own shards
// and against the other, config.json (the quantization_config block as JSON
// values with the fields of section 5 of the format spec that readers act
// on; version, observer, observer_kwargs, global_compression_ratio and config
// group names only as notes), and every other file byte for byte or as JSON.
//
// verify_against_source() checks OUTPUT against the INPUT it was made from,
// unquantized (BF16, F16, F32) or FP8 (block FP8 or compressed-tensors
// float-quantized, section 6): each packed module is unpacked, its codes,
// scales and zero points are recomputed from the source rows (an FP8 weight's
// rows dequantized to BF16 with dequantize_fp8_rows(), as quantize does) with
// quantize_block_ref() (section 3) and compared exactly, its dequantized
// weight (q - z) * s is compared with those source rows (relative Frobenius
// error, largest absolute error), each module's fate is checked against the
// ignore list and targets written in OUTPUT's config.json (section 2), an FP8
// weight written as BF16 must be its exact dequantization, the FP8 scales
// and activation parameters the input carries must be absent, and everything
// else must be the source's bytes.
//
// Both stream tensor by tensor in chunks of about chunk_bytes per side; they
// never hold a whole checkpoint in memory. They open files read-only.
// Differences are returned in the report, never thrown; errors (a path that
// does not exist, a safetensors header that breaks section 1, an OUTPUT
// without a pack-quantized config for --against-source, an INPUT quantized in
// a way ctquant does not convert) throw ctquant::Error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/logger.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"

namespace ctquant {

struct VerifyOptions {
  // Scale values (`*.weight_scale`) that differ by at most this many units in
  // the last place are accepted and reported as notes (F32 checkpoints made on
  // a GPU may differ by one ulp). 0: scales must be bit-identical.
  std::uint64_t scale_ulp = 0;
  std::uint64_t chunk_bytes = 4u << 20;  // bytes read per side per step
  // Threads that compare chunks at once (--against-source); 0: one per
  // core. The report does not depend on it; with 1 no thread is created.
  unsigned threads = 0;
  std::shared_ptr<spdlog::logger> logger;  // debug lines; may be null
  // --against-source on an output whose transform rewrote its source
  // (`--transform rotate`): before_writing is called once before the
  // rewritten INPUT is written under the temporary directory (the only
  // files verify writes), and from then on `cancel` (when set) is polled
  // between tensors and modules: a signal ends the run with
  // Error{kInterrupted} after that directory is removed.
  const std::atomic<bool>* cancel = nullptr;
  std::function<void()> before_writing;
};

enum class VerifyMode { kGolden, kAgainstSource };

// One difference or note. kind is a stable word for scripts:
//   missing_file, extra_file, missing_tensor, extra_tensor, misplaced_tensor,
//   duplicate_tensor, dtype, shape, bytes, codes, scale, zero_point, index,
//   config, file, metadata, source, fate, layout, loadability (loadability.hpp)
struct VerifyItem {
  std::string kind;
  std::string file;    // the file concerned, relative to its checkpoint ("" if none)
  std::string tensor;  // the tensor concerned ("" if none)
  std::string message;
  nlohmann::json details = nlohmann::json::object();  // counts, first (row, column), ulps...
};

// --against-source: one packed module.
struct ModuleCheck {
  std::string module;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::uint64_t groups = 0;             // rows * groups per row
  std::uint64_t groups_mismatched = 0;  // groups whose codes, scale or zero point differ from RTN
  std::optional<std::uint64_t> first_row;  // first mismatched group
  std::optional<std::uint64_t> first_group;
  // The first column of that group whose code is not the RTN code; nullopt
  // when only its scale or zero point differs.
  std::optional<std::uint64_t> first_column;
  bool fp8_source = false;  // the source weight is FP8, W below its BF16 dequantization
  // The weight error of the stored values W' (the family's dequantize)
  // against the source rows W, computed as quant_error.hpp defines it: the
  // figures quantize reports for the module.
  double rel_frobenius = 0;  // ||W - W'||_F / ||W||_F
  double max_abs_error = 0;  // max |W - W'|
};

struct VerifyReport {
  VerifyMode mode = VerifyMode::kGolden;
  std::string output;     // as given
  std::string reference;  // GOLDEN or INPUT, as given
  std::vector<VerifyItem> differences;
  std::vector<VerifyItem> notes;
  std::size_t tensors_output = 0;     // tensors in OUTPUT
  std::size_t tensors_reference = 0;  // tensors in GOLDEN / INPUT
  std::size_t tensors_compared = 0;   // present on both sides with the same dtype and shape
  std::size_t tensors_identical = 0;  // of those, bit-identical
  std::size_t files_compared = 0;     // non-safetensors files present on both sides
  std::vector<ModuleCheck> modules;   // kAgainstSource only, in OUTPUT order
  // kAgainstSource: InputQuantization::describe() of INPUT ("unquantized",
  // "block FP8, weight_block_size [128, 128]", ...). Empty for kGolden.
  std::string input_quantization;

  bool same() const { return differences.empty(); }
};

// Compares OUTPUT with GOLDEN. Throws Error{kIo} when a path does not exist or
// a file cannot be read, Error{kBadInput} when a safetensors header breaks
// section 1 of the format spec.
VerifyReport verify_checkpoints(const std::filesystem::path& output,
                                const std::filesystem::path& golden, const VerifyOptions& options);

// Checks OUTPUT against the checkpoint INPUT it was made from (unquantized or
// FP8). Throws as verify_checkpoints(), and Error{kBadInput} when INPUT's
// quantization_config is one ctquant does not convert (the message of
// classify_input_quantization(), section 6) or OUTPUT's config.json has no
// pack-quantized int quantization_config.
VerifyReport verify_against_source(const std::filesystem::path& output,
                                   const std::filesystem::path& input,
                                   const VerifyOptions& options);

// A human summary: counts, differences and notes (at most max_listed of each
// kind, the rest counted), the per-module table for --against-source, and a
// last line "result: SAME" or "result: DIFFERENT (...)".
std::string render_verify_text(const VerifyReport& report, std::size_t max_listed = 20);

// The whole report as JSON: {"mode", "output", "reference",
// "input_quantization", "same", "summary", "differences", "notes",
// "modules"}; every item, none cut.
nlohmann::json verify_json(const VerifyReport& report);

// Distance in units in the last place between two values of a float dtype
// (BF16, F16 or F32; 16-bit patterns in the low bits) given as raw bits: the
// number of representable values between them, +0 and -0 being 0 apart.
// UINT64_MAX when either is NaN and the bits differ.
std::uint64_t ulp_distance(DType dtype, std::uint32_t bits_a, std::uint32_t bits_b);

}  // namespace ctquant
