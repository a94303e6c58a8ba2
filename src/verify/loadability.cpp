#include "ctquant/verify/loadability.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include <unordered_set>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/format/targets.hpp"
#include "ctquant/model/roles.hpp"
#include "ctquant/model/vllm_match.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant {

using nlohmann::json;

namespace {

constexpr const char* kKind = "loadability";

// compressed-tensors' CompressionFormat values that no scheme family of the
// registry writes; the others are the families' formats.
const std::set<std::string> kOtherFormats = {"dense", "sparse-bitmask", "sparse-24-bitmask",
                                             "marlin-24", "mixed-precision"};

bool is_compressed_tensors_format(const std::string& format) {
  return family_by_format(format) != nullptr || kOtherFormats.contains(format);
}

// The format vLLM serves integer weight-only groups from (the registry row
// with vllm_int_weight_only).
std::string int_weight_only_format() {
  for (const SchemeFamily* f : scheme_families()) {
    if (f->vllm_int_weight_only) return std::string(f->format);
  }
  return std::string();
}

// obj[key] when it is a string (or a boolean), else `otherwise`: a field
// that is absent, null or of another type is read as its default, never
// thrown on (nlohmann's value() throws for null).
std::string string_field(const json& obj, const char* key, const std::string& otherwise) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

bool bool_field(const json& obj, const char* key, bool otherwise) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : otherwise;
}

bool non_empty(const json& v) {
  if (v.is_null()) return false;
  if (v.is_object() || v.is_array() || v.is_string()) return !v.empty();
  return true;
}

struct Group {
  std::string name;
  json weights;
  std::vector<std::string> targets;
  std::string format;  // its own, or the top-level one readers then take
  bool symmetric = true;
  int bits = 4;
};

// The group of each module as vLLM reads config.json (GroupTargets, the
// resolver quantize and lint use; vLLM's reading is the one loadability
// checks against).
class ModuleGroups {
 public:
  explicit ModuleGroups(const std::vector<Group>& groups) : groups_(groups) {
    std::vector<std::vector<std::string>> targets;
    std::vector<std::string> names;
    for (const Group& g : groups) {
      targets.push_back(g.targets);
      names.push_back(g.name);
    }
    try {
      resolver_.emplace(targets, names);
    } catch (const Error&) {
      // Reported with vLLM's reading of the targets (check_loadability).
    }
  }
  // nullptr when no group's targets match the module (or they cannot be
  // evaluated).
  const Group* of(const std::string& module) const {
    if (!resolver_) return nullptr;
    GroupResolution r;
    try {
      r = resolver_->resolve(module);
    } catch (const Error&) {
      return nullptr;  // a pattern that cannot be matched: reported by vLLM's reading
    }
    const std::optional<std::size_t> g = r.vllm ? r.vllm : r.compressed_tensors;
    return g ? &groups_[*g] : nullptr;
  }

 private:
  const std::vector<Group>& groups_;
  std::optional<GroupTargets> resolver_;
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

// The tensors of the written shards, and which modules are quantized:
// packed codes (weight_packed), or a weight with its scale (float-quantized
// formats keep M.weight, FP8 or FP4 codes beside M.weight_scale). 16-bit
// modules have neither.
struct WrittenTensors {
  std::map<std::string, std::pair<std::string, const TensorEntry*>> tensors;  // name -> (shard label, entry)
  std::vector<std::string> packed;  // modules with weight_packed, in name order
  std::set<std::string> packed_set;
  std::set<std::string> quantized;
};

WrittenTensors written_tensors(const std::vector<SafetensorsFile>& shards) {
  WrittenTensors w;
  for (const SafetensorsFile& shard : shards) {
    for (const TensorEntry& t : shard.header().tensors) {
      w.tensors.emplace(t.name, std::make_pair(shard.label(), &t));
    }
  }
  for (const auto& [name, at] : w.tensors) {
    if (name.ends_with(".weight_packed")) {
      w.packed.push_back(module_of(name));
      w.quantized.insert(module_of(name));
    } else if (name.ends_with(".weight_scale")) {
      w.quantized.insert(module_of(name));
    }
  }
  w.packed_set.insert(w.packed.begin(), w.packed.end());
  return w;
}

// config.json's quantization_config object, or nullptr.
const json* quantization_config(const std::optional<json>& config) {
  if (!config || !config->is_object()) return nullptr;
  const auto it = config->find("quantization_config");
  return it != config->end() && it->is_object() ? &*it : nullptr;
}

// Quantized tensors with no quantization_config to say so.
void check_unannounced(const WrittenTensors& w, Checks& c) {
  if (w.quantized.empty()) return;
  c.diff(kConfigFileName, "",
         fmt::format("{} quantized module(s) (first '{}'), but config.json has no "
                     "quantization_config: no loader knows they are quantized",
                     w.quantized.size(), *w.quantized.begin()));
}

// The config block: quant_method, quantization_status, format, transforms
// and sparsity. Returns the top-level format.
std::string check_config_block(const json& qc, Checks& c) {
  const std::string method = string_field(qc, "quant_method", "");
  if (method != "compressed-tensors") {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config.quant_method is '{}': vLLM and transformers read "
                       "compressed-tensors checkpoints only under \"compressed-tensors\"",
                       method));
  }
  const std::string status = string_field(qc, "quantization_status", "");
  if (status != "compressed") {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config.quantization_status is '{}': transformers "
                       "decompresses packed weights only when it is \"compressed\"",
                       status));
  }
  const std::string top_format = string_field(qc, "format", "");
  if (!is_compressed_tensors_format(top_format)) {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config.format '{}' is not a compressed-tensors format",
                       top_format));
  }
  for (const char* key : {"transform_config", "sparsity_config"}) {
    if (const auto it = qc.find(key); it != qc.end() && non_empty(*it)) {
      c.diff(kConfigFileName, "",
             fmt::format("quantization_config.{} is not empty: {}", key,
                         std::string(key) == "transform_config"
                             ? "vLLM applies transforms online only (and not at tensor-parallel "
                               "degrees above 1); ctquant's weights carry none"
                             : "vLLM refuses sparsity configs (\"Sparsity support has been "
                               "removed\")"));
    }
  }
  return top_format;
}

// The top-level format as a note quotes it: 'name', or null / absent.
std::string top_format_text(const json& qc) {
  const auto it = qc.find("format");
  if (it == qc.end()) return "(absent)";
  return it->is_string() ? fmt::format("'{}'", it->get<std::string>()) : it->dump();
}

// The config groups, each checked for a format vLLM reads it with and for
// actorder.
std::vector<Group> read_groups(const json& qc, const std::string& top_format, Checks& c) {
  std::vector<Group> groups;
  const auto it = qc.find("config_groups");
  if (it == qc.end() || !it->is_object()) return groups;
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
    // vLLM reads a group without a format (absent or null) with the
    // top-level one (compressed_tensors.py: "If no per-config format
    // defined, use global format in config").
    const auto own = group.find("format");
    const bool has_format = own != group.end() && own->is_string();
    const std::string format = has_format ? own->get<std::string>() : top_format;
    g.format = format;
    if (!has_format && top_format == "mixed-precision") {
      c.diff(kConfigFileName, "",
             fmt::format("config group '{}' has no format ({}) while the top-level format is "
                         "\"mixed-precision\": vLLM then finds no scheme for it",
                         name, own == group.end() ? "absent" : own->dump()));
    } else if (own != group.end() && own->is_null()) {
      c.note(kConfigFileName, "",
             fmt::format("config group '{}' has format null (model_free_ptq writes a group "
                         "that quantized no module so): readers take the top-level format {}",
                         name, top_format_text(qc)));
    } else if (own != group.end() && !has_format) {
      c.diff(kConfigFileName, "",
             fmt::format("config group '{}': format is {}, not a string", name, own->dump()));
    }
    if (g.weights.is_object()) {
      g.symmetric = bool_field(g.weights, "symmetric", true);
      if (const auto b = g.weights.find("num_bits"); b != g.weights.end() && b->is_number_integer()) {
        g.bits = b->get<int>();
      }
      const bool int_weights = string_field(g.weights, "type", "int") == "int";
      const bool activations = non_empty(group.value("input_activations", json()));
      const SchemeFamily* family = family_by_format(format);
      if (int_weights && !activations && (family == nullptr || !family->vllm_int_weight_only)) {
        c.diff(kConfigFileName, "",
               fmt::format("config group '{}': int weight-only quantization with format '{}'; "
                           "vLLM reads it only as \"{}\" (other formats trip its "
                           "weights.type == FLOAT assertion)",
                           name, format, int_weight_only_format()));
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
  return groups;
}

// The written targets of every group (each once, first seen first) and the
// ignore list.
std::vector<std::string> written_targets(const std::vector<Group>& groups) {
  std::vector<std::string> targets;
  std::unordered_set<std::string> seen;
  for (const Group& g : groups) {
    for (const auto& t : g.targets) {
      if (seen.insert(t).second) targets.push_back(t);
    }
  }
  return targets;
}

std::vector<std::string> written_ignore(const json& qc) {
  std::vector<std::string> ignore;
  if (const auto it = qc.find("ignore"); it != qc.end() && it->is_array()) {
    for (const json& e : *it) {
      if (e.is_string()) ignore.push_back(e.get<std::string>());
    }
  }
  return ignore;
}

// Packed modules' tensors: no .weight beside weight_packed, the scale (and
// the shape, for a format that records it), a zero point exactly when the
// scheme is asymmetric.
void check_packed_modules(const WrittenTensors& w, const std::string& top_format,
                          const ModuleGroups& groups, Checks& c) {
  for (const std::string& m : w.packed) {
    const Group* scheme = groups.of(m);
    const SchemeFamily* family = family_by_format(scheme != nullptr ? scheme->format : top_format);
    const std::string& file = w.tensors.at(m + ".weight_packed").first;
    if (w.tensors.contains(m + ".weight")) {
      c.diff(file, m + ".weight",
             fmt::format("module '{}' is packed and still has a .weight: a loader that builds it "
                         "quantized finds a tensor it has no parameter for",
                         m));
    }
    std::vector<const char*> needed{"weight_scale"};
    if (family != nullptr && family->writes_weight_shape) needed.push_back("weight_shape");
    for (const char* p : needed) {
      if (!w.tensors.contains(m + "." + p)) {
        c.diff(file, m + ".weight_packed",
               fmt::format("packed module '{}' has no {}", m, p));
      }
    }
    const bool zp = w.tensors.contains(m + ".weight_zero_point");
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
}

// The tensors as the role analysis takes them: a packed module as its
// .weight, with the unpacked column count (codes of `bits` bits); a
// quantized module's other tensors left out.
std::vector<std::pair<std::string, std::vector<std::uint64_t>>> role_listing(
    const WrittenTensors& w, const ModuleGroups& groups) {
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> listed;
  for (const auto& [name, at] : w.tensors) {
    const std::string module = module_of(name);
    if (w.quantized.contains(module)) {
      const auto& shape = at.second->shape;
      if (name.ends_with(".weight_packed") && shape.size() == 2) {
        const Group* g = groups.of(module);
        const int bits = g != nullptr && g->bits > 0 && g->bits <= 32 ? g->bits : 4;
        const std::uint64_t word_bits = static_cast<std::uint64_t>(dtype_bits(at.second->dtype));
        listed.emplace_back(module + ".weight",
                            std::vector<std::uint64_t>{
                                shape[0], shape[1] * word_bits / static_cast<std::uint64_t>(bits)});
      } else if (name == module + ".weight" && !w.packed_set.contains(module)) {
        listed.emplace_back(name, shape);
      }
      continue;
    }
    listed.emplace_back(name, at.second->shape);
  }
  return listed;
}

// Every module's state against vLLM's reading of ignore and targets (and
// stacked experts against the family's vLLM loader).
void check_vllm_reading(const WrittenTensors& w, const RoleAnalysis& roles,
                        const VllmLoadRules& rules, Checks& c) {
  std::set<std::string> refused_layers;
  for (const ModuleInfo& m : roles.modules) {
    if (m.role == ModuleRole::kParameter || m.role == ModuleRole::kNorm) continue;
    const bool is_packed = w.quantized.contains(m.module);
    const std::string tensor =
        w.packed_set.contains(m.module) ? m.module + ".weight_packed" : m.tensor;
    const auto found = w.tensors.find(tensor);
    const std::string file = found == w.tensors.end() ? std::string() : found->second.first;
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
    const VllmExpectation e = rules.expect(m);
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

}  // namespace

void check_loadability(const std::optional<json>& config,
                       const std::vector<SafetensorsFile>& shards, VerifyReport& report) {
  Checks c(report);
  const WrittenTensors written = written_tensors(shards);
  const json* qc = quantization_config(config);
  if (qc == nullptr) {
    check_unannounced(written, c);
    return;
  }
  const std::string top_format = check_config_block(*qc, c);
  const std::vector<Group> groups = read_groups(*qc, top_format, c);
  const ModuleGroups module_groups(groups);
  check_packed_modules(written, top_format, module_groups, c);
  const RoleAnalysis roles = analyze_roles(config, role_listing(written, module_groups));
  std::optional<VllmLoadRules> rules;
  try {
    rules.emplace(roles, written_ignore(*qc), written_targets(groups));
  } catch (const Error& e) {
    c.diff(kConfigFileName, "",
           fmt::format("quantization_config ignore or targets cannot be evaluated: {}", e.what()));
    return;
  }
  check_vllm_reading(written, roles, *rules, c);
}

}  // namespace ctquant
