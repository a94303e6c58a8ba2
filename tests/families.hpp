// Tiny checkpoints of real model families, built from their tensor names
// and config.json fields (as transformers and the published checkpoints
// write them), for the module-role, lint and loadability tests.
//
// Sizes are small (hidden 256, vocab 512, 2 layers, 4 experts) but keep the
// relations the roles are read from: [vocab, hidden] embeddings and heads,
// [num_experts, hidden] routers, [E, 2I, H] / [E, H, 2I] stacked experts,
// FP8 block scales of DeepSeek-V3, one MTP layer past num_hidden_layers.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fake_checkpoint.hpp"

namespace ctquant::test {

enum class Family {
  kLlama,
  kQwen3Tied,
  kQwen3Moe,          // per-expert tensors
  kQwen3MoeFused,     // transformers v5: mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]
  kQwen2MoeShared,    // shared expert and shared_expert_gate
  kMixtral,
  kDeepSeekV3,        // MLA, block FP8, one MTP layer
  kMistral3,          // LLaVA-style VLM, transformers >= 4.52 names, Pixtral tower, patch merger
  kLlavaOld,          // LLaVA with the pre-4.52 names (language_model.model.*, language_model.lm_head)
  kGemma3,            // Gemma 3 VLM: SigLIP tower, raw projection parameter, tied
  kQwen25Vl,          // Qwen2.5-VL, original names (model.*, visual.*)
  kGptOss,            // stacked interleaved experts [E, H, 2I], router with bias
  kEagle3,            // EAGLE-3 draft (midlayer.*, fc, draft lm_head, d2t/t2d)
  kMistralConsolidated,  // MistralForCausalLM: HF shards + index, consolidated.safetensors beside
};

// Every family, for parameterised tests.
std::vector<Family> all_families();
const char* family_name(Family family);

struct FamilyCheckpoint {
  nlohmann::json config;
  // Shards: file name -> tensors. One shard without an index unless the
  // family has several (then an index lists exactly these tensors, except
  // unindexed ones).
  std::vector<std::pair<std::string, std::vector<FakeSpec>>> shards;
  bool index = false;
  // Tensors written into a shard but left out of the index: (file, tensor).
  std::vector<std::pair<std::string, FakeSpec>> unindexed;
  // Other files: name -> content (a consolidated.safetensors is written as
  // a real safetensors file from `consolidated`).
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<FakeSpec> consolidated;  // non-empty: write consolidated.safetensors
};

FamilyCheckpoint make_family(Family family);

// Writes the family into dir. random: 2-D float weights get seeded normal
// values (std 0.02), so that the checkpoint can be quantized; otherwise the
// files are sparse (zero data), enough for planning.
void write_family(const std::filesystem::path& dir, Family family, bool random);

}  // namespace ctquant::test
