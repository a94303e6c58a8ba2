// Machine-readable reports: the JSON documents of `quantize --report FILE`
// and `quantize --json`, and the envelope that `inspect --json` and
// `verify --json` share with them.
//
// Every document is a JSON object with snake_case keys (sorted when written)
// that starts from report_envelope(): "report_version" (kReportVersion),
// "ctquant_version", "command" ("quantize", "inspect", "verify") and "argv"
// (the command line as given). The quantize report's fields are listed in
// docs/report.md and checked by the JSON Schema docs/report.schema.json;
// fields are only ever added, and a change of meaning raises
// kReportVersion.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/recipe.hpp"
#include "ctquant/report/weight_error.hpp"

namespace ctquant {

inline constexpr int kReportVersion = 1;

// {"report_version", "ctquant_version", "command", "argv"}.
nlohmann::json report_envelope(std::string_view command, const std::vector<std::string>& argv);

// Adds the envelope's fields to an existing report object (inspect_json,
// verify_json, manifest_check_json); keys it already has are kept.
nlohmann::json with_envelope(nlohmann::json report, std::string_view command,
                             const std::vector<std::string>& argv);

// Every file of a checkpoint INPUT as quantize reads it (a directory: the
// files list_checkpoint_files gives, shards, index, config.json and the
// files copied; a single .safetensors file: that file), with size and
// SHA-256, sorted by name, `threads` files at a time. Throws what
// list_checkpoint_files and sha256_file throw (when several files fail, the
// error of the first in name order).
std::vector<ManifestEntry> hash_input_files(const std::filesystem::path& input,
                                            bool follow_symlinks, unsigned threads);

// The peak resident set size of this process so far, in bytes
// (getrusage(RUSAGE_SELF).ru_maxrss, which Linux gives in KiB).
std::uint64_t peak_rss_bytes();

// The plan as the quantize report gives it: plan_json (inspect.hpp) with,
// for every input tensor, "scheme" (the scheme it is quantized with, or
// null) and "output_shard" (the output file holding what it becomes, or
// null when it is dropped). Call it where the checkpoint is at hand
// (QuantizeOptions::on_plan).
nlohmann::json report_plan_json(const Checkpoint& checkpoint, const QuantizePlan& plan);

// The plan's --transform: what config.json's ctquant_transform records
// (RewritePlan::record) with "tensors", each rewritten tensor and what was
// done to it; null when the plan has no rewrite. The "transform" of the
// quantize report and of `inspect --plan --json`.
nlohmann::json transform_json(const QuantizePlan& plan);

// What a quantize report is made of. Pointers are borrowed for the call.
struct QuantizeReportInput {
  std::vector<std::string> argv;
  const QuantizeOptions* options = nullptr;
  const EffectiveRecipe* recipe = nullptr;
  std::string recipe_yaml;  // recipe_yaml(*recipe, summary->plan)
  const QuantizeSummary* summary = nullptr;
  nlohmann::json plan;  // report_plan_json of the run's plan
  std::vector<ManifestEntry> input_files;  // hash_input_files(options->input, ...)
  double seconds_hash_inputs = 0;
  std::uint64_t peak_rss_bytes = 0;
};

// The quantize report (docs/report.md): the envelope, "dry_run", "threads",
// "input" {path, files}, "output" {path, files} (files empty for a dry
// run), "recipe" (effective_recipe_json plus "yaml"), "plan"
// (report_plan_json), "lint"
// (findings_json), "bytes_in", "bytes_out", "seconds" {open, plan, lint,
// stream, flush, manifest, commit, hash_inputs, total}, "peak_rss_bytes",
// "weight_error" (weight_error_json of the modules this run quantized),
// "observer_choice" (observer_choice_json, null without --observer auto).
nlohmann::json quantize_report_json(const QuantizeReportInput& input);

}  // namespace ctquant
