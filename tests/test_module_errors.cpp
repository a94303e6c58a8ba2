// The weight error of every module end to end: computed by quantize while
// it writes (run report, summary), by verify --against-source and by
// inspect --errors, with the same bits on every golden case; the same for
// every thread count, chunk size and FP8 band; exact on a hand-computed
// checkpoint; and the CLI's summary lines, inspect --errors and its usage
// errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/job/quantize.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/errors.hpp"
#include "ctquant/verify/verify.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

QuantizeSummary quantize_case(const GoldenCase& c, const fs::path& output, unsigned threads,
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

// Module name -> figures.
std::map<std::string, QuantError> by_name(const QuantizePlan& plan,
                                          const std::vector<ModuleError>& errors) {
  std::map<std::string, QuantError> out;
  for (const ModuleError& e : errors) out[plan.modules.at(e.module).name] = e.error;
  return out;
}

class ModuleErrors : public ::testing::TestWithParam<std::string> {};

TEST_P(ModuleErrors, SameFiguresForEveryThreadCountChunkSizeAndBand) {
  const GoldenCase c = find_case(GetParam());
  TempDir tmp;
  const QuantizeSummary one = quantize_case(c, tmp / "t1", 1);
  const auto want = by_name(one.plan, one.execute.module_errors);
  std::size_t quantized = 0;
  for (const PlannedModule& m : one.plan.modules) {
    if (m.kind == PlannedModule::Kind::kQuantize) ++quantized;
  }
  ASSERT_EQ(want.size(), quantized);
  for (const auto& [name, e] : want) {
    EXPECT_GT(e.rel_frobenius(), 0.0) << name;
    EXPECT_GT(e.max_abs_error(), 0.0) << name;
  }
  struct Run {
    const char* name;
    unsigned threads;
    std::uint64_t chunk;
    std::uint64_t band;
  };
  for (const Run& r : {Run{"t2", 2, 4u << 20, 256u << 10}, Run{"t8", 8, 4u << 20, 256u << 10},
                       Run{"t8-small-chunks", 8, 1000, 256u << 10},
                       Run{"t1-small-chunks", 1, 1000, 256u << 10},
                       Run{"t2-small-bands", 2, 4u << 20, 1}}) {
    const QuantizeSummary s = quantize_case(c, tmp / r.name, r.threads, r.chunk, r.band);
    EXPECT_EQ(by_name(s.plan, s.execute.module_errors), want) << r.name;
  }
}

// quantize's figures, verify --against-source's table and inspect --errors
// are the same bits; so are inspect --errors's on the reference's own output
// (the expected fixture, the same bytes).
TEST_P(ModuleErrors, QuantizeVerifyAndInspectGiveTheSameFigures) {
  const GoldenCase c = find_case(GetParam());
  TempDir tmp;
  const QuantizeSummary s = quantize_case(c, tmp / "out", 2);
  const auto want = by_name(s.plan, s.execute.module_errors);
  ASSERT_FALSE(want.empty());

  const VerifyReport v = verify_against_source(tmp / "out", input_of(c), {});
  ASSERT_EQ(v.modules.size(), want.size());
  for (const ModuleCheck& m : v.modules) {
    ASSERT_TRUE(want.contains(m.module)) << m.module;
    EXPECT_EQ(m.rel_frobenius, want.at(m.module).rel_frobenius()) << m.module;
    EXPECT_EQ(m.max_abs_error, want.at(m.module).max_abs_error()) << m.module;
  }

  const CheckpointErrors ours = checkpoint_errors(tmp / "out", input_of(c));
  EXPECT_TRUE(ours.skipped.empty()) << ours.skipped.front();
  EXPECT_EQ(by_name(ours.plan, ours.modules), want);
  const CheckpointErrors reference = checkpoint_errors(expected_of(c), input_of(c));
  EXPECT_EQ(by_name(reference.plan, reference.modules), want);
}

INSTANTIATE_TEST_SUITE_P(Cases, ModuleErrors, ::testing::ValuesIn(case_names()),
                         [](const auto& param) { return case_test_name(param.param); });

// Two rows whose max |w| is 7.5 give the int4 scale 7.5 / 7.5 = 1, so the
// codes are the weights rounded half to even and clamped to [-8, 7]:
//   row 0: 7.5 -> 7 (d 0.5), 1.25 -> 1 (d 0.25); w^2 56.25 + 1.5625
//   row 1: 7.5 -> 7 (d 0.5), -3.5 -> -4 (d 0.5); w^2 56.25 + 12.25
// err2 = 0.3125 + 0.5 = 0.8125, w2 = 57.8125 + 68.5 = 126.3125.
TEST(ModuleErrorsReport, HandComputedFiguresInTheReport) {
  TempDir tmp;
  std::vector<float> values(2 * 128, 0.0f);
  values[0] = 7.5f;
  values[1] = 1.25f;
  values[128] = 7.5f;
  values[129] = -3.5f;
  fs::create_directories(tmp / "in");
  write_safetensors(tmp / "in" / "model.safetensors",
                    {FakeTensor{"model.layers.0.mlp.down_proj.weight", DType::kBF16, {2, 128},
                                float_bytes(DType::kBF16, values)}});
  write_file(tmp / "in" / "config.json", R"({"model_type": "llama"})");
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(),
                                       "--json", "--progress", "none", "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(r.out);
  const json& e = report.at("weight_error");
  ASSERT_EQ(e.at("modules").size(), 1u);
  const json& m = e.at("modules")[0];
  EXPECT_EQ(m.at("module"), "model.layers.0.mlp.down_proj");
  EXPECT_EQ(m.at("scheme"), "W4A16");
  EXPECT_EQ(m.at("shape"), json::array({2, 128}));
  EXPECT_EQ(m.at("rel_frobenius").get<double>(), std::sqrt(0.8125 / 126.3125));
  EXPECT_EQ(m.at("max_abs_error").get<double>(), 0.5);
  EXPECT_EQ(e.at("rel_frobenius"), m.at("rel_frobenius"));
  EXPECT_EQ(e.at("max_abs_error"), m.at("max_abs_error"));
  expect_message(r.err, {"ctquant: weight error ||W-Q||/||W|| 8.0203e-02 over 1 quantized module(s) "
                         "(max |W-Q| 5.0000e-01); largest:\n  8.0203e-02  max |W-Q| 5.0000e-01  "
                         "model.layers.0.mlp.down_proj\n"});
}

// The summary's lines follow the done line: the figure over all modules and
// the five largest, largest first, as the report gives them; none with -q.
TEST(ModuleErrorsReport, SummaryListsTheFiveLargestAfterTheDoneLine) {
  TempDir tmp;
  const fs::path input = golden_dir() / "llama-bf16" / "input";
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string(),
                                       "--json", "--progress", "none"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(r.out);
  std::vector<std::pair<double, std::string>> modules;
  for (const json& m : report["weight_error"]["modules"]) {
    modules.emplace_back(m["rel_frobenius"].get<double>(), m["module"].get<std::string>());
  }
  ASSERT_EQ(modules.size(), 14u);
  std::stable_sort(modules.begin(), modules.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  const std::size_t done = r.err.find("ctquant: done:");
  const std::size_t header = r.err.find("ctquant: weight error ||W-Q||/||W|| ");
  ASSERT_NE(done, std::string::npos) << r.err;
  ASSERT_NE(header, std::string::npos) << r.err;
  EXPECT_LT(done, header);
  std::size_t at = header;
  for (std::size_t i = 0; i < 5; ++i) {
    const std::size_t line = r.err.find("\n  ", at);
    ASSERT_NE(line, std::string::npos) << r.err;
    const std::size_t end = r.err.find('\n', line + 1);
    const std::string text = r.err.substr(line + 1, end - line - 1);
    EXPECT_TRUE(text.ends_with("  " + modules[i].second)) << text;
    at = end;
  }
  EXPECT_EQ(r.err.find("\n  ", at), std::string::npos) << "more than five modules listed";

  const CommandResult quiet = run_ctquant(
      {"quantize", input.string(), (tmp / "quiet").string(), "-q", "--progress", "none"});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
}

// inspect --errors prints the run report's figures, in text and as the same
// JSON values.
TEST(InspectErrors, PrintsTheFiguresTheRunReported) {
  TempDir tmp;
  const fs::path input = golden_dir() / "llama-bf16-nvfp4a16" / "input";
  const CommandResult q =
      run_ctquant({"quantize", input.string(), (tmp / "out").string(), "--scheme", "NVFP4A16",
                   "--report", (tmp / "report.json").string(), "-q"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  const json report = read_json(tmp / "report.json");

  const CommandResult j = run_ctquant(
      {"inspect", (tmp / "out").string(), "--errors", "--source", input.string(), "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["command"], "inspect");
  EXPECT_EQ(doc["mode"], "errors");
  EXPECT_EQ(doc["input_quantization"], "unquantized");
  EXPECT_EQ(doc["weight_error"], report["weight_error"]);
  EXPECT_EQ(doc["skipped"], json::array());

  const CommandResult t =
      run_ctquant({"inspect", (tmp / "out").string(), "--errors", "--source", input.string()});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  for (const json& m : report["weight_error"]["modules"]) {
    expect_message(t.out, {m["module"].get<std::string>()});
  }
  expect_message(t.out, {"||W-Q||/||W||", "max |W-Q|", "NVFP4A16", "largest:"});
}

// A module config.json says is quantized but OUTPUT holds in 16 bits has no
// figures; it is listed with the reason.
TEST(InspectErrors, ListsModulesOutputDoesNotHoldQuantized) {
  TempDir tmp;
  const fs::path input = golden_dir() / "llama-bf16" / "input";
  const CommandResult q =
      run_ctquant({"quantize", input.string(), (tmp / "out").string(), "--ignore",
                   "model.layers.0.mlp.down_proj", "-q"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  json config = read_json(tmp / "out" / "config.json");
  json& ignore = config["quantization_config"]["ignore"];
  json kept = json::array();
  for (const json& e : ignore) {
    if (e != "model.layers.0.mlp.down_proj") kept.push_back(e);
  }
  ignore = kept;
  write_file(tmp / "out" / "config.json", config.dump(2));
  const CheckpointErrors e = checkpoint_errors(tmp / "out", input);
  ASSERT_EQ(e.skipped.size(), 1u);
  expect_message(e.skipped[0], {"model.layers.0.mlp.down_proj: OUTPUT has no "
                                "'model.layers.0.mlp.down_proj.weight_packed'"});
  EXPECT_EQ(e.modules.size(), 13u);
}

TEST(InspectErrors, UsageErrors) {
  const std::string input = (golden_dir() / "llama-bf16" / "input").string();
  const std::string output = (golden_dir() / "llama-bf16" / "expected").string();
  const CommandResult no_source = run_ctquant({"inspect", output, "--errors"});
  EXPECT_EQ(no_source.exit_code, 2);
  expect_message(no_source.err, {"--errors needs --source INPUT"});
  const CommandResult no_errors = run_ctquant({"inspect", output, "--source", input});
  EXPECT_EQ(no_errors.exit_code, 2);
  expect_message(no_errors.err, {"--source is the INPUT of --errors"});
  const CommandResult plan =
      run_ctquant({"inspect", output, "--errors", "--source", input, "--scheme", "W8A16"});
  EXPECT_EQ(plan.exit_code, 2);
  expect_message(plan.err, {"--errors takes the scheme groups and ignore list from OUTPUT's"});
  // An unquantized OUTPUT: no quantization_config to plan INPUT with.
  const CommandResult unquantized =
      run_ctquant({"inspect", input, "--errors", "--source", input});
  EXPECT_EQ(unquantized.exit_code, 1);
  expect_message(unquantized.err,
                 {"OUTPUT config.json: no quantization_config; inspect --errors needs"});
}

}  // namespace
}  // namespace ctquant::test
