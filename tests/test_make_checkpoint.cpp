// The synthetic checkpoint generator (tools/make_checkpoint.cpp) writes FP8
// layouts as FP8 checkpoints are made: per 128 x 128 block (block FP8,
// F32 weight_scale_inv) or per row (compressed-tensors channel FP8, BF16
// weight_scale [N, 1]), scale = amax / 448, codes rounded to nearest; so the
// dequantized values are the seeded normal weights again (std 0.02), and
// ctquant converts them. Also: the DeepSeek-V3 layout's shapes follow its
// config, and its totals add up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/safetensors.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::CommandResult;
using test::TempDir;

constexpr float kE4m3Max = 448.0f;
// The next E4M3 value below 448: a block's largest element lands on 448, or
// on 416 when a BF16 scale rounded up.
constexpr float kE4m3BelowMax = 416.0f;
// The generator's normal values (std 0.02) with rare outliers.
constexpr double kStd = 0.02;

// The generator's exit code, with its stderr appended to out (for messages).
CommandResult generate(const std::string& manifest, const fs::path& out,
                       const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {(test::layouts_dir() / manifest).string(), out.string(),
                                   "--seed", "5"};
  args.insert(args.end(), extra.begin(), extra.end());
  CommandResult r = test::run_make_checkpoint(args);
  r.out += r.err;
  return r;
}

std::vector<std::byte> tensor_bytes(const SafetensorsFile& f, const std::string& name) {
  const TensorEntry* t = f.header().find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<std::byte> bytes(t->byte_size());
  f.read(t->begin, bytes);
  return bytes;
}

// Checks one FP8 weight: the codes of each scale's block reach the top of
// the E4M3 range, and the dequantized values have the generator's spread.
void check_fp8_weight(const SafetensorsFile& f, const std::string& module,
                      const std::string& scale_suffix, std::uint64_t block_rows,
                      std::uint64_t block_cols) {
  SCOPED_TRACE(module);
  const TensorEntry* w = f.header().find(module + ".weight");
  const TensorEntry* s = f.header().find(module + scale_suffix);
  ASSERT_NE(w, nullptr);
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(w->dtype, DType::kF8_E4M3);
  const std::uint64_t rows = w->shape[0];
  const std::uint64_t cols = w->shape[1];
  const std::vector<std::byte> codes = tensor_bytes(f, w->name);
  const std::vector<std::byte> scales = tensor_bytes(f, s->name);
  const std::uint64_t grid_cols = (cols + block_cols - 1) / block_cols;
  const std::uint64_t scale_bytes = static_cast<std::uint64_t>(dtype_bits(s->dtype) / 8);
  double sum = 0;
  double sum_sq = 0;
  for (std::uint64_t r0 = 0; r0 < rows; r0 += block_rows) {
    for (std::uint64_t c0 = 0; c0 < cols; c0 += block_cols) {
      const std::uint64_t g = (r0 / block_rows) * grid_cols + c0 / block_cols;
      const float scale = load_as_float(s->dtype, &scales[g * scale_bytes]);
      ASSERT_GT(scale, 0.0f);
      float top = 0;
      for (std::uint64_t r = r0; r < std::min(rows, r0 + block_rows); ++r) {
        for (std::uint64_t c = c0; c < std::min(cols, c0 + block_cols); ++c) {
          const float code = f8_e4m3_to_float(std::to_integer<std::uint8_t>(codes[r * cols + c]));
          ASSERT_TRUE(std::isfinite(code)) << "NaN code at [" << r << ", " << c << "]";
          top = std::max(top, std::fabs(code));
          const double value = static_cast<double>(code) * static_cast<double>(scale);
          sum += value;
          sum_sq += value * value;
        }
      }
      EXPECT_GE(top, kE4m3BelowMax) << "block at [" << r0 << ", " << c0 << "]";
      EXPECT_LE(top, kE4m3Max);
    }
  }
  const double n = static_cast<double>(rows * cols);
  const double mean = sum / n;
  const double std = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.1 * kStd);
  EXPECT_NEAR(std, kStd, 0.15 * kStd);  // outliers (1 in 10^4, x20) widen it a little
}

TEST(MakeCheckpoint, BlockFp8IsQuantizedPerBlock) {
  TempDir tmp;
  const CommandResult r = generate("fp8-block.manifest.json", tmp / "ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const SafetensorsFile f(tmp / "ckpt" / "model.safetensors", "model.safetensors");
  EXPECT_EQ(f.header().find("model.layers.0.mlp.gate_proj.weight_scale_inv")->dtype, DType::kF32);
  for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.gate_proj",
                        "model.layers.1.mlp.down_proj"}) {
    check_fp8_weight(f, m, ".weight_scale_inv", 128, 128);
  }
}

TEST(MakeCheckpoint, ChannelFp8IsQuantizedPerRow) {
  TempDir tmp;
  const CommandResult r = generate("fp8-channel.manifest.json", tmp / "ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const SafetensorsFile f(tmp / "ckpt" / "model.safetensors", "model.safetensors");
  EXPECT_EQ(f.header().find("model.layers.0.mlp.up_proj.weight_scale")->dtype, DType::kBF16);
  EXPECT_EQ(f.header().find("model.layers.0.mlp.up_proj.weight_scale")->shape,
            (std::vector<std::uint64_t>{320, 1}));
  for (const char* m : {"model.layers.0.self_attn.k_proj", "model.layers.1.mlp.up_proj",
                        "model.layers.1.mlp.down_proj"}) {
    check_fp8_weight(f, m, ".weight_scale", 1, m == std::string("model.layers.1.mlp.down_proj")
                                                    ? 320
                                                    : 256);
  }
}

// Same bytes for every thread count; ctquant converts both kinds, and what it
// wrote is the RTN of the dequantized source.
TEST(MakeCheckpoint, Fp8CheckpointsAreDeterministicAndConvert) {
  for (const char* manifest : {"fp8-block.manifest.json", "fp8-channel.manifest.json"}) {
    SCOPED_TRACE(manifest);
    TempDir tmp;
    ASSERT_EQ(generate(manifest, tmp / "a", {"--threads", "1"}).exit_code, 0);
    ASSERT_EQ(generate(manifest, tmp / "b", {"--threads", "3"}).exit_code, 0);
    EXPECT_EQ(test::diff_bytes(tmp / "a", tmp / "b"), "");
    // down_proj has 320 input columns: group size 64 divides them.
    const CommandResult q = test::run_ctquant(
        {"quantize", (tmp / "a").string(), (tmp / "out").string(), "--group-size", "64", "-q"});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    const CommandResult v = test::run_ctquant(
        {"verify", (tmp / "out").string(), (tmp / "a").string(), "--against-source"});
    EXPECT_EQ(v.exit_code, 0) << v.out;
  }
}

// --fp8 block|channel writes a BF16 layout's linear weights as FP8 with
// their scales and the matching quantization_config; embeddings, norms,
// heads and the manifest's recommended_ignore modules stay as listed, and
// ctquant converts the result.
TEST(MakeCheckpoint, Fp8OptionWritesTheLinearWeightsAsFp8) {
  struct Kind {
    const char* option;
    const char* scale_suffix;
    DType scale_dtype;
    std::uint64_t block_rows, block_cols;
  };
  for (const Kind& k : {Kind{"block", ".weight_scale_inv", DType::kF32, 128, 128},
                        Kind{"channel", ".weight_scale", DType::kBF16, 1, 0}}) {
    SCOPED_TRACE(k.option);
    TempDir tmp;
    const CommandResult r = generate("llama-20-shards.manifest.json", tmp / "ckpt",
                                     {"--fp8", k.option, "--only-layers", "0"});
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const json config = json::parse(test::read_file(tmp / "ckpt" / "config.json"));
    EXPECT_EQ(config["quantization_config"]["quant_method"],
              std::string(k.option) == "block" ? "fp8" : "compressed-tensors");
    const SafetensorsFile f(tmp / "ckpt" / "model.safetensors", "model.safetensors");
    const TensorEntry* scale = f.header().find("model.layers.0.mlp.down_proj" +
                                               std::string(k.scale_suffix));
    ASSERT_NE(scale, nullptr);
    EXPECT_EQ(scale->dtype, k.scale_dtype);
    const TensorEntry* w = f.header().find("model.layers.0.mlp.down_proj.weight");
    check_fp8_weight(f, "model.layers.0.mlp.down_proj", k.scale_suffix, k.block_rows,
                     k.block_cols == 0 ? w->shape[1] : k.block_cols);
    EXPECT_EQ(f.header().find("model.layers.0.input_layernorm.weight")->dtype, DType::kBF16);
    const CommandResult q = test::run_ctquant(
        {"quantize", (tmp / "ckpt").string(), (tmp / "out").string(), "-q"});
    ASSERT_EQ(q.exit_code, 0) << q.err;
  }
  TempDir tmp;
  const CommandResult bad = generate("llama-20-shards.manifest.json", tmp / "x", {"--fp8", "e5m2"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--fp8 e5m2: expected block or channel"), std::string::npos) << bad.out;
}

TEST(MakeCheckpoint, OnlyLayersKeepsTheListedLayers) {
  TempDir tmp;
  const CommandResult r =
      generate("fp8-block.manifest.json", tmp / "ckpt", {"--only-layers", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const SafetensorsFile f(tmp / "ckpt" / "model.safetensors", "model.safetensors");
  for (const TensorEntry& t : f.header().tensors) {
    EXPECT_TRUE(t.name.starts_with("model.layers.1.")) << t.name;
  }
  EXPECT_EQ(f.header().tensors.size(), 15u);  // a norm and 7 weights with their scales
  const CommandResult bad = generate("fp8-block.manifest.json", tmp / "bad", {"--only-layers", "7"});
  EXPECT_EQ(bad.exit_code, 2);
  test::expect_message(bad.out, {"--only-layers: the manifest has no layer 7"});
}

// tools/layouts/deepseek-v3.manifest.json: every shape follows config.json
// (MLA, dense and MoE MLPs, the MTP layer), every F8 weight has its
// 128 x 128 scale grid, and the totals are the tensors' sums.
TEST(DeepSeekLayout, ShapesFollowTheConfig) {
  const json m = test::read_json(test::layouts_dir().parent_path().parent_path() / "tools" /
                                 "layouts" / "deepseek-v3.manifest.json");
  const json& c = m.at("config");
  const std::uint64_t h = c.at("hidden_size");
  const std::uint64_t heads = c.at("num_attention_heads");
  const std::uint64_t qk = c.at("qk_nope_head_dim").get<std::uint64_t>() +
                           c.at("qk_rope_head_dim").get<std::uint64_t>();
  const std::uint64_t kv = c.at("qk_nope_head_dim").get<std::uint64_t>() +
                           c.at("v_head_dim").get<std::uint64_t>();
  std::map<std::string, std::vector<std::uint64_t>> shape;
  std::map<std::string, std::string> dtype;
  std::uint64_t bytes = 0;
  for (const json& t : m.at("tensors")) {
    shape[t.at("name")] = t.at("shape").get<std::vector<std::uint64_t>>();
    dtype[t.at("name")] = t.at("dtype");
    std::uint64_t n = t.at("dtype") == "F32" ? 4 : t.at("dtype") == "BF16" ? 2 : 1;
    for (const std::uint64_t d : shape[t.at("name")]) n *= d;
    bytes += n;
  }
  EXPECT_EQ(m.at("totals").at("tensor_count"), m.at("tensors").size());
  EXPECT_EQ(m.at("totals").at("bytes"), bytes);
  using Shape = std::vector<std::uint64_t>;
  const std::string a = "model.layers.3.self_attn.";
  EXPECT_EQ(shape[a + "q_a_proj.weight"], (Shape{c.at("q_lora_rank"), h}));
  EXPECT_EQ(shape[a + "q_b_proj.weight"], (Shape{heads * qk, c.at("q_lora_rank")}));
  EXPECT_EQ(shape[a + "kv_a_proj_with_mqa.weight"],
            (Shape{c.at("kv_lora_rank").get<std::uint64_t>() + c.at("qk_rope_head_dim").get<std::uint64_t>(), h}));
  EXPECT_EQ(shape[a + "kv_b_proj.weight"], (Shape{heads * kv, c.at("kv_lora_rank")}));
  EXPECT_EQ(shape[a + "o_proj.weight"], (Shape{h, heads * c.at("v_head_dim").get<std::uint64_t>()}));
  EXPECT_EQ(shape["model.layers.0.mlp.gate_proj.weight"], (Shape{c.at("intermediate_size"), h}));
  EXPECT_EQ(shape["model.layers.3.mlp.experts.255.down_proj.weight"],
            (Shape{h, c.at("moe_intermediate_size")}));
  EXPECT_EQ(shape.count("model.layers.3.mlp.experts.256.down_proj.weight"), 0u);
  EXPECT_EQ(shape["model.layers.3.mlp.gate.weight"], (Shape{c.at("n_routed_experts"), h}));
  EXPECT_EQ(dtype["model.layers.3.mlp.gate.weight"], "BF16");
  EXPECT_EQ(dtype["model.layers.3.mlp.gate.e_score_correction_bias"], "F32");
  EXPECT_EQ(shape["model.layers.61.eh_proj.weight"], (Shape{h, 2 * h}));
  EXPECT_EQ(dtype["model.layers.61.eh_proj.weight"], "BF16");
  EXPECT_EQ(shape["model.layers.61.shared_head.head.weight"], (Shape{c.at("vocab_size"), h}));
  EXPECT_EQ(shape.count("model.layers.61.enorm.weight"), 1u);
  EXPECT_EQ(shape.count("model.layers.61.hnorm.weight"), 1u);
  for (const auto& [name, s] : shape) {
    if (dtype[name] != "F8_E4M3") continue;
    const std::string module = name.substr(0, name.size() - 7);
    ASSERT_EQ(shape.count(module + ".weight_scale_inv"), 1u) << name;
    EXPECT_EQ(shape[module + ".weight_scale_inv"],
              (Shape{(s[0] + 127) / 128, (s[1] + 127) / 128}))
        << name;
    EXPECT_EQ(dtype[module + ".weight_scale_inv"], "F32") << name;
  }
}

}  // namespace
}  // namespace ctquant
