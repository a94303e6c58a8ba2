// verify --against-source with FP8 sources (section 6 of the format spec):
// the two FP8 golden cases against their inputs, then copies of them with
// one thing changed, each found where it was made: a code of a packed module
// made from FP8 rows, a byte of an FP8 weight written as BF16, FP8 scales and
// activation parameters left in OUTPUT, a source value that dequantizes to
// NaN, and the input kinds quantize does not convert. Hand-made inputs cover
// the scale layouts the golden cases lack.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "fake_checkpoint.hpp"
#include "fp8_test_support.hpp"
#include "test_support.hpp"
#include "verify_test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::describe;
using test::without_fp8_block_qkv;
using test::golden;
using test::GoldenCopy;
using test::kMaxRelFrobenius4Bit;
using test::of_kind;
using nlohmann::json;

// A chunk smaller than one row: every row chunk is a single row, so each
// FP8 scale grid row is read again for every weight row it covers.
constexpr std::uint64_t kOneRowChunk = 1;

const ModuleCheck* find_module(const VerifyReport& r, const std::string& module) {
  const auto it = std::find_if(r.modules.begin(), r.modules.end(),
                               [&](const ModuleCheck& m) { return m.module == module; });
  return it == r.modules.end() ? nullptr : &*it;
}


// Appends a tensor to a safetensors file and, when the directory has an
// index, lists it there and adds its bytes to total_size.
void add_tensor(const fs::path& file, const test::FakeTensor& tensor) {
  std::vector<test::FakeTensor> all;
  {
    const SafetensorsFile f(file, file.filename().string());
    for (const TensorEntry& e : f.header().tensors) {
      std::vector<std::byte> bytes(e.byte_size());
      f.read(e.begin, bytes);
      all.push_back(test::FakeTensor{e.name, e.dtype, e.shape, std::move(bytes)});
    }
  }
  all.push_back(tensor);
  test::write_safetensors(file, all);
  const fs::path index = file.parent_path() / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json value = test::read_json(index);
    value["weight_map"][tensor.name] = file.filename().string();
    value["metadata"]["total_size"] =
        value["metadata"]["total_size"].get<std::uint64_t>() + tensor.data.size();
    test::write_json(index, value);
  }
}

// The tensor `name` of a checkpoint directory, whichever shard holds it.
test::FakeTensor tensor_of(const fs::path& dir, const std::string& name) {
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() != ".safetensors") continue;
    const SafetensorsFile f(item.path(), item.path().filename().string());
    if (const TensorEntry* e = f.header().find(name)) {
      std::vector<std::byte> bytes(e->byte_size());
      f.read(e->begin, bytes);
      return test::FakeTensor{e->name, e->dtype, e->shape, std::move(bytes)};
    }
  }
  throw std::runtime_error("no tensor " + name + " in " + dir.string());
}

std::size_t packed_modules_in(const fs::path& dir) {
  std::size_t packed = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() != ".safetensors") continue;
    const SafetensorsFile f(item.path(), item.path().filename().string());
    for (const TensorEntry& t : f.header().tensors) {
      if (t.name.ends_with(".weight_packed")) ++packed;
    }
  }
  return packed;
}

// ---- the golden cases ----

struct Fp8Case {
  const char* name;
  const char* input_quantization;
  std::size_t modules;      // packed modules in expected/
  std::size_t dequantized;  // FP8 weights written as BF16 .weight
  std::size_t copied;       // tensors copied unchanged
};

constexpr Fp8Case kFp8Cases[] = {
    // fp8-block ignores v_proj and down_proj: 4 FP8 weights written as BF16.
    {"fp8-block", "block FP8, weight_block_size [128, 128]", 10, 4, 7},
    {"fp8-ct-channel", "compressed-tensors float-quantized FP8 (strategy channel)", 7, 0, 5},
};

TEST(VerifyAgainstFp8Source, GoldenCasesPass) {
  for (const Fp8Case& fc : kFp8Cases) {
    for (const std::uint64_t chunk : {VerifyOptions{}.chunk_bytes, kOneRowChunk}) {
      SCOPED_TRACE(std::string(fc.name) + ", chunk " + std::to_string(chunk));
      VerifyOptions options;
      options.chunk_bytes = chunk;
      const fs::path expected = golden(fc.name) / "expected";
      const VerifyReport r = verify_against_source(expected, golden(fc.name) / "input", options);
      EXPECT_TRUE(without_fp8_block_qkv(r).empty()) << describe(r);
      // fp8-block's ignore list splits q/k/v in both layers: vLLM refuses them.
      EXPECT_EQ(r.differences.size(), std::string(fc.name) == "fp8-block" ? 2u : 0u)
          << describe(r);
      EXPECT_TRUE(r.notes.empty()) << describe(r);
      EXPECT_EQ(r.input_quantization, fc.input_quantization);
      EXPECT_EQ(r.tensors_compared, fc.dequantized + fc.copied);
      EXPECT_EQ(r.tensors_identical, r.tensors_compared);
      ASSERT_EQ(r.modules.size(), fc.modules);
      EXPECT_EQ(packed_modules_in(expected), fc.modules);
      for (const ModuleCheck& m : r.modules) {
        EXPECT_TRUE(m.fp8_source) << m.module;
        EXPECT_EQ(m.groups_mismatched, 0u) << m.module;
        EXPECT_EQ(m.groups, m.rows * (m.cols / 128)) << m.module;
        EXPECT_GT(m.rel_frobenius, 0.0) << m.module;
        EXPECT_LT(m.rel_frobenius, kMaxRelFrobenius4Bit) << m.module;
        EXPECT_GT(m.max_abs_error, 0.0) << m.module;
      }
    }
  }
}

TEST(VerifyAgainstFp8Source, CommandLineReportsTheSourceKind) {
  const fs::path dir = golden("fp8-block");
  const auto r = test::run_ctquant(
      {"verify", (dir / "expected").string(), (dir / "input").string(), "--against-source"});
  // Exit 3: the fixture's split q/k/v (its ignore list) is not loadable.
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.out, "INPUT: block FP8, weight_block_size [128, 128]")) << r.out;
  EXPECT_TRUE(contains(r.out, "loadability  model-00001-of-00002.safetensors: "
                              "model.layers.0.self_attn.k_proj.weight_packed: vLLM refuses to "
                              "build 'model.layers.0.self_attn.qkv_proj'"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "result: DIFFERENT (2 differences")) << r.out;

  const auto j = test::run_ctquant({"verify", (dir / "expected").string(), (dir / "input").string(),
                                    "--against-source", "--json"});
  EXPECT_EQ(j.exit_code, 3) << j.err;
  const json report = json::parse(j.out);
  EXPECT_EQ(report["input_quantization"], "block FP8, weight_block_size [128, 128]");
  ASSERT_EQ(report["modules"].size(), 10u);
  EXPECT_EQ(report["modules"][0]["fp8_source"], true);
  EXPECT_EQ(report["modules"][0]["first_column"], nullptr);
}

// Hand-made inputs for the layouts the golden cases do not have: block FP8
// with partial edge blocks and E5M2 codes, and compressed-tensors per-tensor
// scales of shape [] in BF16 beside a static input_scale. Each has one module
// quantized and one ignored (written as BF16).
TEST(VerifyAgainstFp8Source, HandMadeLayoutsPass) {
  struct Layout {
    std::string name;
    json config;
    DType code_dtype;
    DType scale_dtype;
    std::vector<std::uint64_t> up_scale_shape;    // up_proj [5, 256]
    std::vector<std::uint64_t> down_scale_shape;  // down_proj [4, 128]
    std::vector<test::FakeTensor> extra;
  };
  const std::vector<Layout> layouts = {
      {"block 2 x 3, E5M2",
       test::block_config(2, 3),
       DType::kF8_E5M2,
       DType::kF32,
       {3, 86},
       {2, 43},
       {}},
      {"compressed-tensors tensor",
       test::ct_config("tensor"),
       DType::kF8_E4M3,
       DType::kBF16,
       {},
       {},
       {{"model.layers.0.mlp.up_proj.input_scale",
         DType::kF32,
         {1},
         test::float_bytes(DType::kF32, {0.25f})}}},
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    test::TempDir dir;
    const std::string scale_param = l.config["quantization_config"]["quant_method"] == "fp8"
                                        ? "weight_scale_inv"
                                        : "weight_scale";
    std::vector<test::FakeTensor> tensors = {
        test::random_weight("lm_head.weight", DType::kBF16, 8, 128, 1)};
    std::uint32_t seed = 2;
    for (const auto& [module, rows, cols, scale_shape] : std::vector<
             std::tuple<std::string, std::uint64_t, std::uint64_t, std::vector<std::uint64_t>>>{
             {"model.layers.0.mlp.up_proj", 5, 256, l.up_scale_shape},
             {"model.layers.0.mlp.down_proj", 4, 128, l.down_scale_shape}}) {
      tensors.push_back({module + ".weight",
                         l.code_dtype,
                         {rows, cols},
                         test::code_bytes(test::random_codes(l.code_dtype, rows * cols, seed))});
      const std::size_t n_scales = test::fake_numel(scale_shape);
      tensors.push_back(
          {module + "." + scale_param, l.scale_dtype, scale_shape,
           test::float_bytes(l.scale_dtype,
                             test::distinct_scales(n_scales, 0.001f * static_cast<float>(seed)))});
      ++seed;
    }
    tensors.insert(tensors.end(), l.extra.begin(), l.extra.end());
    test::write_checkpoint(dir / "in", tensors, l.config);
    QuantizeOptions o = test::test_options(dir / "in", dir / "out");
    o.plan.ignore = {"lm_head", "re:.*down_proj$"};
    o.allow_unloadable = true;  // up_proj quantized without a gate_proj beside it
    quantize(o);
    for (const std::uint64_t chunk : {VerifyOptions{}.chunk_bytes, kOneRowChunk}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      VerifyOptions options;
      options.chunk_bytes = chunk;
      const VerifyReport r = verify_against_source(o.output, dir / "in", options);
      EXPECT_TRUE(r.same()) << describe(r);
      ASSERT_EQ(r.modules.size(), 1u) << describe(r);
      EXPECT_EQ(r.modules[0].module, "model.layers.0.mlp.up_proj");
      EXPECT_TRUE(r.modules[0].fp8_source);
      EXPECT_EQ(r.modules[0].groups, 5u * 2u);
      EXPECT_LT(r.modules[0].rel_frobenius, kMaxRelFrobenius4Bit);
      // lm_head copied, down_proj dequantized: both identical to the source.
      EXPECT_EQ(r.tensors_compared, 2u);
      EXPECT_EQ(r.tensors_identical, 2u);
    }
  }
}

// ---- one change each ----

TEST(VerifyAgainstFp8Source, FlippedNibbleFoundAtItsRowAndColumn) {
  GoldenCopy out("fp8-block");
  // gate_proj [320, 256] packs 32 words per row. Row 130 is in the second
  // 128-row block of the FP8 scale grid; word 20 holds columns 160..167 and
  // the high nibble of its third byte is column 165, in group 1.
  const std::string tensor = "model.layers.1.mlp.gate_proj.weight_packed";
  test::xor_tensor_byte(out.path / "model-00002-of-00002.safetensors", tensor,
                        (130 * 32 + 20) * 4 + 2, 0x10);
  for (const std::uint64_t chunk : {VerifyOptions{}.chunk_bytes, kOneRowChunk}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    VerifyOptions options;
    options.chunk_bytes = chunk;
    const VerifyReport r = verify_against_source(out.path, golden("fp8-block") / "input", options);
    const std::vector<VerifyItem> diffs = without_fp8_block_qkv(r);
    ASSERT_EQ(diffs.size(), 1u) << describe(r);
    const VerifyItem& d = diffs[0];
    EXPECT_EQ(d.kind, "codes");
    EXPECT_EQ(d.file, "model-00002-of-00002.safetensors");
    EXPECT_EQ(d.tensor, tensor);
    EXPECT_EQ(d.details["groups_mismatched"], 1);
    EXPECT_EQ(d.details["groups"], 320 * 2);
    EXPECT_EQ(d.details["first_row"], 130);
    EXPECT_EQ(d.details["first_group"], 1);
    EXPECT_EQ(d.details["first_column"], 165);
    EXPECT_EQ(d.details["source"], "dequantized FP8");
    EXPECT_TRUE(
        contains(d.message, "1 of 640 groups are not the RTN codes of the dequantized FP8 source"))
        << d.message;
    EXPECT_TRUE(contains(d.message, "first at row 130, column 165 (group 1)")) << d.message;
    const ModuleCheck* m = find_module(r, "model.layers.1.mlp.gate_proj");
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->groups_mismatched, 1u);
    EXPECT_EQ(m->first_row, 130u);
    EXPECT_EQ(m->first_column, 165u);
    EXPECT_LT(m->rel_frobenius, kMaxRelFrobenius4Bit);
    EXPECT_EQ(r.tensors_identical, r.tensors_compared);
  }
}

TEST(VerifyAgainstFp8Source, ChangedByteOfDequantizedWeightFound) {
  GoldenCopy out("fp8-block");
  // v_proj is ignored, so its FP8 weight is written as BF16 [64, 256].
  // Flipping the low bit of element [5, 200] moves it by one ulp.
  const std::string tensor = "model.layers.0.self_attn.v_proj.weight";
  test::xor_tensor_byte(out.path / "model-00001-of-00002.safetensors", tensor, (5 * 256 + 200) * 2,
                        0x01);
  for (const std::uint64_t chunk : {VerifyOptions{}.chunk_bytes, kOneRowChunk}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    VerifyOptions options;
    options.chunk_bytes = chunk;
    const VerifyReport r = verify_against_source(out.path, golden("fp8-block") / "input", options);
    const std::vector<VerifyItem> diffs = without_fp8_block_qkv(r);
    ASSERT_EQ(diffs.size(), 1u) << describe(r);
    const VerifyItem& d = diffs[0];
    EXPECT_EQ(d.kind, "bytes");
    EXPECT_EQ(d.file, "model-00001-of-00002.safetensors");
    EXPECT_EQ(d.tensor, tensor);
    EXPECT_EQ(d.details["elements_differ"], 1);
    EXPECT_EQ(d.details["elements"], 64 * 256);
    EXPECT_EQ(d.details["first_row"], 5);
    EXPECT_EQ(d.details["first_column"], 200);
    EXPECT_GT(d.details["max_abs_difference"].get<double>(), 0.0);
    EXPECT_TRUE(contains(d.message,
                         "1 of 16384 elements differ from the BF16 dequantization of the FP8 "
                         "source (section 6), first at [5, 200]"))
        << d.message;
    EXPECT_EQ(r.tensors_identical, r.tensors_compared - 1);
  }
}

TEST(VerifyAgainstFp8Source, LeftoverWeightScaleInvReported) {
  GoldenCopy out("fp8-block");
  // The scale of a quantized module (gate_proj) and of a dequantized one
  // (v_proj), both consumed by their dequantization.
  const fs::path input = golden("fp8-block") / "input";
  const fs::path shard = out.path / "model-00001-of-00002.safetensors";
  add_tensor(shard, tensor_of(input, "model.layers.0.mlp.gate_proj.weight_scale_inv"));
  add_tensor(shard, tensor_of(input, "model.layers.0.self_attn.v_proj.weight_scale_inv"));
  const VerifyReport r = verify_against_source(out.path, input, {});
  const std::vector<VerifyItem> diffs = without_fp8_block_qkv(r);
  ASSERT_EQ(diffs.size(), 2u) << describe(r);
  for (const VerifyItem& d : diffs) {
    EXPECT_EQ(d.kind, "extra_tensor");
    EXPECT_EQ(d.file, "model-00001-of-00002.safetensors");
    EXPECT_TRUE(contains(d.message, "consumed by its dequantization; section 6: it is not written"))
        << d.message;
  }
  EXPECT_EQ(diffs[0].tensor, "model.layers.0.mlp.gate_proj.weight_scale_inv");
  EXPECT_TRUE(contains(diffs[0].message,
                       "the scale of FP8 weight 'model.layers.0.mlp.gate_proj.weight'"));
  EXPECT_EQ(diffs[1].tensor, "model.layers.0.self_attn.v_proj.weight_scale_inv");
  EXPECT_TRUE(contains(render_verify_text(r),
                       "model-00001-of-00002.safetensors: 0 missing, 2 "
                       "extra, 0 misplaced"));
}

TEST(VerifyAgainstFp8Source, ActivationParametersAreDroppedNotMissing) {
  // An fp8-ct-channel input that also carries a static input_scale: quantize
  // drops it, verify accepts its absence and reports it when it is left in.
  GoldenCopy in("fp8-ct-channel", "input");
  const std::string param = "model.layers.0.self_attn.q_proj.input_scale";
  add_tensor(in.path / "model.safetensors",
             test::FakeTensor{param, DType::kF32, {1}, test::float_bytes(DType::kF32, {0.5f})});
  QuantizeOptions o = test::test_options(in.path, in.dir / "out");
  o.plan.ignore = {"lm_head", "model.embed_tokens"};
  quantize(o);
  const VerifyReport clean = verify_against_source(o.output, in.path, {});
  EXPECT_TRUE(clean.same()) << describe(clean);
  EXPECT_EQ(clean.modules.size(), 7u);

  add_tensor(o.output / "model.safetensors",
             test::FakeTensor{param, DType::kF32, {1}, test::float_bytes(DType::kF32, {0.5f})});
  const VerifyReport r = verify_against_source(o.output, in.path, {});
  ASSERT_EQ(r.differences.size(), 1u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "extra_tensor");
  EXPECT_EQ(r.differences[0].tensor, param);
  EXPECT_TRUE(contains(r.differences[0].message,
                       "an activation or KV-cache parameter ('input_scale') of the FP8 INPUT"))
      << r.differences[0].message;
}

TEST(VerifyAgainstFp8Source, SourceValueThatDequantizesToNanIsReported) {
  GoldenCopy in("fp8-ct-channel", "input");
  // E4M3 code 0x7F is NaN: set element [7, 33] of q_proj's FP8 weight to it.
  const std::string tensor = "model.layers.0.self_attn.q_proj.weight";
  const fs::path file = in.path / "model.safetensors";
  const auto codes = test::read_tensor(file, tensor);
  const auto at = static_cast<std::uint64_t>(7 * 256 + 33);
  test::xor_tensor_byte(file, tensor, at, std::to_integer<std::uint8_t>(codes[at]) ^ 0x7Fu);
  const VerifyReport r = verify_against_source(golden("fp8-ct-channel") / "expected", in.path, {});
  ASSERT_EQ(r.differences.size(), 1u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "source");
  EXPECT_EQ(r.differences[0].tensor, tensor);
  EXPECT_TRUE(contains(r.differences[0].message,
                       "source element [7, 33] is code 0x7F, which is nan in F8_E4M3"))
      << r.differences[0].message;
  EXPECT_EQ(find_module(r, "model.layers.0.self_attn.q_proj"), nullptr);
  EXPECT_EQ(r.modules.size(), 6u);
}

TEST(VerifyAgainstFp8Source, Fp8WeightLeftAsF8IsADtypeDifference) {
  GoldenCopy out("fp8-block");
  const fs::path input = golden("fp8-block") / "input";
  const std::string tensor = "model.layers.1.self_attn.v_proj.weight";
  const fs::path shard = out.path / "model-00002-of-00002.safetensors";
  test::drop_tensor(shard, tensor);
  add_tensor(shard, tensor_of(input, tensor));
  const VerifyReport r = verify_against_source(out.path, input, {});
  const auto dtype = of_kind(r.differences, "dtype");
  ASSERT_EQ(dtype.size(), 1u) << describe(r);
  EXPECT_EQ(dtype[0].tensor, tensor);
  EXPECT_TRUE(contains(dtype[0].message,
                       "F8_E4M3 [64, 256] in OUTPUT; the FP8 source F8_E4M3 [64, 256] is written "
                       "as its BF16 dequantization"))
      << dtype[0].message;
}

// ---- refused inputs ----

TEST(VerifyAgainstFp8Source, RefusesInputKindsQuantizeDoesNotConvert) {
  const fs::path out = golden("llama-bf16") / "expected";
  // An already pack-quantized INPUT.
  test::expect_bad_input([&] { verify_against_source(out, out, {}); },
                         {"--against-source: INPUT config.json", "already pack-quantized"});

  // GPTQ, and block FP8 without its block size.
  for (const auto& [qc, fragment] : std::vector<std::pair<json, std::string>>{
           {json{{"quant_method", "gptq"}, {"bits", 4}}, "quant_method \"gptq\""},
           {json{{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}},
            "it has no weight_block_size"}}) {
    SCOPED_TRACE(fragment);
    GoldenCopy in("llama-bf16", "input");
    json config = test::read_json(in.path / "config.json");
    config["quantization_config"] = qc;
    test::write_json(in.path / "config.json", config);
    test::expect_bad_input([&] { verify_against_source(out, in.path, {}); },
                           {"--against-source: INPUT config.json", fragment});
    const auto r =
        test::run_ctquant({"verify", out.string(), in.path.string(), "--against-source"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_TRUE(r.out.empty());
    EXPECT_TRUE(contains(r.err, fragment)) << r.err;
  }
}

}  // namespace
}  // namespace ctquant
