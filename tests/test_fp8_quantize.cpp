// FP8 inputs end to end (section 6 of the format spec): hand-made block FP8
// and compressed-tensors float-quantized checkpoints quantized through the
// library and the command line, checked value by value against independent
// references, and one named case per way such an input can be bad.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/config.hpp"
#include "ctquant/format/dtype.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/source/fp8.hpp"
#include "ctquant/util/error.hpp"
#include "fp8_test_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ctquant::test;

void write_checkpoint(const fs::path& dir, const json& config,
                      const std::vector<FakeTensor>& tensors) {
  fs::create_directories(dir);
  test::write_file(dir / "config.json", config.dump(2));
  test::write_safetensors(dir / "model.safetensors", tensors);
}

QuantizeOptions options_for(const fs::path& in, const fs::path& out,
                            std::vector<std::string> ignore = {"lm_head"}) {
  QuantizeOptions o = default_quantize_options();
  o.input = in;
  o.output = out;
  o.plan.ignore = std::move(ignore);
  test::set_group_size(o.plan, 0);  // channel-wise: any in_features is accepted
  o.threads = 1;
  o.fsync = false;
  return o;
}

// ================= end to end: block FP8 =================

constexpr std::uint64_t kBh = 2, kBw = 3;

struct BlockModule {
  std::string module;
  std::uint64_t rows, cols;
  DType dtype = DType::kF8_E4M3;
  std::vector<std::uint8_t> codes;
  std::vector<float> grid;  // [ceil(rows/kBh), ceil(cols/kBw)]
  std::uint64_t grid_cols() const { return (cols + kBw - 1) / kBw; }
  std::uint64_t grid_rows() const { return (rows + kBh - 1) / kBh; }
};

BlockModule block_module(const std::string& module, std::uint64_t rows, std::uint64_t cols,
                         std::uint32_t seed, DType dtype = DType::kF8_E4M3) {
  BlockModule m{module, rows, cols, dtype, random_codes(dtype, rows * cols, seed), {}};
  m.grid = distinct_scales(m.grid_rows() * m.grid_cols(), 0.001f * static_cast<float>(seed));
  return m;
}

std::vector<FakeTensor> block_tensors(const std::vector<BlockModule>& modules) {
  std::vector<FakeTensor> t;
  t.push_back(test::random_weight("lm_head.weight", DType::kBF16, 8, 6, 1));
  t.push_back(FakeTensor{"model.norm.weight",
                         DType::kBF16,
                         {6},
                         test::float_bytes(DType::kBF16, std::vector<float>(6, 1.0f))});
  for (const auto& m : modules) {
    t.push_back(FakeTensor{m.module + ".weight", m.dtype, {m.rows, m.cols}, code_bytes(m.codes)});
    t.push_back(FakeTensor{m.module + ".weight_scale_inv",
                           DType::kF32,
                           {m.grid_rows(), m.grid_cols()},
                           test::float_bytes(DType::kF32, m.grid)});
  }
  return t;
}

std::vector<std::uint16_t> reference_of(const BlockModule& m) {
  return reference_dequantize(m.dtype, m.codes, m.rows, m.cols, m.grid, m.grid_cols(), kBh, kBw);
}

std::vector<std::byte> bf16_bytes(const std::vector<std::uint16_t>& bits) {
  return test::u16_bytes(bits);
}

// Quantizes a BF16 weight with the scalar reference kernel: what the
// packed outputs of a dequantized FP8 weight must hold.
struct RefQuantized {
  std::vector<std::byte> packed;
  std::vector<std::byte> scale;
};
RefQuantized reference_quantize(const QuantScheme& scheme, const std::vector<std::uint16_t>& bf16,
                                std::uint64_t rows, std::uint64_t cols) {
  const auto weight = bf16_bytes(bf16);
  const std::uint64_t words = packed_words_per_row(cols, scheme.num_bits);
  const std::uint64_t n_groups = cols / scheme.effective_group_size(cols);
  std::vector<std::uint32_t> packed(rows * words);
  RefQuantized r;
  r.scale.resize(rows * n_groups * 2);
  std::vector<std::int8_t> zp(rows * n_groups);
  KernelBlock block{DType::kBF16,  rows,           cols,     weight.data(),
                    packed.data(), r.scale.data(), zp.data()};
  EXPECT_FALSE(quantize_block_ref(scheme, block));
  r.packed.resize(packed.size() * 4);
  std::memcpy(r.packed.data(), packed.data(), r.packed.size());
  return r;
}

TEST(Fp8Quantize, BlockFp8PartialBlocksMatchReference) {
  TempDir dir;
  // up_proj: partial blocks on both axes; q_proj: square weight with
  // non-square blocks (grid [3, 2]); down_proj E5M2 and ignored.
  const std::vector<BlockModule> modules{
      block_module("model.layers.0.mlp.up_proj", 5, 7, 3),
      block_module("model.layers.0.self_attn.q_proj", 6, 6, 5),
      block_module("model.layers.0.mlp.down_proj", 7, 5, 9, DType::kF8_E5M2),
  };
  write_checkpoint(dir / "in", block_config(kBh, kBw), block_tensors(modules));

  // Several thread counts and chunk sizes (down to one row per job, so jobs
  // start inside a row block): the bytes must be the same.
  // The last run dequantizes each chunk one row at a time (bands).
  std::vector<std::string> outputs;
  for (const auto& [threads, chunk, band] :
       std::vector<std::tuple<unsigned, std::uint64_t, std::uint64_t>>{
           {1, 4u << 20, 256u << 10}, {3, 1, 256u << 10}, {2, 20, 256u << 10}, {1, 4u << 20, 1}}) {
    const fs::path out = dir / fmt::format("out-{}-{}-{}", threads, chunk, band);
    QuantizeOptions o = options_for(dir / "in", out, {"lm_head", "re:.*down_proj$"});
    o.threads = threads;
    o.chunk_bytes = chunk;
    o.fp8_band_bytes = band;
    const QuantizeSummary s = quantize(o);
    EXPECT_EQ(s.tensors_quantized, 2u);
    EXPECT_EQ(s.tensors_dequantized, 1u);
    EXPECT_EQ(s.tensors_dropped, 3u);
    EXPECT_EQ(s.tensors_copied, 2u);
    outputs.push_back(test::read_file(out / "model.safetensors"));
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], outputs[2]);
  EXPECT_EQ(outputs[0], outputs[3]);

  const fs::path model = dir / "out-1-4194304-262144" / "model.safetensors";
  const BlockModule& down = modules[2];
  EXPECT_EQ(test::read_tensor(model, down.module + ".weight"), bf16_bytes(reference_of(down)));
  QuantScheme channel = QuantScheme{};
  channel.group_size = 0;
  for (const BlockModule* m : {&modules[0], &modules[1]}) {
    const RefQuantized want = reference_quantize(channel, reference_of(*m), m->rows, m->cols);
    EXPECT_EQ(test::read_tensor(model, m->module + ".weight_packed"), want.packed) << m->module;
    EXPECT_EQ(test::read_tensor(model, m->module + ".weight_scale"), want.scale) << m->module;
  }
  SafetensorsFile f(model, "model.safetensors");
  for (const TensorEntry& t : f.header().tensors) {
    EXPECT_FALSE(is_fp8(t.dtype)) << t.name;
    EXPECT_FALSE(t.name.ends_with("weight_scale_inv")) << t.name;
    if (t.name.ends_with(".weight_scale")) {
      EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
    }
  }
  EXPECT_EQ(f.header().find(down.module + ".weight")->dtype, DType::kBF16);

  // config.json: the new block only, nothing of the old one left.
  const json config = json::parse(test::read_file(dir / "out-1-4194304-262144" / "config.json"));
  EXPECT_EQ(config["quantization_config"],
            test::single_group_config(test::int_group(4, true, 0), {"lm_head", "re:.*down_proj$"}));
  EXPECT_EQ(config["model_type"], "llama");
}

// A sharded checkpoint whose FP8 weight and its scale are in different
// shards: the scale is read from its own shard, and the output index lists
// exactly the output tensors.
TEST(Fp8Quantize, ScaleInAnotherShardAndIndexListsOutputsOnly) {
  TempDir dir;
  const BlockModule up = block_module("m.up_proj", 5, 7, 3);
  const BlockModule down = block_module("m.down_proj", 4, 6, 4);
  std::vector<FakeTensor> all = block_tensors({up, down});
  // Shard 1: lm_head, norm, up_proj.weight, down_proj.weight_scale_inv.
  // Shard 2: up_proj.weight_scale_inv, down_proj.weight, an input_scale.
  const std::vector<FakeTensor> shard1{all[0], all[1], all[2], all[5]};
  const std::vector<FakeTensor> shard2{
      all[3], all[4],
      FakeTensor{"m.down_proj.input_scale", DType::kF32, {}, float_bytes(DType::kF32, {1.0f})}};
  fs::create_directories(dir / "in");
  write_file(dir / "in" / "config.json", block_config(kBh, kBw).dump());
  write_safetensors(dir / "in" / "model-00001-of-00002.safetensors", shard1);
  write_safetensors(dir / "in" / "model-00002-of-00002.safetensors", shard2);
  json weight_map = json::object();
  for (const auto& t : shard1) weight_map[t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : shard2) weight_map[t.name] = "model-00002-of-00002.safetensors";
  write_file(dir / "in" / "model.safetensors.index.json",
             json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());

  quantize(options_for(dir / "in", dir / "out", {"lm_head", "m.down_proj"}));
  const fs::path out = dir / "out";
  EXPECT_EQ(read_tensor(out / "model-00002-of-00002.safetensors", "m.down_proj.weight"),
            u16_bytes(reference_of(down)));
  QuantScheme channel;
  channel.group_size = 0;
  const RefQuantized want = reference_quantize(channel, reference_of(up), up.rows, up.cols);
  EXPECT_EQ(read_tensor(out / "model-00001-of-00002.safetensors", "m.up_proj.weight_packed"),
            want.packed);

  const json index = json::parse(read_file(out / "model.safetensors.index.json"));
  std::uint64_t total = 0;
  json expected_map = json::object();
  for (const char* shard :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    SafetensorsFile f(out / shard, shard);
    for (const TensorEntry& t : f.header().tensors) {
      expected_map[t.name] = shard;
      total += t.byte_size();
    }
  }
  EXPECT_EQ(index["weight_map"], expected_map);
  EXPECT_EQ(index["metadata"]["total_size"], total);
  std::vector<std::string> names;
  for (const auto& [name, shard] : expected_map.items()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"lm_head.weight", "m.down_proj.weight",
                                             "m.up_proj.weight_packed", "m.up_proj.weight_scale",
                                             "m.up_proj.weight_shape", "model.norm.weight"}));
}

TEST(Fp8Plan, FatesOfBlockFp8Tensors) {
  TempDir dir;
  const std::vector<BlockModule> modules{block_module("a.q_proj", 4, 6, 3),
                                         block_module("a.v_proj", 4, 6, 4)};
  std::vector<FakeTensor> tensors = block_tensors(modules);
  tensors.push_back(
      FakeTensor{"a.q_proj.input_scale", DType::kF32, {}, test::float_bytes(DType::kF32, {1.0f})});
  write_checkpoint(dir / "in", block_config(kBh, kBw), tensors);
  PlanOptions p;
  test::set_group_size(p, 0);
  p.ignore = {"lm_head", "re:.*v_proj$"};
  const QuantizePlan plan = make_plan(open_checkpoint(dir / "in"), p);
  std::map<std::string, Fate> fates;
  for (const auto& d : plan.decisions) fates[d.name] = d.fate;
  EXPECT_EQ(fates["a.q_proj.weight"], Fate::kQuantize);
  EXPECT_EQ(fates["a.v_proj.weight"], Fate::kDequantize);
  EXPECT_EQ(fates["a.q_proj.weight_scale_inv"], Fate::kDrop);
  EXPECT_EQ(fates["a.q_proj.input_scale"], Fate::kDrop);
  EXPECT_EQ(fates["lm_head.weight"], Fate::kCopy);
  EXPECT_STREQ(fate_name(Fate::kDequantize), "dequantize");
  EXPECT_STREQ(fate_name(Fate::kDrop), "drop");
  EXPECT_EQ(plan.n_dropped, 3u);
  EXPECT_EQ(plan.n_dequantized, 1u);
  for (const auto& d : plan.decisions) {
    if (d.name == "a.q_proj.weight") {
      ASSERT_TRUE(d.fp8);
      EXPECT_EQ(d.rule, "2-D F8_E4M3 (dequantized to BF16) .weight matching target 'Linear'");
    }
    if (d.name == "a.v_proj.weight") {
      EXPECT_EQ(d.rule, "ignored by 're:.*v_proj$'; written as a BF16 .weight");
    }
  }
  // v_proj counts as a module the ignore entry affected.
  EXPECT_EQ(plan.ignore_matches[1], std::vector<std::string>{"a.v_proj"});
}

// ---- named bad inputs of a block FP8 checkpoint ----

enum class BlockCorruption {
  kGridWrongShape,
  kGridTransposed,
  kGridTransposedSquareWeight,
  kMissingScaleInv,
  kScaleInvWithoutWeight,
  kScaleInvBesideBf16Weight,
  kNanCode7F,
  kNanCodeFF,
  kE5M2Infinity,
  kScaleOverflow,
  kThreeDExpert,
  kFnuzWeight,
  kE8M0Tensor,
  kFp8Bias,
  kSeveralProblems,
};

struct BlockCorruptionCase {
  const char* name;
  BlockCorruption corruption;
  std::vector<std::string> fragments;
};

class Fp8BadBlockInput : public testing::TestWithParam<BlockCorruptionCase> {};

// Applies one corruption to the tensors of a valid block FP8 checkpoint
// whose modules are up_proj [5, 10] (grid [3, 4]) and q_proj [6, 6] (grid
// [3, 2]), at indexes 2..5 of block_tensors().
void corrupt(BlockCorruption c, std::vector<FakeTensor>& t) {
  FakeTensor& up = t[2];
  FakeTensor& up_scale = t[3];
  FakeTensor& q = t[4];
  FakeTensor& q_scale = t[5];
  switch (c) {
    case BlockCorruption::kGridWrongShape:
      up_scale.shape = {3, 2};
      up_scale.data.resize(3 * 2 * 4);
      break;
    case BlockCorruption::kGridTransposed:
      up_scale.shape = {4, 3};
      break;
    case BlockCorruption::kGridTransposedSquareWeight:
      q_scale.shape = {2, 3};
      break;
    case BlockCorruption::kMissingScaleInv:
      t.erase(t.begin() + 3);
      break;
    case BlockCorruption::kScaleInvWithoutWeight:
      up_scale.name = "model.layers.0.mlp.gate_proj.weight_scale_inv";
      t.push_back(FakeTensor{
          "model.layers.0.mlp.up_proj.weight_scale_inv", DType::kF32, {3, 4}, up_scale.data});
      break;
    case BlockCorruption::kScaleInvBesideBf16Weight:
      t.push_back(
          FakeTensor{"lm_head.weight_scale_inv", DType::kF32, {4, 2}, std::vector<std::byte>(32)});
      break;
    case BlockCorruption::kNanCode7F:
      up.data[2 * 10 + 4] = std::byte{0x7F};  // row 2, column 4
      break;
    case BlockCorruption::kNanCodeFF:
      q.data[5 * 6 + 1] = std::byte{0xFF};  // row 5, column 1
      break;
    case BlockCorruption::kE5M2Infinity:
      q.dtype = DType::kF8_E5M2;
      for (auto& b : q.data) b = std::byte{0x3C};  // 1.0
      q.data[3 * 6 + 2] = std::byte{0xFC};         // row 3, column 2: -inf
      break;
    case BlockCorruption::kScaleOverflow: {
      for (auto& b : up.data) b = std::byte{0x38};  // 1.0
      up.data[4 * 10 + 9] = std::byte{0x7E};        // 448 in the corner block
      const auto huge = test::float_bytes(DType::kF32, {0x1p126f});
      std::memcpy(up_scale.data.data() + 11 * 4, huge.data(), 4);  // grid [2, 3]
      break;
    }
    case BlockCorruption::kThreeDExpert:
      up.shape = {1, 5, 10};
      break;
    case BlockCorruption::kFnuzWeight:
      up.dtype = DType::kF8_E4M3FNUZ;
      break;
    case BlockCorruption::kE8M0Tensor:
      t.push_back(FakeTensor{"model.layers.0.mlp.up_proj.weight_block_exponent",
                             DType::kF8_E8M0,
                             {2},
                             code_bytes({0x7F, 0x80})});
      break;
    case BlockCorruption::kFp8Bias:
      t.push_back(FakeTensor{"model.layers.0.mlp.up_proj.bias",
                             DType::kF8_E4M3,
                             {5},
                             code_bytes({0x38, 0x38, 0x38, 0x38, 0x38})});
      break;
    case BlockCorruption::kSeveralProblems:
      up_scale.shape = {3, 2};
      up_scale.data.resize(3 * 2 * 4);
      t.erase(t.begin() + 5);  // q_proj's scale
      break;
  }
}

TEST_P(Fp8BadBlockInput, RefusedWithMessageAndNoOutput) {
  TempDir dir;
  const std::vector<BlockModule> modules{block_module("model.layers.0.mlp.up_proj", 5, 10, 3),
                                         block_module("model.layers.0.self_attn.q_proj", 6, 6, 5)};
  std::vector<FakeTensor> tensors = block_tensors(modules);
  corrupt(GetParam().corruption, tensors);
  write_checkpoint(dir / "in", block_config(kBh, kBw), tensors);
  expect_bad_input([&] { quantize(options_for(dir / "in", dir / "out")); }, GetParam().fragments);
  EXPECT_FALSE(fs::exists(dir / "out"));
  // Ignoring the module does not help: the dequantization still runs (with
  // nothing left to quantize, lint L9 would stop the run first without
  // allow_unloadable).
  expect_bad_input(
      [&] {
        QuantizeOptions o = options_for(dir / "in", dir / "out2", {"lm_head", "re:.*proj$"});
        o.allow_unloadable = true;
        quantize(o);
      },
      GetParam().fragments);
  EXPECT_FALSE(fs::exists(dir / "out2"));
}

INSTANTIATE_TEST_SUITE_P(
    Corruptions, Fp8BadBlockInput,
    testing::Values(
        BlockCorruptionCase{"GridWrongShape",
                            BlockCorruption::kGridWrongShape,
                            {"model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight'",
                             "scale 'model.layers.0.mlp.up_proj.weight_scale_inv' (F32 [3, 2]",
                             "expected [3, 4]", "weight_block_size"}},
        BlockCorruptionCase{"GridTransposed",
                            BlockCorruption::kGridTransposed,
                            {"tensor 'model.layers.0.mlp.up_proj.weight'",
                             "scale has shape [4, 3], expected [3, 4]"}},
        BlockCorruptionCase{"GridTransposedSquareWeight",
                            BlockCorruption::kGridTransposedSquareWeight,
                            {"[6, 6]", "scale has shape [2, 3], expected [3, 2] (blocks of 2 x 3"}},
        BlockCorruptionCase{"MissingScaleInv",
                            BlockCorruption::kMissingScaleInv,
                            {"tensor 'model.layers.0.mlp.up_proj.weight'",
                             "has no scale 'model.layers.0.mlp.up_proj.weight_scale_inv'"}},
        BlockCorruptionCase{"ScaleInvWithoutWeight",
                            BlockCorruption::kScaleInvWithoutWeight,
                            {"tensor 'model.layers.0.mlp.gate_proj.weight_scale_inv'",
                             "weight_scale_inv without its weight",
                             "no tensor 'model.layers.0.mlp.gate_proj.weight'"}},
        BlockCorruptionCase{"ScaleInvBesideBf16Weight",
                            BlockCorruption::kScaleInvBesideBf16Weight,
                            {"tensor 'lm_head.weight_scale_inv'", "beside a BF16 weight"}},
        BlockCorruptionCase{"NanCode7F",
                            BlockCorruption::kNanCode7F,
                            {"model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight'",
                             "element [2, 4]", "code 0x7F", "nan in F8_E4M3"}},
        BlockCorruptionCase{"NanCodeFF",
                            BlockCorruption::kNanCodeFF,
                            {"tensor 'model.layers.0.self_attn.q_proj.weight'", "element [5, 1]",
                             "code 0xFF", "nan"}},
        BlockCorruptionCase{"E5M2Infinity",
                            BlockCorruption::kE5M2Infinity,
                            {"tensor 'model.layers.0.self_attn.q_proj.weight'", "element [3, 2]",
                             "code 0xFC", "-inf in F8_E5M2"}},
        BlockCorruptionCase{
            "ScaleOverflow",
            BlockCorruption::kScaleOverflow,
            {"element [4, 9]", "code 0x7E (448) times scale",
             "'model.layers.0.mlp.up_proj.weight_scale_inv' [2, 3]", "inf in BF16"}},
        BlockCorruptionCase{"ThreeDExpert",
                            BlockCorruption::kThreeDExpert,
                            {"tensor 'model.layers.0.mlp.up_proj.weight'",
                             "3-D FP8 expert tensor [1, 5, 10]", "splits stacked experts only"}},
        BlockCorruptionCase{"FnuzWeight",
                            BlockCorruption::kFnuzWeight,
                            {"dtype F8_E4M3FNUZ is not dequantized", "must not carry F8 tensors"}},
        BlockCorruptionCase{"E8M0Tensor",
                            BlockCorruption::kE8M0Tensor,
                            {"'model.layers.0.mlp.up_proj.weight_block_exponent'",
                             "dtype F8_E8M0 is not dequantized"}},
        BlockCorruptionCase{
            "Fp8Bias",
            BlockCorruption::kFp8Bias,
            {"'model.layers.0.mlp.up_proj.bias'", "F8_E4M3 tensor that is not a module's .weight"}},
        BlockCorruptionCase{"SeveralProblems",
                            BlockCorruption::kSeveralProblems,
                            {"up_proj.weight_scale_inv' (F32 [3, 2]",
                             "has no scale 'model.layers.0.self_attn.q_proj.weight_scale_inv'",
                             "2 tensor(s) cannot be converted"}}),
    [](const testing::TestParamInfo<BlockCorruptionCase>& param_info) {
      return param_info.param.name;
    });

TEST(Fp8BadInput, F8WeightWithoutQuantizationConfig) {
  TempDir dir;
  std::vector<FakeTensor> tensors = block_tensors({block_module("a.up_proj", 4, 6, 3)});
  write_checkpoint(dir / "in", json{{"model_type", "llama"}}, tensors);
  expect_bad_input([&] { quantize(options_for(dir / "in", dir / "out")); },
                   {"tensor 'a.up_proj.weight'",
                    "F8_E4M3 weight, but config.json has no FP8 "
                    "quantization_config"});
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// ================= end to end: compressed-tensors float-quantized =================

TEST(Fp8Quantize, CompressedTensorsScaleShapesAndDtypes) {
  struct Variant {
    const char* strategy;
    DType scale_dtype;
    std::vector<std::uint64_t> scale_shape;
  };
  for (const Variant& v : std::vector<Variant>{{"channel", DType::kBF16, {4, 1}},
                                               {"channel", DType::kF32, {4}},
                                               {"tensor", DType::kF32, {1}},
                                               {"tensor", DType::kBF16, {}}}) {
    SCOPED_TRACE(
        fmt::format("{} {} {}", v.strategy, dtype_tag(v.scale_dtype), shape_string(v.scale_shape)));
    TempDir dir;
    const std::uint64_t rows = 4, cols = 6;
    const auto codes = random_codes(DType::kF8_E4M3, rows * cols, 11);
    const std::uint64_t n_scales = v.scale_shape.empty() ? 1 : v.scale_shape[0];
    // Scales exactly representable in BF16 so the same values serve both dtypes.
    std::vector<float> scales;
    for (std::uint64_t i = 0; i < n_scales; ++i)
      scales.push_back(0.0078125f * static_cast<float>(i + 3));
    std::vector<FakeTensor> t{
        test::random_weight("lm_head.weight", DType::kBF16, 8, 6, 1),
        FakeTensor{"m.up_proj.weight", DType::kF8_E4M3, {rows, cols}, code_bytes(codes)},
        FakeTensor{"m.up_proj.weight_scale", v.scale_dtype, v.scale_shape,
                   test::float_bytes(v.scale_dtype, scales)},
        FakeTensor{
            "m.up_proj.input_scale", DType::kF32, {1}, test::float_bytes(DType::kF32, {0.5f})},
        FakeTensor{"m.attn.k_scale", DType::kF32, {}, test::float_bytes(DType::kF32, {0.5f})},
        FakeTensor{"m.attn.v_scale", DType::kF32, {}, test::float_bytes(DType::kF32, {0.5f})},
    };
    write_checkpoint(dir / "in", ct_config(v.strategy), t);
    // Nothing is quantized (lint L9): written under allow_unloadable.
    QuantizeOptions o = options_for(dir / "in", dir / "out", {"lm_head", "m.up_proj"});
    o.allow_unloadable = true;
    const QuantizeSummary s = quantize(o);
    EXPECT_EQ(s.tensors_dequantized, 1u);
    EXPECT_EQ(s.tensors_dropped, 4u);
    EXPECT_EQ(s.tensors_copied, 1u);

    std::vector<std::uint16_t> want(rows * cols);
    for (std::uint64_t i = 0; i < rows; ++i) {
      for (std::uint64_t j = 0; j < cols; ++j) {
        const float scale = scales[n_scales == 1 ? 0 : i];
        want[i * cols + j] = float_to_bf16(e4m3_reference(codes[i * cols + j]) * scale);
      }
    }
    const fs::path model = dir / "out" / "model.safetensors";
    EXPECT_EQ(test::read_tensor(model, "m.up_proj.weight"), bf16_bytes(want));
    SafetensorsFile f(model, "model.safetensors");
    std::vector<std::string> names;
    for (const TensorEntry& e : f.header().tensors) names.push_back(e.name);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"lm_head.weight", "m.up_proj.weight"}));
    const json config = json::parse(test::read_file(dir / "out" / "config.json"));
    // Nothing quantized: the group is not written (model_free_ptq writes it
    // with format null), the top level is "dense" (schemes.md 9.2).
    PlanOptions none;
    none.groups = {test::int_group(4, true, 0)};
    none.ignore = {"lm_head", "m.up_proj"};
    EXPECT_EQ(config["quantization_config"], plan_quantization_config(none, {0}));
    EXPECT_EQ(config["quantization_config"]["format"], "dense");
    EXPECT_TRUE(config["quantization_config"]["config_groups"].empty());
  }
}

TEST(Fp8Quantize, CompressedTensorsQuantizedModuleHasBf16Scales) {
  TempDir dir;
  const std::uint64_t rows = 3, cols = 8;
  const auto codes = random_codes(DType::kF8_E4M3, rows * cols, 13);
  const std::vector<float> scales{0.015625f, 0.03125f, 0.0234375f};
  write_checkpoint(dir / "in", ct_config("channel"),
                   {FakeTensor{"m.o_proj.weight", DType::kF8_E4M3, {rows, cols}, code_bytes(codes)},
                    FakeTensor{"m.o_proj.weight_scale",
                               DType::kF32,
                               {rows, 1},
                               test::float_bytes(DType::kF32, scales)}});
  quantize(options_for(dir / "in", dir / "out"));
  std::vector<std::uint16_t> bf16(rows * cols);
  for (std::uint64_t i = 0; i < rows * cols; ++i) {
    bf16[i] = float_to_bf16(e4m3_reference(codes[i]) * scales[i / cols]);
  }
  QuantScheme channel;
  channel.group_size = 0;
  const RefQuantized want = reference_quantize(channel, bf16, rows, cols);
  const fs::path model = dir / "out" / "model.safetensors";
  EXPECT_EQ(test::read_tensor(model, "m.o_proj.weight_packed"), want.packed);
  EXPECT_EQ(test::read_tensor(model, "m.o_proj.weight_scale"), want.scale);
  SafetensorsFile f(model, "model.safetensors");
  EXPECT_EQ(f.header().find("m.o_proj.weight_scale")->dtype, DType::kBF16);
}

enum class CtCorruption {
  kScaleWrongShape,
  kScaleF16,
  kScaleMissing,
  kScaleWithoutWeight,
  kScaleBesideBf16Weight,
  kInputIgnoredModuleIsFp8,
};

struct CtCorruptionCase {
  const char* name;
  CtCorruption corruption;
  std::vector<std::string> fragments;
};

class Fp8BadCompressedTensorsInput : public testing::TestWithParam<CtCorruptionCase> {};

TEST_P(Fp8BadCompressedTensorsInput, RefusedWithMessageAndNoOutput) {
  TempDir dir;
  const auto codes = random_codes(DType::kF8_E4M3, 4 * 6, 17);
  std::vector<FakeTensor> t{
      test::random_weight("lm_head.weight", DType::kBF16, 8, 6, 1),
      FakeTensor{"m.up_proj.weight", DType::kF8_E4M3, {4, 6}, code_bytes(codes)},
      FakeTensor{"m.up_proj.weight_scale",
                 DType::kBF16,
                 {4, 1},
                 test::float_bytes(DType::kBF16, {0.5f, 0.25f, 1.0f, 2.0f})},
  };
  switch (GetParam().corruption) {
    case CtCorruption::kScaleWrongShape:
      t[2].shape = {2, 2};
      break;
    case CtCorruption::kScaleF16:
      t[2].dtype = DType::kF16;
      break;
    case CtCorruption::kScaleMissing:
      t.pop_back();
      break;
    case CtCorruption::kScaleWithoutWeight:
      t[2].name = "m.down_proj.weight_scale";
      t.push_back(FakeTensor{"m.up_proj.weight_scale", DType::kBF16, {4, 1}, t[2].data});
      break;
    case CtCorruption::kScaleBesideBf16Weight:
      t.push_back(
          FakeTensor{"lm_head.weight_scale", DType::kBF16, {8, 1}, std::vector<std::byte>(16)});
      break;
    case CtCorruption::kInputIgnoredModuleIsFp8:
      t[1].name = "lm_head.weight";
      t[2].name = "lm_head.weight_scale";
      t[0].name = "m.up_proj.weight";
      break;
  }
  write_checkpoint(dir / "in", ct_config("channel"), t);
  expect_bad_input([&] { quantize(options_for(dir / "in", dir / "out", {"re:.*"})); },
                   GetParam().fragments);
  EXPECT_FALSE(fs::exists(dir / "out"));
}

INSTANTIATE_TEST_SUITE_P(
    Corruptions, Fp8BadCompressedTensorsInput,
    testing::Values(
        CtCorruptionCase{
            "ScaleWrongShape",
            CtCorruption::kScaleWrongShape,
            {"tensor 'm.up_proj.weight'", "scale has shape [2, 2]", "expected [4, 1] or [4]"}},
        CtCorruptionCase{"ScaleF16",
                         CtCorruption::kScaleF16,
                         {"tensor 'm.up_proj.weight'", "scale dtype is F16, expected F32 or BF16"}},
        CtCorruptionCase{"ScaleMissing",
                         CtCorruption::kScaleMissing,
                         {"tensor 'm.up_proj.weight'", "has no scale 'm.up_proj.weight_scale'"}},
        CtCorruptionCase{"ScaleWithoutWeight",
                         CtCorruption::kScaleWithoutWeight,
                         {"tensor 'm.down_proj.weight_scale'", "weight_scale without its weight"}},
        CtCorruptionCase{
            "ScaleBesideBf16Weight",
            CtCorruption::kScaleBesideBf16Weight,
            {"tensor 'lm_head.weight_scale'", "beside a BF16 weight 'lm_head.weight'"}},
        CtCorruptionCase{"InputIgnoredModuleIsFp8",
                         CtCorruption::kInputIgnoredModuleIsFp8,
                         {"tensor 'lm_head.weight'",
                          "config.json quantization_config.ignore entry 'lm_head' says module "
                          "'lm_head' was never quantized, but its weight is F8_E4M3"}}),
    [](const testing::TestParamInfo<CtCorruptionCase>& param_info) {
      return param_info.param.name;
    });

// ================= command line =================

TEST(Fp8Cli, RefusesPackQuantizedCheckpoint) {
  TempDir dir;
  json config = ct_config("group");
  config["quantization_config"]["format"] = "pack-quantized";
  write_checkpoint(dir / "in", config,
                   {test::random_weight("m.up_proj.weight", DType::kBF16, 4, 128, 3)});
  const auto r = test::run_ctquant({"quantize", (dir / "in").string(), (dir / "out").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("config.json: quantization_config has quant_method \"compressed-tensors\" "
                       "with format \"pack-quantized\": the checkpoint is already pack-quantized"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

}  // namespace
}  // namespace ctquant
