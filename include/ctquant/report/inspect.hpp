// Inspection: what a checkpoint holds, and what quantize would do with it.
//
// make_inventory() lists every tensor (name, dtype, shape, bytes, shard),
// totals per dtype, the element count, the config's architecture and any
// quantization_config, from headers only. render_plan_text() and plan_json()
// show a QuantizePlan: each input tensor's fate (quantize, copy, or any
// other fate the planner knows, named by fate_name()) and the rule that
// decided it, the modules each ignore and targets entry matched, and the
// expected output size. inspect_checkpoint() ties these together for
// `ctquant inspect`; `quantize --dry-run` prints the same plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

struct InventoryTensor {
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::uint64_t bytes = 0;
  std::string shard;  // file name
};

struct DTypeTotal {
  DType dtype{};
  std::size_t tensors = 0;
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
};

struct InventoryShard {
  std::string file;
  std::size_t tensors = 0;
  std::uint64_t file_bytes = 0;
};

struct Inventory {
  std::string root;
  bool has_index = false;
  std::vector<InventoryShard> shards;
  std::vector<InventoryTensor> tensors;  // sorted by name
  std::vector<DTypeTotal> by_dtype;      // in dtype table order, only dtypes present
  std::uint64_t elements = 0;            // stored elements (packed int32 words count as one each)
  std::uint64_t tensor_bytes = 0;
  std::vector<std::string> architectures;             // config.json "architectures", if any
  std::string model_type;                             // config.json "model_type", if any
  std::optional<nlohmann::json> quantization_config;  // an existing one, as stored
  std::vector<std::string> other_files;
};

// The inventory of an opened checkpoint (headers and config.json only; no
// tensor data is read). Throws nothing beyond std::bad_alloc: everything it
// reads was validated when the checkpoint was opened.
Inventory make_inventory(const Checkpoint& checkpoint);

// The inventory as text for `ctquant inspect`: one line per tensor (name,
// dtype, shape, bytes, shard), then the totals per dtype, the parameter
// count, the architecture and any existing quantization_config.
std::string render_inventory_text(const Inventory& inventory);
// The inventory as JSON: {"root", "has_index", "shards": [{file, tensors,
// file_bytes}], "tensors": [{name, dtype, shape, bytes, shard}], "by_dtype",
// "elements", "tensor_bytes", "architectures", "model_type",
// "quantization_config" (or null), "other_files"}.
nlohmann::json inventory_json(const Inventory& inventory);

// The files quantize writes for plan (plan_output_files, except the
// manifest) as manifest entries: name and size, sha256 left empty.
std::vector<ManifestEntry> expected_output_files(const Checkpoint& checkpoint,
                                                 const QuantizePlan& plan);

// Bytes of the output quantize would write for plan: the shards, the index
// and config.json as serialised, the copied files and the manifest.
std::uint64_t expected_output_bytes(const Checkpoint& checkpoint, const QuantizePlan& plan);

// The plan as text: scheme, one line per input tensor (fate, name, dtype,
// shape, rule), the modules each ignore and targets entry matched, the
// output shards and the expected output size.
std::string render_plan_text(const Checkpoint& checkpoint, const QuantizePlan& plan);

// The plan as JSON: {"scheme", "tensors": [{name, dtype, shape, bytes, shard,
// fate, rule, ignore_entry}], "counts", "ignore": [{entry, modules}],
// "targets": [...], "outputs": [{file, tensors, bytes}], "expected_output_bytes"}.
nlohmann::json plan_json(const Checkpoint& checkpoint, const QuantizePlan& plan);

struct InspectOptions {
  bool plan = false;         // also plan (and lint) with plan_options
  PlanOptions plan_options;  // scheme, ignore list, targets, as for quantize
  LintOptions lint;          // tensor-parallel degree for L5
};

struct InspectReport {
  Checkpoint checkpoint;
  Inventory inventory;
  std::optional<QuantizePlan> plan;  // when options.plan and the plan could be made
  std::vector<Finding> findings;     // lint findings of the plan
  // When options.plan but make_plan refused the input (Error{kBadInput}, e.g.
  // in_features not a multiple of the group size): its message.
  std::optional<std::string> plan_error;
};

// Opens input (see open_checkpoint) and builds the inventory and, when
// options.plan, the plan and its lint findings. Throws what open_checkpoint
// and run_lint throw, and make_plan's usage errors; make_plan's bad-input
// errors go into plan_error; lint findings are returned, never thrown.
InspectReport inspect_checkpoint(const std::filesystem::path& input, const InspectOptions& options);

// Inventory, then plan and lint findings when planned.
std::string render_inspect_text(const InspectReport& report);
// {"inventory", "plan" (or null), "lint" (findings_json, or null),
//  "plan_error" (a message, or null)}.
nlohmann::json inspect_json(const InspectReport& report);

}  // namespace ctquant
