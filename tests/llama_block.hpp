// A small Llama model for the transform tests: one decoder block's tensors
// with seeded values, its config.json, and its float64 forward pass
// (transformers' modeling_llama.py: RMSNorm x * g, GQA attention without
// RoPE, which a rewrite of the Linears' inputs and outputs never touches,
// SwiGLU MLP), so a rewrite is checked by computing the same outputs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"

namespace ctquant::test {

struct Geometry {
  std::uint64_t hidden = 8, heads = 4, kv_heads = 2, head_dim = 2, inter = 16;
};

nlohmann::json llama_config(const Geometry& g, const std::string& arch = "LlamaForCausalLM");

// Seeded values with column magnitudes spread over 1/8 .. 8.
std::vector<float> spread_values(std::uint64_t rows, std::uint64_t cols, std::uint32_t seed);

using TensorValues =
    std::map<std::string, std::pair<std::vector<std::uint64_t>, std::vector<float>>>;

// One Llama block as F32 values ("model.layers.0." ...), plus the embedding
// (16 tokens), final norm and head a model has.
TensorValues llama_block(const Geometry& g);

// Writes llama_block(g) as a checkpoint of `dtype` into dir.
void write_block(const std::filesystem::path& dir, const Geometry& g, DType dtype,
                 const nlohmann::json& config);

using Weights = std::map<std::string, std::vector<double>>;

// The block's output for input x[T, H] in float64: pre-norm attention
// (causal, GQA: query head i reads KV head i / rep, as repeat_kv) and MLP.
std::vector<double> block_forward(const Weights& w, const Geometry& g, const std::vector<double>& x,
                                  std::uint64_t tokens);

// Logits [T, vocab] of the one-block model for token ids: embedding, the
// block, the final norm and the head (the embedding when `lm_head.weight`
// is absent: tied).
std::vector<double> model_forward(const Weights& w, const Geometry& g,
                                  const std::vector<std::uint64_t>& tokens);

// The largest |a[i] - b[i]| and the largest |a[i]|, over a's elements (b at
// least as long): how far a rewritten model's outputs moved, against their size.
struct OutputDifference {
  double worst = 0, largest = 0;
};
OutputDifference output_difference(const std::vector<double>& a, const std::vector<double>& b);

// The message with which --transform `name` refuses the checkpoint at dir
// (an Error{kUsage}, checked), or "" when it is accepted.
std::string transform_refusal(const std::filesystem::path& dir, const std::string& name);

}  // namespace ctquant::test
