#include "ctquant/verify/loadability.hpp"

#include <map>
#include <set>
#include <string>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/model/roles.hpp"
#include "ctquant/model/vllm_match.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant {

using nlohmann::json;

namespace {

constexpr const char* kKind = "loadability";

// compressed-tensors' CompressionFormat values (mxfp8-quantized: schemes.md
// section 2, fixture llama-bf16-mxfp8a16).
const std::set<std::string> kFormats = {
    "dense",           "sparse-bitmask",       "sparse-24-bitmask",    "int-quantized",
    "float-quantized", "naive-quantized",      "pack-quantized",       "marlin-24",
    "mixed-precision", "nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp8-quantized"};

bool non_empty(const json& v) {
  if (v.is_null()) return false;
  if (v.is_object() || v.is_array() || v.is_string()) return !v.empty();
  return true;
}

struct Group {
  std::string name;
  json weights;
  std::vector<std::string> targets;
  bool symmetric = true;
  int bits = 4;
};

class Checks {
 public:
  explicit Checks(VerifyReport& report) : report_(report) {}
  void diff(const std::string& file, const std::string& tensor, std::string message) {
    report_.differences.push_back(VerifyItem{kKind, file, tensor, std::move(message), json::object()});
  }
  void note(const std::string& file, const std::string& tensor, std::string message) {
    report_.notes.push_back(VerifyItem{kKind, file, tensor, std::move(message), json::object()});
  }

 private:
  VerifyReport& report_;
};

}  // namespace

void check_loadability(const std::optional<json>& config,
                       const std::vector<SafetensorsFile>& shards, VerifyReport& report) {
  Checks c(report);
  // Every tensor: name -> (shard label, entry).
  std::map<std::string, std::pair<std::string, const TensorEntry*>> tensors;
  for (const SafetensorsFile& shard : shards) {
    for (const TensorEntry& t : shard.header().tensors) {
      tensors.emplace(t.name, std::make_pair(shard.label(), &t));
    }
  }
  // Quantized modules: packed codes (weight_packed), or a weight with its
  // scale (float-quantized formats keep M.weight, FP8 or FP4 codes beside
  // M.weight_scale). 16-bit modules have neither.
  std::vector<std::string> packed;  // modules with weight_packed, in name order
  std::set<std::string> quantized;
  for (const auto& [name, at] : tensors) {
    if (name.ends_with(".weight_packed")) {
      packed.push_back(module_of(name));
      quantized.insert(module_of(name));
    } else if (name.ends_with(".weight_scale")) {
      quantized.insert(module_of(name));
    }
  }
  const json* qc = nullptr;
  if (config && config->is_object()) {
    if (const auto it = config->find("quantization_config"); it != config->end() && it->is_object()) {
      qc = &*it;
    }
  }
  if (qc == nullptr) {
    if (!quantized.empty()) {
      c.diff(kConfigFileName, "",
             fmt::format("{} quantized module(s) (first '{}'), but config.json has no "
                         "quantization_config: no loader knows they are quantized",
                         quantized.size(), *quantized.begin()));
    }
    return;
  }

  // The config block.
  const std::string method = qc->value("quant_method", std::string());
  if (method != "compressed-tensors") {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config.quant_method is '{}': vLLM and transformers read "
                       "compressed-tensors checkpoints only under \"compressed-tensors\"",
                       method));
  }
  const std::string status = qc->value("quantization_status", std::string());
  if (status != "compressed") {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config.quantization_status is '{}': transformers "
                       "decompresses packed weights only when it is \"compressed\"",
                       status));
  }
  const std::string top_format = qc->value("format", std::string());
  if (!kFormats.contains(top_format)) {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config.format '{}' is not a compressed-tensors format",
                       top_format));
  }
  for (const char* key : {"transform_config", "sparsity_config"}) {
    if (const auto it = qc->find(key); it != qc->end() && non_empty(*it)) {
      c.diff(kConfigFileName, "",
             fmt::format("quantization_config.{} is not empty: {}", key,
                         std::string(key) == "transform_config"
                             ? "vLLM applies transforms online only (and not at tensor-parallel "
                               "degrees above 1); ctquant's weights carry none"
                             : "vLLM refuses sparsity configs (\"Sparsity support has been "
                               "removed\")"));
    }
  }
  std::vector<Group> groups;
  if (const auto it = qc->find("config_groups"); it != qc->end() && it->is_object()) {
    for (const auto& [name, group] : it->items()) {
      if (!group.is_object()) continue;
      Group g;
      g.name = name;
      g.weights = group.value("weights", json());
      if (const auto t = group.find("targets"); t != group.end() && t->is_array()) {
        for (const json& x : *t) {
          if (x.is_string()) g.targets.push_back(x.get<std::string>());
        }
      }
      const std::string format = group.value("format", top_format);
      if (!group.contains("format") && top_format == "mixed-precision") {
        c.diff(kConfigFileName, "",
               fmt::format("config group '{}' has no format while the top-level format is "
                           "\"mixed-precision\": vLLM then finds no scheme for it",
                           name));
      }
      if (g.weights.is_object()) {
        g.symmetric = g.weights.value("symmetric", true);
        if (const auto b = g.weights.find("num_bits"); b != g.weights.end() && b->is_number_integer()) {
          g.bits = b->get<int>();
        }
        const bool int_weights = g.weights.value("type", std::string("int")) == "int";
        const bool activations = non_empty(group.value("input_activations", json()));
        if (int_weights && !activations && format != "pack-quantized") {
          c.diff(kConfigFileName, "",
                 fmt::format("config group '{}': int weight-only quantization with format '{}'; "
                             "vLLM reads it only as \"pack-quantized\" (other formats trip its "
                             "weights.type == FLOAT assertion)",
                             name, format));
        }
        if (const auto a = g.weights.find("actorder"); a != g.weights.end() && !a->is_null()) {
          c.diff(kConfigFileName, "",
                 fmt::format("config group '{}': weights.actorder is {}; a loader then expects "
                             "weight_g_idx (\"group\") or a reordering ctquant never wrote",
                             name, a->dump()));
        }
      }
      groups.push_back(std::move(g));
    }
  }
  std::vector<std::string> targets;
  for (const Group& g : groups) {
    for (const auto& t : g.targets) {
      if (std::find(targets.begin(), targets.end(), t) == targets.end()) targets.push_back(t);
    }
  }
  std::vector<std::string> ignore;
  if (const auto it = qc->find("ignore"); it != qc->end() && it->is_array()) {
    for (const json& e : *it) {
      if (e.is_string()) ignore.push_back(e.get<std::string>());
    }
  }
  const Group* scheme = groups.empty() ? nullptr : &groups.front();

  // Packed modules' tensors.
  std::set<std::string> packed_set(packed.begin(), packed.end());
  for (const std::string& m : packed) {
    const std::string& file = tensors.at(m + ".weight_packed").first;
    if (tensors.contains(m + ".weight")) {
      c.diff(file, m + ".weight",
             fmt::format("module '{}' is packed and still has a .weight: a loader that builds it "
                         "quantized finds a tensor it has no parameter for",
                         m));
    }
    // pack-quantized (the int formats) also records each weight's shape;
    // the FP4 formats do not.
    std::vector<const char*> needed{"weight_scale"};
    if (top_format == "pack-quantized") needed.push_back("weight_shape");
    for (const char* p : needed) {
      if (!tensors.contains(m + "." + p)) {
        c.diff(file, m + ".weight_packed",
               fmt::format("packed module '{}' has no {}", m, p));
      }
    }
    const bool zp = tensors.contains(m + ".weight_zero_point");
    if (scheme != nullptr && scheme->symmetric && zp) {
      c.diff(file, m + ".weight_zero_point",
             fmt::format("module '{}' has a weight_zero_point, but the scheme is symmetric: "
                         "vLLM creates no zero-point parameter for it",
                         m));
    } else if (scheme != nullptr && !scheme->symmetric && !zp) {
      c.diff(file, m + ".weight_packed",
             fmt::format("module '{}' has no weight_zero_point, but the scheme is asymmetric", m));
    }
  }

  // Every module's state against vLLM's reading of ignore and targets. A
  // packed module is given to the role analysis as its .weight, with the
  // unpacked column count.
  const int bits = scheme != nullptr && scheme->bits > 0 && scheme->bits <= 32 ? scheme->bits : 4;
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> listed;
  for (const auto& [name, at] : tensors) {
    const std::string module = module_of(name);
    if (quantized.contains(module)) {
      const auto& shape = at.second->shape;
      if (name.ends_with(".weight_packed") && shape.size() == 2) {
        const std::uint64_t word_bits = static_cast<std::uint64_t>(dtype_bits(at.second->dtype));
        listed.emplace_back(module + ".weight",
                            std::vector<std::uint64_t>{
                                shape[0], shape[1] * word_bits / static_cast<std::uint64_t>(bits)});
      } else if (name == module + ".weight" && !packed_set.contains(module)) {
        listed.emplace_back(name, shape);
      }
      continue;
    }
    listed.emplace_back(name, at.second->shape);
  }
  const RoleAnalysis roles = analyze_roles(config, listed);
  std::optional<VllmLoadRules> rules;
  try {
    rules.emplace(roles, ignore, targets);
  } catch (const Error& e) {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config ignore or targets cannot be evaluated: {}", e.what()));
    return;
  }
  std::set<std::string> refused_layers;
  for (const ModuleInfo& m : roles.modules) {
    if (m.role == ModuleRole::kParameter || m.role == ModuleRole::kNorm) continue;
    const bool is_packed = quantized.contains(m.module);
    const std::string tensor = packed_set.contains(m.module) ? m.module + ".weight_packed" : m.tensor;
    const auto found = tensors.find(tensor);
    const std::string file = found == tensors.end() ? std::string() : found->second.first;
    if (m.role == ModuleRole::kStackedExperts && m.stacked) {
      const StackedExperts& s = roles.stacked[*m.stacked];
      if (!s.vllm_loads_stacked) {
        c.diff(file, tensor,
               fmt::format("3-D stacked experts {}: {}'s vLLM loader reads experts per expert "
                           "(experts.{{e}}.gate_proj/up_proj/down_proj)",
                           shape_string(m.shape),
                           roles.family != nullptr ? roles.family->name : "this architecture"));
        continue;
      }
    }
    const VllmExpectation e = rules->expect(m);
    using State = VllmExpectation::State;
    if (e.state == State::kRefused) {
      // Once per layer, at its first module.
      if (refused_layers.insert(e.layer).second) {
        c.diff(file, tensor, fmt::format("vLLM refuses to build '{}': {}", e.layer, e.why));
      }
    } else if (m.build == VllmBuild::kPlain && is_packed) {
      c.diff(file, tensor,
             fmt::format("'{}' is quantized, but vLLM loads it as a 16-bit .weight ({})", m.module,
                         m.reason));
    } else if (e.state == State::kPacked && !is_packed) {
      c.diff(file, tensor,
             fmt::format("'{}' is in 16 bits, but vLLM builds '{}' quantized ({}) and looks for "
                         "its quantized tensors",
                         m.module, e.layer, e.why));
    } else if (e.state == State::kUnquantized && is_packed) {
      c.diff(file, tensor,
             fmt::format("'{}' is quantized, but vLLM builds '{}' unquantized ({}) and looks for "
                         "a 16-bit .weight",
                         m.module, e.layer, e.why));
    } else if (e.unmatched) {
      c.note(file, tensor, e.why);
    }
  }
}

}  // namespace ctquant
