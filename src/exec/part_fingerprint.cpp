// plan_fingerprint and fingerprint_changes (exec/parts.hpp): what identifies
// a plan, and the names of what differs between two.
#include <algorithm>
#include <map>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/exec/parts.hpp"
#include "ctquant/format/config.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/sha256.hpp"
#include "ctquant/util/version.hpp"
#include "exec/part_record.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string header_digest(const SafetensorsHeader& h) {
  Sha256 hash;
  hash.update(fmt::format("{}\n", h.header_size));
  for (const auto& [key, value] : h.metadata) {
    hash.update(key);
    hash.update(std::string_view("\0", 1));
    hash.update(value);
    hash.update(std::string_view("\n", 1));
  }
  for (const TensorEntry& t : h.tensors) {
    hash.update(fmt::format("{}\t{}\t{}\t{}\t{}\n", t.name, dtype_tag(t.dtype),
                            shape_string(t.shape), t.begin, t.end));
  }
  return hash.hex_digest();
}

std::string json_digest(const std::optional<json>& value) {
  return value ? sha256_hex(value->dump()) : std::string();
}

std::uint64_t other_file_size(const Checkpoint& ckpt, const std::string& name) {
  std::error_code ec;
  const auto size = fs::file_size(ckpt.root / name, ec);
  return ec ? 0 : size;
}

// A JSON value as a message shows it: short.
std::string short_value(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// Paths where two JSON values differ ("ignore", "config_groups.group_0..."),
// at most `limit`.
void json_changes(const json& before, const json& now, const std::string& path,
                  std::vector<std::string>& out, std::size_t limit) {
  if (out.size() >= limit || before == now) return;
  if (before.is_object() && now.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : before.items()) keys.insert(k);
    for (const auto& [k, v] : now.items()) keys.insert(k);
    for (const std::string& k : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!before.contains(k)) {
        out.push_back(fmt::format("{}: added ({})", sub, short_value(now[k])));
      } else if (!now.contains(k)) {
        out.push_back(fmt::format("{}: removed (was {})", sub, short_value(before[k])));
      } else {
        json_changes(before[k], now[k], sub, out, limit);
      }
      if (out.size() >= limit) return;
    }
    return;
  }
  out.push_back(fmt::format("{}: {} then, {} now", path.empty() ? "(value)" : path,
                            short_value(before), short_value(now)));
}

}  // namespace

json plan_fingerprint(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  json input;
  json shards = json::array();
  for (const SafetensorsFile& shard : checkpoint.shards) {
    shards.push_back(json{{"name", shard.label()},
                          {"size", shard.file_size()},
                          {"header_sha256", header_digest(shard.header())}});
  }
  input["shards"] = shards;
  input["config_sha256"] = json_digest(checkpoint.config);
  input["index_sha256"] =
      checkpoint.has_index ? json_digest(std::optional<json>(checkpoint.index)) : std::string();
  json others = json::array();
  for (const std::string& name : checkpoint.other_files) {
    others.push_back(json{{"name", name}, {"size", other_file_size(checkpoint, name)}});
  }
  input["other_files"] = others;

  json output;
  json files = json::array();
  Sha256 layout;
  std::vector<std::string> tensors;
  std::uint64_t bytes = 0;
  for (const PlannedFile& f : plan_output_files(checkpoint, plan)) {
    files.push_back(json{{"name", f.name}, {"size", f.size}});
    bytes += f.size;
    tensors.insert(tensors.end(), f.tensors.begin(), f.tensors.end());
  }
  for (const ShardPlan& shard : plan.shards) layout.update(shard.header);
  layout.update(dump_json(plan.index));
  layout.update(dump_json(plan.config));
  std::sort(tensors.begin(), tensors.end());
  Sha256 names;
  for (const std::string& t : tensors) {
    names.update(t);
    names.update(std::string_view("\n", 1));
  }
  output["files"] = files;
  output["bytes"] = bytes;
  output["layout_sha256"] = layout.hex_digest();
  output["tensors"] = tensors.size();
  output["tensors_sha256"] = names.hex_digest();

  json fingerprint;
  fingerprint["ctquant_version"] = ctquant_version();
  fingerprint["record_format"] = detail::kRecordFormat;
  fingerprint["input"] = input;
  fingerprint["options"] = plan.config.contains("quantization_config")
                               ? plan.config["quantization_config"]
                               : json(nullptr);
  fingerprint["output"] = output;
  fingerprint["fingerprint"] = sha256_hex(fingerprint.dump());
  return fingerprint;
}

std::vector<std::string> fingerprint_changes(const json& before, const json& now) {
  std::vector<std::string> changes;
  if (before.value("fingerprint", "") == now.value("fingerprint", "")) return changes;
  constexpr std::size_t kLimit = 12;
  if (before.value("ctquant_version", "") != now.value("ctquant_version", "") ||
      before.value("record_format", 0) != now.value("record_format", 0)) {
    changes.push_back(fmt::format("ctquant version: {} then, {} now",
                                  before.value("ctquant_version", "?"),
                                  now.value("ctquant_version", "?")));
  }
  const json bi = before.value("input", json::object());
  const json ni = now.value("input", json::object());
  const auto by_name = [](const json& list) {
    std::map<std::string, json> out;
    if (list.is_array()) {
      for (const json& item : list) {
        if (item.is_object() && item.contains("name")) out[item.value("name", "")] = item;
      }
    }
    return out;
  };
  const auto compare_files = [&](const char* key, const char* what) {
    const auto b = by_name(bi.value(key, json::array()));
    const auto n = by_name(ni.value(key, json::array()));
    for (const auto& [name, item] : b) {
      if (changes.size() >= kLimit) return;
      const auto it = n.find(name);
      if (it == n.end()) {
        changes.push_back(fmt::format("input {} {}: gone", what, name));
      } else if (item.value("size", 0ull) != it->second.value("size", 0ull)) {
        changes.push_back(fmt::format("input {} {}: {} bytes then, {} now", what, name,
                                      item.value("size", 0ull), it->second.value("size", 0ull)));
      } else if (item.value("header_sha256", "") != it->second.value("header_sha256", "")) {
        changes.push_back(fmt::format("input {} {}: its header differs", what, name));
      }
    }
    for (const auto& [name, item] : n) {
      if (changes.size() >= kLimit) return;
      if (b.count(name) == 0) changes.push_back(fmt::format("input {} {}: new", what, name));
    }
  };
  compare_files("shards", "shard");
  compare_files("other_files", "file");
  if (bi.value("config_sha256", "") != ni.value("config_sha256", "")) {
    changes.push_back(fmt::format("input {}: differs", kConfigFileName));
  }
  if (bi.value("index_sha256", "") != ni.value("index_sha256", "")) {
    changes.push_back(fmt::format("input {}: differs", kIndexFileName));
  }
  std::vector<std::string> options;
  json_changes(before.value("options", json()), now.value("options", json()), "", options, kLimit);
  for (const std::string& o : options) changes.push_back("options: quantization_config." + o);
  if (changes.empty()) changes.push_back("the output layout differs");
  return changes;
}

}  // namespace ctquant
