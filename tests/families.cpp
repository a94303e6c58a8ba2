#include "families.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

namespace ctquant::test {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::uint64_t H = 256;       // hidden size
constexpr std::uint64_t V = 512;       // vocab size
constexpr std::uint64_t I = 512;       // dense intermediate size
constexpr std::uint64_t E = 4;         // experts
constexpr std::uint64_t MI = 128;      // expert intermediate size
constexpr std::uint64_t HD = 128;      // head dim
constexpr std::uint64_t Q = 2 * HD;    // 2 attention heads
constexpr std::uint64_t KV = HD;       // 1 key/value head
constexpr std::uint64_t VH = 128;      // vision hidden size
constexpr std::uint64_t VI = 256;      // vision intermediate size

struct Tensors {
  std::vector<FakeSpec> list;
  void add(const std::string& name, std::vector<std::uint64_t> shape, DType dtype = DType::kBF16) {
    list.push_back(FakeSpec{name, std::move(shape), dtype});
  }
  void linear(const std::string& module, std::uint64_t out, std::uint64_t in, bool bias = false) {
    add(module + ".weight", {out, in});
    if (bias) add(module + ".bias", {out});
  }
  void norm(const std::string& module, std::uint64_t dim) { add(module + ".weight", {dim}); }
  // Llama-style attention and norms of one decoder layer.
  void attention(const std::string& layer, bool qk_norm = false, bool bias = false) {
    norm(layer + ".input_layernorm", H);
    linear(layer + ".self_attn.q_proj", Q, H, bias);
    linear(layer + ".self_attn.k_proj", KV, H, bias);
    linear(layer + ".self_attn.v_proj", KV, H, bias);
    linear(layer + ".self_attn.o_proj", H, Q);
    if (qk_norm) {
      norm(layer + ".self_attn.q_norm", HD);
      norm(layer + ".self_attn.k_norm", HD);
    }
    norm(layer + ".post_attention_layernorm", H);
  }
  void mlp(const std::string& prefix, std::uint64_t inter = I) {
    linear(prefix + ".gate_proj", inter, H);
    linear(prefix + ".up_proj", inter, H);
    linear(prefix + ".down_proj", H, inter);
  }
  void experts(const std::string& prefix, const char* gate = "gate_proj",
               const char* up = "up_proj", const char* down = "down_proj") {
    for (std::uint64_t e = 0; e < E; ++e) {
      const std::string p = prefix + "." + std::to_string(e) + ".";
      linear(p + gate, MI, H);
      linear(p + up, MI, H);
      linear(p + down, H, MI);
    }
  }
};

json llama_config(const char* architecture, const char* model_type) {
  return json{{"architectures", {architecture}},
              {"model_type", model_type},
              {"hidden_size", H},
              {"intermediate_size", I},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 1},
              {"head_dim", HD},
              {"num_hidden_layers", 2},
              {"vocab_size", V},
              {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"}};
}

FamilyCheckpoint single(json config, Tensors t) {
  FamilyCheckpoint c;
  c.config = std::move(config);
  c.shards.emplace_back("model.safetensors", std::move(t.list));
  return c;
}

FamilyCheckpoint llama() {
  Tensors t;
  t.linear("model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.attention(p);
    t.mlp(p + ".mlp");
  }
  t.norm("model.norm", H);
  t.linear("lm_head", V, H);
  return single(llama_config("LlamaForCausalLM", "llama"), std::move(t));
}

FamilyCheckpoint qwen3_tied() {
  Tensors t;
  t.linear("model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.attention(p, /*qk_norm=*/true);
    t.mlp(p + ".mlp");
  }
  t.norm("model.norm", H);
  json config = llama_config("Qwen3ForCausalLM", "qwen3");
  config["tie_word_embeddings"] = true;
  return single(std::move(config), std::move(t));
}

json qwen3_moe_config() {
  json config = llama_config("Qwen3MoeForCausalLM", "qwen3_moe");
  config["num_experts"] = E;
  config["num_experts_per_tok"] = 2;
  config["moe_intermediate_size"] = MI;
  config["decoder_sparse_step"] = 1;
  config["mlp_only_layers"] = json::array();
  config["norm_topk_prob"] = true;
  return config;
}

FamilyCheckpoint qwen3_moe(bool fused) {
  Tensors t;
  t.linear("model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.attention(p, /*qk_norm=*/true);
    t.linear(p + ".mlp.gate", E, H);
    if (fused) {
      // transformers v5: [E, 2I, H] (gate rows then up rows) and [E, H, I], no .weight.
      t.add(p + ".mlp.experts.gate_up_proj", {E, 2 * MI, H});
      t.add(p + ".mlp.experts.down_proj", {E, H, MI});
    } else {
      t.experts(p + ".mlp.experts");
    }
  }
  t.norm("model.norm", H);
  t.linear("lm_head", V, H);
  return single(qwen3_moe_config(), std::move(t));
}

FamilyCheckpoint qwen2_moe() {
  Tensors t;
  t.linear("model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.attention(p, /*qk_norm=*/false, /*bias=*/true);
    t.linear(p + ".mlp.gate", E, H);
    t.experts(p + ".mlp.experts");
    t.mlp(p + ".mlp.shared_expert", I);
    t.linear(p + ".mlp.shared_expert_gate", 1, H);
  }
  t.norm("model.norm", H);
  t.linear("lm_head", V, H);
  json config = llama_config("Qwen2MoeForCausalLM", "qwen2_moe");
  config["num_experts"] = E;
  config["moe_intermediate_size"] = MI;
  config["shared_expert_intermediate_size"] = I;
  config["decoder_sparse_step"] = 1;
  config["mlp_only_layers"] = json::array();
  return single(std::move(config), std::move(t));
}

FamilyCheckpoint mixtral() {
  Tensors t;
  t.linear("model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.attention(p);
    t.linear(p + ".block_sparse_moe.gate", E, H);
    t.experts(p + ".block_sparse_moe.experts", "w1", "w3", "w2");
  }
  t.norm("model.norm", H);
  t.linear("lm_head", V, H);
  json config = llama_config("MixtralForCausalLM", "mixtral");
  config["num_local_experts"] = E;
  config["num_experts_per_tok"] = 2;
  config["intermediate_size"] = MI;
  return single(std::move(config), std::move(t));
}

// DeepSeek-V3: block FP8 (128 x 128) linear weights with F32
// weight_scale_inv; embeddings, heads, norms and routers in BF16.
FamilyCheckpoint deepseek_v3() {
  Tensors t;
  const auto fp8 = [&](const std::string& module, std::uint64_t out, std::uint64_t in) {
    t.add(module + ".weight", {out, in}, DType::kF8_E4M3);
    t.add(module + ".weight_scale_inv", {(out + 127) / 128, (in + 127) / 128}, DType::kF32);
  };
  constexpr std::uint64_t kQLora = 128, kKvLora = 128, kRope = 64, kNope = 64, kV = 64;
  const auto layer = [&](const std::string& p, bool moe) {
    t.norm(p + ".input_layernorm", H);
    fp8(p + ".self_attn.q_a_proj", kQLora, H);
    t.norm(p + ".self_attn.q_a_layernorm", kQLora);
    fp8(p + ".self_attn.q_b_proj", 2 * (kNope + kRope), kQLora);
    fp8(p + ".self_attn.kv_a_proj_with_mqa", kKvLora + kRope, H);
    t.norm(p + ".self_attn.kv_a_layernorm", kKvLora);
    fp8(p + ".self_attn.kv_b_proj", 2 * (kNope + kV), kKvLora);
    fp8(p + ".self_attn.o_proj", H, 2 * kV);
    t.norm(p + ".post_attention_layernorm", H);
    if (!moe) {
      fp8(p + ".mlp.gate_proj", I, H);
      fp8(p + ".mlp.up_proj", I, H);
      fp8(p + ".mlp.down_proj", H, I);
      return;
    }
    t.linear(p + ".mlp.gate", E, H);
    t.add(p + ".mlp.gate.e_score_correction_bias", {E}, DType::kF32);
    for (std::uint64_t e = 0; e < E; ++e) {
      const std::string x = p + ".mlp.experts." + std::to_string(e);
      fp8(x + ".gate_proj", MI, H);
      fp8(x + ".up_proj", MI, H);
      fp8(x + ".down_proj", H, MI);
    }
    fp8(p + ".mlp.shared_experts.gate_proj", MI, H);
    fp8(p + ".mlp.shared_experts.up_proj", MI, H);
    fp8(p + ".mlp.shared_experts.down_proj", H, MI);
  };
  t.linear("model.embed_tokens", V, H);
  layer("model.layers.0", false);
  layer("model.layers.1", true);
  // The MTP layer: index num_hidden_layers.
  const std::string mtp = "model.layers.2";
  t.linear(mtp + ".embed_tokens", V, H);
  t.norm(mtp + ".enorm", H);
  t.norm(mtp + ".hnorm", H);
  fp8(mtp + ".eh_proj", H, 2 * H);
  layer(mtp, true);
  t.norm(mtp + ".shared_head.norm", H);
  t.linear(mtp + ".shared_head.head", V, H);
  t.norm("model.norm", H);
  t.linear("lm_head", V, H);
  json config = llama_config("DeepseekV3ForCausalLM", "deepseek_v3");
  config["n_routed_experts"] = E;
  config["n_shared_experts"] = 1;
  config["moe_intermediate_size"] = MI;
  config["first_k_dense_replace"] = 1;
  config["num_nextn_predict_layers"] = 1;
  config["q_lora_rank"] = kQLora;
  config["kv_lora_rank"] = kKvLora;
  config["qk_rope_head_dim"] = kRope;
  config["qk_nope_head_dim"] = kNope;
  config["v_head_dim"] = kV;
  config["topk_method"] = "noaux_tc";
  config["quantization_config"] = {
      {"quant_method", "fp8"},
      {"fmt", "e4m3"},
      {"activation_scheme", "dynamic"},
      {"weight_block_size", {128, 128}}};
  return single(std::move(config), std::move(t));
}

// A Pixtral / CLIP-style tower layer.
void pixtral_tower(Tensors& t, const std::string& root) {
  t.add(root + ".patch_conv.weight", {VH, 3, 14, 14});
  t.norm(root + ".ln_pre", VH);
  const std::string p = root + ".transformer.layers.0";
  t.norm(p + ".attention_norm", VH);
  for (const char* x : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    t.linear(p + ".attention." + x, VH, VH);
  }
  t.norm(p + ".ffn_norm", VH);
  t.linear(p + ".feed_forward.gate_proj", VI, VH);
  t.linear(p + ".feed_forward.up_proj", VI, VH);
  t.linear(p + ".feed_forward.down_proj", VH, VI);
}

json vlm_config(const char* architecture, const char* model_type, json text, json vision) {
  return json{{"architectures", {architecture}},
              {"model_type", model_type},
              {"text_config", std::move(text)},
              {"vision_config", std::move(vision)},
              {"torch_dtype", "bfloat16"}};
}

FamilyCheckpoint mistral3() {
  Tensors t;
  pixtral_tower(t, "model.vision_tower");
  t.norm("model.multi_modal_projector.norm", VH);
  t.linear("model.multi_modal_projector.patch_merger.merging_layer", VH, VH * 4);
  t.linear("model.multi_modal_projector.linear_1", H, VH);
  t.linear("model.multi_modal_projector.linear_2", H, H);
  t.linear("model.language_model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.language_model.layers." + std::to_string(l);
    t.attention(p);
    t.mlp(p + ".mlp");
  }
  t.norm("model.language_model.norm", H);
  t.linear("lm_head", V, H);
  json text = llama_config("MistralForCausalLM", "mistral");
  text.erase("architectures");
  json vision = {{"model_type", "pixtral"}, {"hidden_size", VH}, {"intermediate_size", VI}};
  json config = vlm_config("Mistral3ForConditionalGeneration", "mistral3", text, vision);
  config["spatial_merge_size"] = 2;
  return single(std::move(config), std::move(t));
}

FamilyCheckpoint llava_old() {
  Tensors t;
  const std::string v = "vision_tower.vision_model";
  t.add(v + ".embeddings.patch_embedding.weight", {VH, 3, 14, 14});
  t.linear(v + ".embeddings.position_embedding", 50, VH);
  t.norm(v + ".pre_layrnorm", VH);
  const std::string p = v + ".encoder.layers.0";
  for (const char* x : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
    t.linear(p + ".self_attn." + x, VH, VH, true);
  }
  t.norm(p + ".layer_norm1", VH);
  t.linear(p + ".mlp.fc1", VI, VH, true);
  t.linear(p + ".mlp.fc2", VH, VI, true);
  t.norm(p + ".layer_norm2", VH);
  t.linear("multi_modal_projector.linear_1", H, VH, true);
  t.linear("multi_modal_projector.linear_2", H, H, true);
  t.linear("language_model.model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string q = "language_model.model.layers." + std::to_string(l);
    t.attention(q);
    t.mlp(q + ".mlp");
  }
  t.norm("language_model.model.norm", H);
  t.linear("language_model.lm_head", V, H);
  json text = llama_config("LlamaForCausalLM", "llama");
  text.erase("architectures");
  json vision = {{"model_type", "clip_vision_model"}, {"hidden_size", VH}, {"intermediate_size", VI}};
  return single(vlm_config("LlavaForConditionalGeneration", "llava", text, vision), std::move(t));
}

FamilyCheckpoint gemma3() {
  Tensors t;
  const std::string v = "model.vision_tower.vision_model";
  constexpr std::uint64_t kSiglipInter = 200;  // not a multiple of 64: fc1/fc2 are plain
  t.add(v + ".embeddings.patch_embedding.weight", {VH, 3, 14, 14});
  t.add(v + ".embeddings.patch_embedding.bias", {VH});
  t.linear(v + ".embeddings.position_embedding", 64, VH);
  const std::string p = v + ".encoder.layers.0";
  for (const char* x : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
    t.linear(p + ".self_attn." + x, VH, VH, true);
  }
  t.norm(p + ".layer_norm1", VH);
  t.linear(p + ".mlp.fc1", kSiglipInter, VH, true);
  t.linear(p + ".mlp.fc2", VH, kSiglipInter, true);
  t.norm(p + ".layer_norm2", VH);
  t.norm(v + ".post_layernorm", VH);
  t.add("model.multi_modal_projector.mm_input_projection_weight", {VH, H});
  t.norm("model.multi_modal_projector.mm_soft_emb_norm", VH);
  t.linear("model.language_model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string q = "model.language_model.layers." + std::to_string(l);
    t.attention(q, /*qk_norm=*/true);
    t.norm(q + ".pre_feedforward_layernorm", H);
    t.norm(q + ".post_feedforward_layernorm", H);
    t.mlp(q + ".mlp");
  }
  t.norm("model.language_model.norm", H);
  json text = llama_config("Gemma3ForCausalLM", "gemma3_text");
  text.erase("architectures");
  text["tie_word_embeddings"] = true;
  json vision = {{"model_type", "siglip_vision_model"},
                 {"hidden_size", VH},
                 {"intermediate_size", kSiglipInter}};
  return single(vlm_config("Gemma3ForConditionalGeneration", "gemma3", text, vision),
                std::move(t));
}

FamilyCheckpoint qwen25_vl() {
  Tensors t;
  t.add("visual.patch_embed.proj.weight", {VH, 3, 2, 14, 14});
  const std::string b = "visual.blocks.0";
  t.norm(b + ".norm1", VH);
  t.linear(b + ".attn.qkv", 3 * VH, VH, true);
  t.linear(b + ".attn.proj", VH, VH, true);
  t.norm(b + ".norm2", VH);
  t.linear(b + ".mlp.gate_proj", VI, VH, true);
  t.linear(b + ".mlp.up_proj", VI, VH, true);
  t.linear(b + ".mlp.down_proj", VH, VI, true);
  t.norm("visual.merger.ln_q", VH);
  t.linear("visual.merger.mlp.0", 4 * VH, 4 * VH, true);
  t.linear("visual.merger.mlp.2", H, 4 * VH, true);
  t.linear("model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string q = "model.layers." + std::to_string(l);
    t.attention(q, false, true);
    t.mlp(q + ".mlp");
  }
  t.norm("model.norm", H);
  t.linear("lm_head", V, H);
  json config = llama_config("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl");
  config["vision_config"] = {{"hidden_size", VH}, {"intermediate_size", VI}, {"out_hidden_size", H}};
  return single(std::move(config), std::move(t));
}

FamilyCheckpoint gpt_oss() {
  constexpr std::uint64_t kI = 192;  // intermediate_size: 2I = 384, H = 256
  Tensors t;
  t.linear("model.embed_tokens", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.norm(p + ".input_layernorm", H);
    t.linear(p + ".self_attn.q_proj", Q, H, true);
    t.linear(p + ".self_attn.k_proj", KV, H, true);
    t.linear(p + ".self_attn.v_proj", KV, H, true);
    t.linear(p + ".self_attn.o_proj", H, Q, true);
    t.add(p + ".self_attn.sinks", {2}, DType::kF32);
    t.norm(p + ".post_attention_layernorm", H);
    t.linear(p + ".mlp.router", E, H, true);
    t.add(p + ".mlp.experts.gate_up_proj", {E, H, 2 * kI});
    t.add(p + ".mlp.experts.gate_up_proj_bias", {E, 2 * kI});
    t.add(p + ".mlp.experts.down_proj", {E, kI, H});
    t.add(p + ".mlp.experts.down_proj_bias", {E, H});
  }
  t.norm("model.norm", H);
  t.linear("lm_head", V, H);
  json config = llama_config("GptOssForCausalLM", "gpt_oss");
  config["num_local_experts"] = E;
  config["experts_per_token"] = 2;
  config["intermediate_size"] = kI;
  return single(std::move(config), std::move(t));
}

FamilyCheckpoint eagle3() {
  constexpr std::uint64_t kDraftVocab = 128;
  Tensors t;
  t.linear("fc", H, 3 * H);
  t.norm("midlayer.hidden_norm", H);
  t.norm("midlayer.input_layernorm", H);
  t.linear("midlayer.self_attn.q_proj", Q, 2 * H);
  t.linear("midlayer.self_attn.k_proj", KV, 2 * H);
  t.linear("midlayer.self_attn.v_proj", KV, 2 * H);
  t.linear("midlayer.self_attn.o_proj", H, Q);
  t.norm("midlayer.post_attention_layernorm", H);
  t.mlp("midlayer.mlp");
  t.norm("norm", H);
  t.linear("lm_head", kDraftVocab, H);
  t.add("d2t", {kDraftVocab}, DType::kI64);
  t.add("t2d", {V}, DType::kBool);
  json config = llama_config("LlamaForCausalLMEagle3", "llama");
  config["num_hidden_layers"] = 1;
  config["draft_vocab_size"] = kDraftVocab;
  return single(std::move(config), std::move(t));
}

FamilyCheckpoint mistral_consolidated() {
  FamilyCheckpoint c;
  c.config = llama_config("MistralForCausalLM", "mistral");
  Tensors a;
  a.linear("model.embed_tokens", V, H);
  a.attention("model.layers.0");
  a.mlp("model.layers.0.mlp");
  Tensors b;
  b.attention("model.layers.1");
  b.mlp("model.layers.1.mlp");
  b.norm("model.norm", H);
  b.linear("lm_head", V, H);
  c.shards.emplace_back("model-00001-of-00002.safetensors", std::move(a.list));
  c.shards.emplace_back("model-00002-of-00002.safetensors", std::move(b.list));
  c.index = true;
  // A buffer an old exporter left in the shard but not in the index.
  c.unindexed.emplace_back("model-00001-of-00002.safetensors",
                           FakeSpec{"model.layers.0.self_attn.rotary_emb.inv_freq", {64},
                                    DType::kF32});
  // Mistral's own format beside the HF shards: other names, same weights.
  Tensors m;
  m.linear("tok_embeddings", V, H);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "layers." + std::to_string(l);
    m.linear(p + ".attention.wq", Q, H);
    m.linear(p + ".attention.wk", KV, H);
    m.linear(p + ".attention.wv", KV, H);
    m.linear(p + ".attention.wo", H, Q);
    m.linear(p + ".feed_forward.w1", I, H);
    m.linear(p + ".feed_forward.w2", H, I);
    m.linear(p + ".feed_forward.w3", I, H);
    m.norm(p + ".attention_norm", H);
    m.norm(p + ".ffn_norm", H);
  }
  m.norm("norm", H);
  m.linear("output", V, H);
  c.consolidated = std::move(m.list);
  c.files.emplace_back("params.json",
                       json{{"dim", H}, {"n_layers", 2}, {"vocab_size", V}}.dump(2));
  return c;
}

// A safetensors file of specs: sparse zeros, or seeded values for 2-D floats.
void write_specs(const fs::path& path, const std::vector<FakeSpec>& specs, bool random,
                 std::uint32_t& seed) {
  if (random) {
    std::vector<FakeTensor> tensors;
    for (const auto& s : specs) {
      if (s.shape.size() == 2 && is_quantizable_float(s.dtype)) {
        tensors.push_back(random_weight(s.name, s.dtype, s.shape[0], s.shape[1], seed++));
      } else {
        tensors.push_back(FakeTensor{s.name, s.dtype, s.shape,
                                     std::vector<std::byte>(fake_bytes(s), std::byte{0})});
      }
    }
    write_safetensors(path, tensors);
    return;
  }
  std::vector<TensorSpec> tensors;
  for (const auto& s : specs) tensors.push_back(TensorSpec{s.name, s.dtype, s.shape, fake_bytes(s)});
  const ShardLayout layout = layout_shard(tensors, {{"format", "pt"}});
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(layout.header.data(), static_cast<std::streamsize>(layout.header.size()));
    if (!out) throw std::runtime_error("cannot write " + path.string());
  }
  if (::truncate(path.c_str(), static_cast<off_t>(layout.file_size)) != 0) {
    throw std::runtime_error("cannot size " + path.string());
  }
}

}  // namespace

std::vector<Family> all_families() {
  return {Family::kLlama,    Family::kQwen3Tied, Family::kQwen3Moe,  Family::kQwen3MoeFused,
          Family::kQwen2MoeShared, Family::kMixtral, Family::kDeepSeekV3, Family::kMistral3,
          Family::kLlavaOld, Family::kGemma3,    Family::kQwen25Vl,  Family::kGptOss,
          Family::kEagle3,   Family::kMistralConsolidated};
}

const char* family_name(Family family) {
  switch (family) {
    case Family::kLlama:
      return "llama";
    case Family::kQwen3Tied:
      return "qwen3_tied";
    case Family::kQwen3Moe:
      return "qwen3_moe";
    case Family::kQwen3MoeFused:
      return "qwen3_moe_fused";
    case Family::kQwen2MoeShared:
      return "qwen2_moe_shared";
    case Family::kMixtral:
      return "mixtral";
    case Family::kDeepSeekV3:
      return "deepseek_v3";
    case Family::kMistral3:
      return "mistral3";
    case Family::kLlavaOld:
      return "llava_old";
    case Family::kGemma3:
      return "gemma3";
    case Family::kQwen25Vl:
      return "qwen2_5_vl";
    case Family::kGptOss:
      return "gpt_oss";
    case Family::kEagle3:
      return "eagle3";
    case Family::kMistralConsolidated:
      return "mistral_consolidated";
  }
  return "?";
}

FamilyCheckpoint make_family(Family family) {
  switch (family) {
    case Family::kLlama:
      return llama();
    case Family::kQwen3Tied:
      return qwen3_tied();
    case Family::kQwen3Moe:
      return qwen3_moe(false);
    case Family::kQwen3MoeFused:
      return qwen3_moe(true);
    case Family::kQwen2MoeShared:
      return qwen2_moe();
    case Family::kMixtral:
      return mixtral();
    case Family::kDeepSeekV3:
      return deepseek_v3();
    case Family::kMistral3:
      return mistral3();
    case Family::kLlavaOld:
      return llava_old();
    case Family::kGemma3:
      return gemma3();
    case Family::kQwen25Vl:
      return qwen25_vl();
    case Family::kGptOss:
      return gpt_oss();
    case Family::kEagle3:
      return eagle3();
    case Family::kMistralConsolidated:
      return mistral_consolidated();
  }
  throw std::logic_error("unknown family");
}

void write_family(const fs::path& dir, Family family, bool random) {
  const FamilyCheckpoint c = make_family(family);
  fs::create_directories(dir);
  std::uint32_t seed = 1;
  json weight_map = json::object();
  std::uint64_t total = 0;
  for (const auto& [file, specs] : c.shards) {
    std::vector<FakeSpec> all = specs;
    for (const auto& [f, spec] : c.unindexed) {
      if (f == file) all.push_back(spec);
    }
    write_specs(dir / file, all, random, seed);
    for (const auto& s : specs) {
      weight_map[s.name] = file;
      total += fake_bytes(s);
    }
  }
  if (c.index) {
    write_file(dir / "model.safetensors.index.json",
               json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2));
  }
  if (!c.consolidated.empty()) write_specs(dir / "consolidated.safetensors", c.consolidated, random, seed);
  for (const auto& [name, content] : c.files) write_file(dir / name, content);
  write_config(dir, c.config);
}

}  // namespace ctquant::test
