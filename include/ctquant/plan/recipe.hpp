// llm-compressor recipes, in and out.
//
// A recipe (llm-compressor `recipe/recipe.py`, `Recipe.from_dict`) is a YAML
// mapping of stages (keys ending in `_stage`) holding modifier groups (keys
// ending in `_modifiers`) holding modifiers by type name. ctquant reads the
// one data-free modifier llm-compressor has, `QuantizationModifier`, with
// `scheme` (a preset name, or a mapping of preset names to targets) or
// `config_groups` (compressed-tensors QuantizationScheme objects, or a preset
// name mapped to targets), `targets` and `ignore`
// (`modifiers/quantization/quantization/mixin.py`, QuantizationMixin), and
// refuses everything it cannot honour, naming the file, the line and the key:
// calibration-based modifiers (GPTQModifier, AWQModifier, SmoothQuantModifier,
// ...), activation quantization that is not dynamic, a kv_cache_scheme,
// observer overrides, and any key it does not know. llm-compressor itself
// ignores unknown top-level keys and groups silently; ctquant does not.
//
// parse_recipe() (recipe_reader.hpp) gives a RecipeSpec: the values of the
// file, each with the line it came from. resolve_recipe() merges it with the command line
// (options given there win; a combination that cannot be resolved, such as
// --group-size with config_groups, is a usage error) into an EffectiveRecipe,
// which says where each value came from. recipe_yaml() writes an
// EffectiveRecipe back as a recipe that llm-compressor's `oneshot` accepts
// and that parse_recipe() reads into the same plan.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/plan/plan.hpp"
#include "ctquant/plan/recipe_reader.hpp"

namespace ctquant {

// Where an effective value came from.
struct ValueOrigin {
  enum class Kind { kDefault, kCommandLine, kRecipe };
  Kind kind = Kind::kDefault;
  std::string file;  // kRecipe: the recipe file as given
  int line = 0;      // kRecipe: 1-based line of the value
  std::string note;  // why, when the value is implied (e.g. llm-compressor's default)

  // "default", "command line", or "FILE:LINE", then " (note)" if any.
  std::string describe() const;
  // {"source": "default" | "command_line" | "recipe", "file", "line", "note"}
  // (file and line only for a recipe, note only when set).
  nlohmann::json to_json() const;
};

// The quantize options given on the command line, before defaults.
struct CommandLinePlan {
  std::optional<std::string> scheme;
  std::optional<long long> group_size;       // -1: channel-wise
  std::vector<std::string> ignore;           // empty: not given
  std::vector<std::string> targets;          // empty: not given
  std::vector<std::string> scheme_for;       // PATTERN=PRESET, tried before the scheme
  std::string quantization_config;           // a QuantizationConfig JSON file, or empty
  std::optional<std::string> observer;       // --observer: every group's weight observer
  std::vector<std::string> observer_kwargs;  // --observer-kwarg KEY=VALUE
};

// What a run quantizes with, in recipe terms, and where each value came from.
struct EffectiveRecipe {
  // Exactly one of scheme and config_groups is set.
  std::optional<std::string> scheme;
  std::optional<nlohmann::json> config_groups;
  // The order the config groups are tried in, when it is not the object's
  // (key) order: the order of a --quantization-config file.
  std::vector<std::string> config_group_order;
  std::optional<long long> group_size;  // overrides the preset's; -1: channel-wise
  std::vector<std::string> targets;     // with scheme (config groups carry their own)
  std::vector<std::string> scheme_for;  // with scheme: PATTERN=PRESET groups tried first
  std::vector<std::string> ignore;
  // The weights' observer of every group, when given (--observer, the
  // recipe's weight_observer), and --observer-kwarg's observer_kwargs.
  std::optional<std::string> observer;
  nlohmann::json observer_kwargs;  // null: not given
  ValueOrigin observer_origin;
  ValueOrigin scheme_origin;  // of scheme or config_groups
  ValueOrigin group_size_origin;
  ValueOrigin targets_origin;
  ValueOrigin ignore_origin;
  const RecipeSpec* recipe = nullptr;  // the recipe read, if any (for messages)
  // One line per recipe value a command-line option replaced ("--scheme
  // W8A16 replaces the recipe's scheme (r.yaml:4: W4A16)"), logged as info;
  // and, when --ignore replaces the recipe's ignore list, the line naming the
  // recipe entries it drops, logged as a warning (what they kept in 16 bits
  // is quantized), or "".
  std::vector<std::string> overridden;
  std::string ignore_dropped;
};

// Merges a recipe (or none) with the command line: a command-line value
// replaces the recipe's, which replaces the default (W4A16, targets
// ["Linear"], no ignore entry: the plan starts from the module roles'
// default list, PlanOptions::default_ignore). A --quantization-config file gives the
// config groups and the ignore list (--ignore entries appended). Throws
// Error{kUsage} naming the recipe's file, line and key when they cannot be
// merged: --group-size, --targets, --scheme or --scheme-for together with
// config_groups (each group has its own weights and targets), a recipe
// together with --quantization-config.
EffectiveRecipe resolve_recipe(const RecipeSpec* recipe, const CommandLinePlan& command_line);

// The planner's options for an effective recipe: the --scheme-for groups,
// then the scheme's (or the config groups, read by plan_options_from_config).
// Throws Error{kUsage} naming the recipe's file and line (or the option) for
// a scheme or config group ctquant does not write, and for invalid group
// sizes.
PlanOptions plan_options_for(const EffectiveRecipe& recipe);

// The effective recipe as llm-compressor recipe YAML (one stage `quant_stage`,
// group `quant_modifiers`, one QuantizationModifier): `scheme`, `targets` and
// `ignore` when a preset is used as it is, otherwise `config_groups` (taken
// from the compressed-tensors quantization_config the plan writes, without
// the per-group `format`) and `ignore`. Strings are double-quoted, nested
// values written as JSON flow collections (valid YAML); no timestamp.
std::string recipe_yaml(const EffectiveRecipe& recipe, const QuantizePlan& plan);

// The effective recipe as JSON for reports: {"scheme" | "config_groups",
// "group_size", "targets", "ignore", "origins": {key: ValueOrigin::to_json}}.
nlohmann::json effective_recipe_json(const EffectiveRecipe& recipe);

// Lines for `--dry-run` and logs: "  scheme   W4A16   (recipe.yaml:5)" per value.
// default_ignore: whether the module roles' default ignore entries are added
// (false with --no-default-ignore), which the ignore line says.
std::string render_recipe_origins(const EffectiveRecipe& recipe, bool default_ignore = true);

}  // namespace ctquant
