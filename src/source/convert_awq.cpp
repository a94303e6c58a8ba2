// AutoAWQ GEMM checkpoints into compressed-tensors pack-quantized: the
// registry row of compressed-tensors 0.18's AutoAWQConverter
// (src/compressed_tensors/entrypoints/convert/converters/autoawq.py), the
// rules of docs/converters.md "AutoAWQ GEMM -> pack-quantized".
//
// Input (AutoAWQ awq/modules/linear/gemm.py WQLinear_GEMM): qweight I32
// [in, out/8], qzeros I32 [in/g, out/8], scales F16 [in/g, out]; nibble p
// of a word holds output column 8c + AWQ_ORDER[p]. Output: weight_packed I32
// [out, in/8] (nibble j of word [o, c] = the code of input 8c + j),
// weight_scale [out, in/g] (scales transposed), weight_zero_point I32
// [out/8, in/g] (zero_point only, packed along dim 0), weight_shape I64 [2].
// Codes and zero points are moved, never recomputed: lossless.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/source/converter.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

using nlohmann::json;

namespace {

enum AwqOp : int {
  kAwqWeight = kFirstConverterOp,  // qweight -> weight_packed
  kAwqScale,                       // scales -> weight_scale
  kAwqZeroPoint,                   // qzeros -> weight_zero_point
};

// AWQ_REVERSE_ORDER (awq/utils/packing_utils.py): the nibble of a word that
// holds output column 8c + j.
constexpr int kReverseOrder[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Python's re.escape (3.7+): what AutoAWQConverter.from_autoawq_config
// escapes in a modules_to_not_convert entry.
std::string python_re_escape(const std::string& text) {
  static constexpr std::string_view kSpecial = "()[]{}?*+-|^$\\.&~# \t\n\r\v\f";
  std::string out;
  for (const char c : text) {
    if (kSpecial.find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void store_u32(std::byte* p, std::uint32_t v) { std::memcpy(p, &v, 4); }

// Eight words side by side (GCC/clang vector extension: element-wise
// operators, lowered to whatever SIMD the target has, or to scalars).
using Words8 = std::uint32_t __attribute__((vector_size(32)));

// Transposes an 8x8 matrix of nibbles held in 8 words (element (r, p) =
// nibble p of a[r]) in place: afterwards nibble r of a[p] is the old (r, p).
// Blocks of 4x4, 2x2, then single nibbles are swapped. W is one word, or
// Words8 for eight independent matrices at once.
template <class W>
inline void transpose_nibbles(W a[8]) {
  for (int r = 0; r < 4; ++r) {
    const W x = a[r], y = a[r + 4];
    a[r] = (x & 0x0000FFFFu) | (y << 16);
    a[r + 4] = (x >> 16) | (y & 0xFFFF0000u);
  }
  for (const int r : {0, 1, 4, 5}) {
    const W x = a[r], y = a[r + 2];
    a[r] = (x & 0x00FF00FFu) | ((y & 0x00FF00FFu) << 8);
    a[r + 2] = ((x >> 8) & 0x00FF00FFu) | (y & 0xFF00FF00u);
  }
  for (const int r : {0, 2, 4, 6}) {
    const W x = a[r], y = a[r + 1];
    a[r] = (x & 0x0F0F0F0Fu) | ((y & 0x0F0F0F0Fu) << 4);
    a[r + 1] = ((x >> 4) & 0x0F0F0F0Fu) | (y & 0xF0F0F0F0u);
  }
}

// One block of 8 inputs (8c .. 8c+7) and 8 outputs (8w .. 8w+7): the
// nibbles transposed, and output 8w + k taking AWQ's nibble
// kReverseOrder[k].
inline void awq_block(const std::byte* in, std::byte* out, std::uint64_t words,
                      std::uint64_t out_cols, std::uint64_t c, std::uint64_t w) {
  std::uint32_t a[8];
  for (int j = 0; j < 8; ++j) a[j] = load_u32(in + ((8 * c + j) * words + w) * 4);
  transpose_nibbles(a);
  for (int k = 0; k < 8; ++k) {
    store_u32(out + ((8 * w + k) * out_cols + c) * 4, a[kReverseOrder[k]]);
  }
}

// weight_packed [out, in/8] from qweight [in, out/8], block by block as
// awq_block. Tiles of 32 word columns by 32 output words are transposed
// eight blocks at once (Words8) into a local 32 KiB tile, then copied out
// 128 bytes per output row. The rows of both matrices are often 2^n bytes
// apart: writing 4 bytes into each of hundreds of rows in turn evicts them
// from L1 before they fill, and walking a column of rows misses the TLB at
// every row. The tiles of one band of 32 output words are visited in
// order, so its input rows are read front to back. The edges that do not
// fill a tile go block by block. (tools/bench-convert.sh measures it.)
void awq_weight(const std::vector<std::uint64_t>& qshape, const std::byte* in, std::byte* out) {
  const std::uint64_t n_in = qshape[0], words = qshape[1];
  const std::uint64_t out_cols = n_in / 8;  // words per output row
  constexpr std::uint64_t kTile = 32;
  const std::uint64_t full_words = words / kTile * kTile;
  const std::uint64_t full_cols = out_cols / kTile * kTile;
  alignas(64) std::uint32_t tile[8 * kTile][kTile];
  for (std::uint64_t c0 = 0; c0 < full_cols; c0 += kTile) {
    for (std::uint64_t w0 = 0; w0 < full_words; w0 += kTile) {
      if (w0 + kTile < full_words) {
        // The next tile's input lines: 8 * kTile rows too far apart for the
        // hardware prefetchers to follow.
        for (std::uint64_t r = 0; r < 8 * kTile; ++r) {
          const std::byte* p = in + ((8 * c0 + r) * words + w0 + kTile) * 4;
          __builtin_prefetch(p);
          __builtin_prefetch(p + 64);
        }
      }
      for (std::uint64_t c = 0; c < kTile; ++c) {
        for (std::uint64_t h = 0; h < kTile; h += 8) {
          Words8 a[8];
          for (int j = 0; j < 8; ++j) {
            std::memcpy(&a[j], in + ((8 * (c0 + c) + j) * words + w0 + h) * 4, sizeof(Words8));
          }
          transpose_nibbles(a);
          for (int l = 0; l < 8; ++l) {
            for (int k = 0; k < 8; ++k) tile[8 * (h + l) + k][c] = a[kReverseOrder[k]][l];
          }
        }
      }
      for (std::uint64_t r = 0; r < 8 * kTile; ++r) {
        std::memcpy(out + ((8 * w0 + r) * out_cols + c0) * 4, tile[r], sizeof(tile[r]));
      }
    }
  }
  for (std::uint64_t c = full_cols; c < out_cols; ++c) {
    for (std::uint64_t w = 0; w < full_words; ++w) awq_block(in, out, words, out_cols, c, w);
  }
  for (std::uint64_t w = full_words; w < words; ++w) {
    for (std::uint64_t c = 0; c < out_cols; ++c) awq_block(in, out, words, out_cols, c, w);
  }
}

// weight_zero_point [out/8, G] from qzeros [G, out/8]: nibble j of word
// [r, k] is the zero point of output 8r + j, group k.
void awq_zero_point(const std::vector<std::uint64_t>& zshape, const std::byte* in, std::byte* out) {
  const std::uint64_t groups = zshape[0], words = zshape[1];
  for (std::uint64_t k = 0; k < groups; ++k) {
    for (std::uint64_t r = 0; r < words; ++r) {
      const std::uint32_t z = load_u32(in + (k * words + r) * 4);
      std::uint32_t v = 0;
      for (int j = 0; j < 8; ++j) v |= ((z >> (4 * kReverseOrder[j])) & 15u) << (4 * j);
      store_u32(out + (r * groups + k) * 4, v);
    }
  }
}

// weight_scale [out, G] from scales [G, out], element bits unchanged.
void transpose_elements(const std::vector<std::uint64_t>& shape, std::size_t element,
                        const std::byte* in, std::byte* out) {
  const std::uint64_t rows = shape[0], cols = shape[1];
  for (std::uint64_t r = 0; r < rows; ++r) {
    for (std::uint64_t c = 0; c < cols; ++c) {
      std::memcpy(out + (c * rows + r) * element, in + (r * cols + c) * element, element);
    }
  }
}

void produce_awq(const ConvertedTensor& t, std::span<const std::span<const std::byte>> inputs,
                 std::span<std::byte> out) {
  // The input shapes are recorded in the output's: weight_packed [out, in/8]
  // from qweight [in, out/8]; weight_scale [out, G] from [G, out];
  // weight_zero_point [out/8, G] from [G, out/8].
  switch (t.op) {
    case kAwqWeight:
      awq_weight({t.shape[1] * 8, t.shape[0] / 8}, inputs[0].data(), out.data());
      break;
    case kAwqScale:
      transpose_elements({t.shape[1], t.shape[0]},
                         static_cast<std::size_t>(dtype_bits(t.dtype) / 8), inputs[0].data(),
                         out.data());
      break;
    case kAwqZeroPoint:
      awq_zero_point({t.shape[1], t.shape[0]}, inputs[0].data(), out.data());
      break;
    default:
      throw std::logic_error("AWQ converter: unknown operation");
  }
}

// The unsupported-input error for a config.json value, with the rule.
[[noreturn]] void refuse(const std::string& key, const std::string& value, const std::string& why) {
  throw unsupported_input(fmt::format(
      "config.json: quantization_config.{} {}: {} (ctquant converts AutoAWQ GEMM checkpoints: "
      "quant_method \"awq\", version \"gemm\", bits 4, as compressed-tensors' AutoAWQConverter "
      "does); nothing was written",
      key, value, why));
}

std::optional<SourceFormat> detect_awq(const Checkpoint& checkpoint,
                                       const ConvertOptions& options) {
  if (!checkpoint.config || !checkpoint.config->is_object()) return std::nullopt;
  const auto qc = checkpoint.config->find("quantization_config");
  if (qc == checkpoint.config->end() || !qc->is_object()) return std::nullopt;
  const auto method = qc->find("quant_method");
  if (method == qc->end() || !method->is_string() || method->get<std::string>() != "awq") {
    return std::nullopt;
  }
  // AutoAWQConverter.from_autoawq_config's defaults.
  const json bits = qc->value("bits", json(4));
  const json version = qc->value("version", json("gemm"));
  const json zero_point = qc->value("zero_point", json(true));
  const json group_size = qc->value("group_size", json(128));
  const json not_convert = qc->value("modules_to_not_convert", json(nullptr));
  if (!version.is_string() || version.get<std::string>() != "gemm") {
    const std::string v = version.is_string() ? version.get<std::string>() : version.dump();
    std::string why = fmt::format("Unsupported AutoAWQ version: {}", v);
    if (v == "gemv") {
      why += "; GEMV packs qweight [out, in/8] along the inputs, another layout";
    } else if (v == "marlin") {
      why += "; Marlin stores permuted 16x16 tiles, another layout";
    } else if (v == "GEMM" || v == "Gemm") {
      why +=
          "; the version is compared exactly, as compressed-tensors does: if the tensors are "
          "GEMM-packed, write \"gemm\" in config.json";
    } else {
      why += "; only \"gemm\" names the layout the converter reads";
    }
    refuse("version", fmt::format("\"{}\"", v), why);
  }
  if (!bits.is_number_integer() || bits.get<long long>() != 4) {
    refuse("bits", bits.dump(),
           "AutoAWQConverter currently supports only 4-bit weights (no AutoAWQ kernel writes "
           "another width)");
  }
  if (!zero_point.is_boolean()) refuse("zero_point", zero_point.dump(), "not true or false");
  if (!group_size.is_number_integer() || group_size.get<long long>() <= 0) {
    refuse("group_size", group_size.dump(),
           "a group strategy needs a positive group size (compressed-tensors' QuantizationArgs "
           "refuses it; AutoAWQ cannot write per-channel GEMM checkpoints)");
  }
  if (!not_convert.is_null() && !not_convert.is_array()) {
    refuse("modules_to_not_convert", not_convert.dump(), "not a list of module names or null");
  }
  SourceFormat f;
  const bool zp = zero_point.get<bool>();
  const long long g = group_size.get<long long>();
  f.description =
      fmt::format("AutoAWQ GEMM, 4 bits, group {}, {}", g, zp ? "zero point" : "no zero point");
  f.targets = options.targets.value_or(std::vector<std::string>{"Linear"});
  if (options.ignore) {
    f.ignore = *options.ignore;
  } else {
    f.ignore = {"lm_head"};
    for (const json& m : not_convert.is_array() ? not_convert : json::array()) {
      if (!m.is_string()) refuse("modules_to_not_convert", m.dump(), "not a module name");
      f.ignore.push_back(".*" + python_re_escape(m.get<std::string>()) + ".*");
      f.ignore.back().insert(0, "re:");
    }
  }
  f.params = {{"zero_point", zp}, {"group_size", g}};
  f.group = {
      {"format", "pack-quantized"},
      {"input_activations", nullptr},
      {"output_activations", nullptr},
      {"targets", f.targets},
      {"weights",
       {{"actorder", nullptr},
        {"block_structure", nullptr},
        {"dynamic", false},
        {"group_size", g},
        {"num_bits", 4},
        {"observer", "memoryless_minmax"},
        {"observer_kwargs", json::object()},
        {"scale_dtype", nullptr},
        {"strategy", "group"},
        {"symmetric", !zp},
        {"type", "int"},
        {"zp_dtype", zp ? json("torch.int8") : json(nullptr)}}},
  };
  f.kv_cache_scheme = nullptr;
  return f;
}

std::string describe(const Checkpoint& c, const TensorLocation& at) {
  const TensorEntry& t = c.entry(at);
  return fmt::format("{}: tensor '{}' ({} {})", c.shards[at.shard].label(), t.name,
                     dtype_tag(t.dtype), shape_string(t.shape));
}

std::vector<ConvertedModule> plan_awq(const Checkpoint& c, const SourceFormat& f,
                                      std::vector<std::string>& problems) {
  const ModuleMatcher ignore(f.ignore, ModuleMatcher::Role::kIgnore);
  const ModuleMatcher targets(f.targets, ModuleMatcher::Role::kTargets);
  const bool zp = f.params["zero_point"].get<bool>();
  const auto group = static_cast<std::uint64_t>(f.params["group_size"].get<long long>());
  std::vector<ConvertedModule> modules;
  for (std::size_t s = 0; s < c.shards.size(); ++s) {
    const auto& tensors = c.shards[s].header().tensors;
    for (std::size_t e = 0; e < tensors.size(); ++e) {
      const TensorEntry& t = tensors[e];
      const std::string param = last_component(t.name);
      if (param != "qweight" && param != "qzeros" && param != "scales") continue;
      const std::string module = module_of(t.name);
      const TensorLocation at{s, e};
      if (ignore.first_match(module) || !targets.first_match(module)) {
        // validate(): AutoAWQ's tensors of a module the converter does not
        // take (a modules_to_not_convert entry naming a quantized module).
        problems.push_back(fmt::format(
            "{}: Found unexpected non-targeted tensor {}: module '{}' is {} but holds AutoAWQ "
            "tensors; config.json and the tensors disagree",
            describe(c, at), t.name, module,
            ignore.first_match(module) ? "in the ignore list made from modules_to_not_convert"
                                       : "not in the converter's targets"));
        continue;
      }
      if (param != "qweight") {
        if (c.find(module + ".qweight") == nullptr) {
          problems.push_back(fmt::format("{}: {} without its qweight '{}.qweight'", describe(c, at),
                                         param, module));
        }
        continue;
      }
      const auto find = [&](const std::string& p) -> std::optional<TensorLocation> {
        const auto it = c.tensors.find(module + "." + p);
        if (it == c.tensors.end()) return std::nullopt;
        return it->second;
      };
      const auto scales = find("scales");
      const auto qzeros = find("qzeros");
      if (t.dtype != DType::kI32 || t.shape.size() != 2 || t.shape[0] % 8 != 0) {
        problems.push_back(
            fmt::format("{}: an AutoAWQ GEMM qweight is I32 [in, out/8] with in a multiple of 8",
                        describe(c, at)));
        continue;
      }
      const std::uint64_t n_in = t.shape[0], words = t.shape[1], n_out = 8 * words;
      if (!scales) {
        problems.push_back(fmt::format(
            "{}: Found qweight without corresponding scales: tensor '{}.scales' is missing",
            describe(c, at), module));
        continue;
      }
      const TensorEntry& st = c.entry(*scales);
      if (n_in % group != 0) {
        problems.push_back(fmt::format(
            "{}: in_features {} (qweight {}) is not a multiple of config.json's "
            "quantization_config.group_size {}: each group of scales covers group_size inputs",
            describe(c, at), n_in, shape_string(t.shape), group));
        continue;
      }
      if (st.shape != std::vector<std::uint64_t>{n_in / group, n_out} ||
          (st.dtype != DType::kF16 && st.dtype != DType::kBF16 && st.dtype != DType::kF32)) {
        problems.push_back(fmt::format(
            "{}: expected F16 scales [{}, {}] (in_features {} / group_size {}, out_features {} "
            "from qweight {})",
            describe(c, *scales), n_in / group, n_out, n_in, group, n_out, shape_string(t.shape)));
        continue;
      }
      if (zp && !qzeros) {
        problems.push_back(fmt::format(
            "{}: Found qweight without corresponding qzeros: zero_point is true and tensor "
            "'{}.qzeros' is missing",
            describe(c, at), module));
        continue;
      }
      const std::uint64_t groups = n_in / group;
      if (qzeros && (c.entry(*qzeros).dtype != DType::kI32 ||
                     c.entry(*qzeros).shape != std::vector<std::uint64_t>{groups, words})) {
        problems.push_back(
            fmt::format("{}: expected I32 qzeros [{}, {}]", describe(c, *qzeros), groups, words));
        continue;
      }
      ConvertedModule m;
      m.name = module;
      m.primary = at;
      m.params = n_out * n_in;
      m.consumed = {at, *scales};
      if (qzeros) m.consumed.push_back(*qzeros);  // dropped also without zero_point
      const auto add = [&](std::string suffix, DType dtype, std::vector<std::uint64_t> shape,
                           int op, std::vector<TensorLocation> inputs) {
        ConvertedTensor o;
        o.name = module + "." + suffix;
        o.dtype = dtype;
        o.shape = std::move(shape);
        std::uint64_t n = 1;
        for (const std::uint64_t d : o.shape) n *= d;
        o.byte_size = n * static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
        o.op = op;
        o.inputs = std::move(inputs);
        m.outputs.push_back(std::move(o));
      };
      add("weight_packed", DType::kI32, {n_out, n_in / 8}, kAwqWeight, {at});
      add("weight_scale", st.dtype, {n_out, groups}, kAwqScale, {*scales});
      add("weight_shape", DType::kI64, {2}, kConstantOp, {});
      for (const std::uint64_t v : {n_out, n_in}) {
        const auto* b = reinterpret_cast<const std::byte*>(&v);
        m.outputs.back().constant.insert(m.outputs.back().constant.end(), b, b + 8);
      }
      if (zp) add("weight_zero_point", DType::kI32, {words, groups}, kAwqZeroPoint, {*qzeros});
      modules.push_back(std::move(m));
    }
  }
  return modules;
}

// (q - z) * s per element, as AutoAWQ dequantizes (packing_utils.dequantize_gemm),
// into F32 [out, in]; consumed = {qweight, scales[, qzeros]}.
bool dequantize_awq(const Checkpoint& c, const ConvertedModule& m,
                    std::span<const std::vector<std::byte>> inputs, std::vector<float>& out,
                    std::uint64_t& rows, std::uint64_t& cols) {
  const TensorEntry& qw = c.entry(m.consumed[0]);
  const TensorEntry& sc = c.entry(m.consumed[1]);
  const bool has_zeros =
      m.consumed.size() > 2 && std::any_of(m.outputs.begin(), m.outputs.end(), [](const auto& o) {
        return o.name.ends_with(".weight_zero_point");
      });
  const std::uint64_t n_in = qw.shape[0], words = qw.shape[1], n_out = 8 * words;
  const std::uint64_t group = n_in / sc.shape[0];
  rows = n_out;
  cols = n_in;
  out.assign(n_out * n_in, 0.0f);
  for (std::uint64_t i = 0; i < n_in; ++i) {
    for (std::uint64_t o = 0; o < n_out; ++o) {
      const int nib = kReverseOrder[o % 8];
      const std::uint32_t q =
          (load_u32(inputs[0].data() + (i * words + o / 8) * 4) >> (4 * nib)) & 15u;
      std::uint32_t z = 8;
      if (has_zeros) {
        z = (load_u32(inputs[2].data() + ((i / group) * words + o / 8) * 4) >> (4 * nib)) & 15u;
      }
      const std::byte* sp =
          inputs[1].data() + ((i / group) * n_out + o) * (dtype_bits(sc.dtype) / 8);
      float s = 0.0f;
      if (sc.dtype == DType::kF32) {
        std::memcpy(&s, sp, 4);
      } else {
        std::uint16_t bits16;
        std::memcpy(&bits16, sp, 2);
        s = sc.dtype == DType::kF16 ? f16_to_float(bits16) : bf16_to_float(bits16);
      }
      out[o * n_in + i] = static_cast<float>(static_cast<int>(q) - static_cast<int>(z)) * s;
    }
  }
  return true;
}

}  // namespace

extern const SourceConverter kAwqConverter;
const SourceConverter kAwqConverter{
    .name = "AWQ",
    .source = "compressed-tensors 0.18 entrypoints/convert/converters/autoawq.py",
    .detect = detect_awq,
    .plan = plan_awq,
    .produce = produce_awq,
    .dequantize_source = dequantize_awq,
    .lossless = true,
};

}  // namespace ctquant
