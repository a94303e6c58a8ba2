// The refit observer on the command line (scheme/refit.hpp): refusals and
// kwargs, config.json and the report recording the observer, verify
// --against-source on every preset it takes, NVFP4's global scales,
// --scheme-for, recipes and quantization configs.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/plan/recipe.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using json = nlohmann::json;
using test::expect_message;
using test::TempDir;
namespace fs = std::filesystem;

TEST(RefitCli, Fp8SchemeIsAUsageErrorNamingTheGroup) {
  TempDir tmp;
  const test::CommandResult r =
      test::run_ctquant({"quantize", (test::golden_dir() / "llama-bf16" / "input").string(),
                         (tmp / "out").string(), "--scheme", "FP8_DYNAMIC", "--observer", "refit"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"--observer refit", "config group FP8_DYNAMIC", "refit with FP8"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(RefitCli, BadKwargIsAUsageErrorAndWeightX2IsAWord) {
  TempDir tmp;
  const std::string in = (test::golden_dir() / "llama-bf16" / "input").string();
  test::CommandResult r = test::run_ctquant({"quantize", in, (tmp / "a").string(), "--observer",
                                             "refit", "--observer-kwarg", "span=1.5"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"observer_kwargs.span 1.5", "below 1"});
  r = test::run_ctquant({"quantize", in, (tmp / "b").string(), "--observer", "refit",
                         "--observer-kwarg", "weight=x4"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"observer_kwargs.weight \"x4\""});
  r = test::run_ctquant({"quantize", in, (tmp / "c").string(), "--observer", "refit",
                         "--observer-kwarg", "weight=x2", "--no-default-ignore", "--ignore",
                         "lm_head", "--ignore", "model.embed_tokens"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_json(tmp / "c" / "config.json")
                .at("quantization_config")
                .at("config_groups")
                .at("W4A16")
                .at("weights")
                .at("observer_kwargs"),
            json({{"weight", "x2"}}));
}

// ---- end to end ----

std::vector<std::string> llama_args(const fs::path& out, std::vector<std::string> extra) {
  std::vector<std::string> args = {
      "quantize",   (test::golden_dir() / "llama-bf16" / "input").string(),
      out.string(), "--no-default-ignore",
      "--ignore",   "lm_head",
      "--ignore",   "model.embed_tokens"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(RefitCli, EveryPresetItTakesVerifiesAgainstTheSourceAndRecordsTheObserver) {
  for (const char* preset :
       {"W4A16", "W4A16_ASYM", "W8A16", "W8A8", "NVFP4A16", "MXFP4A16", "MXFP8A16"}) {
    TempDir tmp;
    const test::CommandResult r = test::run_ctquant(
        llama_args(tmp / "out", {"--scheme", preset, "--observer", "refit", "--observer-kwarg",
                                 "steps=6", "--report", (tmp / "report.json").string()}));
    ASSERT_EQ(r.exit_code, 0) << preset << r.err;
    const json weights = test::read_json(tmp / "out" / "config.json")
                             .at("quantization_config")
                             .at("config_groups")
                             .at(preset)
                             .at("weights");
    EXPECT_EQ(weights.at("observer"), "refit") << preset;
    EXPECT_EQ(weights.at("observer_kwargs"), json({{"steps", 6}})) << preset;
    const json report = test::read_json(tmp / "report.json");
    bool recorded = false;
    for (const json& g : report.at("plan").at("groups")) {
      recorded |= g.at("weights").at("observer") == "refit";
    }
    EXPECT_TRUE(recorded) << preset;
    const test::CommandResult v = test::run_ctquant(
        {"verify", (tmp / "out").string(), (test::golden_dir() / "llama-bf16" / "input").string(),
         "--against-source"});
    EXPECT_EQ(v.exit_code, 0) << preset << v.out << v.err;
    expect_message(v.out, {"SAME"});
  }
}

TEST(RefitCli, Nvfp4KeepsMinMaxsGlobalScales) {
  TempDir tmp;
  ASSERT_EQ(
      test::run_ctquant(llama_args(tmp / "refit", {"--scheme", "NVFP4A16", "--observer", "refit"}))
          .exit_code,
      0);
  ASSERT_EQ(test::run_ctquant(llama_args(tmp / "minmax", {"--scheme", "NVFP4A16"})).exit_code, 0);
  std::size_t checked = 0;
  std::size_t scales_differ = 0;
  for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                        "model.layers.0.mlp.gate_proj", "model.layers.1.mlp.down_proj"}) {
    const std::string t = std::string(m) + ".weight_global_scale";
    EXPECT_EQ(test::read_tensor(tmp / "refit" / "model.safetensors", t),
              test::read_tensor(tmp / "minmax" / "model.safetensors", t))
        << t;
    const std::string g = std::string(m) + ".weight_scale";
    scales_differ += test::read_tensor(tmp / "refit" / "model.safetensors", g) !=
                     test::read_tensor(tmp / "minmax" / "model.safetensors", g);
    ++checked;
  }
  EXPECT_EQ(checked, 4u);
  EXPECT_EQ(scales_differ, 4u);
}

TEST(RefitCli, SchemeForRecipeAndQuantizationConfigTakeRefit) {
  TempDir tmp;
  const test::CommandResult r = test::run_ctquant(llama_args(
      tmp / "scheme-for", {"--scheme", "W4A16", "--scheme-for", "re:.*mlp.*=W4A16_ASYM@refit"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json groups = test::read_json(tmp / "scheme-for" / "config.json")
                          .at("quantization_config")
                          .at("config_groups");
  bool refit_group = false;
  for (const auto& [name, g] : groups.items()) {
    if (g.at("weights").at("observer") == "refit") {
      refit_group = true;
      EXPECT_EQ(g.at("weights").at("symmetric"), false) << name;
    }
  }
  EXPECT_TRUE(refit_group) << groups.dump();
  // A compressed-tensors config with weights.observer refit.
  test::write_file(tmp / "config.json", R"({"config_groups": {"group_0": {
      "targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                  "symmetric": true, "dynamic": false, "observer": "refit",
                  "observer_kwargs": {"steps": 4, "weight": "x2"}}}}})");
  const test::CommandResult q = test::run_ctquant(
      llama_args(tmp / "qc", {"--quantization-config", (tmp / "config.json").string()}));
  ASSERT_EQ(q.exit_code, 0) << q.err;
  const json w = test::read_json(tmp / "qc" / "config.json")
                     .at("quantization_config")
                     .at("config_groups")
                     .at("group_0")
                     .at("weights");
  EXPECT_EQ(w.at("observer"), "refit");
  EXPECT_EQ(w.at("observer_kwargs"), json({{"steps", 4}, {"weight", "x2"}}));
  const test::CommandResult v = test::run_ctquant(
      {"verify", (tmp / "qc").string(), (test::golden_dir() / "llama-bf16" / "input").string(),
       "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  // A recipe's weight_observer.
  const RecipeSpec spec = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16_ASYM\n"
      "      weight_observer: refit\n",
      "r.yaml");
  const PlanOptions options = plan_options_for(resolve_recipe(&spec, {}));
  ASSERT_EQ(options.groups.size(), 1u);
  EXPECT_EQ(options.groups[0].weights.observer, "refit");
}

}  // namespace
}  // namespace ctquant
