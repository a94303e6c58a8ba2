// Real third-party safetensors files (tests/real, copied byte for byte from
// public repositories; tests/real/PROVENANCE.md says where each came from).
// Every directory and every .safetensors file there is run through quantize
// with a stated expectation: it quantizes (with the modules that must be
// quantized, every copied tensor byte-identical and every other file copied)
// or it fails with the specific error the format spec asks for, leaving
// nothing behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/util/error.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RealCase {
  std::string name;                              // test name
  std::string path;                              // relative to tests/real
  std::function<void(QuantizeOptions&)> adjust;  // may be empty
  // Success: the modules that must be quantized (sorted) and how many tensors
  // are copied; selected tensors' decision rules.
  bool succeeds = true;
  std::vector<std::string> quantized;
  std::size_t n_copied = 0;
  std::vector<std::pair<std::string, std::string>> rules;  // tensor -> rule
  // Failure: kind and message fragments.
  ErrorKind kind = ErrorKind::kBadInput;
  std::vector<std::string> fragments;
  std::vector<std::string> absent;
};

// A group size that fits these small files; vLLM runs only 32, 64 and 128
// (lint L10), so other sizes are written only when asked for.
void group_size(QuantizeOptions& o, std::uint64_t g) {
  test::set_group_size(o.plan, g);
  o.allow_unloadable = g != 0 && g != 32 && g != 64 && g != 128;
}

std::vector<RealCase> real_cases() {
  std::vector<RealCase> cases;
  const auto ok = [&](std::string name, std::string path, std::vector<std::string> quantized,
                      std::size_t n_copied,
                      std::vector<std::pair<std::string, std::string>> rules = {},
                      std::function<void(QuantizeOptions&)> adjust = {}) {
    RealCase c;
    c.name = std::move(name);
    c.path = std::move(path);
    // Nothing to quantize is lint L9, an error: these cases check the
    // copy written under --allow-unloadable (BurnBooleanStoppedByLint checks
    // the refusal).
    // So is a checkpoint without config.json (L19): most of these files
    // come without one, and the tensors are what the cases check.
    const fs::path file = real_dir() / path;
    const fs::path config = (fs::is_directory(file) ? file : file.parent_path()) / "config.json";
    if (quantized.empty() || !fs::exists(config)) {
      adjust = [inner = std::move(adjust)](QuantizeOptions& o) {
        if (inner) inner(o);
        o.allow_unloadable = true;
      };
    }
    c.adjust = std::move(adjust);
    c.quantized = std::move(quantized);
    c.n_copied = n_copied;
    c.rules = std::move(rules);
    cases.push_back(std::move(c));
  };
  const auto fails = [&](std::string name, std::string path, ErrorKind kind,
                         std::vector<std::string> fragments, std::vector<std::string> absent = {},
                         std::function<void(QuantizeOptions&)> adjust = {}) {
    RealCase c;
    c.name = std::move(name);
    c.path = std::move(path);
    c.adjust = std::move(adjust);
    c.succeeds = false;
    c.kind = kind;
    c.fragments = std::move(fragments);
    c.absent = std::move(absent);
    cases.push_back(std::move(c));
  };

  // torchtune's one-layer HF Llama/Gemma in F16, hidden size 64: six linear
  // weights have in_features 64, which group size 128 cannot split (all six
  // are listed at once, down_proj [64, 256] is fine); with group size 64
  // every linear weight quantizes.
  const std::string gemma = "llm_f16_torchtune_gemma_tiny/gemma_hf_checkpoint.safetensors";
  const std::vector<std::string> gemma_in64 = {
      "'model.layers.0.mlp.gate_proj.weight' [256, 64] has in_features 64",
      "'model.layers.0.mlp.up_proj.weight' [256, 64] has in_features 64",
      "'model.layers.0.self_attn.k_proj.weight' [16, 64] has in_features 64",
      "'model.layers.0.self_attn.o_proj.weight' [64, 64] has in_features 64",
      "'model.layers.0.self_attn.q_proj.weight' [64, 64] has in_features 64",
      "'model.layers.0.self_attn.v_proj.weight' [16, 64] has in_features 64",
      "6 tensor(s) cannot be quantized with group size 128: keep them in 16 bits (--ignore "
      "'re:.*\\.(gate_proj|k_proj|o_proj|q_proj|up_proj|v_proj)$')"};
  std::vector<std::string> gemma_file_fragments = gemma_in64;
  gemma_file_fragments.push_back(
      "gemma_hf_checkpoint.safetensors: tensor "
      "'model.layers.0.mlp.gate_proj.weight'");
  fails("GemmaTinyDirectoryGroupSize128", "llm_f16_torchtune_gemma_tiny", ErrorKind::kBadInput,
        gemma_file_fragments, {"down_proj", "embed_tokens"});
  fails("GemmaTinyFileGroupSize128", gemma, ErrorKind::kBadInput, gemma_in64, {"down_proj"});
  const std::vector<std::string> gemma_linear = {
      "model.layers.0.mlp.down_proj",    "model.layers.0.mlp.gate_proj",
      "model.layers.0.mlp.up_proj",      "model.layers.0.self_attn.k_proj",
      "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj",
      "model.layers.0.self_attn.v_proj"};
  ok("GemmaTinyGroupSize64", gemma, gemma_linear, 4,
     {{"model.embed_tokens.weight", "embedding (target Linear never covers it)"},
      {"model.layers.0.input_layernorm.weight", "1-D, not a 2-D linear weight"},
      {"model.norm.weight", "1-D, not a 2-D linear weight"}},
     [](QuantizeOptions& o) { group_size(o, 64); });

  // ollama's fake MiniCPM3 in F32: every 2-D weight is [100, 100]. lm_head
  // is ignored by default and not reported; the eight others are.
  fails("MiniCpm3GroupSize128", "llm_f32_ollama_minicpm3_testdata", ErrorKind::kBadInput,
        {"model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' [100, 100] has "
         "in_features 100, not a multiple of the group size 128",
         "'model.layers.0.self_attn.kv_a_proj_with_mqa.weight' [100, 100]",
         "'model.layers.0.self_attn.q_b_proj.weight' [100, 100]",
         "8 tensor(s) cannot be quantized with group size 128"},
        {"lm_head", "embed_tokens"});
  const std::vector<std::string> minicpm_linear = {
      "model.layers.0.mlp.down_proj",       "model.layers.0.mlp.gate_proj",
      "model.layers.0.mlp.up_proj",         "model.layers.0.self_attn.kv_a_proj_with_mqa",
      "model.layers.0.self_attn.kv_b_proj", "model.layers.0.self_attn.o_proj",
      "model.layers.0.self_attn.q_a_proj",  "model.layers.0.self_attn.q_b_proj"};
  ok("MiniCpm3ChannelWise", "llm_f32_ollama_minicpm3_testdata", minicpm_linear, 7,
     {{"lm_head.weight", "ignored by 'lm_head'"},
      {"model.layers.0.self_attn.kv_a_layernorm.weight", "1-D, not a 2-D linear weight"}},
     [](QuantizeOptions& o) { group_size(o, 0); });
  ok("MiniCpm3GroupSize20", "llm_f32_ollama_minicpm3_testdata/model.safetensors", minicpm_linear, 7,
     {}, [](QuantizeOptions& o) { group_size(o, 20); });

  // The real gpt-oss-20b index without its shards: every missing shard file
  // is named, with how many tensors the index maps to it.
  fails("GptOssIndexWithoutShards", "index_only_gpt_oss_20b", ErrorKind::kBadInput,
        {"model.safetensors.index.json: weight_map names file 'model-00000-of-00002.safetensors' "
         "for 196 tensor(s) (first 'model.layers.0.input_layernorm.weight'), which does not "
         "exist",
         "'model-00001-of-00002.safetensors' for 197 tensor(s)",
         "'model-00002-of-00002.safetensors' for 66 tensor(s) (first 'lm_head.weight')"});

  // compressed-tensors' Hadamard table: 66 I8 tensors named "1".."256"
  // (no module part), all copied. Its __metadata__ (construction names) is
  // not carried over: output shards hold {"format": "pt"} (section 5).
  ok("HadamardsDirectory", "compressed_tensors_hadamards", {}, 66,
     {{"100", "not a .weight tensor"}});
  ok("HadamardsFile", "compressed_tensors_hadamards/hadamards.safetensors", {}, 66);

  // An MLX LoRA adapter: "__metadata__": null (accepted, as by the reference
  // reader) and lora_a / lora_b parameters, which are not .weight tensors.
  ok("MlxLoraAdapterDirectory", "lora_mlx_ollama_discollama", {}, 8,
     {{"model.layers.30.self_attn.q_proj.lora_a", "not a .weight tensor"}});
  ok("MlxLoraAdapterFile", "lora_mlx_ollama_discollama/adapters.safetensors", {}, 8);

  // torchao FP8: names are "<param>:<component>" ("0.weight:qdata" F8_E4M3
  // [256, 32], "0.weight:scale", "0.bias:data"), a tensor-subclass layout
  // described in __metadata__ and none of the FP8 layouts of section 6.
  // ctquant refuses it and names the tensors (docs/cli.md, "Layouts ctquant
  // does not know").
  const std::vector<std::string> torchao_refusal = {
      "fp8_weights.safetensors: tensors '0.weight:scale', '0.bias:data', '0.weight:qdata'",
      "torchao's tensor-subclass layout", "3 tensor(s) cannot be converted"};
  fails("TorchaoParentDirectory", "fp8_torchao", ErrorKind::kBadInput,
        {"no .safetensors file in the directory"});
  fails("TorchaoTwoFilesWithoutIndex", "fp8_torchao/d0f7d539", ErrorKind::kBadInput,
        {"2 .safetensors files but no model.safetensors.index.json"});
  fails("TorchaoFp8Directory", "fp8_torchao/f892e970", ErrorKind::kBadInput, torchao_refusal);
  fails("TorchaoFp8File", "fp8_torchao/d0f7d539/fp8_weights.safetensors", ErrorKind::kBadInput,
        torchao_refusal);
  fails("TorchaoFp8NewMetadataFile", "fp8_torchao/f892e970/fp8_weights.safetensors",
        ErrorKind::kBadInput, torchao_refusal);
  // F32 linear weights stored as "layerN.weight:original_weight": the same
  // layout, refused too.
  fails("TorchaoOriginalWeightsFile", "fp8_torchao/d0f7d539/fp8_weights_multi.safetensors",
        ErrorKind::kBadInput,
        {"fp8_weights_multi.safetensors: tensors", "'layer3.weight:original_weight'",
         "torchao's tensor-subclass layout"});

  // burn's PyTorch test modules.
  fails("BurnDirectory", "misc_burn", ErrorKind::kBadInput,
        {"9 .safetensors files but no model.safetensors.index.json to say which are shards of "
         "the checkpoint (to quantize one file alone, give that file as INPUT)"});
  ok("BurnBoolean", "misc_burn/boolean.safetensors", {}, 1, {{"buffer", "not a .weight tensor"}});
  ok("BurnBuffer", "misc_burn/buffer.safetensors", {}, 1);
  fails("BurnBooleanStoppedByLint", "misc_burn/boolean.safetensors", ErrorKind::kLint,
        {"L9 error: no tensor would be quantized (of 1 tensor)", "--allow-unloadable"});
  fails("BurnComplexNested", "misc_burn/complex_nested.safetensors", ErrorKind::kBadInput,
        {"complex_nested.safetensors: tensor 'fc1.weight' [12, 120] has in_features 120",
         "complex_nested.safetensors: tensor 'fc2.weight' [10, 12] has in_features 12",
         "2 tensor(s) cannot be quantized with group size 128"});
  ok("BurnComplexNestedChannelWise", "misc_burn/complex_nested.safetensors", {"fc1", "fc2"}, 21,
     {{"conv_blocks.0.conv.weight", "4-D, not a 2-D linear weight"},
      {"conv_blocks.0.norm.weight", "1-D, not a 2-D linear weight"},
      {"norm1.num_batches_tracked", "not a .weight tensor"}},
     [](QuantizeOptions& o) { group_size(o, 0); });
  ok("BurnConv2d", "misc_burn/conv2d.safetensors", {}, 3,
     {{"conv1.weight", "4-D, not a 2-D linear weight"}});
  ok("BurnEmbedding", "misc_burn/embedding.safetensors", {}, 1,
     {{"embed.weight", "embedding (target Linear never covers it)"}});
  ok("BurnInteger", "misc_burn/integer.safetensors", {}, 1);
  fails("BurnLinearWithBias", "misc_burn/linear_with_bias.safetensors", ErrorKind::kBadInput,
        {"linear_with_bias.safetensors: tensor 'fc1.weight' [3, 2] has in_features 2, not a "
         "multiple of the group size 128"});
  ok("BurnLinearWithBiasGroupSize2", "misc_burn/linear_with_bias.safetensors", {"fc1"}, 1,
     {{"fc1.bias", "not a .weight tensor"}}, [](QuantizeOptions& o) { group_size(o, 2); });
  // fc1.weight [16, 256] quantizes; the 0-d I64 num_batches_tracked, the
  // 4-D conv weight and the batch-norm tensors are copied.
  ok("BurnMultiLayer", "misc_burn/multi_layer.safetensors", {"fc1"}, 8,
     {{"norm1.num_batches_tracked", "not a .weight tensor"},
      {"conv1.weight", "4-D, not a 2-D linear weight"},
      {"norm1.weight", "1-D, not a 2-D linear weight"}});
  ok("BurnNonContiguousIndexes", "misc_burn/non_contiguous_indexes.safetensors", {}, 10);

  // candle example data.
  fails("CandleDirectory", "misc_candle", ErrorKind::kBadInput,
        {"2 .safetensors files but no model.safetensors.index.json"});
  ok("CandleJfkCodes", "misc_candle/jfk-codes.safetensors", {}, 1);
  ok("CandleMelFilters", "misc_candle/mel_filters.safetensors", {}, 1,
     {{"mel_80", "not a .weight tensor"}});

  // safetensors.numpy samples from 2022 with unaligned headers.
  fails("SamplesDirectory", "misc_safetensors_samples", ErrorKind::kBadInput,
        {"4 .safetensors files but no model.safetensors.index.json"});
  ok("SamplesD", "misc_safetensors_samples/d.safetensors", {}, 1);
  ok("SamplesE", "misc_safetensors_samples/e.safetensors", {}, 1);
  ok("SamplesF", "misc_safetensors_samples/f.safetensors", {}, 1);
  ok("SamplesOverall", "misc_safetensors_samples/overall.safetensors", {}, 9);
  return cases;
}

// The shard files of an input: the file itself, or the directory's .safetensors files.
std::vector<fs::path> input_shards(const fs::path& input) {
  if (fs::is_regular_file(input)) return {input};
  std::vector<fs::path> shards;
  for (const auto& item : fs::directory_iterator(input)) {
    if (item.path().extension() == ".safetensors") shards.push_back(item.path());
  }
  return shards;
}

void verify_output(const fs::path& input, const fs::path& out, const QuantizeSummary& summary,
                   const RealCase& c) {
  const QuantizePlan& plan = summary.plan;
  std::vector<std::string> quantized;
  for (const TensorDecision& d : plan.decisions) {
    if (d.fate == Fate::kQuantize) quantized.push_back(d.module);
  }
  std::sort(quantized.begin(), quantized.end());
  EXPECT_EQ(quantized, c.quantized);
  EXPECT_EQ(summary.tensors_quantized, c.quantized.size());
  EXPECT_EQ(summary.tensors_copied, c.n_copied);
  for (const auto& [tensor, rule] : c.rules) {
    // A named copy: clang 14 cannot capture a structured binding.
    const std::string& name = tensor;
    const auto it = std::find_if(plan.decisions.begin(), plan.decisions.end(),
                                 [&](const TensorDecision& d) { return d.name == name; });
    ASSERT_NE(it, plan.decisions.end()) << tensor;
    EXPECT_EQ(it->rule, rule) << tensor;
  }

  // Every input tensor: copied byte for byte, or replaced by the section 4
  // tensors with their shapes.
  const QuantArgs& scheme = plan.options.groups.front().weights;
  std::set<std::string> expected_files{"config.json", "model.safetensors.index.json"};
  for (const fs::path& shard : input_shards(input)) {
    const std::string file = shard.filename().string();
    expected_files.insert(file);
    const SafetensorsFile in(shard, file);
    const SafetensorsFile outf(out / file, file);
    for (const TensorEntry& t : in.header().tensors) {
      const std::string module = module_of(t.name);
      if (std::binary_search(c.quantized.begin(), c.quantized.end(), module) &&
          t.name == module + ".weight") {
        const std::uint64_t rows = t.shape[0];
        const std::uint64_t cols = t.shape[1];
        const TensorEntry* packed = outf.header().find(module + ".weight_packed");
        const TensorEntry* scale = outf.header().find(module + ".weight_scale");
        const TensorEntry* shape = outf.header().find(module + ".weight_shape");
        ASSERT_TRUE(packed && scale && shape) << module;
        EXPECT_EQ(packed->shape,
                  (std::vector<std::uint64_t>{rows, packed_words_per_row(cols, scheme.num_bits)}));
        EXPECT_EQ(scale->shape,
                  (std::vector<std::uint64_t>{rows, cols / scheme.scale_cols(cols)}));
        EXPECT_EQ(scale->dtype, t.dtype);
        EXPECT_EQ(outf.header().find(t.name), nullptr);
      } else {
        EXPECT_EQ(read_tensor(out / file, t.name), read_tensor(shard, t.name)) << t.name;
        EXPECT_EQ(outf.header().find(t.name)->dtype, t.dtype) << t.name;
        EXPECT_EQ(outf.header().find(t.name)->shape, t.shape) << t.name;
      }
    }
  }

  // config.json: the input's (if any; a single file's directory's) plus
  // quantization_config; the other files of an input directory are copied
  // byte for byte.
  json config = read_json(out / "config.json");
  ASSERT_TRUE(config.contains("quantization_config"));
  config.erase("quantization_config");
  const fs::path config_dir = fs::is_directory(input) ? input : input.parent_path();
  if (fs::exists(config_dir / "config.json")) {
    EXPECT_EQ(config, read_json(config_dir / "config.json"));
  } else {
    EXPECT_EQ(config, json::object());
  }
  if (fs::is_directory(input)) {
    for (const auto& item : fs::directory_iterator(input)) {
      const std::string name = item.path().filename().string();
      if (!item.is_regular_file() || expected_files.contains(name)) continue;
      expected_files.insert(name);
      EXPECT_EQ(read_file(out / name), read_file(item.path())) << name;
    }
  }
  expected_files.insert(kManifestFileName);
  std::set<std::string> out_files;
  for (const auto& item : fs::directory_iterator(out)) {
    out_files.insert(item.path().filename().string());
  }
  EXPECT_EQ(out_files, expected_files);
}

// Test names print the case name, not the bytes of the struct.
void PrintTo(const RealCase& c, std::ostream* os) { *os << c.name; }

class RealFiles : public ::testing::TestWithParam<RealCase> {};

TEST_P(RealFiles, QuantizeOrFailClearly) {
  const RealCase& c = GetParam();
  const fs::path input = real_dir() / c.path;
  ASSERT_TRUE(fs::exists(input)) << input;
  TempDir tmp;
  const auto before = fs::is_directory(input)
                          ? snapshot_files(input)
                          : std::map<std::string, std::string>{{c.path, read_file(input)}};
  QuantizeOptions options = test_options(input, tmp / "out");
  if (c.adjust) c.adjust(options);
  if (c.succeeds) {
    const QuantizeSummary summary = quantize(options);
    verify_output(input, tmp / "out", summary, c);
  } else {
    try {
      quantize(options);
      ADD_FAILURE() << "quantize succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), c.kind) << e.what();
      expect_message(e.what(), c.fragments, c.absent);
    }
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
  const auto after = fs::is_directory(input)
                         ? snapshot_files(input)
                         : std::map<std::string, std::string>{{c.path, read_file(input)}};
  EXPECT_EQ(after, before) << "the input was modified";
}

INSTANTIATE_TEST_SUITE_P(Cases, RealFiles, ::testing::ValuesIn(real_cases()),
                         [](const ::testing::TestParamInfo<RealCase>& param) {
                           return param.param.name;
                         });

// Every directory and every .safetensors file of tests/real has a case.
TEST(RealFilesCoverage, EveryDirectoryAndFileHasACase) {
  std::set<std::string> covered;
  for (const RealCase& c : real_cases()) covered.insert(c.path);
  for (const auto& item : fs::recursive_directory_iterator(real_dir())) {
    const std::string rel = fs::relative(item.path(), real_dir()).string();
    if (item.is_directory() || item.path().extension() == ".safetensors") {
      EXPECT_TRUE(covered.contains(rel)) << rel << " has no case in test_real.cpp";
    }
  }
}

// The copy in tests/real is the inventoried one: every file has its size,
// and the reader sees exactly the inventoried header of every safetensors
// file (names, dtypes, shapes, offsets, header length, metadata).
TEST(RealFilesCoverage, ReaderAgreesWithInventory) {
  const json inventory = read_json(real_dir() / "INVENTORY.json");
  ASSERT_EQ(inventory.at("files").size(), 28u);
  for (const json& f : inventory.at("files")) {
    const std::string rel = f.at("file");
    SCOPED_TRACE(rel);
    const fs::path path = real_dir() / rel;
    ASSERT_TRUE(fs::exists(path));
    EXPECT_EQ(fs::file_size(path), f.at("size").get<std::uint64_t>());
    if (!f.contains("safetensors")) continue;
    const json& st = f.at("safetensors");
    const SafetensorsHeader h = read_header(path, rel);
    EXPECT_EQ(h.header_size, st.at("header_len").get<std::uint64_t>());
    EXPECT_EQ(h.tensors.size(), st.at("n_tensors").get<std::size_t>());
    if (st.at("metadata").is_object()) {
      EXPECT_EQ(json(h.metadata), st.at("metadata"));
    } else {
      EXPECT_TRUE(h.metadata.empty());
    }
    for (const json& t : st.at("tensors")) {
      const TensorEntry* e = h.find(t.at("name").get<std::string>());
      ASSERT_NE(e, nullptr) << t.at("name");
      EXPECT_EQ(dtype_tag(e->dtype), t.at("dtype").get<std::string>());
      EXPECT_EQ(e->shape, t.at("shape").get<std::vector<std::uint64_t>>());
      EXPECT_EQ(e->begin, t.at("data_offsets")[0].get<std::uint64_t>());
      EXPECT_EQ(e->end, t.at("data_offsets")[1].get<std::uint64_t>());
    }
  }
}

// "__metadata__": null, as MLX writes it, is no metadata; other non-object
// values are still refused.
TEST(RealFilesCoverage, NullMetadataIsNoMetadata) {
  const std::string header =
      R"({"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  const SafetensorsHeader h = parse_header(header, 8 + header.size() + 2, "x.safetensors");
  EXPECT_FALSE(h.has_metadata);
  EXPECT_TRUE(h.metadata.empty());
  EXPECT_EQ(h.tensors.size(), 1u);
  const std::string bad =
      R"({"__metadata__":"pt","a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  try {
    parse_header(bad, 8 + bad.size() + 2, "x.safetensors");
    FAIL() << "accepted a string __metadata__";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("__metadata__ is a JSON string"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ctquant::test
