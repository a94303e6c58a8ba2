// The blocks `--transform balance` may rewrite (model/rewrite_rules.hpp).
#include "ctquant/model/rewrite_rules.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"

namespace ctquant {
namespace {

using nlohmann::json;

// The families whose blocks are pre-norm Llama blocks (transformers'
// modeling_llama.py, modeling_mistral.py, modeling_qwen3.py).
const std::set<std::string> kSafeArchitectures{"LlamaForCausalLM", "MistralForCausalLM",
                                               "Qwen3ForCausalLM"};

std::uint64_t config_uint(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_number_unsigned()) return 0;
  return it->get<std::uint64_t>();
}

}  // namespace

// Why a family that is not safe is refused, by a fragment of its
// model_type or architecture.
std::string rewrite_family_reason(const std::string& model_type, const std::string& arch) {
  const auto has = [&](const char* s) {
    return model_type.find(s) != std::string::npos || arch.find(s) != std::string::npos;
  };
  if (has("DFlash") || has("dflash") || has("Eagle") || has("eagle")) {
    return "a speculative-decoding draft: its fc and target hidden states feed norms and "
           "consumers ctquant does not see";
  }
  if (has("gemma") || has("Gemma")) {
    return "Gemma's RMSNorm computes x * (1 + g), so a rewrite of g does not scale its output "
           "as the rewrite needs (and its sandwich norms after attention and the MLP)";
  }
  if (has("deepseek") || has("DeepSeek") || has("kimi")) {
    return "MLA (latent q/kv projections with their own norms)";
  }
  if (has("moe") || has("Moe") || has("MoE") || has("mixtral") || has("Mixtral")) {
    return "a mixture of experts: the router, shared experts and every expert would all need "
           "the rewrite of the norm that feeds them; not done";
  }
  return "no rule says its blocks are pre-norm Llama blocks (RMSNorm x * g, no biases)";
}

RewriteFamily rewrite_family(const Checkpoint& checkpoint) {
  RewriteFamily family;
  auto& problems = family.problems;
  if (!checkpoint.config || !checkpoint.config->is_object()) {
    problems.push_back("no config.json: the family and the attention heads are unknown");
    return family;
  }
  const json& config = *checkpoint.config;
  family.model_type = config.value("model_type", std::string{});
  if (config.contains("architectures") && config["architectures"].is_array() &&
      config["architectures"].size() == 1 && config["architectures"][0].is_string()) {
    family.arch = config["architectures"][0].get<std::string>();
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (config.value(key, false)) {
      problems.push_back(
          fmt::format("config.json: {} is true: biased Linears are not handled", key));
    }
  }
  family.heads = config_uint(config, "num_attention_heads");
  family.kv_heads = config_uint(config, "num_key_value_heads");
  if (family.kv_heads == 0) family.kv_heads = family.heads;
  family.head_dim = config_uint(config, "head_dim");
  const std::uint64_t hidden = config_uint(config, "hidden_size");
  if (family.head_dim == 0 && family.heads > 0) family.head_dim = hidden / family.heads;
  if (family.heads == 0 || family.head_dim == 0 || family.heads % family.kv_heads != 0) {
    problems.push_back(
        "config.json: num_attention_heads, num_key_value_heads and head_dim (or hidden_size) "
        "must give whole GQA groups");
  }
  return family;
}

BalanceLayout balance_layout(const Checkpoint& checkpoint) {
  BalanceLayout layout;
  RewriteFamily family = rewrite_family(checkpoint);
  if (!checkpoint.config || !checkpoint.config->is_object()) {
    layout.problems = std::move(family.problems);
    return layout;
  }
  const json& config = *checkpoint.config;
  const std::string& arch = family.arch;
  const std::string& model_type = family.model_type;
  auto& problems = layout.problems;
  if (!kSafeArchitectures.contains(arch)) {
    problems.push_back(fmt::format("config.json: architecture '{}' (model_type '{}'): {}", arch,
                                   model_type, rewrite_family_reason(model_type, arch)));
  }
  for (std::string& p : family.problems) problems.push_back(std::move(p));
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (config_uint(config, key) > 0) {
      problems.push_back(fmt::format(
          "config.json: {}: a mixture of experts (the router, shared experts and every expert "
          "would need the rewrite of the norm that feeds them; not done)",
          key));
    }
  }
  layout.heads = family.heads;
  layout.kv_heads = family.kv_heads;
  layout.head_dim = family.head_dim;

  // Every tensor of every block, by block prefix.
  static const std::regex kBlock(R"(^((?:.*\.)?layers\.(\d+)\.)(.*)$)");
  std::map<std::uint64_t, std::pair<std::string, std::set<std::string>>> blocks;
  for (const auto& [name, at] : checkpoint.tensors) {
    std::smatch m;
    if (!std::regex_match(name, m, kBlock)) continue;
    auto& block = blocks[std::stoull(m[2].str())];
    if (!block.first.empty() && block.first != m[1].str()) {
      problems.push_back(fmt::format("{}: two blocks numbered {} ('{}' and '{}')", name, m[2].str(),
                                     block.first, m[1].str()));
    }
    block.first = m[1].str();
    block.second.insert(m[3].str());
  }
  if (blocks.empty()) problems.push_back("no decoder blocks (tensors named '...layers.N....')");
  std::set<std::string> expected;
  for (const char* n : kBalanceNorms) expected.insert(std::string(n) + ".weight");
  for (const char* n : kBalanceAttn) expected.insert(std::string("self_attn.") + n + ".weight");
  for (const char* n : kBalanceMlp) expected.insert(std::string("mlp.") + n + ".weight");
  std::set<std::string> allowed = expected;
  if (arch == "Qwen3ForCausalLM") {
    // Per-head norms of q and k after their projections: unchanged by a
    // rewrite of q_proj's and k_proj's input columns.
    allowed.insert("self_attn.q_norm.weight");
    allowed.insert("self_attn.k_norm.weight");
  }
  for (const auto& [layer, block] : blocks) {
    const auto& [prefix, names] = block;
    for (const std::string& n : names) {
      if (!allowed.contains(n)) {
        problems.push_back(fmt::format(
            "{}{}: not part of a pre-norm Llama block (a bias, a sandwich or post norm, an "
            "attention output gate, an expert or router): its producer or consumer would need "
            "the rewrite too",
            prefix, n));
      }
    }
    for (const std::string& n : expected) {
      if (!names.contains(n)) problems.push_back(fmt::format("{}{}: missing", prefix, n));
    }
    for (const std::string& n : expected) {
      const TensorEntry* e = checkpoint.find(prefix + n);
      if (e == nullptr) continue;
      if (!is_quantizable_float(e->dtype)) {
        problems.push_back(
            fmt::format("{}{}: dtype {}: only BF16, F16 and F32 weights are "
                        "rewritten (FP8 inputs are not balanced)",
                        prefix, n, dtype_tag(e->dtype)));
      }
      const std::size_t dims = n.find("norm") != std::string::npos ? 1 : 2;
      if (e->shape.size() != dims) {
        problems.push_back(
            fmt::format("{}{}: {}-D, expected {}-D", prefix, n, e->shape.size(), dims));
      }
    }
    layout.blocks.push_back({prefix, layer});
  }
  return layout;
}

}  // namespace ctquant
