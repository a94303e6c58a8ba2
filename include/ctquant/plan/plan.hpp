// The quantization plan: every output tensor's name, dtype, shape, byte size,
// file and offset, decided before any tensor data is read.
//
// make_plan() is pure: it reads only headers (already validated by
// open_checkpoint), config.json and the options. It classifies the input's
// quantization (unquantized, block FP8 or compressed-tensors FP8, section 6
// of the format spec; anything else is refused), applies section 2 of the
// format spec to decide each input tensor's fate and the rule that decided
// it (an FP8 weight is judged as the BF16 weight it dequantizes to), splits
// stacked 3-D expert tensors into one 2-D weight per expert and projection
// (schemes.md section 8), assigns every quantized weight to the first scheme
// group whose targets match it (schemes.md 9.3), computes its output tensors
// from the group's scheme family (scheme/registry.hpp), lays out every
// output shard (section 5: same file names, tensors sorted by name) and
// builds the output index and config.json. Because the plan holds each
// output header, the executor writes headers first and then streams data,
// and `--dry-run` costs nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/targets.hpp"
#include "ctquant/model/roles.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/source/converter.hpp"
#include "ctquant/source/fp8.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "ctquant/transform/transform.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

// Largest row, in bytes, of a weight to quantize (16M BF16 columns, far
// above any real in_features): the executor keeps whole rows in memory.
inline constexpr std::uint64_t kMaxWeightRowBytes = 32u << 20;

// What happens to one input tensor.
enum class Fate {
  kCopy,        // written unchanged under the same name
  kQuantize,    // replaced by its scheme's output tensors (weight_packed, weight_scale, ...)
  kDequantize,  // an FP8 weight not quantized: written as a BF16 .weight (section 6)
  kDrop,        // not written: an FP8 weight's scale (consumed by its dequantization) or an
                // activation / KV-cache parameter of an FP8 input (kActivationParams)
  kSplit,       // a stacked 3-D expert tensor: written as one 2-D weight per expert and
                // projection, each quantized or kept in 16 bits (schemes.md 8)
  kConvert,     // a tensor of a module quantized by another tool (AWQ, ModelOpt NVFP4):
                // consumed by its converter, which writes the module's outputs
                // (source/converter.hpp, QuantizePlan::converted)
};

const char* fate_name(Fate fate);

// One scheme group of the output config (compressed-tensors
// QuantizationScheme under config_groups): a module is quantized with the
// first group whose targets match it.
struct SchemeGroup {
  std::string name;  // config_groups key
  std::vector<std::string> targets{"Linear"};
  QuantArgs weights;
  nlohmann::json input_activations;  // null, or the (dynamic) activations block

  // The family compressed-tensors infers for this scheme, or nullptr.
  const SchemeFamily* family() const;
};

// The group a preset gives, keyed by the preset's name as written (as
// model_free_ptq keys it, schemes.md 9.1), targets ["Linear"]. Throws
// Error{kUsage} for an unknown preset, listing the known ones.
SchemeGroup preset_group(const std::string& preset);

// A weight the plan writes as its own module: a whole 2-D .weight, or one
// expert projection of a split stacked tensor.
struct PlannedModule {
  enum class Kind {
    kQuantize,    // the group's output tensors
    kDequantize,  // an FP8 weight written as a BF16 M.weight
    kSlice,       // a split expert projection kept in 16 bits: its bytes copied to M.weight
  };
  std::string name;  // module name (tensor name without ".weight")
  std::size_t decision = 0;
  WeightSource source;
  Kind kind = Kind::kQuantize;
  std::size_t group = 0;                    // kQuantize: index into PlanOptions::groups
  std::string rule;                         // why it is quantized or kept
  std::optional<std::size_t> ignore_entry;  // the ignore entry that kept it, if any
  // kQuantize with a family that needs_tensor_amax: index into
  // QuantizePlan::amax_sets (the modules that share one amax).
  std::optional<std::size_t> amax_set;
  std::size_t shard = 0;       // output shard (the input tensor's shard)
  DType dtype = DType::kBF16;  // of the rows once loaded (BF16 for FP8)
};

// The decision for one input tensor, in input order (shard by shard, data order).
struct TensorDecision {
  std::string name;
  std::string module;  // name up to the last dot ("" when there is none)
  TensorLocation source;
  Fate fate = Fate::kCopy;
  std::string rule;  // why, e.g. "ignored by 're:.*qkv_proj$'" or "2-D BF16 .weight in targets"
  std::optional<std::size_t> ignore_entry;  // the ignore entry that matched, if any
  bool selectable = false;  // passed rules 1-4 and 6: the ignore list and targets decided
  // kQuantize, kDequantize, kSplit: the modules written from it.
  std::vector<std::size_t> modules;
  // An FP8 weight (fate kQuantize, kDequantize or kSplit): its scale.
  std::optional<Fp8Source> fp8;
  // kConvert: index into QuantizePlan::converted.
  std::optional<std::size_t> converted;
};

struct PlannedTensor {
  enum class Source {
    kCopy,    // the input tensor of `decision`, copied
    kModule,  // an output of `module`: the family's outputs()[output], or its 16-bit weight
    // output `output` of converted module `converted` (source/converter.hpp)
    kConvert,
  };
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::uint64_t byte_size = 0;
  std::uint64_t offset = 0;  // in the data buffer of its shard
  Source source = Source::kCopy;
  std::size_t decision = 0;  // index into QuantizePlan::decisions
  std::size_t module = 0;    // kModule: index into QuantizePlan::modules
  // kModule: index into the family's outputs() of the module; nullopt for
  // the M.weight of a kDequantize or kSlice module.
  std::optional<std::size_t> output;
  std::size_t converted = 0;  // kConvert: index into QuantizePlan::converted
};

struct ShardPlan {
  std::string file_name;  // same as the input shard
  std::size_t input_shard = 0;
  std::vector<PlannedTensor> tensors;  // sorted by name == data order
  std::string header;                  // bytes to write at offset 0 (length prefix, JSON, padding)
  std::uint64_t data_start = 0;
  std::uint64_t file_size = 0;
};

// The targets used when none are given: every Linear module.
inline const std::vector<std::string> kDefaultTargets{"Linear"};

struct PlanOptions {
  // Tried in order; a module goes to the first group whose targets match it
  // (schemes.md 9.3). Default: W4A16 on every Linear.
  std::vector<SchemeGroup> groups{preset_group("W4A16")};
  // Entries added to the default ignore list (never replacing one of it);
  // the list applies to every group.
  std::vector<std::string> ignore;
  // Start from the default ignore list of the module roles (roles.hpp:
  // embeddings, output heads, routers, shared-expert gates, modules vLLM
  // builds unquantized, draft modules vLLM reads as 16-bit weights, stacked
  // experts vLLM loads only stacked, vision/audio towers and projectors).
  // False: the ignore list is `ignore` alone (--no-default-ignore).
  bool default_ignore = true;
  // Quantize vision/audio towers and projectors like the language model
  // (--quantize-vision); their plain modules stay in the default list.
  bool quantize_vision = false;
  // Which group a module the targets of several groups match goes to
  // (format/targets.hpp): kFirstGiven, model_free_ptq's rule, for groups
  // in the order the user gave them (quantize); kAsRead, the group
  // compressed-tensors gives it, for groups read back from a written
  // config.json, whose order is not the one they were given in (verify
  // --against-source). Where the readers disagree, the plan records it
  // (QuantizePlan::group_conflicts).
  enum class GroupRule { kFirstGiven, kAsRead };
  GroupRule group_rule = GroupRule::kFirstGiven;
  // Whether the groups were asked for (--scheme, --scheme-for,
  // --quantization-config, a recipe) rather than the default W4A16. An input
  // a converter takes (source/converter.hpp) is then only converted: its
  // 16-bit modules are quantized only when a scheme was given.
  bool scheme_given = true;
  // The converter's targets and ignore list, instead of those it derives
  // from the input's config (compressed-tensors' converter arguments).
  ConvertOptions convert;
  // A function-keeping rewrite applied to the source before quantizing
  // (transform/transform.hpp; --transform NAME); empty: none.
  std::string transform;
};

// A quantized module that the readers of config.json give different scheme
// groups (GroupTargets::resolve): the output would be read with a scheme
// other than the one its tensors were written with.
struct GroupConflict {
  std::string module;
  std::string tensor;  // the input tensor it is read from
  GroupResolution groups;
};

struct QuantizePlan {
  // The options, with options.ignore the ignore list written to config.json:
  // the default entries first (unless default_ignore is false), then the
  // given entries not already in it.
  PlanOptions options;
  RoleAnalysis roles;  // every weight's role (roles.hpp)
  // Why each entry of options.ignore is there: the default entries' reasons,
  // "--ignore" for the given ones.
  std::vector<std::string> ignore_reasons;
  // For each default entry of options.ignore, the modules it keeps (the
  // roles it was made for; ignore_matches counts only modules section 2
  // could quantize, so an embedding's entry matches none there).
  std::vector<std::vector<std::string>> ignore_keeps;
  std::size_t n_default_ignore = 0;      // options.ignore[0, n) are default entries
  InputQuantization input_quantization;  // what the input's quantization_config says
  std::vector<TensorDecision> decisions;
  std::vector<PlannedModule> modules;
  // Modules whose family needs max |w| before quantizing (NVFP4 global
  // scales, per-tensor FP8 scales), in sets that share one amax: fused
  // partners (q/k/v, gate/up) under NVFP4, each module alone otherwise.
  std::vector<std::vector<std::size_t>> amax_sets;
  std::vector<ShardPlan> shards;
  nlohmann::json index;   // output model.safetensors.index.json (always written)
  nlohmann::json config;  // output config.json
  std::vector<std::string> copied_files;
  // For each ignore entry, the modules it matched among the modules whose
  // .weight passed rules 1-4 and 6 of section 2 (the ones it could affect;
  // an FP8 weight counts as the BF16 weight it dequantizes to).
  std::vector<std::vector<std::string>> ignore_matches;
  // For each group, for each of its targets entries, the modules it matched
  // among the same modules (whether or not an ignore entry or an earlier
  // group then took them).
  std::vector<std::vector<std::vector<std::string>>> target_matches;
  // For each group, how many modules it quantizes. config.json lists only
  // the groups that quantize a module (plan_quantization_config).
  std::vector<std::size_t> group_modules;
  // The quantized modules the readers give different groups, in input
  // order (lint L11 reports them; verify --against-source too).
  std::vector<GroupConflict> group_conflicts;
  // The input's format when a converter takes it (source/converter.hpp),
  // and the modules it converts, in input order.
  std::optional<SourceFormat> source_format;
  std::vector<ConvertedModule> converted;
  // Entries of source_format->ignore left out of the written config: a new
  // group's name or `re:` target quantizes a module they match (the
  // converter's ignore list keeps a module only from a "Linear" target).
  std::vector<std::string> lifted_convert_ignore;
  // The 16-bit modules the converter's ignore entries keep: where an entry
  // is lifted, the modules it kept are written into config.json's ignore
  // list by exact name (they stay 16-bit; the converter's target would
  // otherwise take them in vLLM).
  std::vector<std::string> converter_kept_modules;

  std::size_t n_quantized = 0;    // weights quantized (split experts counted one by one)
  std::size_t n_copied = 0;       // input tensors copied
  std::size_t n_dequantized = 0;  // FP8 weights written as BF16
  std::size_t n_dropped = 0;      // FP8 scales and activation parameters not written
  std::size_t n_split = 0;        // stacked expert tensors split
  std::size_t n_converted = 0;    // modules converted (source_format)
  // Parameters of the linear layers' weights: every 2-D weight and stacked
  // expert tensor whose role (roles.hpp) is not an embedding, output head,
  // norm or raw parameter; and of those, the ones quantized. The summary
  // and lint (L15) say what share stays in 16 bits.
  std::uint64_t linear_params = 0;
  std::uint64_t linear_params_quantized = 0;
  std::uint64_t tensor_bytes_out = 0;  // sum of output tensor byte sizes
  std::uint64_t shard_bytes_out = 0;   // sum of output shard file sizes

  // options.transform's rewrite: planned by make_plan (which tensors, how;
  // recorded in config.json's `ctquant_transform`), its scales derived from
  // the weights before the executor or verify applies it; null without one.
  std::shared_ptr<const RewritePlan> rewrite;

  const SchemeGroup& group_of(const PlannedModule& m) const { return options.groups[m.group]; }
};

// Builds the plan. Throws Error{kUsage} for invalid ignore/target entries or
// schemes. Throws Error{kBadInput} for an input config whose
// quantization_config ctquant does not convert (classify_input_quantization),
// for an output header over kMaxHeaderBytes, and, listing every problem at
// once: each selected weight its scheme cannot quantize (the family's
// `refuse`: in_features not a multiple of the group size, ...); each
// selected weight with rows over kMaxWeightRowBytes; each tensor whose name
// has a ':' component (torchao's tensor-subclass layout, not a module
// parameter); each F8 tensor that is not a recognised FP8 weight (wrong
// dtype variant, not a .weight, no FP8 quantization_config, a module the
// input's ignore list says was never FP8); each FP8 weight whose scale is
// missing or has the wrong dtype or shape; each scale without its F8
// weight; each stacked expert tensor whose layout cannot be split.
QuantizePlan make_plan(const Checkpoint& checkpoint, const PlanOptions& options);

// The ignore list written for these roles and options: the default entries
// (default_ignore_entries(), unless options.default_ignore is false), then
// options.ignore's entries not already in it, each with its reason
// ("--ignore" for given ones) and, for default entries, the modules it keeps.
struct IgnoreList {
  std::vector<std::string> entries;
  std::vector<std::string> reasons;             // per entry
  std::vector<std::vector<std::string>> keeps;  // per entry: the modules a default entry keeps
  std::size_t n_default = 0;                    // entries[0, n) are default entries
};
IgnoreList effective_ignore(const RoleAnalysis& roles, const PlanOptions& options);

// Checks the options alone, before any file is read. Throws Error{kUsage}
// for no group, a group whose scheme no family writes or ctquant does not
// support, and invalid ignore and target entries (every invalid entry of
// every list in one message, see ModuleMatcher).
void check_plan_options(const PlanOptions& options);

// The output config.json's quantization_config for the plan's groups: each
// group that quantizes a module (group_modules[g] > 0) with the format of
// its family; a group that quantizes nothing is not written (model_free_ptq
// writes it with format null, which verify and readers then have to guess
// at). The top-level format is the written groups' common one,
// "mixed-precision" when they differ, "dense" when there is none (schemes.md
// 9.2).
nlohmann::json plan_quantization_config(const PlanOptions& options,
                                        const std::vector<std::size_t>& group_modules);

}  // namespace ctquant
