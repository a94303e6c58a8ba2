// The quantize job through the library (quantize.hpp): which tensors are
// quantized (section 2 of the format spec), what is written for them
// (sections 4 and 5), every bad-input and usage error with its kind and
// message, and the guarantee that a failed run leaves no OUTPUT, no
// temporary directory and an unchanged input.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/logger.h>
#include <spdlog/sinks/ostream_sink.h>
#include <nlohmann/json.hpp>

#include "ctquant/exec/executor.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/pack.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "fake_checkpoint.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

FakeTensor zeros(const std::string& name, DType dtype, std::vector<std::uint64_t> shape) {
  std::uint64_t numel = 1;
  for (std::uint64_t d : shape) numel *= d;
  const std::uint64_t bits = numel * static_cast<std::uint64_t>(dtype_bits(dtype));
  return FakeTensor{name, dtype, std::move(shape), std::vector<std::byte>(bits / 8)};
}

FakeTensor weight(const std::string& name, DType dtype, std::uint64_t rows, std::uint64_t cols,
                  std::uint32_t seed = 1) {
  return random_weight(name, dtype, rows, cols, seed);
}

// Sets element [row, col] of a 2-D float tensor to value (stored as its dtype).
void set_element(FakeTensor& t, std::uint64_t row, std::uint64_t col, float value) {
  const std::vector<std::byte> bytes = float_bytes(t.dtype, {value});
  std::memcpy(t.data.data() + (row * t.shape[1] + col) * bytes.size(), bytes.data(), bytes.size());
}

// A small Llama-like checkpoint with one tensor for each rule of section 2.
// Each entry: the tensor and the rule text the plan must give it.
struct RuleCase {
  FakeTensor tensor;
  Fate fate;
  std::string rule;
};

std::vector<RuleCase> rule_cases() {
  return {
      {weight("lm_head.weight", DType::kBF16, 16, 128), Fate::kCopy, "ignored by 'lm_head'"},
      {weight("model.embed_tokens.weight", DType::kBF16, 32, 128), Fate::kCopy,
       "embedding (target Linear never covers it)"},
      {weight("transformer.wte.weight", DType::kBF16, 16, 128), Fate::kCopy,
       "embedding (target Linear never covers it)"},
      {weight("transformer.wpe.weight", DType::kBF16, 16, 128), Fate::kCopy,
       "embedding (target Linear never covers it)"},
      {zeros("model.layers.0.input_layernorm.weight", DType::kBF16, {128}), Fate::kCopy,
       "1-D, not a 2-D linear weight"},
      {weight("model.layers.0.self_attn.q_proj.weight", DType::kBF16, 16, 128), Fate::kQuantize,
       "2-D BF16 .weight matching target 'Linear'"},
      {zeros("model.layers.0.self_attn.q_proj.bias", DType::kBF16, {16}), Fate::kCopy,
       "not a .weight tensor"},
      // A 2-D weight whose module ends with "norm" is still not quantized.
      {weight("model.layers.0.self_attn.q_norm.weight", DType::kBF16, 16, 128), Fate::kCopy,
       "module ends with 'norm'"},
      {weight("model.layers.0.mlp.down_proj.weight", DType::kF16, 8, 256), Fate::kQuantize,
       "2-D F16 .weight matching target 'Linear'"},
      {weight("model.layers.0.mlp.gate_proj.weight", DType::kF32, 8, 128), Fate::kQuantize,
       "2-D F32 .weight matching target 'Linear'"},
      {zeros("model.layers.0.mlp.experts.weight", DType::kBF16, {2, 8, 128}), Fate::kCopy,
       "3-D, not a 2-D linear weight"},
      {zeros("model.layers.0.mlp.int_proj.weight", DType::kI64, {4, 128}), Fate::kCopy,
       "dtype I64 is not BF16, F16 or F32"},
      {zeros("model.rotary_emb.position_ids", DType::kI64, {1, 16}), Fate::kCopy,
       "not a .weight tensor"},
      {zeros("model.norm.weight", DType::kBF16, {128}), Fate::kCopy,
       "1-D, not a 2-D linear weight"},
      {zeros("weight", DType::kBF16, {16, 128}), Fate::kCopy, "not a .weight tensor"},
      {zeros("scalar", DType::kF32, {}), Fate::kCopy, "not a .weight tensor"},
      {zeros("model.layers.0.empty_proj.weight", DType::kBF16, {0, 128}), Fate::kCopy,
       "empty tensor"},
  };
}

// Options for runs over rule_tensors(): its 3-D experts weight is copied by
// section 2 but stops a run at lint L7 (vLLM would expect it packed), so
// these runs go ahead with allow_unloadable; test_lint.cpp covers L7 itself.
QuantizeOptions rule_options(const fs::path& input, const fs::path& output) {
  QuantizeOptions options = test_options(input, output);
  options.allow_unloadable = true;
  return options;
}

std::vector<FakeTensor> rule_tensors() {
  std::vector<FakeTensor> tensors;
  for (auto& c : rule_cases()) tensors.push_back(c.tensor);
  return tensors;
}

const json kConfig = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", 128},
                      {"torch_dtype", "bfloat16"}};

TEST(QuantizePlan, EachRuleOfSectionTwo) {
  TempDir tmp;
  write_checkpoint(tmp / "in", rule_tensors(), kConfig);
  const Checkpoint ckpt = open_checkpoint(tmp / "in");
  const PlanOptions defaults;
  const QuantizePlan plan = make_plan(ckpt, defaults);
  std::map<std::string, const TensorDecision*> by_name;
  for (const TensorDecision& d : plan.decisions) by_name[d.name] = &d;
  const auto cases = rule_cases();
  ASSERT_EQ(by_name.size(), cases.size());
  for (const RuleCase& c : cases) {
    SCOPED_TRACE(c.tensor.name);
    ASSERT_TRUE(by_name.contains(c.tensor.name));
    EXPECT_EQ(by_name[c.tensor.name]->fate, c.fate);
    EXPECT_EQ(by_name[c.tensor.name]->rule, c.rule);
  }
  EXPECT_EQ(plan.n_quantized, 3u);
  EXPECT_EQ(plan.n_copied, cases.size() - 3);
  // The default ignore list keeps the head and the embeddings (roles.hpp);
  // of these only lm_head is a module section 2 could quantize.
  EXPECT_EQ(plan.options.ignore,
            (std::vector<std::string>{"lm_head", "model.embed_tokens", "transformer.wpe",
                                      "transformer.wte"}));
  EXPECT_EQ(plan.n_default_ignore, 4u);
  EXPECT_EQ(plan.ignore_matches, (std::vector<std::vector<std::string>>{{"lm_head"}, {}, {}, {}}));
  EXPECT_EQ(plan.ignore_keeps[2], std::vector<std::string>{"transformer.wpe"});
}

TEST(QuantizePlan, TargetsRestrictWhatIsQuantized) {
  TempDir tmp;
  write_checkpoint(tmp / "in", rule_tensors(), kConfig);
  PlanOptions options;
  options.groups.front().targets = {"re:.*\\.mlp\\."};
  const QuantizePlan plan = make_plan(open_checkpoint(tmp / "in"), options);
  for (const TensorDecision& d : plan.decisions) {
    if (d.name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(d.fate, Fate::kCopy);
      EXPECT_EQ(d.rule, "matches no target");
    }
    if (d.name == "model.layers.0.mlp.down_proj.weight") {
      EXPECT_EQ(d.fate, Fate::kQuantize);
      EXPECT_EQ(d.rule, "2-D F16 .weight matching target 're:.*\\.mlp\\.'");
    }
  }
  EXPECT_EQ(plan.n_quantized, 2u);
  EXPECT_EQ(plan.config["quantization_config"]["config_groups"]["W4A16"]["targets"],
            json({"re:.*\\.mlp\\."}));
}

// Section 4: for a quantized module M, M.weight_packed (I32 [R, C*b/32]),
// M.weight_scale (the weight's dtype, [R, C/G]) and M.weight_shape (I64 [2])
// replace M.weight; every other tensor is copied byte for byte; config.json
// carries quantization_config and other files are copied.
TEST(Quantize, WritesPackedTensorsAndCopiesTheRest) {
  TempDir tmp;
  const auto tensors = rule_tensors();
  write_checkpoint(tmp / "in", tensors, kConfig);
  write_file(tmp / "in" / "tokenizer_config.json", "{\"x\": 1}\n");
  write_file(tmp / "in" / "README.md", "readme\n");
  const QuantizeSummary summary = quantize(rule_options(tmp / "in", tmp / "out"));
  EXPECT_EQ(summary.tensors_quantized, 3u);
  EXPECT_EQ(summary.tensors_copied, tensors.size() - 3);

  const fs::path shard = tmp / "out" / "model.safetensors";
  const SafetensorsFile out(shard, "model.safetensors");
  const auto expect_tensor = [&](const std::string& name, DType dtype,
                                 std::vector<std::uint64_t> shape) {
    const TensorEntry* e = out.header().find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, dtype) << name;
    EXPECT_EQ(e->shape, shape) << name;
  };
  expect_tensor("model.layers.0.self_attn.q_proj.weight_packed", DType::kI32, {16, 16});
  expect_tensor("model.layers.0.self_attn.q_proj.weight_scale", DType::kBF16, {16, 1});
  expect_tensor("model.layers.0.self_attn.q_proj.weight_shape", DType::kI64, {2});
  expect_tensor("model.layers.0.mlp.down_proj.weight_packed", DType::kI32, {8, 32});
  expect_tensor("model.layers.0.mlp.down_proj.weight_scale", DType::kF16, {8, 2});
  expect_tensor("model.layers.0.mlp.gate_proj.weight_packed", DType::kI32, {8, 16});
  expect_tensor("model.layers.0.mlp.gate_proj.weight_scale", DType::kF32, {8, 1});
  EXPECT_EQ(out.header().find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(out.header().find("model.layers.0.self_attn.q_proj.weight_zero_point"), nullptr);
  EXPECT_EQ(out.header().tensors.size(), tensors.size() - 3 + 3 * 3);
  EXPECT_EQ(out.header().metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(out.header().data_start % 8, 0u);
  // Tensors are laid out as the safetensors writer lays them out: dtypes in
  // its order (I64, F32, I32, BF16, F16 here), then names; each one starts at
  // a multiple of its element size.
  for (std::size_t i = 0; i < out.header().tensors.size(); ++i) {
    const TensorEntry& t = out.header().tensors[i];
    EXPECT_EQ((out.header().data_start + t.begin) % std::max(1, dtype_bits(t.dtype) / 8), 0u)
        << t.name;
    if (i == 0) continue;
    const TensorEntry& p = out.header().tensors[i - 1];
    EXPECT_TRUE(dtype_writer_order(p.dtype) > dtype_writer_order(t.dtype) ||
                (p.dtype == t.dtype && p.name < t.name))
        << p.name << " before " << t.name;
  }
  EXPECT_EQ(out.header().tensors.front().dtype, DType::kI64);

  // weight_shape holds [R, C] as little-endian int64.
  const auto shape_bytes = read_tensor(shard, "model.layers.0.mlp.down_proj.weight_shape");
  std::int64_t shape[2];
  std::memcpy(shape, shape_bytes.data(), 16);
  EXPECT_EQ(shape[0], 8);
  EXPECT_EQ(shape[1], 256);

  // Every copied tensor is byte-identical to the input.
  for (const RuleCase& c : rule_cases()) {
    if (c.fate == Fate::kCopy) {
      EXPECT_EQ(read_tensor(shard, c.tensor.name), c.tensor.data) << c.tensor.name;
    }
  }

  // The packed and scale bytes are the kernel's output for the whole weight
  // (the kernel's arithmetic is pinned by test_kernel and the goldens; this
  // checks that the executor puts its output at the right offsets).
  for (const RuleCase& c : rule_cases()) {
    if (c.fate != Fate::kQuantize) continue;
    const FakeTensor& w = c.tensor;
    const QuantScheme scheme;
    const std::uint64_t words = packed_words_per_row(w.shape[1], 4);
    std::vector<std::uint32_t> packed(w.shape[0] * words);
    std::vector<std::byte> scale(w.shape[0] * (w.shape[1] / 128) * (dtype_bits(w.dtype) / 8));
    const KernelBlock block{w.dtype,       w.shape[0],   w.shape[1], w.data.data(),
                            packed.data(), scale.data(), nullptr};
    ASSERT_EQ(quantize_block_ref(scheme, block), std::nullopt);
    const std::string module = module_of(w.name);
    const auto packed_bytes = read_tensor(shard, module + ".weight_packed");
    ASSERT_EQ(packed_bytes.size(), packed.size() * 4);
    EXPECT_EQ(std::memcmp(packed_bytes.data(), packed.data(), packed_bytes.size()), 0) << module;
    EXPECT_EQ(read_tensor(shard, module + ".weight_scale"), scale) << module;
  }

  // config.json: the input's keys plus quantization_config (section 5).
  const json config = read_json(tmp / "out" / "config.json");
  json expected_config = kConfig;
  expected_config["quantization_config"] = config.at("quantization_config");
  EXPECT_EQ(config, expected_config);
  const json& qc = config.at("quantization_config");
  EXPECT_EQ(qc.at("ignore"),
            json({"lm_head", "model.embed_tokens", "transformer.wpe", "transformer.wte"}));
  EXPECT_EQ(qc.at("format"), "pack-quantized");
  EXPECT_EQ(qc.at("quant_method"), "compressed-tensors");
  EXPECT_EQ(qc.at("quantization_status"), "compressed");
  EXPECT_EQ(qc.at("config_groups").at("W4A16").at("weights").at("group_size"), 128);
  EXPECT_EQ(qc.at("config_groups").at("W4A16").at("targets"), json({"Linear"}));

  EXPECT_EQ(read_file(tmp / "out" / "tokenizer_config.json"), "{\"x\": 1}\n");
  EXPECT_EQ(read_file(tmp / "out" / "README.md"), "readme\n");
  // model_free_ptq writes an index for a single-file input too.
  EXPECT_EQ(read_json(tmp / "out" / "model.safetensors.index.json")["weight_map"].size(),
            read_header(tmp / "out" / "model.safetensors", "out").tensors.size());
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});

  // The summary counts the files on both sides.
  std::uint64_t in_bytes = 0;
  for (const auto& [name, bytes] : snapshot_files(tmp / "in")) in_bytes += bytes.size();
  std::uint64_t out_bytes = 0;
  for (const auto& [name, bytes] : snapshot_files(tmp / "out")) out_bytes += bytes.size();
  EXPECT_EQ(summary.bytes_in, in_bytes);
  EXPECT_EQ(summary.bytes_out, out_bytes);
}

// ---- sharded checkpoints ----

std::string shard_name(std::size_t i, std::size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

// Writes shards model-0000i-of-0000n.safetensors, their index (edited by
// edit_weight_map when given) and config.json.
void write_sharded(const fs::path& dir, const std::vector<std::vector<FakeTensor>>& shards,
                   const std::function<void(json&)>& edit_weight_map = {}) {
  fs::create_directories(dir);
  json weight_map = json::object();
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    write_safetensors(dir / shard_name(i, shards.size()), shards[i]);
    for (const FakeTensor& t : shards[i]) {
      weight_map[t.name] = shard_name(i, shards.size());
      total += t.data.size();
    }
  }
  if (edit_weight_map) edit_weight_map(weight_map);
  write_file(dir / "model.safetensors.index.json",
             json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2));
  write_file(dir / "config.json", kConfig.dump(2));
}

// Each output shard holds the outputs of its input shard; the index lists
// every output tensor and total_size is the sum of their byte sizes.
TEST(Quantize, ShardedOutputAndIndex) {
  TempDir tmp;
  write_sharded(tmp / "in", {{weight("a.q_proj.weight", DType::kBF16, 8, 256),
                              zeros("a.input_layernorm.weight", DType::kBF16, {256})},
                             {weight("b.o_proj.weight", DType::kBF16, 16, 128),
                              weight("lm_head.weight", DType::kBF16, 4, 128)}});
  quantize(test_options(tmp / "in", tmp / "out"));
  const json index = read_json(tmp / "out" / "model.safetensors.index.json");
  std::uint64_t total = 0;
  json weight_map = json::object();
  for (std::size_t i = 0; i < 2; ++i) {
    const SafetensorsHeader h = read_header(tmp / "out" / shard_name(i, 2), shard_name(i, 2));
    for (const TensorEntry& t : h.tensors) {
      weight_map[t.name] = shard_name(i, 2);
      total += t.byte_size();
    }
  }
  EXPECT_EQ(weight_map, json({{"a.input_layernorm.weight", shard_name(0, 2)},
                              {"a.q_proj.weight_packed", shard_name(0, 2)},
                              {"a.q_proj.weight_scale", shard_name(0, 2)},
                              {"a.q_proj.weight_shape", shard_name(0, 2)},
                              {"b.o_proj.weight_packed", shard_name(1, 2)},
                              {"b.o_proj.weight_scale", shard_name(1, 2)},
                              {"b.o_proj.weight_shape", shard_name(1, 2)},
                              {"lm_head.weight", shard_name(1, 2)}}));
  // 8*32*4 + 8*2*2 + 16 + 256*2 (shard 1), 16*16*4 + 16*1*2 + 16 + 4*128*2 (shard 2).
  EXPECT_EQ(total, 1024u + 32 + 16 + 512 + 1024 + 32 + 16 + 1024);
  EXPECT_EQ(index, json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}));
}

// A .safetensors file the index does not list (say a consolidated copy next
// to the shards) is not part of the checkpoint: neither read nor copied,
// with a warning (vLLM reads only the files the index lists). The plan
// lists it under "not written".
TEST(Quantize, FilesTheIndexDoesNotListAreNotCopied) {
  TempDir tmp;
  write_sharded(tmp / "in", {{weight("a.q_proj.weight", DType::kBF16, 8, 128)}});
  write_safetensors(tmp / "in" / "consolidated.safetensors",
                    {weight("layers.0.wq.weight", DType::kBF16, 8, 128)});
  std::ostringstream log_text;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(log_text);
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  options.logger = std::make_shared<spdlog::logger>("test", sink);
  quantize(options);
  EXPECT_NE(log_text.str().find("consolidated.safetensors: a .safetensors file "
                                "model.safetensors.index.json does not list; not copied to OUTPUT"),
            std::string::npos)
      << log_text.str();
  EXPECT_FALSE(fs::exists(tmp / "out" / "consolidated.safetensors"));
  const json index = read_json(tmp / "out" / "model.safetensors.index.json");
  EXPECT_FALSE(index["weight_map"].contains("layers.0.wq.weight"));
  const Checkpoint ckpt = open_checkpoint(tmp / "in");
  EXPECT_EQ(ckpt.unlisted_files, std::vector<std::string>{"consolidated.safetensors"});
  const std::string plan_text = render_plan_text(ckpt, make_plan(ckpt, PlanOptions{}));
  EXPECT_NE(plan_text.find("not written (not listed in model.safetensors.index.json):\n"
                           "  file consolidated.safetensors\n"),
            std::string::npos)
      << plan_text;
}

// Regression: an untied lm_head held by a listed shard but missing from
// weight_map was dropped with exit 0. vLLM reads every tensor of each file
// the index lists (weight_utils.py), so it is part of the model: planned like
// any other tensor (kept in 16 bits by the default ignore list), written,
// listed in the output index, and named in a warning; verify --against-source
// accounts for it.
TEST(Quantize, TensorTheIndexOmitsIsWrittenAndIndexed) {
  TempDir tmp;
  const FakeTensor head = weight("lm_head.weight", DType::kBF16, 64, 128, 9);
  write_sharded(tmp / "in",
                {{weight("model.layers.0.self_attn.o_proj.weight", DType::kBF16, 128, 128, 3)},
                 {weight("model.layers.0.mlp.down_proj.weight", DType::kBF16, 128, 128, 4),
                  zeros("model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {64}), head}},
                [](json& m) {
                  m.erase("lm_head.weight");
                  m.erase("model.layers.0.self_attn.rotary_emb.inv_freq");
                });
  std::ostringstream log_text;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(log_text);
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  options.logger = std::make_shared<spdlog::logger>("test", sink);
  options.strict = true;  // a warning of lint would stop the run; the index's is not lint's
  const QuantizeSummary summary = quantize(options);
  const std::string warned = log_text.str();
  EXPECT_NE(warned.find("model.safetensors.index.json: incomplete: weight_map omits 2 tensor(s) "
                        "that the listed shard model-00002-of-00002.safetensors holds ("),
            std::string::npos)
      << warned;
  EXPECT_NE(warned.find("'lm_head.weight'"), std::string::npos) << warned;
  EXPECT_NE(warned.find("vLLM reads every tensor of a listed shard, so they are part of the "
                        "model: planned like any other tensor and listed in OUTPUT's index"),
            std::string::npos)
      << warned;
  const fs::path shard2 = tmp / "out" / "model-00002-of-00002.safetensors";
  EXPECT_EQ(read_tensor(shard2, "lm_head.weight"), head.data);  // kept in 16 bits, as given
  EXPECT_NE(read_header(shard2, "out").find("model.layers.0.self_attn.rotary_emb.inv_freq"),
            nullptr);
  const json index = read_json(tmp / "out" / "model.safetensors.index.json");
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.0.self_attn.rotary_emb.inv_freq"],
            "model-00002-of-00002.safetensors");
  EXPECT_EQ(summary.plan.n_dropped, 0u);
  const std::string plan_text =
      render_plan_text(open_checkpoint(tmp / "in"), make_plan(open_checkpoint(tmp / "in"), {}));
  EXPECT_NE(plan_text.find("  tensor lm_head.weight in model-00002-of-00002.safetensors\n"),
            std::string::npos)
      << plan_text;

  // verify --against-source accounts for every tensor of every listed shard:
  // the output is the same as its source, and one without the head is not.
  EXPECT_TRUE(verify_against_source(tmp / "out", tmp / "in", {}).same());
  test::copy_dir(tmp / "out", tmp / "dropped");
  test::drop_tensor(tmp / "dropped" / "model-00002-of-00002.safetensors", "lm_head.weight");
  const VerifyReport dropped = verify_against_source(tmp / "dropped", tmp / "in", {});
  ASSERT_FALSE(dropped.same());
  EXPECT_TRUE(std::any_of(dropped.differences.begin(), dropped.differences.end(),
                          [](const VerifyItem& d) { return d.tensor == "lm_head.weight"; }));
}

// Regression: tie_word_embeddings: "false" (a JSON string) turned the head
// lints off and, with --no-default-ignore, lm_head was packed with exit 0.
// transformers 5 refuses such a config; vLLM and transformers 4 read the
// string as true. ctquant refuses it, naming the file, the key and the value.
TEST(Quantize, TieFlagOfWrongJsonTypeIsRefused) {
  TempDir tmp;
  const std::vector<FakeTensor> tensors = {
      weight("model.layers.0.self_attn.o_proj.weight", DType::kBF16, 128, 128, 2),
      weight("lm_head.weight", DType::kBF16, 64, 128, 3)};
  for (const json& bad : {json("false"), json(""), json(0), json(nullptr)}) {
    SCOPED_TRACE(bad.dump());
    for (const bool in_text_config : {false, true}) {
      json config = kConfig;
      if (in_text_config) {
        config["text_config"] = {{"tie_word_embeddings", bad}};
      } else {
        config["tie_word_embeddings"] = bad;
      }
      fs::remove_all(tmp / "in");
      write_checkpoint(tmp / "in", tensors, config);
      try {
        quantize(test_options(tmp / "in", tmp / "out"));
        ADD_FAILURE() << "not refused";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
        expect_message(e.what(), {"config.json: ",
                                  std::string(in_text_config ? "text_config." : "") +
                                      "tie_word_embeddings is ",
                                  bad.dump(), "expected true or false",
                                  "transformers 5 refuses", "Python truthiness"});
      }
      EXPECT_FALSE(fs::exists(tmp / "out"));
    }
  }
  // The binary, as the report had it: exit 1, nothing written.
  json config = kConfig;
  config["tie_word_embeddings"] = "false";
  fs::remove_all(tmp / "in");
  write_checkpoint(tmp / "in", tensors, config);
  const test::CommandResult r = test::run_ctquant(
      {"quantize", (tmp / "in").string(), (tmp / "out").string(), "--no-default-ignore"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tie_word_embeddings is the JSON string \"false\""), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// Regression: one .safetensors file of a sharded checkpoint given as INPUT
// wrote half a model with exit 0. It is refused (exit 2) before anything is
// written, naming the directory to give instead: by its shard name, or
// because the index beside it lists it.
TEST(Quantize, ShardOfShardedCheckpointIsRefusedNamingTheDirectory) {
  TempDir tmp;
  write_sharded(tmp / "in", {{weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                             {weight("b.o_proj.weight", DType::kBF16, 8, 128)}});
  const fs::path shard = tmp / "in" / "model-00001-of-00002.safetensors";
  const test::CommandResult r =
      test::run_ctquant({"quantize", shard.string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {shard.string() + ": one file of a sharded checkpoint",
                         "its name says it is shard 00001 of 00002",
                         "give the directory as INPUT instead: " + (tmp / "in").string()});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  // A shard with another name, listed by the index beside it.
  fs::rename(shard, tmp / "in" / "first.safetensors");
  json index = read_json(tmp / "in" / "model.safetensors.index.json");
  index["weight_map"]["a.q_proj.weight"] = "first.safetensors";
  write_file(tmp / "in" / "model.safetensors.index.json", index.dump());
  try {
    open_checkpoint(tmp / "in" / "first.safetensors");
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_message(e.what(), {"model.safetensors.index.json beside it lists it as a shard "
                              "(tensor 'a.q_proj.weight')"});
  }
  // A consolidated copy the index does not list is a checkpoint of its own;
  // a single file shard 1 of 1 too.
  write_safetensors(tmp / "in" / "consolidated.safetensors",
                    {weight("layers.0.wq.weight", DType::kBF16, 8, 128)});
  EXPECT_EQ(open_checkpoint(tmp / "in" / "consolidated.safetensors").shards.size(), 1u);
  fs::create_directories(tmp / "one");
  write_safetensors(tmp / "one" / "model-00001-of-00001.safetensors",
                    {weight("layers.0.wq.weight", DType::kBF16, 8, 128)});
  EXPECT_EQ(open_checkpoint(tmp / "one" / "model-00001-of-00001.safetensors").shards.size(), 1u);
}

// Regression: one shard of a sharded checkpoint copied alone into a
// directory was quantized as the whole model (exit 0), and the refusal of
// the shard given as a file sent the user to that directory. A directory
// whose only .safetensors file is named as one shard of several, with no
// index, is refused naming the missing shards; so is the file, without the
// hint to give its incomplete directory.
TEST(Quantize, LoneShardWithoutItsSiblingsIsRefusedNamingTheMissingShards) {
  TempDir tmp;
  fs::create_directories(tmp / "lone");
  const fs::path shard = tmp / "lone" / "model-00002-of-00003.safetensors";
  write_safetensors(shard, {weight("layers.1.o_proj.weight", DType::kBF16, 8, 128)});
  try {
    open_checkpoint(tmp / "lone");
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    expect_message(e.what(), {(tmp / "lone").string() +
                                  ": holds only 'model-00002-of-00003.safetensors'",
                              "one shard of 3", "no model.safetensors.index.json",
                              "model-00001-of-00003.safetensors, model-00003-of-00003.safetensors"});
  }
  const test::CommandResult r =
      test::run_ctquant({"quantize", (tmp / "lone").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
  const test::CommandResult f =
      test::run_ctquant({"quantize", shard.string(), (tmp / "out").string()});
  EXPECT_EQ(f.exit_code, 2) << f.err;
  expect_message(f.err, {shard.string() + ": one file of a sharded checkpoint",
                         (tmp / "lone").string() + " lacks the other shards "
                         "(model-00001-of-00003.safetensors, model-00003-of-00003.safetensors)"});
  EXPECT_EQ(f.err.find("give the directory as INPUT instead"), std::string::npos) << f.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// Regression: a single-file model given as its file did not read the
// config.json beside it, so a DFlash draft lost its defaults and g_proj was
// packed. The config is read (and written, with quantization_config, to
// OUTPUT): qkv_proj and g_proj stay in 16 bits as they do for the directory.
TEST(Quantize, SingleFileReadsTheConfigBesideIt) {
  TempDir tmp;
  const FakeTensor g_proj = weight("layers.0.self_attn.g_proj.weight", DType::kBF16, 2, 256, 5);
  const FakeTensor qkv = weight("layers.0.self_attn.qkv_proj.weight", DType::kBF16, 512, 256, 6);
  write_checkpoint(tmp / "in",
                   {g_proj, qkv, weight("layers.0.self_attn.o_proj.weight", DType::kBF16, 256, 256, 7),
                    weight("fc.weight", DType::kBF16, 256, 768, 8)},
                   json{{"architectures", {"DFlashLagunaForCausalLM"}},
                        {"model_type", "laguna"},
                        {"hidden_size", 256},
                        {"dflash_config", {{"block_size", 16}}}});
  const fs::path file = tmp / "in" / "model.safetensors";
  const test::CommandResult r =
      test::run_ctquant({"quantize", file.string(), (tmp / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("a single .safetensors file; the model's config.json is read from " +
                       (tmp / "in" / "config.json").string()),
            std::string::npos)
      << r.err;
  const fs::path out = tmp / "out" / "model.safetensors";
  EXPECT_EQ(read_tensor(out, "layers.0.self_attn.g_proj.weight"), g_proj.data);
  EXPECT_EQ(read_tensor(out, "layers.0.self_attn.qkv_proj.weight"), qkv.data);
  EXPECT_NE(read_header(out, "out").find("layers.0.self_attn.o_proj.weight_packed"), nullptr);
  const json config = read_json(tmp / "out" / "config.json");
  EXPECT_EQ(config["architectures"], json({"DFlashLagunaForCausalLM"}));
  EXPECT_TRUE(config.contains("quantization_config"));
}

// Row chunking never changes the bytes, for odd row counts and bit widths
// whose codes straddle words (3, 5 bits) and for zero points packed along
// dim 0: the output equals the kernel run over the whole weight at once,
// whatever the chunk size and thread count.
TEST(Quantize, RowChunksEqualWholeTensorForEveryWidth) {
  TempDir tmp;
  const FakeTensor w = weight("m.q_proj.weight", DType::kBF16, 37, 96, 7);
  write_checkpoint(tmp / "in", {w});
  int run = 0;
  for (const int bits : {3, 4, 5, 8}) {
    for (const bool symmetric : {true, false}) {
      const QuantScheme scheme{"custom", bits, symmetric, 32};
      SCOPED_TRACE(std::to_string(bits) + (symmetric ? " bits symmetric" : " bits asymmetric"));
      // The whole weight at once.
      const std::uint64_t words = packed_words_per_row(96, bits);
      std::vector<std::uint32_t> packed(37 * words);
      std::vector<std::byte> scale(37 * 3 * 2);
      std::vector<std::int8_t> zero(37 * 3);
      const KernelBlock block{DType::kBF16,
                              37,
                              96,
                              w.data.data(),
                              packed.data(),
                              scale.data(),
                              symmetric ? nullptr : zero.data()};
      ASSERT_EQ(quantize_block_ref(scheme, block), std::nullopt);
      std::vector<std::uint32_t> zero_packed(packed_words_per_row(37, bits) * 3);
      if (!symmetric) pack_zero_points(zero, 37, 3, bits, zero_packed);

      for (const auto& [threads, chunk] :
           {std::pair{1u, std::uint64_t{4} << 20}, std::pair{3u, std::uint64_t{200}},
            std::pair{2u, std::uint64_t{1000}}}) {
        const fs::path out = tmp / ("out" + std::to_string(run++));
        QuantizeOptions options = test_options(tmp / "in", out);
        options.plan.groups = {test::int_group(bits, symmetric, 32)};
        options.allow_unloadable = true;  // vLLM runs 4 and 8 bits only (lint L10)
        options.threads = threads;
        options.chunk_bytes = chunk;
        quantize(options);
        const fs::path shard = out / "model.safetensors";
        const auto packed_out = read_tensor(shard, "m.q_proj.weight_packed");
        ASSERT_EQ(packed_out.size(), packed.size() * 4);
        EXPECT_EQ(std::memcmp(packed_out.data(), packed.data(), packed_out.size()), 0)
            << threads << " threads, chunk " << chunk;
        EXPECT_EQ(read_tensor(shard, "m.q_proj.weight_scale"), scale);
        if (!symmetric) {
          const auto zero_out = read_tensor(shard, "m.q_proj.weight_zero_point");
          ASSERT_EQ(zero_out.size(), zero_packed.size() * 4);
          EXPECT_EQ(std::memcmp(zero_out.data(), zero_packed.data(), zero_out.size()), 0)
              << threads << " threads, chunk " << chunk;
        }
      }
    }
  }
}

// Names that need JSON escaping or are not ASCII survive into the output
// headers and the index; ignore patterns see the decoded names.
TEST(Quantize, NamesWithQuotesBackslashesAndUnicode) {
  TempDir tmp;
  const std::vector<std::string> names = {"layer\"1\".q_proj.weight", "a\\b.up_proj.weight",
                                          "m\u00f6dule.\u00fcber_proj.weight",
                                          "tab\there.norm.bias"};
  std::vector<std::vector<FakeTensor>> shards(2);
  shards[0].push_back(weight(names[0], DType::kBF16, 8, 128));
  shards[0].push_back(weight(names[1], DType::kBF16, 8, 128));
  shards[1].push_back(weight(names[2], DType::kBF16, 8, 128));
  shards[1].push_back(zeros(names[3], DType::kBF16, {8}));
  write_sharded(tmp / "in", shards);
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  options.plan.ignore = {"re:.*\u00fcber_proj$"};
  const QuantizeSummary summary = quantize(options);
  EXPECT_EQ(summary.tensors_quantized, 2u);
  const SafetensorsHeader h0 = read_header(tmp / "out" / shard_name(0, 2), "0");
  EXPECT_NE(h0.find("layer\"1\".q_proj.weight_packed"), nullptr);
  EXPECT_NE(h0.find("a\\b.up_proj.weight_scale"), nullptr);
  const SafetensorsHeader h1 = read_header(tmp / "out" / shard_name(1, 2), "1");
  EXPECT_EQ(read_tensor(tmp / "out" / shard_name(1, 2), names[2]), shards[1][0].data);
  EXPECT_NE(h1.find(names[3]), nullptr);
  const json weight_map = read_json(tmp / "out" / "model.safetensors.index.json")["weight_map"];
  EXPECT_TRUE(weight_map.contains("layer\"1\".q_proj.weight_shape"));
  EXPECT_TRUE(weight_map.contains(names[2]));
  EXPECT_TRUE(weight_map.contains(names[3]));
}

// A Hugging Face cache snapshot: every file is a symbolic link to a blob
// outside the snapshot directory. Such links are refused unless
// follow_symlinks (--follow-symlinks) is set; then they are followed and the
// output holds regular files equal to the golden.
TEST(Quantize, SymlinkedSnapshotDirectory) {
  TempDir tmp;
  const fs::path golden = golden_dir() / "dflash-bf16-sharded";
  fs::create_directories(tmp / "blobs");
  fs::create_directories(tmp / "snapshot");
  int i = 0;
  for (const auto& item : fs::directory_iterator(golden / "input")) {
    const std::string blob = "blob" + std::to_string(i++);
    fs::copy_file(item.path(), tmp / "blobs" / blob);
    fs::create_symlink(fs::path("..") / "blobs" / blob, tmp / "snapshot" / item.path().filename());
  }
  QuantizeOptions options = test_options(tmp / "snapshot", tmp / "out");
  options.plan.ignore = {"re:.*qkv_proj$", "re:.*g_proj$"};
  try {
    quantize(options);
    FAIL() << "links out of INPUT were followed without follow_symlinks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("config.json: is a symbolic link to"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "out"));
  options.follow_symlinks = true;
  quantize(options);
  EXPECT_EQ(diff_golden(tmp / "out", golden / "expected", /*group_keys=*/false), "");
  for (const auto& item : fs::directory_iterator(tmp / "out")) {
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(item.path()))) << item.path();
  }
  // OUTPUT inside the directory the links resolve into is still OUTPUT
  // beside INPUT: allowed. OUTPUT equal to INPUT through a link is not.
  fs::create_directory_symlink(tmp / "snapshot", tmp / "link");
  const QuantizeOptions same = test_options(tmp / "link", tmp / "snapshot");
  try {
    quantize(same);
    FAIL() << "OUTPUT equal to INPUT through a symlink was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  }
}

// Progress reports end at the totals: every input tensor and every input
// tensor byte, also with many small row chunks on several threads.
TEST(Quantize, ProgressEndsAtTheTotals) {
  TempDir tmp;
  write_checkpoint(tmp / "in", rule_tensors(), kConfig);
  std::uint64_t tensor_bytes = 0;
  for (const FakeTensor& t : rule_tensors()) tensor_bytes += t.data.size();
  std::vector<Progress> reports;
  QuantizeOptions options = rule_options(tmp / "in", tmp / "out");
  options.threads = 3;
  options.chunk_bytes = 600;
  options.on_progress = [&](const Progress& p) { reports.push_back(p); };
  quantize(options);
  ASSERT_FALSE(reports.empty());
  const Progress& last = reports.back();
  EXPECT_EQ(last.bytes_total, tensor_bytes);
  EXPECT_EQ(last.bytes_done, tensor_bytes);
  EXPECT_EQ(last.tensors_total, rule_tensors().size());
  EXPECT_EQ(last.tensors_done, rule_tensors().size());
}

// The threads of this process: the entries of /proc/self/task.
std::size_t process_threads() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// One thread runs every job on the calling thread and creates none: each
// progress report, made between jobs (after every job with a zero
// interval), comes from the calling thread while the process has the
// threads it had before the run; the bytes are those of a 3-thread run.
TEST(Execute, OneThreadRunsEveryJobOnTheCallingThread) {
  TempDir tmp;
  write_checkpoint(tmp / "in", rule_tensors(), kConfig);
  const Checkpoint ckpt = open_checkpoint(tmp / "in");
  const PlanOptions defaults;
  const QuantizePlan plan = make_plan(ckpt, defaults);
  const std::size_t threads_before = process_threads();
  const std::thread::id caller = std::this_thread::get_id();
  std::size_t reports = 0;
  ExecuteOptions options;
  options.threads = 1;
  options.chunk_bytes = 600;  // many row chunks, so many jobs
  options.progress_interval_ms = 0;
  options.fsync = false;
  options.on_progress = [&](const Progress&) {
    ++reports;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(process_threads(), threads_before);
  };
  fs::create_directory(tmp / "t1");
  execute_plan(ckpt, plan, tmp / "t1", options);
  EXPECT_GE(reports, 10u) << "progress is reported between jobs, not only at the end";

  options.threads = 3;
  options.on_progress = {};
  fs::create_directory(tmp / "t3");
  execute_plan(ckpt, plan, tmp / "t3", options);
  EXPECT_EQ(diff_bytes(tmp / "t3", tmp / "t1"), "");
}

// ---- errors: kind, message, and nothing left behind ----

struct ErrorCase {
  std::string name;
  std::function<void(const fs::path& input)> make_input;
  std::function<void(QuantizeOptions&)> adjust;  // may be empty
  ErrorKind kind;
  std::vector<std::string> fragments;  // each must appear in the message
  std::vector<std::string> absent;     // none may appear
};

std::vector<ErrorCase> error_cases() {
  std::vector<ErrorCase> cases;
  cases.push_back(
      {"GroupSizeListsEveryTensor",
       [](const fs::path& in) {
         write_sharded(in, {{weight("a.q_proj.weight", DType::kBF16, 8, 100),
                             weight("b.ok_proj.weight", DType::kBF16, 8, 128),
                             weight("lm_head.weight", DType::kBF16, 8, 100)},
                            {weight("c.k_proj.weight", DType::kF16, 8, 100),
                             weight("d.up_proj.weight", DType::kF32, 8, 64)}});
       },
       {},
       ErrorKind::kBadInput,
       {"model-00001-of-00002.safetensors: tensor 'a.q_proj.weight' [8, 100] has in_features "
        "100, not a multiple of the group size 128",
        "model-00002-of-00002.safetensors: tensor 'c.k_proj.weight' [8, 100] has in_features 100",
        "model-00002-of-00002.safetensors: tensor 'd.up_proj.weight' [8, 64] has in_features 64",
        "3 tensor(s) cannot be quantized with group size 128: keep them in 16 bits (--ignore "
        "'re:.*\\.(k_proj|q_proj|up_proj)$') or pick another --group-size"},
       {"lm_head", "b.ok_proj"}});
  cases.push_back({"GroupSizeThirtyTwoAlsoChecked",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 48)});
                   },
                   [](QuantizeOptions& o) { test::set_group_size(o.plan, 32); },
                   ErrorKind::kBadInput,
                   {"tensor 'a.q_proj.weight' [8, 48] has in_features 48, not a multiple of the "
                    "group size 32"},
                   {}});
  cases.push_back({"NanInSelectedWeight",
                   [](const fs::path& in) {
                     FakeTensor w =
                         weight("model.layers.0.self_attn.q_proj.weight", DType::kBF16, 16, 128);
                     set_element(w, 5, 77, std::numeric_limits<float>::quiet_NaN());
                     write_checkpoint(in, {w, weight("lm_head.weight", DType::kBF16, 4, 128)});
                   },
                   // 256-byte rows, 512-byte chunks: row 5 is in the third chunk, so the
                   // reported row must be the tensor's, not the chunk's.
                   [](QuantizeOptions& o) { o.chunk_bytes = 512; },
                   ErrorKind::kBadInput,
                   {"model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight': element "
                    "[5, 77] is nan"},
                   {}});
  cases.push_back({"InfInSelectedF32Weight",
                   [](const fs::path& in) {
                     FakeTensor w = weight("m.down_proj.weight", DType::kF32, 4, 128);
                     set_element(w, 3, 127, -std::numeric_limits<float>::infinity());
                     write_checkpoint(in, {w});
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"tensor 'm.down_proj.weight': element [3, 127] is -inf"},
                   {}});
  cases.push_back({"InfInSelectedF16WeightInSecondShard",
                   [](const fs::path& in) {
                     FakeTensor w = weight("b.up_proj.weight", DType::kF16, 4, 128);
                     set_element(w, 0, 1, 1e6f);  // overflows F16: stored as +inf
                     write_sharded(in, {{weight("a.up_proj.weight", DType::kF16, 4, 128)}, {w}});
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"model-00002-of-00002.safetensors: tensor 'b.up_proj.weight': element [0, 1] "
                    "is inf"},
                   {}});
  cases.push_back({"IndexNamesMissingFiles",
                   [](const fs::path& in) {
                     write_sharded(in, {{weight("a.q_proj.weight", DType::kBF16, 8, 128)}},
                                   [](json& m) {
                                     m["x.weight"] = "model-00003-of-00003.safetensors";
                                     m["y.weight"] = "model-00003-of-00003.safetensors";
                                     m["z.weight"] = "model-00002-of-00003.safetensors";
                                   });
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"model.safetensors.index.json: weight_map names file "
                    "'model-00002-of-00003.safetensors' for 1 tensor(s) (first 'z.weight'), "
                    "which does not exist",
                    "weight_map names file 'model-00003-of-00003.safetensors' for 2 tensor(s) "
                    "(first 'x.weight')"},
                   {}});
  cases.push_back({"IndexNamesTensorTheFileDoesNotHold",
                   [](const fs::path& in) {
                     write_sharded(in,
                                   {{weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                                    {weight("b.q_proj.weight", DType::kBF16, 8, 128)}},
                                   [](json& m) { m["ghost.weight"] = shard_name(0, 2); });
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"model.safetensors.index.json: weight_map lists tensor 'ghost.weight' in "
                    "'model-00001-of-00002.safetensors', but that file does not hold it"},
                   {}});
  cases.push_back({"IndexMapsTensorToTheWrongShard",
                   [](const fs::path& in) {
                     write_sharded(in,
                                   {{weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                                    {weight("b.q_proj.weight", DType::kBF16, 8, 128)}},
                                   [](json& m) { m["a.q_proj.weight"] = shard_name(1, 2); });
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"weight_map lists tensor 'a.q_proj.weight' in "
                    "'model-00002-of-00002.safetensors', but that file does not hold it"},
                   {}});
  cases.push_back({"SameTensorInTwoShards",
                   [](const fs::path& in) {
                     write_sharded(in, {{weight("a.q_proj.weight", DType::kBF16, 8, 128),
                                         weight("b.q_proj.weight", DType::kBF16, 8, 128)},
                                        {weight("a.q_proj.weight", DType::kBF16, 8, 128),
                                         weight("c.q_proj.weight", DType::kBF16, 8, 128)}});
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"model-00002-of-00002.safetensors: tensor 'a.q_proj.weight' is also in "
                    "model-00001-of-00002.safetensors"},
                   {}});
  cases.push_back({"IndexIsNotJson",
                   [](const fs::path& in) {
                     write_sharded(in, {{weight("a.q_proj.weight", DType::kBF16, 8, 128)}});
                     write_file(in / "model.safetensors.index.json", "{\"weight_map\": ");
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"model.safetensors.index.json: not valid JSON"},
                   {}});
  cases.push_back({"IndexShardPathLeavesTheDirectory",
                   [](const fs::path& in) {
                     write_sharded(in, {{weight("a.q_proj.weight", DType::kBF16, 8, 128)}},
                                   [](json& m) { m["a.q_proj.weight"] = "../x.safetensors"; });
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"weight_map entry 'a.q_proj.weight' names file '../x.safetensors', which is "
                    "not a plain file name"},
                   {}});
  cases.push_back({"ConfigIsNotJson",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
                     write_file(in / "config.json", "{\"model_type\": \"llama\",");
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"config.json: not valid JSON"},
                   {}});
  // Running as root, a file cannot be made unreadable by its mode; a link
  // whose target is gone is the unreadable config.json of a broken cache.
  cases.push_back({"ConfigIsADanglingLink",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                                      json());
                     fs::create_symlink(in / "gone.json", in / "config.json");
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"config.json is not a regular file: it is a symbolic link whose target is "
                    "missing or not a regular file"},
                   {}});
  cases.push_back({"ShardIsADanglingLink",
                   [](const fs::path& in) {
                     write_sharded(in, {{weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                                        {weight("b.q_proj.weight", DType::kBF16, 8, 128)}});
                     fs::rename(in / shard_name(1, 2), in / "blob");
                     fs::create_symlink(in / "missing-blob", in / shard_name(1, 2));
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"model-00002-of-00002.safetensors is not a regular file"},
                   {}});
  cases.push_back({"ConfigIsADirectory",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                                      json());
                     fs::create_directories(in / "config.json");
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"config.json is not a regular file: it is a directory"},
                   {}});
  cases.push_back({"ConfigIsNotAnObject",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                                      json::array({1, 2}));
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"config.json: is a JSON array, expected an object"},
                   {}});
  cases.push_back({"ConfigAlreadyQuantized",
                   [](const fs::path& in) {
                     json config = kConfig;
                     config["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                                      {"format", "pack-quantized"}};
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)},
                                      config);
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"config.json: quantization_config has quant_method \"compressed-tensors\" "
                    "with format \"pack-quantized\"",
                    "already pack-quantized"},
                   {}});
  cases.push_back({"SeveralFilesWithoutIndex",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
                     write_safetensors(in / "extra.safetensors",
                                       {weight("b.q_proj.weight", DType::kBF16, 8, 128)});
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"2 .safetensors files but no model.safetensors.index.json"},
                   {}});
  cases.push_back({"NoSafetensorsFile",
                   [](const fs::path& in) {
                     fs::create_directories(in);
                     write_file(in / "config.json", kConfig.dump());
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"no .safetensors file in the directory"},
                   {}});
  cases.push_back({"OutputNameCollision",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("m.q_proj.weight", DType::kBF16, 8, 128),
                                           zeros("m.q_proj.weight_packed", DType::kI32, {8, 16})});
                   },
                   {},
                   ErrorKind::kBadInput,
                   {"model.safetensors: output tensor 'm.q_proj.weight_packed' would be written "
                    "twice"},
                   {}});
  cases.push_back({"InvalidIgnorePatterns",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
                   },
                   [](QuantizeOptions& o) {
                     o.plan.ignore = {"re:(", "lm_head", "re:[x"};
                   },
                   ErrorKind::kUsage,
                   {"--ignore 're:('", "--ignore 're:[x'"},
                   {}});
  cases.push_back({"PatternErrorsBeforeInputIsRead",
                   [](const fs::path& in) { fs::create_directories(in); },
                   [](QuantizeOptions& o) {
                     o.plan.ignore = {"re:a)"};
                     o.plan.groups.front().targets = {"re:(?<n"};
                   },
                   ErrorKind::kUsage,
                   {"--ignore 're:a)'", "--targets 're:(?<n'"},
                   {"no .safetensors file"}});
  cases.push_back({"Interrupted",
                   [](const fs::path& in) { write_checkpoint(in, rule_tensors(), kConfig); },
                   [](QuantizeOptions& o) {
                     static const std::atomic<bool> kCancelled{true};
                     o.cancel = &kCancelled;
                     o.allow_unloadable = true;  // see rule_options()
                   },
                   ErrorKind::kInterrupted,
                   {"interrupted"},
                   {}});
  cases.push_back({"ZeroThreads",
                   [](const fs::path& in) {
                     write_checkpoint(in, {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
                   },
                   [](QuantizeOptions& o) { o.threads = 0; },
                   ErrorKind::kUsage,
                   {"--threads must be at least 1"},
                   {}});
  cases.push_back({"InputDoesNotExist",
                   [](const fs::path& in) { fs::create_directories(in.parent_path()); },
                   [](QuantizeOptions& o) { o.input = o.input / "nothing"; },
                   ErrorKind::kIo,
                   {"nothing: no such file or directory"},
                   {}});
  return cases;
}

// Test names print the case name, not the bytes of the struct.
void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class QuantizeError : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(QuantizeError, FailsCleanly) {
  const ErrorCase& c = GetParam();
  TempDir tmp;
  c.make_input(tmp / "in");
  const auto before = snapshot_files(tmp.path());
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  if (c.adjust) c.adjust(options);
  try {
    quantize(options);
    FAIL() << "quantize succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), c.kind) << e.what();
    expect_message(e.what(), c.fragments, c.absent);
  }
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
  EXPECT_EQ(snapshot_files(tmp.path()), before) << "the input was modified";
}

INSTANTIATE_TEST_SUITE_P(Cases, QuantizeError, ::testing::ValuesIn(error_cases()),
                         [](const ::testing::TestParamInfo<ErrorCase>& param) {
                           return param.param.name;
                         });

// A NaN or infinity in a tensor that is copied (ignored, norm, 3-D,
// embedding, bias) is not inspected: the run succeeds and copies it.
TEST(Quantize, NonFiniteInCopiedTensorsIsFine) {
  TempDir tmp;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  FakeTensor head = weight("lm_head.weight", DType::kBF16, 4, 128);
  set_element(head, 1, 2, nan);
  FakeTensor norm = weight("model.layers.0.k_norm.weight", DType::kBF16, 4, 128);
  set_element(norm, 0, 0, std::numeric_limits<float>::infinity());
  FakeTensor embed = weight("model.embed_tokens.weight", DType::kF32, 4, 128);
  set_element(embed, 3, 3, nan);
  FakeTensor bias = zeros("model.layers.0.q_proj.bias", DType::kF32, {4});
  std::memcpy(bias.data.data(), &nan, 4);
  const std::vector<FakeTensor> tensors = {
      head, norm, embed, bias, weight("model.layers.0.q_proj.weight", DType::kBF16, 4, 128)};
  write_checkpoint(tmp / "in", tensors);
  const QuantizeSummary summary = quantize(test_options(tmp / "in", tmp / "out"));
  EXPECT_EQ(summary.tensors_quantized, 1u);
  for (const FakeTensor& t : {head, norm, embed, bias}) {
    EXPECT_EQ(read_tensor(tmp / "out" / "model.safetensors", t.name), t.data) << t.name;
  }
}

// ---- OUTPUT handling ----

Error quantize_error(const QuantizeOptions& options) {
  try {
    quantize(options);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "quantize succeeded";
  return Error(ErrorKind::kIo, "");
}

TEST(QuantizeOutput, ExistingOutputWithoutForceIsUsageError) {
  TempDir tmp;
  write_checkpoint(tmp / "in", {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
  fs::create_directories(tmp / "out");
  write_file(tmp / "out" / "keep.txt", "old");
  const Error e = quantize_error(test_options(tmp / "in", tmp / "out"));
  EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  EXPECT_NE(std::string(e.what()).find("already exists (use --force to replace it)"),
            std::string::npos)
      << e.what();
  EXPECT_EQ(snapshot_files(tmp / "out"), (std::map<std::string, std::string>{{"keep.txt", "old"}}));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

TEST(QuantizeOutput, ForceReplacesExistingOutput) {
  TempDir tmp;
  write_checkpoint(tmp / "in", {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
  write_checkpoint(tmp / "out", {weight("old.q_proj.weight", DType::kBF16, 8, 128)});
  write_file(tmp / "out" / "keep.txt", "old");
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  options.force = true;
  quantize(options);
  std::vector<std::string> names;
  for (const auto& [name, bytes] : snapshot_files(tmp / "out")) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "ctquant-manifest.json",
                                             "model.safetensors",
                                             "model.safetensors.index.json"}));
  // Nothing but in/ and out/ remains: no temporary or set-aside directory.
  std::vector<std::string> entries;
  for (const auto& item : fs::directory_iterator(tmp.path())) {
    entries.push_back(item.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"in", "out"}));
}

TEST(QuantizeOutput, ForceKeepsOldOutputWhenTheRunFails) {
  TempDir tmp;
  FakeTensor w = weight("a.q_proj.weight", DType::kBF16, 8, 128);
  set_element(w, 7, 127, std::numeric_limits<float>::quiet_NaN());
  write_checkpoint(tmp / "in", {w});
  write_checkpoint(tmp / "out", {weight("old.q_proj.weight", DType::kBF16, 8, 128)});
  write_file(tmp / "out" / "keep.txt", "old");
  const auto before = snapshot_files(tmp / "out");
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  options.force = true;
  EXPECT_EQ(quantize_error(options).kind(), ErrorKind::kBadInput);
  EXPECT_EQ(snapshot_files(tmp / "out"), before);
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

// OUTPUT equal to, inside or containing INPUT is refused before anything is
// written, whatever spelling the paths use.
TEST(QuantizeOutput, OutputOverlappingInputIsUsageError) {
  TempDir tmp;
  write_checkpoint(tmp / "in", {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
  const auto before = snapshot_files(tmp.path());
  struct Case {
    fs::path input;
    fs::path output;
    bool force;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {tmp / "in", tmp / "in", false, "is the INPUT"},
      {tmp / "in", tmp / "in", true, "is the INPUT"},
      {tmp / "in", tmp.path() / "in" / "", true, "is the INPUT"},
      {tmp / "in", tmp / "x" / ".." / "in", true, "is the INPUT"},
      {tmp / "in", tmp / "in" / "out", false, "lies inside INPUT"},
      {tmp / "in", tmp / "in" / "a" / "b", false, "lies inside INPUT"},
      {tmp / "in", tmp.path(), true, "contains INPUT"},
      {tmp / "in" / "model.safetensors", tmp / "in" / "model.safetensors", true, "is the INPUT"},
      {tmp / "in" / "model.safetensors", tmp.path(), true, "contains INPUT"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.input.string() + " -> " + c.output.string());
    QuantizeOptions options = test_options(c.input, c.output);
    options.force = c.force;
    const Error e = quantize_error(options);
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find(c.fragment), std::string::npos) << e.what();
    EXPECT_EQ(snapshot_files(tmp.path()), before);
    EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
    EXPECT_EQ(temp_leftovers(tmp / "in"), std::vector<std::string>{});
  }
}

TEST(QuantizeOutput, MissingParentDirectoryIsUsageError) {
  TempDir tmp;
  write_checkpoint(tmp / "in", {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
  const Error e = quantize_error(test_options(tmp / "in", tmp / "no" / "out"));
  EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  EXPECT_NE(std::string(e.what()).find("that should hold OUTPUT does not exist"), std::string::npos)
      << e.what();
  EXPECT_FALSE(fs::exists(tmp / "no"));

  // A usage error about OUTPUT comes before INPUT is read (docs/cli.md): an
  // input cut short is not reported, the missing directory is.
  write_checkpoint(tmp / "cut", {weight("a.q_proj.weight", DType::kBF16, 8, 128)});
  fs::resize_file(tmp / "cut" / "model.safetensors",
                  fs::file_size(tmp / "cut" / "model.safetensors") - 2);
  const Error before_input = quantize_error(test_options(tmp / "cut", tmp / "no" / "out"));
  EXPECT_EQ(before_input.kind(), ErrorKind::kUsage);
  EXPECT_NE(std::string(before_input.what()).find("that should hold OUTPUT does not exist"),
            std::string::npos)
      << before_input.what();
}

// A single .safetensors file: the output directory holds the same file name
// and the config.json beside it with quantization_config set (only
// quantization_config without one); the other files beside the input file
// are not part of the checkpoint and are not copied.
TEST(QuantizeOutput, SingleFileInput) {
  TempDir tmp;
  fs::create_directories(tmp / "dir");
  write_safetensors(tmp / "dir" / "weights.safetensors",
                    {weight("a.q_proj.weight", DType::kBF16, 8, 128),
                     zeros("a.input_layernorm.weight", DType::kBF16, {128})});
  write_file(tmp / "dir" / "README.md", "not copied");
  write_file(tmp / "dir" / "config.json", "{\"model_type\": \"llama\"}");
  const QuantizeSummary summary =
      quantize(test_options(tmp / "dir" / "weights.safetensors", tmp / "out"));
  EXPECT_EQ(summary.tensors_quantized, 1u);
  EXPECT_EQ(summary.tensors_copied, 1u);
  std::vector<std::string> names;
  for (const auto& [name, bytes] : snapshot_files(tmp / "out")) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "ctquant-manifest.json",
                                             "model.safetensors.index.json",
                                             "weights.safetensors"}));
  const json config = read_json(tmp / "out" / "config.json");
  EXPECT_EQ(config.size(), 2u);
  EXPECT_EQ(config.at("model_type"), "llama");
  EXPECT_EQ(config.at("quantization_config").at("format"), "pack-quantized");
  // Without config.json beside it: lint L19, written with --allow-unloadable.
  fs::remove(tmp / "dir" / "config.json");
  QuantizeOptions alone = test_options(tmp / "dir" / "weights.safetensors", tmp / "alone");
  alone.allow_unloadable = true;
  quantize(alone);
  EXPECT_EQ(read_json(tmp / "alone" / "config.json").size(), 1u);
  EXPECT_NE(SafetensorsFile(tmp / "out" / "weights.safetensors", "w")
                .header()
                .find("a.q_proj.weight_packed"),
            nullptr);
}

TEST(QuantizeOutput, DryRunWritesNothing) {
  TempDir tmp;
  write_checkpoint(tmp / "in", rule_tensors(), kConfig);
  QuantizeOptions options = rule_options(tmp / "in", tmp / "out");
  options.dry_run = true;
  const QuantizeSummary summary = quantize(options);
  EXPECT_EQ(summary.tensors_quantized, 3u);
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

// "quantization_config": null says the checkpoint is not quantized: it is
// replaced like an absent one, the other keys kept.
TEST(Quantize, NullQuantizationConfigIsReplaced) {
  TempDir tmp;
  json config = kConfig;
  config["quantization_config"] = nullptr;
  write_checkpoint(tmp / "in", {weight("a.q_proj.weight", DType::kBF16, 8, 128)}, config);
  quantize(test_options(tmp / "in", tmp / "out"));
  json out = read_json(tmp / "out" / "config.json");
  EXPECT_EQ(out["quantization_config"]["format"], "pack-quantized");
  out.erase("quantization_config");
  EXPECT_EQ(out, kConfig);
}

// Asymmetric and channel-wise schemes write their extra tensor and shapes.
TEST(Quantize, AsymmetricAndChannelWiseShapes) {
  TempDir tmp;
  write_checkpoint(tmp / "in", {weight("m.q_proj.weight", DType::kBF16, 20, 256)});
  QuantizeOptions asym = test_options(tmp / "in", tmp / "asym");
  asym.plan.groups = {preset_group("W4A16_ASYM")};
  quantize(asym);
  const SafetensorsHeader a = read_header(tmp / "asym" / "model.safetensors", "asym");
  ASSERT_NE(a.find("m.q_proj.weight_zero_point"), nullptr);
  // Zero points packed along dim 0: ceil(20 * 4 / 32) = 3 rows, one column per group.
  EXPECT_EQ(a.find("m.q_proj.weight_zero_point")->shape, (std::vector<std::uint64_t>{3, 2}));
  EXPECT_EQ(a.find("m.q_proj.weight_zero_point")->dtype, DType::kI32);
  EXPECT_EQ(
      read_json(
          tmp / "asym" /
          "config.json")["quantization_config"]["config_groups"]["W4A16_ASYM"]["weights"]["zp_dtype"],
      "torch.int8");

  QuantizeOptions channel = test_options(tmp / "in", tmp / "channel");
  test::set_group_size(channel.plan, 0);
  quantize(channel);
  const SafetensorsHeader c = read_header(tmp / "channel" / "model.safetensors", "channel");
  EXPECT_EQ(c.find("m.q_proj.weight_scale")->shape, (std::vector<std::uint64_t>{20, 1}));
  const json weights =
      read_json(tmp / "channel" /
                "config.json")["quantization_config"]["config_groups"]["config_group_0"]["weights"];
  EXPECT_EQ(weights["strategy"], "channel");
  EXPECT_TRUE(weights["group_size"].is_null());
}

}  // namespace
}  // namespace ctquant::test
