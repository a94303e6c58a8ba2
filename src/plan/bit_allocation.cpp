#include "ctquant/plan/bit_allocation.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "ctquant/model/roles.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant {

namespace {

constexpr std::uint64_t kSmallerGroups[] = {64, 32};

std::string group_list(const PlanOptions& options) {
  std::vector<std::string> names;
  for (const SchemeGroup& g : options.groups) names.push_back(g.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// The option named `name` unless the ladder has it already.
std::string unique_name(const BitLadder& ladder, std::string name) {
  const auto taken = [&](const std::string& n) {
    return std::any_of(ladder.options.begin(), ladder.options.end(),
                       [&](const SchemeGroup& g) { return g.name == n; });
  };
  const std::string base = name;
  for (int k = 2; taken(name); ++k) name = fmt::format("{}_{}", base, k);
  return name;
}

}  // namespace

BitLadder bit_ladder(const PlanOptions& options, std::string_view option) {
  if (options.groups.size() != 1) {
    throw usage_error(fmt::format(
        "{} starts from one scheme group and splits it; the options give {} ({}) from "
        "--scheme-for, --quantization-config or a recipe: give one --scheme (and --group-size) "
        "instead",
        option, options.groups.size(), group_list(options)));
  }
  const SchemeGroup& given = options.groups.front();
  const Preset* w8 = find_preset("W8A16");
  const SchemeFamily* family = given.family();
  const SchemeFamily* w8_family = family_for(w8->weights, false);
  if (family == nullptr || family != w8_family || !given.input_activations.is_null() ||
      given.weights.type != QuantArgs::Type::kInt) {
    throw usage_error(fmt::format(
        "{}: scheme {} cannot mix: {} raises modules to W8A16 or to a smaller group size of "
        "the same integer weight-only scheme, all written in the {} format; {} is written as "
        "{}, and a checkpoint that mixes it with W8A16 would hold two formats "
        "(mixed-precision), which ctquant does not write; use --scheme W4A16 or W4A16_ASYM",
        option, given.name, option, w8_family->format, given.name,
        family != nullptr ? std::string(family->format) : std::string("an unknown format")));
  }
  BitLadder ladder;
  ladder.options.push_back(given);
  const bool grouped = given.weights.strategy == QuantArgs::Strategy::kGroup;
  if (grouped) {
    for (const std::uint64_t size : kSmallerGroups) {
      if (size >= given.weights.group_size) continue;
      SchemeGroup g = given;
      g.weights.group_size = size;
      g.name = unique_name(ladder, fmt::format("{}_g{}", given.name, size));
      if (family->supports(g.weights).empty()) ladder.options.push_back(std::move(g));
    }
  }
  if (given.weights.num_bits < w8->weights.num_bits) {
    SchemeGroup g = preset_group("W8A16");
    g.targets = given.targets;
    g.weights.observer = given.weights.observer;
    g.weights.observer_kwargs = given.weights.observer_kwargs;
    g.weights.strategy = given.weights.strategy;
    if (grouped) g.weights.group_size = given.weights.group_size;
    if (!grouped || g.weights.group_size != w8->weights.group_size) {
      g.name += grouped ? fmt::format("_g{}", g.weights.group_size)
                        : std::string("_") + strategy_name(g.weights.strategy);
    }
    g.name = unique_name(ladder, g.name);
    if (family->supports(g.weights).empty()) ladder.options.push_back(std::move(g));
  }
  if (ladder.options.size() == 1) {
    throw usage_error(fmt::format(
        "{}: scheme {} has nothing to raise modules to: it is already 8 bits, and a smaller "
        "group size (64, 32) is not below its own; use --scheme W4A16 or W4A16_ASYM",
        option, given.name));
  }
  return ladder;
}

std::uint64_t quantized_bytes(const SchemeFamily& family, const QuantArgs& args, DType weight_dtype,
                              std::uint64_t rows, std::uint64_t cols) {
  std::uint64_t bytes = 0;
  for (const OutputTensorSpec& s : family.outputs(args, weight_dtype, rows, cols)) {
    if (s.kind != OutputTensorSpec::Kind::kShape) bytes += s.byte_size();
  }
  return bytes;
}

bool use_more_bits(std::uint64_t layer, std::uint64_t n_layers) {
  // ggml src/llama-quant.cpp: i_layer < n_layers/8 || i_layer >= 7*n_layers/8 ||
  // (i_layer - n_layers/8) % 3 == 2, in int arithmetic; the first two
  // conditions are false here, so i_layer >= n_layers/8.
  const std::uint64_t eighth = n_layers / 8;
  if (layer >= n_layers) return false;
  return layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2;
}

std::vector<std::uint64_t> more_bits_layers(std::uint64_t n_layers) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t i = 0; i < n_layers; ++i) {
    if (use_more_bits(i, n_layers)) out.push_back(i);
  }
  return out;
}

std::optional<std::uint64_t> decoder_layer(std::string_view module) {
  constexpr std::string_view kLayers = "layers.";
  for (std::size_t at = module.find(kLayers); at != std::string_view::npos;
       at = module.find(kLayers, at + 1)) {
    if (at != 0 && module[at - 1] != '.') continue;
    const std::string_view rest = module.substr(at + kLayers.size());
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), n);
    if (ec != std::errc() || end == rest.data()) continue;
    if (end != rest.data() + rest.size() && *end != '.') continue;
    return n;
  }
  return std::nullopt;
}

namespace {

// The role of a planned module. A split expert projection has no role of
// its own: its stacked tensor's (the MoE layer's) is the one.
const ModuleInfo* role_of(const QuantizePlan& plan, const PlannedModule& m) {
  const ModuleInfo* info = plan.roles.find(m.name);
  if (info == nullptr && m.decision < plan.decisions.size()) {
    info = plan.roles.find(plan.decisions[m.decision].name);
  }
  return info;
}

}  // namespace

std::vector<std::vector<std::size_t>> scheme_units(const QuantizePlan& plan) {
  std::vector<std::vector<std::size_t>> units;
  std::map<std::string, std::size_t> by_layer;  // vLLM layer -> unit
  for (std::size_t mi = 0; mi < plan.modules.size(); ++mi) {
    const PlannedModule& m = plan.modules[mi];
    if (m.kind != PlannedModule::Kind::kQuantize) continue;
    const ModuleInfo* info = role_of(plan, m);
    const std::string layer =
        info != nullptr && !info->vllm_layer.empty() ? info->vllm_layer : m.name;
    const auto [it, fresh] = by_layer.try_emplace(layer, units.size());
    if (fresh) units.emplace_back();
    units[it->second].push_back(mi);
  }
  return units;
}

std::uint64_t BitAllocation::params() const {
  std::uint64_t n = 0;
  for (const ModuleBits& m : modules) n += m.params;
  return n;
}

std::uint64_t BitAllocation::bytes() const {
  std::uint64_t n = 0;
  for (const ModuleBits& m : modules) n += m.bytes[m.option];
  return n;
}

std::uint64_t BitAllocation::bytes_of(std::size_t option) const {
  std::uint64_t n = 0;
  for (const ModuleBits& m : modules) n += m.bytes[option];
  return n;
}

double BitAllocation::bits_per_weight() const {
  const std::uint64_t n = params();
  return n == 0 ? 0.0 : 8.0 * static_cast<double>(bytes()) / static_cast<double>(n);
}

std::size_t BitAllocation::modules_upgraded() const {
  return static_cast<std::size_t>(
      std::count_if(modules.begin(), modules.end(), [](const ModuleBits& m) { return m.option; }));
}

BitAllocation start_allocation(const QuantizePlan& plan, const BitLadder& ladder) {
  BitAllocation a;
  a.options = ladder.options;
  std::map<std::size_t, std::size_t> slot;  // plan module -> index into a.modules
  for (std::size_t mi = 0; mi < plan.modules.size(); ++mi) {
    const PlannedModule& m = plan.modules[mi];
    if (m.kind != PlannedModule::Kind::kQuantize) continue;
    if (plan.group_of(m).weights != ladder.options.front().weights) {
      throw usage_error(fmt::format("module '{}' is planned with group {}, not {}", m.name,
                                    plan.group_of(m).name, ladder.options.front().name));
    }
    slot[mi] = a.modules.size();
    ModuleBits& b = a.modules.emplace_back();
    b.module = mi;
    b.params = m.source.rows * m.source.cols;
    for (const SchemeGroup& g : ladder.options) {
      const SchemeFamily* family = g.family();
      const bool takes = family != nullptr && family->supports(g.weights).empty() &&
                         family->refuse(g.weights, m.source.rows, m.source.cols).empty();
      b.bytes.push_back(
          takes ? quantized_bytes(*family, g.weights, m.dtype, m.source.rows, m.source.cols) : 0);
    }
  }
  // A unit takes an option only when each of its modules does.
  for (const std::vector<std::size_t>& unit : scheme_units(plan)) {
    for (std::size_t k = 1; k < a.options.size(); ++k) {
      const bool all = std::all_of(unit.begin(), unit.end(), [&](std::size_t mi) {
        return a.modules[slot.at(mi)].bytes[k] > 0;
      });
      if (all) continue;
      for (const std::size_t mi : unit) a.modules[slot.at(mi)].bytes[k] = 0;
    }
  }
  return a;
}

namespace {

// rel^2 * params: the module's relative squared error weighted by its size.
double weighted_error(const QuantError& e, std::uint64_t params) {
  if (e.w2 == 0) return 0.0;
  return e.err2 / e.w2 * static_cast<double>(params);
}

// The bits per weight of `bytes` over `params`, computed as
// BitAllocation::bits_per_weight does, are at most target: a run asked for
// the figure it reports gets it.
bool within(std::uint64_t bytes, std::uint64_t params, double target) {
  return params == 0 || 8.0 * static_cast<double>(bytes) / static_cast<double>(params) <= target;
}

}  // namespace

void check_target_bits(const BitAllocation& a, double target_bits) {
  const double given_bits =
      a.params() == 0 ? 0.0
                      : 8.0 * static_cast<double>(a.bytes_of(0)) / static_cast<double>(a.params());
  if (!std::isfinite(target_bits) || target_bits > kMaxTargetBits) {
    throw usage_error(fmt::format(
        "--target-bits {}: bits per weight must be a number at most {} (16-bit weights)",
        target_bits, kMaxTargetBits));
  }
  if (!within(a.bytes_of(0), a.params(), target_bits)) {
    throw usage_error(fmt::format(
        "--target-bits {}: below the {:.4f} bits per weight of {} on this checkpoint's "
        "quantized modules (codes, scales and zero points), where the allocation starts; give at "
        "least that",
        target_bits, given_bits, a.options.front().name));
  }
}

void allocate_bits(BitAllocation& a, const QuantizePlan& plan, double target_bits) {
  check_target_bits(a, target_bits);
  a.rule = fmt::format("--target-bits {}", target_bits);
  a.target_bits = target_bits;
  std::map<std::size_t, std::size_t> slot;
  for (std::size_t i = 0; i < a.modules.size(); ++i) slot[a.modules[i].module] = i;
  const std::vector<std::vector<std::size_t>> units = scheme_units(plan);
  const std::size_t n_options = a.options.size();
  // Per unit and option: bytes (0: the unit cannot take it) and error.
  std::vector<std::vector<std::uint64_t>> bytes(units.size(),
                                                std::vector<std::uint64_t>(n_options, 0));
  std::vector<std::vector<double>> error(units.size(), std::vector<double>(n_options, 0.0));
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (std::size_t k = 0; k < n_options; ++k) {
      bool takes = true;
      for (const std::size_t mi : units[u]) {
        const ModuleBits& m = a.modules[slot.at(mi)];
        takes = takes && m.bytes[k] > 0 && k < m.errors.size();
        if (!takes) break;
        bytes[u][k] += m.bytes[k];
        error[u][k] += weighted_error(m.errors[k], m.params);
      }
      if (!takes) bytes[u][k] = 0;
    }
  }
  std::vector<std::size_t> at(units.size(), 0);
  std::uint64_t total = a.bytes_of(0);
  const std::uint64_t params = a.params();
  for (;;) {
    std::optional<std::pair<std::size_t, std::size_t>> best;
    double best_ratio = 0.0;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const std::size_t c = at[u];
      for (std::size_t k = 0; k < n_options; ++k) {
        if (bytes[u][k] <= bytes[u][c] || !(error[u][k] < error[u][c])) continue;
        const std::uint64_t extra = bytes[u][k] - bytes[u][c];
        if (!within(total + extra, params, target_bits)) continue;
        const double ratio = (error[u][c] - error[u][k]) / static_cast<double>(extra);
        const bool better =
            !best || ratio > best_ratio ||
            (ratio == best_ratio && best->first == u && bytes[u][k] < bytes[u][best->second]);
        if (better) {
          best = {u, k};
          best_ratio = ratio;
        }
      }
    }
    if (!best) break;
    const auto [u, k] = *best;
    total += bytes[u][k] - bytes[u][at[u]];
    at[u] = k;
  }
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (const std::size_t mi : units[u]) a.modules[slot.at(mi)].option = at[u];
  }
}

void allocate_more_bits(BitAllocation& a, const QuantizePlan& plan) {
  // The W8A16 option: an upgrade, never the given scheme itself.
  const auto w8 = std::find_if(a.options.begin() + 1, a.options.end(), [&](const SchemeGroup& g) {
    return g.weights.num_bits == 8 && g.weights.num_bits > a.options.front().weights.num_bits;
  });
  if (w8 == a.options.end()) {
    throw usage_error(
        fmt::format("--more-bits layers: scheme {} has no W8A16 above it to raise "
                    "down_proj to; use --scheme W4A16 or W4A16_ASYM",
                    a.options.front().name));
  }
  const std::size_t k = static_cast<std::size_t>(w8 - a.options.begin());
  std::uint64_t n_layers = plan.roles.dims.layers.value_or(0);
  std::vector<std::pair<std::size_t, std::uint64_t>> downs;  // slot, layer
  for (std::size_t i = 0; i < a.modules.size(); ++i) {
    const PlannedModule& m = plan.modules[a.modules[i].module];
    const ModuleInfo* info = role_of(plan, m);
    // The language model's decoder layers, or a draft's own (a DFlash
    // draft's layers.N, which vLLM builds as model.layers.N).
    if (info != nullptr && info->component != Component::kLanguage &&
        info->component != Component::kDraft) {
      continue;
    }
    const bool down =
        m.name.ends_with(".down_proj") ||
        (info != nullptr && info->role == ModuleRole::kExpert && m.name.ends_with(".w2"));
    const std::optional<std::uint64_t> layer = decoder_layer(m.name);
    if (!down || !layer) continue;
    downs.emplace_back(i, *layer);
    if (!plan.roles.dims.layers) n_layers = std::max(n_layers, *layer + 1);
  }
  if (downs.empty()) {
    throw usage_error(
        "--more-bits layers raises the down_proj of decoder layers (model.layers.N...down_proj "
        "or a draft's layers.N...down_proj, a MoE layer's experts' down_proj or w2), and this "
        "plan quantizes none");
  }
  a.rule = "--more-bits layers";
  a.n_layers = n_layers;
  a.layers = more_bits_layers(n_layers);
  std::map<std::size_t, std::size_t> slot;
  for (std::size_t i = 0; i < a.modules.size(); ++i) slot[a.modules[i].module] = i;
  std::set<std::size_t> raise;  // plan modules whose unit holds a chosen down_proj
  for (const auto& [i, layer] : downs) {
    if (use_more_bits(layer, n_layers)) raise.insert(a.modules[i].module);
  }
  for (const std::vector<std::size_t>& unit : scheme_units(plan)) {
    const bool chosen =
        std::any_of(unit.begin(), unit.end(), [&](std::size_t mi) { return raise.contains(mi); });
    // A unit the option refuses (its shape) keeps the given scheme.
    if (!chosen || a.modules[slot.at(unit.front())].bytes[k] == 0) continue;
    for (const std::size_t mi : unit) a.modules[slot.at(mi)].option = k;
  }
}

PlanOptions split_groups_by_bits(const PlanOptions& given, const QuantizePlan& plan,
                                 const BitAllocation& a) {
  if (a.modules_upgraded() == 0) return given;
  std::vector<std::vector<std::string>> names(a.options.size());
  for (const ModuleBits& m : a.modules) names[m.option].push_back(plan.modules[m.module].name);
  PlanOptions out = given;
  out.groups.clear();
  for (std::size_t k = 0; k < a.options.size(); ++k) {
    if (names[k].empty()) continue;
    SchemeGroup g = a.options[k];
    // Entries each engine finds under its own names (model/roles.hpp).
    g.targets = exact_target_entries(plan.roles, names[k]);
    out.groups.push_back(std::move(g));
  }
  return out;
}

}  // namespace ctquant
