#include "ctquant/plan/quant_config.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/refused_presets.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"

namespace ctquant {

using nlohmann::json;

namespace {

constexpr std::array<std::string_view, 12> kArgsFields = {
    "actorder",        "block_structure", "dynamic",  "group_size", "num_bits", "observer",
    "observer_kwargs", "scale_dtype",     "strategy", "symmetric",  "type",     "zp_dtype"};

std::vector<std::string> string_list(const json& value, const std::string& where) {
  if (!value.is_array()) throw usage_error(fmt::format("{}: expected a list of strings", where));
  std::vector<std::string> out;
  for (const json& v : value) {
    if (!v.is_string()) {
      throw usage_error(fmt::format("{}: {} is not a string", where, v.dump()));
    }
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

json activation_args_json(const json& args, const std::string& where) {
  if (!args.is_object()) throw usage_error(fmt::format("{}: expected QuantizationArgs", where));
  for (const auto& [key, value] : args.items()) {
    if (std::find(kArgsFields.begin(), kArgsFields.end(), key) == kArgsFields.end()) {
      throw usage_error(fmt::format("{}: unknown field '{}'", where, key));
    }
  }
  const auto field = [&](const char* key) {
    const auto it = args.find(key);
    return it == args.end() ? json(nullptr) : *it;
  };
  if (field("dynamic") != true) {
    throw usage_error(fmt::format(
        "{}: \"dynamic\": {}: activations must be quantized dynamically; data-free quantization "
        "cannot calibrate activation scales (model_free_ptq: \"Model Free PTQ cannot calibrate "
        "activations\"; use llm-compressor's oneshot with calibration data)",
        where, field("dynamic").dump()));
  }
  json out = {
      {"actorder", nullptr},
      {"block_structure", field("block_structure")},
      {"dynamic", true},
      {"group_size", field("group_size")},
      {"num_bits", field("num_bits").is_null() ? json(8) : field("num_bits")},
      // compressed-tensors sets no observer for dynamic activations.
      {"observer", nullptr},
      {"observer_kwargs", json::object()},
      {"scale_dtype", field("scale_dtype")},
      {"strategy", field("strategy")},
      {"symmetric", field("symmetric").is_null() ? json(true) : field("symmetric")},
      {"type", field("type").is_null() ? json("int") : field("type")},
      {"zp_dtype", nullptr},
  };
  if (out["strategy"].is_null()) {
    const json& g = out["group_size"];
    out["strategy"] = g.is_null() ? "tensor" : g == -1 ? "channel" : "group";
  }
  if (!field("actorder").is_null()) {
    throw usage_error(fmt::format("{}: actorder applies to weights only", where));
  }
  if (out["symmetric"] == false) {
    throw usage_error(fmt::format(
        "{}: asymmetric activations need zero points vLLM computes only for static int8 "
        "activations; ctquant writes symmetric dynamic activations",
        where));
  }
  return out;
}

void apply_group_size(SchemeGroup& group, long long group_size) {
  using S = QuantArgs::Strategy;
  if (group.weights.type != QuantArgs::Type::kInt ||
      (group.weights.strategy != S::kGroup && group.weights.strategy != S::kChannel)) {
    throw usage_error(fmt::format(
        "--group-size applies to the integer presets; {} has a fixed layout", group.name));
  }
  if (group_size == -1) {
    group.weights.strategy = S::kChannel;
    group.weights.group_size = 0;
  } else if (group_size > 0) {
    group.weights.strategy = S::kGroup;
    group.weights.group_size = static_cast<std::uint64_t>(group_size);
  } else {
    throw usage_error(fmt::format(
        "--group-size {}: expected a positive number of columns, or -1 for channel-wise",
        group_size));
  }
  const Preset* preset = find_preset(group.name);
  if (preset == nullptr || !(preset->weights == group.weights)) group.name = "config_group_0";
}

bool scheme_for_names_observer(const std::string& spec) {
  const auto eq = spec.rfind('=');
  return eq != std::string::npos && spec.find('@', eq) != std::string::npos;
}

SchemeGroup scheme_for_group(const std::string& spec) {
  const auto eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    throw usage_error(fmt::format(
        "--scheme-for '{}': expected PATTERN=PRESET, e.g. 're:.*self_attn.*=W8A16'", spec));
  }
  // PRESET@OBSERVER: the group's own weight observer; the group is then
  // named PRESET_OBSERVER, so that groups of one preset with different
  // observers stay apart.
  std::string preset = spec.substr(eq + 1);
  std::string observer;
  if (const auto at = preset.find('@'); at != std::string::npos) {
    observer = preset.substr(at + 1);
    preset.resize(at);
    if (observer.empty()) {
      throw usage_error(
          fmt::format("--scheme-for '{}': '@' names no observer (PRESET@OBSERVER, e.g. "
                      "'re:.*self_attn.*=W8A16@memoryless_mse'; or PRESET alone)",
                      spec));
    }
  }
  SchemeGroup g = preset_group(preset);
  g.targets = {spec.substr(0, eq)};
  // The pattern is checked here so that a bad one is named by its option.
  const ModuleMatcher check(g.targets, ModuleMatcher::Role::kTargets, "--scheme-for");
  if (!observer.empty()) {
    const ObserverChoice choice = resolve_observer(observer, "--scheme-for '" + spec + "'");
    if (!choice.note.empty()) add_observer_note(choice.note);
    g.weights.observer = choice.written;
    g.name += "_" + choice.written;
    const SchemeFamily* family = g.family();
    const std::string why = family != nullptr ? family->supports(g.weights) : std::string();
    if (!why.empty()) throw usage_error(fmt::format("--scheme-for '{}': {}", spec, why));
  }
  return g;
}

void add_scheme_group(PlanOptions& options, SchemeGroup group) {
  for (SchemeGroup& existing : options.groups) {
    if (existing.name == group.name) {
      existing.targets.insert(existing.targets.end(), group.targets.begin(), group.targets.end());
      return;
    }
  }
  options.groups.push_back(std::move(group));
}

PlanOptions plan_options_from_config(const json& config, const std::string& where) {
  if (!config.is_object()) {
    throw usage_error(fmt::format("{}: a QuantizationConfig must be a JSON object", where));
  }
  static constexpr std::array<std::string_view, 11> kKnown = {"config_groups",
                                                              "ignore",
                                                              "format",
                                                              "quant_method",
                                                              "quantization_status",
                                                              "kv_cache_scheme",
                                                              "global_compression_ratio",
                                                              "version",
                                                              "transform_config",
                                                              "sparsity_config",
                                                              "provider"};
  for (const auto& [key, value] : config.items()) {
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end()) {
      throw usage_error(fmt::format("{}: unknown key '{}' (QuantizationConfig keys: {})", where,
                                    key, fmt::join(kKnown, ", ")));
    }
  }
  const auto non_empty = [&](const char* key) {
    const auto it = config.find(key);
    return it != config.end() && !it->is_null() && !(it->is_object() && it->empty());
  };
  if (non_empty("kv_cache_scheme")) {
    throw usage_error(fmt::format(
        "{}: kv_cache_scheme: KV-cache quantization needs calibrated k_scale/v_scale tensors, "
        "which data-free quantization cannot make (model_free_ptq writes the scheme but no "
        "scales, and the result does not load correctly)",
        where));
  }
  if (non_empty("transform_config")) {
    throw usage_error(
        fmt::format("{}: transform_config: transforms are not applied data-free", where));
  }
  if (non_empty("sparsity_config")) {
    throw usage_error(fmt::format("{}: sparsity_config: ctquant writes no sparse formats", where));
  }
  if (config.contains("quant_method") && config["quant_method"] != "compressed-tensors") {
    throw usage_error(fmt::format("{}: quant_method {} is not \"compressed-tensors\"", where,
                                  config["quant_method"].dump()));
  }
  PlanOptions options;
  options.groups.clear();
  options.ignore.clear();
  const auto groups = config.find("config_groups");
  if (groups == config.end() || !groups->is_object() || groups->empty()) {
    throw usage_error(
        fmt::format("{}: config_groups must be an object with at least one group", where));
  }
  // The groups in the order written (nlohmann's ordered iteration is by key,
  // so the order comes from the text): the caller passes an ordered_json-
  // parsed object re-serialised in order, see read_quantization_config.
  for (const auto& [name, group] : groups->items()) {
    const std::string at = fmt::format("{}: config_groups.{}", where, name);
    if (group.is_array()) {
      // A preset name mapped to its targets.
      if (find_preset(name) == nullptr) {
        if (const RefusedPreset* refused = refused_preset(name)) {
          throw usage_error(
              fmt::format("{}: preset '{}' is not written: {}", at, name, refused->reason));
        }
        throw usage_error(
            fmt::format("{}: a list of targets needs a preset name as its key "
                        "(presets: {})",
                        at, preset_names()));
      }
      SchemeGroup g = preset_group(name);
      g.name = name;  // the file's own key
      g.targets = string_list(group, at);
      if (g.targets.empty()) g.targets = {"Linear"};
      options.groups.push_back(std::move(g));
      continue;
    }
    if (!group.is_object()) {
      throw usage_error(
          fmt::format("{}: expected a QuantizationScheme object or a list of "
                      "targets",
                      at));
    }
    for (const auto& [key, value] : group.items()) {
      if (key != "targets" && key != "weights" && key != "input_activations" &&
          key != "output_activations" && key != "format") {
        throw usage_error(
            fmt::format("{}: unknown key '{}' (QuantizationScheme keys: targets, "
                        "weights, input_activations, output_activations, format)",
                        at, key));
      }
    }
    SchemeGroup g;
    g.name = name;
    const auto weights = group.find("weights");
    if (weights == group.end() || weights->is_null()) {
      throw usage_error(fmt::format(
          "{}: no weights: data-free quantization quantizes weights (model_free_ptq: \"Must "
          "provide a weights quantization scheme\")",
          at));
    }
    g.weights = quant_args_from_json(*weights, at + ".weights");
    const auto targets = group.find("targets");
    g.targets = targets == group.end() || targets->is_null()
                    ? std::vector<std::string>{}
                    : string_list(*targets, at + ".targets");
    if (g.targets.empty()) g.targets = {"Linear"};
    const auto input = group.find("input_activations");
    if (input != group.end() && !input->is_null()) {
      g.input_activations = activation_args_json(*input, at + ".input_activations");
    }
    const auto output = group.find("output_activations");
    if (output != group.end() && !output->is_null()) {
      throw usage_error(
          fmt::format("{}.output_activations: output activation quantization is "
                      "not written data-free",
                      at));
    }
    const SchemeFamily* family = g.family();
    const auto format = group.find("format");
    if (family != nullptr && format != group.end() && !format->is_null() &&
        *format != family->format) {
      throw usage_error(
          fmt::format("{}.format: {} is not the format compressed-tensors writes "
                      "for these weights (\"{}\")",
                      at, format->dump(), family->format));
    }
    options.groups.push_back(std::move(g));
  }
  const auto ignore = config.find("ignore");
  if (ignore != config.end() && !ignore->is_null()) {
    options.ignore = string_list(*ignore, where + ": ignore");
  }
  return options;
}

PlanOptions read_quantization_config(const std::string& path) {
  // The JSON reader (size, nesting and repeated-key bounds); what is wrong
  // with the file is a usage error, like every other option.
  nlohmann::ordered_json ordered;
  try {
    ordered = detail::parse_ordered_json_text(
        detail::read_input_file(path, path, detail::kMaxJsonFileBytes), path,
        /*reject_duplicate_keys=*/true);
  } catch (const Error& e) {
    throw usage_error(e.what());
  }
  // Groups are tried in the order written: parse each group through the
  // ordered object, one at a time.
  if (!ordered.is_object()) {
    throw usage_error(fmt::format("{}: a QuantizationConfig must be a JSON object", path));
  }
  const auto groups = ordered.find("config_groups");
  if (groups == ordered.end() || !groups->is_object()) {
    return plan_options_from_config(json::parse(ordered.dump()), path);
  }
  PlanOptions options;
  options.groups.clear();
  json rest = json::parse(ordered.dump());
  for (const auto& [name, group] : groups->items()) {
    rest["config_groups"] = json::object({{name, json::parse(group.dump())}});
    PlanOptions one = plan_options_from_config(rest, path);
    options.groups.push_back(std::move(one.groups.front()));
    options.ignore = std::move(one.ignore);
  }
  return options;
}

}  // namespace ctquant
