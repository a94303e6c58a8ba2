// The blocks `--transform balance` may rewrite (model/rewrite_rules.hpp).
#include "ctquant/model/rewrite_rules.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"

namespace ctquant {
namespace {

using nlohmann::json;

// The families whose blocks are pre-norm Llama blocks (transformers'
// modeling_llama.py, modeling_mistral.py, modeling_qwen3.py), dense or with
// a router and experts that all read the post-attention norm
// (modeling_qwen3_moe.py, modeling_mixtral.py).
const std::set<std::string> kSafeArchitectures{"LlamaForCausalLM", "MistralForCausalLM",
                                               "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                                               "MixtralForCausalLM"};

// A block's mixture of experts in one family's names.
struct MoeNames {
  const char* router;  // after the block prefix
  const char* expert;  // "<prefix>experts.", followed by the expert number
  const char* gate;
  const char* up;
  const char* down;
};
constexpr MoeNames kQwen3Moe{"mlp.gate.weight", "mlp.experts.", "gate_proj.weight",
                             "up_proj.weight", "down_proj.weight"};
constexpr MoeNames kMixtral{"block_sparse_moe.gate.weight", "block_sparse_moe.experts.",
                            "w1.weight", "w3.weight", "w2.weight"};

// The experts of a block by number, from its tensor names; every name it
// takes is removed from `names`. Problems (a gap in the numbering, an
// expert without one of its three tensors) are appended.
std::vector<BalanceExpert> experts_of(const std::string& prefix, const MoeNames& moe,
                                      std::set<std::string>& names,
                                      std::vector<std::string>& problems) {
  std::map<std::uint64_t, std::set<std::string>> found;
  const std::string head = moe.expert;
  for (auto it = names.begin(); it != names.end();) {
    const std::string& n = *it;
    std::size_t digits = head.size();
    while (digits < n.size() && std::isdigit(static_cast<unsigned char>(n[digits]))) ++digits;
    if (!n.starts_with(head) || digits == head.size() || digits >= n.size() || n[digits] != '.') {
      ++it;
      continue;
    }
    found[std::stoull(n.substr(head.size(), digits - head.size()))].insert(n.substr(digits + 1));
    it = names.erase(it);
  }
  std::vector<BalanceExpert> experts;
  std::uint64_t next = 0;
  for (const auto& [e, parts] : found) {
    const std::string at = fmt::format("{}{}{}.", prefix, head, e);
    if (e != next) {
      problems.push_back(
          fmt::format("{}: experts numbered with a gap (expert {} missing)", at, next));
    }
    next = e + 1;
    for (const char* part : {moe.gate, moe.up, moe.down}) {
      if (!parts.contains(part)) problems.push_back(fmt::format("{}{}: missing", at, part));
    }
    for (const std::string& part : parts) {
      if (part != moe.gate && part != moe.up && part != moe.down) {
        problems.push_back(fmt::format(
            "{}{}: not part of an expert (gate, up, down): its producer or consumer would need "
            "the rewrite too",
            at, part));
      }
    }
    const std::string base = fmt::format("{}{}.", head, e);
    experts.push_back({base + moe.gate, base + moe.up, base + moe.down});
  }
  return experts;
}

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
    return "a mixture of experts with no rule here (Qwen3-MoE's and Mixtral's are known: a "
           "router and experts that all read the post-attention norm; shared experts and their "
           "gates are not handled)";
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
  const bool modelopt = std::find(checkpoint.other_files.begin(), checkpoint.other_files.end(),
                                  "hf_quant_config.json") != checkpoint.other_files.end();
  if (const auto qc = config.find("quantization_config"); qc != config.end() || modelopt) {
    const std::string method = qc != config.end() && qc->is_object()
                                   ? qc->value("quant_method", std::string("unknown"))
                                   : std::string("modelopt");
    family.quantized = fmt::format(
        "INPUT is quantized ({}: quant_method {})",
        modelopt && qc == config.end() ? "hf_quant_config.json" : "config.json", method);
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
  const std::string& arch = family.arch;
  const std::string& model_type = family.model_type;
  auto& problems = layout.problems;
  if (!kSafeArchitectures.contains(arch)) {
    problems.push_back(fmt::format("config.json: architecture '{}' (model_type '{}'): {}", arch,
                                   model_type, rewrite_family_reason(model_type, arch)));
  }
  for (std::string& p : family.problems) problems.push_back(std::move(p));
  if (!family.quantized.empty()) {
    problems.push_back(family.quantized +
                       ": balance rewrites BF16, F16 and F32 weights only; balance the 16-bit "
                       "model it was made from");
  }
  // A family with no rule, or a quantized input: its tensors are not looked
  // at one by one (each would only repeat that its block is not a known one,
  // or that its dtype is not rewritten).
  if (!kSafeArchitectures.contains(arch) || !family.quantized.empty()) return layout;
  const bool moe_family = arch == "Qwen3MoeForCausalLM" || arch == "MixtralForCausalLM";
  const MoeNames& moe = arch == "MixtralForCausalLM" ? kMixtral : kQwen3Moe;
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
  std::set<std::string> attention;
  for (const char* n : kBalanceNorms) attention.insert(std::string(n) + ".weight");
  for (const char* n : kBalanceAttn) attention.insert(std::string("self_attn.") + n + ".weight");
  std::set<std::string> dense;
  for (const char* n : kBalanceMlp) dense.insert(std::string("mlp.") + n + ".weight");
  std::set<std::string> allowed_extra;
  if (arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM") {
    // Per-head norms of q and k after their projections: unchanged by a
    // rewrite of q_proj's and k_proj's input columns.
    allowed_extra.insert("self_attn.q_norm.weight");
    allowed_extra.insert("self_attn.k_norm.weight");
  }
  for (auto& [layer, block] : blocks) {
    auto& [prefix, names] = block;
    BalanceBlock out{prefix, layer, "", {}};
    // A mixture (Qwen3-MoE may keep some layers dense: mlp_only_layers).
    std::set<std::string> expected = attention;
    if (moe_family && names.contains(moe.router)) {
      out.router = moe.router;
      expected.insert(moe.router);
      names.erase(moe.router);
      out.experts = experts_of(prefix, moe, names, problems);
      for (const BalanceExpert& x : out.experts) {
        for (const std::string* n : {&x.gate, &x.up, &x.down}) {
          if (checkpoint.find(prefix + *n) != nullptr) expected.insert(*n);
        }
      }
      bool stacked_found = false;
      for (const char* stacked : {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}) {
        if (names.erase(stacked) > 0) {
          problems.push_back(fmt::format(
              "{}{}: stacked 3-D experts: balance rescales one expert's columns by its own t, "
              "which needs one 2-D tensor per expert (--transform rotate takes stacked experts)",
              prefix, stacked));
          stacked_found = true;
        }
      }
      if (out.experts.empty() && !stacked_found) {
        problems.push_back(fmt::format("{}{}: no experts", prefix, moe.expert));
      }
    } else {
      expected.insert(dense.begin(), dense.end());
    }
    const std::set<std::string> in_block = names;
    for (const std::string& n : in_block) {
      if (expected.contains(n)) continue;
      if (!allowed_extra.contains(n)) {
        problems.push_back(fmt::format(
            "{}{}: not part of a pre-norm Llama block (a bias, a sandwich or post norm, an "
            "attention output gate, a shared expert, an expert or router of a family whose "
            "mixture is not known): its producer or consumer would need the rewrite too",
            prefix, n));
      }
    }
    for (const std::string& n : expected) {
      if (checkpoint.find(prefix + n) == nullptr) {
        problems.push_back(fmt::format("{}{}: missing", prefix, n));
      }
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
    layout.blocks.push_back(std::move(out));
  }
  return layout;
}

}  // namespace ctquant
