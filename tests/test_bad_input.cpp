// Every kind of bad input ctquant must refuse, one named case each, generated
// here from an enum: the file is written, then quantize() (the library) and
// the ctquant binary must both refuse it with Error{kBadInput} / exit 1, a
// message naming the file, the tensor (when there is one) and the rule, and
// no OUTPUT or temporary directory left behind (docs/security.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "ctquant/format/matcher.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/util/error.hpp"
#include "fp8_test_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::FakeTensor;
using test::TempDir;

enum class Corruption {
  // container
  kFileShorterThan8Bytes,
  kHeaderLengthPastEnd,
  kHeaderOverLimit,
  kHeaderNotUtf8,
  kHeaderNotJson,
  kHeaderNotObject,
  kHeaderPaddedWithNul,
  kHeaderStartsWithBom,
  // entries
  kEntryMissingDtype,
  kEntryMissingShape,
  kEntryMissingDataOffsets,
  kEntryKeyRepeated,
  kUnknownDtype,
  kDtypeNestedDeeply,
  kNegativeDimension,
  kNegativeZeroDimension,
  kFractionalDimension,
  kNonNumericDimension,
  kDimensionBeyond64Bits,
  kShapeOverflows64Bits,
  kByteSizeMismatch,
  // data offsets
  kOffsetsOutOfOrder,
  kNegativeZeroOffset,
  kOffsetsOverlap,
  kOffsetsLeaveGap,
  kOffsetsPastEnd,
  kDataEndsBeforeFile,
  // names and metadata
  kDuplicateTensorInHeader,
  kDuplicateTensorAcrossShards,
  kMetadataNotObject,
  kMetadataValueNotString,
  // index
  kIndexNamesMissingFile,
  kIndexNamesParentDirectory,
  kIndexNamesAbsolutePath,
  kIndexNamesSubdirectory,
  kIndexTensorNotInFile,
  kIndexRepeatsTensor,
  // weights
  kNanInWeight,
  kPositiveInfinityInWeight,
  kNegativeInfinityInWeight,
  kWeightRowsTooLarge,
  // config.json
  kConfigNotJson,
  kConfigNestedTooDeep,
  kConfigQuantizationNotConverted,
  kCount,
};

const char* corruption_name(Corruption c) {
  switch (c) {
    case Corruption::kFileShorterThan8Bytes:
      return "FileShorterThan8Bytes";
    case Corruption::kHeaderLengthPastEnd:
      return "HeaderLengthPastEnd";
    case Corruption::kHeaderOverLimit:
      return "HeaderOverLimit";
    case Corruption::kHeaderNotUtf8:
      return "HeaderNotUtf8";
    case Corruption::kHeaderNotJson:
      return "HeaderNotJson";
    case Corruption::kHeaderNotObject:
      return "HeaderNotObject";
    case Corruption::kHeaderPaddedWithNul:
      return "HeaderPaddedWithNul";
    case Corruption::kHeaderStartsWithBom:
      return "HeaderStartsWithBom";
    case Corruption::kNegativeZeroDimension:
      return "NegativeZeroDimension";
    case Corruption::kNegativeZeroOffset:
      return "NegativeZeroOffset";
    case Corruption::kEntryMissingDtype:
      return "EntryMissingDtype";
    case Corruption::kEntryMissingShape:
      return "EntryMissingShape";
    case Corruption::kEntryMissingDataOffsets:
      return "EntryMissingDataOffsets";
    case Corruption::kEntryKeyRepeated:
      return "EntryKeyRepeated";
    case Corruption::kUnknownDtype:
      return "UnknownDtype";
    case Corruption::kDtypeNestedDeeply:
      return "DtypeNestedDeeply";
    case Corruption::kNegativeDimension:
      return "NegativeDimension";
    case Corruption::kFractionalDimension:
      return "FractionalDimension";
    case Corruption::kNonNumericDimension:
      return "NonNumericDimension";
    case Corruption::kDimensionBeyond64Bits:
      return "DimensionBeyond64Bits";
    case Corruption::kShapeOverflows64Bits:
      return "ShapeOverflows64Bits";
    case Corruption::kByteSizeMismatch:
      return "ByteSizeMismatch";
    case Corruption::kOffsetsOutOfOrder:
      return "OffsetsOutOfOrder";
    case Corruption::kOffsetsOverlap:
      return "OffsetsOverlap";
    case Corruption::kOffsetsLeaveGap:
      return "OffsetsLeaveGap";
    case Corruption::kOffsetsPastEnd:
      return "OffsetsPastEnd";
    case Corruption::kDataEndsBeforeFile:
      return "DataEndsBeforeFile";
    case Corruption::kDuplicateTensorInHeader:
      return "DuplicateTensorInHeader";
    case Corruption::kDuplicateTensorAcrossShards:
      return "DuplicateTensorAcrossShards";
    case Corruption::kMetadataNotObject:
      return "MetadataNotObject";
    case Corruption::kMetadataValueNotString:
      return "MetadataValueNotString";
    case Corruption::kIndexNamesMissingFile:
      return "IndexNamesMissingFile";
    case Corruption::kIndexNamesParentDirectory:
      return "IndexNamesParentDirectory";
    case Corruption::kIndexNamesAbsolutePath:
      return "IndexNamesAbsolutePath";
    case Corruption::kIndexNamesSubdirectory:
      return "IndexNamesSubdirectory";
    case Corruption::kIndexTensorNotInFile:
      return "IndexTensorNotInFile";
    case Corruption::kIndexRepeatsTensor:
      return "IndexRepeatsTensor";
    case Corruption::kNanInWeight:
      return "NanInWeight";
    case Corruption::kPositiveInfinityInWeight:
      return "PositiveInfinityInWeight";
    case Corruption::kNegativeInfinityInWeight:
      return "NegativeInfinityInWeight";
    case Corruption::kWeightRowsTooLarge:
      return "WeightRowsTooLarge";
    case Corruption::kConfigNotJson:
      return "ConfigNotJson";
    case Corruption::kConfigNestedTooDeep:
      return "ConfigNestedTooDeep";
    case Corruption::kConfigQuantizationNotConverted:
      return "ConfigQuantizationNotConverted";
    case Corruption::kCount:
      break;
  }
  return "?";
}

// What the refusal must say.
struct Expected {
  ErrorKind kind = ErrorKind::kBadInput;
  std::string file;               // the file named in the message
  std::string tensor;             // the tensor named, "" when the rule is not about one
  std::vector<std::string> rule;  // words of the rule (and what was found)
};

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kWeight = "model.layers.0.mlp.down_proj.weight";
constexpr const char* kNorm = "model.norm.weight";

std::vector<std::byte> zeros(std::size_t n) { return std::vector<std::byte>(n); }

// A raw header entry: `"name":{"dtype":..,"shape":..,"data_offsets":..}`.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  std::uint64_t begin, std::uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A 2 x 128 BF16 weight (selected for W4A16 g128) with one element replaced.
FakeTensor weight_with(std::uint64_t row, std::uint64_t col, float value) {
  FakeTensor w = test::random_weight(kWeight, DType::kBF16, 2, 128, 7);
  const std::vector<std::byte> bad = test::float_bytes(DType::kBF16, {value});
  std::copy(bad.begin(), bad.end(),
            w.data.begin() + static_cast<std::ptrdiff_t>((row * 128 + col) * 2));
  return w;
}

FakeTensor norm() {
  return FakeTensor{
      kNorm, DType::kBF16, {128}, test::float_bytes(DType::kBF16, std::vector<float>(128, 1.0f))};
}

// Two valid shards and their index; `weight_map` replaces the index's map.
void write_sharded(const fs::path& dir, const std::string& weight_map) {
  test::write_safetensors(dir / kShard1, {test::random_weight(kWeight, DType::kBF16, 2, 128, 1)});
  test::write_safetensors(dir / kShard2, {norm()});
  test::write_file(dir / kIndex,
                   "{\"metadata\": {\"total_size\": 768}, \"weight_map\": " + weight_map + "}");
}

std::string valid_weight_map() {
  return std::string("{\"") + kWeight + "\": \"" + kShard1 + "\", \"" + kNorm + "\": \"" + kShard2 +
         "\"}";
}

// Writes the checkpoint directory `dir` broken in the way `c` says and
// returns what the refusal must say.
Expected make_case(Corruption c, const fs::path& dir) {
  fs::create_directories(dir);
  test::write_file(dir / "config.json", "{\"model_type\": \"llama\"}\n");
  const fs::path single = dir / kSingle;
  switch (c) {
    case Corruption::kFileShorterThan8Bytes:
      test::write_file(single, std::string("\x05\x00\x00", 3));
      return {ErrorKind::kBadInput, kSingle, "", {"3 bytes", "too short", "8-byte header length"}};
    case Corruption::kHeaderLengthPastEnd: {
      std::string bytes(8, '\0');
      bytes[0] = static_cast<char>(0xE8);  // 1000
      bytes[1] = 0x03;
      test::write_file(single, bytes + "{\"a\":1}");
      return {ErrorKind::kBadInput, kSingle, "", {"header length 1000", "runs past the end"}};
    }
    case Corruption::kHeaderOverLimit: {
      std::string bytes(8, '\0');
      const std::uint64_t n = 100'000'001;
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
      test::write_file(single, bytes + "{}");
      return {ErrorKind::kBadInput, kSingle, "", {"100000001", "more than the limit of 100000000"}};
    }
    case Corruption::kHeaderNotUtf8:
      test::write_raw_safetensors(single, "{\"w\xff\":{}}      ", {});
      return {ErrorKind::kBadInput, kSingle, "", {"not valid UTF-8", "byte 3"}};
    case Corruption::kHeaderNotJson:
      test::write_raw_safetensors(single, "{\"w\": {\"dtype\": BF16}}", {});
      return {ErrorKind::kBadInput, kSingle, "", {"not valid JSON"}};
    case Corruption::kHeaderNotObject:
      test::write_raw_safetensors(single, "[1, 2, 3]", {});
      return {ErrorKind::kBadInput, kSingle, "", {"header is a JSON array", "expected an object"}};
    case Corruption::kHeaderPaddedWithNul: {
      // Valid JSON, then NUL padding: the reference reader (serde_json)
      // refuses anything but JSON whitespace after the object.
      const std::string header = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
      test::write_raw_safetensors(single, header + std::string(4, '\0'), zeros(4));
      return {ErrorKind::kBadInput,
              kSingle,
              "",
              {"NUL byte at byte " + std::to_string(header.size()) + " of the header",
               "only JSON whitespace"}};
    }
    case Corruption::kEntryMissingDtype:
      test::write_raw_safetensors(single, "{\"w\":{\"shape\":[2],\"data_offsets\":[0,4]}}",
                                  zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w", {"has no 'dtype'"}};
    case Corruption::kEntryMissingShape:
      test::write_raw_safetensors(single, "{\"w\":{\"dtype\":\"BF16\",\"data_offsets\":[0,4]}}",
                                  zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w", {"has no 'shape'"}};
    case Corruption::kEntryMissingDataOffsets:
      test::write_raw_safetensors(single, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2]}}", zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w", {"has no 'data_offsets'"}};
    case Corruption::kEntryKeyRepeated:
      test::write_raw_safetensors(
          single,
          "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",
          zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w", {"key 'dtype' appears twice"}};
    case Corruption::kUnknownDtype:
      test::write_raw_safetensors(single, "{" + entry("w", "BF17", "[2]", 0, 4) + "}", zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w", {"unknown dtype", "BF17"}};
    case Corruption::kDtypeNestedDeeply: {
      // Printing such a value recursively overflowed the stack (a crash that
      // left no message); it is refused where it appears.
      const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
      test::write_raw_safetensors(
          single, "{\"w\":{\"dtype\":" + deep + ",\"shape\":[4],\"data_offsets\":[0,4]}}",
          zeros(4));
      return {
          ErrorKind::kBadInput, kSingle, "w", {"dtype is a JSON array", "expected a string tag"}};
    }
    // The reference reader (safetensors 0.8.0, serde_json) refuses a byte
    // order mark before the header and reads -0 as the float -0.0, which no
    // dimension or offset accepts: "expected value at line 1 column 1",
    // "invalid type: floating point `-0.0`, expected usize".
    case Corruption::kHeaderStartsWithBom:
      test::write_raw_safetensors(
          single,
          "\xEF\xBB\xBF{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
          zeros(4));
      return {ErrorKind::kBadInput, kSingle, "", {"header starts with a UTF-8 byte order mark",
                                                  "section 1 of the format spec"}};
    case Corruption::kNegativeZeroDimension:
      test::write_raw_safetensors(single, "{\"w\":{\"dtype\":\"U8\",\"shape\":[-0],"
                                          "\"data_offsets\":[0,0]}}",
                                  {});
      return {ErrorKind::kBadInput, kSingle, "w",
              {"shape dimension 0 is -0", "negative zero", "section 1 of the format spec"}};
    case Corruption::kNegativeZeroOffset:
      test::write_raw_safetensors(single, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],"
                                          "\"data_offsets\":[-0,4]}}",
                                  zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w",
              {"data_offsets value 0 is -0", "negative zero", "section 1 of the format spec"}};
    case Corruption::kNegativeDimension:
      test::write_raw_safetensors(single, "{" + entry("w", "BF16", "[2,-2]", 0, 8) + "}", zeros(8));
      return {
          ErrorKind::kBadInput, kSingle, "w", {"shape dimension 1 is -2", "cannot be negative"}};
    case Corruption::kFractionalDimension:
      test::write_raw_safetensors(single, "{" + entry("w", "BF16", "[2.5]", 0, 4) + "}", zeros(4));
      return {
          ErrorKind::kBadInput, kSingle, "w", {"shape dimension 0 is 2.5", "must be an integer"}};
    case Corruption::kNonNumericDimension:
      test::write_raw_safetensors(single, "{" + entry("w", "BF16", "[\"2\"]", 0, 4) + "}",
                                  zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w", {"shape dimension 0 is \"2\"", "non-numeric"}};
    case Corruption::kDimensionBeyond64Bits:
      test::write_raw_safetensors(
          single, "{" + entry("w", "U8", "[18446744073709551616]", 0, 1) + "}", zeros(1));
      return {
          ErrorKind::kBadInput, kSingle, "w", {"18446744073709551616", "does not fit in 64 bits"}};
    case Corruption::kShapeOverflows64Bits:
      test::write_raw_safetensors(
          single, "{" + entry("w", "U8", "[4294967296,4294967296,2]", 0, 1) + "}", zeros(1));
      return {ErrorKind::kBadInput,
              kSingle,
              "w",
              {"[4294967296, 4294967296, 2]", "more than 2^64 elements"}};
    case Corruption::kByteSizeMismatch:
      test::write_raw_safetensors(single, "{" + entry("w", "BF16", "[5,10]", 0, 99) + "}",
                                  zeros(99));
      return {ErrorKind::kBadInput,
              kSingle,
              "w",
              {"data_offsets [0, 99] hold 99 bytes, expected 100 for BF16 [5, 10]"}};
    case Corruption::kOffsetsOutOfOrder:
      test::write_raw_safetensors(single, "{" + entry("w", "U8", "[4]", 4, 0) + "}", zeros(4));
      return {ErrorKind::kBadInput, kSingle, "w", {"data_offsets [4, 0]", "out of order"}};
    case Corruption::kOffsetsOverlap:
      test::write_raw_safetensors(
          single, "{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 2, 6) + "}",
          zeros(6));
      return {ErrorKind::kBadInput, kSingle, "b", {"data_offsets [2, 6]", "overlap tensor 'a'"}};
    case Corruption::kOffsetsLeaveGap:
      test::write_raw_safetensors(
          single, "{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 6, 10) + "}",
          zeros(10));
      return {ErrorKind::kBadInput, kSingle, "b", {"leave a gap of 2 bytes after tensor 'a'"}};
    case Corruption::kOffsetsPastEnd:
      test::write_raw_safetensors(
          single, "{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 4, 8) + "}",
          zeros(6));
      return {ErrorKind::kBadInput,
              kSingle,
              "b",
              {"data_offsets [4, 8]", "run past the end of the data buffer (6 bytes)",
               "the file is shorter than its header says (truncated?"}};
    case Corruption::kDataEndsBeforeFile:
      test::write_raw_safetensors(single, "{" + entry("a", "U8", "[4]", 0, 4) + "}", zeros(6));
      return {ErrorKind::kBadInput,
              kSingle,
              "",
              {"ends at byte 4", "2 more bytes", "must end at the end of the file"}};
    case Corruption::kDuplicateTensorInHeader:
      test::write_raw_safetensors(
          single, "{" + entry("w", "U8", "[4]", 0, 4) + "," + entry("w", "U8", "[4]", 4, 8) + "}",
          zeros(8));
      return {ErrorKind::kBadInput, kSingle, "w", {"appears twice in the header"}};
    case Corruption::kDuplicateTensorAcrossShards:
      test::write_safetensors(dir / kShard1,
                              {test::random_weight(kWeight, DType::kBF16, 2, 128, 1), norm()});
      test::write_safetensors(dir / kShard2, {norm()});
      test::write_file(dir / kIndex, "{\"weight_map\": " + valid_weight_map() + "}");
      return {ErrorKind::kBadInput,
              kShard2,
              kNorm,
              {"is also in " + std::string(kShard1), "one shard only"}};
    case Corruption::kMetadataNotObject:
      test::write_raw_safetensors(
          single, "{\"__metadata__\":\"pt\"," + entry("a", "U8", "[4]", 0, 4) + "}", zeros(4));
      return {ErrorKind::kBadInput,
              kSingle,
              "",
              {"__metadata__ is a JSON string (\"pt\")", "expected an object of strings"}};
    case Corruption::kMetadataValueNotString:
      test::write_raw_safetensors(
          single, "{\"__metadata__\":{\"format\":1}," + entry("a", "U8", "[4]", 0, 4) + "}",
          zeros(4));
      return {ErrorKind::kBadInput,
              kSingle,
              "",
              {"__metadata__ value of \"format\" is a JSON number (1)", "expected a string"}};
    case Corruption::kIndexNamesMissingFile:
      write_sharded(dir, std::string("{\"") + kWeight + "\": \"" + kShard1 + "\", \"" + kNorm +
                             "\": \"model-00003-of-00003.safetensors\"}");
      return {ErrorKind::kBadInput,
              kIndex,
              kNorm,
              {"model-00003-of-00003.safetensors", "does not exist"}};
    case Corruption::kIndexNamesParentDirectory:
      // The file exists beside the checkpoint: it must not be read.
      test::write_safetensors(dir.parent_path() / "outside.safetensors", {norm()});
      write_sharded(dir, std::string("{\"") + kWeight + "\": \"" + kShard1 + "\", \"" + kNorm +
                             "\": \"../outside.safetensors\"}");
      return {ErrorKind::kBadInput,
              kIndex,
              kNorm,
              {"../outside.safetensors", "not a plain file name inside the checkpoint directory"}};
    case Corruption::kIndexNamesAbsolutePath: {
      const fs::path outside = dir.parent_path() / "outside.safetensors";
      test::write_safetensors(outside, {norm()});
      write_sharded(dir, std::string("{\"") + kWeight + "\": \"" + kShard1 + "\", \"" + kNorm +
                             "\": \"" + outside.string() + "\"}");
      return {ErrorKind::kBadInput, kIndex, kNorm, {outside.string(), "not a plain file name"}};
    }
    case Corruption::kIndexNamesSubdirectory:
      fs::create_directories(dir / "sub");
      test::write_safetensors(dir / "sub" / kShard2, {norm()});
      write_sharded(dir, std::string("{\"") + kWeight + "\": \"" + kShard1 + "\", \"" + kNorm +
                             "\": \"sub/" + kShard2 + "\"}");
      return {ErrorKind::kBadInput,
              kIndex,
              kNorm,
              {"sub/" + std::string(kShard2), "not a plain file name"}};
    case Corruption::kIndexTensorNotInFile:
      write_sharded(dir, std::string("{\"") + kWeight + "\": \"" + kShard1 + "\", \"" + kNorm +
                             "\": \"" + kShard2 + "\", \"lm_head.weight\": \"" + kShard2 + "\"}");
      return {ErrorKind::kBadInput,
              kIndex,
              "lm_head.weight",
              {"in '" + std::string(kShard2) + "'", "does not hold it"}};
    case Corruption::kIndexRepeatsTensor:
      write_sharded(dir, std::string("{\"") + kWeight + "\": \"" + kShard1 + "\", \"" + kNorm +
                             "\": \"" + kShard2 + "\", \"" + kWeight + "\": \"" + kShard2 + "\"}");
      return {ErrorKind::kBadInput, kIndex, kWeight, {"appears twice in 'weight_map'"}};
    case Corruption::kNanInWeight:
      test::write_safetensors(
          single, {weight_with(1, 77, std::numeric_limits<float>::quiet_NaN()), norm()});
      return {ErrorKind::kBadInput, kSingle, kWeight, {"element [1, 77] is nan", "must be finite"}};
    case Corruption::kPositiveInfinityInWeight:
      test::write_safetensors(single,
                              {weight_with(0, 5, std::numeric_limits<float>::infinity()), norm()});
      return {ErrorKind::kBadInput, kSingle, kWeight, {"element [0, 5] is inf", "must be finite"}};
    case Corruption::kNegativeInfinityInWeight:
      test::write_safetensors(
          single, {weight_with(1, 127, -std::numeric_limits<float>::infinity()), norm()});
      return {
          ErrorKind::kBadInput, kSingle, kWeight, {"element [1, 127] is -inf", "must be finite"}};
    case Corruption::kWeightRowsTooLarge: {
      // One row of 16M + 128 BF16 columns, in a sparse file: the header
      // alone must not make ctquant allocate it.
      const std::uint64_t cols = (16u << 20) + 128;
      test::write_raw_safetensors(
          single,
          "{" + entry(kWeight, "BF16", "[1," + std::to_string(cols) + "]", 0, cols * 2) + "}", {});
      fs::resize_file(single, fs::file_size(single) + cols * 2);
      return {ErrorKind::kBadInput,
              kSingle,
              kWeight,
              {"rows of 33554688 bytes", "more than the limit of 33554432"}};
    }
    case Corruption::kConfigNotJson:
      test::write_safetensors(single, {norm()});
      test::write_file(dir / "config.json", "{\"model_type\": \"llama\",");
      return {ErrorKind::kBadInput, "config.json", "", {"not valid JSON"}};
    case Corruption::kConfigNestedTooDeep:
      test::write_safetensors(single, {norm()});
      test::write_file(dir / "config.json",
                       "{\"a\": " + std::string(200'000, '[') + std::string(200'000, ']') + "}");
      return {ErrorKind::kBadInput, "config.json", "", {"nests deeper than 128 levels"}};
    case Corruption::kConfigQuantizationNotConverted:
      test::write_safetensors(single, {norm()});
      test::write_file(dir / "config.json",
                       "{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": "
                       "\"gptq\", \"bits\": 4}}");
      return {
          ErrorKind::kBadInput, "config.json", "", {"quant_method \"gptq\"", "is not converted"}};
    case Corruption::kCount:
      break;
  }
  throw std::logic_error("no such corruption");
}

std::vector<Corruption> all_corruptions() {
  std::vector<Corruption> all;
  for (int i = 0; i < static_cast<int>(Corruption::kCount); ++i)
    all.push_back(static_cast<Corruption>(i));
  return all;
}

// The message names the file, the tensor and the rule.
void expect_message(const std::string& message, const Expected& expected) {
  EXPECT_NE(message.find(expected.file), std::string::npos)
      << "file '" << expected.file << "' not named in: " << message;
  if (!expected.tensor.empty()) {
    EXPECT_NE(message.find("'" + expected.tensor + "'"), std::string::npos)
        << "tensor '" << expected.tensor << "' not named in: " << message;
  }
  for (const std::string& words : expected.rule) {
    EXPECT_NE(message.find(words), std::string::npos)
        << "rule words \"" << words << "\" not in: " << message;
  }
}

// Nothing was left beside OUTPUT: no OUTPUT, no temporary directory.
void expect_no_output(const fs::path& output) {
  EXPECT_FALSE(fs::exists(fs::symlink_status(output))) << output;
  EXPECT_TRUE(test::temp_leftovers(output.parent_path()).empty())
      << "a temporary output directory was left in " << output.parent_path();
}

class BadInput : public ::testing::TestWithParam<Corruption> {};

TEST_P(BadInput, LibraryRefusesIt) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  const fs::path output = tmp / "out";
  const Expected expected = make_case(GetParam(), input);

  const QuantizeOptions options = test::test_options(input, output);
  try {
    quantize(options);
    ADD_FAILURE() << "quantize() accepted " << corruption_name(GetParam());
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), expected.kind) << e.what();
    expect_message(e.what(), expected);
  }
  expect_no_output(output);
}

TEST_P(BadInput, BinaryRefusesItWithExitStatus1) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  const fs::path output = tmp / "out";
  const Expected expected = make_case(GetParam(), input);

  const test::CommandResult result =
      test::run_ctquant({"quantize", input.string(), output.string()});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("ctquant: error: "), std::string::npos) << result.err;
  expect_message(result.err, expected);
  EXPECT_EQ(result.out, "");
  expect_no_output(output);
}

INSTANTIATE_TEST_SUITE_P(EveryCase, BadInput, ::testing::ValuesIn(all_corruptions()),
                         [](const ::testing::TestParamInfo<Corruption>& param_info) {
                           return std::string(corruption_name(param_info.param));
                         });

// The reference reader treats `"__metadata__": null` as no metadata (MLX
// writes it): it is not bad input.
TEST(SafetensorsReader, AcceptsNullMetadata) {
  const std::string json =
      "{\"__metadata__\":null,\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
  const SafetensorsHeader header = parse_header(json, 8 + json.size() + 4, "x.safetensors");
  EXPECT_FALSE(header.has_metadata);
  ASSERT_EQ(header.tensors.size(), 1u);
  EXPECT_EQ(header.tensors[0].name, "a");
  EXPECT_EQ(header.tensors[0].byte_size(), 4u);
}

// serde_json, which the reference reader parses headers with, accepts JSON
// whitespace around the object: space, tab, newline, carriage return.
TEST(SafetensorsReader, AcceptsJsonWhitespacePadding) {
  TempDir tmp;
  const std::string header = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
  test::write_raw_safetensors(tmp / "a.safetensors", header + " \t\r\n  ", zeros(4));
  const SafetensorsHeader h = read_header(tmp / "a.safetensors", "a.safetensors");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].name, "w");
}

// Keys an entry does not define are skipped, as the reference reader skips
// them, however they are nested (safetensors 0.8.0's safe_open reads such a
// file: its TensorInfo does not deny unknown fields).
TEST(SafetensorsReader, IgnoresUnknownEntryKeys) {
  const std::string json =
      "{\"a\":{\"dtype\":\"U8\",\"extra\":[[{\"x\":[1,2]}],null],\"shape\":[2,2],"
      "\"data_offsets\":[0,4]}}";
  const SafetensorsHeader header = parse_header(json, 8 + json.size() + 4, "x.safetensors");
  ASSERT_EQ(header.tensors.size(), 1u);
  EXPECT_EQ(header.tensors[0].shape, (std::vector<std::uint64_t>{2, 2}));
}

// A shape with a zero dimension has no elements, whatever the others are.
TEST(SafetensorsReader, AcceptsZeroDimensionWithHugeOthers) {
  const std::string json =
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[0,18446744073709551615,3],\"data_offsets\":[0,0]}}";
  const SafetensorsHeader header = parse_header(json, 8 + json.size(), "x.safetensors");
  ASSERT_EQ(header.tensors.size(), 1u);
  EXPECT_EQ(header.tensors[0].numel(), 0u);
  EXPECT_EQ(header.tensors[0].byte_size(), 0u);
}

// Several problems of the index phase are reported together.
TEST(CheckpointReader, ReportsEveryIndexProblemAtOnce) {
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  fs::create_directories(dir);
  write_sharded(dir, std::string("{\"") + kWeight + "\": \"../a.safetensors\", \"" + kNorm +
                         "\": \"missing.safetensors\"}");
  try {
    open_checkpoint(dir);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    const std::string message = e.what();
    EXPECT_NE(message.find("'" + std::string(kWeight) + "' names file '../a.safetensors'"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("weight_map names file 'missing.safetensors' for 1 tensor(s) (first '" +
                           std::string(kNorm) + "'), which does not exist"),
              std::string::npos)
        << message;
  }
}

// A pattern that hits PCRE2's match limit on a long tensor name must not
// count as "does not match" (the module would be quantized although the user
// meant to ignore it).
TEST(ModuleMatcher, RefusesToGuessWhenAMatchCannotBeDecided) {
  const ModuleMatcher ignore({"re:(a|aa)+$"}, ModuleMatcher::Role::kIgnore);
  const std::string module = std::string(60, 'a') + "b";
  try {
    ignore.entry_matches(0, module);
    FAIL() << "the match limit was not reached or was taken as an answer";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("--ignore 're:(a|aa)+$': cannot be matched"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(ignore.entry_matches(0, "aaaa"));
  EXPECT_FALSE(ignore.entry_matches(0, "b"));
}

// weight_block_size comes from config.json: a block taller than the weight
// (up to 2^64 - 1 rows) is one block row, exactly as a block of the weight's
// own height; the grid arithmetic must not wrap.
TEST(CheckedArithmetic, HugeFp8BlockSizeIsOneBlockRow) {
  TempDir tmp;
  const std::uint64_t rows = 4;
  const std::uint64_t cols = 128;
  const std::vector<FakeTensor> tensors = {
      FakeTensor{kWeight,
                 DType::kF8_E4M3,
                 {rows, cols},
                 test::code_bytes(test::random_codes(DType::kF8_E4M3, rows * cols, 5))},
      FakeTensor{std::string(kWeight) + "_scale_inv",
                 DType::kF32,
                 {1, 1},
                 test::float_bytes(DType::kF32, {0.5f})}};
  test::write_checkpoint(tmp / "huge", tensors,
                         test::block_config(std::numeric_limits<std::uint64_t>::max(), cols));
  test::write_checkpoint(tmp / "exact", tensors, test::block_config(rows, cols));
  quantize(test::test_options(tmp / "huge", tmp / "huge-out"));
  quantize(test::test_options(tmp / "exact", tmp / "exact-out"));
  EXPECT_EQ(test::read_file(tmp / "huge-out" / kSingle),
            test::read_file(tmp / "exact-out" / kSingle));
}

}  // namespace
}  // namespace ctquant
