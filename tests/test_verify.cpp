// verify: every outcome against a golden checkpoint as a named case (copies
// of the golden fixtures with one thing changed), the golden fixtures against
// themselves, fresh outputs against them, --against-source, and the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "fake_checkpoint.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"
#include "verify_test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::contains;
using test::describe;
using test::golden;
using test::GoldenCopy;
using test::kMaxRelFrobenius4Bit;
using test::kMaxRelFrobenius8Bit;
using test::of_kind;
using test::without_fp8_block_qkv;

using test::golden_cases;
using test::GoldenCase;

// Whether the registry has the case's scheme(s).
bool supported(const GoldenCase& c) {
  try {
    check_plan_options(test::plan_of(c));
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Notes a fresh output may carry against a fixture without loading
// differently: config group names (older fixtures), an index the single-file
// fixture lacks, __metadata__, tensors held by other shards (both indexes
// consistent).
bool loader_neutral(const VerifyItem& note) {
  return note.kind == "config" || note.kind == "index" || note.kind == "metadata" ||
         note.kind == "misplaced_tensor";
}

// ---- ulp distance ----

TEST(UlpDistance, CountsRepresentableValuesBetween) {
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x3f80, 0x3f81), 1u);
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x3f81, 0x3f80), 1u);
  EXPECT_EQ(ulp_distance(DType::kF16, 0x3c00, 0x3c05), 5u);
  EXPECT_EQ(ulp_distance(DType::kF32, 0x3f800000u, 0x3f800001u), 1u);
  // +0 and -0 are the same value; the smallest subnormals of either sign are 2 apart.
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x0000, 0x8000), 0u);
  EXPECT_EQ(ulp_distance(DType::kF32, 0x00000001u, 0x80000001u), 2u);
  // Crossing an exponent boundary is still one step.
  EXPECT_EQ(ulp_distance(DType::kF16, 0x3bff, 0x3c00), 1u);
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x7fc0, 0x3f80), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x7fc0, 0x7fc0), 0u);
}

// ---- verify against a golden checkpoint: one outcome per case ----

TEST(VerifyGolden, IdenticalCopyIsSame) {
  GoldenCopy out("dflash-bf16-sharded");
  const VerifyReport r =
      verify_checkpoints(out.path, golden("dflash-bf16-sharded") / "expected", {});
  EXPECT_TRUE(r.same()) << describe(r);
  EXPECT_TRUE(r.notes.empty());
  EXPECT_EQ(r.tensors_output, 44u);
  EXPECT_EQ(r.tensors_compared, 44u);
  EXPECT_EQ(r.tensors_identical, 44u);
  EXPECT_EQ(r.files_compared, 2u);
}

TEST(VerifyGolden, FlippedNibbleFoundAtItsRowAndColumn) {
  GoldenCopy out("llama-bf16");
  // down_proj is [256, 384]: 48 words per row. Word 2 of row 3 holds columns
  // 16..23; the high nibble of its second byte is column 19.
  const std::string tensor = "model.layers.0.mlp.down_proj.weight_packed";
  test::xor_tensor_byte(out.path / "model.safetensors", tensor, (3 * 48 + 2) * 4 + 1, 0x10);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  ASSERT_EQ(r.differences.size(), 1u) << describe(r);
  const VerifyItem& d = r.differences[0];
  EXPECT_EQ(d.kind, "codes");
  EXPECT_EQ(d.file, "model.safetensors");
  EXPECT_EQ(d.tensor, tensor);
  EXPECT_EQ(d.details["codes_differ"], 1);
  EXPECT_EQ(d.details["codes"], 256 * 384);
  EXPECT_EQ(d.details["first_row"], 3);
  EXPECT_EQ(d.details["first_column"], 19);
  const int a = d.details["first_codes"][0];
  const int b = d.details["first_codes"][1];
  EXPECT_EQ((a + 8) ^ (b + 8), 1);  // one bit of the offset code
  EXPECT_TRUE(contains(d.message, "1 of 98304 codes differ, first at row 3, column 19"));
  EXPECT_EQ(r.tensors_identical, r.tensors_compared - 1);
}

TEST(VerifyGolden, ScaleOffByOneUlpAcceptedOnlyWithScaleUlp) {
  GoldenCopy out("llama-f32");
  // Element [5, 1] of an F32 [128, 2] scale: flipping the lowest mantissa bit
  // moves it by exactly one ulp.
  const std::string tensor = "model.layers.0.mlp.down_proj.weight_scale";
  test::xor_tensor_byte(out.path / "model.safetensors", tensor, (5 * 2 + 1) * 4, 0x01);
  const fs::path ref = golden("llama-f32") / "expected";

  const VerifyReport strict = verify_checkpoints(out.path, ref, {});
  ASSERT_EQ(strict.differences.size(), 1u) << describe(strict);
  EXPECT_EQ(strict.differences[0].kind, "scale");
  EXPECT_EQ(strict.differences[0].tensor, tensor);
  EXPECT_EQ(strict.differences[0].details["values_differ"], 1);
  EXPECT_EQ(strict.differences[0].details["max_ulp"], 1);
  EXPECT_TRUE(contains(strict.differences[0].message, "first at [5, 1]"));

  VerifyOptions one;
  one.scale_ulp = 1;
  const VerifyReport lenient = verify_checkpoints(out.path, ref, one);
  EXPECT_TRUE(lenient.same()) << describe(lenient);
  ASSERT_EQ(lenient.notes.size(), 1u);
  EXPECT_EQ(lenient.notes[0].kind, "scale");
  EXPECT_TRUE(contains(lenient.notes[0].message, "accepted by --scale-ulp 1"));
  EXPECT_EQ(lenient.tensors_identical, lenient.tensors_compared - 1);

  // Two ulps are too many for --scale-ulp 1.
  test::xor_tensor_byte(out.path / "model.safetensors", tensor, (5 * 2 + 1) * 4, 0x03);
  const VerifyReport two = verify_checkpoints(out.path, ref, one);
  ASSERT_EQ(two.differences.size(), 1u);
  EXPECT_EQ(two.differences[0].details["max_ulp"], 2);
}

TEST(VerifyGolden, MissingTensorReported) {
  GoldenCopy out("llama-bf16");
  const std::string tensor = "model.layers.1.mlp.up_proj.weight_scale";
  test::drop_tensor(out.path / "model.safetensors", tensor);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  ASSERT_EQ(r.differences.size(), 2u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "missing_tensor");
  EXPECT_EQ(r.differences[0].tensor, tensor);
  EXPECT_EQ(r.differences[0].file, "model.safetensors");
  EXPECT_TRUE(contains(r.differences[0].message, "in GOLDEN only (BF16 [384, 2])"));
  // A packed module without its scale does not load either.
  EXPECT_EQ(r.differences[1].kind, "loadability");
  EXPECT_EQ(r.differences[1].tensor, "model.layers.1.mlp.up_proj.weight_packed");
  EXPECT_EQ(r.differences[1].message,
            "packed module 'model.layers.1.mlp.up_proj' has no weight_scale");
}

TEST(VerifyGolden, MissingTensorInShardedOutputAlsoMakesTheIndexStale) {
  GoldenCopy out("dflash-bf16-sharded");
  test::drop_tensor(out.path / "model-00002-of-00002.safetensors", "norm.weight");
  const VerifyReport r =
      verify_checkpoints(out.path, golden("dflash-bf16-sharded") / "expected", {});
  EXPECT_EQ(of_kind(r.differences, "missing_tensor").size(), 1u) << describe(r);
  const auto index = of_kind(r.differences, "index");
  ASSERT_EQ(index.size(), 2u) << describe(r);
  EXPECT_EQ(index[0].tensor, "norm.weight");
  EXPECT_TRUE(contains(index[0].message, "which does not hold it; no shard does"));
  EXPECT_TRUE(contains(index[1].message, "metadata.total_size is"));
}

TEST(VerifyGolden, StaleIndexEntryNamesTheWrongShard) {
  GoldenCopy out("dflash-bf16-sharded");
  const fs::path index = out.path / "model.safetensors.index.json";
  json value = test::read_json(index);
  value["weight_map"]["fc.weight_scale"] = "model-00002-of-00002.safetensors";
  test::write_json(index, value);
  const VerifyReport r =
      verify_checkpoints(out.path, golden("dflash-bf16-sharded") / "expected", {});
  ASSERT_EQ(r.differences.size(), 2u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "index");
  EXPECT_EQ(r.differences[0].tensor, "fc.weight_scale");
  EXPECT_TRUE(contains(r.differences[0].message,
                       "OUTPUT: weight_map lists it in 'model-00002-of-00002.safetensors', but "
                       "'model-00001-of-00002.safetensors' holds it"));
  EXPECT_EQ(r.differences[1].kind, "index");
  EXPECT_TRUE(
      contains(r.differences[1].message, "weight_map differs for 1 tensor: fc.weight_scale"));
  EXPECT_EQ(r.tensors_identical, 44u);  // the tensors themselves are fine
}

TEST(VerifyGolden, IndexMissingATensorAndWrongTotalSize) {
  GoldenCopy out("dflash-bf16-sharded");
  const fs::path index = out.path / "model.safetensors.index.json";
  json value = test::read_json(index);
  value["weight_map"].erase("layers.1.self_attn.o_proj.weight_shape");
  value["metadata"]["total_size"] = value["metadata"]["total_size"].get<std::uint64_t>() + 1;
  test::write_json(index, value);
  const VerifyReport r =
      verify_checkpoints(out.path, golden("dflash-bf16-sharded") / "expected", {});
  const auto items = of_kind(r.differences, "index");
  ASSERT_EQ(items.size(), r.differences.size()) << describe(r);
  ASSERT_EQ(items.size(), 4u) << describe(r);
  EXPECT_EQ(items[0].tensor, "layers.1.self_attn.o_proj.weight_shape");
  EXPECT_TRUE(
      contains(items[0].message, "held by 'model-00002-of-00002.safetensors' but not listed"));
  EXPECT_TRUE(contains(items[1].message, "metadata.total_size is"));
  EXPECT_TRUE(contains(items[2].message, "weight_map differs for 1 tensor"));
  EXPECT_TRUE(contains(items[3].message, "metadata.total_size:"));
}

TEST(VerifyGolden, ConfigFieldReadersActOnIsADifference) {
  GoldenCopy out("llama-bf16");
  json config = test::read_json(out.path / "config.json");
  config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64;
  config["torch_dtype"] = "float16";
  test::write_json(out.path / "config.json", config);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  ASSERT_EQ(r.differences.size(), 2u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "config");
  EXPECT_EQ(r.differences[0].details["path"],
            "quantization_config.config_groups.group_0.weights.group_size");
  EXPECT_EQ(r.differences[0].details["acted_on"], true);
  EXPECT_TRUE(
      contains(r.differences[0].message, "64 in OUTPUT, 128 in GOLDEN (a field vLLM acts on)"));
  EXPECT_EQ(r.differences[1].details["path"], "torch_dtype");
  EXPECT_EQ(r.differences[1].details["acted_on"], false);
}

// Which formats loaders read is the registry's answer (SchemeFamily::
// vllm_int_weight_only, writes_weight_shape) and compressed-tensors' list.
TEST(VerifyLoadability, IntWeightOnlyGroupOutsidePackQuantizedIsADifference) {
  GoldenCopy out("llama-bf16");
  json config = test::read_json(out.path / "config.json");
  json& qc = config["quantization_config"];
  qc["format"] = "int-quantized";
  qc["config_groups"]["group_0"]["format"] = "int-quantized";
  test::write_json(out.path / "config.json", config);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  const auto items = of_kind(r.differences, "loadability");
  ASSERT_EQ(items.size(), 1u) << describe(r);
  EXPECT_EQ(items[0].file, "config.json");
  EXPECT_EQ(items[0].message,
            "config group 'group_0': int weight-only quantization with format 'int-quantized'; "
            "vLLM reads it only as \"pack-quantized\" (other formats trip its weights.type == "
            "FLOAT assertion)");
}

TEST(VerifyLoadability, FormatCompressedTensorsDoesNotHaveIsADifference) {
  GoldenCopy out("llama-bf16");
  json config = test::read_json(out.path / "config.json");
  config["quantization_config"]["format"] = "pack-quantised";
  test::write_json(out.path / "config.json", config);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  const auto items = of_kind(r.differences, "loadability");
  // Neither a registry row's format nor one of compressed-tensors' others.
  ASSERT_EQ(items.size(), 1u) << describe(r);
  EXPECT_EQ(items[0].message,
            "quantization_config.format 'pack-quantised' is not a compressed-tensors format");
  // A compressed-tensors format ctquant does not write is not this difference.
  config["quantization_config"]["format"] = "mixed-precision";
  test::write_json(out.path / "config.json", config);
  const VerifyReport mixed = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  EXPECT_TRUE(of_kind(mixed.differences, "loadability").empty()) << describe(mixed);
}

TEST(VerifyGolden, NoteOnlyConfigDifferencesAreSame) {
  GoldenCopy out("llama-bf16");
  json config = test::read_json(out.path / "config.json");
  json& qc = config["quantization_config"];
  qc["version"] = "0.17.1";
  qc["global_compression_ratio"] = 1.9;
  qc["config_groups"]["group_0"]["weights"]["observer"] = "minmax";
  qc["config_groups"]["group_0"]["weights"]["observer_kwargs"] = {{"averaging_constant", 0.01}};
  qc["config_groups"]["group_9"] = qc["config_groups"]["group_0"];
  qc["config_groups"].erase("group_0");
  test::write_json(out.path / "config.json", config);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  EXPECT_TRUE(r.same()) << describe(r);
  ASSERT_EQ(r.notes.size(), 5u) << describe(r);
  EXPECT_TRUE(
      contains(r.notes[0].message, "config_groups names: group_9 in OUTPUT, group_0 in GOLDEN"));
  EXPECT_EQ(r.notes[1].details["path"],
            "quantization_config.config_groups.group_0.weights.observer");
  EXPECT_EQ(r.notes[2].details["path"],
            "quantization_config.config_groups.group_0.weights.observer_kwargs.averaging_constant");
  EXPECT_EQ(r.notes[3].details["path"], "quantization_config.global_compression_ratio");
  EXPECT_EQ(r.notes[4].details["path"], "quantization_config.version");
  EXPECT_TRUE(contains(render_verify_text(r), "result: SAME (5 notes)"));
}

// A converter's group and a new scheme's are named differently by ctquant
// and model_free_ptq; renamed groups whose name order is swapped are paired
// by content, not by position.
TEST(VerifyGolden, RenamedConfigGroupsArePairedByContentNotByNameOrder) {
  GoldenCopy out("llama-bf16-mixed");
  json config = test::read_json(out.path / "config.json");
  json& groups = config["quantization_config"]["config_groups"];
  ASSERT_TRUE(groups.contains("attention") && groups.contains("mlp"));
  // "attention" < "mlp" in the reference; "b_attention" > "a_mlp" here.
  groups["b_attention"] = groups["attention"];
  groups["a_mlp"] = groups["mlp"];
  groups.erase("attention");
  groups.erase("mlp");
  test::write_json(out.path / "config.json", config);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16-mixed") / "expected", {});
  EXPECT_TRUE(r.same()) << describe(r);
  ASSERT_EQ(r.notes.size(), 1u) << describe(r);
  EXPECT_TRUE(
      contains(r.notes[0].message,
               "config_groups names: a_mlp, b_attention in OUTPUT, attention, mlp in GOLDEN"))
      << r.notes[0].message;
}

TEST(VerifyGolden, OtherFilesComparedAsBytesOrJson) {
  GoldenCopy out("llama-bf16");
  const fs::path tokenizer = out.path / "tokenizer_config.json";
  json value = test::read_json(tokenizer);
  test::write_file(tokenizer, value.dump(4));  // same JSON, other bytes
  VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  EXPECT_TRUE(r.same()) << describe(r);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].file, "tokenizer_config.json");

  value["model_max_length"] = 17;
  test::write_file(tokenizer, value.dump(2));
  test::write_file(out.path / "README.md", "extra\n");
  r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  ASSERT_EQ(r.differences.size(), 2u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "extra_file");
  EXPECT_EQ(r.differences[0].file, "README.md");
  EXPECT_EQ(r.differences[1].kind, "file");
  EXPECT_EQ(r.differences[1].file, "tokenizer_config.json");
  EXPECT_TRUE(contains(r.differences[1].message, "model_max_length: 17 in OUTPUT"));
}

TEST(VerifyGolden, ZeroPointDifferenceFoundAtItsRowAndGroup) {
  GoldenCopy out("llama-bf16-asym");
  // weight_zero_point [16, 2]: word (0, 1) holds rows 0..7 of group 1; bits 4..7 are row 1.
  const std::string tensor = "model.layers.0.mlp.down_proj.weight_zero_point";
  test::xor_tensor_byte(out.path / "model.safetensors", tensor, 4, 0x10);
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16-asym") / "expected", {});
  ASSERT_EQ(r.differences.size(), 1u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "zero_point");
  EXPECT_EQ(r.differences[0].details["zero_points_differ"], 1);
  EXPECT_EQ(r.differences[0].details["first_row"], 1);
  EXPECT_EQ(r.differences[0].details["first_group"], 1);
}

TEST(VerifyGolden, PaddingBitsPastTheLastColumnAreReported) {
  // A [2, 12] weight packed as 4-bit codes: 48 bits in two words per row, so
  // the upper half of each row's second word is padding.
  const json config = {
      {"quantization_config",
       {{"quant_method", "compressed-tensors"},
        {"format", "pack-quantized"},
        {"quantization_status", "compressed"},
        {"config_groups",
         {{"group_0", {{"targets", {"Linear"}}, {"weights", {{"num_bits", 4}}}}}}}}}};
  const auto write = [&](const fs::path& dir, std::uint32_t last_word) {
    fs::create_directories(dir);
    std::vector<std::byte> words(16, std::byte{0});
    std::memcpy(words.data() + 12, &last_word, 4);
    std::vector<std::byte> shape(16, std::byte{0});
    const std::int64_t dims[2] = {2, 12};
    std::memcpy(shape.data(), dims, 16);
    // In the safetensors writer's order (I64, I32, BF16): every tensor aligned.
    test::write_safetensors(dir / "model.safetensors",
                            {{"m.weight_shape", DType::kI64, {2}, shape},
                             {"m.weight_packed", DType::kI32, {2, 2}, words},
                             {"m.weight_scale", DType::kBF16, {2, 1}, std::vector<std::byte>(4)}});
    test::write_json(dir / "config.json", config);
  };
  test::TempDir dir;
  write(dir / "a", 0x00000000u);
  write(dir / "b", 0x00010000u);  // bit 16 of row 1's second word: column 12, past the end
  const VerifyReport r = verify_checkpoints(dir / "a", dir / "b", {});
  ASSERT_EQ(r.differences.size(), 1u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "codes");
  EXPECT_EQ(r.differences[0].details["codes_differ"], 0);
  EXPECT_EQ(r.differences[0].details["first_row"], 1);
  EXPECT_TRUE(contains(r.differences[0].message, "padding bits past the last column"));

  write(dir / "b", 0x00000100u);  // bits 8..11 of row 1's second word: column 10
  const VerifyReport r2 = verify_checkpoints(dir / "a", dir / "b", {});
  ASSERT_EQ(r2.differences.size(), 1u) << describe(r2);
  EXPECT_EQ(r2.differences[0].details["first_row"], 1);
  EXPECT_EQ(r2.differences[0].details["first_column"], 10);
}

TEST(VerifyGolden, DifferentCasesDifferInDtypeAndSets) {
  const VerifyReport r =
      verify_checkpoints(golden("llama-f16") / "expected", golden("llama-bf16") / "expected", {});
  EXPECT_FALSE(r.same());
  EXPECT_FALSE(of_kind(r.differences, "dtype").empty());
  EXPECT_EQ(of_kind(r.differences, "dtype")[0].tensor, "lm_head.weight");
}

// config.json, the index and any other .json file are read through the JSON
// reader's bounds on both sides: JSON nested 100,000 levels deep (which once
// ended verify with SIGSEGV) is a difference that names the file and the
// rule, and verify exits 3.
TEST(VerifyGolden, DeeplyNestedJsonIsADifferenceNotACrash) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  GoldenCopy out("dflash-bf16-sharded");
  GoldenCopy ref("dflash-bf16-sharded");
  json config = test::read_json(out.path / "config.json");
  const std::string text = config.dump();
  test::write_file(out.path / "config.json",
                   text.substr(0, text.size() - 1) + ",\"deep\":" + deep + "}");
  test::write_file(ref.path / "model.safetensors.index.json", deep);
  test::write_file(ref.path / "generation_config.json", deep);
  const VerifyReport r = verify_checkpoints(out.path, ref.path, {});
  EXPECT_FALSE(r.same());
  const auto config_diffs = of_kind(r.differences, "config");
  ASSERT_FALSE(config_diffs.empty()) << describe(r);
  EXPECT_TRUE(contains(config_diffs[0].message, "config.json: JSON nests deeper than 128 levels"))
      << config_diffs[0].message;
  const auto index_diffs = of_kind(r.differences, "index");
  ASSERT_FALSE(index_diffs.empty()) << describe(r);
  EXPECT_TRUE(contains(index_diffs[0].message, "nests deeper than 128 levels"))
      << index_diffs[0].message;
  const auto file_diffs = of_kind(r.differences, "file");
  ASSERT_EQ(file_diffs.size(), 1u) << describe(r);
  EXPECT_EQ(file_diffs[0].file, "generation_config.json");
  EXPECT_TRUE(contains(file_diffs[0].message,
                       "not compared as JSON: generation_config.json of GOLDEN: JSON nests "
                       "deeper than 128 levels"))
      << file_diffs[0].message;
  const auto cli = test::run_ctquant({"verify", out.path.string(), ref.path.string()});
  EXPECT_EQ(cli.exit_code, 3) << cli.err;
  EXPECT_TRUE(contains(cli.out, "nests deeper than 128 levels")) << cli.out;
}

// An OUTPUT tensor whose data does not start at a multiple of its element
// size (an I64 at a byte offset of 6 mod 8) is a difference of kind
// "alignment", even when every value matches.
TEST(VerifyGolden, MisalignedTensorIsADifference) {
  test::TempDir tmp;
  const auto write = [](const fs::path& dir, const std::string& entries, std::size_t data_bytes) {
    fs::create_directories(dir);
    std::string header = "{" + entries + "}";
    header.resize((header.size() + 7) / 8 * 8, ' ');
    test::write_raw_safetensors(dir / "model.safetensors", header,
                                std::vector<std::byte>(data_bytes, std::byte{0}));
  };
  // "a" BF16 [3] takes 6 bytes; "b" I64 [2] after it starts at 6.
  write(tmp / "out",
        R"("a":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
        R"("b":{"dtype":"I64","shape":[2],"data_offsets":[6,22]})",
        22);
  write(tmp / "ref",
        R"("b":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
        R"("a":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]})",
        22);
  const VerifyReport r = verify_checkpoints(tmp / "out", tmp / "ref", {});
  const auto aligned = of_kind(r.differences, "alignment");
  ASSERT_EQ(aligned.size(), 1u) << describe(r);
  EXPECT_EQ(aligned[0].tensor, "b");
  EXPECT_EQ(aligned[0].file, "model.safetensors");
  EXPECT_TRUE(contains(aligned[0].message,
                       "offset 6 of the data buffer), not a multiple of its element size (8 "
                       "bytes for I64)"))
      << aligned[0].message;
  EXPECT_EQ(aligned[0].details["element_bytes"], 8);
  // The reference side is aligned: nothing to report the other way round.
  EXPECT_TRUE(
      of_kind(verify_checkpoints(tmp / "ref", tmp / "out", {}).differences, "alignment").empty());
}

TEST(VerifyGolden, MissingDirectoryIsAnError) {
  test::TempDir dir;
  try {
    verify_checkpoints(dir / "nope", golden("llama-bf16") / "expected", {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_TRUE(contains(e.what(), "no such file or directory"));
  }
}

// ---- golden fixtures against themselves and against fresh outputs ----

TEST(VerifyGoldenFixtures, EachExpectedAgainstItself) {
  for (const GoldenCase& c : golden_cases()) {
    const fs::path expected = golden(c.name) / "expected";
    const VerifyReport r = verify_checkpoints(expected, expected, {});
    EXPECT_TRUE(without_fp8_block_qkv(r).empty()) << c.name << "\n" << describe(r);
    EXPECT_EQ(r.differences.size(), c.name == "fp8-block" ? 2u : 0u) << c.name;
    EXPECT_TRUE(r.notes.empty()) << c.name;
    EXPECT_EQ(r.tensors_identical, r.tensors_output) << c.name;
  }
}

TEST(VerifyGoldenFixtures, FreshOutputMatchesExpected) {
  std::size_t checked = 0;
  for (const GoldenCase& c : golden_cases()) {
    if (!supported(c)) continue;
    test::TempDir dir;
    QuantizeOptions o = default_quantize_options();
    o.input = golden(c.name) / "input";
    o.output = dir / "out";
    o.plan = test::plan_of(c);
    o.allow_unloadable = test::unloadable_in_vllm(c.name);
    o.threads = 2;
    o.fsync = false;
    quantize(o);
    const VerifyReport r = verify_checkpoints(dir / "out", golden(c.name) / "expected", {});
    EXPECT_TRUE(without_fp8_block_qkv(r).empty()) << c.name << "\n" << describe(r);
    EXPECT_EQ(r.differences.size(), c.name == "fp8-block" ? 2u : 0u) << c.name;
    for (const VerifyItem& n : r.notes)
      EXPECT_TRUE(loader_neutral(n)) << c.name << ": " << n.message;
    ++checked;
  }
  EXPECT_GE(checked, 12u);
}

// ---- --against-source ----

// llama-f16-nvfp4a16's layer-0 q/k/v (amax 0.03): 2688 / amax overflows
// F16, so model_free_ptq gives them the global scale 1.0 (schemes.md 5.3).
bool f16_global_scale_overflow(const std::string& name, const std::string& module) {
  return name == "llama-f16-nvfp4a16" && module.starts_with("model.layers.0.self_attn.") &&
         !module.ends_with("o_proj");
}

TEST(VerifyAgainstSource, GoldenCasesPass) {
  std::size_t checked = 0;
  std::size_t checked_overflow = 0;
  for (const GoldenCase& c : golden_cases()) {
    if (!supported(c)) continue;
    const fs::path expected = golden(c.name) / "expected";
    const VerifyReport r = verify_against_source(expected, golden(c.name) / "input", {});
    EXPECT_TRUE(without_fp8_block_qkv(r).empty()) << c.name << "\n" << describe(r);
    EXPECT_EQ(r.differences.size(), c.name == "fp8-block" ? 2u : 0u) << c.name;
    const QuantizePlan plan =
        make_plan(open_checkpoint(golden(c.name) / "input"), test::plan_of(c));
    EXPECT_EQ(r.modules.size(), plan.n_quantized) << c.name;
    const double bound = c.scheme == "W8A16" ? kMaxRelFrobenius8Bit : kMaxRelFrobenius4Bit;
    for (const ModuleCheck& m : r.modules) {
      EXPECT_EQ(m.groups_mismatched, 0u) << c.name << " " << m.module;
      EXPECT_GT(m.rel_frobenius, 0.0) << c.name << " " << m.module;
      if (f16_global_scale_overflow(c.name, m.module)) {
        // Global scale 1.0: most FP8 group scales round to 0 and become
        // 0.125, so most codes are 0 (schemes.md 5.3, 13 item 4).
        EXPECT_GT(m.rel_frobenius, 0.5) << c.name << " " << m.module;
        EXPECT_LT(m.rel_frobenius, 1.0) << c.name << " " << m.module;
        ++checked_overflow;
        continue;
      }
      EXPECT_LT(m.rel_frobenius, bound) << c.name << " " << m.module;
      EXPECT_GT(m.max_abs_error, 0.0) << c.name << " " << m.module;
    }
    ++checked;
  }
  EXPECT_GE(checked, 12u);
  EXPECT_EQ(checked_overflow, 3u);
}

TEST(VerifyAgainstSource, FlippedCodeIsNotTheRtnCode) {
  GoldenCopy out("llama-bf16");
  test::xor_tensor_byte(out.path / "model.safetensors",
                        "model.layers.0.mlp.down_proj.weight_packed", (3 * 48 + 2) * 4 + 1, 0x10);
  const VerifyReport r = verify_against_source(out.path, golden("llama-bf16") / "input", {});
  ASSERT_EQ(r.differences.size(), 1u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "codes");
  EXPECT_EQ(r.differences[0].details["groups_mismatched"], 1);
  EXPECT_EQ(r.differences[0].details["first_row"], 3);
  EXPECT_EQ(r.differences[0].details["first_group"], 0);
  const auto m = std::find_if(r.modules.begin(), r.modules.end(), [](const ModuleCheck& x) {
    return x.module == "model.layers.0.mlp.down_proj";
  });
  ASSERT_NE(m, r.modules.end());
  EXPECT_EQ(m->groups_mismatched, 1u);
  EXPECT_EQ(m->groups, 256u * 3u);
}

TEST(VerifyAgainstSource, ScaleUlpAppliesToRecomputedScales) {
  GoldenCopy out("llama-f32");
  test::xor_tensor_byte(out.path / "model.safetensors", "model.layers.0.mlp.up_proj.weight_scale",
                        7 * 4, 0x01);
  const fs::path input = golden("llama-f32") / "input";
  const VerifyReport exact = verify_against_source(out.path, input, {});
  ASSERT_EQ(exact.differences.size(), 1u) << describe(exact);
  EXPECT_EQ(exact.differences[0].details["first_row"], 7);
  VerifyOptions one;
  one.scale_ulp = 1;
  // The codes were computed with the exact scale; one ulp off is accepted
  // only where the stored codes still are the RTN codes.
  const VerifyReport lenient = verify_against_source(out.path, input, one);
  EXPECT_TRUE(lenient.same()) << describe(lenient);
  ASSERT_EQ(lenient.notes.size(), 1u);
  EXPECT_EQ(lenient.notes[0].kind, "scale");
}

TEST(VerifyAgainstSource, ModuleLeftUnpackedAgainstConfigIsAFateDifference) {
  GoldenCopy out("llama-bf16");
  json config = test::read_json(out.path / "config.json");
  config["quantization_config"]["ignore"] = json::array({"model.embed_tokens"});  // drop lm_head
  test::write_json(out.path / "config.json", config);
  const VerifyReport r = verify_against_source(out.path, golden("llama-bf16") / "input", {});
  const auto fate = of_kind(r.differences, "fate");
  ASSERT_EQ(fate.size(), 1u) << describe(r);
  EXPECT_EQ(fate[0].tensor, "lm_head.weight");
  EXPECT_TRUE(contains(fate[0].message, "vLLM will expect 'lm_head.weight_packed'"));
}

TEST(VerifyAgainstSource, CopiedTensorChangedAndSourceTensorMissing) {
  GoldenCopy out("llama-bf16");
  test::xor_tensor_byte(out.path / "model.safetensors", "model.norm.weight", 10, 0x01);
  test::drop_tensor(out.path / "model.safetensors", "model.layers.1.input_layernorm.weight");
  const VerifyReport r = verify_against_source(out.path, golden("llama-bf16") / "input", {});
  ASSERT_EQ(r.differences.size(), 2u) << describe(r);
  EXPECT_EQ(r.differences[0].kind, "bytes");
  EXPECT_EQ(r.differences[0].tensor, "model.norm.weight");
  EXPECT_TRUE(contains(r.differences[0].message, "1 of 256 elements differ, first at [5]"));
  EXPECT_EQ(r.differences[1].kind, "missing_tensor");
  EXPECT_EQ(r.differences[1].tensor, "model.layers.1.input_layernorm.weight");
}

TEST(VerifyAgainstSource, RefusesPackQuantizedSource) {
  // FP8 sources are checked (test_verify_fp8.cpp); a source quantize does not
  // convert is refused.
  const fs::path expected = golden("llama-bf16") / "expected";
  try {
    verify_against_source(expected, expected, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_TRUE(contains(e.what(), "--against-source: INPUT config.json: quantization_config"));
    EXPECT_TRUE(contains(e.what(), "already pack-quantized"));
  }
}

TEST(VerifyAgainstSource, RefusesOutputWithoutQuantizationConfig) {
  const fs::path input = golden("llama-bf16") / "input";
  try {
    verify_against_source(input, input, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_TRUE(contains(e.what(), "OUTPUT config.json: no quantization_config"));
  }
}

// ---- CLI ----

// A broken shard on either side is an error (not a difference) that says
// which checkpoint holds it.
TEST(VerifyErrors, BrokenShardNamesItsSide) {
  const fs::path expected = golden("llama-bf16") / "expected";
  GoldenCopy broken("llama-bf16");
  fs::resize_file(broken.path / "model.safetensors", 4);  // shorter than the 8-byte length
  for (const bool broken_is_output : {true, false}) {
    SCOPED_TRACE(broken_is_output ? "OUTPUT" : "GOLDEN");
    try {
      if (broken_is_output) {
        verify_checkpoints(broken.path, expected, {});
      } else {
        verify_checkpoints(expected, broken.path, {});
      }
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      const std::string want =
          fmt::format("{} {}: model.safetensors: ", broken_is_output ? "OUTPUT" : "GOLDEN",
                      broken.path.string());
      EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << e.what();
    }
  }
}

// A shard that is not a regular file is an error saying what it is, never a
// missing file; a directory without any shard is an error too.
TEST(VerifyErrors, NonRegularShardAndEmptyDirectoryAreErrors) {
  const fs::path expected = golden("llama-bf16") / "expected";
  test::TempDir tmp;
  fs::create_directories(tmp / "dangling");
  fs::create_symlink(tmp / "nowhere", tmp / "dangling" / "model.safetensors");
  fs::create_directories(tmp / "empty");
  struct Case {
    fs::path output;
    std::string fragment;
  };
  for (const Case& c :
       {Case{tmp / "dangling",
             "model.safetensors is not a regular file: it is a symbolic link whose target is "
             "missing"},
        Case{tmp / "empty", "no .safetensors file"}}) {
    SCOPED_TRACE(c.output.string());
    try {
      verify_checkpoints(c.output, expected, {});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_TRUE(contains(e.what(), "OUTPUT " + c.output.string() + ": " + c.fragment))
          << e.what();
    }
  }
}

TEST(VerifyCli, ExitCodes) {
  const std::string expected = (golden("llama-bf16") / "expected").string();
  const auto same = test::run_ctquant({"verify", expected, expected});
  EXPECT_EQ(same.exit_code, 0) << same.err;
  EXPECT_TRUE(contains(same.out, "result: SAME"));

  GoldenCopy out("llama-bf16");
  test::xor_tensor_byte(out.path / "model.safetensors",
                        "model.layers.0.mlp.down_proj.weight_packed", 0, 0x01);
  const auto differ = test::run_ctquant({"verify", out.path.string(), expected});
  EXPECT_EQ(differ.exit_code, 3);
  EXPECT_TRUE(contains(differ.out, "first at row 0, column 0"));
  EXPECT_TRUE(contains(differ.out, "result: DIFFERENT (1 difference, 0 notes)"));

  const auto missing = test::run_ctquant({"verify", (out.dir / "nope").string(), expected});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(missing.out.empty());
  EXPECT_TRUE(contains(missing.err, "no such file or directory"));

  EXPECT_EQ(test::run_ctquant({"verify", expected}).exit_code, 2);
  EXPECT_EQ(test::run_ctquant({"verify", expected, expected, "--scale-ulp", "x"}).exit_code, 2);
  // A negative count must not wrap around to "accept everything".
  const auto negative = test::run_ctquant({"verify", expected, expected, "--scale-ulp", "-1"});
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_TRUE(contains(negative.err,
                       "--scale-ulp: -1 is out of range: expected a whole number from 0 to "
                       "4294967296"))
      << negative.err;
  const auto fraction = test::run_ctquant({"verify", expected, expected, "--scale-ulp", "1.5"});
  EXPECT_EQ(fraction.exit_code, 2);
  EXPECT_TRUE(contains(fraction.err, "--scale-ulp: 1.5 is not a whole number")) << fraction.err;

  const auto source = test::run_ctquant(
      {"verify", expected, (golden("llama-bf16") / "input").string(), "--against-source"});
  EXPECT_EQ(source.exit_code, 0) << source.err;
  EXPECT_TRUE(contains(source.out, "model.layers.0.mlp.down_proj"));
  const auto flipped = test::run_ctquant(
      {"verify", out.path.string(), (golden("llama-bf16") / "input").string(), "--against-source"});
  EXPECT_EQ(flipped.exit_code, 3);
}

TEST(VerifyCli, JsonReportIsValidJson) {
  const std::string expected = (golden("dflash-bf16-sharded") / "expected").string();
  GoldenCopy out("dflash-bf16-sharded");
  test::drop_tensor(out.path / "model-00001-of-00002.safetensors", "fc.weight_shape");
  const auto r = test::run_ctquant({"verify", out.path.string(), expected, "--json"});
  EXPECT_EQ(r.exit_code, 3);
  const json report = json::parse(r.out);
  EXPECT_EQ(report["mode"], "golden");
  EXPECT_EQ(report["same"], false);
  EXPECT_EQ(report["summary"]["tensors_output"], 43);
  EXPECT_EQ(report["summary"]["tensors_reference"], 44);
  ASSERT_FALSE(report["differences"].empty());
  EXPECT_EQ(report["differences"][0]["kind"], "missing_tensor");
  EXPECT_EQ(report["differences"][0]["tensor"], "fc.weight_shape");
  EXPECT_EQ(report["summary"]["tensor_sets_per_file"]["model-00001-of-00002.safetensors"],
            json({{"missing", 1}, {"extra", 0}, {"misplaced", 0}}));

  const auto s =
      test::run_ctquant({"verify", expected, (golden("dflash-bf16-sharded") / "input").string(),
                         "--against-source", "--json"});
  EXPECT_EQ(s.exit_code, 0) << s.err;
  const json src = json::parse(s.out);
  EXPECT_EQ(src["mode"], "against-source");
  EXPECT_EQ(src["same"], true);
  EXPECT_EQ(src["modules"].size(), 9u);
  EXPECT_EQ(src["modules"][0]["module"], "fc");
  EXPECT_EQ(src["modules"][0]["groups_mismatched"], 0);
}

}  // namespace
}  // namespace ctquant
