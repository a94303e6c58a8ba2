// The converter registry and what its rows share (source/converter.hpp).
#include "ctquant/source/converter.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/config.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"

namespace ctquant {

using nlohmann::json;

// The rows, each defined in its own file.
extern const SourceConverter kAwqConverter;
extern const SourceConverter kModelOptNvfp4Converter;

const std::vector<const SourceConverter*>& source_converters() {
  static const std::vector<const SourceConverter*> rows{&kAwqConverter, &kModelOptNvfp4Converter};
  return rows;
}

std::optional<SourceFormat> detect_source_format(const Checkpoint& checkpoint,
                                                 const ConvertOptions& options) {
  for (const SourceConverter* c : source_converters()) {
    if (auto format = c->detect(checkpoint, options)) {
      format->converter = c;
      return format;
    }
  }
  return std::nullopt;
}

void produce_converted(const SourceConverter& converter, const ConvertedTensor& t,
                       std::span<const std::span<const std::byte>> inputs,
                       std::span<std::byte> out) {
  if (t.op == kConstantOp) {
    std::memcpy(out.data(), t.constant.data(), std::min(out.size(), t.constant.size()));
    return;
  }
  if (t.op == kRenameOp) {
    std::memcpy(out.data(), inputs[0].data(), std::min(out.size(), inputs[0].size()));
    return;
  }
  converter.produce(t, inputs, out);
}

namespace {

// compressed-tensors utils/helpers.py find_unique_name: a taken name
// "base_N" becomes "base_{N+1}", ... (a name without a number gets "_1").
std::string unique_name(const std::string& name, const json& taken) {
  if (!taken.contains(name)) return name;
  std::string base = name;
  long long n = 0;
  const auto us = name.rfind('_');
  if (us != std::string::npos && us + 1 < name.size() &&
      std::all_of(name.begin() + static_cast<std::ptrdiff_t>(us) + 1, name.end(),
                  [](char c) { return c >= '0' && c <= '9'; })) {
    base = name.substr(0, us);
    n = std::stoll(name.substr(us + 1));
  }
  std::string candidate;
  do {
    candidate = fmt::format("{}_{}", base, ++n);
  } while (taken.contains(candidate));
  return candidate;
}

}  // namespace

std::map<std::string, std::string> merged_group_names(const std::vector<std::string>& names) {
  json taken = json{{"config_group_0", nullptr}};  // the converter's group
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  std::map<std::string, std::string> out;
  for (const std::string& name : sorted) {
    const std::string unique = unique_name(name, taken);
    taken[unique] = nullptr;
    out[name] = unique;
  }
  return out;
}

json converted_quantization_config(const SourceFormat& format, const json& new_block,
                                   const std::vector<std::string>& keep_ignore,
                                   const std::vector<std::string>& lifted) {
  // create_config() (converters/base.py, autoawq.py, modelopt_nvfp4.py), as
  // write_checkpoint_quantization_config writes it (convert_file.py).
  json config{
      {"config_groups", json{{"config_group_0", format.group}}},
      {"format", format.group.value("format", json(nullptr))},
      {"global_compression_ratio", nullptr},
      {"ignore", format.ignore},
      {"kv_cache_scheme", format.kv_cache_scheme},
      {"quant_method", "compressed-tensors"},
      {"quantization_status", "compressed"},
      {"version", kCompressedTensorsVersion},
  };
  if (new_block.is_null() || new_block.value("config_groups", json::object()).empty()) {
    for (const std::string& entry : keep_ignore) {
      if (std::find(config["ignore"].begin(), config["ignore"].end(), json(entry)) ==
          config["ignore"].end()) {
        config["ignore"].push_back(entry);
      }
    }
    return config;
  }
  // QuantizationConfig.merge (quant_config.py), called by
  // create_or_update_quant_config (llm-compressor model_free/save_utils.py).
  std::vector<std::string> targets;
  for (const auto& [name, group] : new_block["config_groups"].items()) {
    for (const auto& t : group["targets"]) targets.push_back(t.get<std::string>());
  }
  const ModuleMatcher new_targets(targets, ModuleMatcher::Role::kTargets);
  json ignore = json::array();
  for (const std::string& entry : format.ignore) {
    // match_name(ignore, target): "Linear" is a class name, not a module
    // name, so only a regex or the same literal prunes an entry here.
    bool pruned = std::find(lifted.begin(), lifted.end(), entry) != lifted.end();
    if (!pruned && !entry.starts_with("re:")) {
      for (std::size_t i = 0; i < targets.size() && !pruned; ++i) {
        pruned = targets[i] != "Linear" && new_targets.entry_matches(i, entry);
      }
    }
    if (!pruned) ignore.push_back(entry);
  }
  for (const std::string& entry : keep_ignore) {
    if (std::find(ignore.begin(), ignore.end(), json(entry)) == ignore.end()) {
      ignore.push_back(entry);
    }
  }
  config["ignore"] = ignore;
  std::set<std::string> formats{format.group.value("format", std::string())};
  for (const auto& [name, group] : new_block["config_groups"].items()) {
    config["config_groups"][unique_name(name, config["config_groups"])] = group;
    formats.insert(group["format"].is_string() ? group["format"].get<std::string>() : "");
  }
  config["format"] = formats.size() == 1 ? json(*formats.begin()) : json("mixed-precision");
  config["transform_config"] = json::object();
  return config;
}

std::optional<json> read_side_json(const Checkpoint& checkpoint, const std::string& name) {
  if (std::find(checkpoint.other_files.begin(), checkpoint.other_files.end(), name) ==
      checkpoint.other_files.end()) {
    return std::nullopt;
  }
  return detail::read_json_file(checkpoint.root / name, name);
}

}  // namespace ctquant
