// Input formats quantized by other tools, converted losslessly into
// compressed-tensors (docs/converters.md): the converter registry.
//
// A converter is one row (`SourceConverter`) and one file
// (src/source/convert_<name>.cpp), following compressed-tensors 0.18's own
// converters (src/compressed_tensors/entrypoints/convert/converters/):
// `detect` reads the input's own config (config.json's quantization_config,
// hf_quant_config.json) and says whether the input is in its format,
// refusing a variant it does not convert; `plan` names, module by module,
// the input tensors each converted module consumes and the output tensors
// it writes (name, dtype, shape and how each is made from its inputs);
// `produce` makes one output tensor's bytes from its inputs' bytes. The
// planner (plan/plan.hpp) gives the consumed tensors the fate "convert";
// the executor runs each output tensor as one job (exec/executor.hpp).
// Nothing is requantized: every converted value is the source's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

// How an output tensor of a converted module is made. kRename and
// kConstant are shared; a converter numbers its own operations from
// kFirstConverterOp.
inline constexpr int kRenameOp = 0;    // the bytes of inputs[0], unchanged (a copy)
inline constexpr int kConstantOp = 1;  // `constant`, made at plan time (e.g. weight_shape)
inline constexpr int kFirstConverterOp = 2;

// The most input tensors one output tensor is made from (every converter
// op reads one).
inline constexpr std::size_t kMaxConverterInputs = 4;

// One output tensor of a converted module.
struct ConvertedTensor {
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::uint64_t byte_size = 0;
  int op = kRenameOp;
  std::vector<TensorLocation> inputs;  // the input tensors it is made from, in the op's order
                                       // (at most kMaxConverterInputs)
  std::vector<std::byte> constant;     // kConstantOp: the tensor's bytes
};

// A module the converter rewrites: its input tensors are consumed (not
// copied) and its outputs are written into the shard of `primary` (where
// compressed-tensors' convert_file writes them: the shard of the tensor
// whose job fetched the dependencies).
struct ConvertedModule {
  std::string name;
  TensorLocation primary;                // AWQ: X.qweight; ModelOpt: X.weight
  std::vector<TensorLocation> consumed;  // every input tensor it replaces, primary included
  std::vector<ConvertedTensor> outputs;
  std::uint64_t params = 0;  // out_features x in_features of the weight it stands for
};

struct SourceConverter;

// What `detect` found: the converter and its arguments as compressed-tensors'
// converter takes them.
struct SourceFormat {
  const SourceConverter* converter = nullptr;
  std::string description;           // for logs, e.g. "AutoAWQ GEMM, 4 bits, group 128, zero point"
  std::vector<std::string> targets;  // the converter's targets (config_group_0's)
  std::vector<std::string> ignore;   // the converter's ignore list (written to config.json)
  // config_group_0 as create_config() writes it, targets included.
  nlohmann::json group;
  nlohmann::json kv_cache_scheme;  // null, or QuantizationArgs filled out
  nlohmann::json params;           // the converter's own (AWQ: zero_point, group_size)
};

// What the caller may set instead of what detect derives (the arguments
// compressed-tensors' converters take: targets, ignore).
struct ConvertOptions {
  std::optional<std::vector<std::string>> targets;
  std::optional<std::vector<std::string>> ignore;
};

// One input format (a row of the registry).
struct SourceConverter {
  std::string_view name;    // in plans and summaries: "convert (AWQ)"
  std::string_view source;  // the compressed-tensors file whose rules it follows
  // nullopt when the checkpoint is not in this format. Throws
  // Error{kUnsupported} for a variant of the format that is not converted
  // (naming the file, the key and the rule), Error{kUsage} for options that
  // do not apply.
  std::optional<SourceFormat> (*detect)(const Checkpoint& checkpoint,
                                        const ConvertOptions& options);
  // The converted modules, in input order. Each problem of the input
  // (missing or unexpected tensors, wrong dtypes or shapes) is appended to
  // `problems`, naming the shard, the tensor and the rule.
  std::vector<ConvertedModule> (*plan)(const Checkpoint& checkpoint, const SourceFormat& format,
                                       std::vector<std::string>& problems);
  // The bytes of output tensor t (its op >= kFirstConverterOp) from the
  // bytes of t.inputs, in order, into out (t.byte_size bytes).
  void (*produce)(const ConvertedTensor& t, std::span<const std::span<const std::byte>> inputs,
                  std::span<std::byte> out);
  // Dequantizes a converted module's stored source tensors to F32 [out, in]
  // row-major (verify --against-source): `inputs` are the bytes of the
  // module's consumed tensors, in ConvertedModule::consumed order. Returns
  // false when it cannot (the caller reports the module as not checked).
  bool (*dequantize_source)(const Checkpoint& checkpoint, const ConvertedModule& module,
                            std::span<const std::vector<std::byte>> inputs, std::vector<float>& out,
                            std::uint64_t& rows, std::uint64_t& cols);
  bool lossless = true;  // nothing requantized (the summary says so)
};

// The rows, in detection order: AutoAWQ GEMM (convert_awq.cpp), ModelOpt
// NVFP4 (convert_modelopt.cpp).
const std::vector<const SourceConverter*>& source_converters();

// The format of the input as its config says, or nullopt for an input no
// converter takes (unquantized, FP8: plan/plan.hpp's own rules).
std::optional<SourceFormat> detect_source_format(const Checkpoint& checkpoint,
                                                 const ConvertOptions& options);

// Output tensor t's bytes from its inputs' bytes: kRenameOp and kConstantOp
// here, the rest by its converter.
void produce_converted(const SourceConverter& converter, const ConvertedTensor& t,
                       std::span<const std::span<const std::byte>> inputs,
                       std::span<std::byte> out);

// The output's quantization_config when some modules are converted:
// compressed-tensors' create_config() of the converter with "version", and,
// when `new_block` (the quantization_config of the groups this run
// quantizes with, format/config.hpp) has groups, merged into it as
// llm-compressor's model_free_ptq(converter=...) merges them
// (QuantizationConfig.merge, quant_config.py: new groups appended under
// unique names, the converter's literal ignore entries that a new target
// matches pruned, the run's ignore list not carried, kv_cache_scheme the
// converter's, format "mixed-precision" when the groups' formats differ,
// "transform_config": {}). `keep_ignore` are entries of the run's ignore
// list that ctquant adds back because a new group's targets would
// otherwise take a module the run kept (the library drops them and writes
// a config vLLM reads wrong, docs/converters.md). `lifted` are entries of
// the converter's ignore list left out because a new group's name or `re:`
// target quantizes a module they match (QuantizePlan::lifted_convert_ignore).
// The names the groups this run quantizes with get in that merged config:
// each of `names` in sorted order (the order of new_block's groups), made
// unique against the converter's "config_group_0" and the names given
// before it (compressed-tensors' find_unique_name: a taken "base_N" becomes
// "base_{N+1}"). The plan renames its groups with this, so the summary and
// the report name each group as config.json does.
std::map<std::string, std::string> merged_group_names(const std::vector<std::string>& names);

nlohmann::json converted_quantization_config(const SourceFormat& format,
                                             const nlohmann::json& new_block,
                                             const std::vector<std::string>& keep_ignore,
                                             const std::vector<std::string>& lifted = {});

// Shared by the rows: the JSON file `name` of the checkpoint's directory
// (hf_quant_config.json), if it is one of its files.
std::optional<nlohmann::json> read_side_json(const Checkpoint& checkpoint, const std::string& name);

}  // namespace ctquant
