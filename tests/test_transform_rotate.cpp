// --transform rotate (src/transform/rotate.cpp, transform/hadamard.hpp):
// the Hadamard matrices and the fast rotation against dense ones, the
// rewritten model's logits against the original's in float64 (untied,
// tied, a hidden size that needs a Paley H_12), the refusals by name, and
// runs through the CLI (the rewritten source written and removed, the
// untied head, config.json's record, verify --against-source, the dry run).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/transform/hadamard.hpp"
#include "ctquant/transform/transform.hpp"
#include "ctquant/util/error.hpp"
#include "llama_block.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using nlohmann::json;
using namespace ctquant::test;  // NOLINT: the test helpers

TEST(Hadamard, EveryBuiltMatrixIsHadamard) {
  std::vector<std::uint64_t> built;
  for (std::uint64_t k = 1; k <= 256; ++k) {
    std::vector<int> h;
    try {
      h = hadamard_matrix(k);
    } catch (const std::invalid_argument&) {
      continue;  // k itself is not built
    }
    built.push_back(k);
    ASSERT_EQ(h.size(), k * k);
    for (std::uint64_t i = 0; i < k; ++i) {
      for (std::uint64_t j = 0; j < k; ++j) {
        ASSERT_TRUE(h[i * k + j] == 1 || h[i * k + j] == -1) << k;
        long dot = 0;
        for (std::uint64_t c = 0; c < k; ++c) dot += h[i * k + c] * h[j * k + c];
        ASSERT_EQ(dot, i == j ? static_cast<long>(k) : 0)
            << "k " << k << " rows " << i << ", " << j;
      }
    }
  }
  // Sylvester's orders, Paley I (q + 1, q = 3 mod 4) and Paley II
  // (2 (q + 1), q = 1 mod 4) up to 64.
  const std::vector<std::uint64_t> up_to_64(built.begin(),
                                            std::find(built.begin(), built.end(), 68));
  EXPECT_EQ(up_to_64,
            (std::vector<std::uint64_t>{1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 44, 48, 60, 64}));
}

TEST(Hadamard, KnownOrdersOfModelSizes) {
  EXPECT_EQ(hadamard_known_order(4096), 1u);          // Llama-3-8B, Qwen3-8B
  EXPECT_EQ(hadamard_known_order(2560), 20u);         // Qwen3-4B: 20 * 128
  EXPECT_EQ(hadamard_known_order(3072), 12u);         // Llama-3.2-3B: 12 * 256
  EXPECT_EQ(hadamard_known_order(896), 28u);          // Qwen2.5-0.5B: 28 * 32
  EXPECT_EQ(hadamard_known_order(5120), 20u);         // Qwen3-14B: 20 * 256
  EXPECT_EQ(hadamard_known_order(80), 20u);           // head_dim 80: 20 * 4
  EXPECT_EQ(hadamard_known_order(92), std::nullopt);  // 23 * 4: no order built
  EXPECT_EQ(hadamard_known_order(7), std::nullopt);
  EXPECT_EQ(hadamard_known_order(0), std::nullopt);
  EXPECT_THROW(hadamard_matrix(92), std::invalid_argument);
}

// x Q with Q = D (H_12 (x) H_2) / sqrt(24), computed densely.
TEST(Hadamard, RotationEqualsTheDenseMatrixAndInvertsExactly) {
  const std::uint64_t n = 24;
  const Rotation r(n, 5);
  ASSERT_EQ(r.known_order(), 12u);
  const std::vector<int> h12 = hadamard_matrix(12), h2 = hadamard_matrix(2);
  std::vector<double> x(n), scratch;
  for (std::uint64_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<double>(i) + 0.5) * 3;
  std::vector<double> dense(n, 0.0);
  int negative = 0;
  for (std::uint64_t j = 0; j < n; ++j) {
    for (std::uint64_t i = 0; i < n; ++i) {
      const int hij = h12[(i / 2) * 12 + j / 2] * h2[(i % 2) * 2 + j % 2];
      dense[j] += x[i] * r.sign(i) * hij / std::sqrt(24.0);
    }
  }
  for (std::uint64_t i = 0; i < n; ++i) negative += r.sign(i) < 0 ? 1 : 0;
  EXPECT_GT(negative, 3);  // the signs are not all +1
  EXPECT_LT(negative, 21);
  std::vector<double> y = x;
  r.apply(y.data(), scratch);
  for (std::uint64_t j = 0; j < n; ++j) EXPECT_NEAR(y[j], dense[j], 1e-12) << j;
  r.apply_transposed(y.data(), scratch);
  for (std::uint64_t j = 0; j < n; ++j) EXPECT_NEAR(y[j], x[j], 1e-12) << j;
  // Columns of a 24 x 3 matrix rotated together: each exactly as a row.
  std::vector<double> m(n * 3);
  for (std::uint64_t i = 0; i < n * 3; ++i) m[i] = std::cos(static_cast<double>(i));
  std::vector<double> cols = m;
  r.apply_to_columns(cols.data(), 3, scratch);
  for (std::uint64_t c = 0; c < 3; ++c) {
    std::vector<double> col(n);
    for (std::uint64_t i = 0; i < n; ++i) col[i] = m[i * 3 + c];
    r.apply(col.data(), scratch);
    for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(cols[i * 3 + c], col[i]) << i << ", " << c;
  }
  // The same seed gives the same signs.
  const Rotation again(n, 5);
  for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(again.sign(i), r.sign(i));
}

Weights load_all(const Checkpoint& ck) {
  Weights w;
  for (const auto& [name, at] : ck.tensors) {
    const TensorEntry& e = ck.entry(at);
    // Every row of a 2-D or stacked 3-D tensor (a 1-D one is one row).
    const std::uint64_t cols = e.shape.empty() ? 1 : e.shape.back();
    read_rows_as_double(ck, name, 0, e.numel() / cols, w[name]);
  }
  return w;
}

// The rotated model's logits against the original's, both from F32
// checkpoints: equal to within F32 rounding of the rewritten weights.
void expect_same_logits(const Geometry& g, const json& config, bool drop_head) {
  TempDir dir;
  std::vector<FakeTensor> tensors;
  for (const auto& [name, tv] : llama_block(g)) {
    if (drop_head && name == "lm_head.weight") continue;
    tensors.push_back({name, DType::kF32, tv.first, float_bytes(DType::kF32, tv.second)});
  }
  write_checkpoint(dir / "in", tensors, config);
  const Checkpoint ck = open_checkpoint(dir / "in");
  const auto plan = plan_transform(ck, "rotate");
  const StagedSource staged(ck, *plan, dir / "rotated", true);
  const Checkpoint rotated = open_checkpoint(staged.path());
  const Weights before = load_all(ck), after = load_all(rotated);
  ASSERT_TRUE(after.contains("lm_head.weight"));
  // Every Linear moved: the rotation is not trivial.
  for (const char* n :
       {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.embed_tokens.weight"}) {
    double moved = 0;
    for (std::size_t i = 0; i < before.at(n).size(); ++i) {
      moved = std::max(moved, std::fabs(after.at(n)[i] - before.at(n)[i]));
    }
    EXPECT_GT(moved, 0.01) << n;
  }
  for (double v : after.at("model.layers.0.input_layernorm.weight")) EXPECT_EQ(v, 1.0);
  for (double v : after.at("model.norm.weight")) EXPECT_EQ(v, 1.0);
  const std::vector<std::uint64_t> tokens{3, 1, 4, 1, 5, 9, 2};
  const auto y0 = model_forward(before, g, tokens);
  const auto y1 = model_forward(after, g, tokens);
  ASSERT_EQ(y0.size(), y1.size());
  const auto [worst, largest] = output_difference(y0, y1);
  EXPECT_GT(largest, 1.0);
  EXPECT_LT(worst, 1e-5 * largest) << worst << " of " << largest;
}

TEST(Rotate, KeepsTheLogitsOfAnUntiedLlama) {
  const Geometry g;  // hidden 8, head_dim 2
  expect_same_logits(g, llama_config(g), false);
}

TEST(Rotate, KeepsTheLogitsOfATiedLlamaAndUntiesIt) {
  const Geometry g;
  json config = llama_config(g);
  config["tie_word_embeddings"] = true;
  expect_same_logits(g, config, true);
}

TEST(Rotate, KeepsTheLogitsWithAPaleyOrderHiddenSize) {
  // hidden 24 = H_12 (Paley I of 11) x H_2; head_dim 4.
  const Geometry g{24, 4, 2, 4, 48};
  expect_same_logits(g, llama_config(g), false);
}

// down_proj's columns are rotated over every row: one value against the
// dense Q1^T W computed here.
TEST(Rotate, MixesTheRowsOfDownProj) {
  TempDir dir;
  const Geometry g;
  write_block(dir / "in", g, DType::kF32, llama_config(g));
  const Checkpoint ck = open_checkpoint(dir / "in");
  const StagedSource staged(ck, *plan_transform(ck, "rotate"), dir / "rotated", true);
  const Checkpoint rotated = open_checkpoint(staged.path());
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  const Weights before = load_all(ck), after = load_all(rotated);
  const Rotation q1(g.hidden, 0);  // the R1 seed config.json records
  const std::vector<int> h = hadamard_matrix(g.hidden);
  for (std::uint64_t row : {0u, 5u}) {
    for (std::uint64_t col : {0u, 7u}) {
      // (Q^T W)[row, col] = sum_i Q[i, row] W[i, col], Q[i, j] = d_i H[i, j] / sqrt(n).
      double want = 0;
      for (std::uint64_t i = 0; i < g.hidden; ++i) {
        want += q1.sign(i) * h[i * g.hidden + row] / std::sqrt(8.0) *
                before.at(down)[i * g.inter + col];
      }
      EXPECT_EQ(after.at(down)[row * g.inter + col], static_cast<double>(static_cast<float>(want)))
          << row << ", " << col;
    }
  }
  EXPECT_EQ(read_json(staged.path() / "config.json")["ctquant_transform"]["r1"]["sign_seed"], 0);
}

std::string rotate_refusal(const std::filesystem::path& dir) {
  return transform_refusal(dir, "rotate");
}

TEST(Rotate, RefusesAHiddenSizeWithNoHadamardMatrix) {
  TempDir dir;
  const Geometry g{92, 4, 2, 4, 16};
  write_block(dir / "in", g, DType::kF32, llama_config(g));
  expect_message(rotate_refusal(dir / "in"), {"--transform rotate", "hidden size 92",
                                              "no Hadamard matrix", "nothing was written"});
}

TEST(Rotate, RefusesDraftsOtherFamiliesAndAMissingEmbedding) {
  TempDir dir;
  copy_dir(golden_dir() / "dflash-bf16-sharded" / "input", dir / "draft");
  expect_message(rotate_refusal(dir / "draft"), {"DFlashLagunaForCausalLM", "draft"});
  const Geometry g;
  write_block(dir / "qwen2moe", g, DType::kF32, llama_config(g, "Qwen2MoeForCausalLM"));
  expect_message(rotate_refusal(dir / "qwen2moe"),
                 {"Qwen2MoeForCausalLM", "experts that all read the post-attention norm"});
  std::vector<FakeTensor> tensors;
  for (const auto& [name, tv] : llama_block(g)) {
    if (name == "model.embed_tokens.weight") continue;
    tensors.push_back({name, DType::kF32, tv.first, float_bytes(DType::kF32, tv.second)});
  }
  tensors.push_back({"model.layers.0.self_attn.o_proj.bias",
                     DType::kF32,
                     {g.hidden},
                     float_bytes(DType::kF32, std::vector<float>(g.hidden, 0.5f))});
  write_checkpoint(dir / "no-embed", tensors, llama_config(g));
  expect_message(rotate_refusal(dir / "no-embed"),
                 {"model.embed_tokens.weight: missing", "R1 rotates the embedding",
                  "model.layers.0.self_attn.o_proj.bias: not part of a pre-norm Llama block"});
}

// A Qwen3 MoE with stacked experts (transformers-v5 layout, the golden
// case): the router and every expert's gate/up read the post-attention
// norm, every expert's down_proj writes the residual stream. Each relation
// is checked by undoing the rotation: W' Q1^T = W diag(g) for the readers,
// Q1 W'_e = W_e for each expert's down_proj, to BF16 precision.
TEST(Rotate, RotatesTheRouterAndEveryExpertOfAMixture) {
  TempDir dir;
  const std::filesystem::path in = golden_dir() / "qwen3moe-fused-bf16-w4a16" / "input";
  const Checkpoint ck = open_checkpoint(in);
  const auto plan = plan_transform(ck, "rotate");
  const StagedSource staged(ck, *plan, dir / "rotated", true);
  const Checkpoint rotated = open_checkpoint(staged.path());
  const Weights before = load_all(ck), after = load_all(rotated);
  const std::uint64_t h = 256;
  const Rotation q1(h, 0);
  std::vector<double> scratch;
  const std::string p = "model.layers.0.";
  const std::vector<double>& gamma = before.at(p + "post_attention_layernorm.weight");
  for (const std::string n : {"mlp.gate.weight", "mlp.experts.gate_up_proj"}) {
    const std::vector<double>& w = before.at(p + n);
    std::vector<double> back = after.at(p + n);
    double worst = 0, largest = 0;
    for (std::uint64_t r = 0; r * h < back.size(); ++r) {
      q1.apply_transposed(back.data() + r * h, scratch);
      for (std::uint64_t c = 0; c < h; ++c) {
        worst = std::max(worst, std::fabs(back[r * h + c] - w[r * h + c] * gamma[c]));
        largest = std::max(largest, std::fabs(w[r * h + c] * gamma[c]));
      }
    }
    EXPECT_LT(worst, 0.02 * largest) << n;  // BF16 keeps 8 bits
    EXPECT_GT(largest, 0.0) << n;
  }
  // down_proj [4 experts, 256, 128]: each expert's columns.
  const std::vector<double>& down = before.at(p + "mlp.experts.down_proj");
  const std::vector<double>& down_r = after.at(p + "mlp.experts.down_proj");
  ASSERT_EQ(down.size(), 4u * 256u * 128u);
  ASSERT_EQ(down_r.size(), down.size());
  ASSERT_EQ(before.at(p + "mlp.experts.gate_up_proj").size(), 4u * 256u * 256u);
  double worst = 0, largest = 0;
  std::vector<double> col(h);
  for (std::uint64_t e = 0; e < 4; ++e) {
    for (std::uint64_t c = 0; c < 128; ++c) {
      for (std::uint64_t i = 0; i < h; ++i) col[i] = down_r[(e * h + i) * 128 + c];
      q1.apply_transposed(col.data(), scratch);  // (c'^T Q1^T)^T = Q1 c'
      for (std::uint64_t i = 0; i < h; ++i) {
        worst = std::max(worst, std::fabs(col[i] - down[(e * h + i) * 128 + c]));
        largest = std::max(largest, std::fabs(down[(e * h + i) * 128 + c]));
      }
    }
  }
  EXPECT_LT(worst, 0.02 * largest);
  for (double v : after.at(p + "post_attention_layernorm.weight")) EXPECT_EQ(v, 1.0);
  // The per-head q/k norms are kept as they are.
  EXPECT_EQ(after.at(p + "self_attn.q_norm.weight"), before.at(p + "self_attn.q_norm.weight"));
  // Quantized (the stacked experts split as model_free_ptq splits them) and
  // verified against INPUT rotated again.
  const CommandResult run =
      run_ctquant({"quantize", in.string(), (dir / "out").string(), "--transform", "rotate"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const CommandResult verify =
      run_ctquant({"verify", (dir / "out").string(), in.string(), "--against-source"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

// A model W4A16 can quantize: hidden and intermediate multiples of 128.
const Geometry kWide{128, 4, 2, 32, 256};

TEST(Rotate, QuantizeWritesTheRotatedSourceUntiedAndVerifies) {
  TempDir dir;
  json config = llama_config(kWide);
  config["tie_word_embeddings"] = true;
  std::vector<FakeTensor> tensors;
  for (const auto& [name, tv] : llama_block(kWide)) {
    if (name == "lm_head.weight") continue;
    tensors.push_back({name, DType::kBF16, tv.first, float_bytes(DType::kBF16, tv.second)});
  }
  write_checkpoint(dir / "in", tensors, config);
  const std::string in = (dir / "in").string(), out = (dir / "out").string();
  const CommandResult dry =
      run_ctquant({"quantize", in, out, "--transform", "rotate", "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  expect_message(dry.out + dry.err,
                 {"rotate: Q1^T × (rows mixed)", "rotate: g folded into q/k/v_proj, set to 1",
                  "transform rotate"});
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  EXPECT_FALSE(std::filesystem::exists(dir / ".out.ctquant-rotate"));
  // inspect --plan --json carries the same record as the quantize report.
  const CommandResult inspect =
      run_ctquant({"inspect", in, "--plan", "--transform", "rotate", "--json"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  const json planned = json::parse(inspect.out);
  EXPECT_EQ(planned["transform"]["transform"], "rotate");
  EXPECT_EQ(planned["transform"]["untied_head"], true);
  EXPECT_EQ(planned["transform"]["r1"]["size"], 128);
  // Every tensor of the block: the embedding, two norms, seven Linears, the
  // final norm and the untied head.
  EXPECT_EQ(planned["transform"]["tensors"].size(), 12u);

  const CommandResult run = run_ctquant({"quantize", in, out, "--transform", "rotate",
                                         "--write-recipe", (dir / "recipe.yaml").string()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  expect_message(run.err, {"writing the rewritten source", "transform rotate"});
  // The recipe says the rewrite is not part of it.
  expect_message(read_file(dir / "recipe.yaml"),
                 {"rewritten first with ctquant's --transform rotate", "give it again"});
  EXPECT_FALSE(std::filesystem::exists(dir / ".out.ctquant-rotate"));
  const json written = read_json(dir / "out" / "config.json");
  EXPECT_EQ(written["tie_word_embeddings"], false);
  EXPECT_EQ(written["ctquant_transform"]["transform"], "rotate");
  EXPECT_EQ(written["ctquant_transform"]["untied_head"], true);
  EXPECT_EQ(written["quantization_config"]["transform_config"], json::object());
  const std::vector<std::byte> head =
      read_tensor(dir / "out" / "model.safetensors", "lm_head.weight");
  EXPECT_EQ(head.size(), 16u * 128u * 2u);  // BF16, kept (ignored by default)
  EXPECT_NE(head, read_tensor(dir / "in" / "model.safetensors", "model.embed_tokens.weight"));
  // The input is untouched.
  EXPECT_EQ(read_json(dir / "in" / "config.json")["tie_word_embeddings"], true);

  const CommandResult verify = run_ctquant({"verify", out, in, "--against-source"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  // The record must say how the weights were made: a changed sign seed is
  // a difference.
  json changed = written;
  changed["ctquant_transform"]["r1"]["sign_seed"] = 7;
  write_file(dir / "out" / "config.json", changed.dump(2));
  const CommandResult tampered = run_ctquant({"verify", out, in, "--against-source"});
  EXPECT_EQ(tampered.exit_code, 3) << tampered.out << tampered.err;
  expect_message(tampered.out, {"ctquant_transform.r1.sign_seed: 7 in OUTPUT, 0 in INPUT"});
  // An INPUT the rewrite refuses is not OUTPUT's source: verify says so,
  // not quantize's "run without --transform rotate".
  copy_dir(dir / "in", dir / "other");
  json other = read_json(dir / "in" / "config.json");
  other["architectures"] = {"GPT2LMHeadModel"};
  write_file(dir / "other" / "config.json", other.dump(2));
  const CommandResult refused =
      run_ctquant({"verify", out, (dir / "other").string(), "--against-source"});
  EXPECT_EQ(refused.exit_code, 3) << refused.out << refused.err;  // DIFFERENT
  expect_message(refused.out, {"OUTPUT's config.json records --transform rotate, which INPUT "
                               "cannot be rewritten with, so INPUT is not the checkpoint OUTPUT "
                               "was quantized from",
                               "GPT2LMHeadModel"});
  EXPECT_EQ(refused.out.find("run without --transform"), std::string::npos) << refused.out;
  EXPECT_EQ(refused.out.find("nothing was written"), std::string::npos) << refused.out;
  // inspect --errors cannot compare at all: an error that says why.
  const CommandResult errors =
      run_ctquant({"inspect", out, "--errors", "--source", (dir / "other").string()});
  EXPECT_EQ(errors.exit_code, 2) << errors.out << errors.err;
  expect_message(errors.err, {"OUTPUT's config.json records --transform rotate",
                              "give as INPUT the checkpoint OUTPUT was quantized from"});
}

TEST(Rotate, RefusedRunsLeaveNothingBehind) {
  TempDir dir;
  write_block(dir / "in", kWide, DType::kBF16, llama_config(kWide));
  const std::string in = (dir / "in").string(), out = (dir / "out").string();
  const CommandResult part =
      run_ctquant({"quantize", in, out, "--transform", "rotate", "--part", "1/2"});
  EXPECT_EQ(part.exit_code, 2);
  expect_message(part.err, {"--transform rotate with --part", "not supported yet"});
  // Planned from the rewritten source, then refused (nothing quantized).
  const CommandResult none =
      run_ctquant({"quantize", in, out, "--transform", "rotate", "--ignore", "re:.*"});
  EXPECT_NE(none.exit_code, 0);
  expect_message(none.err, {"no tensor would be quantized"});
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  EXPECT_FALSE(std::filesystem::exists(dir / ".out.ctquant-rotate"));
  // No usable temporary directory (the headers are planned there): named.
  RunOptions no_tmp_dir;
  no_tmp_dir.env = {"TMPDIR=" + (dir / "no").string()};
  const CommandResult no_tmp =
      run_ctquant({"quantize", in, out, "--transform", "rotate"}, no_tmp_dir);
  EXPECT_EQ(no_tmp.exit_code, 2);
  expect_message(no_tmp.err, {"no usable temporary directory (TMPDIR=", "set TMPDIR"});
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  // A directory left by a run that was killed is named, not overwritten,
  // and refused before anything is planned or written; a dry run says a
  // run would refuse it.
  std::filesystem::create_directory(dir / ".out.ctquant-rotate");
  const CommandResult left = run_ctquant({"quantize", in, out, "--transform", "rotate"});
  EXPECT_EQ(left.exit_code, 2);
  expect_message(left.err, {".out.ctquant-rotate exists", "rm -rf ", "Nothing was written"});
  EXPECT_EQ(left.err.find("writing the rewritten source"), std::string::npos) << left.err;
  const CommandResult dry =
      run_ctquant({"quantize", in, out, "--transform", "rotate", "--dry-run"});
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  expect_message(dry.err, {"a run would refuse", ".out.ctquant-rotate exists"});
  EXPECT_TRUE(std::filesystem::is_directory(dir / ".out.ctquant-rotate"));
}

// A double rounded to nearest, ties to even, with `bits` bits of mantissa
// after the leading one, computed from frexp (normal numbers only).
double round_once(double v, int bits) {
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e);  // [0.5, 1)
  const double scaled = std::ldexp(m, bits + 1);  // [2^bits, 2^(bits+1))
  double q = std::floor(scaled);
  const double r = scaled - q;
  if (r > 0.5 || (r == 0.5 && std::fmod(q, 2.0) == 1.0)) q += 1;
  return std::copysign(std::ldexp(q, e - bits - 1), v);
}

// The rewrite's values are rounded once from double (as torch's .to()),
// including just off a midpoint between two BF16 or F16 values, where
// rounding through float first would tie to even the wrong way.
TEST(StoreRounded, RoundsOnceFromDoubleToBf16AndF16) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> mant(0.5, 1.0);
  std::uniform_int_distribution<int> expo(-12, 12);
  for (const auto& [dtype, bits] : {std::pair{DType::kBF16, 7}, std::pair{DType::kF16, 10}}) {
    for (int k = 0; k < 20000; ++k) {
      double v = std::ldexp(mant(gen), expo(gen)) * (k % 2 == 0 ? 1 : -1);
      if (k % 4 >= 2) {
        // A midpoint of two representable values, nudged by 2^-40 of it.
        const double a = round_once(v, bits);
        const double step = std::ldexp(1.0, std::ilogb(a) - bits);
        const double mid = a + step / 2;
        v = mid + (k % 8 >= 4 ? 1 : -1) * std::ldexp(std::fabs(mid), -40);
      }
      std::byte out[2];
      store_rounded(dtype, v, out);
      ASSERT_EQ(static_cast<double>(load_as_float(dtype, out)), round_once(v, bits))
          << dtype_tag(dtype) << " " << v;
    }
  }
}

// F16 holds at most 65504: a row of 60000s (each Hadamard output sums 8
// of them with signs; at least one sums to 4 x 60000 / sqrt(8)) leaves it.
TEST(Rotate, ValueLeavingTheDtypesRangeIsRefused) {
  TempDir dir;
  const Geometry g;
  std::vector<FakeTensor> tensors;
  for (auto [name, tv] : llama_block(g)) {
    if (name == "model.embed_tokens.weight") {
      std::fill(tv.second.begin(), tv.second.begin() + static_cast<std::ptrdiff_t>(g.hidden),
                60000.0f);
    }
    tensors.push_back({name, DType::kF16, tv.first, float_bytes(DType::kF16, tv.second)});
  }
  write_checkpoint(dir / "in", tensors, llama_config(g));
  const Checkpoint ck = open_checkpoint(dir / "in");
  try {
    const StagedSource staged(ck, *plan_transform(ck, "rotate"), dir / "rotated", true);
    ADD_FAILURE() << "an infinite rotated value was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    expect_message(e.what(), {"tensor 'model.embed_tokens.weight' element [0, ",
                              "not finite in F16", "Rotate a BF16 or F32 copy of INPUT"});
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "rotated"));
}

TEST(Rotate, KeepsRopeFrequenciesAndRefusesAQuantizedInputWithOneReason) {
  TempDir dir;
  const Geometry g;
  std::vector<FakeTensor> tensors;
  for (const auto& [name, tv] : llama_block(g)) {
    tensors.push_back({name, DType::kF32, tv.first, float_bytes(DType::kF32, tv.second)});
  }
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                     DType::kF32,
                     {1},
                     float_bytes(DType::kF32, {0.5f})});
  write_checkpoint(dir / "rope", tensors, llama_config(g));
  EXPECT_EQ(rotate_refusal(dir / "rope"), "");
  const std::string awq = rotate_refusal(golden_dir() / "awq-gemm-zp-g128" / "input");
  expect_message(awq,
                 {"INPUT is quantized (config.json: quant_method awq)",
                  "rotate the 16-bit model it was made from"},
                 {"not part of"});
  // The head is neither stored nor tied: refused, not built from the embedding.
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const FakeTensor& t) { return t.name == "lm_head.weight"; }),
                tensors.end());
  write_checkpoint(dir / "no-head", tensors, llama_config(g));
  expect_message(rotate_refusal(dir / "no-head"),
                 {"lm_head.weight: missing, and config.json's tie_word_embeddings is not true"});
}

// OUTPUT given as "dir/" writes dir, with the rewritten source beside it;
// what lint refuses is refused before any value is rewritten.
TEST(Rotate, TrailingSlashAndLintBeforeTheRewrite) {
  TempDir dir;
  write_block(dir / "in", kWide, DType::kBF16, llama_config(kWide));
  const std::string in = (dir / "in").string();
  const CommandResult slash =
      run_ctquant({"quantize", in, (dir / "out").string() + "/", "--transform", "rotate"});
  ASSERT_EQ(slash.exit_code, 0) << slash.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "config.json"));
  expect_message(slash.err, {".out.ctquant-rotate"});
  EXPECT_FALSE(std::filesystem::exists(dir / ".out.ctquant-rotate"));
  const CommandResult lint = run_ctquant(
      {"quantize", in, (dir / "l3").string(), "--transform", "rotate", "--ignore", "re:.*v_proj$"});
  EXPECT_EQ(lint.exit_code, 1) << lint.err;
  expect_message(lint.err, {"L3"}, {"writing the rewritten source"});
  EXPECT_FALSE(std::filesystem::exists(dir / "l3"));
  EXPECT_FALSE(std::filesystem::exists(dir / ".l3.ctquant-rotate"));
}

}  // namespace
}  // namespace ctquant
