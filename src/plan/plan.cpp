#include "ctquant/plan/plan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "ctquant/util/checked.hpp"
#include "ctquant/format/config.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/plan/matcher.hpp"
#include "ctquant/format/safetensors_writer.hpp"

namespace ctquant {

using nlohmann::json;

const char* fate_name(Fate fate) {
  switch (fate) {
    case Fate::kQuantize:
      return "quantize";
    case Fate::kCopy:
      return "copy";
    case Fate::kDequantize:
      return "dequantize";
    case Fate::kDrop:
      return "drop";
  }
  return "?";
}

std::string module_of(const std::string& tensor_name) {
  const auto dot = tensor_name.rfind('.');
  return dot == std::string::npos ? std::string() : tensor_name.substr(0, dot);
}

namespace {

std::string param_of(const std::string& tensor_name) {
  const auto dot = tensor_name.rfind('.');
  return dot == std::string::npos ? tensor_name : tensor_name.substr(dot + 1);
}

// Section 2, rule 6: the last component contains "embed", or is wte / wpe.
bool is_embedding(const std::string& module) {
  const auto dot = module.rfind('.');
  const std::string last = dot == std::string::npos ? module : module.substr(dot + 1);
  return last.find("embed") != std::string::npos || last == "wte" || last == "wpe";
}

void check_scheme(const QuantScheme& scheme) {
  if (scheme.num_bits < 2 || scheme.num_bits > 8) {
    throw usage_error(
        fmt::format("scheme {}: num_bits {} is outside 2..8", scheme.name, scheme.num_bits));
  }
}

// Output tensors of a quantized module, section 4 of the format spec.
// T is the weight's dtype, BF16 for a dequantized FP8 weight.
void add_quantized_outputs(const TensorDecision& d, const TensorEntry& w, DType t,
                           const QuantScheme& scheme, std::size_t decision_index,
                           std::vector<PlannedTensor>& out) {
  const std::uint64_t rows = w.shape[0];
  const std::uint64_t cols = w.shape[1];
  const std::uint64_t n_groups = cols / scheme.effective_group_size(cols);
  const std::uint64_t words = packed_words_per_row(cols, scheme.num_bits);
  const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(t) / 8);
  // Every size below is bounded by the weight's byte size (a few bytes per
  // element at most), which parse_header bounded by the file size; the
  // products are still checked so that no future scheme can wrap them.
  const auto bytes_of = [&](std::uint64_t a, std::uint64_t b, std::uint64_t c) {
    std::uint64_t ab = 0;
    std::uint64_t abc = 0;
    if (!checked_mul(a, b, ab) || !checked_mul(ab, c, abc)) {
      throw bad_input(fmt::format("tensor '{}' {}: output size overflows 64 bits", w.name,
                                  shape_string(w.shape)));
    }
    return abc;
  };
  const auto add = [&](const std::string& suffix, DType dtype, std::vector<std::uint64_t> shape,
                       std::uint64_t bytes, OutputRole role) {
    out.push_back(PlannedTensor{d.module + "." + suffix, dtype, std::move(shape), bytes, 0, role,
                                decision_index});
  };
  add("weight_packed", DType::kI32, {rows, words}, bytes_of(rows, words, 4), OutputRole::kPacked);
  add("weight_scale", t, {rows, n_groups}, bytes_of(rows, n_groups, esize), OutputRole::kScale);
  add("weight_shape", DType::kI64, {2}, 16, OutputRole::kShape);
  if (!scheme.symmetric) {
    const std::uint64_t zp_rows = packed_words_per_row(rows, scheme.num_bits);
    add("weight_zero_point", DType::kI32, {zp_rows, n_groups}, bytes_of(zp_rows, n_groups, 4),
        OutputRole::kZeroPoint);
  }
}

// Section 2, rules 1-6, applied in order; the first that fails decides.
class Section2Rules {
 public:
  Section2Rules(const PlanOptions& options, QuantizePlan& plan)
      : options_(options),
        ignore_(options.ignore, ModuleMatcher::Role::kIgnore),
        targets_(options.targets, ModuleMatcher::Role::kTargets),
        plan_(plan) {
    plan_.ignore_matches.resize(options.ignore.size());
    plan_.target_matches.resize(options.targets.size());
  }

  // Sets d.fate (kCopy or kQuantize), d.rule and d.ignore_entry. dtype stands
  // for the tensor's dtype: BF16 for an FP8 weight, which is judged as the
  // weight it dequantizes to. dtype_text describes the stored dtype.
  void decide(TensorDecision& d, const TensorEntry& t, DType dtype, const std::string& dtype_text,
              const std::string& file) {
    d.fate = Fate::kCopy;
    if (param_of(t.name) != "weight" || d.module.empty()) {
      d.rule = "not a .weight tensor";
    } else if (t.shape.size() != 2) {
      d.rule = fmt::format("{}-D, not a 2-D linear weight", t.shape.size());
    } else if (d.module.ends_with("norm")) {
      d.rule = "module ends with 'norm'";
    } else if (!is_quantizable_float(dtype)) {
      d.rule = fmt::format("dtype {} is not BF16, F16 or F32", dtype_text);
    } else if (is_embedding(d.module)) {
      d.rule = "embedding (target Linear never covers it)";
    } else if (t.shape[0] == 0 || t.shape[1] == 0) {
      d.rule = "empty tensor";
    } else {
      d.selectable = true;
      for (std::size_t i = 0; i < ignore_.entries().size(); ++i) {
        if (ignore_.entry_matches(i, d.module)) {
          plan_.ignore_matches[i].push_back(d.module);
          if (!d.ignore_entry) d.ignore_entry = i;
        }
      }
      std::optional<std::size_t> target;
      for (std::size_t i = 0; i < targets_.entries().size(); ++i) {
        if (targets_.entry_matches(i, d.module)) {
          plan_.target_matches[i].push_back(d.module);
          if (!target) target = i;
        }
      }
      if (d.ignore_entry) {
        d.rule = fmt::format("ignored by '{}'", options_.ignore[*d.ignore_entry]);
      } else if (!target) {
        d.rule = "matches no target";
      } else {
        const std::uint64_t g = options_.scheme.effective_group_size(t.shape[1]);
        if (t.shape[1] % g != 0) {
          const auto dot = d.module.rfind('.');
          group_size_names_.insert(dot == std::string::npos ? d.module : d.module.substr(dot + 1));
          if (dot == std::string::npos) group_size_top_level_ = true;
          group_size_errors_.push_back(
              fmt::format("{}: tensor '{}' {} has in_features {}, not a multiple of the group "
                          "size {}",
                          file, t.name, shape_string(t.shape), t.shape[1], g));
        }
        d.fate = Fate::kQuantize;
        d.rule = fmt::format("2-D {} .weight matching target '{}'", dtype_text,
                             options_.targets[*target]);
      }
    }
  }

  const std::vector<std::string>& group_size_errors() const { return group_size_errors_; }
  // The ignore entry that keeps every tensor of group_size_errors() in 16 bits.
  std::string group_size_fix() const {
    return last_component_entry(group_size_names_, group_size_top_level_);
  }

 private:
  const PlanOptions& options_;
  const ModuleMatcher ignore_;
  const ModuleMatcher targets_;
  QuantizePlan& plan_;
  std::vector<std::string> group_size_errors_;
  std::set<std::string> group_size_names_;  // last components of their modules
  bool group_size_top_level_ = false;
};

// The input's own ignore list (compressed-tensors), matched with the same
// semantics as --ignore (section 2). A pattern that does not compile is bad
// input here, not a usage error.
std::optional<ModuleMatcher> input_ignore_matcher(const InputQuantization& q) {
  if (q.ignore.empty()) return std::nullopt;
  try {
    return ModuleMatcher(q.ignore, ModuleMatcher::Role::kIgnore);
  } catch (const Error& e) {
    throw bad_input(fmt::format("{}: quantization_config.ignore: {}", kConfigFileName, e.what()));
  }
}

// Checks an F8 tensor against section 6 and returns its scale when it is an
// FP8 weight ctquant dequantizes; otherwise adds the reasons to problems.
std::optional<Fp8Source> fp8_weight_source(const Checkpoint& checkpoint, const InputQuantization& q,
                                           const std::optional<ModuleMatcher>& input_ignore,
                                           const TensorDecision& d, const TensorEntry& t,
                                           std::vector<std::string>& problems) {
  const std::size_t n_problems = problems.size();
  const auto problem = [&](const std::string& what) { problems.push_back(what); };
  const std::string dtype = std::string(dtype_tag(t.dtype));
  if (!is_dequantizable_fp8(t.dtype)) {
    problem(
        fmt::format("dtype {} is not dequantized (ctquant dequantizes F8_E4M3 and F8_E5M2 "
                    "weights), and a W4A16 checkpoint must not carry F8 tensors",
                    dtype));
    return std::nullopt;
  }
  if (param_of(t.name) != "weight" || d.module.empty()) {
    problem(
        fmt::format("{} tensor that is not a module's .weight: ctquant dequantizes FP8 weights "
                    "only, and a W4A16 checkpoint must not carry F8 tensors",
                    dtype));
    return std::nullopt;
  }
  if (!q.is_fp8()) {
    problem(
        fmt::format("{} weight, but {} has no FP8 quantization_config (quant_method \"fp8\" "
                    "with weight_block_size, or compressed-tensors \"float-quantized\") to "
                    "say how it is scaled",
                    dtype, kConfigFileName));
    return std::nullopt;
  }
  if (t.shape.size() == 3) {
    problem(
        fmt::format("3-D FP8 expert tensor {}: dequantizing stacked expert weights is not "
                    "supported yet",
                    shape_string(t.shape)));
  } else if (t.shape.size() != 2) {
    problem(fmt::format("{}-D FP8 weight {}, expected 2-D [out_features, in_features]",
                        t.shape.size(), shape_string(t.shape)));
  }
  if (input_ignore) {
    if (const auto entry = input_ignore->first_match(d.module)) {
      problem(
          fmt::format("{} quantization_config.ignore entry '{}' says module '{}' was never "
                      "quantized, but its weight is {}",
                      kConfigFileName, q.ignore[*entry], d.module, dtype));
    }
  }
  const std::string scale_name = d.module + "." + std::string(q.scale_param());
  const auto scale = checkpoint.tensors.find(scale_name);
  if (scale == checkpoint.tensors.end()) {
    const std::string other =
        q.kind == InputQuantKind::kBlockFp8 ? "weight_scale" : "weight_scale_inv";
    const bool has_other = checkpoint.tensors.contains(d.module + "." + other);
    problem(fmt::format(
        "FP8 weight {} {} has no scale '{}' ({}){}", dtype, shape_string(t.shape), scale_name,
        q.describe(),
        has_other ? fmt::format("; found '{}.{}', which this kind does not use", d.module, other)
                  : ""));
  }
  if (problems.size() != n_problems) return std::nullopt;

  const TensorEntry& s = checkpoint.entry(scale->second);
  try {
    return Fp8Source{scale->second, fp8_scale_layout(q, t.shape[0], t.shape[1], s.dtype, s.shape)};
  } catch (const Error& e) {
    problem(fmt::format("its scale '{}' ({} {}, in {}): {}", scale_name, dtype_tag(s.dtype),
                        shape_string(s.shape), checkpoint.shards[scale->second.shard].label(),
                        e.what()));
    return std::nullopt;
  }
}

}  // namespace

IgnoreList effective_ignore(const RoleAnalysis& roles, const PlanOptions& options) {
  IgnoreList list;
  if (options.default_ignore) {
    for (DefaultIgnoreEntry& d : default_ignore_entries(roles)) {
      list.entries.push_back(std::move(d.entry));
      list.reasons.push_back(std::move(d.reason));
      list.keeps.push_back(std::move(d.modules));
    }
  }
  list.n_default = list.entries.size();
  for (const std::string& e : options.ignore) {
    if (std::find(list.entries.begin(), list.entries.end(), e) != list.entries.end()) continue;
    list.entries.push_back(e);
    list.reasons.push_back("--ignore");
    list.keeps.emplace_back();
  }
  return list;
}

void check_plan_options(const PlanOptions& options) {
  check_scheme(options.scheme);
  std::string problems;
  for (const auto& [entries, role] : {std::pair{&options.ignore, ModuleMatcher::Role::kIgnore},
                                      std::pair{&options.targets, ModuleMatcher::Role::kTargets}}) {
    try {
      const ModuleMatcher matcher(*entries, role);
    } catch (const Error& e) {
      problems += (problems.empty() ? "" : "\n") + std::string(e.what());
    }
  }
  if (!problems.empty()) throw usage_error(problems);
}

QuantizePlan make_plan(const Checkpoint& checkpoint, const PlanOptions& given) {
  check_plan_options(given);
  QuantizePlan plan;
  plan.roles = analyze_roles(checkpoint, RoleOptions{.quantize_vision = given.quantize_vision});
  plan.options = given;
  IgnoreList ignore = effective_ignore(plan.roles, given);
  plan.options.ignore = std::move(ignore.entries);
  plan.ignore_reasons = std::move(ignore.reasons);
  plan.ignore_keeps = std::move(ignore.keeps);
  plan.n_default_ignore = ignore.n_default;
  const PlanOptions& options = plan.options;
  Section2Rules rules(options, plan);
  plan.input_quantization = classify_input_quantization(checkpoint.config);
  const InputQuantization& q = plan.input_quantization;
  const std::optional<ModuleMatcher> input_ignore = input_ignore_matcher(q);
  std::vector<std::string> problems;  // every input problem of this phase, reported at once
  std::size_t n_bad_tensors = 0;

  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) {
    const std::string& file = checkpoint.shards[s].label();
    const auto& tensors = checkpoint.shards[s].header().tensors;
    std::vector<std::string> colon_names;  // tensors of this shard with ':' in their names
    for (std::size_t e = 0; e < tensors.size(); ++e) {
      const TensorEntry& t = tensors[e];
      TensorDecision d;
      d.name = t.name;
      d.module = module_of(t.name);
      d.source = TensorLocation{s, e};
      d.fate = Fate::kCopy;
      const std::string param = param_of(t.name);
      std::vector<std::string> found;
      if (!checkpoint.holds(d.source)) {
        d.fate = Fate::kDrop;
        d.rule = fmt::format("not listed in {} (not written)", kIndexFileName);
        ++plan.n_unindexed;
      } else if (t.name.find(':') != std::string::npos) {
        d.rule = "unknown layout (':' in the name)";
        colon_names.push_back(t.name);
      } else if (q.is_fp8() && !d.module.empty() && param == q.scale_param()) {
        const TensorEntry* w = checkpoint.find(d.module + ".weight");
        if (w != nullptr && is_fp8(w->dtype)) {
          d.fate = Fate::kDrop;
          d.rule = fmt::format("scale of FP8 weight '{}.weight' (consumed by its dequantization)",
                               d.module);
        } else if (w == nullptr) {
          found.push_back(
              fmt::format("{} without its weight: the checkpoint has no tensor "
                          "'{}.weight'",
                          param, d.module));
        } else {
          found.push_back(
              fmt::format("{} beside a {} weight '{}.weight'; in a {} checkpoint only "
                          "F8 weights have one",
                          param, dtype_tag(w->dtype), d.module, q.describe()));
        }
      } else if (q.is_fp8() && !d.module.empty() && is_activation_param(param)) {
        d.fate = Fate::kDrop;
        d.rule = fmt::format(
            "activation or KV-cache parameter '{}' of an FP8 input (dropped: the "
            "output quantizes weights only)",
            param);
      } else if (is_fp8(t.dtype)) {
        d.fp8 = fp8_weight_source(checkpoint, q, input_ignore, d, t, found);
        if (d.fp8) {
          rules.decide(d, t, DType::kBF16,
                       fmt::format("{} (dequantized to BF16)", dtype_tag(t.dtype)), file);
          if (d.fate == Fate::kCopy) {
            d.fate = Fate::kDequantize;
            d.rule += "; written as a BF16 .weight";
          }
        }
      } else {
        rules.decide(d, t, t.dtype, std::string(dtype_tag(t.dtype)), file);
      }
      for (const std::string& f : found) {
        problems.push_back(fmt::format("{}: tensor '{}': {}", file, t.name, f));
      }
      if (!found.empty()) ++n_bad_tensors;
      plan.decisions.push_back(std::move(d));
    }
    if (!colon_names.empty()) {
      // torchao writes tensor subclasses as '<param>:<component>' keys
      // described in __metadata__: copying them would drop that metadata
      // (and could carry F8 codes into a W4A16 checkpoint), and reading them
      // needs torchao's own rules. ctquant refuses the format.
      constexpr std::size_t kNamesShown = 8;
      std::string names;
      for (std::size_t i = 0; i < colon_names.size() && i < kNamesShown; ++i) {
        names += fmt::format("{}'{}'", i == 0 ? "" : ", ", colon_names[i]);
      }
      if (colon_names.size() > kNamesShown) {
        names += fmt::format(" and {} more", colon_names.size() - kNamesShown);
      }
      problems.insert(
          problems.begin(),
          fmt::format("{}: {} {}: a name with a ':' component is torchao's tensor-subclass "
                      "layout ('<param>:<component>', described in __metadata__), not a module "
                      "parameter; ctquant does not convert this format (load the model with "
                      "torchao and save plain BF16 weights first)",
                      file, colon_names.size() == 1 ? "tensor" : "tensors", names));
      n_bad_tensors += colon_names.size();
    }
  }
  const auto& group_size_errors = rules.group_size_errors();
  if (!problems.empty() || !group_size_errors.empty()) {
    std::string message;
    for (const auto& m : problems) message += m + "\n";
    for (const auto& m : group_size_errors) message += m + "\n";
    if (!problems.empty()) {
      message += fmt::format("{} tensor(s) cannot be converted", n_bad_tensors);
      if (!group_size_errors.empty()) message += "; ";
    }
    if (!group_size_errors.empty()) {
      message += fmt::format(
          "{} tensor(s) cannot be quantized with group size {}: keep them in 16 bits (--ignore "
          "'{}') or pick another --group-size",
          group_size_errors.size(), options.scheme.group_size, rules.group_size_fix());
    }
    throw bad_input(message);
  }

  // The executor holds whole rows of a weight in memory (at least one per
  // thread): bound them, so that a header cannot make it allocate without
  // limit (a sparse file can claim any size).
  // FP8 rows are held as BF16 once loaded (section 6).
  std::vector<std::string> row_errors;
  for (const TensorDecision& d : plan.decisions) {
    if (d.fate != Fate::kQuantize && d.fate != Fate::kDequantize) continue;
    const TensorEntry& t = checkpoint.entry(d.source);
    const std::uint64_t element_bytes =
        d.fp8 ? 2u : static_cast<std::uint64_t>(dtype_bits(t.dtype) / 8);
    std::uint64_t row_bytes = 0;
    if (!checked_mul(t.shape[1], element_bytes, row_bytes) || row_bytes > kMaxWeightRowBytes) {
      row_errors.push_back(fmt::format(
          "{}: tensor '{}' {} has rows of {} bytes, more than the limit of {} bytes per row of a "
          "weight to quantize or dequantize; ignore it (--ignore) to copy it unchanged",
          checkpoint.shards[d.source.shard].label(), t.name, shape_string(t.shape), row_bytes,
          kMaxWeightRowBytes));
    }
  }
  if (!row_errors.empty()) {
    std::string message = row_errors.front();
    for (std::size_t i = 1; i < row_errors.size(); ++i) message += "\n" + row_errors[i];
    throw bad_input(message);
  }

  // Output tensors, shard by shard.
  json weight_map = json::object();
  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) {
    ShardPlan shard;
    shard.file_name = checkpoint.shards[s].label();
    shard.input_shard = s;
    for (std::size_t i = 0; i < plan.decisions.size(); ++i) {
      const TensorDecision& d = plan.decisions[i];
      if (d.source.shard != s) continue;
      const TensorEntry& t = checkpoint.entry(d.source);
      switch (d.fate) {
        case Fate::kQuantize:
          add_quantized_outputs(d, t, d.fp8 ? DType::kBF16 : t.dtype, options.scheme, i,
                                shard.tensors);
          ++plan.n_quantized;
          break;
        case Fate::kDequantize: {
          std::uint64_t bytes = 0;
          if (!checked_mul(t.numel(), 2, bytes)) throw bad_input("output size overflows 64 bits");
          shard.tensors.push_back(
              PlannedTensor{t.name, DType::kBF16, t.shape, bytes, 0, OutputRole::kDequantized, i});
          ++plan.n_dequantized;
          break;
        }
        case Fate::kDrop:
          if (checkpoint.holds(d.source)) ++plan.n_dropped;
          break;
        case Fate::kCopy:
          shard.tensors.push_back(
              PlannedTensor{t.name, t.dtype, t.shape, t.byte_size(), 0, OutputRole::kCopy, i});
          ++plan.n_copied;
          break;
      }
    }
    std::sort(shard.tensors.begin(), shard.tensors.end(),
              [](const PlannedTensor& a, const PlannedTensor& b) { return a.name < b.name; });
    for (std::size_t i = 1; i < shard.tensors.size(); ++i) {
      if (shard.tensors[i].name == shard.tensors[i - 1].name) {
        throw bad_input(
            fmt::format("{}: output tensor '{}' would be written twice (the input "
                        "already holds a tensor of that name)",
                        shard.file_name, shard.tensors[i].name));
      }
    }
    std::vector<TensorSpec> specs;
    specs.reserve(shard.tensors.size());
    for (const PlannedTensor& t : shard.tensors) {
      specs.push_back(TensorSpec{t.name, t.dtype, t.shape, t.byte_size});
      weight_map[t.name] = shard.file_name;
      if (!checked_add(plan.tensor_bytes_out, t.byte_size, plan.tensor_bytes_out)) {
        throw bad_input("output size overflows 64 bits");
      }
    }
    ShardLayout layout = layout_shard(specs, {{"format", "pt"}});
    if (layout.data_start - 8 > kMaxHeaderBytes) {
      throw bad_input(
          fmt::format("{}: the output header would be {} bytes, more than the limit of "
                      "{} that readers accept (section 1 of the format spec)",
                      shard.file_name, layout.data_start - 8, kMaxHeaderBytes));
    }
    for (std::size_t i = 0; i < shard.tensors.size(); ++i)
      shard.tensors[i].offset = layout.offsets[i];
    shard.header = std::move(layout.header);
    shard.data_start = layout.data_start;
    shard.file_size = layout.file_size;
    if (!checked_add(plan.shard_bytes_out, shard.file_size, plan.shard_bytes_out)) {
      throw bad_input("output size overflows 64 bits");
    }
    plan.shards.push_back(std::move(shard));
  }

  if (checkpoint.has_index) {
    plan.index =
        json{{"metadata", {{"total_size", plan.tensor_bytes_out}}}, {"weight_map", weight_map}};
  }
  plan.config = output_config(checkpoint.config,
                              quantization_config(options.scheme, options.ignore, options.targets));
  plan.copied_files = checkpoint.other_files;
  return plan;
}

}  // namespace ctquant
