// Golden end-to-end runs: every case of tests/golden/cases.json is quantized
// with the case's scheme (or QuantizationConfig) and ignore list, and the
// output must equal tests/golden/<case>/expected/ tensor by tensor (section 5
// of the format spec; tests/golden/README.md says what must match). Adding a
// case is adding its folder and its cases.json entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Cases whose scheme has no family in the registry are skipped, naming it.
#define SKIP_UNLESS_SUPPORTED(c)                                     \
  do {                                                               \
    try {                                                            \
      check_plan_options(plan_of(c));                                \
    } catch (const Error& e) {                                       \
      GTEST_SKIP() << (c).name << ": not in the registry: " << e.what(); \
    }                                                                \
  } while (0)

QuantizeSummary run_library(const GoldenCase& c, const fs::path& output, unsigned threads,
                            std::uint64_t chunk_bytes = 4u << 20,
                            std::uint64_t fp8_band_bytes = QuantizeOptions{}.fp8_band_bytes) {
  QuantizeOptions options = test_options(input_of(c), output);
  options.plan = plan_of(c);
  options.threads = threads;
  options.chunk_bytes = chunk_bytes;
  options.fp8_band_bytes = fp8_band_bytes;
  options.allow_unloadable = unloadable_in_vllm(c.name);
  return quantize(options);
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, LibraryOutputEqualsExpected) {
  const GoldenCase c = find_case(GetParam());
  SKIP_UNLESS_SUPPORTED(c);
  TempDir tmp;
  const auto input_before = snapshot_files(input_of(c));
  const QuantizeSummary summary = run_library(c, tmp / "out", 2);
  EXPECT_EQ(diff_golden(tmp / "out", expected_of(c), c.by_library), "");
  EXPECT_EQ(snapshot_files(input_of(c)), input_before) << "the input was modified";
  EXPECT_GT(summary.tensors_quantized, 0u);
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

// Every output tensor starts at a multiple of its element size, laid out as
// the safetensors writer lays it out (dtypes in its order, largest first,
// then names: section 5 of the format spec). For the cases the library
// wrote, each shard's data buffer is then the expected file's, byte for
// byte (the headers differ only in __metadata__).
TEST_P(Golden, OutputTensorsAreAlignedInTheWritersOrder) {
  const GoldenCase c = find_case(GetParam());
  SKIP_UNLESS_SUPPORTED(c);
  TempDir tmp;
  run_library(c, tmp / "out", 2);
  for (const auto& item : fs::directory_iterator(tmp / "out")) {
    if (item.path().extension() != ".safetensors") continue;
    const std::string name = item.path().filename().string();
    SCOPED_TRACE(name);
    const SafetensorsHeader h = read_header(item.path(), name);
    for (std::size_t i = 0; i < h.tensors.size(); ++i) {
      const TensorEntry& t = h.tensors[i];
      const std::uint64_t item_bytes = std::max(1, dtype_bits(t.dtype) / 8);
      EXPECT_EQ((h.data_start + t.begin) % item_bytes, 0u) << t.name << " " << dtype_tag(t.dtype);
      if (i == 0) continue;
      const TensorEntry& p = h.tensors[i - 1];
      const int po = dtype_writer_order(p.dtype);
      const int to = dtype_writer_order(t.dtype);
      EXPECT_TRUE(po > to || (po == to && p.name < t.name)) << p.name << " before " << t.name;
    }
    const fs::path expected = expected_of(c) / name;
    if (!c.by_library || !fs::exists(expected)) continue;
    const SafetensorsHeader e = read_header(expected, name);
    std::vector<std::string> ours;
    std::vector<std::string> theirs;
    for (const TensorEntry& t : h.tensors) ours.push_back(t.name);
    for (const TensorEntry& t : e.tensors) theirs.push_back(t.name);
    if (ours != theirs) {
      // Another set of tensors in this shard (fused partners moved): the
      // tensors are compared by LibraryOutputEqualsExpected.
      std::sort(ours.begin(), ours.end());
      std::sort(theirs.begin(), theirs.end());
      EXPECT_NE(ours, theirs) << "same tensors, another order than the library's";
      continue;
    }
    const std::string a = read_file(item.path());
    const std::string b = read_file(expected);
    EXPECT_TRUE(a.compare(h.data_start, std::string::npos, b, e.data_start, std::string::npos) == 0)
        << "the data buffer differs from the library's";
  }
}

// The config.json written carries the case's groups and ignore list (a
// check that the case was run with the parameters cases.json gives,
// independent of the fixture), and equals the expected one as a JSON value.
TEST_P(Golden, ConfigCarriesTheCaseScheme) {
  const GoldenCase c = find_case(GetParam());
  SKIP_UNLESS_SUPPORTED(c);
  TempDir tmp;
  run_library(c, tmp / "out", 1);
  const json config = read_json(tmp / "out" / "config.json");
  const json& qc = config.at("quantization_config");
  const PlanOptions plan = plan_of(c);
  EXPECT_EQ(qc.at("config_groups").size(), plan.groups.size());
  for (const SchemeGroup& g : plan.groups) {
    const json* group = c.by_library ? &qc.at("config_groups").at(g.name)
                                     : &qc.at("config_groups").begin().value();
    EXPECT_EQ(group->at("weights"), quant_args_json(g.weights)) << g.name;
    EXPECT_EQ(group->at("targets"), json(g.targets)) << g.name;
  }
  EXPECT_EQ(qc.at("ignore"), json(plan.ignore));
  EXPECT_EQ(diff_golden(tmp / "out", expected_of(c), c.by_library), "");
}

// Output bytes never depend on the thread count or on how rows are chunked:
// 1, 2 and 8 threads with the default chunk, and 8 threads with 1000-byte
// chunks (every quantized weight split into many row chunks); nor, for FP8
// inputs, on how a chunk is cut into dequantized bands (one row-alignment
// unit per band).
TEST_P(Golden, SameBytesForEveryThreadCountAndChunkSize) {
  const GoldenCase c = find_case(GetParam());
  SKIP_UNLESS_SUPPORTED(c);
  TempDir tmp;
  run_library(c, tmp / "t1", 1);
  ASSERT_EQ(diff_golden(tmp / "t1", expected_of(c), c.by_library), "");
  run_library(c, tmp / "t2", 2);
  EXPECT_EQ(diff_bytes(tmp / "t2", tmp / "t1"), "");
  run_library(c, tmp / "t8", 8);
  EXPECT_EQ(diff_bytes(tmp / "t8", tmp / "t1"), "");
  run_library(c, tmp / "t8-small-chunks", 8, 1000);
  EXPECT_EQ(diff_bytes(tmp / "t8-small-chunks", tmp / "t1"), "");
  run_library(c, tmp / "t1-small-chunks", 1, 1000);
  EXPECT_EQ(diff_bytes(tmp / "t1-small-chunks", tmp / "t1"), "");
  run_library(c, tmp / "t2-small-bands", 2, 4u << 20, 1);
  EXPECT_EQ(diff_bytes(tmp / "t2-small-bands", tmp / "t1"), "");
}

// The CLI flags a user would type for the case, on `threads` worker threads.
std::vector<std::string> binary_args(const GoldenCase& c, const fs::path& tmp,
                                     const std::string& threads) {
  std::vector<std::string> args{"quantize", input_of(c).string(), (tmp / "out").string(),
                                "--threads", threads};
  if (c.scheme == "config") {
    write_file(tmp / "config.json", c.config.dump());
    args.insert(args.end(), {"--quantization-config", (tmp / "config.json").string()});
  } else {
    args.insert(args.end(), {"--scheme", c.scheme});
    if (c.group_size) args.insert(args.end(), {"--group-size", std::to_string(*c.group_size)});
  }
  for (const std::string& entry : c.ignore) {
    args.push_back("--ignore");
    args.push_back(entry);
  }
  if (unloadable_in_vllm(c.name)) args.push_back("--allow-unloadable");
  return args;
}

// The real binary with binary_args(), run with options.
void expect_binary_output_equals_expected(const GoldenCase& c, const std::string& threads,
                                          const RunOptions& options = {}) {
  TempDir tmp;
  const CommandResult r = run_ctquant(binary_args(c, tmp.path(), threads), options);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  if (c.name.starts_with("fp8-")) {
    EXPECT_NE(r.err.find("FP8 weights are dequantized to BF16 exactly"), std::string::npos)
        << r.err;
  }
  EXPECT_EQ(diff_golden(tmp / "out", expected_of(c), c.by_library), "");
}

TEST_P(Golden, BinaryOutputEqualsExpected) {
  const GoldenCase c = find_case(GetParam());
  SKIP_UNLESS_SUPPORTED(c);
  expect_binary_output_equals_expected(c, "3");
}

// --threads 1: the whole job on the main thread, the manifest's hashing
// included, no thread created: run where creating a thread fails (a seccomp
// filter, where filters_threads_supported(); see
// GoldenThreads.BinaryTwoThreadsFailWhereThreadsCannotBeCreated), and where
// no second thread is ever scheduled: this is the golden test the AArch64
// build runs under qemu-user (tests/CMakeLists.txt).
TEST_P(Golden, BinaryOneThreadOutputEqualsExpected) {
  const GoldenCase c = find_case(GetParam());
  SKIP_UNLESS_SUPPORTED(c);
  RunOptions options;
  options.forbid_threads = filters_threads_supported();
  expect_binary_output_equals_expected(c, "1", options);
}

// The filter that BinaryOneThreadOutputEqualsExpected runs under stops a run
// that does create threads, with a clear error: what makes that test prove
// something.
TEST(GoldenThreads, BinaryTwoThreadsFailWhereThreadsCannotBeCreated) {
  const GoldenCase c = find_case("dflash-bf16-sharded");
  if (!filters_threads_supported()) GTEST_SKIP() << "no seccomp filter here";
  TempDir tmp;
  RunOptions options;
  options.forbid_threads = true;
  const CommandResult r = run_ctquant(binary_args(c, tmp.path(), "2"), options);
  EXPECT_EQ(r.exit_code, 1);
  expect_message(r.err, {"cannot start worker thread 1 of 2", "--threads 1"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// Every case, whatever its scheme: one code byte changed in the expected
// output is found by verify against the expected fixture (the tensor named)
// and by verify --against-source (the codes are no longer the RTN codes of
// INPUT). A new scheme row is checked here by its fixture alone.
TEST_P(Golden, FlippedCodeIsFoundByBothVerifyModes) {
  const GoldenCase c = find_case(GetParam());
  SKIP_UNLESS_SUPPORTED(c);
  TempDir tmp;
  const fs::path out = tmp / "out";
  copy_dir(expected_of(c), out);
  // The first code tensor: packed int or FP4 codes, or one code byte per
  // weight (FP8, MXFP8, int8).
  fs::path file;
  std::string tensor;
  std::uint64_t at = 0;
  DType dtype = DType::kU8;
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  for (const fs::path& shard : shards) {
    const SafetensorsFile f(shard, shard.filename().string());
    for (const TensorEntry& t : f.header().tensors) {
      const bool packed = t.name.ends_with(".weight_packed");
      const bool byte_codes = t.name.ends_with(".weight") &&
                              (t.dtype == DType::kF8_E4M3 || t.dtype == DType::kI8);
      if (tensor.empty() && (packed || byte_codes) && t.byte_size() > 0) {
        file = shard;
        tensor = t.name;
        dtype = t.dtype;
        at = f.header().data_start + t.begin + t.byte_size() / 2;
      }
    }
  }
  ASSERT_FALSE(tensor.empty()) << c.name << ": no code tensor in " << expected_of(c);
  // A mask that keeps an E4M3 code finite (0x7F and 0xFF are NaN).
  std::uint8_t mask = 0x01;
  if (dtype == DType::kF8_E4M3) {
    std::ifstream in(file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(at));
    char byte = 0;
    in.read(&byte, 1);
    if (((static_cast<std::uint8_t>(byte) ^ mask) & 0x7F) == 0x7F) mask = 0x02;
  }
  const VerifyReport before = verify_against_source(out, input_of(c), {});
  const VerifyReport golden_before = verify_checkpoints(out, expected_of(c), {});
  {
    std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
    io.seekg(static_cast<std::streamoff>(at));
    char byte = 0;
    io.read(&byte, 1);
    byte = static_cast<char>(static_cast<std::uint8_t>(byte) ^ mask);
    io.seekp(static_cast<std::streamoff>(at));
    io.write(&byte, 1);
    ASSERT_TRUE(io) << file;
  }
  const VerifyReport golden = verify_checkpoints(out, expected_of(c), {});
  const auto names = [](const VerifyReport& r) {
    std::vector<std::string> tensors;
    for (const VerifyItem& d : r.differences) tensors.push_back(d.tensor);
    return tensors;
  };
  // (fp8-block's fixture differs from itself in two loadability checks:
  // its ignore list splits q/k/v; every other fixture in none.)
  std::vector<std::string> expected_names = names(golden_before);
  expected_names.push_back(tensor);
  std::vector<std::string> golden_names = names(golden);
  std::sort(expected_names.begin(), expected_names.end());
  std::sort(golden_names.begin(), golden_names.end());
  EXPECT_EQ(golden_names, expected_names) << c.name;
  const VerifyReport after = verify_against_source(out, input_of(c), {});
  EXPECT_EQ(after.differences.size(), before.differences.size() + 1) << c.name << ": " << tensor;
  const std::vector<std::string> found = names(after);
  EXPECT_NE(std::find(found.begin(), found.end(), tensor), found.end()) << c.name << ": " << tensor;
}

INSTANTIATE_TEST_SUITE_P(Cases, Golden, ::testing::ValuesIn(case_names()),
                         [](const auto& param) { return case_test_name(param.param); });

// llama-f16-nvfp4a16 has one fused set under the F16 overflow rule (q/k/v:
// 2688 / max |w| overflows F16, the global scale becomes 1.0) and one not
// (gate/up): the run writes the reference's bytes and warns for exactly the
// first set, naming its modules; BF16 input never overflows.
TEST(GoldenCases, Nvfp4GlobalScaleOverflowOfF16IsWarnedForItsSetOnly) {
  TempDir tmp;
  const QuantizeSummary f16 = run_library(find_case("llama-f16-nvfp4a16"), tmp.path() / "f16", 2);
  ASSERT_EQ(f16.execute.warnings.size(), 1u);
  const std::string& w = f16.execute.warnings[0];
  EXPECT_EQ(w.rfind("modules 'model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj', "
                    "'model.layers.0.self_attn.v_proj': max |w| ",
                    0),
            0u)
      << w;
  EXPECT_NE(w.find("overflow F16"), std::string::npos) << w;
  EXPECT_EQ(w.find("gate_proj"), std::string::npos) << w;
  const QuantizeSummary bf16 =
      run_library(find_case("llama-bf16-nvfp4a16"), tmp.path() / "bf16", 2);
  EXPECT_TRUE(bf16.execute.warnings.empty());
}

// Without --allow-unloadable the fp8-block ignore list is stopped by lint L3
// before anything is written.
TEST(GoldenCases, Fp8BlockIgnoreListIsStoppedByLint) {
  const GoldenCase c = find_case("fp8-block");
  TempDir tmp;
  std::vector<std::string> args{"quantize", input_of(c).string(), (tmp / "out").string()};
  for (const std::string& entry : c.ignore) {
    args.push_back("--ignore");
    args.push_back(entry);
  }
  const CommandResult r = run_ctquant(args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("L3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.layers.0.self_attn.v_proj"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--allow-unloadable"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

// odd-bf16-fp8-block quantizes q/k/v_proj and gate/up_proj whose rows are
// not multiples of 128: vLLM would refuse the merged layers, lint L5 stops
// the run (the case's runs pass --allow-unloadable).
TEST(GoldenCases, OddFp8BlockShapesAreStoppedByLint) {
  const GoldenCase c = find_case("odd-bf16-fp8-block");
  TempDir tmp;
  std::vector<std::string> args{"quantize", input_of(c).string(), (tmp / "out").string(),
                                "--scheme", "FP8_BLOCK"};
  for (const std::string& entry : c.ignore) {
    args.push_back("--ignore");
    args.push_back(entry);
  }
  const CommandResult r = run_ctquant(args);
  EXPECT_EQ(r.exit_code, 1);
  expect_message(r.err, {"L5 error", "out_features 320 per shard is not a multiple of the FP8 "
                         "block height 128", "model.layers.0.self_attn.q_proj.weight",
                         "model.layers.0.mlp.gate_proj.weight", "--allow-unloadable"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

// The comparison itself finds a difference: one flipped byte in a quantized
// tensor is reported with the tensor name and the byte offset.
TEST(GoldenCompare, ReportsFirstDifferingTensorAndByte) {
  const GoldenCase c = find_case("llama-bf16");
  TempDir tmp;
  copy_dir(expected_of(c), tmp / "copy");
  const fs::path shard = tmp / "copy" / "model.safetensors";
  const SafetensorsHeader header = read_header(shard, "model.safetensors");
  const TensorEntry* packed = header.find("model.layers.0.mlp.down_proj.weight_packed");
  ASSERT_NE(packed, nullptr);
  std::string bytes = read_file(shard);
  bytes[header.data_start + packed->begin + 5] ^= 0x01;
  write_file(shard, bytes);
  const std::string diff = diff_golden(tmp / "copy", expected_of(c), c.by_library);
  EXPECT_NE(diff.find("'model.layers.0.mlp.down_proj.weight_packed'"), std::string::npos) << diff;
  EXPECT_NE(diff.find("byte 5 "), std::string::npos) << diff;
  EXPECT_EQ(diff_golden(expected_of(c), expected_of(c), c.by_library), "");
}

}  // namespace
}  // namespace ctquant::test
