// A small Llama model for the transform tests (llama_block.hpp).
#include "llama_block.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/transform/transform.hpp"
#include "ctquant/util/error.hpp"
#include "test_support.hpp"

namespace ctquant::test {

using nlohmann::json;

namespace {

// y[T, rows] = x[T, cols] W^T
std::vector<double> linear(const std::vector<double>& x, std::uint64_t tokens,
                           const std::vector<double>& w, std::uint64_t rows, std::uint64_t cols) {
  std::vector<double> y(tokens * rows, 0.0);
  for (std::uint64_t t = 0; t < tokens; ++t) {
    for (std::uint64_t i = 0; i < rows; ++i) {
      double s = 0;
      for (std::uint64_t j = 0; j < cols; ++j) s += x[t * cols + j] * w[i * cols + j];
      y[t * rows + i] = s;
    }
  }
  return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, std::uint64_t tokens, std::uint64_t h,
                             const std::vector<double>& gamma) {
  std::vector<double> y(x.size());
  for (std::uint64_t t = 0; t < tokens; ++t) {
    double ms = 0;
    for (std::uint64_t j = 0; j < h; ++j) ms += x[t * h + j] * x[t * h + j];
    const double inv = 1.0 / std::sqrt(ms / static_cast<double>(h) + 1e-6);
    for (std::uint64_t j = 0; j < h; ++j) y[t * h + j] = x[t * h + j] * inv * gamma[j];
  }
  return y;
}

}  // namespace

json llama_config(const Geometry& g, const std::string& arch) {
  return {{"architectures", {arch}},           {"model_type", "llama"},
          {"hidden_size", g.hidden},           {"num_attention_heads", g.heads},
          {"num_key_value_heads", g.kv_heads}, {"head_dim", g.head_dim},
          {"intermediate_size", g.inter},      {"num_hidden_layers", 1}};
}

std::vector<float> spread_values(std::uint64_t rows, std::uint64_t cols, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> v(rows * cols);
  for (std::uint64_t i = 0; i < rows; ++i) {
    for (std::uint64_t j = 0; j < cols; ++j) {
      v[i * cols + j] = normal(gen) * std::exp2(static_cast<float>(j % 7) - 3.0f);
    }
  }
  return v;
}

// One Llama block as F32 tensors ("model.layers.0." ...), plus the embedding,
// final norm and head a model has.
TensorValues llama_block(const Geometry& g) {
  const std::uint64_t h = g.hidden, q = g.heads * g.head_dim, kv = g.kv_heads * g.head_dim;
  TensorValues t;
  const std::string p = "model.layers.0.";
  std::uint32_t seed = 1;
  const auto add = [&](const std::string& name, std::uint64_t rows, std::uint64_t cols) {
    t[name] = {{rows, cols}, spread_values(rows, cols, seed++)};
  };
  add(p + "self_attn.q_proj.weight", q, h);
  add(p + "self_attn.k_proj.weight", kv, h);
  add(p + "self_attn.v_proj.weight", kv, h);
  add(p + "self_attn.o_proj.weight", h, q);
  add(p + "mlp.gate_proj.weight", g.inter, h);
  add(p + "mlp.up_proj.weight", g.inter, h);
  add(p + "mlp.down_proj.weight", h, g.inter);
  add("model.embed_tokens.weight", 16, h);
  add("lm_head.weight", 16, h);
  for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
    std::vector<float> gamma = spread_values(1, h, seed++);
    for (float& x : gamma) x = 1.0f + std::fabs(x);
    t[p + n] = {{h}, gamma};
  }
  t["model.norm.weight"] = {{h}, std::vector<float>(h, 1.0f)};
  return t;
}

void write_block(const std::filesystem::path& dir, const Geometry& g, DType dtype,
                 const json& config) {
  std::vector<FakeTensor> tensors;
  for (const auto& [name, tv] : llama_block(g)) {
    tensors.push_back({name, dtype, tv.first, float_bytes(dtype, tv.second)});
  }
  write_checkpoint(dir, tensors, config);
}

// The block's output for input x[T, H] in float64: pre-norm attention
// (causal, GQA: query head i reads KV head i / rep, as repeat_kv) and MLP.
std::vector<double> block_forward(const Weights& w, const Geometry& g, const std::vector<double>& x,
                                  std::uint64_t tokens) {
  const std::string p = "model.layers.0.";
  const std::uint64_t h = g.hidden, hd = g.head_dim, q_dim = g.heads * hd, kv_dim = g.kv_heads * hd,
                      rep = g.heads / g.kv_heads;
  const auto a = rms_norm(x, tokens, h, w.at(p + "input_layernorm.weight"));
  const auto q = linear(a, tokens, w.at(p + "self_attn.q_proj.weight"), q_dim, h);
  const auto k = linear(a, tokens, w.at(p + "self_attn.k_proj.weight"), kv_dim, h);
  const auto v = linear(a, tokens, w.at(p + "self_attn.v_proj.weight"), kv_dim, h);
  std::vector<double> attn(tokens * q_dim, 0.0);
  for (std::uint64_t head = 0; head < g.heads; ++head) {
    const std::uint64_t kvh = head / rep;
    for (std::uint64_t t = 0; t < tokens; ++t) {
      std::vector<double> s(t + 1);
      double mx = -1e300;
      for (std::uint64_t u = 0; u <= t; ++u) {
        double d = 0;
        for (std::uint64_t c = 0; c < hd; ++c) {
          d += q[t * q_dim + head * hd + c] * k[u * kv_dim + kvh * hd + c];
        }
        s[u] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[u]);
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (std::uint64_t u = 0; u <= t; ++u) {
        for (std::uint64_t c = 0; c < hd; ++c) {
          attn[t * q_dim + head * hd + c] += s[u] / z * v[u * kv_dim + kvh * hd + c];
        }
      }
    }
  }
  const auto o = linear(attn, tokens, w.at(p + "self_attn.o_proj.weight"), h, q_dim);
  std::vector<double> r(x);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] += o[i];
  const auto m = rms_norm(r, tokens, h, w.at(p + "post_attention_layernorm.weight"));
  const auto gate = linear(m, tokens, w.at(p + "mlp.gate_proj.weight"), g.inter, h);
  auto up = linear(m, tokens, w.at(p + "mlp.up_proj.weight"), g.inter, h);
  for (std::size_t i = 0; i < up.size(); ++i) up[i] *= gate[i] / (1.0 + std::exp(-gate[i]));
  const auto down = linear(up, tokens, w.at(p + "mlp.down_proj.weight"), h, g.inter);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] += down[i];
  return r;
}

std::vector<double> model_forward(const Weights& w, const Geometry& g,
                                  const std::vector<std::uint64_t>& tokens) {
  const std::uint64_t h = g.hidden, t = tokens.size();
  const std::vector<double>& embed = w.at("model.embed_tokens.weight");
  const std::uint64_t vocab = embed.size() / h;
  std::vector<double> x(t * h);
  for (std::uint64_t i = 0; i < t; ++i) {
    std::copy_n(embed.begin() + static_cast<std::ptrdiff_t>(tokens[i] * h), h,
                x.begin() + static_cast<std::ptrdiff_t>(i * h));
  }
  const auto y = rms_norm(block_forward(w, g, x, t), t, h, w.at("model.norm.weight"));
  const auto head = w.find("lm_head.weight");
  return linear(y, t, head != w.end() ? head->second : embed, vocab, h);
}

OutputDifference output_difference(const std::vector<double>& a, const std::vector<double>& b) {
  OutputDifference d;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d.worst = std::max(d.worst, std::fabs(a[i] - b[i]));
    d.largest = std::max(d.largest, std::fabs(a[i]));
  }
  return d;
}

std::string transform_refusal(const std::filesystem::path& dir, const std::string& name) {
  try {
    plan_transform(open_checkpoint(dir), name);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

}  // namespace ctquant::test
