#include "ctquant/scheme/registry.hpp"

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>

#include "ctquant/scheme/observer.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

using nlohmann::json;

// The rows, each defined in its own file under src/scheme/.
extern const SchemeFamily kMxfp4Family;           // mxfp4.cpp
extern const SchemeFamily kMxfp8Family;           // mxfp8.cpp
extern const SchemeFamily kNvfp4Family;           // nvfp4.cpp
extern const SchemeFamily kIntPackedFamily;       // int_packed.cpp
extern const SchemeFamily kIntQuantizedFamily;    // int8.cpp
extern const SchemeFamily kFloatQuantizedFamily;  // fp8.cpp
extern const SchemeFamily kNaiveQuantizedFamily;  // fp8.cpp

namespace {

// compressed-tensors' format priority (`compressors/format.py`,
// COMPRESSION_FORMAT_PRIORITY; schemes.md 1.1): mxfp4-pack-quantized,
// mxfp8-quantized, nvfp4-pack-quantized, int-quantized, pack-quantized,
// float-quantized, naive-quantized.
constexpr std::array kFamilies = {
    &kMxfp4Family,
    &kMxfp8Family,
    &kNvfp4Family,
    &kIntQuantizedFamily,
    &kIntPackedFamily,
    &kFloatQuantizedFamily,
    &kNaiveQuantizedFamily,
};

}  // namespace

std::uint64_t QuantArgs::scale_cols(std::uint64_t n_cols) const {
  switch (strategy) {
    case Strategy::kGroup:
    case Strategy::kTensorGroup:
      return group_size;
    case Strategy::kBlock:
      return block[1];
    case Strategy::kTensor:
    case Strategy::kChannel:
      return n_cols;
  }
  return n_cols;
}

std::uint64_t QuantArgs::scale_rows(std::uint64_t n_rows) const {
  switch (strategy) {
    case Strategy::kBlock:
      return block[0];
    case Strategy::kTensor:
      return n_rows;
    default:
      return 1;
  }
}

const char* strategy_name(QuantArgs::Strategy strategy) {
  switch (strategy) {
    case QuantArgs::Strategy::kTensor:
      return "tensor";
    case QuantArgs::Strategy::kChannel:
      return "channel";
    case QuantArgs::Strategy::kGroup:
      return "group";
    case QuantArgs::Strategy::kBlock:
      return "block";
    case QuantArgs::Strategy::kTensorGroup:
      return "tensor_group";
  }
  return "?";
}

std::uint64_t OutputTensorSpec::byte_size() const {
  std::uint64_t n = 1;
  for (const std::uint64_t d : shape) n *= d;
  return n * static_cast<std::uint64_t>(dtype_bits(dtype)) / 8;
}

std::span<const SchemeFamily* const> scheme_families() { return kFamilies; }

const SchemeFamily* family_for(const QuantArgs& args, bool has_input_activations) {
  for (const SchemeFamily* f : kFamilies) {
    if (f->writes(args, has_input_activations)) return f;
  }
  return nullptr;
}

const SchemeFamily* family_by_format(std::string_view format) {
  for (const SchemeFamily* f : kFamilies) {
    if (f->format == format) return f;
  }
  return nullptr;
}

const Preset* find_preset(std::string_view name) {
  const std::string key = upper(name);
  for (const SchemeFamily* f : kFamilies) {
    for (const Preset& p : f->presets) {
      if (p.name == key) return &p;
    }
  }
  return nullptr;
}

std::string preset_names() {
  std::string out;
  for (const SchemeFamily* f : kFamilies) {
    for (const Preset& p : f->presets) {
      if (!p.refused.empty()) continue;
      if (!out.empty()) out += ", ";
      out += p.name;
    }
  }
  return out;
}

namespace {

// torch dtype names as compressed-tensors serialises scale_dtype / zp_dtype.
struct TorchDType {
  DType dtype;
  std::string_view name;
};
constexpr std::array<TorchDType, 5> kTorchDTypes = {{
    {DType::kF8_E4M3, "torch.float8_e4m3fn"},
    {DType::kU8, "torch.uint8"},
    {DType::kI8, "torch.int8"},
    {DType::kBF16, "torch.bfloat16"},
    {DType::kF16, "torch.float16"},
}};

json torch_dtype_json(std::optional<DType> dtype) {
  if (!dtype) return nullptr;
  for (const TorchDType& t : kTorchDTypes) {
    if (t.dtype == *dtype) return std::string(t.name);
  }
  return std::string(dtype_tag(*dtype));
}

}  // namespace

json quant_args_json(const QuantArgs& args) {
  using S = QuantArgs::Strategy;
  const bool grouped = args.strategy == S::kGroup || args.strategy == S::kTensorGroup;
  return json{
      {"actorder", nullptr},
      {"block_structure",
       args.strategy == S::kBlock ? json::array({args.block[0], args.block[1]}) : json(nullptr)},
      {"dynamic", false},
      {"group_size", grouped ? json(args.group_size) : json(nullptr)},
      {"num_bits", args.num_bits},
      {"observer", args.observer},
      {"observer_kwargs", args.observer_kwargs},
      {"scale_dtype", torch_dtype_json(args.scale_dtype)},
      {"strategy", strategy_name(args.strategy)},
      {"symmetric", args.symmetric},
      {"type", args.type == QuantArgs::Type::kInt ? "int" : "float"},
      // compressed-tensors writes zp_dtype only for asymmetric args (schemes.md 9.2).
      {"zp_dtype", args.symmetric ? json(nullptr)
                                  : torch_dtype_json(args.type == QuantArgs::Type::kInt
                                                         ? std::optional(DType::kI8)
                                                         : args.scale_dtype)},
  };
}

namespace {
// A JSON whole number greater than zero: signed or unsigned, as JSON files and
// YAML recipes give them.
bool is_positive_whole(const json& v) {
  return v.is_number_integer() && v.get<std::int64_t>() > 0;
}
}  // namespace

QuantArgs quant_args_from_json(const json& weights, const std::string& where) {
  const auto fail = [&](const std::string& what) {
    return usage_error(fmt::format("{}: {}", where, what));
  };
  if (!weights.is_object()) throw fail("weights must be an object of QuantizationArgs");
  static constexpr std::array<std::string_view, 12> kKnown = {
      "actorder",  "block_structure", "dynamic", "group_size", "num_bits", "observer",
      "observer_kwargs", "scale_dtype", "strategy", "symmetric", "type", "zp_dtype"};
  for (const auto& [key, value] : weights.items()) {
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end()) {
      throw fail(fmt::format("unknown field '{}' (QuantizationArgs fields: {})", key,
                             fmt::join(kKnown, ", ")));
    }
  }
  QuantArgs args;
  const auto get = [&](const char* key) -> const json* {
    const auto it = weights.find(key);
    return it == weights.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* v = get("type")) {
    if (*v == "int") {
      args.type = QuantArgs::Type::kInt;
    } else if (*v == "float") {
      args.type = QuantArgs::Type::kFloat;
    } else {
      throw fail(fmt::format("type {} is not \"int\" or \"float\"", v->dump()));
    }
  }
  if (const json* v = get("num_bits")) {
    if (!is_positive_whole(*v) || v->get<std::int64_t>() > 8) {
      throw fail(fmt::format("num_bits {} is not a whole number from 1 to 8", v->dump()));
    }
    args.num_bits = v->get<int>();
  } else {
    args.num_bits = 8;  // compressed-tensors' default
  }
  if (const json* v = get("symmetric")) {
    if (!v->is_boolean()) throw fail(fmt::format("symmetric {} is not true or false", v->dump()));
    args.symmetric = v->get<bool>();
  }
  if (const json* v = get("dynamic")) {
    if (*v != false) {
      throw fail(fmt::format(
          "dynamic {}: weights are quantized once, here (\"dynamic\": false)", v->dump()));
    }
  }
  if (const json* v = get("actorder")) {
    throw fail(fmt::format(
        "actorder {}: activation ordering needs calibration (GPTQ); data-free RTN writes "
        "\"actorder\": null",
        v->dump()));
  }
  std::optional<std::uint64_t> group_size;
  if (const json* v = get("group_size")) {
    if (v->is_number_integer() && v->get<std::int64_t>() == -1) {
      group_size.reset();  // compressed-tensors: -1 means channel-wise
    } else if (!is_positive_whole(*v)) {
      throw fail(fmt::format("group_size {} is not a positive whole number", v->dump()));
    } else {
      group_size = v->get<std::uint64_t>();
    }
  }
  const json* strategy = get("strategy");
  const std::string s = strategy != nullptr && strategy->is_string() ? strategy->get<std::string>()
                        : group_size                                  ? "group"
                                                                      : "tensor";
  if (strategy != nullptr && !strategy->is_string()) {
    throw fail(fmt::format("strategy {} is not a string", strategy->dump()));
  }
  if (s == "group" || s == "tensor_group") {
    args.strategy = s == "group" ? QuantArgs::Strategy::kGroup : QuantArgs::Strategy::kTensorGroup;
    if (!group_size) {
      throw fail(fmt::format("strategy \"{}\" needs a positive group_size", s));
    }
    args.group_size = *group_size;
  } else if (s == "channel" || s == "tensor") {
    if (group_size) {
      throw fail(fmt::format("group_size {} requires strategy \"group\" (strategy is \"{}\")",
                             *group_size, s));
    }
    args.strategy = s == "channel" ? QuantArgs::Strategy::kChannel : QuantArgs::Strategy::kTensor;
    args.group_size = 0;
  } else if (s == "block") {
    if (group_size) {
      throw fail(fmt::format("group_size {} requires strategy \"group\" (strategy is \"block\")",
                             *group_size));
    }
    args.strategy = QuantArgs::Strategy::kBlock;
    args.group_size = 0;
    const json* b = get("block_structure");
    if (b == nullptr || !b->is_array() || b->size() != 2 || !is_positive_whole((*b)[0]) ||
        !is_positive_whole((*b)[1])) {
      throw fail("strategy \"block\" needs block_structure [rows, cols] of positive numbers");
    }
    args.block = {(*b)[0].get<std::uint64_t>(), (*b)[1].get<std::uint64_t>()};
  } else {
    throw fail(fmt::format(
        "strategy \"{}\" cannot be applied to weights data-free (tensor, channel, group, "
        "tensor_group or block)",
        s));
  }
  if (args.strategy != QuantArgs::Strategy::kBlock && get("block_structure") != nullptr) {
    throw fail("block_structure requires strategy \"block\"");
  }
  if (const json* v = get("scale_dtype")) {
    bool found = false;
    for (const TorchDType& t : kTorchDTypes) {
      if (*v == t.name) {
        args.scale_dtype = t.dtype;
        found = true;
      }
    }
    if (!found) throw fail(fmt::format("scale_dtype {} is not one ctquant writes", v->dump()));
  }
  if (const json* v = get("observer")) {
    if (!v->is_string()) throw fail(fmt::format("observer {} is not a string", v->dump()));
    // model_free_ptq's names (schemes.md 11, docs/observers.md): "minmax"
    // is written "static_minmax", "mse" runs memoryless_mse.
    const ObserverChoice choice = resolve_observer(v->get<std::string>(), where + ".observer");
    args.observer = choice.written;
    if (!choice.note.empty()) add_observer_note(choice.note);
  }
  if (const json* v = get("observer_kwargs")) {
    observer_params(args.observer, *v, where + ".observer_kwargs");
    args.observer_kwargs = *v;
  }
  return args;
}

}  // namespace ctquant
