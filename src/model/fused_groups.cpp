#include "ctquant/model/fused_groups.hpp"

#include <algorithm>

namespace ctquant {

const FusedSpec& vllm_fused_group(FusedKind kind) {
  static const FusedSpec kQkvProj{"qkv_proj", {"q_proj", "k_proj", "v_proj"}};
  static const FusedSpec kGateUpProj{"gate_up_proj", {"gate_proj", "up_proj"}};
  static const FusedSpec kExpertW13{"w13", {"w1", "w3"}};
  static const FusedSpec kFusedQkvAProj{"fused_qkv_a_proj", {"q_a_proj", "kv_a_proj_with_mqa"}};
  switch (kind) {
    case FusedKind::kQkvProj:
      return kQkvProj;
    case FusedKind::kGateUpProj:
      return kGateUpProj;
    case FusedKind::kExpertW13:
      return kExpertW13;
    case FusedKind::kFusedQkvAProj:
      return kFusedQkvAProj;
  }
  return kQkvProj;
}

FusedSpec vllm_fused_group(FusedKind kind, const char* listed_if_config) {
  FusedSpec spec = vllm_fused_group(kind);
  spec.listed_if_config = listed_if_config;
  return spec;
}

const std::vector<FusedSpec>& llama_fused_groups() {
  static const std::vector<FusedSpec> groups = {vllm_fused_group(FusedKind::kQkvProj),
                                                vllm_fused_group(FusedKind::kGateUpProj)};
  return groups;
}

const FusedSpec* llama_fused_group_of(std::string_view shard) {
  for (const FusedSpec& g : llama_fused_groups()) {
    if (std::any_of(g.shards.begin(), g.shards.end(),
                    [&](const char* s) { return shard == s; })) {
      return &g;
    }
  }
  return nullptr;
}

}  // namespace ctquant
