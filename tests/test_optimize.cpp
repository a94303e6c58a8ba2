// --optimize (plan/optimize.hpp): the observer table per scheme, each row's
// figures as docs/accuracy.md gives them, the output of a run equal to the
// run with the chosen observer named, and the options it refuses beside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/plan/optimize.hpp"
#include "ctquant/plan/plan.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

OptimizeChoice optimize_one(SchemeGroup g, SchemeGroup* after = nullptr) {
  PlanOptions options;
  options.groups = {std::move(g)};
  const std::vector<OptimizeChoice> c = apply_optimize(options);
  EXPECT_EQ(c.size(), 1u);
  if (after != nullptr) *after = options.groups[0];
  return c.at(0);
}

TEST(Optimize, ChoosesTheObserverMeasuredBestPerScheme) {
  const std::vector<std::pair<std::string, std::string>> presets{
      {"W4A16", "memoryless_mse"},
      {"W4A16_ASYM", "refit"},
      {"W8A16", "refit"},
      {"NVFP4A16", "nvfp4_expanded_mse"},
      {"MXFP4A16", "memoryless_minmax"},
      {"FP8_DYNAMIC", "memoryless_minmax"},
      {"W8A8", "memoryless_minmax"}};
  for (const auto& [preset, observer] : presets) {
    SchemeGroup after;
    const OptimizeChoice c = optimize_one(preset_group(preset), &after);
    EXPECT_EQ(c.group, preset);
    EXPECT_EQ(c.observer, observer) << preset;
    EXPECT_EQ(after.weights.observer, observer) << preset;
    EXPECT_TRUE(after.weights.observer_kwargs.empty()) << preset;
    EXPECT_NE(c.evidence.find("docs/accuracy.md"), std::string::npos) << preset;
  }
  // Bits and sizes of the same format: 3 and 2 bits take refit; the same
  // format without a measurement (channel-wise) keeps min-max and says so.
  EXPECT_EQ(optimize_one(int_group(3, true, 128)).observer, "refit");
  EXPECT_EQ(optimize_one(int_group(2, false, 128)).observer, "refit");
  const OptimizeChoice channel = optimize_one(int_group(4, true, 0));
  EXPECT_EQ(channel.observer, "memoryless_minmax");
  EXPECT_NE(channel.evidence.find("no measurement"), std::string::npos);
  // The bits per weight never change: only the observer does.
  SchemeGroup before = preset_group("W4A16"), after;
  optimize_one(before, &after);
  after.weights.observer = before.weights.observer;
  EXPECT_EQ(after.weights, before.weights);
}

// Every KLD a row cites is in docs/accuracy.md, so the table cannot drift
// from the measurement behind it unnoticed.
TEST(Optimize, EveryCitedFigureIsInTheAccuracyTables) {
  const std::string doc = read_file(fs::path(CTQUANT_DOCS_DIR) / "accuracy.md");
  const std::regex figure(R"(0\.\d{3,6})");
  int checked = 0;
  for (const std::string preset : {"W4A16", "W4A16_ASYM", "W8A16", "NVFP4A16"}) {
    const OptimizeChoice c = optimize_one(preset_group(preset));
    for (auto it = std::sregex_iterator(c.evidence.begin(), c.evidence.end(), figure);
         it != std::sregex_iterator(); ++it) {
      EXPECT_NE(doc.find(it->str()), std::string::npos) << preset << " cites " << it->str();
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

// A run with --optimize writes what the run naming the chosen observer
// writes, byte for byte: here W4A16 with memoryless_mse, which is also
// model_free_ptq's output of the llama-bf16-mse fixture.
TEST(Optimize, RunEqualsTheRunWithTheChosenObserverAndSaysSo) {
  const fs::path input = golden_dir() / "llama-bf16-mse" / "input";
  TempDir tmp;
  const CommandResult r =
      run_ctquant({"quantize", input.string(), (tmp / "opt").string(), "--optimize"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"info: --optimize: group 'W4A16' weights with memoryless_mse (measured "
                         "at W4A16 g128",
                         "docs/accuracy.md", "(W4A16 with memoryless_mse by --optimize)"});
  const CommandResult named = run_ctquant(
      {"quantize", input.string(), (tmp / "named").string(), "--observer", "memoryless_mse"});
  ASSERT_EQ(named.exit_code, 0) << named.err;
  EXPECT_EQ(
      diff_safetensors(tmp / "opt" / "model.safetensors", tmp / "named" / "model.safetensors"), "");
  EXPECT_EQ(read_json(tmp / "opt" / "config.json"), read_json(tmp / "named" / "config.json"));
  EXPECT_EQ(diff_golden(tmp / "opt", golden_dir() / "llama-bf16-mse" / "expected",
                        /*group_keys=*/false),
            "");
}

// The recipe --write-recipe writes for an --optimize run carries the
// chosen observer (config groups), so reading it back writes the same bytes.
TEST(Optimize, WrittenRecipeReproducesTheRun) {
  const fs::path input = golden_dir() / "llama-bf16" / "input";
  for (const std::string scheme : {"W4A16", "W4A16_ASYM", "NVFP4A16"}) {
    TempDir tmp;
    const CommandResult r =
        run_ctquant({"quantize", input.string(), (tmp / "opt").string(), "--scheme", scheme,
                     "--optimize", "--write-recipe", (tmp / "r.yaml").string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const CommandResult again = run_ctquant({"quantize", input.string(), (tmp / "again").string(),
                                             "--recipe", (tmp / "r.yaml").string()});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(
        diff_safetensors(tmp / "again" / "model.safetensors", tmp / "opt" / "model.safetensors"),
        "")
        << scheme << "\n"
        << read_file(tmp / "r.yaml");
  }
}

TEST(Optimize, RefusesAnObserverGivenBesideIt) {
  const fs::path input = golden_dir() / "llama-bf16" / "input";
  TempDir tmp;
  const CommandResult flag = run_ctquant(
      {"quantize", input.string(), (tmp / "a").string(), "--optimize", "--observer", "refit"});
  EXPECT_EQ(flag.exit_code, 2);
  expect_message(flag.err, {"--optimize chooses each group's observer, and --observer names one "
                            "(refit): give one of them"});
  EXPECT_FALSE(fs::exists(tmp / "a"));
  const fs::path config = tmp / "config.json";
  write_file(config, json{{"config_groups",
                           {{"group_0",
                             {{"targets", {"Linear"}},
                              {"weights",
                               {{"num_bits", 4},
                                {"type", "int"},
                                {"symmetric", true},
                                {"strategy", "group"},
                                {"group_size", 128},
                                {"observer", "memoryless_mse"}}}}}}}}
                         .dump());
  const CommandResult file = run_ctquant({"quantize", input.string(), (tmp / "b").string(),
                                          "--optimize", "--quantization-config", config.string()});
  EXPECT_EQ(file.exit_code, 2);
  expect_message(file.err, {"--optimize chooses each group's observer, and config group "
                            "'group_0' names one (memoryless_mse)"});
  EXPECT_FALSE(fs::exists(tmp / "b"));
  // A --scheme-for @OBSERVER names one too, min-max included (the group
  // would otherwise be named W4A16_memoryless_minmax and hold another).
  const CommandResult named =
      run_ctquant({"quantize", input.string(), (tmp / "c").string(), "--optimize", "--scheme-for",
                   "re:.*mlp.*=W4A16@memoryless_minmax"});
  EXPECT_EQ(named.exit_code, 2) << named.err;
  expect_message(named.err, {"--optimize chooses each group's observer, and --scheme-for "
                             "'re:.*mlp.*=W4A16@memoryless_minmax' names one"});
  EXPECT_FALSE(fs::exists(tmp / "c"));
}

}  // namespace
}  // namespace ctquant::test
