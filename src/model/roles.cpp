#include "ctquant/model/roles.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "model/role_paths.hpp"

namespace ctquant {

using nlohmann::json;

namespace detail {

// ---------------------------------------------------------------------------
// Name helpers.

std::vector<std::string> split_dots(std::string_view name) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const auto dot = name.find('.', begin);
    parts.emplace_back(name.substr(begin, dot == std::string_view::npos ? dot : dot - begin));
    if (dot == std::string_view::npos) break;
    begin = dot + 1;
  }
  return parts;
}

std::string join_dots(const std::vector<std::string>& parts, std::size_t from, std::size_t to) {
  std::string out;
  for (std::size_t i = from; i < parts.size() && i < to; ++i) {
    if (i > from) out += '.';
    out += parts[i];
  }
  return out;
}

bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

// A name with its numeric components replaced by "#" ("layers.#.mlp"): the
// template modules of every layer share.
std::string numbered_template(std::string_view name) {
  std::vector<std::string> parts = split_dots(name);
  for (std::string& p : parts) {
    if (is_digits(p)) p.assign(1, '#');
  }
  return join_dots(parts);
}

ComponentAt component_of(const std::string& module, const ModelDims& dims,
                         const FamilyRow* family) {
  static const std::set<std::string> kVision = {"vision_tower",   "visual",        "vision_model",
                                                "vision_encoder", "image_encoder", "vision"};
  static const std::set<std::string> kAudio = {"audio_tower", "audio_model", "audio_encoder",
                                               "audio"};
  static const std::set<std::string> kProjector = {"multi_modal_projector", "mm_projector",
                                                   "multimodal_projector", "connector"};
  const std::vector<std::string> parts = split_dots(module);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string& p = parts[i];
    const auto at = [&](Component c) { return ComponentAt{c, join_dots(parts, 0, i + 1)}; };
    if (kVision.contains(p)) return at(Component::kVision);
    if (kAudio.contains(p)) return at(Component::kAudio);
    if (kProjector.contains(p)) return at(Component::kProjector);
  }
  const bool draft = family != nullptr && !family->top_level_quant_config;
  if (draft) return {Component::kDraft, ""};
  if (!parts.empty() && (parts[0] == "mtp" || (parts.size() > 1 && parts[1] == "mtp"))) {
    return {Component::kMtp, ""};
  }
  if (dims.layers && dims.nextn_layers > 0) {
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i] == "layers" && is_digits(parts[i + 1]) && parts[i + 1].size() < 10) {
        const auto index = std::stoull(parts[i + 1]);
        if (index >= *dims.layers) return {Component::kMtp, ""};
        break;
      }
    }
  }
  return {};
}

// The checkpoint module name a 3-D expert tensor belongs to: its path through
// the last `experts` component.
std::string moe_layer_of(const std::string& name) {
  const std::vector<std::string> parts = split_dots(name);
  for (std::size_t i = parts.size(); i-- > 0;) {
    if (parts[i] == "experts") return join_dots(parts, 0, i + 1);
  }
  return module_of(name);
}

}  // namespace detail

using detail::component_of;
using detail::ComponentAt;
using detail::is_digits;
using detail::join_dots;
using detail::moe_layer_of;
using detail::numbered_template;
using detail::split_dots;

namespace {

std::optional<std::uint64_t> uint_field(const json& object, const char* key) {
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  const auto v = it->get<std::int64_t>();
  if (v < 0) return std::nullopt;
  return static_cast<std::uint64_t>(v);
}

bool truthy_field(const json& object, const char* key) {
  if (!object.is_object()) return false;
  const auto it = object.find(key);
  if (it == object.end()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number()) return it->get<double>() != 0.0;
  if (it->is_array() || it->is_object() || it->is_string()) return !it->empty();
  return false;
}

// The packed_modules_mapping vLLM matches ignore with: for the row's own
// quantization config, its listed fused groups; none for drafts.
bool fused_listed(const FusedSpec& spec, const std::optional<json>& config) {
  if (spec.listed_if_config == nullptr) return true;
  if (!config) return false;
  const json* text = &*config;
  if (const auto it = config->find("text_config"); it != config->end() && it->is_object()) {
    text = &*it;
  }
  for (const std::string& key : split_dots(replace_all(spec.listed_if_config, ",", "."))) {
    if (truthy_field(*config, key.c_str()) || truthy_field(*text, key.c_str())) return true;
  }
  return false;
}

ModelDims read_dims(const std::optional<json>& config, const FamilyRow* family) {
  ModelDims d;
  if (!config || !config->is_object()) return d;
  const json& top = *config;
  const json* text = &top;
  if (const auto it = top.find("text_config"); it != top.end() && it->is_object()) text = &*it;
  const auto pick = [&](const char* key) {
    auto v = uint_field(*text, key);
    return v ? v : uint_field(top, key);
  };
  d.vocab = pick("vocab_size");
  d.draft_vocab = pick("draft_vocab_size");
  d.hidden = pick("hidden_size");
  d.intermediate = pick("intermediate_size");
  const char* key = family ? family->intermediate_key : "moe_intermediate_size";
  d.moe_intermediate = pick(key);
  if (!d.moe_intermediate) d.moe_intermediate = pick("moe_intermediate_size");
  if (!d.moe_intermediate) d.moe_intermediate = pick("intermediate_size");
  for (const char* k : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (!d.experts) d.experts = pick(k);
  }
  d.layers = pick("num_hidden_layers");
  d.nextn_layers = pick("num_nextn_predict_layers").value_or(0);
  d.tied = truthy_field(top, "tie_word_embeddings") || truthy_field(*text, "tie_word_embeddings");
  if (const auto it = top.find("vision_config"); it != top.end() && it->is_object()) {
    d.vision_hidden = uint_field(*it, "hidden_size");
    d.vision_intermediate = uint_field(*it, "intermediate_size");
  }
  return d;
}

struct RoleDecision {
  ModuleRole role = ModuleRole::kLinear;
  VllmBuild build = VllmBuild::kQuantizable;
  std::string reason;
  const char* entry = nullptr;
  std::size_t rule = SIZE_MAX;
};

// The generic name and shape rules (every checkpoint; the only ones for an
// architecture the table does not know).
RoleDecision generic_role(const std::string& module, const std::string& tensor,
                          const std::vector<std::uint64_t>& shape, const ModelDims& dims,
                          bool is_weight) {
  RoleDecision r;
  const std::string last = last_component(module);
  const std::string parent_last = last_component(module_of(module));
  const std::vector<std::string> parts = split_dots(module);
  const bool numbered = std::any_of(parts.begin(), parts.end(), is_digits);
  if (shape.size() == 3) {
    r.role = ModuleRole::kStackedExperts;
    r.reason = "stacked experts: every expert of the layer in one 3-D tensor";
    return r;
  }
  if (!is_weight) {
    r.role = ModuleRole::kParameter;
    r.build = VllmBuild::kPlain;
    r.reason =
        fmt::format("'{}' is a raw parameter, not a module's .weight: never quantized (section 2)",
                    last_component(tensor));
    return r;
  }
  if (last.ends_with("norm")) {
    r.role = ModuleRole::kNorm;
    r.build = VllmBuild::kPlain;
    r.reason = "norm: vLLM builds RMSNorm / LayerNorm, never quantized (section 2)";
    return r;
  }
  if (last == "lm_head" || module.ends_with("shared_head.head")) {
    r.role = ModuleRole::kHead;
    r.build = VllmBuild::kIfTargeted;
    r.reason =
        "output head: vLLM builds ParallelLMHead, quantized only when a target names it (a "
        "Linear target does not)";
    return r;
  }
  if (last.find("embed") != std::string::npos || last == "wte" || last == "wpe") {
    r.role = ModuleRole::kEmbedding;
    r.build = VllmBuild::kIfTargeted;
    r.reason =
        "embedding: vLLM builds VocabParallelEmbedding, quantized only when a target names it "
        "(a Linear target does not)";
    return r;
  }
  if (last == "shared_expert_gate") {
    r.role = ModuleRole::kSharedExpertGate;
    r.build = VllmBuild::kPlain;
    r.reason = "shared-expert gate: a [1, hidden] gate vLLM builds without the quantization config";
    return r;
  }
  static const std::set<std::string> kMoeBlocks = {"mlp", "block_sparse_moe", "feed_forward",
                                                   "moe"};
  if (last == "router" || (last == "gate" && kMoeBlocks.contains(parent_last) &&
                           shape.size() == 2 && (!dims.experts || shape[0] == *dims.experts))) {
    r.role = ModuleRole::kRouter;
    r.reason =
        "router: [num_experts, hidden] gate of a MoE layer; kept in 16 bits and named in "
        "ignore (vLLM builds routers without the quantization config, or as a Linear the "
        "target would take)";
    return r;
  }
  for (std::size_t i = 0; i + 2 < parts.size(); ++i) {
    if (parts[i] == "experts" && is_digits(parts[i + 1])) {
      r.role = ModuleRole::kExpert;
      r.reason = "expert projection: vLLM loads the experts of a layer into one fused MoE layer";
      return r;
    }
  }
  if (last == "eh_proj") {
    r.role = ModuleRole::kPlainLinear;
    r.build = VllmBuild::kPlain;
    r.reason = "MTP eh_proj: vLLM builds torch.nn.Linear";
    return r;
  }
  // [vocab, hidden] names an embedding or head only outside the decoder
  // blocks (a projection may happen to have that shape).
  static const std::set<std::string> kBlockWords = {
      "layers", "blocks",       "h",   "midlayer", "self_attn", "attn", "attention",
      "mlp",    "feed_forward", "ffn", "experts"};
  const bool in_block = numbered || last.ends_with("_proj") ||
                        std::any_of(parts.begin(), parts.end(),
                                    [](const std::string& p) { return kBlockWords.contains(p); });
  if (!in_block && shape.size() == 2 && dims.vocab && dims.hidden &&
      ((shape[0] == *dims.vocab && shape[1] == *dims.hidden) ||
       (dims.draft_vocab && shape[0] == *dims.draft_vocab && shape[1] == *dims.hidden))) {
    const bool head = last.find("head") != std::string::npos || last == "output";
    r.role = head ? ModuleRole::kHead : ModuleRole::kEmbedding;
    r.build = VllmBuild::kIfTargeted;
    r.reason = fmt::format("{} by its shape [vocab_size, hidden_size] = [{}, {}]",
                           head ? "output head" : "embedding", shape[0], shape[1]);
    return r;
  }
  r.reason = "Linear: vLLM builds it with the quantization config";
  return r;
}

struct CompiledRule {
  const NameRule* rule;
  ModuleMatcher matcher;
};

bool is_3d_expert_tensor(const std::string& name, const std::vector<std::uint64_t>& shape) {
  if (shape.size() != 3) return false;
  const std::vector<std::string> parts = split_dots(name);
  return std::find(parts.begin(), parts.end(), "experts") != parts.end();
}

StackedExperts::Kind stacked_kind(const std::string& tensor) {
  std::string last = last_component(tensor);
  if (last == "weight") last = last_component(module_of(tensor));
  if (last == "gate_up_proj" || last == "w13" || last == "gate_up" || last == "w13_weight") {
    return StackedExperts::Kind::kGateUp;
  }
  if (last == "down_proj" || last == "w2" || last == "w2_weight") {
    return StackedExperts::Kind::kDown;
  }
  return StackedExperts::Kind::kUnknown;
}

// Fills E, I, H and the orientation of one stacked tensor from its shape and
// the config; the sibling pass and the family layout come later.
void size_stacked(StackedExperts& s, const std::vector<std::uint64_t>& shape,
                  const ModelDims& dims) {
  s.experts = shape[0];
  s.hidden = dims.hidden.value_or(0);
  s.intermediate = dims.moe_intermediate.value_or(0);
  if (dims.experts && *dims.experts != shape[0]) {
    s.problem =
        fmt::format("dim 0 is {}, but config.json says {} experts", shape[0], *dims.experts);
    return;
  }
  if (s.hidden == 0 || s.intermediate == 0) {
    s.problem = "config.json gives no hidden size or expert intermediate size to read the dims by";
    return;
  }
  const std::uint64_t h = s.hidden;
  std::uint64_t out = 0;
  std::uint64_t in = 0;
  switch (s.kind) {
    case StackedExperts::Kind::kGateUp:
      out = 2 * s.intermediate;
      in = h;
      break;
    case StackedExperts::Kind::kDown:
      out = h;
      in = s.intermediate;
      break;
    case StackedExperts::Kind::kUnknown:
      s.problem = "its name says neither gate_up_proj nor down_proj";
      return;
  }
  if (shape[1] == out && shape[2] == in) {
    s.orientation = StackedExperts::Orientation::kOutIn;
  } else if (shape[1] == in && shape[2] == out) {
    s.orientation = StackedExperts::Orientation::kInOut;
  } else {
    s.problem = fmt::format(
        "dims [{}, {}] are not [{}, {}] in either order (E={}, I={}, H={} from config.json)",
        shape[1], shape[2], out, in, s.experts, s.intermediate, h);
    return;
  }
  if (out != in) {
    s.proof = StackedExperts::Proof::kShape;
  } else {
    s.orientation = StackedExperts::Orientation::kUnknown;  // square: either way
  }
}

}  // namespace

const ModuleInfo* RoleAnalysis::find(std::string_view module) const {
  const auto it = index.find(module);
  return it == index.end() ? nullptr : &modules[it->second];
}

std::string RoleAnalysis::family_text() const {
  if (family == nullptr) return "no row of the role table";
  return fmt::format("{} ({})", family->name, family_source(*family));
}

void check_tie_flag(const std::optional<json>& config) {
  if (!config || !config->is_object()) return;
  const auto check = [](const json& object, const std::string& where) {
    const auto it = object.find("tie_word_embeddings");
    if (it == object.end() || it->is_boolean()) return;
    throw bad_input(fmt::format(
        "{}: {}tie_word_embeddings is {} {}, expected true or false: transformers 5 refuses "
        "this config (its config classes check the type: expected bool), and vLLM and "
        "transformers 4 read it with Python truthiness (any non-empty string, any non-zero "
        "number is true), so whether the head is tied is ambiguous; write true or false",
        kConfigFileName, where, it->is_string() ? "the JSON string" : "the JSON value",
        it->dump()));
  };
  check(*config, "");
  if (const auto text = config->find("text_config"); text != config->end() && text->is_object()) {
    check(*text, "text_config.");
  }
}

namespace {

// The stages of analyze_roles, in order.

using TensorList = std::vector<std::pair<std::string, std::vector<std::uint64_t>>>;

// Stage 1, the model: the family row matching config.json, the
// architecture and model_type it names, why roles come from the generic
// rules when no row matches, and the sizes the rules read.
RoleAnalysis identify_model(const std::optional<json>& config) {
  RoleAnalysis a;
  a.family = match_family(config);
  if (config && config->is_object()) {
    if (const auto it = config->find("architectures");
        it != config->end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
      a.architecture = (*it)[0].get<std::string>();
    }
    if (const auto it = config->find("model_type"); it != config->end() && it->is_string()) {
      a.model_type = it->get<std::string>();
    }
  }
  if (a.family == nullptr) {
    a.fallback = fmt::format(
        "architecture '{}'{} is not in the role table: roles come from name and shape rules "
        "only, vLLM names are assumed equal to the checkpoint's",
        a.architecture.empty() ? "(none)" : a.architecture,
        a.model_type.empty() ? "" : fmt::format(" (model_type {})", a.model_type));
  }
  a.dims = read_dims(config, a.family);
  return a;
}

// Stage 1b, a draft that vLLM numbers after its target's layers
// (FamilyRow::layers_after_target): the offset, or why it is unknown.
void read_layer_offset(RoleAnalysis& a, const std::optional<json>& config) {
  const FamilyRow* row = a.family;
  if (row == nullptr ||
      std::none_of(row->layers_after_target.begin(), row->layers_after_target.end(),
                   [&](const char* arch) { return a.architecture == arch; })) {
    return;
  }
  if (config && config->is_object()) {
    a.vllm_layer_offset = uint_field(*config, "num_target_layers");
    if (const auto it = row->config_key != nullptr ? config->find(row->config_key) : config->end();
        !a.vllm_layer_offset && it != config->end() && it->is_object()) {
      a.vllm_layer_offset = uint_field(*it, "num_target_layers");
    }
  }
  if (!a.vllm_layer_offset) {
    a.vllm_layers_unknown = fmt::format(
        "{} ({}) names the draft's decoder layer N model.layers.{{N + the target's number of "
        "layers}}, and config.json gives no num_target_layers",
        a.architecture, family_source(*row));
  }
}

// model.layers.N... as model.layers.{N + offset}...; other names unchanged.
std::string after_target(const std::string& name, std::uint64_t offset) {
  constexpr std::string_view kLayers = "model.layers.";
  if (!name.starts_with(kLayers)) return name;
  std::size_t end = kLayers.size();
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == kLayers.size() || (end < name.size() && name[end] != '.')) return name;
  std::uint64_t n = 0;
  const char* digits = name.data() + kLayers.size();
  // A number past 64 bits, or one the offset would carry past them, is no
  // layer vLLM builds: left as it is.
  if (std::from_chars(digits, name.data() + end, n).ec != std::errc() || n > UINT64_MAX - offset) {
    return name;
  }
  return fmt::format("{}{}{}", kLayers, n + offset, name.substr(end));
}

// Stage 2, the row's name rules, compiled once.
std::vector<CompiledRule> compile_rules(const FamilyRow* row) {
  std::vector<CompiledRule> rules;
  if (row != nullptr) {
    for (const NameRule& r : row->rules) {
      rules.push_back(CompiledRule{&r, ModuleMatcher({r.pattern}, ModuleMatcher::Role::kIgnore)});
    }
  }
  return rules;
}

// A fused group of the family and whether vLLM's packed_modules_mapping
// lists it.
struct FusedAt {
  const FusedSpec* spec;
  bool listed;
};
using FusedByShard = std::map<std::string, FusedAt>;

// Stage 3, the fused groups: the family's, by shard name (a draft's
// quantization config lists none).
FusedByShard fused_by_shard(const FamilyRow* row, const std::optional<json>& config) {
  FusedByShard shard_to_fused;
  for (const FusedSpec& spec : family_fused_groups(row)) {
    const bool listed =
        (row == nullptr || row->top_level_quant_config) && fused_listed(spec, config);
    for (const char* shard : spec.shards) shard_to_fused[shard] = {&spec, listed};
  }
  return shard_to_fused;
}

// The modules with a `.weight` tensor. A group is fused only where every
// shard is there (a layout missing one does not load as that model anyway;
// partial layouts are tested alone).
std::set<std::string> weight_modules_of(const TensorList& tensors) {
  std::set<std::string> weight_modules;
  for (const auto& [name, shape] : tensors) {
    if (name.ends_with(".weight")) weight_modules.insert(module_of(name));
  }
  return weight_modules;
}

// Stage 4, a tensor's role: the first of the row's name rules that matches
// the module (for a 2-D module weight), else the generic name and shape rules.
RoleDecision decide_role(const std::vector<CompiledRule>& rules, const ModelDims& dims,
                         const std::string& module, const std::string& tensor,
                         const std::vector<std::uint64_t>& shape, bool is_weight,
                         bool stacked_tensor) {
  if (is_weight && !stacked_tensor) {
    for (const CompiledRule& r : rules) {
      if (!r.matcher.entry_matches(0, module)) continue;
      RoleDecision decision;
      decision.role = r.rule->role;
      decision.build = r.rule->build;
      decision.reason = r.rule->reason;
      decision.entry = r.rule->entry;
      decision.rule = static_cast<std::size_t>(&r - rules.data());
      if (r.rule->condition == RuleCondition::kSiglipMlpQuantizableIf64) {
        const bool ok = dims.vision_hidden && dims.vision_intermediate &&
                        *dims.vision_hidden % 64 == 0 && *dims.vision_intermediate % 64 == 0;
        if (!ok) {
          decision.role = ModuleRole::kPlainLinear;
          decision.build = VllmBuild::kPlain;
          decision.reason = fmt::format(
              "SigLIP MLP: vision hidden_size {} and intermediate_size {} are not both "
              "multiples of 64, so vLLM builds fc1/fc2 without the quantization config "
              "(siglip.py@0c028ba4)",
              dims.vision_hidden ? std::to_string(*dims.vision_hidden) : "?",
              dims.vision_intermediate ? std::to_string(*dims.vision_intermediate) : "?");
        }
      }
      return decision;
    }
  }
  return generic_role(module, tensor, shape, dims, is_weight);
}

// Stage 5, vLLM's names: the name ignore is tested on and the layer vLLM
// builds (a MoE layer, whose experts.0.{gate,up,down}_proj vLLM probes; the
// fused layer of a shard whose group is complete, tested under the fused
// name when vLLM does not list the group).
void set_vllm_names(ModuleInfo& m, const FamilyRow* row, const FusedByShard& shard_to_fused,
                    const std::set<std::string>& weight_modules) {
  if (m.role == ModuleRole::kExpert || m.role == ModuleRole::kStackedExperts) {
    m.vllm_layer = vllm_module_name(
        row, moe_layer_of(m.role == ModuleRole::kStackedExperts ? m.tensor : module_of(m.module)));
    m.vllm_name = m.vllm_layer;
    return;
  }
  if (m.role == ModuleRole::kParameter) {
    m.vllm_name = vllm_tensor_name(row, m.tensor);
    m.vllm_layer = m.vllm_name;
    return;
  }
  m.vllm_name = vllm_module_name(row, m.module);
  m.vllm_layer = m.vllm_name;
  const auto f = shard_to_fused.find(last_component(m.vllm_name));
  if (f == shard_to_fused.end()) return;
  const std::string parent = module_of(m.module);
  for (const char* shard : f->second.spec->shards) {
    if (!weight_modules.contains(parent.empty() ? std::string(shard) : parent + "." + shard)) {
      return;
    }
  }
  m.vllm_layer = module_of(m.vllm_name);
  m.vllm_layer = (m.vllm_layer.empty() ? "" : m.vllm_layer + ".") + f->second.spec->fused;
  // A group vLLM does not list is tested under its fused name.
  if (!f->second.listed) m.vllm_name = m.vllm_layer;
}

// Stage 6, a stacked-experts tensor: its kind, dims and what the family
// says of its layout and of vLLM's loader.
StackedExperts stacked_experts_of(const std::string& tensor,
                                  const std::vector<std::uint64_t>& shape, const FamilyRow* row,
                                  const ModelDims& dims) {
  StackedExperts s;
  s.tensor = tensor;
  s.moe_layer = moe_layer_of(tensor);
  s.kind = stacked_kind(tensor);
  s.vllm_loads_stacked = row != nullptr && row->vllm_loads_stacked;
  s.vllm_loads_per_expert = row == nullptr || row->vllm_loads_per_expert;
  if (row != nullptr && row->stacked != StackedLayout::kNone) {
    s.interleave_known = true;
    s.interleaved = row->stacked == StackedLayout::kInOutInterleaved;
  }
  size_stacked(s, shape, dims);
  return s;
}

// Stage 7, the default action: Linear layers and experts are quantized
// unless vLLM builds them plain or they are part of a tower (kept unless
// quantize_vision); stacked experts are split and quantized unless vLLM
// reads only the stacked layout; everything else is kept.
void set_default_action(ModuleInfo& m, const RoleAnalysis& a, const RoleOptions& options,
                        const std::string& tower_root) {
  const bool tower = m.component == Component::kVision || m.component == Component::kAudio ||
                     m.component == Component::kProjector;
  switch (m.role) {
    case ModuleRole::kLinear:
    case ModuleRole::kExpert:
      m.action = m.build == VllmBuild::kPlain || (tower && !options.quantize_vision)
                     ? DefaultAction::kKeep
                     : DefaultAction::kQuantize;
      break;
    case ModuleRole::kStackedExperts:
      // Read only stacked by vLLM: kept whole. Otherwise the planner splits
      // them into per-expert weights (schemes.md 8), quantized like
      // experts.
      m.action = a.stacked[*m.stacked].vllm_loads_stacked ? DefaultAction::kKeep
                                                          : DefaultAction::kQuantize;
      break;
    default:
      m.action = DefaultAction::kKeep;
      break;
  }
  if (tower && m.action == DefaultAction::kKeep &&
      (m.role == ModuleRole::kLinear || m.role == ModuleRole::kExpert)) {
    m.reason += fmt::format(
        "; part of the {} '{}', kept in 16 bits by default "
        "(--quantize-vision quantizes it)",
        component_name(m.component), tower_root);
  }
}

// Stage 8, once every tensor has a role: the orientation of square stacked
// tensors, from the layer's other stacked tensor, else from the family's
// layout.
void orient_square_stacked(std::vector<StackedExperts>& stacked, const FamilyRow* row) {
  for (StackedExperts& s : stacked) {
    if (s.orientation != StackedExperts::Orientation::kUnknown || !s.problem.empty()) continue;
    for (const StackedExperts& t : stacked) {
      if (&t == &s || t.moe_layer != s.moe_layer || t.proof != StackedExperts::Proof::kShape) {
        continue;
      }
      s.orientation = t.orientation;
      s.proof = StackedExperts::Proof::kSibling;
      break;
    }
    if (s.orientation == StackedExperts::Orientation::kUnknown && row != nullptr &&
        row->stacked != StackedLayout::kNone) {
      s.orientation = row->stacked == StackedLayout::kOutInHalves
                          ? StackedExperts::Orientation::kOutIn
                          : StackedExperts::Orientation::kInOut;
      s.proof = StackedExperts::Proof::kFamily;
    }
  }
}

// Stage 9, the reason of each stacked-experts module: its dims, orientation
// and what happens to it.
void describe_stacked(RoleAnalysis& a) {
  for (ModuleInfo& m : a.modules) {
    if (!m.stacked) continue;
    const StackedExperts& s = a.stacked[*m.stacked];
    m.reason = fmt::format("stacked experts {}: E={}, I={}, H={}, orientation {} ({}){}{}",
                           s.kind == StackedExperts::Kind::kGateUp ? "gate_up_proj"
                           : s.kind == StackedExperts::Kind::kDown ? "down_proj"
                                                                   : "(unknown projection)",
                           s.experts, s.intermediate, s.hidden, orientation_name(s.orientation),
                           proof_name(s.proof),
                           s.interleave_known ? (s.interleaved ? ", gate/up interleaved" : "")
                                              : ", interleaving unknown",
                           s.problem.empty() ? std::string() : "; " + s.problem);
    if (s.vllm_loads_stacked) {
      m.reason +=
          "; vLLM's loader reads only the stacked layout, so it is kept in 16 bits and "
          "its MoE layer named in ignore";
    } else {
      m.reason +=
          "; vLLM loads per-expert experts.{e}.gate_proj/up_proj/down_proj tensors, so "
          "the planner splits it";
    }
  }
}

}  // namespace

RoleAnalysis analyze_roles(const Checkpoint& checkpoint, const RoleOptions& options) {
  check_tie_flag(checkpoint.config);
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> tensors;
  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) {
    const auto& entries = checkpoint.shards[s].header().tensors;
    for (std::size_t e = 0; e < entries.size(); ++e) {
      tensors.emplace_back(entries[e].name, entries[e].shape);
    }
  }
  return analyze_roles(checkpoint.config, tensors, options);
}

RoleAnalysis analyze_roles(const std::optional<json>& config, const TensorList& tensors,
                           const RoleOptions& options) {
  RoleAnalysis a = identify_model(config);
  read_layer_offset(a, config);
  const FamilyRow* row = a.family;
  const std::vector<CompiledRule> rules = compile_rules(row);
  const FusedByShard shard_to_fused = fused_by_shard(row, config);
  const std::set<std::string> weight_modules = weight_modules_of(tensors);

  for (const auto& [name, shape] : tensors) {
    poll_cancel();  // a signal stops the roles of a huge checkpoint (util/cancel.hpp)
    const bool stacked_tensor = is_3d_expert_tensor(name, shape);
    if (shape.size() != 2 && !stacked_tensor) continue;
    if (name.find(':') != std::string::npos) continue;  // torchao layout, refused by the plan
    const bool is_weight = name.ends_with(".weight");
    ModuleInfo m;
    m.tensor = name;
    m.shape = shape;
    m.module = is_weight ? module_of(name) : name;
    const ComponentAt at = component_of(m.module, a.dims, row);
    m.component = at.component;
    RoleDecision decision =
        decide_role(rules, a.dims, m.module, name, shape, is_weight, stacked_tensor);
    m.role = decision.role;
    m.build = decision.build;
    m.reason = std::move(decision.reason);
    m.entry = decision.entry;
    m.rule = decision.rule;
    m.source = row != nullptr ? family_source(*row) : std::string();
    set_vllm_names(m, row, shard_to_fused, weight_modules);
    if (a.vllm_layer_offset) {
      m.vllm_name = after_target(m.vllm_name, *a.vllm_layer_offset);
      m.vllm_layer = after_target(m.vllm_layer, *a.vllm_layer_offset);
    }
    m.hf_name = hf_module_name(row, m.module);
    if (m.role == ModuleRole::kStackedExperts) {
      m.stacked = a.stacked.size();
      a.stacked.push_back(stacked_experts_of(name, shape, row, a.dims));
    }
    set_default_action(m, a, options, at.root);
    a.index.emplace(m.module, a.modules.size());
    a.modules.push_back(std::move(m));
  }
  orient_square_stacked(a.stacked, row);
  describe_stacked(a);
  return a;
}

}  // namespace ctquant
