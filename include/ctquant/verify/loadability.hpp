// Loadability: what a loader (vLLM, transformers' compressed-tensors
// integration) checks or silently relies on when it reads a written
// checkpoint, checked on its headers and config.json. verify_checkpoints()
// and verify_against_source() run it on OUTPUT; every problem is a
// difference of kind "loadability" (exit 3).
//
// Checked:
//   - config.json's quantization_config: quant_method "compressed-tensors"
//     (vLLM selects its config by that name); quantization_status
//     "compressed" (transformers decompresses only then); a format a loader
//     reads for each group ("mixed-precision" needs a format per group, an
//     int weight-only group must be "pack-quantized": vLLM asserts
//     weights.type == FLOAT for activation formats without
//     input_activations); weights.actorder null (ctquant writes no
//     weight_g_idx; actorder "group" needs it); an empty transform_config and
//     sparsity_config (vLLM refuses sparsity, and applies transforms only
//     online);
//   - packed modules: no `.weight` beside `weight_packed`; `weight_scale`
//     and `weight_shape` present; `weight_zero_point` present exactly when
//     the scheme is asymmetric;
//   - every module's packed or 16-bit state against what vLLM expects from
//     the ignore list and targets, evaluated with vLLM's rules on vLLM's
//     names (vllm_match.hpp: exact or re.match after the model's name
//     mapping, fused layers shard by shard, MoE layers by their
//     experts.0.{gate,up,down}_proj probes), and modules vLLM builds
//     unquantized (roles.hpp) not packed; stacked experts only where the
//     family's vLLM loader reads them.
// A checkpoint without quantization_config and without packed tensors is
// not checked.
#pragma once

#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/verify/verify.hpp"

namespace ctquant {

// Appends the problems to report.differences and the remarks (a layer
// matched by neither ignore nor targets, which only older vLLM refuses) to
// report.notes. `file` of each item is config.json or the shard holding
// the tensor.
void check_loadability(const std::optional<nlohmann::json>& config,
                       const std::vector<SafetensorsFile>& shards, VerifyReport& report);

}  // namespace ctquant
