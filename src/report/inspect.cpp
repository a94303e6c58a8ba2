#include "ctquant/report/inspect.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/format/config.hpp"
#include "ctquant/plan/output_files.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/report/roles_report.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::uint64_t file_bytes(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : size;
}

// "W4A16 (4-bit int, symmetric, group size 128; pack-quantized)".
std::string group_text(const SchemeGroup& g) {
  const QuantArgs& a = g.weights;
  std::string layout;
  switch (a.strategy) {
    case QuantArgs::Strategy::kChannel:
      layout = "channel-wise";
      break;
    case QuantArgs::Strategy::kTensor:
      layout = "per tensor";
      break;
    case QuantArgs::Strategy::kBlock:
      layout = fmt::format("blocks {}x{}", a.block[0], a.block[1]);
      break;
    case QuantArgs::Strategy::kGroup:
      layout = fmt::format("group size {}", a.group_size);
      break;
    case QuantArgs::Strategy::kTensorGroup:
      layout = fmt::format("group size {}, global scale", a.group_size);
      break;
  }
  const SchemeFamily* f = g.family();
  return fmt::format("{} ({}-bit {}, {}, {}{}; {})", g.name, a.num_bits,
                     a.type == QuantArgs::Type::kInt ? "int" : "float",
                     a.symmetric ? "symmetric" : "asymmetric", layout,
                     g.input_activations.is_null() ? "" : ", dynamic input activations",
                     f != nullptr ? f->format : "no format");
}

std::string quoted_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += (i > 0 ? ", '" : "'") + items[i] + "'";
  }
  return out + "]";
}

}  // namespace

Inventory make_inventory(const Checkpoint& checkpoint) {
  Inventory inv;
  inv.root = checkpoint.root.string();
  inv.has_index = checkpoint.has_index;
  inv.other_files = checkpoint.other_files;
  std::map<DType, DTypeTotal> totals;
  for (const SafetensorsFile& shard : checkpoint.shards) {
    inv.shards.push_back(
        InventoryShard{shard.label(), shard.header().tensors.size(), shard.file_size()});
    for (const TensorEntry& t : shard.header().tensors) {
      inv.tensors.push_back(
          InventoryTensor{t.name, t.dtype, t.shape, t.byte_size(), shard.label()});
      DTypeTotal& total = totals[t.dtype];
      total.dtype = t.dtype;
      ++total.tensors;
      total.elements += t.numel();
      total.bytes += t.byte_size();
      inv.elements += t.numel();
      inv.tensor_bytes += t.byte_size();
    }
  }
  std::sort(inv.tensors.begin(), inv.tensors.end(),
            [](const InventoryTensor& a, const InventoryTensor& b) { return a.name < b.name; });
  for (const auto& [dtype, total] : totals) inv.by_dtype.push_back(total);
  if (checkpoint.config) {
    const json& config = *checkpoint.config;
    const auto arch = config.find("architectures");
    if (arch != config.end() && arch->is_array()) {
      for (const auto& a : *arch) {
        if (a.is_string()) inv.architectures.push_back(a.get<std::string>());
      }
    }
    const auto type = config.find("model_type");
    if (type != config.end() && type->is_string()) inv.model_type = type->get<std::string>();
    const auto qc = config.find("quantization_config");
    if (qc != config.end()) inv.quantization_config = *qc;
  }
  return inv;
}

std::string render_inventory_text(const Inventory& inv) {
  std::string text =
      fmt::format("checkpoint: {} ({}{})\n", inv.root, plural(inv.shards.size(), "shard"),
                  inv.has_index ? ", with index" : "");
  std::string arch;
  for (const auto& a : inv.architectures) arch += (arch.empty() ? "" : ", ") + a;
  text +=
      fmt::format("architecture: {}{}\n", arch.empty() ? "(none in config.json)" : arch,
                  inv.model_type.empty() ? "" : fmt::format(" (model_type {})", inv.model_type));
  text += fmt::format("quantization_config: {}\n",
                      inv.quantization_config ? inv.quantization_config->dump() : "none");
  std::size_t name_w = 4;
  std::size_t shape_w = 5;
  for (const auto& t : inv.tensors) {
    name_w = std::max(name_w, t.name.size());
    shape_w = std::max(shape_w, shape_string(t.shape).size());
  }
  text += fmt::format("tensors ({}):\n", inv.tensors.size());
  text += fmt::format("  {:<{}}  {:<11}  {:<{}}  {:>13}  {}\n", "NAME", name_w, "DTYPE", "SHAPE",
                      shape_w, "BYTES", "SHARD");
  for (const auto& t : inv.tensors) {
    text +=
        fmt::format("  {:<{}}  {:<11}  {:<{}}  {:>13}  {}\n", t.name, name_w, dtype_tag(t.dtype),
                    shape_string(t.shape), shape_w, grouped_digits(t.bytes), t.shard);
  }
  text += "by dtype:\n";
  for (const auto& d : inv.by_dtype) {
    text += fmt::format("  {:<11}  {:>6} tensors  {:>16} elements  {:>11}\n", dtype_tag(d.dtype),
                        d.tensors, grouped_digits(d.elements), human_bytes(d.bytes));
  }
  text += fmt::format("total: {}, {} parameters (stored elements), {} ({} bytes)\n",
                      plural(inv.tensors.size(), "tensor"), grouped_digits(inv.elements),
                      human_bytes(inv.tensor_bytes), grouped_digits(inv.tensor_bytes));
  if (!inv.other_files.empty()) {
    std::string files;
    for (const auto& f : inv.other_files) files += (files.empty() ? "" : ", ") + f;
    text += fmt::format("other files: {}\n", files);
  }
  return text;
}

json inventory_json(const Inventory& inv) {
  json tensors = json::array();
  for (const auto& t : inv.tensors) {
    tensors.push_back(json{{"name", t.name},
                           {"dtype", dtype_tag(t.dtype)},
                           {"shape", t.shape},
                           {"bytes", t.bytes},
                           {"shard", t.shard}});
  }
  json by_dtype = json::object();
  for (const auto& d : inv.by_dtype) {
    by_dtype[std::string(dtype_tag(d.dtype))] =
        json{{"tensors", d.tensors}, {"elements", d.elements}, {"bytes", d.bytes}};
  }
  json shards = json::array();
  for (const auto& s : inv.shards) {
    shards.push_back(json{{"file", s.file}, {"tensors", s.tensors}, {"file_bytes", s.file_bytes}});
  }
  return json{
      {"root", inv.root},
      {"has_index", inv.has_index},
      {"shards", shards},
      {"architectures", inv.architectures},
      {"model_type", inv.model_type.empty() ? json(nullptr) : json(inv.model_type)},
      {"quantization_config", inv.quantization_config ? *inv.quantization_config : json(nullptr)},
      {"tensors", tensors},
      {"by_dtype", by_dtype},
      {"elements", inv.elements},
      {"tensor_bytes", inv.tensor_bytes},
      {"other_files", inv.other_files}};
}

std::vector<ManifestEntry> expected_output_files(const Checkpoint& checkpoint,
                                                 const QuantizePlan& plan) {
  std::vector<ManifestEntry> files;
  for (const PlannedFile& f : plan_output_files(checkpoint, plan)) {
    files.push_back({f.name, f.size, {}});
  }
  return files;
}

std::uint64_t expected_output_bytes(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  const std::vector<ManifestEntry> files = expected_output_files(checkpoint, plan);
  std::uint64_t total = 0;
  for (const ManifestEntry& f : files) total += f.size;
  return total + manifest_bytes(files);
}

namespace {

// Per fate name, the number of input tensors with that fate, in first-seen order.
std::vector<std::pair<std::string, std::size_t>> fate_counts(const QuantizePlan& plan) {
  std::vector<std::pair<std::string, std::size_t>> counts{{fate_name(Fate::kQuantize), 0}};
  for (const TensorDecision& d : plan.decisions) {
    const std::string name = fate_name(d.fate);
    auto it =
        std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == name; });
    if (it == counts.end()) {
      counts.emplace_back(name, 1);
    } else {
      ++it->second;
    }
  }
  return counts;
}

std::uint64_t input_bytes(const Checkpoint& checkpoint) {
  std::uint64_t total = checkpoint.total_file_bytes();
  if (checkpoint.has_index) total += file_bytes(checkpoint.root / kIndexFileName);
  if (checkpoint.config) total += file_bytes(checkpoint.root / kConfigFileName);
  return total;
}

// The modules of an amax set, as "parent.{a, b, c}" when they share a
// parent module (fused partners always do), else listed whole.
std::string amax_set_text(const QuantizePlan& plan, const std::vector<std::size_t>& set) {
  std::vector<std::string> names;
  for (const std::size_t mi : set) names.push_back(plan.modules[mi].name);
  const std::string common = module_of(names.front());
  const bool same_parent =
      !common.empty() && std::all_of(names.begin(), names.end(),
                                     [&](const auto& n) { return module_of(n) == common; });
  std::string list;
  for (const auto& n : names) {
    list += fmt::format("{}{}", list.empty() ? "" : ", ",
                        same_parent ? n.substr(common.size() + 1) : n);
  }
  return same_parent ? fmt::format("{}.{{{}}}", common, list) : list;
}

// Which modules share one max |w| (QuantizePlan::amax_sets): the NVFP4
// global scale of fused partners (docs/schemes.md section 7); nothing when
// no family of the plan needs the pre-pass.
std::string render_amax_sets_text(const QuantizePlan& plan) {
  if (plan.amax_sets.empty()) return {};
  std::size_t shared = 0;
  for (const auto& set : plan.amax_sets) shared += set.size() > 1 ? 1 : 0;
  std::string text = fmt::format(
      "scales from max |w| taken before quantizing (NVFP4 global scales, per-tensor FP8 "
      "scales): {} of fused partners that share one (docs/schemes.md section 7), {} with "
      "their own\n",
      plural(shared, "set"), plural(plan.amax_sets.size() - shared, "module"));
  for (const auto& set : plan.amax_sets) {
    if (set.size() > 1) text += fmt::format("  {}\n", amax_set_text(plan, set));
  }
  return text;
}

// The output tensors of each planned module, in shard order: one pass over
// the shards (a module's outputs are all in its shard).
std::vector<std::vector<const PlannedTensor*>> module_outputs(const QuantizePlan& plan) {
  std::vector<std::vector<const PlannedTensor*>> out(plan.modules.size());
  for (const ShardPlan& shard : plan.shards) {
    for (const PlannedTensor& t : shard.tensors) {
      if (t.source == PlannedTensor::Source::kModule && t.module < out.size()) {
        out[t.module].push_back(&t);
      }
    }
  }
  return out;
}

// The modules a converter rewrites (source/converter.hpp), one line each:
// "convert (AWQ)", the module and its output tensors.
std::string render_converted_text(const QuantizePlan& plan) {
  if (!plan.source_format) return {};
  const SourceFormat& f = *plan.source_format;
  std::string text = fmt::format(
      "input: {}: {} converted as compressed-tensors' converter does ({}), lossless (no "
      "requantization); converter targets {}, ignore {}{}\n",
      f.description, plural(plan.converted.size(), "module"), f.converter->source,
      quoted_list(f.targets), quoted_list(f.ignore),
      plan.options.scheme_given ? "" : "; 16-bit modules kept (no scheme given)");
  for (const ConvertedModule& m : plan.converted) {
    std::string outputs;
    for (const ConvertedTensor& t : m.outputs) {
      outputs += fmt::format("{}{} {} {}", outputs.empty() ? "" : ", ", last_component(t.name),
                             dtype_tag(t.dtype), shape_string(t.shape));
    }
    text += fmt::format("  convert ({})  {}: {}\n", f.converter->name, m.name, outputs);
  }
  return text;
}

}  // namespace

std::string render_plan_text(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  const PlanOptions& o = plan.options;
  std::string text;
  if (plan.source_format && !o.scheme_given) {
    // A converted input with no scheme for its 16-bit modules: the default
    // group is not written (config.json holds the converter's group and
    // ignore list, on the "input:" line below).
    text = fmt::format(
        "plan: convert the {} modules only; 16-bit modules kept (give --scheme to quantize "
        "them)\n",
        plan.source_format->converter->name);
  } else if (o.groups.size() == 1) {
    text = fmt::format("plan: {}, targets {}, ignore {}\n", group_text(o.groups[0]),
                       quoted_list(o.groups[0].targets), quoted_list(o.ignore));
  } else {
    text = fmt::format("plan: {} scheme groups, tried in this order; ignore {}\n", o.groups.size(),
                       quoted_list(o.ignore));
    for (std::size_t g = 0; g < o.groups.size(); ++g) {
      text +=
          fmt::format("  {}. {}, targets {}: {}\n", g + 1, group_text(o.groups[g]),
                      quoted_list(o.groups[g].targets), plural(plan.group_modules[g], "module"));
    }
  }
  text += render_converted_text(plan);
  std::string counts;
  for (const auto& [name, n] : fate_counts(plan)) {
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", n, name);
  }
  if (plan.rewrite) {
    text += fmt::format(
        "transform: {} ({} tensors rewritten before quantizing; config.json "
        "records it as ctquant_transform)\n",
        plan.rewrite->transform, plan.rewrite->tensors.size());
  }
  text += render_roles_text(checkpoint, plan);
  text += fmt::format("tensors ({}): {}\n", plan.decisions.size(), counts);
  std::size_t fate_w = 4;
  std::size_t name_w = 6;
  std::size_t shape_w = 5;
  for (const TensorDecision& d : plan.decisions) {
    poll_cancel();
    fate_w = std::max(fate_w, std::string(fate_name(d.fate)).size());
    name_w = std::max(name_w, d.name.size());
    shape_w = std::max(shape_w, shape_string(checkpoint.entry(d.source).shape).size());
  }
  text += fmt::format("  {:<{}}  {:<{}}  {:<11}  {:<{}}  {}\n", "FATE", fate_w, "TENSOR", name_w,
                      "DTYPE", "SHAPE", shape_w, "RULE");
  for (const TensorDecision& d : plan.decisions) {
    poll_cancel();
    const TensorEntry& t = checkpoint.entry(d.source);
    text += fmt::format("  {:<{}}  {:<{}}  {:<11}  {:<{}}  {}\n", fate_name(d.fate), fate_w, d.name,
                        name_w, dtype_tag(t.dtype), shape_string(t.shape), shape_w, d.rule);
    // --transform: how the tensor is rewritten before it is quantized or copied.
    if (const TensorRewrite* r = plan.rewrite ? plan.rewrite->find(d.name) : nullptr) {
      for (const std::string& what : r->what) {
        text += fmt::format("  {:<{}}  {:<{}}  {}\n", "", fate_w, "", name_w, what);
      }
    }
  }
  // Each written weight: its scheme (or 16-bit kind) and exact output bytes.
  if (!plan.modules.empty()) {
    text += fmt::format("modules written from weights ({}):\n", plan.modules.size());
    std::size_t module_w = 6;
    std::size_t module_shape_w = 0;
    const auto module_shape = [](const PlannedModule& m) {
      return fmt::format("[{}, {}]", m.source.rows, m.source.cols);
    };
    for (const PlannedModule& m : plan.modules) {
      module_w = std::max(module_w, m.name.size());
      module_shape_w = std::max(module_shape_w, module_shape(m).size());
    }
    const std::vector<std::vector<const PlannedTensor*>> outputs_of = module_outputs(plan);
    for (std::size_t mi = 0; mi < plan.modules.size(); ++mi) {
      poll_cancel();
      const PlannedModule& m = plan.modules[mi];
      std::uint64_t bytes = 0;
      std::string outputs;
      for (const PlannedTensor* output : outputs_of[mi]) {
        const PlannedTensor& t = *output;
        bytes += t.byte_size;
        outputs +=
            fmt::format("{}{} {} {}", outputs.empty() ? "" : ", ", t.name.substr(m.name.size() + 1),
                        dtype_tag(t.dtype), shape_string(t.shape));
      }
      const std::string what = m.kind == PlannedModule::Kind::kQuantize     ? plan.group_of(m).name
                               : m.kind == PlannedModule::Kind::kDequantize ? "BF16 (dequantized)"
                                                                            : "16-bit (kept)";
      text += fmt::format("  {:<{}}  {:<{}}  {}: {} ({} bytes)\n", m.name, module_w,
                          module_shape(m), module_shape_w, what, outputs, grouped_digits(bytes));
    }
  }
  text += render_amax_sets_text(plan);
  text += render_ignore_text(plan);
  text += "targets:\n";
  // Modules a target matches that the group quantizes (the others are
  // ignored, or taken by an earlier group).
  std::set<std::pair<std::size_t, std::string>> quantized;
  for (const PlannedModule& m : plan.modules) {
    if (m.kind == PlannedModule::Kind::kQuantize) quantized.emplace(m.group, m.name);
  }
  for (std::size_t g = 0; g < o.groups.size(); ++g) {
    const std::vector<std::string>& targets = o.groups[g].targets;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      const auto& modules = plan.target_matches[g][i];
      const std::size_t kept = static_cast<std::size_t>(
          std::count_if(modules.begin(), modules.end(), [&](const std::string& m) {
            return !quantized.contains({g, m});
          }));
      text +=
          fmt::format("  {}{}: {}{}\n", targets[i],
                      o.groups.size() == 1 ? "" : fmt::format(" (group '{}')", o.groups[g].name),
                      plural(modules.size(), "module"),
                      kept == 0 ? "" : fmt::format(", {} of them not quantized by it", kept));
      if (targets[i] != "Linear") {
        for (const auto& m : modules) text += fmt::format("    {}\n", m);
      }
    }
  }
  text += fmt::format("output: {}\n", plural(plan.shards.size(), "shard"));
  for (const ShardPlan& s : plan.shards) {
    text +=
        fmt::format("  {}  {}  {} ({} bytes)\n", s.file_name, plural(s.tensors.size(), "tensor"),
                    human_bytes(s.file_size), grouped_digits(s.file_size));
  }
  std::string files = std::string(kIndexFileName) + ", " + kConfigFileName;
  for (const auto& f : plan.copied_files) files += ", " + f;
  text += fmt::format("  {}\n", files);
  const std::uint64_t out = expected_output_bytes(checkpoint, plan);
  const std::uint64_t in = input_bytes(checkpoint);
  text += fmt::format("expected output size: {} ({} bytes); input {}{}\n", human_bytes(out),
                      grouped_digits(out), human_bytes(in),
                      out == 0 ? std::string()
                               : fmt::format(", ratio {:.2f}x",
                                             static_cast<double>(in) / static_cast<double>(out)));
  return text;
}

json plan_json(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  const PlanOptions& o = plan.options;
  json tensors = json::array();
  for (const TensorDecision& d : plan.decisions) {
    poll_cancel();
    const TensorEntry& t = checkpoint.entry(d.source);
    tensors.push_back(
        json{{"name", d.name},
             {"module", d.module},
             {"dtype", dtype_tag(t.dtype)},
             {"shape", t.shape},
             {"bytes", t.byte_size()},
             {"shard", checkpoint.shards[d.source.shard].label()},
             {"fate", fate_name(d.fate)},
             {"rule", d.rule},
             {"ignore_entry", d.ignore_entry ? json(o.ignore[*d.ignore_entry]) : json(nullptr)}});
  }
  json counts = json::object();
  for (const auto& [name, n] : fate_counts(plan)) counts[name] = n;
  const json ignore = ignore_json(plan);
  json groups = json::array();
  for (std::size_t g = 0; g < o.groups.size(); ++g) {
    const SchemeGroup& group = o.groups[g];
    json targets = json::array();
    for (std::size_t i = 0; i < group.targets.size(); ++i) {
      targets.push_back(json{{"entry", group.targets[i]}, {"modules", plan.target_matches[g][i]}});
    }
    const SchemeFamily* f = group.family();
    groups.push_back(json{{"name", group.name},
                          {"format", f != nullptr ? json(std::string(f->format)) : json(nullptr)},
                          {"weights", quant_args_json(group.weights)},
                          {"input_activations", group.input_activations},
                          {"targets", targets},
                          {"modules", plan.group_modules[g]}});
  }
  json modules = json::array();
  const std::vector<std::vector<const PlannedTensor*>> outputs_of = module_outputs(plan);
  for (std::size_t mi = 0; mi < plan.modules.size(); ++mi) {
    poll_cancel();
    const PlannedModule& m = plan.modules[mi];
    json outs = json::array();
    for (const PlannedTensor* output : outputs_of[mi]) {
      const PlannedTensor& t = *output;
      outs.push_back(json{{"name", t.name},
                          {"dtype", dtype_tag(t.dtype)},
                          {"shape", t.shape},
                          {"bytes", t.byte_size}});
    }
    modules.push_back(
        json{{"module", m.name},
             {"tensor", plan.decisions[m.decision].name},
             {"shape", {m.source.rows, m.source.cols}},
             {"kind", m.kind == PlannedModule::Kind::kQuantize     ? "quantize"
                      : m.kind == PlannedModule::Kind::kDequantize ? "dequantize"
                                                                   : "keep"},
             {"group", m.kind == PlannedModule::Kind::kQuantize ? json(plan.group_of(m).name)
                                                                : json(nullptr)},
             {"rule", m.rule},
             {"shard", plan.shards[m.shard].file_name},
             {"outputs", outs}});
  }
  json outputs = json::array();
  for (const ShardPlan& s : plan.shards) {
    json shard_tensors = json::array();
    for (const PlannedTensor& t : s.tensors) {
      shard_tensors.push_back(json{{"name", t.name},
                                   {"dtype", dtype_tag(t.dtype)},
                                   {"shape", t.shape},
                                   {"bytes", t.byte_size}});
    }
    outputs.push_back(
        json{{"file", s.file_name}, {"bytes", s.file_size}, {"tensors", shard_tensors}});
  }
  // The modules that share one max |w| (the NVFP4 global scale of fused
  // partners), one list per set; modules alone in their set included.
  json amax_sets = json::array();
  for (const auto& set : plan.amax_sets) {
    json names = json::array();
    for (const std::size_t mi : set) names.push_back(plan.modules[mi].name);
    amax_sets.push_back(std::move(names));
  }
  return json{{"groups", groups},
              {"tensors", tensors},
              {"modules", modules},
              {"amax_sets", amax_sets},
              {"counts", counts},
              {"ignore", ignore},
              {"outputs", outputs},
              {"copied_files", plan.copied_files},
              {"roles", roles_json(checkpoint, plan)},
              {"expected_output_bytes", expected_output_bytes(checkpoint, plan)},
              {"input_bytes", input_bytes(checkpoint)}};
}

InspectReport inspect_checkpoint(const fs::path& input, const InspectOptions& options) {
  // Read-only: links out of the directory (a cache snapshot) are followed.
  InspectReport report{open_checkpoint(input, OpenOptions{.follow_links_outside = true}),
                       {},
                       std::nullopt,
                       {},
                       std::nullopt};
  report.inventory = make_inventory(report.checkpoint);
  if (options.plan) {
    try {
      report.plan = make_plan(report.checkpoint, options.plan_options);
    } catch (const Error& e) {
      // The inventory is still worth showing; usage errors are not reports.
      if (e.kind() != ErrorKind::kBadInput) throw;
      report.plan_error = e.what();
      return report;
    }
    report.findings = run_lint(report.checkpoint, *report.plan, options.lint);
  }
  return report;
}

std::string render_inspect_text(const InspectReport& report) {
  std::string text = render_inventory_text(report.inventory);
  if (report.plan) {
    text += '\n';
    text += render_plan_text(report.checkpoint, *report.plan);
    text += '\n';
    text += render_findings_text(report.findings);
  }
  if (report.plan_error) text += fmt::format("\nplan: cannot be made: {}\n", *report.plan_error);
  return text;
}

json inspect_json(const InspectReport& report) {
  return json{{"inventory", inventory_json(report.inventory)},
              {"plan", report.plan ? plan_json(report.checkpoint, *report.plan) : json(nullptr)},
              {"lint", report.plan ? findings_json(report.findings) : json(nullptr)},
              {"plan_error", report.plan_error ? json(*report.plan_error) : json(nullptr)}};
}

}  // namespace ctquant
