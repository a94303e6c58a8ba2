// llm-compressor recipes in and out: the upstream example recipes in
// tests/recipes/ (tests/recipes/PROVENANCE.md) give the plan of the
// equivalent command line or are refused naming file, line and key; the
// recipe ctquant writes reads back into the same plan.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ctquant/plan/recipe.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using nlohmann::json;
using test::expect_message;
namespace fs = std::filesystem;

fs::path recipes_dir() { return CTQUANT_RECIPES_DIR; }
fs::path llama_input() { return test::golden_dir() / "llama-bf16" / "input"; }

// The plan of options on INPUT as JSON plus the config.json it writes, with
// each scheme group's name replaced by its position: a preset's group is keyed
// by the preset's name, a recipe's by its config_groups key.
json plan_of(const fs::path& input, const PlanOptions& options) {
  const Checkpoint checkpoint = open_checkpoint(input, OpenOptions{});
  const QuantizePlan plan = make_plan(checkpoint, options);
  json j = plan_json(checkpoint, plan);
  j.erase("expected_output_bytes");  // counts config.json, which holds the group names
  std::map<std::string, std::string> renamed;
  for (json& g : j["groups"]) {
    const std::string position = "group " + std::to_string(renamed.size());
    renamed[g["name"].get<std::string>()] = position;
    g["name"] = position;
  }
  for (json& m : j["modules"]) {
    if (m["group"].is_string()) m["group"] = renamed.at(m["group"].get<std::string>());
  }
  json config = plan.config;
  json& quantization_config = config["quantization_config"];
  json groups = json::object();
  for (const auto& [name, group] : quantization_config["config_groups"].items()) {
    groups[renamed.count(name) != 0 ? renamed.at(name) : name] = group;
  }
  quantization_config["config_groups"] = groups;
  j["config"] = config;
  return j;
}

PlanOptions options_from_recipe(const fs::path& file, const CommandLinePlan& cli = {}) {
  const RecipeSpec spec = parse_recipe(file);
  return plan_options_for(resolve_recipe(&spec, cli));
}

// A command line with only --scheme, --group-size, --ignore and --targets.
CommandLinePlan cl(std::optional<std::string> scheme, std::optional<long long> group_size,
                   std::vector<std::string> ignore, std::vector<std::string> targets) {
  CommandLinePlan plan;
  plan.scheme = std::move(scheme);
  plan.group_size = group_size;
  plan.ignore = std::move(ignore);
  plan.targets = std::move(targets);
  return plan;
}

PlanOptions options_from_command_line(const CommandLinePlan& cli) {
  return plan_options_for(resolve_recipe(nullptr, cli));
}

// The error message of f, which must throw Error{kUsage}.
template <class F>
std::string usage_error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

// ---- recipes that llm-compressor wrote (Recipe.yaml) give the command line's plan ----

struct SameAsCommandLine {
  const char* recipe;  // under tests/recipes/
  CommandLinePlan command_line;
};

TEST(Recipe, LlmCompressorWrittenRecipesGiveTheCommandLinePlan) {
  const std::vector<std::string> e2e_ignore = {"lm_head", "re:.*mlp.gate[.].*"};
  const SameAsCommandLine cases[] = {
      {"written/w4a16_rtn.yaml", cl("W4A16", std::nullopt, e2e_ignore, {"Linear"})},
      {"written/w4a16_asym_rtn.yaml", cl("W4A16_ASYM", std::nullopt, e2e_ignore, {"Linear"})},
      {"written/w8a16_rtn.yaml", cl("W8A16", std::nullopt, e2e_ignore, {"Linear"})},
      {"written/w4a16_asym_g64_groups.yaml", cl("W4A16_ASYM", 64, {"lm_head"}, {})},
      {"written/w8a16_channel_groups.yaml", cl("W8A16", -1, {"lm_head"}, {})},
  };
  for (const SameAsCommandLine& c : cases) {
    SCOPED_TRACE(c.recipe);
    EXPECT_EQ(plan_of(llama_input(), options_from_recipe(recipes_dir() / c.recipe)),
              plan_of(llama_input(), options_from_command_line(c.command_line)));
  }
}

TEST(Recipe, ConfigGroupsOfTheW4A16ExampleGiveTheW4A16Plan) {
  // tests/e2e/recipes/WNA16/recipe_w4a16_awq_sym.yaml without its AWQModifier:
  // the data-free half of the upstream recipe (derived/, see PROVENANCE.md).
  EXPECT_EQ(plan_of(llama_input(), options_from_recipe(recipes_dir() / "derived/w4a16_sym.yaml")),
            plan_of(llama_input(), options_from_command_line(cl("W4A16", {}, {"lm_head"}, {}))));
  EXPECT_EQ(
      plan_of(llama_input(), options_from_recipe(recipes_dir() / "derived/w4a16_asym.yaml")),
      plan_of(llama_input(), options_from_command_line(cl("W4A16_ASYM", {}, {"lm_head"}, {}))));
}

// ---- refusals of upstream recipes ----

struct Refused {
  const char* recipe;
  std::vector<std::string> fragments;  // file:line, key, reason
};

TEST(Recipe, CalibrationBasedUpstreamRecipesAreRefusedNamingTheModifier) {
  const Refused cases[] = {
      {"upstream/new_quant_group.yaml",
       {"new_quant_group.yaml:16:", "GPTQModifier", "calibration"}},
      {"upstream/new_quant_channel.yaml",
       {"new_quant_channel.yaml:15:", "GPTQModifier", "oneshot"}},
      {"upstream/recipe_w4a16_awq_sym.yaml",
       {"recipe_w4a16_awq_sym.yaml:3:", "AWQModifier", "calibration"}},
      {"upstream/recipe_w4a16_awq_asym.yaml", {"recipe_w4a16_awq_asym.yaml:3:", "AWQModifier"}},
      {"upstream/recipe_gptq_awq.yaml", {"recipe_gptq_awq.yaml:3:", "AWQModifier"}},
      {"upstream/recipe_w8a8_dynamic_asym.yaml",
       {"recipe_w8a8_dynamic_asym.yaml:3:", "SmoothQuantModifier"}},
      {"upstream/quantization_int4_int8.recipe.yaml",
       {"quantization_int4_int8.recipe.yaml:3:", "GPTQModifier"}},
      {"upstream/sparse_24_fp8.yaml", {"sparse_24_fp8.yaml:3:", "SparseGPTModifier", "pruning"}},
  };
  for (const Refused& c : cases) {
    SCOPED_TRACE(c.recipe);
    expect_message(usage_error_of([&] { parse_recipe(recipes_dir() / c.recipe); }), c.fragments);
  }
}

TEST(Recipe, UpstreamRecipesNeedingCalibrationDataAreRefusedNamingTheKey) {
  const Refused cases[] = {
      // A kv_cache_scheme needs observed scales.
      {"upstream/default.yaml", {"default.yaml:4:", "kv_cache_scheme", "calibration"}},
      // input_activations without dynamic: true are static (calibrated).
      {"upstream/new_quant_simple.yaml",
       {"new_quant_simple.yaml:12:", "input_activations", "dynamic false", "calibration"}},
  };
  for (const Refused& c : cases) {
    SCOPED_TRACE(c.recipe);
    expect_message(usage_error_of([&] { parse_recipe(recipes_dir() / c.recipe); }), c.fragments);
  }
}

// The data-free FP8 recipes give the plan of the equivalent preset, or the
// format compressed-tensors infers for their weights (schemes.md 1.1:
// weight-only FP8 is naive-quantized, FP8 with activations float-quantized).
TEST(Recipe, Fp8RecipesGiveTheirSchemes) {
  const std::vector<std::string> vision_ignore = {"lm_head", "re:vision_tower.*",
                                                  "re:.*multi_modal_projector.*", "re:.*visual.*",
                                                  "re:.*vision_model.*"};
  EXPECT_EQ(plan_of(llama_input(),
                    options_from_recipe(recipes_dir() / "upstream/recipe_fp8_dynamic.yaml")),
            plan_of(llama_input(), options_from_command_line(cl("FP8_DYNAMIC", std::nullopt,
                                                                vision_ignore, {"Linear"}))));
  EXPECT_EQ(
      plan_of(llama_input(), options_from_recipe(recipes_dir() / "written/fp8_dynamic_rtn.yaml")),
      plan_of(llama_input(),
              options_from_command_line(
                  cl("FP8_DYNAMIC", std::nullopt, {"lm_head", "re:.*mlp.gate[.].*"}, {"Linear"}))));
  struct Groups {
    const char* recipe;
    std::vector<std::pair<std::string, int>> format_and_modules;  // per group, in order
  };
  const Groups cases[] = {
      {"upstream/recipe_fp8_weight_only_channel.yaml", {{"naive-quantized", 14}}},
      {"upstream/recipe_fp8_weight_only_per_tensor.yaml", {{"naive-quantized", 14}}},
      {"upstream/new_quant_fp8.yaml", {{"naive-quantized", 14}}},
      // attention per channel, the MLP per tensor
      {"upstream/quantization_fp8_multiple_strategies.recipe.yaml",
       {{"float-quantized", 8}, {"float-quantized", 6}}},
  };
  for (const Groups& c : cases) {
    SCOPED_TRACE(c.recipe);
    const json plan = plan_of(llama_input(), options_from_recipe(recipes_dir() / c.recipe));
    std::vector<std::pair<std::string, int>> got;
    for (const json& g : plan["groups"]) {
      got.emplace_back(g["format"].get<std::string>(), g["modules"].get<int>());
    }
    EXPECT_EQ(got, c.format_and_modules);
  }
}

// A recipe llm-compressor wrote for NVFP4A16 gives the NVFP4A16 plan.
TEST(Recipe, Nvfp4RecipeGivesTheNvfp4Plan) {
  EXPECT_EQ(
      plan_of(llama_input(), options_from_recipe(recipes_dir() / "written/nvfp4a16_rtn.yaml")),
      plan_of(llama_input(),
              options_from_command_line(
                  cl("NVFP4A16", std::nullopt, {"lm_head", "re:.*mlp.gate[.].*"}, {"Linear"}))));
}

// ---- bad recipes: named cases, each with its file:line and key ----

struct BadRecipe {
  const char* name;
  const char* text;
  std::vector<std::string> fragments;
};

TEST(Recipe, BadRecipesAreUsageErrorsNamingFileLineAndKey) {
  const BadRecipe cases[] = {
      {"invalid_yaml", "quant_stage:\n  quant_modifiers: [1, 2\n", {"r.yaml:3:1:", "invalid YAML"}},
      {"not_a_mapping", "- a\n- b\n", {"r.yaml:1:", "not an llm-compressor recipe"}},
      {"unknown_top_level_key",
       "args: {}\nquant_stage:\n  quant_modifiers:\n    QuantizationModifier: {scheme: W4A16}\n",
       {"r.yaml:1:", "unknown key 'args'"}},
      {"unknown_group_key",
       "quant_stage:\n  quant_mods:\n    QuantizationModifier: {}\n",
       {"r.yaml:2:", "unknown key 'quant_mods'"}},
      {"unknown_modifier",
       "quant_stage:\n  quant_modifiers:\n    FooModifier: {}\n",
       {"r.yaml:3:", "unknown modifier 'FooModifier'"}},
      {"unknown_modifier_key",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      foo: 1\n",
       {"r.yaml:5:", "unknown key 'foo'"}},
      {"unknown_weights_key",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        group_0:\n          targets: [Linear]\n          weights: {num_bits: 4, foo: 1}\n",
       {"r.yaml:7:", "unknown key 'foo'", "config_groups.group_0.weights"}},
      {"unknown_group_field",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        group_0:\n          targets: [Linear]\n          wieghts: {num_bits: 4}\n",
       {"r.yaml:7:", "unknown key 'wieghts'"}},
      {"repeated_key",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      scheme: W8A16\n",
       {"r.yaml:5:", "'scheme'", "repeated"}},
      {"scheme_and_config_groups",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      config_groups:\n        g: {targets: [Linear], weights: {num_bits: 8}}\n",
       {"r.yaml:3:", "both scheme (line 4) and config_groups (line 5)"}},
      {"targets_with_config_groups",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      targets: [re:.*mlp.*]\n"
       "      config_groups:\n        g: {targets: [Linear], weights: {num_bits: 8}}\n",
       {"r.yaml:4:", "'targets' has no effect with config_groups"}},
      {"two_quantization_modifiers",
       "a_stage:\n  x_modifiers:\n    QuantizationModifier: {scheme: W4A16}\n"
       "b_stage:\n  y_modifiers:\n    QuantizationModifier: {scheme: W8A16}\n",
       {"r.yaml:6:", "second QuantizationModifier", "line 3"}},
      {"no_quantization_modifier",
       "quant_stage:\n  quant_modifiers: {}\n",
       {"r.yaml", "no QuantizationModifier"}},
      {"input_observer",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      input_observer: mse\n",
       {"r.yaml:5:", "input_observer", "activations"}},
      {"imatrix_observer_in_weights",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g:\n          targets: [Linear]\n          weights:\n            num_bits: 4\n"
       "            observer: imatrix_mse\n",
       {"r.yaml:9:", "imatrix_mse", "calibration data"}},
      {"unknown_observer_kwarg",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g:\n          targets: [Linear]\n          weights:\n            num_bits: 4\n"
       "            observer: memoryless_mse\n            observer_kwargs: {maxshrnk: 0.3}\n",
       {"r.yaml:10:", "maxshrnk", "maxshrink"}},
      {"actorder",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g:\n          targets: [Linear]\n          weights: {num_bits: 4, actorder: "
       "group}\n",
       {"r.yaml:7:", "actorder", "GPTQ"}},
      {"static_input_activations",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g:\n          targets: [Linear]\n          weights: {num_bits: 8}\n"
       "          input_activations: {num_bits: 8, dynamic: false}\n",
       {"r.yaml:8:", "input_activations with dynamic false", "calibration"}},
      {"local_input_activations",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g:\n          targets: [Linear]\n          weights: {num_bits: 4}\n"
       "          input_activations: {num_bits: 4, dynamic: local}\n",
       {"r.yaml:8:", "dynamic \"local\""}},
      {"output_activations",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g:\n          targets: [Linear]\n          weights: {num_bits: 8}\n"
       "          output_activations: {num_bits: 8, dynamic: true}\n",
       {"r.yaml:8:", "output activation quantization"}},
      {"group_without_weights",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g: {targets: [Linear]}\n",
       {"r.yaml:5:", "has no weights"}},
      {"octal_number",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
       "        g: {targets: [Linear], weights: {num_bits: 04}}\n",
       {"r.yaml:5:", "'04'", "decimal"}},
      {"bypass_divisibility_checks",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      bypass_divisibility_checks: true\n",
       {"r.yaml:5:", "bypass_divisibility_checks"}},
      {"requires_calibration_data",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      requires_calibration_data: true\n",
       {"r.yaml:5:", "requires_calibration_data", "calibration data"}},
      {"schedule_field",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      start: 0\n",
       {"r.yaml:5:", "'start'"}},
      {"ignore_not_a_list",
       "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n"
       "      ignore: lm_head\n",
       {"r.yaml:5:", "ignore must be a list of strings"}},
  };
  for (const BadRecipe& c : cases) {
    SCOPED_TRACE(c.name);
    expect_message(usage_error_of([&] { parse_recipe_text(c.text, "r.yaml"); }), c.fragments);
  }
}

TEST(Recipe, MissingFileIsAUsageError) {
  test::TempDir dir;
  expect_message(usage_error_of([&] { parse_recipe(dir / "absent.yaml"); }),
                 {"--recipe", "absent.yaml"});
}

// PyYAML's safe_load (llm-compressor's reader) refuses a stream of several
// documents; yaml-cpp's Load read the first and dropped the rest silently.
TEST(Recipe, SecondYamlDocumentIsRefusedNamingItsLine) {
  const std::string w4 =
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n";
  const std::string w8 =
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W8A16\n";
  expect_message(usage_error_of([&] { parse_recipe_text(w4 + "---\n" + w8, "r.yaml"); }),
                 {"r.yaml:5: a second YAML document starts here ('---')",
                  "llm-compressor refuses this file too"});
  expect_message(usage_error_of([&] { parse_recipe_text("---\n" + w4 + "\n---\n", "r.yaml"); }),
                 {"r.yaml:7: a second YAML document"});
  expect_message(usage_error_of([&] {
                   parse_recipe_text("# two\n---\n" + w4 + "--- # next\n" + w8, "r.yaml");
                 }),
                 {"r.yaml:7: a second YAML document"});
  // One document between its markers is read.
  EXPECT_EQ(parse_recipe_text("---\n" + w4 + "...\n", "r.yaml").scheme->value, "W4A16");
}

// ---- YAML scalars are typed as PyYAML's safe_load types them ----

TEST(Recipe, ScalarsAreTypedAsPyYamlSafeLoad) {
  const RecipeSpec spec = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n"
      "        g:\n          targets: Linear\n          format: ~\n          weights:\n"
      "            num_bits: 4\n            symmetric: False\n            type: \"int\"\n"
      "            group_size: 32\n            strategy: group\n            zp_dtype: torch.int8\n"
      "            observer_kwargs: {}\n            block_structure: null\n",
      "r.yaml");
  ASSERT_TRUE(spec.config_groups);
  const json& g = spec.config_groups->value["g"];
  EXPECT_EQ(g["targets"], json::array({"Linear"}));
  EXPECT_TRUE(g["format"].is_null());
  EXPECT_EQ(g["weights"]["num_bits"], json(4));
  EXPECT_EQ(g["weights"]["symmetric"], json(false));
  EXPECT_EQ(g["weights"]["type"], json("int"));
  EXPECT_EQ(g["weights"]["zp_dtype"], json("torch.int8"));
  EXPECT_TRUE(g["weights"]["block_structure"].is_null());
  EXPECT_EQ(spec.where("config_groups.g.weights.group_size"), "r.yaml:12");
  EXPECT_EQ(spec.where("config_groups.g.weights"), "r.yaml:8");
}

TEST(Recipe, SchemeMappingOfPresetsIsConfigGroupsOfPresets) {
  // QuantizationModifier(scheme={"W8A16": [...]}) as llm-compressor reads it.
  const RecipeSpec spec = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      ignore: [lm_head]\n"
      "      scheme:\n        w8a16: ['re:.*mlp.*']\n",
      "r.yaml");
  ASSERT_TRUE(spec.config_groups);
  EXPECT_EQ(spec.config_groups->value, json({{"w8a16", {"re:.*mlp.*"}}}));
  const PlanOptions options = plan_options_for(resolve_recipe(&spec, {}));
  ASSERT_EQ(options.groups.size(), 1u);
  EXPECT_EQ(options.groups[0].name, "w8a16");
  EXPECT_EQ(options.groups[0].weights.num_bits, 8);
  EXPECT_EQ(options.groups[0].targets, std::vector<std::string>{"re:.*mlp.*"});
}

// ---- the command line and the recipe ----

TEST(Recipe, CommandLineOverridesTheRecipeAndSaysWhereEachValueCameFrom) {
  const RecipeSpec spec = parse_recipe(recipes_dir() / "written/w4a16_rtn.yaml");
  const std::string file = (recipes_dir() / "written/w4a16_rtn.yaml").string();
  {
    const EffectiveRecipe r = resolve_recipe(&spec, {});
    EXPECT_EQ(*r.scheme, "W4A16");
    EXPECT_EQ(r.scheme_origin.describe(), file + ":6");
    EXPECT_EQ(r.targets_origin.describe(), file + ":4");
    EXPECT_EQ(r.ignore_origin.describe(), file + ":5");
    EXPECT_EQ(r.ignore, (std::vector<std::string>{"lm_head", "re:.*mlp.gate[.].*"}));
    expect_message(render_recipe_origins(r),
                   {"scheme        W4A16  (" + file + ":6)", "ignore", file + ":5"});
  }
  {
    const EffectiveRecipe r = resolve_recipe(&spec, cl("W8A16", 64, {"lm_head"}, {"re:.*mlp.*"}));
    EXPECT_EQ(*r.scheme, "W8A16");
    EXPECT_EQ(r.scheme_origin.describe(), "command line");
    EXPECT_EQ(r.group_size_origin.describe(), "command line");
    EXPECT_EQ(r.targets_origin.describe(), "command line");
    EXPECT_EQ(r.ignore_origin.describe(), "command line");
    EXPECT_EQ(r.ignore_origin.to_json(), json({{"source", "command_line"}}));
    const PlanOptions o = plan_options_for(r);
    ASSERT_EQ(o.groups.size(), 1u);
    EXPECT_EQ(o.groups[0].weights.num_bits, 8);
    EXPECT_EQ(o.groups[0].weights.group_size, 64u);
  }
  {
    const EffectiveRecipe r = resolve_recipe(nullptr, {});
    EXPECT_EQ(r.scheme_origin.describe(), "default");
    EXPECT_TRUE(r.ignore.empty());  // the plan adds the roles' defaults
    EXPECT_EQ(r.targets, kDefaultTargets);
    // The options block does not show an empty list as if it were the
    // default ignore list.
    expect_message(render_recipe_origins(r),
                   {"ignore        none given; the module roles' defaults"});
    EXPECT_EQ(render_recipe_origins(r).find("[]"), std::string::npos);
  }
}

TEST(Recipe, RecipeWithoutIgnoreIgnoresNothingAsLlmCompressorDoes) {
  const RecipeSpec spec = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n",
      "r.yaml");
  const EffectiveRecipe r = resolve_recipe(&spec, {});
  EXPECT_TRUE(r.ignore.empty());
  expect_message(r.ignore_origin.describe(), {"r.yaml:3", "nothing ignored"});
}

TEST(Recipe, OptionsThatDoNotApplyToConfigGroupsAreUsageErrors) {
  const RecipeSpec spec = parse_recipe(recipes_dir() / "written/w4a16_asym_g64_groups.yaml");
  expect_message(usage_error_of([&] { resolve_recipe(&spec, cl(std::nullopt, 32, {}, {})); }),
                 {"--group-size 32", "w4a16_asym_g64_groups.yaml:4: config_groups"});
  expect_message(usage_error_of([&] {
                   resolve_recipe(&spec, cl(std::nullopt, std::nullopt, {}, {"Linear"}));
                 }),
                 {"--targets", "w4a16_asym_g64_groups.yaml:4: config_groups"});
  expect_message(usage_error_of([&] { resolve_recipe(&spec, cl("W8A16", std::nullopt, {}, {})); }),
                 {"--scheme W8A16", "w4a16_asym_g64_groups.yaml:4: config_groups"});
  // --ignore applies to every group.
  const EffectiveRecipe r =
      resolve_recipe(&spec, cl(std::nullopt, std::nullopt, {"re:.*head$"}, {}));
  EXPECT_EQ(plan_options_for(r).ignore, std::vector<std::string>{"re:.*head$"});
}

// ---- recipes out: what --write-recipe writes reads back into the same plan ----

TEST(Recipe, WrittenRecipeReadsBackIntoTheSamePlan) {
  const CommandLinePlan cases[] = {
      cl("W4A16", std::nullopt, {"lm_head", "re:.*down_proj$"}, {}),
      cl("w8a16", std::nullopt, {}, {"re:.*self_attn.*"}),
      cl("W4A16_ASYM", 64, {"lm_head"}, {}),  // a preset changed: written as config_groups
      cl("W4A16", -1, {}, {}),                // channel-wise
  };
  test::TempDir dir;
  const Checkpoint checkpoint = open_checkpoint(llama_input(), OpenOptions{});
  for (const CommandLinePlan& c : cases) {
    SCOPED_TRACE(c.scheme.value_or("") + " g" + std::to_string(c.group_size.value_or(0)));
    const EffectiveRecipe r = resolve_recipe(nullptr, c);
    const PlanOptions options = plan_options_for(r);
    const QuantizePlan plan = make_plan(checkpoint, options);
    const std::string yaml = recipe_yaml(r, plan);
    EXPECT_EQ(yaml.find("Z"), std::string::npos) << "no timestamp expected:\n" << yaml;
    test::write_file(dir / "recipe.yaml", yaml);
    const RecipeSpec spec = parse_recipe(dir / "recipe.yaml");
    EXPECT_EQ(plan_of(llama_input(), plan_options_for(resolve_recipe(&spec, {}))),
              plan_of(llama_input(), options))
        << yaml;
    if (c.group_size) {
      EXPECT_TRUE(spec.config_groups) << yaml;
    } else {
      ASSERT_TRUE(spec.scheme) << yaml;
    }
  }
}

// The written ignore list is config.json's: the module roles' defaults
// (here lm_head and the embedding) with the given entries.
TEST(Recipe, WrittenRecipeOfAPresetIsTheSchemeForm) {
  const EffectiveRecipe r = resolve_recipe(nullptr, cl("w4a16", std::nullopt, {"lm_head"}, {}));
  const Checkpoint checkpoint = open_checkpoint(llama_input(), OpenOptions{});
  const std::string yaml = recipe_yaml(r, make_plan(checkpoint, plan_options_for(r)));
  expect_message(yaml, {"quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
                        "      scheme: \"W4A16\"\n      targets: [\"Linear\"]\n"
                        "      ignore: [\"lm_head\", \"model.embed_tokens\"]\n"});
}

// ---- through the binary ----

TEST(RecipeCli, DryRunSaysWhereEachValueCameFrom) {
  test::TempDir dir;
  const fs::path recipe = recipes_dir() / "written/w4a16_rtn.yaml";
  const auto r =
      test::run_ctquant({"quantize", llama_input().string(), (dir / "out").string(), "--recipe",
                         recipe.string(), "--ignore", "lm_head", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.out, {"scheme        W4A16  (" + recipe.string() + ":6)",
                         "targets       [\"Linear\"]  (" + recipe.string() + ":4)",
                         "ignore        [\"lm_head\"]  (command line)", "plan: W4A16"});
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// --ignore replaces the recipe's ignore list: the recipe's entries it drops
// are named in a warning (what they kept in 16 bits is quantized); a
// replaced scheme is an info line.
TEST(RecipeCli, ReplacedIgnoreListIsAWarningNamingTheDroppedEntries) {
  test::TempDir dir;
  test::write_file(dir / "r.yaml",
                   "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
                   "      scheme: W4A16\n      ignore: [lm_head, 're:.*down_proj$']\n");
  const auto r = test::run_ctquant({"quantize", llama_input().string(), (dir / "out").string(),
                                    "--recipe", (dir / "r.yaml").string(), "--scheme", "W8A16",
                                    "--ignore", "lm_head", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(
      r.err, {"info: --scheme W8A16 replaces the recipe's scheme (" + (dir / "r.yaml").string() +
                  ":4: W4A16)",
              "warning: --ignore replaces the recipe's ignore list (" + (dir / "r.yaml").string() +
                  ":5): its entries [\"re:.*down_proj$\"] are "
                  "not applied"});
}

// A bad pattern in a recipe or a --quantization-config file is named where
// it was written, not by --ignore or --targets.
TEST(RecipeCli, BadPatternIsNamedByItsFileAndKey) {
  test::TempDir dir;
  test::write_file(dir / "r.yaml",
                   "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
                   "      scheme: W4A16\n      ignore: [lm_head, 're:(bad']\n");
  const auto recipe = test::run_ctquant({"quantize", llama_input().string(), (dir / "out").string(),
                                         "--recipe", (dir / "r.yaml").string()});
  EXPECT_EQ(recipe.exit_code, 2) << recipe.err;
  expect_message(recipe.err,
                 {(dir / "r.yaml").string() + ":5: ignore 're:(bad': invalid regular expression"},
                 {"--ignore"});
  test::write_file(dir / "q.json",
                   R"({"config_groups": {"g": {"targets": ["re:(bad"], "weights": {"num_bits": 4,
                   "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}}}})");
  const auto config = test::run_ctquant({"quantize", llama_input().string(), (dir / "out").string(),
                                         "--quantization-config", (dir / "q.json").string()});
  EXPECT_EQ(config.exit_code, 2) << config.err;
  expect_message(config.err,
                 {"--quantization-config " + (dir / "q.json").string() +
                  ": config_groups.g.targets 're:(bad': invalid regular expression"},
                 {"--targets"});
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(RecipeCli, BadRecipeExitsTwoAndWritesNothing) {
  test::TempDir dir;
  test::write_file(dir / "bad.yaml", "quant_stage:\n  quant_modifiers:\n    GPTQModifier: {}\n");
  const auto r =
      test::run_ctquant({"quantize", llama_input().string(), (dir / "out").string(), "--recipe",
                         (dir / "bad.yaml").string(), "--write-recipe", (dir / "w.yaml").string(),
                         "--report", (dir / "r.json").string()});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"bad.yaml:3:", "GPTQModifier", "calibration"});
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / "w.yaml"));
  EXPECT_FALSE(fs::exists(dir / "r.json"));
  EXPECT_TRUE(test::temp_leftovers(dir.path()).empty());
}

TEST(RecipeCli, GroupSizeWithRecipeConfigGroupsExitsTwo) {
  test::TempDir dir;
  const auto r = test::run_ctquant(
      {"quantize", llama_input().string(), (dir / "out").string(), "--recipe",
       (recipes_dir() / "written/w4a16_asym_g64_groups.yaml").string(), "--group-size", "32"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"--group-size 32", "w4a16_asym_g64_groups.yaml:4: config_groups"});
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(RecipeCli, WriteRecipeRoundTripsThroughTheBinary) {
  test::TempDir dir;
  const auto first =
      test::run_ctquant({"quantize", llama_input().string(), (dir / "a").string(), "--scheme",
                         "W4A16_ASYM", "--group-size", "64", "--ignore", "re:.*down_proj$",
                         "--write-recipe", (dir / "recipe.yaml").string(), "--no-sync", "-q"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto second =
      test::run_ctquant({"quantize", llama_input().string(), (dir / "b").string(), "--recipe",
                         (dir / "recipe.yaml").string(), "--no-sync", "-q"});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(test::diff_bytes(dir / "b", dir / "a"), "");
}

TEST(RecipeCli, ReportAndRecipeInsideOutputAreUsageErrors) {
  test::TempDir dir;
  const auto r = test::run_ctquant({"quantize", llama_input().string(), (dir / "out").string(),
                                    "--report", (dir / "out" / "r.json").string()});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"--report", "inside OUTPUT"});
  EXPECT_FALSE(fs::exists(dir / "out"));
}

}  // namespace
}  // namespace ctquant
