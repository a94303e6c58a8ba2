// vLLM's fused layers: the checkpoint modules vLLM loads into one layer.
//
// A fused layer is built once, with one quantization scheme, from several
// checkpoint modules (its shards) under one parent: the shards must all be
// quantized the same way or all kept (lint L3), and a scheme with a global
// scale gives the layer one scale (lint L14). The groups, read from
// vllm-project/vllm:
//   qkv_proj = q_proj + k_proj + v_proj, gate_up_proj = gate_proj + up_proj:
//     packed_modules_mapping and stacked_params_mapping of the Llama-style
//     model files (vllm/model_executor/models/llama.py, and every file the
//     family table lists with these groups);
//   w13 = w1 + w3 (an expert's gate and up): FusedMoE's expert parameter
//     mapping (vllm/model_executor/layers/fused_moe/layer.py,
//     make_expert_params_mapping; mixtral.py names the experts w1/w2/w3);
//   fused_qkv_a_proj = q_a_proj + kv_a_proj_with_mqa: MLA with a q LoRA rank
//     (vllm/model_executor/models/deepseek_v2.py, deepseek_mtp.py).
// Which groups a family's vLLM model file lists, and when, is its row of the
// family table (families.hpp, FamilyRow::fused).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ctquant {

// A group of checkpoint modules vLLM fuses into one layer.
struct FusedSpec {
  const char* fused;                // "qkv_proj"
  std::vector<const char*> shards;  // {"q_proj", "k_proj", "v_proj"}, in vLLM's shard order
  // vLLM's packed_modules_mapping lists the group only when one of these
  // config.json keys is truthy or non-empty (comma-separated); nullptr:
  // always listed. When not listed, ignore is tested on the fused name.
  const char* listed_if_config = nullptr;
};

enum class FusedKind : std::uint8_t {
  kQkvProj,        // qkv_proj: q_proj, k_proj, v_proj
  kGateUpProj,     // gate_up_proj: gate_proj, up_proj
  kExpertW13,      // w13: w1, w3 (an expert's gate and up)
  kFusedQkvAProj,  // fused_qkv_a_proj: q_a_proj, kv_a_proj_with_mqa
};

// The group of a kind, always listed.
const FusedSpec& vllm_fused_group(FusedKind kind);
// The same group, listed in packed_modules_mapping only when one of the
// config.json keys `listed_if_config` names is set (see FusedSpec).
FusedSpec vllm_fused_group(FusedKind kind, const char* listed_if_config);

// The groups of the Llama-style model files, {qkv_proj, gate_up_proj}: the
// rows that list these two, and the groups assumed for a checkpoint whose
// architecture the family table does not know.
const std::vector<FusedSpec>& llama_fused_groups();

// The group of llama_fused_groups() that has `shard` (a module's last name
// component) among its shards, or nullptr.
const FusedSpec* llama_fused_group_of(std::string_view shard);

}  // namespace ctquant
