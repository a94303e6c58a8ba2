#include "cli/plan_args.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/transform/transform.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant::cli {

namespace {

// Larger group sizes than any tensor's in_features are refused by the plan
// anyway; the bound keeps out-of-range numbers a usage error.
constexpr long long kMaxGroupSizeOption = 1LL << 32;

}  // namespace

CLI::Validator whole_number(long long min, long long max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        const std::string digits = !text.empty() && text[0] == '-' ? text.substr(1) : text;
        const bool well_formed =
            !digits.empty() && digits.size() <= 18 &&
            std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
        const long long value = well_formed ? std::stoll(text) : 0;
        if (well_formed && value >= min && value <= max) return {};
        if (!well_formed) return fmt::format("{} is not a whole number", text);
        return fmt::format("{} is out of range: expected a whole number from {} to {}", text, min,
                           max);
      },
      "INT", "whole_number");
}

CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "is empty: an empty path names no file or directory" : "";
      },
      "PATH", "non_empty_path");
}

std::vector<CLI::Option*> add_plan_options(CLI::App* app, PlanArgs& args) {
  std::vector<CLI::Option*> options;
  options.push_back(app->add_option_function<std::string>(
      "--scheme", [&args](const std::string& value) { args.scheme = value; },
      "Preset scheme (default W4A16): " + ctquant::preset_names() +
          ". What each writes and needs (in_features a multiple of 16 for NVFP4A16, 32 for the "
          "MX presets): docs/cli.md, docs/microscale.md, docs/fp8-int8.md; presets that need "
          "calibration data (NVFP4, FP8 static) are refused with the reason"));
  options.push_back(
      app->add_option_function<long long>(
             "--group-size", [&args](const long long& value) { args.group_size = value; },
             "Columns per group of W4A16, W4A16_ASYM and W8A16 (default 128); -1 for "
             "channel-wise, the only value W8A8 takes; the float presets have a fixed layout")
          ->check(whole_number(-1, kMaxGroupSizeOption)));
  options.push_back(app->add_option(
      "--convert-targets", args.convert_targets,
      "An input quantized by AutoAWQ or ModelOpt: the modules its converter takes (repeatable; "
      "default: AWQ Linear, ModelOpt the MLP and attention projections that hold NVFP4 "
      "weights), as compressed-tensors' converter targets (docs/converters.md)"));
  options.push_back(app->add_option(
      "--convert-ignore", args.convert_ignore,
      "An input quantized by AutoAWQ or ModelOpt: the converter's ignore list (repeatable; "
      "default: AWQ lm_head and modules_to_not_convert, ModelOpt the exact names of "
      "exclude_modules)"));
  options.push_back(app->add_option("--ignore", args.ignore,
                                    "Module to leave unquantized (repeatable): a name, or "
                                    "re:PATTERN matched like Python re.match; added to the "
                                    "default ignore list")
                        ->allow_extra_args(false));
  options.push_back(app->add_flag("--no-default-ignore", args.no_default_ignore,
                                  "Start from an empty ignore list instead of the default one "
                                  "(heads, embeddings, routers, plain layers, towers)"));
  options.push_back(app->add_flag("--quantize-vision", args.quantize_vision,
                                  "Quantize vision/audio towers and projectors too (kept in 16 "
                                  "bits by default)"));
  options.push_back(
      app->add_option("--targets", args.targets,
                      "Modules to quantize (repeatable): Linear (all), a name or re:PATTERN")
          ->allow_extra_args(false));
  options.push_back(
      app->add_option("--scheme-for", args.scheme_for,
                      "PATTERN=PRESET[@OBSERVER] (repeatable): modules matching PATTERN (a "
                      "name or re:PATTERN) get PRESET; tried in the order given, "
                      "before --scheme, which takes the rest; @OBSERVER wins over --observer")
          ->allow_extra_args(false));
  options.push_back(app->add_option("--quantization-config", args.quantization_config,
                                    "A compressed-tensors QuantizationConfig JSON file "
                                    "(config_groups, ignore), as model_free_ptq's config= takes")
                        ->check(CLI::ExistingFile));
  options.push_back(app->add_option("--tp", args.tp,
                                    "Tensor-parallel degree the checkpoint will be served with, "
                                    "for the Marlin shape check (lint L5)")
                        ->check(CLI::Range(1u, 1024u))
                        ->capture_default_str());
  options.push_back(app->add_option_function<std::string>(
      "--observer", [&args](const std::string& value) { args.observer = value; },
      "Weight observer of every group (default memoryless_minmax, model_free_ptq's): "
      "memoryless_mse (search of shrunk ranges for the lowest |Q - W|^2.4), nvfp4_expanded_mse "
      "(also wider ranges; for NVFP4); mse runs as memoryless_mse; refit (ctquant's own: the "
      "least-squares scale and integer zero point per group, same format); auto: per module, "
      "min-max, the MSE observer or refit, whichever gives the lowest weight error (reads the "
      "weights about five times); docs/observers.md"));
  options.push_back(app->add_option("--observer-kwarg", args.observer_kwargs,
                                    "KEY=VALUE (repeatable): an observer_kwargs entry of "
                                    "--observer (with auto: of the observer that takes it): "
                                    "maxshrink, grid, norm, patience, expand; refit: steps, "
                                    "span, refits, weight, p, beta, kappa, iters, codes")
                        ->allow_extra_args(false));
  options.push_back(
      app->add_option(
             "--transform", args.transform,
             "Rewrite the BF16 model before quantizing into one computing the same function: "
             "balance (per input column, t = mean |W| over the rows of every Linear reading it, "
             "W / t, the norm or producing rows times t; Llama, Mistral, Qwen3, Qwen3-MoE and "
             "Mixtral) or rotate (offline Hadamard R1 and R2, norms folded, a tied head untied; "
             "the same families; writes the rotated source beside OUTPUT first). docs/cli.md")
          ->check(CLI::Validator(
              [](std::string& text) -> std::string {
                return text.empty() ? "is empty: name a transform (balance, rotate)" : "";
              },
              "NAME", "non_empty_transform")));
  options.push_back(app->add_flag(
      "--optimize", args.optimize,
      "Each group's weights with the observer docs/accuracy.md measured best for its scheme (the "
      "lowest KL divergence on its models, at the same bits per weight): memoryless_mse for "
      "W4A16, refit for W4A16_ASYM, W8A16 and 2-3 bits, nvfp4_expanded_mse for NVFP4A16; "
      "min-max kept where nothing measured better; not with --observer"));
  options.push_back(app->add_option("--recipe", args.recipe,
                                    "llm-compressor recipe YAML with a data-free "
                                    "QuantizationModifier (scheme or config_groups, targets, "
                                    "ignore); options given here override it"));
  return options;
}

ResolvedPlan resolve_plan(const PlanArgs& args) {
  ResolvedPlan plan;
  if (!args.recipe.empty()) {
    plan.recipe = std::make_unique<ctquant::RecipeSpec>(ctquant::parse_recipe(args.recipe));
  }
  ctquant::CommandLinePlan cli;
  cli.scheme = args.scheme;
  cli.group_size = args.group_size;
  cli.ignore = args.ignore;
  cli.targets = args.targets;
  cli.scheme_for = args.scheme_for;
  cli.quantization_config = args.quantization_config;
  cli.observer = args.observer;
  cli.observer_kwargs = args.observer_kwargs;
  plan.effective = ctquant::resolve_recipe(plan.recipe.get(), cli);
  plan.options = ctquant::plan_options_for(plan.effective);
  // The given entries add to the module roles' default list (plan.hpp).
  plan.options.default_ignore = !args.no_default_ignore;
  plan.options.quantize_vision = args.quantize_vision;
  // An input a converter takes is only converted unless a scheme is asked
  // for (plan.hpp, PlanOptions::scheme_given).
  if (!args.convert_targets.empty()) {
    // Checked here so that a bad pattern is named by its own option.
    (void)ctquant::ModuleMatcher(args.convert_targets, ctquant::ModuleMatcher::Role::kTargets,
                                 "--convert-targets");
    plan.options.convert.targets = args.convert_targets;
  }
  if (!args.convert_ignore.empty()) {
    (void)ctquant::ModuleMatcher(args.convert_ignore, ctquant::ModuleMatcher::Role::kIgnore,
                                 "--convert-ignore");
    plan.options.convert.ignore = args.convert_ignore;
  }
  plan.options.scheme_given = args.scheme.has_value() || args.group_size.has_value() ||
                              !args.scheme_for.empty() || !args.quantization_config.empty() ||
                              !args.recipe.empty();
  if (!args.transform.empty()) {
    ctquant::find_transform(args.transform);  // an unknown name is a usage error
    plan.options.transform = args.transform;
  }
  if (args.optimize) {
    if (plan.effective.observer) {
      throw ctquant::usage_error(fmt::format(
          "--optimize chooses each group's observer, and {} names one ({}): give one of them",
          plan.effective.observer_origin.kind == ctquant::ValueOrigin::Kind::kCommandLine
              ? "--observer"
              : "the recipe's weight_observer",
          *plan.effective.observer));
    }
    // A --scheme-for @OBSERVER is asked for by name, min-max included (a
    // written config's group naming memoryless_minmax, its default, takes
    // the table's choice).
    for (const std::string& spec : args.scheme_for) {
      if (ctquant::scheme_for_names_observer(spec)) {
        throw ctquant::usage_error(fmt::format(
            "--optimize chooses each group's observer, and --scheme-for '{}' names one: drop "
            "the @OBSERVER, or drop --optimize",
            spec));
      }
    }
    for (const ctquant::SchemeGroup& g : plan.options.groups) {
      if (g.weights.observer != "memoryless_minmax" || !g.weights.observer_kwargs.empty()) {
        throw ctquant::usage_error(fmt::format(
            "--optimize chooses each group's observer, and config group '{}' names one ({}): "
            "drop the observer from the group (its config file, recipe or --scheme-for "
            "@OBSERVER), or drop --optimize",
            g.name, g.weights.observer));
      }
    }
    plan.optimized = ctquant::apply_optimize(plan.options);
  }
  return plan;
}

void add_revision_option(CLI::App* app, std::optional<std::string>& revision) {
  app->add_option_function<std::string>(
      "--revision", [&revision](const std::string& value) { revision = value; },
      "With a Hugging Face repository id (ORG/NAME): the branch, tag or commit hash of the cached "
      "snapshot to read (default main)");
}

void add_verbosity_flags(CLI::App* app, int& verbosity) {
  app->add_flag_function(
      "-q,--quiet", [&](std::int64_t) { verbosity = -1; }, "Print errors only");
  CLI::Option* quiet = app->get_option("--quiet");
  app->add_flag_function(
         "-v,--verbose", [&](std::int64_t) { verbosity = 1; }, "Print debug detail")
      ->excludes(quiet);
}

}  // namespace ctquant::cli
