// Which checkpoints a function-keeping rewrite (transform/transform.hpp)
// may change, decided from config.json and the tensor names alone: the
// blocks `--transform balance` rewrites and every reason it refuses
// (`--transform rotate` takes the attention geometry and the family
// reasons from here and classifies its blocks itself, mixtures of experts
// included: src/transform/rotate.cpp).
//
// A block is safe to rewrite when it is exactly a pre-norm Llama block:
// RMSNorm x * g with no bias (input_layernorm feeding q/k/v,
// post_attention_layernorm feeding gate/up), no Linear biases, attention
// output o_proj(attn(v)) and MLP down(act(gate) * up), as transformers'
// modeling_llama.py and modeling_qwen3.py compute them (Qwen3's q_norm and
// k_norm act on q and k after their projections, which the rewrite leaves
// unchanged). The MLP may be a mixture of experts whose router and experts
// all read post_attention_layernorm (Qwen3-MoE, Mixtral; one 2-D tensor per
// expert): every one of them is compensated. Refused: Gemma's (1 + g)
// norms, sandwich / post norms, MLA, attention output gates, shared
// experts, stacked 3-D experts, other mixtures, biases, drafts
// (DFlash, EAGLE: their fc and hidden-state inputs feed norms ctquant does
// not see), and any tensor in a block that is not one of these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

// One expert of a mixture, its tensor names after the block prefix
// ("mlp.experts.3.gate_proj.weight"; Mixtral's w1 / w3 / w2).
struct BalanceExpert {
  std::string gate, up, down;
};

// One decoder block to balance: its tensor name prefix ("model.layers.3.")
// and its MLP: dense (mlp.gate_proj / up_proj / down_proj), or a router
// and experts that all read post_attention_layernorm (Qwen3-MoE's
// mlp.gate and mlp.experts.E.*, Mixtral's block_sparse_moe.gate and
// block_sparse_moe.experts.E.w1 / w3 / w2; transformers'
// modeling_qwen3_moe.py, modeling_mixtral.py).
struct BalanceBlock {
  std::string prefix;
  std::uint64_t layer = 0;
  std::string router;                  // "" for a dense MLP
  std::vector<BalanceExpert> experts;  // by expert number; empty for a dense MLP
};

struct BalanceLayout {
  std::vector<BalanceBlock> blocks;  // by layer number
  std::uint64_t heads = 0;           // num_attention_heads
  std::uint64_t kv_heads = 0;        // num_key_value_heads
  std::uint64_t head_dim = 0;        // head_dim, or hidden_size / heads
  // Every reason the checkpoint cannot be balanced; empty when it can.
  std::vector<std::string> problems;
};

// Why a family that is not a pre-norm Llama family is refused, from a
// fragment of its model_type or architecture (a draft, Gemma, MLA, a
// mixture of experts, or none known).
std::string rewrite_family_reason(const std::string& model_type, const std::string& arch);

// What config.json says of a checkpoint a rewrite may change: its family,
// attention geometry, and the reasons every rewrite refuses (no config.json,
// biased Linears, heads that do not make whole GQA groups). Reads config.json
// only.
struct RewriteFamily {
  std::string model_type;
  std::string arch;            // the one entry of `architectures`, or ""
  std::uint64_t heads = 0;     // num_attention_heads
  std::uint64_t kv_heads = 0;  // num_key_value_heads (heads when absent)
  std::uint64_t head_dim = 0;  // head_dim, or hidden_size / heads
  std::vector<std::string> problems;
  // "INPUT is quantized (config.json: quant_method fp8)" when config.json
  // has a quantization_config or hf_quant_config.json sits beside it (FP8,
  // AWQ, ModelOpt, compressed-tensors): one reason for the whole input, not
  // one per tensor it stores; "" for a 16-bit input. Not in `problems`:
  // each rewrite says what it would need instead.
  std::string quantized;
};
RewriteFamily rewrite_family(const Checkpoint& checkpoint);

// The blocks of `checkpoint` and the reasons to refuse (reads config.json
// and the tensor names and shapes; never the data).
BalanceLayout balance_layout(const Checkpoint& checkpoint);

// The names of a block's tensors balance reads or rewrites, by role.
inline constexpr const char* kBalanceNorms[] = {"input_layernorm", "post_attention_layernorm"};
inline constexpr const char* kBalanceAttn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
inline constexpr const char* kBalanceMlp[] = {"gate_proj", "up_proj", "down_proj"};

}  // namespace ctquant
