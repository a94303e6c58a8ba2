#include "ctquant/plan/recipe.hpp"

#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/registry.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/config.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "ctquant/util/version.hpp"

namespace ctquant {

using nlohmann::json;

// ---- origins ----

std::string ValueOrigin::describe() const {
  std::string text;
  switch (kind) {
    case Kind::kDefault:
      text = "default";
      break;
    case Kind::kCommandLine:
      text = "command line";
      break;
    case Kind::kRecipe:
      text = fmt::format("{}:{}", file, line);
      break;
  }
  if (!note.empty()) text += fmt::format(" ({})", note);
  return text;
}

json ValueOrigin::to_json() const {
  json j;
  switch (kind) {
    case Kind::kDefault:
      j["source"] = "default";
      break;
    case Kind::kCommandLine:
      j["source"] = "command_line";
      break;
    case Kind::kRecipe:
      j["source"] = "recipe";
      j["file"] = file;
      j["line"] = line;
      break;
  }
  if (!note.empty()) j["note"] = note;
  return j;
}

// ---- resolving and writing ----

namespace {

// A JSON string for messages; bytes that are not UTF-8 (refused later by
// the planner, naming them) become U+FFFD here instead of throwing.
std::string quoted(const std::string& text) {
  return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string list_text(const std::vector<std::string>& items) {
  std::string text = "[";
  for (std::size_t i = 0; i < items.size(); ++i) text += (i > 0 ? ", " : "") + quoted(items[i]);
  return text + "]";
}

ValueOrigin recipe_origin(const RecipeSpec& recipe, int line, std::string note = {}) {
  return ValueOrigin{ValueOrigin::Kind::kRecipe, recipe.file, line, std::move(note)};
}

ValueOrigin command_line_origin() {
  return ValueOrigin{ValueOrigin::Kind::kCommandLine, {}, 0, {}};
}

// Where a value of the effective recipe is named in messages.
std::string origin_label(const ValueOrigin& origin, const std::string& key,
                         const std::string& option) {
  if (origin.kind == ValueOrigin::Kind::kRecipe)
    return fmt::format("{}: {}", origin.describe(), key);
  return option;
}

// Compiles entries (ignore or targets) now, so that a bad pattern is named
// by where it was written ("r.yaml:5: ignore 're:(': invalid regular
// expression ..."), not by a command-line option the user did not give.
void check_patterns(const std::vector<std::string>& entries, ModuleMatcher::Role role,
                    const std::string& what) {
  const ModuleMatcher matcher(entries, role, what.c_str());
}

// A preset as the registry spells it ("W4A16" for "w4a16", as
// compressed-tensors upper-cases it to look it up); an unknown name as it
// is, for plan_options_for to refuse.
std::string canonical_preset_name(const std::string& name) {
  const Preset* preset = find_preset(name);
  return preset != nullptr ? std::string(preset->name) : name;
}

// A string as a YAML double-quoted scalar (JSON string escapes are YAML's).
std::string yaml_string(const std::string& text) { return json(text).dump(); }

std::string yaml_list(const std::vector<std::string>& items) {
  std::string text = "[";
  for (std::size_t i = 0; i < items.size(); ++i)
    text += (i > 0 ? ", " : "") + yaml_string(items[i]);
  return text + "]";
}

// --observer over the recipe's weight_observer; --observer-kwarg KEY=VALUE
// (VALUE a JSON number, as observer_kwargs hold them, or a word, a string).
void resolve_observer_option(EffectiveRecipe& r, const RecipeSpec* recipe,
                             const CommandLinePlan& cli) {
  if (cli.observer) {
    r.observer = *cli.observer;
    r.observer_origin = command_line_origin();
  } else if (recipe != nullptr && recipe->weight_observer) {
    r.observer = recipe->weight_observer->value;
    r.observer_origin = recipe_origin(*recipe, recipe->weight_observer->line);
  }
  if (cli.observer_kwargs.empty()) return;
  if (!r.observer) {
    throw usage_error(
        "--observer-kwarg needs --observer (or the recipe's weight_observer): the kwargs are the "
        "observer's");
  }
  r.observer_kwargs = json::object();
  for (const std::string& kv : cli.observer_kwargs) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw usage_error(
          fmt::format("--observer-kwarg '{}': expected KEY=VALUE, e.g. norm=2.4", kv));
    }
    // A key given twice: the JSON object would keep one value silently (a
    // config file's repeated key is refused too).
    if (r.observer_kwargs.contains(kv.substr(0, eq))) {
      throw usage_error(fmt::format(
          "--observer-kwarg '{}': {} is given twice; give each kwarg once", kv, kv.substr(0, eq)));
    }
    const std::string text = kv.substr(eq + 1);
    const json value = json::parse(text, nullptr, false);
    if (value.is_discarded() || !value.is_number()) {
      // inf, nan, Infinity: numbers to strtod, not to JSON, and not finite.
      char* end = nullptr;
      const double d = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
      if (!text.empty() && end == text.c_str() + text.size() && !std::isfinite(d)) {
        throw usage_error(fmt::format(
            "--observer-kwarg '{}': observer_kwargs.{} {} is not finite (every observer kwarg "
            "must be a finite number)",
            kv, kv.substr(0, eq), text));
      }
      // A word is a string kwarg (refit's weight=x2); the observer checks
      // each kwarg's type.
      const bool word = !text.empty() && std::isalpha(static_cast<unsigned char>(text[0])) &&
                        std::all_of(text.begin(), text.end(),
                                    [](unsigned char ch) { return std::isalnum(ch) || ch == '_'; });
      if (!word) {
        throw usage_error(
            fmt::format("--observer-kwarg '{}': VALUE must be a number (or a word, such as refit's "
                        "weight=x2)",
                        kv));
      }
      r.observer_kwargs[kv.substr(0, eq)] = text;
      continue;
    }
    r.observer_kwargs[kv.substr(0, eq)] = value;
  }
}

// Sets every group's weight observer to the one given for the run.
// own_observer: the names of the groups whose --scheme-for names their
// observer (PRESET@OBSERVER); the more specific choice wins over --observer
// and the recipe's weight_observer, and --observer auto, which measures
// every group's modules, refuses them.
void apply_observer(PlanOptions& options, const EffectiveRecipe& r,
                    const std::set<std::string>& own_observer = {}) {
  if (!r.observer) return;
  const std::string where = origin_label(r.observer_origin, "observer", "--observer");
  if (*r.observer == "auto" && !own_observer.empty()) {
    throw usage_error(fmt::format(
        "{} auto chooses every module's observer, and --scheme-for group {} names one: drop "
        "the @OBSERVER from --scheme-for, or give --observer a name",
        where, *own_observer.begin()));
  }
  if (*r.observer == "auto") {
    // Planned with min-max; quantize measures every module with both
    // observers and splits the groups (exec/observer_choice.hpp).
    for (SchemeGroup& g : options.groups) {
      g.weights.observer = "memoryless_minmax";
      g.weights.observer_kwargs = json::object();
    }
    if (!r.observer_kwargs.is_null()) {
      const auto [mse, refit] = split_auto_kwargs(r.observer_kwargs);
      observer_params("memoryless_mse", mse, "--observer-kwarg");
      observer_params(kRefitObserver, refit, "--observer-kwarg");
    }
    return;
  }
  const ObserverChoice choice = resolve_observer(*r.observer, where);
  if (!choice.note.empty()) add_observer_note(choice.note);
  for (SchemeGroup& g : options.groups) {
    if (own_observer.contains(g.name)) continue;
    g.weights.observer = choice.written;
    g.weights.observer_kwargs = r.observer_kwargs.is_null() ? json::object() : r.observer_kwargs;
    observer_params(g.weights.observer, g.weights.observer_kwargs,
                    r.observer_kwargs.is_null() ? where : std::string("--observer-kwarg"));
    const SchemeFamily* family = g.family();
    const std::string why = family != nullptr ? family->supports(g.weights) : std::string();
    if (!why.empty()) {
      throw usage_error(fmt::format("{} {}: config group {}: {}", where, *r.observer, g.name, why));
    }
  }
}

}  // namespace

EffectiveRecipe resolve_recipe(const RecipeSpec* recipe, const CommandLinePlan& cli) {
  EffectiveRecipe r;
  r.recipe = recipe;
  if (!cli.quantization_config.empty()) {
    // The config file says everything a recipe would.
    for (const auto& [given, flag] : {std::pair{cli.scheme.has_value(), "--scheme"},
                                      std::pair{cli.group_size.has_value(), "--group-size"},
                                      std::pair{!cli.targets.empty(), "--targets"},
                                      std::pair{!cli.scheme_for.empty(), "--scheme-for"},
                                      std::pair{recipe != nullptr, "--recipe"}}) {
      if (given) {
        throw usage_error(fmt::format(
            "{} does not apply with --quantization-config: the config's groups say which "
            "scheme each module gets (write it into the config instead)",
            flag));
      }
    }
    const PlanOptions file = read_quantization_config(cli.quantization_config);
    const std::string label = "--quantization-config " + cli.quantization_config + ": ";
    check_patterns(file.ignore, ModuleMatcher::Role::kIgnore, label + "ignore");
    for (const SchemeGroup& g : file.groups) {
      check_patterns(g.targets, ModuleMatcher::Role::kTargets,
                     label + "config_groups." + g.name + ".targets");
    }
    // Each group as the file gives it (format null: no module yet).
    std::vector<ConfigGroup> config_groups;
    for (const SchemeGroup& g : file.groups) {
      config_groups.push_back(ConfigGroup{g.name, g.targets, quant_args_json(g.weights),
                                          g.input_activations, std::nullopt});
    }
    json groups = quantization_config(config_groups, {})["config_groups"];
    // Keep the file's order: the groups are tried in it.
    nlohmann::ordered_json ordered = nlohmann::ordered_json::object();
    for (const SchemeGroup& g : file.groups) ordered[g.name] = groups[g.name];
    r.config_groups = json::parse(ordered.dump());
    r.config_group_order.clear();
    for (const SchemeGroup& g : file.groups) r.config_group_order.push_back(g.name);
    r.scheme_origin = ValueOrigin{
        ValueOrigin::Kind::kCommandLine, {}, 0, "--quantization-config " + cli.quantization_config};
    r.ignore = file.ignore;
    r.ignore.insert(r.ignore.end(), cli.ignore.begin(), cli.ignore.end());
    r.ignore_origin = r.scheme_origin;
    if (!cli.ignore.empty()) r.ignore_origin.note += " and --ignore";
    resolve_observer_option(r, recipe, cli);
    return r;
  }
  if (!cli.scheme_for.empty()) {
    if (recipe != nullptr && recipe->config_groups) {
      throw usage_error(fmt::format(
          "--scheme-for does not apply to {}:{}: config_groups of the recipe: add the group "
          "there",
          recipe->file, recipe->config_groups->line));
    }
    r.scheme_for = cli.scheme_for;
  }
  // Scheme or config groups.
  if (recipe != nullptr && recipe->config_groups) {
    const std::string at =
        fmt::format("{}:{}: config_groups", recipe->file, recipe->config_groups->line);
    if (cli.scheme) {
      throw usage_error(fmt::format(
          "--scheme {} contradicts {} of the recipe (each config group has its own weights): "
          "drop --scheme, or use a recipe with scheme:",
          *cli.scheme, at));
    }
    if (cli.group_size) {
      throw usage_error(fmt::format(
          "--group-size {} does not apply to {} of the recipe: set group_size in the group's "
          "weights",
          *cli.group_size, at));
    }
    if (!cli.targets.empty()) {
      throw usage_error(fmt::format(
          "--targets does not apply to {} of the recipe: each config group has its own targets",
          at));
    }
    r.config_groups = recipe->config_groups->value;
    // Groups are tried in the order written: their lines give it.
    for (const auto& [name, group] : r.config_groups->items()) r.config_group_order.push_back(name);
    std::stable_sort(r.config_group_order.begin(), r.config_group_order.end(),
                     [&](const std::string& a, const std::string& b) {
                       const auto la = recipe->lines.find("config_groups." + a);
                       const auto lb = recipe->lines.find("config_groups." + b);
                       return (la == recipe->lines.end() ? 0 : la->second) <
                              (lb == recipe->lines.end() ? 0 : lb->second);
                     });
    r.scheme_origin = recipe_origin(*recipe, recipe->config_groups->line);
  } else if (cli.scheme) {
    r.scheme = canonical_preset_name(*cli.scheme);
    r.scheme_origin = command_line_origin();
    if (recipe != nullptr && recipe->scheme &&
        canonical_preset_name(recipe->scheme->value) != *r.scheme) {
      r.overridden.push_back(fmt::format("--scheme {} replaces the recipe's scheme ({}:{}: {})",
                                         *r.scheme, recipe->file, recipe->scheme->line,
                                         recipe->scheme->value));
    }
  } else if (recipe != nullptr && recipe->scheme) {
    r.scheme = canonical_preset_name(recipe->scheme->value);
    r.scheme_origin = recipe_origin(*recipe, recipe->scheme->line);
  } else {
    r.scheme = "W4A16";
    r.scheme_origin = recipe != nullptr
                          ? ValueOrigin{ValueOrigin::Kind::kDefault,
                                        {},
                                        0,
                                        "the recipe gives neither scheme nor config_groups"}
                          : ValueOrigin{};
  }
  if (cli.group_size) {
    r.group_size = *cli.group_size;
    r.group_size_origin = command_line_origin();
  }
  // Targets (with a scheme only).
  if (!r.config_groups) {
    if (!cli.targets.empty()) {
      r.targets = cli.targets;
      r.targets_origin = command_line_origin();
      if (recipe != nullptr && recipe->targets && recipe->targets->value != cli.targets) {
        r.overridden.push_back(fmt::format("--targets replaces the recipe's targets ({}:{}: {})",
                                           recipe->file, recipe->targets->line,
                                           list_text(recipe->targets->value)));
      }
    } else if (recipe != nullptr && recipe->targets) {
      r.targets = recipe->targets->value;
      r.targets_origin = recipe_origin(*recipe, recipe->targets->line);
      check_patterns(r.targets, ModuleMatcher::Role::kTargets,
                     fmt::format("{}:{}: targets", recipe->file, recipe->targets->line));
    } else {
      r.targets = kDefaultTargets;
    }
  }
  resolve_observer_option(r, recipe, cli);
  // Ignore list.
  if (!cli.ignore.empty()) {
    r.ignore = cli.ignore;
    r.ignore_origin = command_line_origin();
    if (recipe != nullptr && recipe->ignore) {
      std::vector<std::string> dropped;
      for (const std::string& e : recipe->ignore->value) {
        if (std::find(cli.ignore.begin(), cli.ignore.end(), e) == cli.ignore.end()) {
          dropped.push_back(e);
        }
      }
      if (!dropped.empty()) {
        r.ignore_dropped = fmt::format(
            "--ignore replaces the recipe's ignore list ({}:{}): its entries {} are not applied, "
            "so what they kept in 16 bits is quantized unless another entry keeps it; give them "
            "to --ignore too to keep them",
            recipe->file, recipe->ignore->line, list_text(dropped));
      }
    }
  } else if (recipe != nullptr && recipe->ignore) {
    r.ignore = recipe->ignore->value;
    r.ignore_origin = recipe_origin(*recipe, recipe->ignore->line);
    check_patterns(r.ignore, ModuleMatcher::Role::kIgnore,
                   fmt::format("{}:{}: ignore", recipe->file, recipe->ignore->line));
  } else if (recipe != nullptr) {
    // llm-compressor's QuantizationModifier ignores nothing unless told.
    r.ignore = {};
    r.ignore_origin = recipe_origin(*recipe, recipe->modifier_line,
                                    "QuantizationModifier without ignore: llm-compressor's "
                                    "default, nothing ignored beyond the default list");
  } else {
    // The plan starts from the module roles' default list (plan.hpp).
    r.ignore = {};
  }
  return r;
}

PlanOptions plan_options_for(const EffectiveRecipe& r) {
  PlanOptions options;
  options.groups.clear();
  options.ignore = r.ignore;
  if (r.scheme) {
    const std::string where = origin_label(r.scheme_origin, "scheme", "--scheme");
    std::set<std::string> own_observer;
    for (const std::string& spec : r.scheme_for) {
      SchemeGroup g = scheme_for_group(spec);
      if (scheme_for_names_observer(spec)) own_observer.insert(g.name);
      add_scheme_group(options, std::move(g));
    }
    SchemeGroup main;
    try {
      main = preset_group(*r.scheme);
    } catch (const Error& e) {
      throw usage_error(fmt::format("{}: {}", where, e.what()));
    }
    main.targets = r.targets;
    if (r.group_size) apply_group_size(main, *r.group_size);
    add_scheme_group(options, std::move(main));
    apply_observer(options, r, own_observer);
    return options;
  }
  // Config groups, one at a time so that each message names its place and
  // the groups keep their order (they are tried in it).
  const RecipeSpec* recipe = r.recipe;
  const auto where = [&](const std::string& path) {
    return recipe != nullptr ? recipe->where(path) + ": " + path
                             : r.scheme_origin.describe() + ": " + path;
  };
  std::vector<std::string> names = r.config_group_order;
  if (names.empty()) {
    for (const auto& [name, group] : r.config_groups->items()) names.push_back(name);
  }
  for (const std::string& name : names) {
    const json one = {{"config_groups", {{name, r.config_groups->at(name)}}}};
    PlanOptions parsed = plan_options_from_config(one, where("config_groups." + name));
    SchemeGroup& group = parsed.groups.front();
    check_patterns(group.targets, ModuleMatcher::Role::kTargets,
                   where("config_groups." + name + ".targets"));
    const SchemeFamily* family = group.family();
    const std::string why = family != nullptr ? family->supports(group.weights) : std::string();
    if (family == nullptr || !why.empty()) {
      const QuantArgs& w = group.weights;
      throw usage_error(fmt::format(
          "{}: type \"{}\", num_bits {}, strategy \"{}\"{}: {}",
          where("config_groups." + name + ".weights"),
          w.type == QuantArgs::Type::kInt ? "int" : "float", w.num_bits, strategy_name(w.strategy),
          group.input_activations.is_null() ? "" : ", with input activations",
          family == nullptr ? std::string("no output format ctquant writes fits these weights (") +
                                  "it writes " + preset_names() + ")"
                            : why));
    }
    options.groups.push_back(std::move(group));
  }
  apply_observer(options, r);
  return options;
}

std::string recipe_yaml(const EffectiveRecipe& r, const QuantizePlan& plan) {
  std::string text = fmt::format(
      "# llm-compressor recipe written by ctquant {}: the data-free QuantizationModifier of\n"
      "# this run. Reproduce it with ctquant quantize --recipe FILE, or with llm-compressor's\n"
      "# oneshot(model=..., recipe=FILE).\n",
      ctquant_version());
  if (plan.rewrite) {
    // A ctquant rewrite is not a field of the recipe: it is named so that
    // whoever reproduces the run gives it again.
    text += fmt::format(
        "# The weights were rewritten first with ctquant's --transform {} (config.json's\n"
        "# ctquant_transform): give it again with --recipe; llm-compressor does not read it.\n",
        plan.rewrite->transform);
  }
  text += "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n";
  // A preset alone when it says everything: no group size, no per-pattern
  // schemes, no observer (config groups carry weights.observer), and the
  // plan's one group (--target-bits and --more-bits split it) with min-max.
  // An observer set otherwise (--optimize) is carried by the config groups.
  const auto default_observer = [](const SchemeGroup& g) {
    return g.weights.observer == "memoryless_minmax" && g.weights.observer_kwargs.empty();
  };
  if (r.scheme && !r.group_size && r.scheme_for.empty() && !r.observer &&
      plan.options.groups.size() == 1 && default_observer(plan.options.groups[0])) {
    text += fmt::format("      scheme: {}\n", yaml_string(upper(*r.scheme)));
    text += fmt::format("      targets: {}\n", yaml_list(r.targets));
  } else {
    // In the order the groups are tried.
    text += "      config_groups:\n";
    const json& groups = plan.config.at("quantization_config").at("config_groups");
    for (const SchemeGroup& g : plan.options.groups) {
      // A group that quantized nothing is not in config.json, nor here.
      if (!groups.contains(g.name)) continue;
      const json& group = groups.at(g.name);
      text += fmt::format("        {}:\n", yaml_string(g.name));
      for (const auto& [field, value] : group.items()) {
        if (field == "format") continue;  // inferred from the weights, as llm-compressor does
        text += fmt::format("          {}: {}\n", field, value.dump());
      }
    }
  }
  // The list written to config.json: the module roles' defaults and the
  // given entries.
  text += fmt::format("      ignore: {}\n", yaml_list(plan.options.ignore));
  return text;
}

json effective_recipe_json(const EffectiveRecipe& r) {
  json j;
  json origins;
  if (r.scheme) {
    j["scheme"] = *r.scheme;
    origins["scheme"] = r.scheme_origin.to_json();
    j["group_size"] = r.group_size ? json(*r.group_size) : json(nullptr);
    origins["group_size"] = r.group_size_origin.to_json();
    j["targets"] = r.targets;
    origins["targets"] = r.targets_origin.to_json();
  } else {
    j["config_groups"] = *r.config_groups;
    origins["config_groups"] = r.scheme_origin.to_json();
  }
  j["ignore"] = r.ignore;
  origins["ignore"] = r.ignore_origin.to_json();
  j["origins"] = origins;
  return j;
}

std::string render_recipe_origins(const EffectiveRecipe& r, bool default_ignore) {
  std::string text = "options:\n";
  auto line = [&](const char* key, const std::string& value, const ValueOrigin& origin) {
    text += fmt::format("  {:<13} {}  ({})\n", key, value, origin.describe());
  };
  if (r.scheme) {
    line("scheme", upper(*r.scheme), r.scheme_origin);
    if (r.group_size) line("group_size", std::to_string(*r.group_size), r.group_size_origin);
    line("targets", list_text(r.targets), r.targets_origin);
  } else {
    std::vector<std::string> names;
    for (const auto& [name, group] : r.config_groups->items()) names.push_back(name);
    line("config_groups", list_text(names), r.scheme_origin);
  }
  // The entries given; the list written to config.json also holds the
  // module roles' defaults (unless --no-default-ignore), which the plan's
  // "ignore entries" section lists.
  const std::string given = r.ignore.empty() ? "none given" : list_text(r.ignore);
  const std::string origin = r.ignore.empty() ? (r.ignore_origin.describe() == "default"
                                                     ? std::string()
                                                     : " (" + r.ignore_origin.describe() + ")")
                                              : "  (" + r.ignore_origin.describe() + ")";
  if (!default_ignore) {
    text += fmt::format("  {:<13} {}{}, and no module role's default (--no-default-ignore)\n",
                        "ignore", given, origin);
  } else if (r.ignore.empty()) {
    text += fmt::format("  {:<13} none given{}; the module roles' defaults\n", "ignore", origin);
  } else {
    text += fmt::format("  {:<13} {}{}, added to the module roles' defaults\n", "ignore", given,
                        origin);
  }
  return text;
}

}  // namespace ctquant
