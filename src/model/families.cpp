#include "ctquant/model/families.hpp"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

using nlohmann::json;

// ---------------------------------------------------------------------------
// The family table. Each row was read from the vLLM model file it names
// (repository vllm-project/vllm, at the commit given); docs/loadability.md
// lists the rows with their sources. Matching rules common to all rows are
// compressed_tensors/utils.py@008014e8 (should_ignore_layer: exact name or
// Python re.match; fused layers tested shard by shard) and
// compressed_tensors_moe/compressed_tensors_moe.py@0043d6b5 (MoE layers
// probed by <layer>.0.gate_proj / .0.up_proj / .0.down_proj).


namespace {

// transformers >= 4.52 names of LLaVA-style models (the checkpoint may hold
// the older language_model.model.* names).
const std::vector<std::pair<const char*, const char*>> kLlavaHfPrefix = {
    {"model.", "model."},
    {"lm_head", "lm_head"},
    {"language_model.model.", "model.language_model."},
    {"language_model.lm_head", "lm_head"},
    {"vision_tower.", "model.vision_tower."},
    {"multi_modal_projector.", "model.multi_modal_projector."},
};

const std::vector<std::pair<const char*, const char*>> kLlavaVllmPrefix = {
    {"model.language_model.", "language_model.model."},
    {"model.vision_tower.", "vision_tower."},
    {"model.multi_modal_projector.", "multi_modal_projector."},
    {"lm_head.", "language_model.lm_head."},
};

std::vector<FamilyRow> make_family_table() {
  std::vector<FamilyRow> rows;
  {
    FamilyRow r{};
    r.name = "Llama";
    r.architectures = {"LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM",
                       "AquilaForCausalLM", "InternLMForCausalLM", "InternLM3ForCausalLM",
                       "XverseForCausalLM"};
    r.model_types = {"llama", "mistral"};
    r.vllm_file = "vllm/model_executor/models/llama.py";
    r.vllm_commit = "e06c9ba2a6ea923a84add30f5dafaea126429b81";
    r.fused = llama_fused_groups();
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "Qwen3";
    r.architectures = {"Qwen3ForCausalLM"};
    r.model_types = {"qwen3"};
    r.vllm_file = "vllm/model_executor/models/qwen3.py";
    r.vllm_commit = "e745bafffc44744aa601169f8c6f325e47ca7cd5";
    r.fused = llama_fused_groups();
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "Qwen3-MoE";
    r.architectures = {"Qwen3MoeForCausalLM"};
    r.model_types = {"qwen3_moe"};
    r.vllm_file = "vllm/model_executor/models/qwen3_moe.py";
    r.vllm_commit = "2e0831b0ab951c8896d4dd5d6cb9c3350a4574de";
    r.rules = {
        {"re:.*\\.mlp\\.gate$", ModuleRole::kRouter, VllmBuild::kQuantizable,
         "router: vLLM builds ReplicatedLinear(hidden, num_experts, quant_config=quant_config), "
         "so the Linear target takes it unless the ignore list names it",
         "re:.*mlp.gate$"},
        {"re:.*\\.mlp\\.shared_expert_gate$", ModuleRole::kSharedExpertGate, VllmBuild::kPlain,
         "shared-expert gate: vLLM builds ReplicatedLinear(hidden, 1, quant_config=None)"},
    };
    r.fused = {vllm_fused_group(FusedKind::kQkvProj),
               vllm_fused_group(FusedKind::kGateUpProj, "mlp_only_layers")};
    r.stacked = StackedLayout::kOutInHalves;
    r.vllm_loads_stacked = false;
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "Qwen2-MoE";
    r.architectures = {"Qwen2MoeForCausalLM"};
    r.model_types = {"qwen2_moe"};
    r.vllm_file = "vllm/model_executor/models/qwen2_moe.py";
    r.vllm_commit = "8bbabf03350e7821e2ffc6a5b3d9931e5f6df4c0";
    r.rules = {
        {"re:.*\\.mlp\\.gate$", ModuleRole::kRouter, VllmBuild::kPlain,
         "router: vLLM builds ReplicatedLinear(hidden, num_experts, quant_config=None)"},
        {"re:.*\\.mlp\\.shared_expert_gate$", ModuleRole::kSharedExpertGate, VllmBuild::kPlain,
         "shared-expert gate: vLLM builds torch.nn.Linear(hidden, 1)"},
    };
    r.fused = {vllm_fused_group(FusedKind::kQkvProj),
               vllm_fused_group(FusedKind::kGateUpProj,
                                "shared_expert_intermediate_size,mlp_only_layers")};
    r.stacked = StackedLayout::kOutInHalves;
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "Mixtral";
    r.architectures = {"MixtralForCausalLM"};
    r.model_types = {"mixtral"};
    r.vllm_file = "vllm/model_executor/models/mixtral.py";
    r.vllm_commit = "f0e26957c6af4d1ce3d0642120b011949da65885";
    r.rules = {
        {"re:.*\\.block_sparse_moe\\.gate$", ModuleRole::kRouter, VllmBuild::kPlain,
         "router: vLLM builds ReplicatedLinear(hidden, num_experts, quant_config=None) (\"Gate "
         "always runs at half / full precision\")"},
    };
    r.fused = {vllm_fused_group(FusedKind::kQkvProj)};
    r.expert_gate = "w1";
    r.expert_up = "w3";
    r.expert_down = "w2";
    r.intermediate_key = "intermediate_size";
    r.stacked = StackedLayout::kOutInHalves;
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "DeepSeek-V2/V3";
    r.architectures = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                       "DeepseekV32ForCausalLM"};
    r.model_types = {"deepseek_v2", "deepseek_v3", "deepseek_v32"};
    r.vllm_file = "vllm/model_executor/models/deepseek_v2.py";
    r.vllm_commit = "b863fe5bf4e19680572603b4e166faefc5725551";
    r.rules = {
        {"re:.*\\.mlp\\.gate$", ModuleRole::kRouter, VllmBuild::kPlain,
         "router: vLLM builds DeepSeekV2Gate, which asserts quant_config is None"},
        {"re:.*\\.indexer\\.weights_proj$", ModuleRole::kPlainLinear, VllmBuild::kPlain,
         "indexer weights_proj: vLLM builds ReplicatedLinear(quant_config=None)"},
        {"re:.*\\.eh_proj$", ModuleRole::kPlainLinear, VllmBuild::kPlain,
         "MTP eh_proj: vLLM builds torch.nn.Linear(2 * hidden, hidden) "
         "(deepseek_mtp.py@4f7c1440)"},
        {"re:.*\\.shared_head\\.head$", ModuleRole::kHead, VllmBuild::kIfTargeted,
         "MTP output head: vLLM builds ParallelLMHead (deepseek_mtp.py@4f7c1440), quantized "
         "only when a target names it"},
    };
    r.fused = {vllm_fused_group(FusedKind::kGateUpProj),
               vllm_fused_group(FusedKind::kFusedQkvAProj, "q_lora_rank")};
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "LLaVA";
    r.architectures = {"LlavaForConditionalGeneration", "MantisForConditionalGeneration"};
    r.model_types = {"llava"};
    r.vllm_file = "vllm/model_executor/models/llava.py";
    r.vllm_commit = "35d3c24b11a03faf6108c5f9e7b81634ea1c3e5d";
    r.mapper_prefix = kLlavaVllmPrefix;
    r.fused = llama_fused_groups();
    r.hf_prefix = kLlavaHfPrefix;
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "Mistral3";
    r.architectures = {"Mistral3ForConditionalGeneration"};
    r.model_types = {"mistral3"};
    r.vllm_file = "vllm/model_executor/models/mistral3.py";
    r.vllm_commit = "577477b558219164dea7597e6e0356e455a86a61";
    r.rules = {
        {"re:.*multi_modal_projector\\.patch_merger\\.merging_layer$", ModuleRole::kPlainLinear,
         VllmBuild::kPlain, "patch merger: vLLM builds torch.nn.Linear(vision_hidden * merge^2, "
         "vision_hidden)"},
    };
    r.mapper_prefix = kLlavaVllmPrefix;
    r.fused = llama_fused_groups();
    r.hf_prefix = kLlavaHfPrefix;
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "Gemma3 VLM";
    r.architectures = {"Gemma3ForConditionalGeneration"};
    r.model_types = {"gemma3"};
    r.vllm_file = "vllm/model_executor/models/gemma3_mm.py";
    r.vllm_commit = "e5fa94509b708330e28208a55c84aba8a7781675";
    r.rules = {
        {"re:.*vision_tower\\..*\\.mlp\\.fc[12]$", ModuleRole::kLinear, VllmBuild::kQuantizable,
         "SigLIP MLP (siglip.py@0c028ba4): quantizable only when the vision hidden and "
         "intermediate sizes are multiples of 64",
         nullptr, RuleCondition::kSiglipMlpQuantizableIf64},
    };
    r.mapper_prefix = kLlavaVllmPrefix;
    r.fused = llama_fused_groups();
    r.hf_prefix = kLlavaHfPrefix;
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "Qwen2.5-VL";
    r.architectures = {"Qwen2_5_VLForConditionalGeneration"};
    r.model_types = {"qwen2_5_vl"};
    r.vllm_file = "vllm/model_executor/models/qwen2_5_vl.py";
    r.vllm_commit = "fb33ec8cf0a73c82af00a2128dee4ad058d16e9b";
    r.mapper_prefix = {
        {"model.language_model.", "language_model.model."},
        {"model.visual.", "visual."},
        {"lm_head.", "language_model.lm_head."},
        {"model.", "language_model.model."},
    };
    r.fused = llama_fused_groups();
    // transformers' _checkpoint_conversion_mapping: ^visual -> model.visual,
    // ^model(?!.(language_model|visual)) -> model.language_model.
    r.hf_prefix = {
        {"model.language_model.", "model.language_model."},
        {"model.visual.", "model.visual."},
        {"visual.", "model.visual."},
        {"model.", "model.language_model."},
    };
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "gpt-oss";
    r.architectures = {"GptOssForCausalLM"};
    r.model_types = {"gpt_oss"};
    r.vllm_file = "vllm/model_executor/models/gpt_oss.py";
    r.vllm_commit = "a6b6cfaa0cedff84872a0118380c6cfea91b635d";
    r.rules = {
        {"re:.*\\.mlp\\.router$", ModuleRole::kRouter, VllmBuild::kPlain,
         "router: vLLM builds torch.nn.Linear(hidden, num_local_experts) with bias"},
        {"re:(.*\\.)?lm_head$", ModuleRole::kHead, VllmBuild::kPlain,
         "output head: vLLM builds ParallelLMHead without quant_config"},
        {"re:.*\\.embed_tokens$", ModuleRole::kEmbedding, VllmBuild::kPlain,
         "embedding: vLLM builds VocabParallelEmbedding without quant_config (model.embedding)"},
    };
    r.mapper_substr = {{".self_attn.", ".attn."}};
    r.mapper_suffix = {
        {".embed_tokens.weight", ".embedding.weight"}, {".gate_up_proj_blocks", ".w13_weight"},
        {".down_proj_blocks", ".w2_weight"},           {".gate_up_proj_scales", ".w13_weight_scale"},
        {".down_proj_scales", ".w2_weight_scale"},     {".gate_up_proj", ".w13_weight"},
        {".down_proj", ".w2_weight"},                  {".gate_up_proj_bias", ".w13_bias"},
        {".down_proj_bias", ".w2_bias"},
    };
    r.fused = {vllm_fused_group(FusedKind::kQkvProj)};
    r.intermediate_key = "intermediate_size";
    r.stacked = StackedLayout::kInOutInterleaved;
    r.vllm_loads_stacked = true;
    r.vllm_loads_per_expert = false;
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "EAGLE-3 draft";
    r.architectures = {"Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3",
                       "Eagle3Qwen2_5vlForCausalLM", "Eagle3Qwen3vlForCausalLM"};
    r.vllm_file = "vllm/model_executor/models/llama_eagle3.py";
    r.vllm_commit = "583507d13075783a12ccbd774575974d10ca4959";
    r.rules = {
        {"re:(.*\\.)?lm_head$", ModuleRole::kHead, VllmBuild::kPlain,
         "draft output head: vLLM builds ParallelLMHead(draft_vocab_size, hidden) without "
         "quant_config"},
        {"re:(.*\\.)?embed_tokens$", ModuleRole::kEmbedding, VllmBuild::kPlain,
         "draft embedding: shared with the target or built without quant_config"},
        {"re:(.*\\.)?fc$", ModuleRole::kLinear, VllmBuild::kQuantizable,
         "fc over the target's aux hidden states: ReplicatedLinear(quant_config) in current vLLM "
         "(prefix model.fc)"},
    };
    r.mapper_substr = {{"midlayer.", "layers.0."}};
    r.load_prefix = "model.";
    r.load_prefix_except = "lm_head";
    r.top_level_quant_config = false;
    r.fused = llama_fused_groups();
    rows.push_back(std::move(r));
  }
  {
    FamilyRow r{};
    r.name = "DFlash draft";
    r.architecture_substring = "DFlash";
    r.config_key = "dflash_config";
    r.vllm_file = "vllm/model_executor/models/qwen3_dflash.py";
    r.vllm_commit = "036a00d1f5d00d449d02dce9babdd15a5b4d06c9";
    r.rules = {
        {"re:.*\\.qkv_proj$", ModuleRole::kDraftKeep, VllmBuild::kQuantizable,
         "DFlash qkv_proj: vLLM builds the context-KV buffer by reading qkv_proj.weight "
         "directly (_build_context_kv_buffers), so it must stay a 16-bit .weight",
         "re:.*qkv_proj$"},
        {"re:.*\\.self_attn\\.[qkv]_proj$", ModuleRole::kDraftKeep, VllmBuild::kQuantizable,
         "DFlash q/k/v_proj: stacked into qkv_proj, whose .weight vLLM reads directly "
         "(_build_context_kv_buffers), so they must stay 16-bit",
         "re:.*[qkv]_proj$"},
        {"re:.*\\.g_proj$", ModuleRole::kDraftKeep, VllmBuild::kQuantizable,
         "DFlash attention gate g_proj: out_features is the number of heads, too narrow for "
         "Marlin (out_features % 64), kept in 16 bits",
         "re:.*g_proj$"},
        {"re:(.*\\.)?candidate_selector\\.hidden_projection$", ModuleRole::kDraftKeep,
         VllmBuild::kQuantizable,
         "DFlash2 candidate selector hidden_projection: vLLM's DFlash drafts build no candidate "
         "selector, and xLLM's DFlash2 copies hidden_projection.weight as a 16-bit tensor "
         "(xllm/python/models/qwen3_dflash2.py@b09b5ac6), so it stays in 16 bits"},
        {"re:.*_conv\\.kernel_projection$", ModuleRole::kDraftKeep, VllmBuild::kQuantizable,
         "DFlash2 convolution kernel_projection: vLLM's DFlash drafts build no convolutions, "
         "and xLLM's DFlash2 copies kernel_projection.weight as a 16-bit tensor "
         "(xllm/python/models/qwen3_dflash2.py@b09b5ac6), so it stays in 16 bits"},
        {"re:(.*\\.)?lm_head$", ModuleRole::kHead, VllmBuild::kPlain,
         "draft output head: vLLM builds ParallelLMHead without quant_config"},
        {"re:(.*\\.)?embed_tokens$", ModuleRole::kEmbedding, VllmBuild::kPlain,
         "draft embedding: VocabParallelEmbedding without quant_config"},
    };
    r.mapper_substr = {{"midlayer.", "layers.0."},
                       {"encoder.output_norm_enc.", "hidden_norm."},
                       {"encoder.fc.", "fc."}};
    r.load_prefix = "model.";
    r.top_level_quant_config = false;
    r.fused = llama_fused_groups();
    // vLLM's registry builds DFlashDraftModel (the z-lab drafts) with
    // qwen3_dflash.py's DFlashQwen3ForCausalLM, whose decoder layers get the
    // prefix layers.{layer_idx + start_layer_id}, start_layer_id the
    // target's get_total_num_hidden_layers(); DFlashLagunaForCausalLM
    // (laguna_dflash.py@038481da) names its Linear layers layers.{layer_idx}
    // (only its attention's KV-cache name is offset).
    r.layers_after_target = {"DFlashDraftModel"};
    // transformers has no DFlash class: without the draft's own modeling
    // code it builds the class of config.json's model_type (Qwen3ForCausalLM
    // for the z-lab drafts), whose decoder layers are model.layers.N (the
    // draft's own code names them as the checkpoint does).
    r.hf_prefix = {{"layers.", "model.layers."}};
    rows.push_back(std::move(r));
  }
  return rows;
}

// A rule list's key sorted longest first, as vLLM's WeightsMapper does.
std::vector<std::pair<std::string, std::string>> longest_first(
    const std::vector<std::pair<const char*, const char*>>& rules) {
  std::vector<std::pair<std::string, std::string>> out(rules.begin(), rules.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return out;
}

// WeightsMapper._map_name: substring, then prefix, then suffix rules, each
// kind longest key first and first hit only.
std::string map_name(const FamilyRow& row, std::string key) {
  for (const auto& [from, to] : longest_first(row.mapper_substr)) {
    const auto at = key.find(from);
    if (at != std::string::npos) {
      key.replace(at, from.size(), to);
      break;
    }
  }
  for (const auto& [from, to] : longest_first(row.mapper_prefix)) {
    if (key.starts_with(from)) {
      key = to + key.substr(from.size());
      break;
    }
  }
  for (const auto& [from, to] : longest_first(row.mapper_suffix)) {
    if (key.ends_with(from)) {
      key = key.substr(0, key.size() - from.size()) + to;
      break;
    }
  }
  return key;
}
}  // namespace

const std::vector<FamilyRow>& family_table() {
  static const std::vector<FamilyRow> table = make_family_table();
  return table;
}

std::string family_source(const FamilyRow& row) {
  return fmt::format("{}@{}", row.vllm_file, std::string_view(row.vllm_commit).substr(0, 8));
}

const std::vector<FusedSpec>& family_fused_groups(const FamilyRow* family) {
  return family == nullptr ? llama_fused_groups() : family->fused;
}

const FamilyRow* match_family(const std::optional<json>& config) {
  if (!config || !config->is_object()) return nullptr;
  std::vector<std::string> architectures;
  if (const auto it = config->find("architectures"); it != config->end() && it->is_array()) {
    for (const json& a : *it) {
      if (a.is_string()) architectures.push_back(a.get<std::string>());
    }
  }
  std::string model_type;
  if (const auto it = config->find("model_type"); it != config->end() && it->is_string()) {
    model_type = it->get<std::string>();
  }
  // Drafts first: a DFlash draft of a Qwen3 target says model_type qwen3.
  for (const FamilyRow& row : family_table()) {
    const bool by_substring =
        row.architecture_substring != nullptr &&
        std::any_of(architectures.begin(), architectures.end(), [&](const std::string& a) {
          return a.find(row.architecture_substring) != std::string::npos;
        });
    if (by_substring || (row.config_key != nullptr && config->contains(row.config_key))) {
      return &row;
    }
  }
  for (const FamilyRow& row : family_table()) {
    for (const std::string& a : architectures) {
      if (std::find_if(row.architectures.begin(), row.architectures.end(),
                       [&](const char* x) { return a == x; }) != row.architectures.end()) {
        return &row;
      }
    }
  }
  if (!architectures.empty()) return nullptr;  // an architecture the table does not know
  for (const FamilyRow& row : family_table()) {
    if (std::find_if(row.model_types.begin(), row.model_types.end(),
                     [&](const char* x) { return model_type == x; }) != row.model_types.end()) {
      return &row;
    }
  }
  return nullptr;
}

std::string vllm_tensor_name(const FamilyRow* family, const std::string& tensor) {
  if (family == nullptr) return tensor;
  std::string name = map_name(*family, tensor);
  if (*family->load_prefix != '\0' &&
      !(family->load_prefix_except != nullptr && name.starts_with(family->load_prefix_except))) {
    name = family->load_prefix + name;
  }
  return name;
}

std::string vllm_module_name(const FamilyRow* family, const std::string& module) {
  const std::string mapped = vllm_tensor_name(family, module + ".weight");
  return mapped.ends_with(".weight") ? mapped.substr(0, mapped.size() - 7) : module_of(mapped);
}

std::string vllm_entry(const FamilyRow* family, const std::string& entry) {
  if (family == nullptr || !family->top_level_quant_config || regex_pattern(entry)) return entry;
  return map_name(*family, entry);
}

std::string hf_module_name(const FamilyRow* family, const std::string& module) {
  if (family == nullptr) return module;
  for (const auto& [from, to] : family->hf_prefix) {
    const std::string f(from);
    if (module.starts_with(f)) return std::string(to) + module.substr(f.size());
  }
  return module;
}

}  // namespace ctquant
