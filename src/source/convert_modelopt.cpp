// NVIDIA ModelOpt NVFP4 checkpoints into compressed-tensors
// nvfp4-pack-quantized (W4A4): the registry row of compressed-tensors 0.18's
// ModelOptNvfp4Converter
// (src/compressed_tensors/entrypoints/convert/converters/modelopt_nvfp4.py),
// the rules of docs/converters.md "ModelOpt NVFP4 -> nvfp4-pack-quantized".
//
// Per module X (ModelOpt unified HF export): X.weight U8 [out, in/2] becomes
// X.weight_packed (bytes unchanged), X.weight_scale F8_E4M3 [out, in/16] is
// kept, X.weight_scale_2 and X.input_scale F32 [] become
// X.weight_global_scale and X.input_global_scale = 1/x (F32), and with an
// FP8 kv cache X.k_scale / X.v_scale (k_proj, v_proj) are cast to BF16.
// The input scales were calibrated by ModelOpt, which is what makes the
// written W4A4 config loadable: ctquant never writes static activation
// scales of its own.
#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/format/minifloat.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/source/converter.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

using nlohmann::json;

namespace {

// An exclude_modules entry as a compressed-tensors ignore entry. ModelOpt
// writes dot-boundary prefix wildcards (quant_utils.py
// _prefix_wildcard_summarize_exclude_modules) and matches them with
// fnmatch (its tests: tests/gpu/torch/export/test_export.py is_excluded,
// tests/unit/torch/export/test_get_quantization.py; Model-Optimizer
// a2fbac7b): '*' any text, '?' one character, '[...]' a class ('[!...]'
// negated), the whole name. A name without those stays as it is; a
// pattern becomes `re:` + the pattern with the rest escaped, anchored at
// the end ('$', re.match anchors the start): "model.layers.0.self_attn*"
// -> "re:model\.layers\.0\.self_attn.*".
std::string fnmatch_entry(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return pattern;
  std::string re;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '*') {
      re += ".*";
    } else if (c == '?') {
      re += '.';
    } else if (c == '[') {
      // fnmatch.translate: a ']' right after '[' or '[!' is a member.
      std::size_t j = i + 1;
      const bool negated = j < pattern.size() && pattern[j] == '!';
      if (negated) ++j;
      const std::size_t close = pattern.find(']', j + 1);
      if (close == std::string::npos) {
        re += "\\[";
        continue;
      }
      std::string set = negated ? "[^" : "[";
      for (; j < close; ++j) {
        if (pattern[j] == '\\' || pattern[j] == '[' || pattern[j] == '^') set += '\\';
        set += pattern[j];
      }
      re += set + "]";
      i = close;
    } else {
      re += regex_escape(std::string(1, c));
    }
  }
  if (!re.ends_with(".*")) re += '$';
  return "re:" + re;
}

enum ModelOptOp : int {
  kReciprocal = kFirstConverterOp,  // F32 1 / x (weight_scale_2, input_scale)
  kCastBf16,                        // F32 -> BF16, round to nearest even (k_scale, v_scale)
};

// The targets the library's examples give (qwen3_nvfp4_example.py), used
// for the families that hold NVFP4 modules.
constexpr const char* kMlpTarget = "re:.*mlp.*\\.(gate_up|gate|up|down)_proj$";
constexpr const char* kAttentionTarget = "re:.*self_attn.*\\.(q|k|v|o)_proj$";

json nvfp4_args(bool weights) {
  return {
      {"actorder", nullptr},
      {"block_structure", nullptr},
      {"dynamic", weights ? json(false) : json("local")},
      {"group_size", 16},
      {"num_bits", 4},
      {"observer", weights ? "memoryless_minmax" : "static_minmax"},
      {"observer_kwargs", json::object()},
      {"scale_dtype", "torch.float8_e4m3fn"},
      {"strategy", "tensor_group"},
      {"symmetric", true},
      {"type", "float"},
      {"zp_dtype", nullptr},
  };
}

[[noreturn]] void refuse(const std::string& where, const std::string& why) {
  throw unsupported_input(
      fmt::format("{}: {} (ctquant converts ModelOpt NVFP4 checkpoints, quant_algo \"NVFP4\", as "
                  "compressed-tensors' ModelOptNvfp4Converter does); nothing was written",
                  where, why));
}

// The NVFP4 modules of the checkpoint: a U8 .weight beside a .weight_scale_2.
std::vector<std::string> nvfp4_modules(const Checkpoint& c) {
  std::vector<std::string> out;
  for (const SafetensorsFile& shard : c.shards) {
    for (const TensorEntry& t : shard.header().tensors) {
      if (!t.name.ends_with(".weight") || t.dtype != DType::kU8) continue;
      const std::string m = module_of(t.name);
      if (c.find(m + ".weight_scale_2") != nullptr) out.push_back(m);
    }
  }
  return out;
}

std::optional<SourceFormat> detect_modelopt(const Checkpoint& checkpoint,
                                            const ConvertOptions& options) {
  const std::optional<json> hf = read_side_json(checkpoint, "hf_quant_config.json");
  json qc = nullptr;
  if (checkpoint.config && checkpoint.config->is_object()) {
    const auto it = checkpoint.config->find("quantization_config");
    if (it != checkpoint.config->end() && it->is_object() &&
        it->value("quant_method", json(nullptr)) == json("modelopt")) {
      qc = *it;
    }
  }
  json q = nullptr;  // the block holding quant_algo
  std::string where;
  if (hf && hf->is_object() && hf->contains("quantization") && (*hf)["quantization"].is_object()) {
    q = (*hf)["quantization"];
    where = "hf_quant_config.json: quantization";
  } else if (qc.is_object()) {
    q = qc;
    where = "config.json: quantization_config";
  } else {
    return std::nullopt;
  }
  const json algo = q.value("quant_algo", json(nullptr));
  const std::string a = algo.is_string() ? algo.get<std::string>() : algo.dump();
  if (a != "NVFP4") {
    std::string why = fmt::format("quant_algo \"{}\" is not converted", a);
    if (a == "FP8") {
      why +=
          ": ModelOpt FP8 (per-tensor F8_E4M3 weights with static input scales) has no "
          "converter in compressed-tensors 0.18";
    } else if (a == "MIXED_PRECISION") {
      why +=
          ": per-layer algorithms (quantized_layers) mix NVFP4 with other formats, which "
          "the NVFP4 converter would either refuse or copy as unquantized weights";
    } else if (a == "W4A16_NVFP4") {
      why +=
          ": weight-only NVFP4 has no input_scale, which the NVFP4 W4A4 config needs "
          "(ModelOptNvfp4Converter fails on the missing dependency)";
    }
    refuse(where + ".quant_algo", why);
  }
  const json group = q.value("group_size", json(16));
  if (group != json(16))
    refuse(where + ".group_size", "NVFP4 groups are 16 elements, not " + group.dump());
  const json kv = q.value("kv_cache_quant_algo", json(nullptr));
  if (!kv.is_null() && kv != json("FP8")) {
    refuse(where + ".kv_cache_quant_algo",
           fmt::format("kv cache {} is not converted (FP8 or none)", kv.dump()));
  }
  const char* const exclude_key = q.contains("exclude_modules") ? "exclude_modules" : "ignore";
  json exclude = q.value("exclude_modules", q.value("ignore", json::array()));
  if (exclude.is_null()) exclude = json::array();
  if (!exclude.is_array()) {
    refuse(where + "." + exclude_key, "not a list of module names (" + exclude.dump() + ")");
  }
  for (const json& e : exclude) {
    if (!e.is_string()) {
      refuse(where + "." + exclude_key,
             "an entry is not a module name or fnmatch pattern: " + e.dump());
    }
  }

  SourceFormat f;
  f.description = fmt::format("ModelOpt NVFP4 (W4A4){}", kv.is_null() ? "" : ", FP8 kv cache");
  if (options.targets) {
    f.targets = *options.targets;
  } else {
    const std::vector<std::string> modules = nvfp4_modules(checkpoint);
    const ModuleMatcher mlp({kMlpTarget}, ModuleMatcher::Role::kTargets);
    const ModuleMatcher attn({kAttentionTarget}, ModuleMatcher::Role::kTargets);
    bool any_mlp = false, any_attn = false;
    std::vector<std::string> other;
    for (const std::string& m : modules) {
      const bool in_mlp = mlp.first_match(m).has_value();
      const bool in_attn = attn.first_match(m).has_value();
      any_mlp |= in_mlp;
      any_attn |= in_attn;
      if (!in_mlp && !in_attn) other.push_back(m);
    }
    if (!other.empty()) {
      refuse(fmt::format("module(s) {}", join(other, 4)),
             "NVFP4 modules outside the MLP and attention projections: ctquant derives the "
             "converter's targets from those two families only");
    }
    if (any_mlp) f.targets.emplace_back(kMlpTarget);
    if (any_attn) f.targets.emplace_back(kAttentionTarget);
  }
  if (options.ignore) {
    f.ignore = *options.ignore;
  } else {
    // exclude_modules: exact names as they are, and fnmatch patterns
    // ("model.layers.0.self_attn*", ModelOpt's dot-boundary prefix
    // wildcards) as anchored `re:` entries (fnmatch_entry).
    for (const json& e : exclude) {
      if (e.is_string()) f.ignore.push_back(fnmatch_entry(e.get<std::string>()));
    }
  }
  f.group = {
      {"format", "nvfp4-pack-quantized"}, {"input_activations", nvfp4_args(false)},
      {"output_activations", nullptr},    {"targets", f.targets},
      {"weights", nvfp4_args(true)},
  };
  f.kv_cache_scheme = nullptr;
  if (!kv.is_null()) {
    f.kv_cache_scheme = {
        {"actorder", nullptr},
        {"block_structure", nullptr},
        {"dynamic", false},
        {"group_size", nullptr},
        {"num_bits", 8},
        {"observer", "memoryless_minmax"},
        {"observer_kwargs", json::object()},
        {"scale_dtype", nullptr},
        {"strategy", "tensor"},
        {"symmetric", true},
        {"type", "float"},
        {"zp_dtype", nullptr},
    };
  }
  f.params = {{"kv_cache", !kv.is_null()}};
  return f;
}

std::string describe(const Checkpoint& c, const TensorLocation& at) {
  const TensorEntry& t = c.entry(at);
  return fmt::format("{}: tensor '{}' ({} {})", c.shards[at.shard].label(), t.name,
                     dtype_tag(t.dtype), shape_string(t.shape));
}

bool is_scale_param(const std::string& p) {
  return p == "input_scale" || p == "weight_scale" || p == "weight_scale_2" || p == "k_scale" ||
         p == "v_scale";
}

std::vector<ConvertedModule> plan_modelopt(const Checkpoint& c, const SourceFormat& f,
                                           std::vector<std::string>& problems) {
  const ModuleMatcher ignore(f.ignore, ModuleMatcher::Role::kIgnore);
  const ModuleMatcher targets(f.targets, ModuleMatcher::Role::kTargets);
  const bool kv = f.params["kv_cache"].get<bool>();
  std::vector<ConvertedModule> modules;
  std::set<std::string> handled;  // every tensor a module consumes
  for (std::size_t s = 0; s < c.shards.size(); ++s) {
    const auto& tensors = c.shards[s].header().tensors;
    for (std::size_t e = 0; e < tensors.size(); ++e) {
      const TensorEntry& t = tensors[e];
      if (!t.name.ends_with(".weight")) continue;
      const std::string module = module_of(t.name);
      if (module.ends_with("norm") || ignore.first_match(module) || !targets.first_match(module)) {
        continue;
      }
      const TensorLocation at{s, e};
      if (t.dtype != DType::kU8 || t.shape.size() != 2) {
        problems.push_back(fmt::format(
            "{}: module '{}' is in the converter's targets but its weight is not ModelOpt "
            "NVFP4 codes (U8 [out, in/2]); narrow the targets",
            describe(c, at), module));
        continue;
      }
      std::vector<std::string> deps{"weight_scale", "weight_scale_2", "input_scale"};
      if (kv && module.ends_with("k_proj")) deps.emplace_back("k_scale");
      if (kv && module.ends_with("v_proj")) deps.emplace_back("v_scale");
      ConvertedModule m;
      m.name = module;
      m.primary = at;
      m.params = t.shape[0] * t.shape[1] * 2;
      m.consumed = {at};
      bool ok = true;
      for (const std::string& d : deps) {
        const auto it = c.tensors.find(module + "." + d);
        if (it == c.tensors.end()) {
          problems.push_back(fmt::format(
              "{}: Dependency weight {}.{} not found in weight map: a ModelOpt NVFP4 module "
              "has weight, weight_scale, weight_scale_2 and input_scale",
              describe(c, at), module, d));
          ok = false;
          continue;
        }
        const TensorEntry& dt = c.entry(it->second);
        const bool good =
            d == "weight_scale"
                ? dt.dtype == DType::kF8_E4M3 &&
                      dt.shape == std::vector<std::uint64_t>{t.shape[0], t.shape[1] / 8} &&
                      t.shape[1] % 8 == 0
                : dt.dtype == DType::kF32 && dt.numel() == 1;
        if (!good) {
          problems.push_back(fmt::format(
              "{}: expected {}", describe(c, it->second),
              d == "weight_scale" ? fmt::format("F8_E4M3 [{}, {}] (one scale per 16 inputs)",
                                                t.shape[0], t.shape[1] / 8)
                                  : std::string("one F32 value")));
          ok = false;
        }
        m.consumed.push_back(it->second);
      }
      if (!ok) continue;
      const auto add = [&](const std::string& name, TensorLocation from, DType dtype, int op) {
        ConvertedTensor o;
        const TensorEntry& in = c.entry(from);
        o.name = name;
        o.dtype = dtype;
        o.shape = in.shape;
        o.byte_size = in.numel() * static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
        o.op = op;
        o.inputs = {from};
        m.outputs.push_back(std::move(o));
      };
      add(module + ".weight_packed", at, DType::kU8, kRenameOp);
      add(module + ".weight_scale", m.consumed[1], DType::kF8_E4M3, kRenameOp);
      add(module + ".weight_global_scale", m.consumed[2], DType::kF32, kReciprocal);
      add(module + ".input_global_scale", m.consumed[3], DType::kF32, kReciprocal);
      for (std::size_t k = 4; k < m.consumed.size(); ++k) {
        add(c.entry(m.consumed[k]).name, m.consumed[k], DType::kBF16, kCastBf16);
      }
      for (const TensorLocation& l : m.consumed) handled.insert(c.entry(l).name);
      modules.push_back(std::move(m));
    }
  }
  // validate(): a scale no module consumed, of a module not ignored.
  for (std::size_t s = 0; s < c.shards.size(); ++s) {
    const auto& tensors = c.shards[s].header().tensors;
    for (std::size_t e = 0; e < tensors.size(); ++e) {
      const TensorEntry& t = tensors[e];
      if (!is_scale_param(last_component(t.name)) || handled.contains(t.name)) continue;
      if (ignore.first_match(module_of(t.name))) continue;
      problems.push_back(
          fmt::format("{}: Hit unexpected non-targeted tensor {}: a ModelOpt scale of a module the "
                      "converter does not convert (not NVFP4, or not in its targets{})",
                      describe(c, TensorLocation{s, e}), t.name,
                      kv ? "" : "; kv-cache scales need kv_cache_quant_algo \"FP8\""));
    }
  }
  return modules;
}

void produce_modelopt(const ConvertedTensor& t, std::span<const std::span<const std::byte>> inputs,
                      std::span<std::byte> out) {
  const std::byte* in = inputs[0].data();
  const std::size_t n = inputs[0].size() / 4;
  for (std::size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, in + 4 * i, 4);
    if (t.op == kReciprocal) {
      const float r = 1.0f / x;  // torch's F32 reciprocal: IEEE division
      std::memcpy(out.data() + 4 * i, &r, 4);
    } else if (t.op == kCastBf16) {
      const std::uint16_t b = float_to_bf16(x);
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else {
      throw std::logic_error("ModelOpt converter: unknown operation");
    }
  }
}

// e2m1 * weight_scale * weight_scale_2, as ModelOpt dequantizes
// (NVFP4QTensor.dequantize), into F32 [out, in]; consumed = {weight,
// weight_scale, weight_scale_2, input_scale, ...}.
bool dequantize_modelopt(const Checkpoint& c, const ConvertedModule& m,
                         std::span<const std::vector<std::byte>> inputs, std::vector<float>& out,
                         std::uint64_t& rows, std::uint64_t& cols) {
  const TensorEntry& w = c.entry(m.consumed[0]);
  rows = w.shape[0];
  cols = w.shape[1] * 2;
  float s2;
  std::memcpy(&s2, inputs[2].data(), 4);
  out.assign(rows * cols, 0.0f);
  const std::uint64_t groups = cols / 16;
  for (std::uint64_t r = 0; r < rows; ++r) {
    for (std::uint64_t j = 0; j < cols; ++j) {
      const auto byte = static_cast<std::uint8_t>(inputs[0][r * w.shape[1] + j / 2]);
      const auto code = static_cast<std::uint8_t>(j % 2 == 0 ? byte & 15 : byte >> 4);
      const float s = f8_e4m3_to_float(static_cast<std::uint8_t>(inputs[1][r * groups + j / 16]));
      out[r * cols + j] = e2m1_to_float(code) * s * s2;
    }
  }
  return true;
}

}  // namespace

extern const SourceConverter kModelOptNvfp4Converter;
const SourceConverter kModelOptNvfp4Converter{
    .name = "ModelOpt NVFP4",
    .source = "compressed-tensors 0.18 entrypoints/convert/converters/modelopt_nvfp4.py",
    .detect = detect_modelopt,
    .plan = plan_modelopt,
    .produce = produce_modelopt,
    .dequantize_source = dequantize_modelopt,
    .lossless = true,
};

}  // namespace ctquant
