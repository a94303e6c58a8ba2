// ctquant_make_checkpoint: writes a synthetic safetensors checkpoint from a
// layout manifest (shared/bench/*.manifest.json: `config` and a list of
// tensors with name, shape and dtype), for benchmarks.
//
// Float tensors hold seeded normal values (mean 0, std 0.02) with rare
// outliers (about 1 element in 10^4 scaled by 20); other dtypes hold zeros.
// The values of a tensor depend only on the seed, the tensor's name and the
// element index, so the output is the same for every thread count and shard
// size. Data is generated and written in chunks of 1 Mi elements per thread
// with the library's writer (layout_shard, OutputFile): memory stays a few
// MiB whatever the layout size.
//
// FP8 weights (a 2-D `M.weight` of dtype F8_E4M3 or F8_E5M2) are quantized
// from such normal values as the FP8 checkpoints ctquant reads were made
// (section 6 of the format spec): the manifest lists the weight's scale,
// `M.weight_scale_inv` (block FP8) or `M.weight_scale` (compressed-tensors),
// and its shape says how it covers the weight: a grid
// [ceil(R / bh), ceil(C / bw)] of the config's block size (`weight_block_size`,
// or a config group's `block_structure`) or one scale per row ([R, 1] or
// [R]). Each block (or row) gets scale = amax / (largest FP8 value), rounded
// to the scale's dtype, and codes = the values divided by it, rounded to the
// nearest FP8 value (ties to even): dequantized, they are the normal values
// to within FP8 precision.
//
//   ctquant_make_checkpoint MANIFEST OUTPUT_DIR [--seed N] [--layers N]
//                           [--only-layers LIST] [--shard-size BYTES]
//                           [--threads N] [--force]
//
// --layers N rebuilds the `layers.K.*` tensors for N layers, layer K taking
// the shapes of layer K mod (the manifest's layer count), and updates
// num_hidden_layers (and layer_types / sliding_windows when they list one
// entry per layer). --only-layers 0,3 keeps only the tensors of layers 0 and 3
// (a sample of a large model: no embeddings, no head). --shard-size splits the tensors, in name order, into
// model-0000X-of-0000N.safetensors files of at most that many data bytes (a
// larger tensor gets a file of its own) plus model.safetensors.index.json, as
// Hugging Face writers do; the default is one model.safetensors.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/util/checked.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fd_pool.hpp"

namespace {

namespace fs = std::filesystem;
using ctquant::DType;
using json = nlohmann::json;

constexpr double kStd = 0.02;
constexpr double kOutlierScale = 20.0;
constexpr std::uint64_t kOutlierOneIn = 10000;
constexpr std::uint64_t kChunkElements = 1u << 20;

struct Options {
  std::string manifest;
  std::string output;
  std::uint64_t seed = 0;
  unsigned layers = 0;           // 0: as in the manifest
  std::string only_layers;       // "0,3": keep only these layers' tensors
  std::uint64_t shard_size = 0;  // 0: one model.safetensors
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  bool force = false;
  std::string fp8;  // "block" or "channel": write the layout's linear weights as FP8
};

struct Tensor {
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::uint64_t numel = 0;
  std::uint64_t byte_size = 0;
};

struct Shard {
  std::string file_name;
  std::vector<Tensor> tensors;
  ctquant::ShardLayout layout;
};

// splitmix64: a small, well-mixed generator; one per chunk.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1].
  double uniform_open0() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1p-53; }
};

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

// Fills values[i] for elements first .. first + values.size() of the tensor.
// Chunks start at multiples of kChunkElements, so each has its own stream.
void generate(std::uint64_t seed, std::uint64_t name_hash, std::uint64_t chunk,
              std::vector<double>& values) {
  SplitMix64 rng{seed ^ (name_hash * 0x9E3779B97F4A7C15ull) ^ (chunk * 0xD1B54A32D192ED03ull)};
  for (std::size_t i = 0; i < values.size(); i += 2) {
    // Box-Muller: two normals from two uniforms.
    const double r = std::sqrt(-2.0 * std::log(rng.uniform_open0()));
    const double theta = 2.0 * std::numbers::pi * rng.uniform_open0();
    values[i] = r * std::cos(theta) * kStd;
    if (i + 1 < values.size()) values[i + 1] = r * std::sin(theta) * kStd;
  }
  for (double& v : values) {
    if (rng.next() % kOutlierOneIn == 0) v *= kOutlierScale;
  }
}

// Encodes values as dtype into out (numel * bits / 8 bytes).
void encode(DType dtype, const std::vector<double>& values, std::vector<std::byte>& out) {
  const std::size_t n = values.size();
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16: {
      out.resize(n * 2);
      for (std::size_t i = 0; i < n; ++i) {
        const float f = static_cast<float>(values[i]);
        const std::uint16_t b =
            dtype == DType::kBF16 ? ctquant::float_to_bf16(f) : ctquant::float_to_f16(f);
        std::memcpy(out.data() + 2 * i, &b, 2);
      }
      break;
    }
    case DType::kF32: {
      out.resize(n * 4);
      for (std::size_t i = 0; i < n; ++i) {
        const float f = static_cast<float>(values[i]);
        std::memcpy(out.data() + 4 * i, &f, 4);
      }
      break;
    }
    case DType::kF64:
      out.resize(n * 8);
      std::memcpy(out.data(), values.data(), n * 8);
      break;
    default:
      out.assign(n * static_cast<std::size_t>(ctquant::dtype_bits(dtype)) / 8, std::byte{0});
  }
}

bool is_float(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32 ||
         dtype == DType::kF64;
}

std::vector<Tensor> read_manifest(const Options& options, json& config) {
  std::ifstream in(options.manifest);
  if (!in) throw ctquant::io_error(fmt::format("{}: cannot open", options.manifest));
  json manifest;
  try {
    manifest = json::parse(in);
  } catch (const json::exception& e) {
    throw ctquant::bad_input(fmt::format("{}: not JSON: {}", options.manifest, e.what()));
  }
  if (!manifest.is_object() || !manifest.contains("tensors") || !manifest["tensors"].is_array()) {
    throw ctquant::bad_input(
        fmt::format("{}: expected an object with a \"tensors\" array", options.manifest));
  }
  config = manifest.value("config", json::object());
  std::vector<Tensor> tensors;
  for (const json& t : manifest["tensors"]) {
    Tensor tensor;
    const std::string name = t.value("name", "");
    const auto dtype = ctquant::dtype_from_tag(t.value("dtype", ""));
    if (name.empty() || !dtype || !t.contains("shape") || !t["shape"].is_array()) {
      throw ctquant::bad_input(
          fmt::format("{}: tensor entry {} needs a name, a known dtype and a shape",
                      options.manifest, t.dump()));
    }
    tensor.name = name;
    tensor.dtype = *dtype;
    std::uint64_t numel = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_unsigned()) {
        throw ctquant::bad_input(
            fmt::format("{}: tensor '{}': shape entries must be "
                        "non-negative integers, found {}",
                        options.manifest, name, d.dump()));
      }
      tensor.shape.push_back(d.get<std::uint64_t>());
      if (!ctquant::checked_mul(numel, tensor.shape.back(), numel)) {
        throw ctquant::bad_input(
            fmt::format("{}: tensor '{}': element count overflows", options.manifest, name));
      }
    }
    tensor.numel = numel;
    const auto bits = static_cast<std::uint64_t>(ctquant::dtype_bits(*dtype));
    if (!ctquant::checked_mul(numel, bits, tensor.byte_size) || tensor.byte_size % 8 != 0) {
      throw ctquant::bad_input(fmt::format("{}: tensor '{}': {} elements of {} are not whole bytes",
                                           options.manifest, name, numel, t.value("dtype", "")));
    }
    tensor.byte_size /= 8;
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

// "layers.K.rest" (at the start or after a dot) -> (prefix, K, rest).
struct LayerName {
  std::string prefix;
  unsigned index = 0;
  std::string rest;
};

std::optional<LayerName> parse_layer_name(const std::string& name) {
  static constexpr std::string_view kKey = "layers.";
  for (std::size_t at = name.find(kKey); at != std::string::npos; at = name.find(kKey, at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    std::size_t p = at + kKey.size();
    const std::size_t digits_begin = p;
    while (p < name.size() && name[p] >= '0' && name[p] <= '9') ++p;
    if (p == digits_begin || p >= name.size() || name[p] != '.' || p - digits_begin > 6) continue;
    return LayerName{name.substr(0, at + kKey.size()),
                     static_cast<unsigned>(std::stoul(name.substr(digits_begin, p - digits_begin))),
                     name.substr(p)};
  }
  return std::nullopt;
}

// Rebuilds the layer tensors for n_layers layers (section in the file comment).
std::vector<Tensor> scale_layers(const std::vector<Tensor>& tensors, unsigned n_layers,
                                 json& config) {
  unsigned old_layers = 0;
  for (const Tensor& t : tensors) {
    if (const auto l = parse_layer_name(t.name)) old_layers = std::max(old_layers, l->index + 1);
  }
  if (old_layers == 0) {
    throw ctquant::usage_error("--layers: the manifest has no 'layers.K.' tensors to replicate");
  }
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) {
    if (!parse_layer_name(t.name)) out.push_back(t);
  }
  for (unsigned k = 0; k < n_layers; ++k) {
    for (const Tensor& t : tensors) {
      const auto l = parse_layer_name(t.name);
      if (!l || l->index != k % old_layers) continue;
      Tensor copy = t;
      copy.name = fmt::format("{}{}{}", l->prefix, k, l->rest);
      out.push_back(std::move(copy));
    }
  }
  config["num_hidden_layers"] = n_layers;
  for (const char* key : {"layer_types", "sliding_windows"}) {
    if (!config.contains(key) || !config[key].is_array() || config[key].size() != old_layers) {
      continue;
    }
    json scaled = json::array();
    for (unsigned k = 0; k < n_layers; ++k) scaled.push_back(config[key][k % old_layers]);
    config[key] = scaled;
  }
  return out;
}

// Keeps only the tensors of the listed layers ("0,3"): a sample of a model
// too large to generate whole, with real names and shapes.
std::vector<Tensor> keep_layers(const std::vector<Tensor>& tensors, const std::string& list) {
  std::set<unsigned> keep;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
        item.size() > 6) {
      throw ctquant::usage_error(fmt::format("--only-layers {}: expected layer numbers separated "
                                             "by commas, e.g. 0,3",
                                             list));
    }
    keep.insert(static_cast<unsigned>(std::stoul(item)));
  }
  std::vector<Tensor> out;
  std::set<unsigned> found;
  for (const Tensor& t : tensors) {
    const auto l = parse_layer_name(t.name);
    if (l && keep.count(l->index) > 0) {
      out.push_back(t);
      found.insert(l->index);
    }
  }
  for (const unsigned k : keep) {
    if (found.count(k) == 0) {
      throw ctquant::usage_error(fmt::format("--only-layers: the manifest has no layer {}", k));
    }
  }
  return out;
}

std::vector<Shard> split_shards(std::vector<Tensor> tensors, std::uint64_t shard_size) {
  std::sort(tensors.begin(), tensors.end(),
            [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
  std::vector<Shard> shards;
  std::uint64_t filled = 0;
  for (Tensor& t : tensors) {
    if (shards.empty() || (shard_size > 0 && filled > 0 && filled + t.byte_size > shard_size)) {
      shards.emplace_back();
      filled = 0;
    }
    filled += t.byte_size;
    shards.back().tensors.push_back(std::move(t));
  }
  if (shards.empty()) shards.emplace_back();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    shards[i].file_name =
        shard_size == 0 ? "model.safetensors"
                        : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    std::vector<ctquant::TensorSpec> specs;
    for (const Tensor& t : shards[i].tensors) {
      specs.push_back(ctquant::TensorSpec{t.name, t.dtype, t.shape, t.byte_size});
    }
    shards[i].layout = ctquant::layout_shard(specs, {{"format", "pt"}});
  }
  return shards;
}

// ---- FP8 weights ----

// An FP8 weight and the scale that covers it (see the file comment).
struct Fp8Weight {
  const Tensor* weight = nullptr;
  const Tensor* scale = nullptr;
  std::uint64_t block_rows = 1;  // rows one scale covers
  std::uint64_t block_cols = 0;  // columns one scale covers (C for one scale per row)
  std::uint64_t grid_cols = 1;   // scales per row band
};

// The block size [rows, cols] of the config's quantization_config: fp8's
// weight_block_size, or the first config group's block_structure.
std::optional<std::array<std::uint64_t, 2>> config_block_size(const json& config) {
  if (!config.contains("quantization_config") || !config["quantization_config"].is_object()) {
    return std::nullopt;
  }
  const json& qc = config["quantization_config"];
  const auto pair = [](const json& v) -> std::optional<std::array<std::uint64_t, 2>> {
    if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() ||
        !v[1].is_number_unsigned() || v[0] == 0 || v[1] == 0) {
      return std::nullopt;
    }
    return std::array<std::uint64_t, 2>{v[0].get<std::uint64_t>(), v[1].get<std::uint64_t>()};
  };
  if (qc.contains("weight_block_size")) return pair(qc["weight_block_size"]);
  if (qc.contains("config_groups") && qc["config_groups"].is_object()) {
    for (const auto& [name, group] : qc["config_groups"].items()) {
      if (group.is_object() && group.contains("weights") && group["weights"].is_object() &&
          group["weights"].contains("block_structure")) {
        return pair(group["weights"]["block_structure"]);
      }
    }
  }
  return std::nullopt;
}

bool is_f8(DType dtype) { return dtype == DType::kF8_E4M3 || dtype == DType::kF8_E5M2; }

// Pairs every 2-D F8 `M.weight` with its scale and decides how the scale
// covers it from the scale's shape. Throws Error{kBadInput} for a weight
// without a scale, a scale of another shape, or a grid without a block size.
std::vector<Fp8Weight> find_fp8_weights(const std::vector<Shard>& shards, const json& config) {
  std::map<std::string, const Tensor*> by_name;
  for (const Shard& shard : shards) {
    for (const Tensor& t : shard.tensors) by_name[t.name] = &t;
  }
  const auto block = config_block_size(config);
  std::vector<Fp8Weight> out;
  for (const auto& [name, t] : by_name) {
    if (!is_f8(t->dtype) || t->shape.size() != 2 || !name.ends_with(".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    const Tensor* scale = nullptr;
    for (const char* suffix : {".weight_scale_inv", ".weight_scale"}) {
      const auto it = by_name.find(module + suffix);
      if (it != by_name.end()) scale = it->second;
    }
    if (scale == nullptr) {
      throw ctquant::bad_input(fmt::format(
          "FP8 weight '{}' has no {}.weight_scale_inv or .weight_scale in the manifest", name,
          module));
    }
    if (scale->dtype != DType::kF32 && scale->dtype != DType::kBF16) {
      throw ctquant::bad_input(fmt::format("scale '{}': dtype {}, the generator writes F32 or BF16",
                                           scale->name, ctquant::dtype_tag(scale->dtype)));
    }
    const std::uint64_t rows = t->shape[0];
    const std::uint64_t cols = t->shape[1];
    Fp8Weight w{t, scale};
    const auto& s = scale->shape;
    if ((s.size() == 2 && s[0] == rows && s[1] == 1) || (s.size() == 1 && s[0] == rows)) {
      w.block_rows = 1;
      w.block_cols = cols;
      w.grid_cols = 1;
    } else if (s.size() == 2 && block) {
      w.block_rows = (*block)[0];
      w.block_cols = (*block)[1];
      w.grid_cols = (cols + w.block_cols - 1) / w.block_cols;
      if (s[0] != (rows + w.block_rows - 1) / w.block_rows || s[1] != w.grid_cols) {
        throw ctquant::bad_input(fmt::format(
            "scale '{}': shape {} does not cover '{}' {} with blocks of [{}, {}]", scale->name,
            ctquant::shape_string(s), name, ctquant::shape_string(t->shape), w.block_rows,
            w.block_cols));
      }
    } else {
      throw ctquant::bad_input(fmt::format(
          "scale '{}': shape {} is neither one scale per row of '{}' ([{}, 1]) nor a block grid "
          "(which needs weight_block_size or block_structure in the config's "
          "quantization_config)",
          scale->name, ctquant::shape_string(s), name, rows));
    }
    out.push_back(w);
  }
  return out;
}

// Rounds float values to the nearest FP8 value, ties to even, saturating at
// the largest finite value: the rounding of the mantissa done on the float's
// bits (normal range) or on the value scaled to units of the smallest
// subnormal (below it). Checked against a nearest-value search over the
// code table for every float.
class Fp8Encoder {
 public:
  explicit Fp8Encoder(DType dtype)
      : mantissa_bits_(dtype == DType::kF8_E4M3 ? 3 : 2),
        bias_(dtype == DType::kF8_E4M3 ? 7 : 15),
        max_code_(dtype == DType::kF8_E4M3 ? 0x7E : 0x7B),
        max_(dtype == DType::kF8_E4M3 ? ctquant::f8_e4m3_to_float(0x7E)
                                      : ctquant::f8_e5m2_to_float(0x7B)),
        min_normal_(std::ldexp(1.0f, 1 - bias_)) {}
  float max() const { return max_; }
  std::uint8_t encode(float x) const {
    const float a = std::min(std::fabs(x), max_);
    unsigned code = 0;
    if (a < min_normal_) {
      code = static_cast<unsigned>(std::nearbyint(std::ldexp(a, bias_ - 1 + mantissa_bits_)));
    } else {
      const int drop = 23 - mantissa_bits_;
      std::uint32_t bits = std::bit_cast<std::uint32_t>(a);
      bits += (1u << (drop - 1)) - 1 + ((bits >> drop) & 1u);  // round half to even
      bits >>= drop;
      const int exponent = static_cast<int>(bits >> mantissa_bits_) - 127 + bias_;
      code = (static_cast<unsigned>(exponent) << mantissa_bits_) |
             (bits & ((1u << mantissa_bits_) - 1));
      code = std::min(code, max_code_);
    }
    return code != 0 && x < 0 ? static_cast<std::uint8_t>(code | 0x80u)
                              : static_cast<std::uint8_t>(code);
  }

 private:
  int mantissa_bits_;
  int bias_;
  unsigned max_code_;
  float max_;
  float min_normal_;
};

// The scale stored for a block of amax (in the scale's dtype), as a float.
float block_scale(float amax, float fp8_max, DType scale_dtype) {
  float scale = amax / fp8_max;
  if (!(scale > 0)) scale = 1.0f;  // an all-zero block
  if (scale_dtype == DType::kBF16) scale = ctquant::bf16_to_float(ctquant::float_to_bf16(scale));
  return scale;
}

void store_scale(DType dtype, float scale, std::byte* out) {
  if (dtype == DType::kBF16) {
    const std::uint16_t bits = ctquant::float_to_bf16(scale);
    std::memcpy(out, &bits, 2);
  } else {
    std::memcpy(out, &scale, 4);
  }
}

// ---- writing ----

// Where a tensor's bytes go: its file and the file offset of its first byte.
struct Placement {
  const ctquant::OutputFile* file = nullptr;
  std::uint64_t offset = 0;
};

// One unit of work: elements [first, first + count) of one tensor, or rows
// [row_begin, row_end) of an FP8 weight with the scales that cover them.
struct Job {
  const Tensor* tensor = nullptr;
  Placement at;
  std::uint64_t chunk = 0;
  std::uint64_t count = 0;
  const Fp8Weight* fp8 = nullptr;
  Placement scale_at;
  std::uint64_t row_begin = 0;
  std::uint64_t row_end = 0;
};

// Generates and writes one row band of an FP8 weight and its scales.
void write_fp8_rows(const Options& options, const Job& job, const Fp8Encoder& encoder,
                    std::vector<double>& values, std::vector<std::byte>& codes,
                    std::vector<std::byte>& scales) {
  const Fp8Weight& w = *job.fp8;
  const std::uint64_t cols = w.weight->shape[1];
  const std::uint64_t rows = job.row_end - job.row_begin;
  values.assign(rows * cols, 0.0);
  generate(options.seed, fnv1a(w.weight->name), job.chunk, values);
  codes.resize(rows * cols);
  const std::uint64_t scale_bytes = static_cast<std::uint64_t>(ctquant::dtype_bits(w.scale->dtype) / 8);
  // One scale per (row group, column block) of the band: a block band has
  // one row group, a per-row scale one per row.
  const std::uint64_t groups = w.block_rows == 1 ? rows : 1;
  scales.resize(groups * w.grid_cols * scale_bytes);
  for (std::uint64_t g = 0; g < groups; ++g) {
    const std::uint64_t r0 = w.block_rows == 1 ? g : 0;
    const std::uint64_t r1 = w.block_rows == 1 ? g + 1 : rows;
    for (std::uint64_t b = 0; b < w.grid_cols; ++b) {
      const std::uint64_t c0 = b * w.block_cols;
      const std::uint64_t c1 = std::min(cols, c0 + w.block_cols);
      float amax = 0;
      for (std::uint64_t r = r0; r < r1; ++r) {
        for (std::uint64_t c = c0; c < c1; ++c) {
          amax = std::max(amax, std::fabs(static_cast<float>(values[r * cols + c])));
        }
      }
      const float scale = block_scale(amax, encoder.max(), w.scale->dtype);
      store_scale(w.scale->dtype, scale, &scales[(g * w.grid_cols + b) * scale_bytes]);
      for (std::uint64_t r = r0; r < r1; ++r) {
        for (std::uint64_t c = c0; c < c1; ++c) {
          codes[r * cols + c] =
              std::byte{encoder.encode(static_cast<float>(values[r * cols + c]) / scale)};
        }
      }
    }
  }
  job.at.file->write_at(job.at.offset + job.row_begin * cols, codes);
  const std::uint64_t first_scale_row = w.block_rows == 1 ? job.row_begin : job.row_begin / w.block_rows;
  job.scale_at.file->write_at(job.scale_at.offset + first_scale_row * w.grid_cols * scale_bytes,
                              scales);
}

void write_text(const fs::path& path, const std::string& text) {
  ctquant::OutputFile file(path);
  file.write_at(0, std::as_bytes(std::span(text)));
}

// --fp8 block|channel: the layout's linear weights (2-D BF16/F16/F32
// `.weight`, not embeddings, norms, heads, nor the manifest's
// recommended_ignore modules) as F8_E4M3, each with its scale tensor, and the
// quantization_config of such a checkpoint: block FP8 (DeepSeek-V3 style,
// F32 `weight_scale_inv` over 128 x 128 blocks) or compressed-tensors channel
// FP8 (`weight_scale` [R, 1] in the weight's dtype). The values come from the
// same FP8 writer as a manifest that lists FP8 weights.
std::vector<Tensor> as_fp8(const Options& options, std::vector<Tensor> tensors, json& config) {
  if (options.fp8 != "block" && options.fp8 != "channel") {
    throw ctquant::usage_error(fmt::format("--fp8 {}: expected block or channel", options.fp8));
  }
  std::vector<std::string> keep;
  {
    std::ifstream in(options.manifest);
    const json manifest = json::parse(in);
    for (const json& e : manifest.value("recommended_ignore", json::array())) {
      if (e.is_string()) keep.push_back(e.get<std::string>());
    }
  }
  const ctquant::ModuleMatcher kept(keep, ctquant::ModuleMatcher::Role::kIgnore);
  const bool block = options.fp8 == "block";
  std::vector<Tensor> out;
  for (Tensor& t : tensors) {
    const bool weight = t.name.size() > 7 && t.name.ends_with(".weight");
    const std::string module = weight ? t.name.substr(0, t.name.size() - 7) : t.name;
    const std::string last = module.substr(module.rfind('.') + 1);
    const bool linear = weight && t.shape.size() == 2 && is_float(t.dtype) &&
                        t.dtype != DType::kF64 && last.find("embed") == std::string::npos &&
                        last.find("norm") == std::string::npos &&
                        last.find("head") == std::string::npos && !kept.first_match(module);
    if (!linear) {
      out.push_back(std::move(t));
      continue;
    }
    const std::uint64_t rows = t.shape[0];
    const std::uint64_t cols = t.shape[1];
    Tensor scale;
    scale.name = module + (block ? ".weight_scale_inv" : ".weight_scale");
    scale.dtype = block ? DType::kF32 : t.dtype;
    scale.shape = block ? std::vector<std::uint64_t>{(rows + 127) / 128, (cols + 127) / 128}
                        : std::vector<std::uint64_t>{rows, 1};
    scale.numel = scale.shape[0] * scale.shape[1];
    scale.byte_size = scale.numel * static_cast<std::uint64_t>(ctquant::dtype_bits(scale.dtype) / 8);
    t.dtype = DType::kF8_E4M3;
    t.byte_size = t.numel;
    out.push_back(std::move(t));
    out.push_back(std::move(scale));
  }
  if (block) {
    config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                     {"fmt", "e4m3"},
                                     {"quant_method", "fp8"},
                                     {"weight_block_size", json::array({128u, 128u})}};
  } else {
    config["quantization_config"] = {
        {"config_groups",
         {{"group_0",
           {{"format", "float-quantized"},
            {"targets", {"Linear"}},
            {"input_activations",
             {{"dynamic", true}, {"num_bits", 8}, {"strategy", "token"}, {"symmetric", true},
              {"type", "float"}}},
            {"weights",
             {{"dynamic", false}, {"num_bits", 8}, {"strategy", "channel"}, {"symmetric", true},
              {"type", "float"}}}}}}},
        {"format", "float-quantized"},
        {"ignore", keep},
        {"quant_method", "compressed-tensors"},
        {"quantization_status", "compressed"}};
  }
  return out;
}

void run(const Options& options) {
  json config;
  std::vector<Tensor> tensors = read_manifest(options, config);
  if (!options.fp8.empty()) tensors = as_fp8(options, std::move(tensors), config);
  if (options.layers > 0) tensors = scale_layers(tensors, options.layers, config);
  if (!options.only_layers.empty()) tensors = keep_layers(tensors, options.only_layers);
  std::vector<Shard> shards = split_shards(std::move(tensors), options.shard_size);
  const std::vector<Fp8Weight> fp8_weights = find_fp8_weights(shards, config);
  std::set<const Tensor*> written_by_fp8;
  for (const Fp8Weight& w : fp8_weights) {
    written_by_fp8.insert(w.weight);
    written_by_fp8.insert(w.scale);
  }

  const fs::path out_dir = options.output;
  if (fs::exists(out_dir)) {
    if (!options.force) {
      throw ctquant::usage_error(
          fmt::format("{}: exists (pass --force to replace it)", out_dir.string()));
    }
    fs::remove_all(out_dir);
  }
  fs::create_directories(out_dir);

  // Files are opened through one bounded pool of descriptors: a layout may
  // be split into thousands of shards.
  const auto descriptors = std::make_shared<ctquant::FdPool>(ctquant::FdPool::default_capacity());
  std::vector<std::unique_ptr<ctquant::OutputFile>> files;
  std::map<const Tensor*, Placement> placements;
  std::vector<Job> jobs;
  std::uint64_t total_bytes = 0;
  std::uint64_t total_params = 0;
  std::size_t total_tensors = 0;
  for (const Shard& shard : shards) {
    auto file = std::make_unique<ctquant::OutputFile>(out_dir / shard.file_name, descriptors);
    file->reserve(shard.layout.file_size);
    file->write_at(0, std::as_bytes(std::span(shard.layout.header)));
    for (std::size_t i = 0; i < shard.tensors.size(); ++i) {
      const Tensor& t = shard.tensors[i];
      total_bytes += t.byte_size;
      total_params += t.numel;
      ++total_tensors;
      const Placement at{file.get(), shard.layout.data_start + shard.layout.offsets[i]};
      placements[&t] = at;
      if (written_by_fp8.count(&t) > 0) continue;
      for (std::uint64_t first = 0, chunk = 0; first < t.numel; first += kChunkElements, ++chunk) {
        Job job;
        job.tensor = &t;
        job.at = at;
        job.chunk = chunk;
        job.count = std::min(kChunkElements, t.numel - first);
        jobs.push_back(job);
      }
    }
    files.push_back(std::move(file));
  }
  for (const Fp8Weight& w : fp8_weights) {
    const std::uint64_t rows = w.weight->shape[0];
    const std::uint64_t cols = std::max<std::uint64_t>(1, w.weight->shape[1]);
    // Bands of whole blocks, or of rows of about kChunkElements.
    const std::uint64_t band =
        w.block_rows > 1 ? w.block_rows : std::max<std::uint64_t>(1, kChunkElements / cols);
    for (std::uint64_t r = 0, chunk = 0; r < rows; r += band, ++chunk) {
      Job job;
      job.tensor = w.weight;
      job.at = placements.at(w.weight);
      job.chunk = chunk;
      job.fp8 = &w;
      job.scale_at = placements.at(w.scale);
      job.row_begin = r;
      job.row_end = std::min(rows, r + band);
      jobs.push_back(job);
    }
  }

  const Fp8Encoder e4m3(DType::kF8_E4M3);
  const Fp8Encoder e5m2(DType::kF8_E5M2);
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    std::vector<double> values;
    std::vector<std::byte> bytes;
    std::vector<std::byte> scales;
    for (std::size_t i = next.fetch_add(1); i < jobs.size(); i = next.fetch_add(1)) {
      const Job& job = jobs[i];
      try {
        if (job.fp8 != nullptr) {
          write_fp8_rows(options, job, job.tensor->dtype == DType::kF8_E4M3 ? e4m3 : e5m2, values,
                         bytes, scales);
          continue;
        }
        values.assign(job.count, 0.0);
        if (is_float(job.tensor->dtype)) {
          generate(options.seed, fnv1a(job.tensor->name), job.chunk, values);
        }
        encode(job.tensor->dtype, values, bytes);
        const std::uint64_t element_bytes = job.tensor->byte_size / job.tensor->numel;
        job.at.file->write_at(job.at.offset + job.chunk * kChunkElements * element_bytes, bytes);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(jobs.size());
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(1u, options.threads); ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  files.clear();

  if (options.shard_size > 0) {
    json index;
    index["metadata"]["total_size"] = total_bytes;
    index["weight_map"] = json::object();
    for (const Shard& shard : shards) {
      for (const Tensor& t : shard.tensors) index["weight_map"][t.name] = shard.file_name;
    }
    write_text(out_dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_text(out_dir / "config.json", config.dump(2) + "\n");
  std::fprintf(stderr,
               "ctquant_make_checkpoint: %s: %zu tensor(s) (%zu FP8 weights), %llu parameters, "
               "%llu bytes of tensor data in %zu shard(s)\n",
               out_dir.string().c_str(), total_tensors, fp8_weights.size(),
               static_cast<unsigned long long>(total_params),
               static_cast<unsigned long long>(total_bytes), shards.size());
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Write a synthetic safetensors checkpoint from a layout manifest (benchmarks)"};
  app.add_option("MANIFEST", options.manifest, "Layout manifest (JSON: config, tensors)")
      ->required();
  app.add_option("OUTPUT_DIR", options.output, "Checkpoint directory to create")->required();
  app.add_option("--seed", options.seed, "Seed of the values")->capture_default_str();
  app.add_option("--layers", options.layers,
                 "Number of layers: replicate layers.K.* tensors cyclically (default: as listed)");
  app.add_option("--only-layers", options.only_layers,
                 "Keep only the tensors of these layers, e.g. 0,3 (no embeddings, no head)");
  app.add_option("--shard-size", options.shard_size,
                 "Split into shards of at most BYTES of tensor data, with an index (default: "
                 "one model.safetensors)");
  app.add_option("--threads", options.threads, "Generator threads")->capture_default_str();
  app.add_flag("--force", options.force, "Replace OUTPUT_DIR if it exists");
  app.add_option("--fp8", options.fp8,
                 "Write the layout's linear weights as FP8: block (128 x 128 F32 "
                 "weight_scale_inv, quant_method fp8) or channel (compressed-tensors, "
                 "weight_scale [R, 1])");
  CLI11_PARSE(app, argc, argv);
  try {
    run(options);
  } catch (const ctquant::Error& e) {
    std::fprintf(stderr, "ctquant_make_checkpoint: error: %s\n", e.what());
    return ctquant::exit_status(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctquant_make_checkpoint: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
