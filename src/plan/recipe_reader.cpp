#include "ctquant/plan/recipe_reader.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "ctquant/format/config.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

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
    {"SpinQuantModifier",
     "a transform (its learned and online rotations are not applied; `--transform rotate` "
     "absorbs fixed Hadamard R1 and R2 into the weights)"},
};

// QuantizationScheme fields (compressed-tensors `quantization/quant_scheme.py`).
const std::set<std::string> kSchemeKeys = {"targets", "weights", "input_activations",
                                           "output_activations", "format"};
// QuantizationArgs fields (compressed-tensors `quantization/quant_args.py`).
const std::set<std::string> kQuantArgsKeys = {
    "num_bits", "type",     "symmetric",   "group_size", "strategy", "block_structure",
    "dynamic",  "actorder", "scale_dtype", "zp_dtype",   "observer", "observer_kwargs"};

class RecipeReader {
 public:
  explicit RecipeReader(std::string file) { spec_.file = std::move(file); }

  RecipeSpec read(const std::string& text) {
    std::vector<YAML::Node> documents;
    try {
      documents = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
      throw usage_error(fmt::format("{}:{}:{}: invalid YAML: {}", spec_.file, e.mark.line + 1,
                                    e.mark.column + 1, e.msg));
    }
    if (documents.size() > 1) {
      // PyYAML's safe_load, which llm-compressor reads recipes with, refuses
      // a stream of several documents ("expected a single document in the
      // stream"); reading only the first would drop the others silently.
      throw usage_error(fmt::format(
          "{}:{}: a second YAML document starts here ('---'): a recipe is one document "
          "(llm-compressor refuses this file too); merge the documents, or keep the one to run",
          spec_.file, second_document_line(text, documents[1])));
    }
    const YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
    if (!root.IsMap()) {
      throw usage_error(
          fmt::format("{}:{}: not an llm-compressor recipe: expected a mapping of stages (e.g. "
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

  // The line of the '---' that starts the second document: the last one at
  // or before the document's first node (an empty document has no node:
  // the second '---' of the text, or the first one after a line of content).
  static int second_document_line(const std::string& text, const YAML::Node& second) {
    const int node_line = second.Mark().is_null() ? 0 : line_of(second);
    int line = 0;
    int found = 0;
    int markers = 0;
    bool content = false;
    std::size_t start = 0;
    while (start <= text.size()) {
      const std::size_t end = std::min(text.find('\n', start), text.size());
      const std::string_view l(text.data() + start, end - start);
      ++line;
      if (node_line > 0 && line > node_line) break;
      const bool marker =
          l.starts_with("---") && (l.size() == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\r');
      if (marker) {
        ++markers;
        if (node_line > 0 || markers == 2 || content) found = line;
        if (node_line == 0 && found > 0) break;
      } else if (!l.empty() && l[0] != '#' &&
                 l.find_first_not_of(" \t\r") != std::string_view::npos) {
        content = true;
      }
      start = end + 1;
    }
    return found > 0 ? found : std::max(node_line, 1);
  }

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
      throw usage_error(
          fmt::format("{}: unknown key '{}': a recipe's top-level keys are stages ending in _stage "
                      "(llm-compressor would ignore this one)",
                      at(key), name));
    }
    if (!value.IsMap()) {
      throw usage_error(
          fmt::format("{}: stage '{}' must be a mapping of modifier groups "
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
        read_modifier(name.substr(0, name.size() - 6), group.substr(0, group.size() - 10), m->first,
                      m->second);
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
        throw usage_error(
            fmt::format("{}: config_groups must be a mapping of group names to QuantizationScheme "
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
      spec_.ignore = RecipeValue<std::vector<std::string>>{string_list(value, key, "ignore"), line};
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
        throw usage_error(
            fmt::format("{}: observer must map weights/input/output to observer names", at(key)));
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
          throw usage_error(
              fmt::format("{}: observer.{}: expected weights, input or output", at(key), k));
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

  json read_config_group(const std::string& group, const YAML::Node& key, const YAML::Node& value) {
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
      throw usage_error(
          fmt::format("{}: config group '{}' has no targets (a QuantizationScheme needs them; e.g. "
                      "targets: [Linear])",
                      at(key), group));
    }
    return scheme;
  }

  json read_quant_args(const std::string& path, const YAML::Node& key, const YAML::Node& value) {
    if (value.IsNull()) return nullptr;
    if (!value.IsMap()) {
      throw usage_error(
          fmt::format("{}: {} must be a mapping of QuantizationArgs fields", at(key), path));
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
      throw usage_error(
          fmt::format("{}:{}: {}.dynamic {}: weights are quantized once, ahead "
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
        throw usage_error(
            fmt::format("{}: {}[{}] must be a string, not {}", at(value[i]), path, i, j.dump()));
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

}  // namespace ctquant
