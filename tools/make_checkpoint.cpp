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
//   ctquant_make_checkpoint MANIFEST OUTPUT_DIR [--seed N] [--layers N]
//                           [--shard-size BYTES] [--threads N] [--force]
//
// --layers N rebuilds the `layers.K.*` tensors for N layers, layer K taking
// the shapes of layer K mod (the manifest's layer count), and updates
// num_hidden_layers (and layer_types / sliding_windows when they list one
// entry per layer). --shard-size splits the tensors, in name order, into
// model-0000X-of-0000N.safetensors files of at most that many data bytes (a
// larger tensor gets a file of its own) plus model.safetensors.index.json, as
// Hugging Face writers do; the default is one model.safetensors.
#include <algorithm>
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
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ctquant/util/checked.hpp"
#include "ctquant/format/dtype.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/format/safetensors_writer.hpp"

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
  std::uint64_t shard_size = 0;  // 0: one model.safetensors
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  bool force = false;
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

// One unit of work: elements [first, first + count) of one tensor.
struct Job {
  const ctquant::OutputFile* file = nullptr;
  const Tensor* tensor = nullptr;
  std::uint64_t file_offset = 0;  // of the tensor's first byte
  std::uint64_t chunk = 0;
  std::uint64_t count = 0;
};

void write_text(const fs::path& path, const std::string& text) {
  ctquant::OutputFile file(path);
  file.write_at(0, std::as_bytes(std::span(text)));
}

void run(const Options& options) {
  json config;
  std::vector<Tensor> tensors = read_manifest(options, config);
  if (options.layers > 0) tensors = scale_layers(tensors, options.layers, config);
  std::vector<Shard> shards = split_shards(std::move(tensors), options.shard_size);

  const fs::path out_dir = options.output;
  if (fs::exists(out_dir)) {
    if (!options.force) {
      throw ctquant::usage_error(
          fmt::format("{}: exists (pass --force to replace it)", out_dir.string()));
    }
    fs::remove_all(out_dir);
  }
  fs::create_directories(out_dir);

  std::vector<std::unique_ptr<ctquant::OutputFile>> files;
  std::vector<Job> jobs;
  std::uint64_t total_bytes = 0;
  std::uint64_t total_params = 0;
  for (const Shard& shard : shards) {
    auto file = std::make_unique<ctquant::OutputFile>(out_dir / shard.file_name);
    file->reserve(shard.layout.file_size);
    file->write_at(0, std::as_bytes(std::span(shard.layout.header)));
    for (std::size_t i = 0; i < shard.tensors.size(); ++i) {
      const Tensor& t = shard.tensors[i];
      total_bytes += t.byte_size;
      total_params += t.numel;
      const std::uint64_t base = shard.layout.data_start + shard.layout.offsets[i];
      for (std::uint64_t first = 0, chunk = 0; first < t.numel; first += kChunkElements, ++chunk) {
        jobs.push_back(Job{file.get(), &t, base, chunk, std::min(kChunkElements, t.numel - first)});
      }
    }
    files.push_back(std::move(file));
  }

  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    std::vector<double> values;
    std::vector<std::byte> bytes;
    for (std::size_t i = next.fetch_add(1); i < jobs.size(); i = next.fetch_add(1)) {
      const Job& job = jobs[i];
      try {
        values.assign(job.count, 0.0);
        if (is_float(job.tensor->dtype)) {
          generate(options.seed, fnv1a(job.tensor->name), job.chunk, values);
        }
        encode(job.tensor->dtype, values, bytes);
        const std::uint64_t element_bytes = job.tensor->byte_size / job.tensor->numel;
        job.file->write_at(job.file_offset + job.chunk * kChunkElements * element_bytes, bytes);
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
               "ctquant_make_checkpoint: %s: %zu tensor(s), %llu parameters, %llu bytes "
               "of tensor data in %zu shard(s)\n",
               out_dir.string().c_str(),
               static_cast<std::size_t>(std::count_if(jobs.begin(), jobs.end(),
                                                      [](const Job& j) { return j.chunk == 0; })),
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
  app.add_option("--shard-size", options.shard_size,
                 "Split into shards of at most BYTES of tensor data, with an index (default: "
                 "one model.safetensors)");
  app.add_option("--threads", options.threads, "Generator threads")->capture_default_str();
  app.add_flag("--force", options.force, "Replace OUTPUT_DIR if it exists");
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
