// Function-keeping rewrites of the source weights before quantizing
// (`--transform NAME`): the rows of one registry, `transform_rows()`, one
// file per row (src/transform/balance.cpp: `balance`).
//
// A transform is planned from the headers and config.json alone
// (`TransformRow::plan`: which tensors it rewrites and how, or every reason
// it refuses the checkpoint), then derived from the weights in a pre-pass
// (`TransformRow::derive`: its scale vectors, a few per block, read row by
// row so memory stays flat). The executor and verify --against-source then
// apply it to each tensor as they read it (`apply_rewrite`), before the
// tensor is quantized or copied: element [i, j] of the tensor's [rows,
// cols] view (a 1-D tensor is one row) becomes
//     ((w * row_mul[i]) / col_div[j]) * col_mul[j]
// in double from the stored value, rounded once to the tensor's dtype (as
// tools/accuracy/transforms.py computes in float64 and casts once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

// How one input tensor is rewritten. The optional members index
// RewritePlan::scales (a vector of length rows for row_mul, cols for
// col_div and col_mul).
struct TensorRewrite {
  std::string tensor;  // input tensor name
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::optional<std::size_t> row_mul;
  std::optional<std::size_t> col_div;
  std::optional<std::size_t> col_mul;
  // What is done, for inspect --plan and --dry-run, e.g.
  // "balance: columns ÷ t (input_layernorm)".
  std::vector<std::string> what;
};

struct RewritePlan {
  std::string transform;               // the row's name ("balance")
  std::vector<TensorRewrite> tensors;  // sorted by tensor name
  // The scale vectors and their names ("model.layers.0 t(q/k/v)"); the
  // values are empty until derived.
  std::vector<std::string> scale_names;
  std::vector<std::vector<double>> scales;
  bool derived = false;
  std::uint64_t head_dim = 0;  // of the attention heads (config.json)
  // What the row records beside its name in config.json (the scale rule,
  // the rotations).
  nlohmann::json details = nlohmann::json::object();
  // A row that mixes rows of a tensor (rotate) is not applied chunk by
  // chunk: the run writes the rewritten source first (StagedSource) and
  // quantizes that. Such a plan has no scales; it lists the tensors and
  // what is done to them, for inspect --plan and --dry-run. The run that
  // reads a staged source (of any row) holds its plan with this set too:
  // apply_rewrite and derive_transform leave it as it is.
  bool staged_source = false;

  // The rewrite of an input tensor, or null.
  const TensorRewrite* find(std::string_view tensor) const;
  // What config.json's top-level `ctquant_transform` key records (the
  // transform, its scale rule and how many tensors it rewrote). Not
  // quantization_config.transform_config: vLLM validates that block with
  // compressed-tensors' TransformConfig (extra keys forbidden) and builds
  // online transforms from its config_groups
  // (vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py,
  // CompressedTensorsConfig.from_config and get_quant_method).
  nlohmann::json record() const;
};

// One transform of the registry.
struct TransformRow {
  std::string_view name;
  std::string_view help;  // one line for --help and docs
  // Which tensors are rewritten and how. Throws Error{kUsage} listing every
  // reason the checkpoint's family or layout is refused.
  RewritePlan (*plan)(const Checkpoint& checkpoint);
  // Reads the weights the scales come from and fills plan.scales. Throws
  // Error{kIo} on a failed read, Error{kBadInput} for a weight that is not
  // finite. Null for a row that writes the rewritten source instead.
  void (*derive)(const Checkpoint& checkpoint, RewritePlan& plan);
  // For a row whose plan is staged_source: writes the rewritten checkpoint
  // (every shard with the same file name, tensors in the same order plus
  // any it adds, the index, config.json with `ctquant_transform`, the other
  // files linked or copied) into the directory `dir`, which it creates.
  // with_data false writes the headers and leaves the data a hole (a dry
  // run plans from it). Throws as plan, Error{kIo} / Error{kNoSpace} on a
  // failed read or write, Error{kInterrupted} from poll_cancel().
  void (*write_source)(const Checkpoint& checkpoint, const std::filesystem::path& dir,
                       bool with_data, const RewritePlan& plan) = nullptr;
};

std::span<const TransformRow> transform_rows();
// The row named `name`; throws Error{kUsage} naming the known ones.
const TransformRow& find_transform(std::string_view name);

// The planned rewrite of `name` (refusals as TransformRow::plan).
std::shared_ptr<const RewritePlan> plan_transform(const Checkpoint& checkpoint,
                                                  std::string_view name);
// The same plan with its scales derived from the weights.
std::shared_ptr<const RewritePlan> derive_transform(const Checkpoint& checkpoint,
                                                    const RewritePlan& planned);

// A fresh path under the temporary directory (TMPDIR, else /tmp):
// "<dir>/ctquant-<tag>-<pid>-<clock>", not created. Throws Error{kUsage}
// naming TMPDIR and `purpose` (what would be written there) when there is
// no usable temporary directory.
std::filesystem::path temporary_path(std::string_view tag, std::string_view purpose);

// The directory beside OUTPUT that a quantize run writes the rewritten
// source of transform `name` into: "<parent>/.<OUTPUT's name>.ctquant-<name>"
// (a trailing slash of OUTPUT ignored).
std::filesystem::path staged_source_dir(const std::filesystem::path& output, std::string_view name);

// Why a run cannot write `dir` (staged_source_dir): "" when it can; else
// "<dir> exists ..." (left by a run that stopped) or "cannot write in
// <parent> (<errno text>)". A dry run reports it, a run refuses it.
std::string staged_source_refusal(const std::filesystem::path& dir);

// A rewritten source written into a temporary directory for a run
// (TransformRow::write_source), removed with this object.
class StagedSource {
 public:
  // Writes the rewritten source of `checkpoint` into `dir`, which must not
  // exist: plan is plan_transform of a staged_source row (its write_source
  // writes it), or the derived plan of a per-element row (each rewritten
  // tensor read in chunks and rewritten by apply_rewrite; with_data false
  // needs no scales). On any error the directory is removed and the error
  // rethrown.
  StagedSource(const Checkpoint& checkpoint, const RewritePlan& plan, std::filesystem::path dir,
               bool with_data);
  ~StagedSource();
  StagedSource(const StagedSource&) = delete;
  StagedSource& operator=(const StagedSource&) = delete;
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

// True when the transform named `name` is a staged_source row (rotate).
bool transform_stages_source(std::string_view name);

// For verify --against-source and inspect --errors: when an output's
// config.json records (`ctquant_transform`) a transform that stages its
// source, INPUT rewritten as quantize rewrote it, written under the
// system's temporary directory (as large as INPUT's tensors) and removed
// with the object; null otherwise. Throws as open_checkpoint and the row's
// plan and write_source; a refusal of INPUT by the row's plan (INPUT is
// then not OUTPUT's source) is thrown as Error{kUsage} saying so, or, when
// `refused` is given, returned there (rewrite_refusal_reason) with null.
// before_writing (may be empty) is called just before the directory is
// created.
std::unique_ptr<StagedSource> stage_source_for_output(
    const std::optional<nlohmann::json>& output_config, const std::filesystem::path& input,
    const std::function<void()>& before_writing = {}, std::string* refused = nullptr);

// A transform row's refusal (TransformRow::plan's message) without what
// speaks to a quantize run ("(nothing was written)", "fix: run without
// --transform NAME"): for verify, where it means INPUT is not the source.
std::string rewrite_refusal_reason(std::string message);

// Rewrites n elements of `rewrite`'s tensor in place, starting at element
// `first` of its row-major [rows, cols] view, stored as `dtype` (BF16, F16
// or F32). plan must be derived.
void apply_rewrite(const RewritePlan& plan, const TensorRewrite& rewrite, DType dtype,
                   std::uint64_t first, std::uint64_t n, std::byte* data);

// Rounds a double once to `dtype` (BF16, F16: round to nearest even, with
// no double rounding through float; F32: nearest), as torch's .to(dtype).
void store_rounded(DType dtype, double value, std::byte* element);

// Reads rows [row_begin, row_end) of a 2-D (or 1-D: one row) tensor of
// `checkpoint` as doubles into out ((row_end - row_begin) * cols values).
// Throws Error{kIo}.
void read_rows_as_double(const Checkpoint& checkpoint, const std::string& tensor,
                         std::uint64_t row_begin, std::uint64_t row_end, std::vector<double>& out);

}  // namespace ctquant
