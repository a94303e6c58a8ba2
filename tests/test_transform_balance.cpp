// --transform balance (transform/transform.hpp, src/transform/balance.cpp):
// the rewrite keeps the function (float64 forward pass of a Llama block
// before and after), its scales on a hand-made case, the refusals by name,
// and a run through quantize (the rewritten norm written, config.json's
// record, the dry run's lines).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ctquant/job/quantize.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/transform/transform.hpp"
#include "ctquant/util/error.hpp"
#include "llama_block.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using nlohmann::json;
using namespace ctquant::test;  // NOLINT: the test helpers

// The tensors of a checkpoint as doubles, rewritten in double (no cast) when
// a derived plan is given.
Weights load_weights(const Checkpoint& ck, const RewritePlan* plan) {
  Weights w;
  for (const auto& [name, at] : ck.tensors) {
    const TensorEntry& e = ck.entry(at);
    const std::uint64_t rows = e.shape.size() == 2 ? e.shape[0] : 1;
    std::vector<double> v;
    read_rows_as_double(ck, name, 0, rows, v);
    if (const TensorRewrite* r = plan != nullptr ? plan->find(name) : nullptr) {
      for (std::uint64_t k = 0; k < v.size(); ++k) {
        const std::uint64_t i = k / r->cols, j = k % r->cols;
        if (r->row_mul) v[k] *= plan->scales[*r->row_mul][i];
        if (r->col_div) v[k] /= plan->scales[*r->col_div][j];
        if (r->col_mul) v[k] *= plan->scales[*r->col_mul][j];
      }
    }
    w[name] = std::move(v);
  }
  return w;
}

TEST(Balance, KeepsTheFunctionOfALlamaBlockInFloat64) {
  TempDir dir;
  const Geometry g;
  write_block(dir.path(), g, DType::kF32, llama_config(g));
  const Checkpoint ck = open_checkpoint(dir.path());
  const auto plan = derive_transform(ck, *plan_transform(ck, "balance"));
  ASSERT_EQ(plan->tensors.size(), 9u);
  const std::uint64_t tokens = 5;
  const auto x = [&] {
    const auto f = spread_values(tokens, g.hidden, 99);
    return std::vector<double>(f.begin(), f.end());
  }();
  const Weights before = load_weights(ck, nullptr);
  const Weights after = load_weights(ck, plan.get());
  // The scales are not trivial: some weight moved by more than 10%.
  double moved = 0;
  for (const auto& [name, v] : before) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] != 0) moved = std::max(moved, std::fabs(after.at(name)[i] / v[i] - 1));
    }
  }
  EXPECT_GT(moved, 0.1);
  const auto y0 = block_forward(before, g, x, tokens);
  const auto y1 = block_forward(after, g, x, tokens);
  // Equal to float64 rounding: the largest difference within 1e-12 of the
  // largest output.
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < y0.size(); ++i) {
    worst = std::max(worst, std::fabs(y0[i] - y1[i]));
    largest = std::max(largest, std::fabs(y0[i]));
  }
  EXPECT_GT(largest, 1.0);
  EXPECT_LT(worst, 1e-12 * largest) << worst << " of " << largest;
  // The final norm (lm_head's producer) and the embedding are untouched.
  EXPECT_EQ(plan->find("model.norm.weight"), nullptr);
  EXPECT_EQ(plan->find("model.embed_tokens.weight"), nullptr);
}

TEST(Balance, ScalesOfAHandMadeBlock) {
  TempDir dir;
  Geometry g;
  g.hidden = 2;
  g.heads = 1;
  g.kv_heads = 1;
  g.head_dim = 2;
  g.inter = 2;
  const std::string p = "model.layers.0.";
  const auto t = [&](const std::string& n, std::vector<std::uint64_t> shape, std::vector<float> v) {
    return FakeTensor{p + n, DType::kF32, std::move(shape), float_bytes(DType::kF32, v)};
  };
  write_checkpoint(
      dir.path(),
      {t("mlp.down_proj.weight", {2, 2}, {1, 2, 3, 4}),
       t("self_attn.o_proj.weight", {2, 2}, {1, -1, 1, 3}),
       t("self_attn.q_proj.weight", {2, 2}, {4, 0, 0, 2}),
       t("self_attn.k_proj.weight", {2, 2}, {1, 1, 1, 1}),
       t("self_attn.v_proj.weight", {2, 2}, {1, 1, 1, 1}),
       t("mlp.gate_proj.weight", {2, 2}, {3, 0, 0, 1}),
       t("mlp.up_proj.weight", {2, 2}, {2, 2, 2, 2}), t("input_layernorm.weight", {2}, {1, 1}),
       t("post_attention_layernorm.weight", {2}, {1, 1})},
      llama_config(g));
  const Checkpoint ck = open_checkpoint(dir.path());
  const auto plan = derive_transform(ck, *plan_transform(ck, "balance"));
  const auto scale = [&](const std::string& tensor, bool rows) {
    const TensorRewrite* r = plan->find(p + tensor);
    EXPECT_NE(r, nullptr);
    return plan->scales[rows ? *r->row_mul : (r->col_div ? *r->col_div : *r->col_mul)];
  };
  // down: column means of |W| 2, 3; lower median 2.
  EXPECT_EQ(scale("mlp.down_proj.weight", false), (std::vector<double>{1.0, 1.5}));
  EXPECT_EQ(scale("mlp.up_proj.weight", true), (std::vector<double>{1.0, 1.5}));
  // o: column means 1, 2 -> v_proj's rows x [1, 2].
  EXPECT_EQ(scale("self_attn.v_proj.weight", true), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(scale("self_attn.o_proj.weight", false), (std::vector<double>{1.0, 2.0}));
  // q; k; v x [1, 2] rows: column sums 9 and 7 over 6 rows; median 7/6.
  const std::vector<double> t_qkv{(9.0 / 6.0) / (7.0 / 6.0), 1.0};
  EXPECT_EQ(scale("self_attn.q_proj.weight", false), t_qkv);
  EXPECT_EQ(scale("input_layernorm.weight", false), t_qkv);
  // gate; up x [1, 1.5] rows: sums 8 and 6 over 4 rows; median 1.5.
  EXPECT_EQ(scale("mlp.gate_proj.weight", false), (std::vector<double>{2.0 / 1.5, 1.0}));
  // The norm as written: g x t rounded once to BF16.
  std::vector<std::byte> gamma = float_bytes(DType::kBF16, {1.0f, 1.0f});
  apply_rewrite(*plan, *plan->find(p + "input_layernorm.weight"), DType::kBF16, 0, 2, gamma.data());
  EXPECT_EQ(gamma, float_bytes(DType::kBF16, {static_cast<float>(9.0 / 7.0), 1.0f}));
}

std::string refusal(const std::filesystem::path& dir) { return transform_refusal(dir, "balance"); }

TEST(Balance, RefusesGemmaNorms) {
  TempDir dir;
  const Geometry g;
  json config = llama_config(g, "Gemma2ForCausalLM");
  config["model_type"] = "gemma2";
  write_block(dir.path(), g, DType::kBF16, config);
  expect_message(refusal(dir.path()), {"Gemma2ForCausalLM", "x * (1 + g)", "nothing was written",
                                       "fix: run without --transform balance"});
}

TEST(Balance, RefusesBiasesAndSandwichNorms) {
  TempDir dir;
  const Geometry g;
  std::vector<FakeTensor> tensors;
  for (const auto& [name, tv] : llama_block(g)) {
    tensors.push_back({name, DType::kBF16, tv.first, float_bytes(DType::kBF16, tv.second)});
  }
  tensors.push_back({"model.layers.0.self_attn.q_proj.bias",
                     DType::kBF16,
                     {8},
                     float_bytes(DType::kBF16, std::vector<float>(8, 0.0f))});
  tensors.push_back({"model.layers.0.post_feedforward_layernorm.weight",
                     DType::kBF16,
                     {8},
                     float_bytes(DType::kBF16, std::vector<float>(8, 1.0f))});
  json config = llama_config(g);
  config["attention_bias"] = true;
  write_checkpoint(dir.path(), tensors, config);
  expect_message(
      refusal(dir.path()),
      {"model.layers.0.self_attn.q_proj.bias: not part of a pre-norm Llama block",
       "model.layers.0.post_feedforward_layernorm.weight: not part", "attention_bias is true"});
}

TEST(Balance, RefusesMixturesOfExperts) {
  TempDir dir;
  const Geometry g;
  json config = llama_config(g, "MixtralForCausalLM");
  config["num_local_experts"] = 8;
  write_block(dir.path(), g, DType::kBF16, config);
  expect_message(refusal(dir.path()),
                 {"a mixture of experts", "num_local_experts", "every expert"});
}

TEST(Balance, RefusesDrafts) {
  TempDir dir;
  copy_dir(golden_dir() / "dflash-bf16-sharded" / "input", dir.path() / "in");
  expect_message(refusal(dir.path() / "in"), {"DFlashLagunaForCausalLM", "draft"});
}

TEST(Balance, AcceptsLlamaAndQwen3) {
  TempDir dir;
  const Geometry g;
  write_block(dir / "llama", g, DType::kBF16, llama_config(g));
  EXPECT_EQ(refusal(dir / "llama"), "");
  json qwen = llama_config(g, "Qwen3ForCausalLM");
  qwen["model_type"] = "qwen3";
  write_block(dir / "qwen3", g, DType::kBF16, qwen);
  EXPECT_EQ(refusal(dir / "qwen3"), "");
}

TEST(Balance, QuantizeWritesTheRewrittenSource) {
  TempDir dir;
  const Geometry g;
  write_block(dir / "in", g, DType::kBF16, llama_config(g));
  // Columns of 8 need a group size that divides them; vLLM's Marlin
  // shapes (lint L5, L10) do not matter here.
  const CommandResult dry =
      run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(), "--transform",
                   "balance", "--group-size", "8", "--allow-unloadable", "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  expect_message(
      dry.out + dry.err,
      {"transform: balance (9 tensors rewritten", "balance: columns ÷ t (input_layernorm)",
       "balance: rows × t (for down_proj)", "balance: g × t (for q_proj, k_proj, v_proj)",
       "(config_group_0, transform balance)"});
  const CommandResult run =
      run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(), "--transform",
                   "balance", "--group-size", "8", "--allow-unloadable"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json config = read_json(dir / "out" / "config.json");
  EXPECT_EQ(config["ctquant_transform"]["transform"], "balance");
  EXPECT_EQ(config["quantization_config"]["transform_config"], json::object());
  // The norm written is g x t rounded once to BF16.
  const Checkpoint ck = open_checkpoint(dir / "in");
  const auto plan = derive_transform(ck, *plan_transform(ck, "balance"));
  const std::string norm = "model.layers.0.input_layernorm.weight";
  std::vector<std::byte> expected = read_tensor(dir / "in" / "model.safetensors", norm);
  apply_rewrite(*plan, *plan->find(norm), DType::kBF16, 0, g.hidden, expected.data());
  EXPECT_EQ(read_tensor(dir / "out" / "model.safetensors", norm), expected);
  EXPECT_NE(read_tensor(dir / "in" / "model.safetensors", norm), expected);
  // verify --against-source derives t from INPUT again: the rewritten norms
  // and weights are what it expects, not corruption.
  const CommandResult verify =
      run_ctquant({"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  // Untouched: the final norm.
  EXPECT_EQ(read_tensor(dir / "out" / "model.safetensors", "model.norm.weight"),
            read_tensor(dir / "in" / "model.safetensors", "model.norm.weight"));
}

// A consumer kept in 16 bits still reads the rescaled norm: its columns are
// divided too, written as BF16, and verify --against-source expects that.
TEST(Balance, RewritesIgnoredConsumersInSixteenBits) {
  TempDir dir;
  const Geometry g;
  write_block(dir / "in", g, DType::kBF16, llama_config(g));
  const std::string q = "model.layers.0.self_attn.q_proj";
  const CommandResult run =
      run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(), "--transform",
                   "balance", "--group-size", "8", "--allow-unloadable", "--ignore",
                   "re:.*self_attn\\.[qkv]_proj$"});  // the whole fused qkv_proj
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const Checkpoint ck = open_checkpoint(dir / "in");
  const auto plan = derive_transform(ck, *plan_transform(ck, "balance"));
  std::vector<std::byte> expected = read_tensor(dir / "in" / "model.safetensors", q + ".weight");
  apply_rewrite(*plan, *plan->find(q + ".weight"), DType::kBF16, 0, expected.size() / 2,
                expected.data());
  EXPECT_EQ(read_tensor(dir / "out" / "model.safetensors", q + ".weight"), expected);
  const CommandResult verify =
      run_ctquant({"verify", (dir / "out").string(), (dir / "in").string(), "--against-source"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

TEST(Balance, RefusedRunWritesNothing) {
  TempDir dir;
  const Geometry g;
  write_block(dir / "in", g, DType::kBF16, llama_config(g, "Gemma2ForCausalLM"));
  const CommandResult r = run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string(),
                                       "--transform", "balance", "--group-size", "8"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"--transform balance", "x * (1 + g)"});
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  const CommandResult unknown = run_ctquant(
      {"quantize", (dir / "in").string(), (dir / "out").string(), "--transform", "spin"});
  EXPECT_EQ(unknown.exit_code, 2);
  expect_message(unknown.err, {"--transform spin: unknown transform (known: balance, rotate)"});
}

// --observer auto, --target-bits and --more-bits measure or split the
// modules of the rewritten model: the run writes the balanced source
// beside OUTPUT first (as rotate does), quantizes it and removes it; the
// rewritten norm is the one the plain balanced run writes, and
// verify --against-source reads SAME. An empty --transform is a usage
// error, not "no transform".
TEST(Balance, MeasuringAndSplittingOptionsReadTheBalancedWeights) {
  TempDir dir;
  const Geometry g{128, 4, 2, 32, 256};
  write_block(dir / "in", g, DType::kBF16, llama_config(g, "LlamaForCausalLM"));
  const std::string in = (dir / "in").string();
  const CommandResult plain =
      run_ctquant({"quantize", in, (dir / "plain").string(), "--transform", "balance"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::string norm = "model.layers.0.post_attention_layernorm.weight";
  const auto balanced_norm = read_tensor(dir / "plain" / "model.safetensors", norm);
  int n = 0;
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--observer", "auto"}, {"--target-bits", "5"}, {"--more-bits", "layers"}}) {
    const std::filesystem::path out = dir / ("out" + std::to_string(n++));
    std::vector<std::string> args{"quantize", in, out.string(), "--transform", "balance"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = run_ctquant(args);
    ASSERT_EQ(r.exit_code, 0) << extra[0] << r.err;
    expect_message(r.err, {"writing the rewritten source", "transform balance"});
    EXPECT_EQ(read_tensor(out / "model.safetensors", norm), balanced_norm) << extra[0];
    EXPECT_EQ(read_json(out / "config.json")["ctquant_transform"]["transform"], "balance");
    EXPECT_FALSE(
        std::filesystem::exists(dir / ("." + out.filename().string() + ".ctquant-balance")));
    const CommandResult verify = run_ctquant({"verify", out.string(), in, "--against-source"});
    EXPECT_EQ(verify.exit_code, 0) << extra[0] << verify.out << verify.err;
  }
  const CommandResult empty =
      run_ctquant({"quantize", in, (dir / "x").string(), "--transform", ""});
  EXPECT_EQ(empty.exit_code, 2) << empty.err;
  expect_message(empty.err, {"--transform", "is empty: name a transform (balance, rotate)"});
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));
}

// The run that reads a staged balanced source must not balance it again:
// a second pass derives t from the balanced weights (1 within rounding)
// and moved a few values by one BF16 unit, which verify --against-source
// found as groups that are not the RTN codes of the source. On a trained
// model (tools/accuracy), with --target-bits 5.
TEST(Balance, StagedSourceIsNotBalancedTwice) {
  TempDir dir;
  const std::filesystem::path model = std::filesystem::path(CTQUANT_DOCS_DIR).parent_path() /
                                      "tools" / "accuracy" / "models" / "llama-h128";
  const CommandResult run = run_ctquant({"quantize", model.string(), (dir / "out").string(),
                                         "--transform", "balance", "--target-bits", "5"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const CommandResult verify =
      run_ctquant({"verify", (dir / "out").string(), model.string(), "--against-source"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out;
}

}  // namespace
}  // namespace ctquant
