#include "ctquant/plan/recipe.hpp"

#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/registry.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "ctquant/format/config.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "ctquant/util/version.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;
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

std::string RecipeSpec::where(const std::string& path) const {
  std::string p = path;
  for (;;) {
    const auto it = lines.find(p);
    if (it != lines.end()) return fmt::format("{}:{}", file, it->second);
    const auto cut = p.find_last_of(".[");
    if (cut == std::string::npos) break;
    p.resize(cut);
  }
  return fmt::format("{}:{}", file, modifier_line);
}

namespace {

// A recipe is a few KiB; the bound keeps a hostile file from costing memory.
constexpr std::uint64_t kMaxRecipeBytes = 1u << 20;

// The llm-compressor modifiers ctquant does not run, and why
// (llm-compressor `src/llmcompressor/modifiers/`).
struct RefusedModifier {
  const char* name;
  const char* reason;
};
constexpr RefusedModifier kRefusedModifiers[] = {
    {"GPTQModifier", "calibration-based (GPTQ needs calibration data)"},
    {"AWQModifier", "calibration-based (AWQ needs calibration data)"},
    {"AutoRoundModifier", "calibration-based (AutoRound needs calibration data)"},
    {"SmoothQuantModifier", "calibration-based (SmoothQuant needs activation statistics)"},
    {"LogarithmicEqualizationModifier",
     "calibration-based (logarithmic equalization needs activation statistics)"},
    {"SparseGPTModifier", "calibration-based pruning (SparseGPT needs calibration data)"},
    {"WandaPruningModifier", "calibration-based pruning (Wanda needs calibration data)"},
    {"REAPPruningModifier", "calibration-based pruning (REAP needs calibration data)"},
    {"MagnitudePruningModifier", "pruning (ctquant writes no sparsity)"},
    {"ConstantPruningModifier", "pruning (ctquant writes no sparsity)"},
    {"QuIPModifier", "a transform (ctquant applies no rotations)"},
    {"SpinQuantModifier", "a transform (ctquant applies no rotations)"},
};

// QuantizationScheme fields (compressed-tensors `quantization/quant_scheme.py`).
const std::set<std::string> kSchemeKeys = {"targets", "weights", "input_activations",
                                           "output_activations", "format"};
// QuantizationArgs fields (compressed-tensors `quantization/quant_args.py`).
const std::set<std::string> kQuantArgsKeys = {
    "num_bits", "type",     "symmetric",  "group_size", "strategy", "block_structure",
    "dynamic",  "actorder", "scale_dtype", "zp_dtype",  "observer", "observer_kwargs"};

class RecipeReader {
 public:
  explicit RecipeReader(std::string file) { spec_.file = std::move(file); }

  RecipeSpec read(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw usage_error(fmt::format("{}:{}:{}: invalid YAML: {}", spec_.file, e.mark.line + 1,
                                    e.mark.column + 1, e.msg));
    }
    if (!root.IsMap()) {
      throw usage_error(fmt::format(
          "{}:{}: not an llm-compressor recipe: expected a mapping of stages (e.g. "
          "quant_stage: {{quant_modifiers: {{QuantizationModifier: ...}}}})",
          spec_.file, line_of(root)));
    }
    check_unique_keys(root, "");
    for (auto it = root.begin(); it != root.end(); ++it) read_stage(it->first, it->second);
    if (!found_modifier_) {
      throw usage_error(fmt::format(
          "{}: no QuantizationModifier: ctquant runs a recipe's data-free QuantizationModifier "
          "(quant_stage: quant_modifiers: QuantizationModifier: ...)",
          spec_.file));
    }
    return std::move(spec_);
  }

 private:
  static int line_of(const YAML::Node& node) { return node.Mark().line + 1; }

  std::string at(const YAML::Node& node) const {
    return fmt::format("{}:{}", spec_.file, line_of(node));
  }

  // A key must be a plain scalar.
  std::string key_text(const YAML::Node& key) const {
    if (!key.IsScalar()) {
      throw usage_error(fmt::format("{}: a mapping key must be a plain name", at(key)));
    }
    return key.Scalar();
  }

  // PyYAML's safe_load keeps the last of repeated keys; which one a recipe
  // meant is a guess, so a repeated key is refused.
  void check_unique_keys(const YAML::Node& map, const std::string& path) const {
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = key_text(it->first);
      if (!seen.insert(key).second) {
        throw usage_error(fmt::format("{}: key '{}'{} is repeated", at(it->first), key,
                                      path.empty() ? "" : " under " + path));
      }
    }
  }

  void read_stage(const YAML::Node& key, const YAML::Node& value) {
    const std::string name = key_text(key);
    if (!name.ends_with("_stage")) {
      throw usage_error(fmt::format(
          "{}: unknown key '{}': a recipe's top-level keys are stages ending in _stage "
          "(llm-compressor would ignore this one)",
          at(key), name));
    }
    if (!value.IsMap()) {
      throw usage_error(fmt::format("{}: stage '{}' must be a mapping of modifier groups "
                                    "(keys ending in _modifiers)",
                                    at(key), name));
    }
    check_unique_keys(value, name);
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string group = key_text(it->first);
      if (!group.ends_with("_modifiers")) {
        throw usage_error(fmt::format(
            "{}: unknown key '{}' in stage '{}': a stage holds modifier groups ending in "
            "_modifiers (llm-compressor would ignore this one)",
            at(it->first), group, name));
      }
      if (!it->second.IsMap()) {
        throw usage_error(fmt::format(
            "{}: modifier group '{}' must be a mapping of modifier names to their arguments",
            at(it->first), group));
      }
      check_unique_keys(it->second, group);
      for (auto m = it->second.begin(); m != it->second.end(); ++m) {
        read_modifier(name.substr(0, name.size() - 6), group.substr(0, group.size() - 10),
                      m->first, m->second);
      }
    }
  }

  void read_modifier(const std::string& stage, const std::string& group, const YAML::Node& key,
                     const YAML::Node& args) {
    const std::string type = key_text(key);
    if (type != "QuantizationModifier") {
      for (const RefusedModifier& r : kRefusedModifiers) {
        if (type == r.name) {
          throw usage_error(fmt::format(
              "{}: {} is {}; ctquant quantizes data-free (round-to-nearest) and runs only a "
              "QuantizationModifier with dynamic or no activation quantization: run this "
              "recipe with llm-compressor's oneshot",
              at(key), type, r.reason));
        }
      }
      throw usage_error(fmt::format(
          "{}: unknown modifier '{}': ctquant runs only llm-compressor's QuantizationModifier",
          at(key), type));
    }
    if (found_modifier_) {
      throw usage_error(fmt::format(
          "{}: a second QuantizationModifier (the first is at line {}): ctquant runs one; merge "
          "them into one modifier's config_groups",
          at(key), spec_.modifier_line));
    }
    found_modifier_ = true;
    spec_.stage = stage;
    spec_.group = group;
    spec_.modifier_line = line_of(key);
    if (args.IsNull()) return;  // QuantizationModifier: (all defaults)
    if (!args.IsMap()) {
      throw usage_error(
          fmt::format("{}: QuantizationModifier's arguments must be a mapping", at(key)));
    }
    check_unique_keys(args, "QuantizationModifier");
    for (auto it = args.begin(); it != args.end(); ++it) {
      read_modifier_arg(key_text(it->first), it->first, it->second);
    }
    if (spec_.scheme && spec_.config_groups) {
      throw usage_error(fmt::format(
          "{}:{}: QuantizationModifier gives both scheme (line {}) and config_groups (line {}); "
          "llm-compressor refuses this too: give one",
          spec_.file, spec_.modifier_line, spec_.scheme->line, spec_.config_groups->line));
    }
    if (spec_.targets && spec_.config_groups) {
      // llm-compressor ignores a modifier's targets when config_groups are
      // given, and writes its default, [Linear], into the recipes it saves.
      if (spec_.targets->value != kDefaultTargets) {
        throw usage_error(fmt::format(
            "{}:{}: key 'targets' has no effect with config_groups (line {}): each config "
            "group has its own targets; llm-compressor would ignore it, so ctquant refuses it",
            spec_.file, spec_.targets->line, spec_.config_groups->line));
      }
      spec_.targets.reset();
    }
  }

  void read_modifier_arg(const std::string& name, const YAML::Node& key, const YAML::Node& value) {
    const int line = line_of(key);
    if (name == "scheme") {
      if (value.IsMap()) {
        // {PRESET: targets, ...}: the preset form of config_groups.
        json groups = json::object();
        check_unique_keys(value, "scheme");
        for (auto it = value.begin(); it != value.end(); ++it) {
          const std::string preset = key_text(it->first);
          const std::string path = "config_groups." + preset;
          spec_.lines[path] = line_of(it->first);
          groups[preset] = string_list(it->second, it->first, path);
        }
        spec_.config_groups = RecipeValue<json>{groups, line};
        spec_.lines["config_groups"] = line;
        return;
      }
      spec_.scheme = RecipeValue<std::string>{scalar_string(value, key, "scheme"), line};
    } else if (name == "config_groups") {
      if (value.IsNull()) return;  // llm-compressor's default
      if (!value.IsMap() || value.size() == 0) {
        throw usage_error(fmt::format(
            "{}: config_groups must be a mapping of group names to QuantizationScheme "
            "mappings (or a preset name to a list of targets)",
            at(key)));
      }
      spec_.lines["config_groups"] = line;
      json groups = json::object();
      check_unique_keys(value, "config_groups");
      for (auto it = value.begin(); it != value.end(); ++it) {
        const std::string group = key_text(it->first);
        groups[group] = read_config_group(group, it->first, it->second);
      }
      spec_.config_groups = RecipeValue<json>{groups, line};
    } else if (name == "targets") {
      // llm-compressor accepts a single string for one target.
      spec_.targets = RecipeValue<std::vector<std::string>>{
          value.IsScalar() ? std::vector<std::string>{scalar_string(value, key, "targets")}
                           : string_list(value, key, "targets"),
          line};
    } else if (name == "ignore") {
      spec_.ignore =
          RecipeValue<std::vector<std::string>>{string_list(value, key, "ignore"), line};
    } else if (name == "group") {
      spec_.group = scalar_string(value, key, "group");
    } else if (name == "kv_cache_scheme") {
      if (value.IsNull()) return;
      throw usage_error(fmt::format(
          "{}: key 'kv_cache_scheme': KV-cache quantization needs calibration (scales observed "
          "on data); ctquant quantizes weights only: remove it, or run the recipe with "
          "llm-compressor's oneshot",
          at(key)));
    } else if (name == "bypass_divisibility_checks") {
      if (to_json(value, key, "bypass_divisibility_checks") == json(false)) return;
      throw usage_error(fmt::format(
          "{}: key 'bypass_divisibility_checks': ctquant always checks that the group size "
          "divides in_features (section 2 of the format spec, docs/format.md)",
          at(key)));
    } else if (name == "weight_observer") {
      spec_.weight_observer =
          RecipeValue<std::string>{scalar_string(value, key, name), line_of(key)};
    } else if (name == "observer") {
      // {weights: NAME, input: NAME, output: NAME} (QuantizationMixin).
      const json obs = to_json(value, key, name);
      if (!obs.is_object()) {
        throw usage_error(fmt::format("{}: observer must map weights/input/output to observer names",
                                      at(key)));
      }
      for (const auto& [k, v] : obs.items()) {
        if (k == "weights" && v.is_string()) {
          spec_.weight_observer = RecipeValue<std::string>{v.get<std::string>(), line_of(key)};
        } else if (k == "input" || k == "output") {
          throw usage_error(fmt::format(
              "{}: observer.{}: an activation observer needs activations (calibration data); "
              "ctquant quantizes weights only, with dynamic activations",
              at(key), k));
        } else {
          throw usage_error(fmt::format("{}: observer.{}: expected weights, input or output",
                                        at(key), k));
        }
      }
    } else if (name == "input_observer" || name == "output_observer") {
      throw usage_error(fmt::format(
          "{}: key '{}': an activation observer needs activations (calibration data); ctquant "
          "quantizes weights only, with dynamic activations",
          at(key), name));
    } else if (name == "requires_calibration_data") {
      // llm-compressor writes this field when it saves a recipe.
      if (to_json(value, key, name) == json(false)) return;
      throw usage_error(fmt::format(
          "{}: requires_calibration_data: {}: this modifier needs calibration data; ctquant "
          "quantizes data-free: run the recipe with llm-compressor's oneshot",
          at(key), to_json(value, key, name).dump()));
    } else if (name == "start" || name == "end" || name == "update" || name == "index") {
      throw usage_error(fmt::format(
          "{}: key '{}': training-schedule fields of a modifier are not supported by ctquant, "
          "which runs one data-free pass",
          at(key), name));
    } else {
      throw usage_error(fmt::format(
          "{}: unknown key '{}' of QuantizationModifier (ctquant reads scheme, config_groups, "
          "targets and ignore)",
          at(key), name));
    }
  }

  json read_config_group(const std::string& group, const YAML::Node& key,
                         const YAML::Node& value) {
    const std::string path = "config_groups." + group;
    spec_.lines[path] = line_of(key);
    if (value.IsSequence()) return string_list(value, key, path);  // PRESET: [targets]
    if (!value.IsMap()) {
      throw usage_error(fmt::format(
          "{}: config group '{}' must be a QuantizationScheme mapping (targets, weights, ...) "
          "or, under a preset name, a list of targets",
          at(key), group));
    }
    check_unique_keys(value, path);
    json scheme = json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string field = key_text(it->first);
      const std::string field_path = path + "." + field;
      if (!kSchemeKeys.contains(field)) {
        throw usage_error(fmt::format(
            "{}: unknown key '{}' in config group '{}' (a QuantizationScheme has targets, "
            "weights, input_activations, output_activations and format)",
            at(it->first), field, group));
      }
      spec_.lines[field_path] = line_of(it->first);
      if (field == "targets") {
        scheme[field] = it->second.IsScalar()
                            ? json::array({scalar_string(it->second, it->first, field_path)})
                            : json(string_list(it->second, it->first, field_path));
      } else if (field == "format") {
        scheme[field] = it->second.IsNull()
                            ? json(nullptr)
                            : json(scalar_string(it->second, it->first, field_path));
      } else {
        scheme[field] = read_quant_args(field_path, it->first, it->second);
      }
    }
    if (!scheme.contains("weights") || scheme["weights"].is_null()) {
      throw usage_error(fmt::format(
          "{}: config group '{}' has no weights: ctquant quantizes weights (model_free_ptq "
          "refuses this too: \"Must provide a weights quantization scheme\")",
          at(key), group));
    }
    for (const char* activations : {"input_activations", "output_activations"}) {
      if (!scheme.contains(activations) || scheme[activations].is_null()) continue;
      const json& dynamic = scheme[activations].value("dynamic", json(false));
      const int line = spec_.lines[path + "." + activations];
      if (dynamic != json(true)) {
        throw usage_error(fmt::format(
            "{}:{}: config group '{}': {} with dynamic {}: static activation quantization "
            "needs calibration data (scales observed on activations); ctquant quantizes "
            "data-free: use dynamic: true, remove {}, or run the recipe with llm-compressor's "
            "oneshot",
            spec_.file, line, group, activations, dynamic.dump(), activations));
      }
      if (std::string(activations) == "output_activations") {
        throw usage_error(fmt::format(
            "{}:{}: config group '{}': output activation quantization is not supported "
            "(model_free_ptq and vLLM's compressed-tensors schemes quantize weights and inputs)",
            spec_.file, line, group));
      }
    }
    if (!scheme.contains("targets")) {
      throw usage_error(fmt::format(
          "{}: config group '{}' has no targets (a QuantizationScheme needs them; e.g. "
          "targets: [Linear])",
          at(key), group));
    }
    return scheme;
  }

  json read_quant_args(const std::string& path, const YAML::Node& key, const YAML::Node& value) {
    if (value.IsNull()) return nullptr;
    if (!value.IsMap()) {
      throw usage_error(fmt::format("{}: {} must be a mapping of QuantizationArgs fields",
                                    at(key), path));
    }
    check_unique_keys(value, path);
    json args = json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string field = key_text(it->first);
      if (!kQuantArgsKeys.contains(field)) {
        throw usage_error(fmt::format(
            "{}: unknown key '{}' in {} (QuantizationArgs fields: num_bits, type, symmetric, "
            "group_size, strategy, block_structure, dynamic, actorder, scale_dtype, zp_dtype, "
            "observer, observer_kwargs)",
            at(it->first), field, path));
      }
      spec_.lines[path + "." + field] = line_of(it->first);
      args[field] = to_json(it->second, it->first, path + "." + field);
    }
    if (path.ends_with(".weights")) check_weight_args(path, args);
    return args;
  }

  // What a data-free run cannot honour in the weights' args: an observer
  // other than memoryless_minmax, activation ordering (GPTQ), dynamic weights.
  void check_weight_args(const std::string& path, const json& args) {
    auto line = [&](const char* field) { return spec_.lines[path + "." + field]; };
    if (args.contains("observer") && !args["observer"].is_null()) {
      if (!args["observer"].is_string()) {
        throw usage_error(fmt::format("{}:{}: {}.observer {} is not a string", spec_.file,
                                      line("observer"), path, args["observer"].dump()));
      }
      const std::string where = fmt::format("{}:{}: {}", spec_.file, line("observer"), path);
      const ObserverChoice choice = resolve_observer(args["observer"].get<std::string>(), where);
      if (args.contains("observer_kwargs") && !args["observer_kwargs"].is_null()) {
        observer_params(choice.written, args["observer_kwargs"],
                        fmt::format("{}:{}: {}", spec_.file, line("observer_kwargs"), path));
      }
    }
    if (args.contains("actorder") && !args["actorder"].is_null()) {
      throw usage_error(fmt::format(
          "{}:{}: {}.actorder {}: activation ordering is part of GPTQ (calibration-based); "
          "ctquant quantizes round-to-nearest",
          spec_.file, line("actorder"), path, args["actorder"].dump()));
    }
    if (args.contains("dynamic") && args["dynamic"] != json(false)) {
      throw usage_error(fmt::format("{}:{}: {}.dynamic {}: weights are quantized once, ahead "
                                    "of time (dynamic: false)",
                                    spec_.file, line("dynamic"), path, args["dynamic"].dump()));
    }
  }

  std::string scalar_string(const YAML::Node& value, const YAML::Node& key,
                            const std::string& path) const {
    const json j = to_json(value, key, path);
    if (!j.is_string()) {
      throw usage_error(fmt::format("{}: {} must be a string, not {}", at(key), path, j.dump()));
    }
    return j.get<std::string>();
  }

  std::vector<std::string> string_list(const YAML::Node& value, const YAML::Node& key,
                                       const std::string& path) const {
    if (!value.IsSequence()) {
      throw usage_error(fmt::format("{}: {} must be a list of strings", at(key), path));
    }
    std::vector<std::string> items;
    for (std::size_t i = 0; i < value.size(); ++i) {
      const json j = to_json(value[i], value[i], path);
      if (!j.is_string()) {
        throw usage_error(fmt::format("{}: {}[{}] must be a string, not {}", at(value[i]), path,
                                      i, j.dump()));
      }
      items.push_back(j.get<std::string>());
    }
    return items;
  }

  // A YAML value as the JSON value PyYAML's safe_load makes of it (YAML 1.1
  // resolution of plain scalars: null, bool, int, float, else string).
  json to_json(const YAML::Node& node, const YAML::Node& key, const std::string& path) const {
    switch (node.Type()) {
      case YAML::NodeType::Null:
        return nullptr;
      case YAML::NodeType::Scalar:
        return scalar_json(node, key, path);
      case YAML::NodeType::Sequence: {
        json list = json::array();
        for (std::size_t i = 0; i < node.size(); ++i) {
          list.push_back(to_json(node[i], node[i], fmt::format("{}[{}]", path, i)));
        }
        return list;
      }
      case YAML::NodeType::Map: {
        check_unique_keys(node, path);
        json object = json::object();
        for (auto it = node.begin(); it != node.end(); ++it) {
          const std::string k = key_text(it->first);
          object[k] = to_json(it->second, it->first, path + "." + k);
        }
        return object;
      }
      case YAML::NodeType::Undefined:
        break;
    }
    throw usage_error(fmt::format("{}: {}: no value", at(key), path));
  }

  json scalar_json(const YAML::Node& node, const YAML::Node& key, const std::string& path) const {
    const std::string& text = node.Scalar();
    const std::string& tag = node.Tag();
    if (tag == "!" || tag == "tag:yaml.org,2002:str") return text;  // quoted, or !!str
    if (tag != "?" && tag != "tag:yaml.org,2002:int" && tag != "tag:yaml.org,2002:float" &&
        tag != "tag:yaml.org,2002:bool" && tag != "tag:yaml.org,2002:null") {
      throw usage_error(fmt::format("{}: {}: tag '{}' is not supported (safe YAML types only)",
                                    at(key), path, tag));
    }
    static const std::set<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes",
                                                "YES",  "on",   "On",   "ON"};
    static const std::set<std::string> kFalse = {"false", "False", "FALSE", "no", "No",
                                                 "NO",    "off",   "Off",   "OFF"};
    static const std::set<std::string> kNull = {"", "~", "null", "Null", "NULL"};
    if (kNull.contains(text)) return nullptr;
    if (kTrue.contains(text)) return true;
    if (kFalse.contains(text)) return false;
    // PyYAML's YAML 1.1 resolvers (`yaml/resolver.py`). Decimal integers and
    // floats are typed; the other integer forms (0b.., 0x.., octal 017,
    // 1_000, sexagesimal 1:30) are refused rather than guessed.
    static const std::regex kDecimal("[-+]?(0|[1-9][0-9]*)");
    static const std::regex kOtherInt(
        "[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|"
        "[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+");
    static const std::regex kFloat(
        "[-+]?([0-9][0-9_]*)\\.[0-9_]*([eE][-+][0-9]+)?|\\.[0-9_]+([eE][-+][0-9]+)?|"
        "[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
    if (std::regex_match(text, kDecimal)) {
      errno = 0;
      const long long value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        throw usage_error(fmt::format("{}: {}: {} is out of range", at(key), path, text));
      }
      return value;
    }
    if (std::regex_match(text, kOtherInt) ||
        (std::regex_match(text, kFloat) && text.find_first_of("_:") != std::string::npos)) {
      throw usage_error(fmt::format(
          "{}: {}: '{}' is a YAML 1.1 number in a form ctquant does not read; write it in "
          "decimal, or quote it if it is a string",
          at(key), path, text));
    }
    if (std::regex_match(text, kFloat)) {
      const double value = std::strtod(text.c_str(), nullptr);
      if (!std::isfinite(value)) {
        throw usage_error(fmt::format("{}: {}: {} is not a finite number", at(key), path, text));
      }
      return value;
    }
    return text;
  }

  RecipeSpec spec_;
  bool found_modifier_ = false;
};

// ---- resolving and writing ----

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

ValueOrigin command_line_origin() { return ValueOrigin{ValueOrigin::Kind::kCommandLine, {}, 0, {}}; }

// Where a value of the effective recipe is named in messages.
std::string origin_label(const ValueOrigin& origin, const std::string& key,
                         const std::string& option) {
  if (origin.kind == ValueOrigin::Kind::kRecipe) return fmt::format("{}: {}", origin.describe(), key);
  return option;
}

// A string as a YAML double-quoted scalar (JSON string escapes are YAML's).
std::string yaml_string(const std::string& text) { return json(text).dump(); }

std::string yaml_list(const std::vector<std::string>& items) {
  std::string text = "[";
  for (std::size_t i = 0; i < items.size(); ++i) text += (i > 0 ? ", " : "") + yaml_string(items[i]);
  return text + "]";
}

}  // namespace

RecipeSpec parse_recipe_text(const std::string& text, const std::string& path) {
  return RecipeReader(path).read(text);
}

RecipeSpec parse_recipe(const fs::path& path) {
  std::string text;
  try {
    text = detail::read_input_file(path, path.string(), kMaxRecipeBytes);
  } catch (const Error& e) {
    throw usage_error(fmt::format("--recipe: {}", e.what()));
  }
  return parse_recipe_text(text, path.string());
}

namespace {

// --observer over the recipe's weight_observer; --observer-kwarg KEY=VALUE
// (VALUE a JSON number, as observer_kwargs hold them).
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
      throw usage_error(fmt::format("--observer-kwarg '{}': expected KEY=VALUE, e.g. norm=2.4", kv));
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
      throw usage_error(fmt::format("--observer-kwarg '{}': VALUE must be a number", kv));
    }
    r.observer_kwargs[kv.substr(0, eq)] = value;
  }
}

// Sets every group's weight observer to the one given for the run.
void apply_observer(PlanOptions& options, const EffectiveRecipe& r) {
  if (!r.observer) return;
  const std::string where = origin_label(r.observer_origin, "observer", "--observer");
  if (*r.observer == "auto") {
    // Planned with min-max; quantize measures every module with both
    // observers and splits the groups (exec/observer_choice.hpp).
    for (SchemeGroup& g : options.groups) {
      g.weights.observer = "memoryless_minmax";
      g.weights.observer_kwargs = json::object();
    }
    if (!r.observer_kwargs.is_null()) {
      observer_params("memoryless_mse", r.observer_kwargs, "--observer-kwarg");
    }
    return;
  }
  const ObserverChoice choice = resolve_observer(*r.observer, where);
  if (!choice.note.empty()) add_observer_note(choice.note);
  for (SchemeGroup& g : options.groups) {
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
    for (const auto& [given, flag] :
         {std::pair{cli.scheme.has_value(), "--scheme"},
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
    r.scheme_origin = ValueOrigin{ValueOrigin::Kind::kCommandLine, {}, 0,
                                  "--quantization-config " + cli.quantization_config};
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
    r.scheme = *cli.scheme;
    r.scheme_origin = command_line_origin();
  } else if (recipe != nullptr && recipe->scheme) {
    r.scheme = recipe->scheme->value;
    r.scheme_origin = recipe_origin(*recipe, recipe->scheme->line);
  } else {
    r.scheme = "W4A16";
    r.scheme_origin = recipe != nullptr
                          ? ValueOrigin{ValueOrigin::Kind::kDefault, {}, 0,
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
    } else if (recipe != nullptr && recipe->targets) {
      r.targets = recipe->targets->value;
      r.targets_origin = recipe_origin(*recipe, recipe->targets->line);
    } else {
      r.targets = kDefaultTargets;
    }
  }
  resolve_observer_option(r, recipe, cli);
  // Ignore list.
  if (!cli.ignore.empty()) {
    r.ignore = cli.ignore;
    r.ignore_origin = command_line_origin();
  } else if (recipe != nullptr && recipe->ignore) {
    r.ignore = recipe->ignore->value;
    r.ignore_origin = recipe_origin(*recipe, recipe->ignore->line);
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
    for (const std::string& spec : r.scheme_for) add_scheme_group(options, scheme_for_group(spec));
    SchemeGroup main;
    try {
      main = preset_group(*r.scheme);
    } catch (const Error& e) {
      throw usage_error(fmt::format("{}: {}", where, e.what()));
    }
    main.targets = r.targets;
    if (r.group_size) apply_group_size(main, *r.group_size);
    add_scheme_group(options, std::move(main));
    apply_observer(options, r);
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
    const SchemeFamily* family = group.family();
    const std::string why = family != nullptr ? family->supports(group.weights) : std::string();
    if (family == nullptr || !why.empty()) {
      const QuantArgs& w = group.weights;
      throw usage_error(fmt::format(
          "{}: type \"{}\", num_bits {}, strategy \"{}\"{}: {}",
          where("config_groups." + name + ".weights"),
          w.type == QuantArgs::Type::kInt ? "int" : "float", w.num_bits,
          strategy_name(w.strategy),
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
  text += "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n";
  // A preset alone when it says everything: no group size, no per-pattern
  // schemes, no observer (config groups carry weights.observer).
  if (r.scheme && !r.group_size && r.scheme_for.empty() && !r.observer) {
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

std::string render_recipe_origins(const EffectiveRecipe& r) {
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
  if (r.ignore.empty()) {
    text += fmt::format(
        "  {:<13} none given{}; the module roles' defaults (not with --no-default-ignore)\n", "ignore",
        r.ignore_origin.describe() == "default" ? "" : " (" + r.ignore_origin.describe() + ")");
  } else {
    text += fmt::format(
        "  {:<13} {}  ({}), added to the module roles' defaults (not with --no-default-ignore)\n",
        "ignore", list_text(r.ignore), r.ignore_origin.describe());
  }
  return text;
}

}  // namespace ctquant
