// Messages of the binary that send the user the right way: an unquantized
// GOLDEN that is the source (--against-source), a lower-case preset written
// canonically, the Hugging Face cache's five places, a directory given as
// --report, a file given as OUTPUT, PyTorch .bin weights, a checkpoint
// without config.json (lint L19, behind --allow-unloadable), an empty path
// argument. Each with its
// exit code and the fragments of its message.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path sample_input() { return golden_dir() / "llama-bf16" / "input"; }

TEST(CliMessages, VerifyAgainstAnUnquantizedGoldenSuggestsAgainstSource) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_ctquant({"quantize", sample_input().string(), out.string()}).exit_code, 0);
  const CommandResult r = run_ctquant({"verify", out.string(), sample_input().string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  expect_message(r.out, {"has no quantization_config: it looks like an unquantized checkpoint",
                         "ctquant verify " + out.string() + " " + sample_input().string() +
                             " --against-source"});
  const CommandResult json_run =
      run_ctquant({"verify", out.string(), sample_input().string(), "--json"});
  const json report = json::parse(json_run.out);
  ASSERT_FALSE(report.at("notes").empty());
  EXPECT_EQ(report.at("notes").front().at("kind"), "golden_is_unquantized");
  // Against its source it is the same; against a golden output no such note.
  EXPECT_EQ(
      run_ctquant({"verify", out.string(), sample_input().string(), "--against-source"}).exit_code,
      0);
  const CommandResult golden =
      run_ctquant({"verify", out.string(), (golden_dir() / "llama-bf16" / "expected").string()});
  EXPECT_EQ(golden.out.find("--against-source"), std::string::npos) << golden.out;
}

TEST(CliMessages, LowerCaseSchemeIsWrittenAsTheCanonicalPreset) {
  TempDir tmp;
  const CommandResult r =
      run_ctquant({"quantize", sample_input().string(), (tmp / "out").string(), "--scheme", "w4a16",
                   "--write-recipe", (tmp / "recipe.yaml").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"tensors quantized (W4A16)"}, {"w4a16"});
  const json groups =
      read_json(tmp / "out" / "config.json")["quantization_config"]["config_groups"];
  EXPECT_TRUE(groups.contains("W4A16")) << groups.dump();
  EXPECT_FALSE(groups.contains("w4a16")) << groups.dump();
  expect_message(read_file(tmp / "recipe.yaml"), {"scheme: \"W4A16\""}, {"w4a16"});
}

TEST(CliMessages, HfCacheErrorNamesAllFivePlaces) {
  TempDir tmp;
  RunOptions run;
  run.env = {"HF_HUB_CACHE=" + (tmp / "hub").string()};
  const CommandResult r = run_ctquant({"quantize", "acme/absent", (tmp / "out").string()}, run);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err,
                 {"acme/absent: not a file or directory, and not in the Hugging Face cache",
                  "the cache read is " + (tmp / "hub").string(), "$HF_HUB_CACHE",
                  "$HUGGINGFACE_HUB_CACHE", "$HF_HOME/hub", "$XDG_CACHE_HOME/huggingface/hub",
                  "~/.cache/huggingface/hub", "hf download acme/absent"});
}

TEST(CliMessages, ReportThatIsADirectoryIsSaidToBeOne) {
  TempDir tmp;
  RunOptions run;
  run.cwd = tmp.path();
  for (const char* option : {"--report", "--write-recipe"}) {
    SCOPED_TRACE(option);
    const CommandResult r =
        run_ctquant({"quantize", sample_input().string(), "out", option, "."}, run);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, {std::string(option) + " .: is a directory; give the path of a file"},
                   {"contains OUTPUT"});
  }
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(CliMessages, ExistingPlainFileOutputIsNotToldToUseForce) {
  TempDir tmp;
  write_file(tmp / "out", "notes");
  for (const bool force : {false, true}) {
    SCOPED_TRACE(force);
    std::vector<std::string> args = {"quantize", sample_input().string(), (tmp / "out").string()};
    if (force) args.push_back("--force");
    const CommandResult r = run_ctquant(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, {"exists and is a file, not a directory", "choose another OUTPUT"},
                   {"use --force"});
  }
  EXPECT_EQ(read_file(tmp / "out"), "notes");
}

TEST(CliMessages, PytorchBinWeightsAreToldHowToConvert) {
  TempDir tmp;
  fs::create_directories(tmp / "in");
  write_file(tmp / "in" / "pytorch_model.bin", "not read");
  write_file(tmp / "in" / "config.json", R"({"model_type": "llama"})");
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"no .safetensors file in the directory, only PyTorch weights "
                         "(pytorch_model.bin)",
                         "save_pretrained('" + (tmp / "in").string() + "-safetensors')"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// Without config.json vLLM cannot load the output (its config.json would
// hold only quantization_config): an error of lint (L19), which
// --allow-unloadable or --allow L19 lets through.
TEST(CliMessages, MissingConfigJsonStopsTheRunUnlessAllowed) {
  TempDir tmp;
  write_checkpoint(tmp / "in",
                   {random_weight("model.layers.0.mlp.down_proj.weight", DType::kBF16, 8, 128, 1)},
                   nullptr);
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"L19 error: INPUT has no config.json", "vLLM reads the model's",
                         "copy the model's config.json into INPUT", "--allow-unloadable"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  for (const std::vector<std::string>& allow : {std::vector<std::string>{"--allow-unloadable"},
                                                std::vector<std::string>{"--allow", "L19"}}) {
    std::vector<std::string> args = {"quantize", (tmp / "in").string(), (tmp / "out").string()};
    args.insert(args.end(), allow.begin(), allow.end());
    const CommandResult allowed = run_ctquant(args);
    EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
    expect_message(allowed.err, {"ctquant: warning: L19: INPUT has no config.json",
                                 "lets through: vLLM may refuse this output"});
    EXPECT_TRUE(fs::exists(tmp / "out" / "config.json"));
    fs::remove_all(tmp / "out");
  }
}

// A config.json that names no architecture: vLLM picks the model class from
// `architectures` alone. With no model_type either nothing loads the output
// (error); with one, transformers does (warning).
TEST(CliMessages, ConfigJsonWithoutArchitecturesIsNamed) {
  TempDir tmp;
  const std::vector<FakeTensor> tensors = {
      random_weight("model.layers.0.mlp.down_proj.weight", DType::kBF16, 8, 128, 1)};
  write_checkpoint(tmp / "empty", tensors, json::object());
  const CommandResult r =
      run_ctquant({"quantize", (tmp / "empty").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"L19 error: config.json names no model architecture (no `architectures` "
                         "key)",
                         "No model architectures are specified",
                         "with no model_type either transformers' AutoConfig refuses it",
                         "--allow-unloadable"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  write_checkpoint(tmp / "typed", tensors,
                   {{"model_type", "llama"}, {"architectures", json::array()}});
  const CommandResult typed =
      run_ctquant({"quantize", (tmp / "typed").string(), (tmp / "out").string()});
  EXPECT_EQ(typed.exit_code, 0) << typed.err;
  expect_message(typed.err, {"ctquant: warning: L19: config.json names no model architecture "
                             "(`architectures` is [])",
                             "transformers maps its model_type to a class"});
}

TEST(CliMessages, EmptyPathArgumentsAreUsageErrorsNamingTheArgument) {
  TempDir tmp;
  const std::string in = sample_input().string();
  const std::string out = (tmp / "out").string();
  const struct {
    std::vector<std::string> args;
    std::string argument;
  } cases[] = {
      {{"quantize", in, ""}, "OUTPUT"},
      {{"quantize", "", out}, "INPUT"},
      {{"inspect", ""}, "INPUT"},
      {{"verify", "", in}, "OUTPUT"},
      {{"verify", in, "", "--against-source"}, "GOLDEN"},
      {{"finalize", ""}, "OUTPUT"},
  };
  for (const auto& c : cases) {
    const CommandResult r = run_ctquant(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args.front() << " " << c.argument << ": " << r.err;
    expect_message(r.err, {c.argument, "is empty: an empty path names no file or directory"},
                   {"filesystem error", "Invalid argument"});
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace ctquant::test
