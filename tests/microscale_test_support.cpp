#include "microscale_test_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"
#include "test_support.hpp"

namespace ctquant::test {

namespace fs = std::filesystem;

std::vector<std::byte> hex16(const std::string& words) {
  std::istringstream in(words);
  std::vector<std::byte> out;
  std::string w;
  while (in >> w) {
    const auto v = static_cast<std::uint16_t>(std::stoul(w, nullptr, 16));
    out.push_back(std::byte{static_cast<std::uint8_t>(v & 0xFFu)});
    out.push_back(std::byte{static_cast<std::uint8_t>(v >> 8)});
  }
  return out;
}

std::vector<std::byte> hex8(const std::string& bytes) {
  std::istringstream in(bytes);
  std::vector<std::byte> out;
  std::string b;
  while (in >> b) out.push_back(std::byte{static_cast<std::uint8_t>(std::stoul(b, nullptr, 16))});
  return out;
}

std::string to_hex(const std::vector<std::byte>& bytes) {
  std::string out;
  for (const std::byte b : bytes) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{:02x}", std::to_integer<unsigned>(b));
  }
  return out;
}

KernelPath reference_path(const SchemeFamily& family) { return {"reference", family.quantize_ref}; }

KernelPath fast_path(const SchemeFamily& family) { return {"fast", family.quantize}; }

std::vector<KernelPath> all_paths(const SchemeFamily& family, microscale::Format format) {
  std::vector<KernelPath> out = {reference_path(family), fast_path(family)};
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    const microscale::ChunkKernel kernel = microscale::kernel_at(level, format);
    if (kernel == nullptr) continue;
    out.push_back(
        {level.name, [kernel](const QuantArgs&, const KernelIo& io) { return kernel(io); }});
  }
  return out;
}

KernelOutput run_family(const SchemeFamily& family, const QuantArgs& args, DType dtype,
                        std::uint64_t rows, std::uint64_t cols,
                        const std::vector<std::byte>& weight, float tensor_amax, bool fast,
                        std::uint64_t chunk_rows) {
  return run_family(family, args, dtype, rows, cols, weight, tensor_amax,
                    fast ? fast_path(family) : reference_path(family), chunk_rows);
}

KernelOutput run_family(const SchemeFamily& family, const QuantArgs& args, DType dtype,
                        std::uint64_t rows, std::uint64_t cols,
                        const std::vector<std::byte>& weight, float tensor_amax,
                        const KernelPath& path, std::uint64_t chunk_rows) {
  const std::vector<OutputTensorSpec> specs = family.outputs(args, dtype, rows, cols);
  KernelOutput out;
  std::vector<const OutputTensorSpec*> row_specs;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].fill == OutputTensorSpec::Fill::kRows) {
      out.rows_outputs.emplace_back(specs[i].byte_size());
      row_specs.push_back(&specs[i]);
    } else {
      out.whole.push_back(family.whole_tensor(args, dtype, rows, cols, tensor_amax, i));
    }
  }
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(dtype) / 8);
  if (chunk_rows == 0) chunk_rows = rows;
  for (std::uint64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const std::uint64_t n = std::min(chunk_rows, rows - r0);
    std::vector<std::byte> scratch(family.scratch_bytes(args, n, cols));
    KernelIo io;
    io.dtype = dtype;
    io.n_rows = n;
    io.n_cols = cols;
    io.row_begin = r0;
    io.weight = weight.data() + r0 * cols * esize;
    io.tensor_amax = tensor_amax;
    for (std::size_t i = 0; i < row_specs.size(); ++i) {
      io.out[i] = out.rows_outputs[i].data() + row_specs[i]->bytes_before(r0);
    }
    io.scratch = scratch;
    const auto bad = path.run(args, io);
    if (bad) {
      out.bad = r0 * cols + *bad;
      return out;
    }
  }
  return out;
}

std::string first_difference(const KernelOutput& actual, const KernelOutput& expected) {
  if (actual.bad != expected.bad) {
    return fmt::format("first non-finite element {}, expected {}",
                       actual.bad ? std::to_string(*actual.bad) : "none",
                       expected.bad ? std::to_string(*expected.bad) : "none");
  }
  if (expected.bad) return "";  // the outputs are unspecified
  const auto compare = [](const std::vector<std::vector<std::byte>>& a,
                          const std::vector<std::vector<std::byte>>& b,
                          const char* what) -> std::string {
    if (a.size() != b.size())
      return fmt::format("{} {} outputs, expected {}", what, a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      if (a[k].size() != b[k].size()) {
        return fmt::format("{} output {}: {} bytes, expected {}", what, k, a[k].size(),
                           b[k].size());
      }
      for (std::size_t i = 0; i < a[k].size(); ++i) {
        if (a[k][i] != b[k][i]) {
          return fmt::format("{} output {} byte {}: {:02x}, expected {:02x}", what, k, i,
                             std::to_integer<unsigned>(a[k][i]),
                             std::to_integer<unsigned>(b[k][i]));
        }
      }
    }
    return "";
  };
  if (std::string d = compare(actual.rows_outputs, expected.rows_outputs, "row"); !d.empty()) {
    return d;
  }
  return compare(actual.whole, expected.whole, "whole");
}

float weight_amax(DType dtype, const std::vector<std::byte>& weight) {
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(dtype) / 8);
  float amax = 0.0f;
  for (std::size_t i = 0; i < weight.size() / esize; ++i) {
    amax = std::max(amax, std::fabs(load_as_float(dtype, weight.data() + i * esize)));
  }
  return amax;
}

CheckpointTensors read_checkpoint_tensors(const fs::path& dir) {
  CheckpointTensors out;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    const SafetensorsFile file(f, f.filename().string());
    for (const TensorEntry& entry : file.header().tensors) {
      Tensor t{entry.name, entry.dtype, entry.shape, std::vector<std::byte>(entry.byte_size())};
      file.read(entry.begin, t.data);
      if (!out.tensors.emplace(entry.name, std::move(t)).second) {
        throw std::runtime_error("tensor " + entry.name + " in two shards of " + dir.string());
      }
      out.file_of.emplace(entry.name, f.filename().string());
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> input_weight_map(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    // nlohmann::ordered_json keeps the file's key order, as Python's json does.
    std::istringstream in(read_file(index));
    const auto j = nlohmann::ordered_json::parse(in);
    for (const auto& [name, shard] : j.at("weight_map").items()) {
      out.emplace_back(name, shard.get<std::string>());
    }
    return out;
  }
  const SafetensorsFile file(dir / "model.safetensors", "model.safetensors");
  for (const TensorEntry& entry : file.header().tensors) {
    out.emplace_back(entry.name, "model.safetensors");
  }
  return out;
}

void split_moe_experts(std::map<std::string, Tensor>& tensors) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : tensors) {
    const bool gate_up = name.find("gate_up_proj") != std::string::npos;
    const bool down = name.find("down_proj") != std::string::npos;
    if (t.shape.size() != 3 || gate_up == down) {
      out.emplace(name, std::move(t));
      continue;
    }
    const std::string key = gate_up ? "gate_up_proj" : "down_proj";
    const std::vector<std::string> parts = gate_up
                                               ? std::vector<std::string>{"gate_proj", "up_proj"}
                                               : std::vector<std::string>{"down_proj"};
    const std::uint64_t experts = t.shape[0];
    const std::uint64_t part_rows = t.shape[1] / parts.size();
    const std::uint64_t cols = t.shape[2];
    const std::size_t esize = static_cast<std::size_t>(dtype_bits(t.dtype) / 8);
    const std::size_t part_bytes = part_rows * cols * esize;
    for (std::uint64_t e = 0; e < experts; ++e) {
      for (std::size_t p = 0; p < parts.size(); ++p) {
        std::string split = name;
        split.replace(split.find(key), key.size(), fmt::format("{}.{}", e, parts[p]));
        if (!split.ends_with(".weight")) split += ".weight";
        const std::byte* begin = t.data.data() + (e * parts.size() + p) * part_bytes;
        out.emplace(split, Tensor{split,
                                  t.dtype,
                                  {part_rows, cols},
                                  std::vector<std::byte>(begin, begin + part_bytes)});
      }
    }
  }
  tensors = std::move(out);
}

GoldenCheck check_golden_modules(const SchemeFamily& family, const QuantArgs& args,
                                 const std::map<std::string, Tensor>& input,
                                 const CheckpointTensors& expected,
                                 const std::map<std::string, float>& amax_of,
                                 const KernelPath& path, std::uint64_t chunk_rows) {
  GoldenCheck out;
  const std::string scale_suffix = ".weight_scale";
  for (const auto& [name, tensor] : expected.tensors) {
    if (name.ends_with(scale_suffix)) {
      out.modules.push_back(name.substr(0, name.size() - scale_suffix.size()));
    }
  }
  for (const std::string& module : out.modules) {
    const auto w = input.find(module + ".weight");
    if (w == input.end() || w->second.shape.size() != 2) {
      out.differences.push_back(module + ": no 2-D input weight");
      continue;
    }
    const Tensor& weight = w->second;
    const std::uint64_t rows = weight.shape[0];
    const std::uint64_t cols = weight.shape[1];
    const auto amax = amax_of.find(module);
    const float tensor_amax = amax == amax_of.end() ? 0.0f : amax->second;
    const KernelOutput result = run_family(family, args, weight.dtype, rows, cols, weight.data,
                                           tensor_amax, path, chunk_rows);
    if (result.bad) {
      out.differences.push_back(fmt::format("{}: non-finite element {}", module, *result.bad));
      continue;
    }
    std::size_t row_index = 0;
    std::size_t whole_index = 0;
    for (const OutputTensorSpec& spec : family.outputs(args, weight.dtype, rows, cols)) {
      const std::vector<std::byte>& actual = spec.fill == OutputTensorSpec::Fill::kRows
                                                 ? result.rows_outputs[row_index++]
                                                 : result.whole[whole_index++];
      const std::string name = module + "." + spec.suffix;
      const auto e = expected.tensors.find(name);
      if (e == expected.tensors.end()) {
        out.differences.push_back(name + ": not in expected");
        continue;
      }
      if (e->second.dtype != spec.dtype || e->second.shape != spec.shape) {
        out.differences.push_back(fmt::format(
            "{}: {} {} written, expected {} {}", name, dtype_tag(spec.dtype),
            shape_string(spec.shape), dtype_tag(e->second.dtype), shape_string(e->second.shape)));
        continue;
      }
      if (actual != e->second.data) {
        std::size_t at = 0;
        while (at < actual.size() && actual[at] == e->second.data[at]) ++at;
        out.differences.push_back(fmt::format(
            "{}: byte {} is {:02x}, expected {:02x}", name, at,
            at < actual.size() ? std::to_integer<unsigned>(actual[at]) : 0u,
            at < e->second.data.size() ? std::to_integer<unsigned>(e->second.data[at]) : 0u));
      }
    }
  }
  return out;
}

}  // namespace ctquant::test
