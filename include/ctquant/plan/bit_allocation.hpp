// Bits where they matter: `--target-bits B` and `--more-bits layers`.
//
// Both start from the plan of one scheme group (the preset, e.g. W4A16
// group 128) and raise some modules to a higher-precision scheme of the
// same format, written as config groups that name exactly their modules,
// in entries vLLM, compressed-tensors and ctquant find under their own
// names (exact_target_entries, model/roles.hpp; as `--observer auto` writes
// its split, exec/observer_choice.hpp).
//
// The ladder (bit_ladder): the group given and its upgrades, in this order:
// the same scheme with a smaller group size (64, then 32, those below the
// given one), then W8A16 (the library's preset: int8, symmetric, group
// 128) at the given group size. Only schemes compressed-tensors writes in
// the given group's format are upgrades, so OUTPUT stays one format: the
// integer weight-only presets (W4A16, W4A16_ASYM, W8A16: pack-quantized).
// Other presets (NVFP4A16, MXFP4A16, FP8, W8A8) cannot mix: their upgrade
// would be a second format in one checkpoint ("mixed-precision").
//
// Units (scheme_units): the modules vLLM builds as one layer keep one
// scheme: the shards of a fused q/k/v (qkv_proj) and gate/up
// (gate_up_proj), the experts of a MoE layer (ModuleInfo::vllm_layer).
//
// Bits per weight (BitAllocation::bits_per_weight): over the quantized
// modules, 8 * the bytes of every output tensor but weight_shape (codes,
// scales, zero points, global scales) / the weight elements. W4A16 group
// 128 with BF16 scales is 4 + 16/128 = 4.125; W8A16 group 128 is 8.125.
//
// --target-bits (allocate_bits): each module's weight error with every
// option is measured beforehand (exec/bit_choice.hpp: quantized and
// dequantized in memory as the run would, quant_error.hpp). The error of a
// unit is the sum over its modules of rel^2 * params, rel^2 =
// ||W - Q||^2 / ||W||^2 (0 for an all-zero W) and params the module's
// weight elements: the relative squared error weighted by size. It is the
// weight error, not the KL divergence of the model's outputs. Greedy, from
// every module at the given scheme: among the moves of one unit from its
// option to another of more bytes and lower error whose result keeps the
// bits per weight <= B, apply the one with the largest error reduction per
// extra byte (ties: the earlier unit in plan order, then the cheaper
// option); repeat until none is left.
//
// --more-bits layers (more_bits_allocation): llama.cpp's use_more_bits
// rule (ggml llama-quant.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2)
// picks decoder layers (the language model's, or a draft's own: a DFlash
// draft's layers.N); their down_proj (a MoE layer's experts' down_proj
// too) get W8A16, with the rest of their unit. Fixed, data-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/quant_error.hpp"

namespace ctquant {

// --target-bits B takes at most this (16-bit weights); below the given
// scheme's own bits per weight is refused too.
inline constexpr double kMaxTargetBits = 16.0;

// The given group and its upgrades (see above); options[0] is the given
// group, unchanged. Each option's name is the config group it is written
// under: "W4A16_g64", "W4A16_g32", "W8A16" (at group 128; "W8A16_g64" at
// another).
struct BitLadder {
  std::vector<SchemeGroup> options;
};

// The ladder of options.groups[0]. Throws Error{kUsage} naming `option`
// ("--target-bits" or "--more-bits") when there is not exactly one group
// (several from --quantization-config, a recipe or --scheme-for), or the
// group's scheme cannot mix (not integer weight-only in pack-quantized, or
// already 8 bits with no smaller group: nothing to upgrade to).
BitLadder bit_ladder(const PlanOptions& options, std::string_view option);

// The bytes of a module [rows, cols] of weight_dtype written with args by
// family: every output tensor but weight_shape.
std::uint64_t quantized_bytes(const SchemeFamily& family, const QuantArgs& args, DType weight_dtype,
                              std::uint64_t rows, std::uint64_t cols);

// llama.cpp's use_more_bits(i_layer, n_layers), and the layers it picks in
// [0, n_layers), ascending.
bool use_more_bits(std::uint64_t layer, std::uint64_t n_layers);
std::vector<std::uint64_t> more_bits_layers(std::uint64_t n_layers);

// The decoder layer of a module: N of the first ".layers.N." (or leading
// "layers.N.") of its name; nullopt when it has none.
std::optional<std::uint64_t> decoder_layer(std::string_view module);

// The quantized modules of the plan in units vLLM reads with one scheme
// (see above): plan module indices, each unit in plan order, units by their
// first module.
std::vector<std::vector<std::size_t>> scheme_units(const QuantizePlan& plan);

// One quantized module's choice.
struct ModuleBits {
  std::size_t module = 0;            // index into QuantizePlan::modules
  std::size_t option = 0;            // index into BitAllocation::options
  std::uint64_t params = 0;          // weight elements (rows * cols)
  std::vector<std::uint64_t> bytes;  // per option: bytes written (0: the option refuses it)
  std::vector<QuantError> errors;    // per option: measured (--target-bits only)
};

struct BitAllocation {
  std::string rule;                   // "--target-bits 5" or "--more-bits layers"
  std::optional<double> target_bits;  // B (--target-bits)
  std::vector<SchemeGroup> options;   // the ladder
  std::vector<ModuleBits> modules;    // every quantized module, in plan order
  std::vector<std::uint64_t> layers;  // --more-bits layers: the layers picked
  std::uint64_t n_layers = 0;         // --more-bits layers: the n of the rule

  std::uint64_t params() const;
  std::uint64_t bytes() const;                       // as chosen
  std::uint64_t bytes_of(std::size_t option) const;  // every module at one option
  double bits_per_weight() const;                    // 8 * bytes() / params() (0 with no module)
  std::size_t modules_upgraded() const;              // modules not at options[0]
};

// The allocation's skeleton for the plan (made from options.groups[0]):
// every quantized module at options[0], with its bytes under each option (0
// where the family refuses the shape, or where another module of its unit
// is refused: the unit cannot take the option). Throws Error{kUsage} when
// the plan's modules are not all in the ladder's group.
BitAllocation start_allocation(const QuantizePlan& plan, const BitLadder& ladder);

// Throws Error{kUsage} when target_bits is not finite, above
// kMaxTargetBits or below the bits per weight of `allocation` (from
// start_allocation) with every module at options[0], naming both. Reads no
// weight: called before they are measured.
void check_target_bits(const BitAllocation& allocation, double target_bits);

// --target-bits: `allocation` from start_allocation with every module's
// errors measured (ModuleBits::errors, one per option; an option the module
// cannot take is never chosen). Throws what check_target_bits throws.
void allocate_bits(BitAllocation& allocation, const QuantizePlan& plan, double target_bits);

// --more-bits layers (see above). n_layers: config.json's num_hidden_layers
// (RoleAnalysis::dims.layers), else one more than the largest decoder layer
// of a module. Throws Error{kUsage} when the W8A16 option is not in the
// ladder or no module is a down_proj of a decoder layer.
void allocate_more_bits(BitAllocation& allocation, const QuantizePlan& plan);

// `given` (the options the plan was made from) with its one group split by
// the allocation: each option that some module takes is a group whose
// targets are exact_target_entries of its modules (model/roles.hpp: each
// module's checkpoint, vLLM and transformers names, no other module's),
// the given group first under its own name; when every module keeps
// options[0], `given` unchanged.
PlanOptions split_groups_by_bits(const PlanOptions& given, const QuantizePlan& plan,
                                 const BitAllocation& allocation);

}  // namespace ctquant
