// Hand-made checkpoints for the lint, inspect and verify tests.
//
// A FakeLayout lists tensors by name, dtype and shape. write_sparse_checkpoint
// writes real safetensors headers and sizes the files with ftruncate, so the
// data is zeros and costs no disk: enough for everything that reads headers
// only (planning, lint, inspect), even at real model shapes.
// write_random_checkpoint fills 2-D float weights with seeded normal values
// and everything else with zeros, for runs that quantize.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "test_support.hpp"

namespace ctquant::test {

struct FakeSpec {
  std::string name;
  std::vector<std::uint64_t> shape;
  DType dtype = DType::kBF16;
};

inline std::uint64_t fake_numel(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

inline std::uint64_t fake_bytes(const FakeSpec& s) {
  return fake_numel(s.shape) * static_cast<std::uint64_t>(dtype_bits(s.dtype)) / 8;
}

// Writes config.json (when config is an object) next to the shards.
inline void write_config(const std::filesystem::path& dir, const nlohmann::json& config) {
  if (config.is_object()) write_file(dir / "config.json", config.dump(2));
}

// dir/model.safetensors holding specs, zero data, sparse on disk.
inline void write_sparse_checkpoint(const std::filesystem::path& dir,
                                    const std::vector<FakeSpec>& specs,
                                    const nlohmann::json& config = nullptr) {
  std::filesystem::create_directories(dir);
  std::vector<TensorSpec> tensors;
  for (const auto& s : specs)
    tensors.push_back(TensorSpec{s.name, s.dtype, s.shape, fake_bytes(s)});
  const ShardLayout layout = layout_shard(tensors, {{"format", "pt"}});
  const auto path = dir / "model.safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(layout.header.data(), static_cast<std::streamsize>(layout.header.size()));
    if (!out) throw std::runtime_error("cannot write " + path.string());
  }
  if (::truncate(path.c_str(), static_cast<off_t>(layout.file_size)) != 0) {
    throw std::runtime_error("cannot size " + path.string());
  }
  write_config(dir, config);
}

// dir/model.safetensors with seeded values: 2-D BF16/F16/F32 tensors get
// normal values (std 0.02), others zeros.
inline void write_random_checkpoint(const std::filesystem::path& dir,
                                    const std::vector<FakeSpec>& specs,
                                    const nlohmann::json& config = nullptr,
                                    std::uint32_t seed = 1) {
  std::filesystem::create_directories(dir);
  std::vector<FakeTensor> tensors;
  for (const auto& s : specs) {
    if (s.shape.size() == 2 && is_quantizable_float(s.dtype)) {
      tensors.push_back(random_weight(s.name, s.dtype, s.shape[0], s.shape[1], seed++));
    } else {
      tensors.push_back(FakeTensor{s.name, s.dtype, s.shape,
                                   std::vector<std::byte>(fake_bytes(s), std::byte{0})});
    }
  }
  write_safetensors(dir / "model.safetensors", tensors);
  write_config(dir, config);
}

// XORs one byte of a tensor's data in a safetensors file, in place.
inline void xor_tensor_byte(const std::filesystem::path& file, const std::string& tensor,
                            std::uint64_t byte_offset, std::uint8_t mask) {
  std::uint64_t at = 0;
  {
    const SafetensorsFile f(file, file.filename().string());
    const TensorEntry* e = f.header().find(tensor);
    if (e == nullptr || byte_offset >= e->byte_size()) {
      throw std::runtime_error("no byte " + std::to_string(byte_offset) + " in " + tensor);
    }
    at = f.header().data_start + e->begin + byte_offset;
  }
  std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(static_cast<std::uint8_t>(c) ^ mask);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&c, 1);
  if (!io) throw std::runtime_error("cannot patch " + file.string());
}

// Rewrites a safetensors file without the named tensor.
inline void drop_tensor(const std::filesystem::path& file, const std::string& tensor) {
  std::vector<FakeTensor> kept;
  {
    const SafetensorsFile f(file, file.filename().string());
    for (const TensorEntry& e : f.header().tensors) {
      if (e.name == tensor) continue;
      std::vector<std::byte> bytes(e.byte_size());
      f.read(e.begin, bytes);
      kept.push_back(FakeTensor{e.name, e.dtype, e.shape, std::move(bytes)});
    }
  }
  write_safetensors(file, kept);
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(read_file(path));
}

inline void write_json(const std::filesystem::path& path, const nlohmann::json& value) {
  write_file(path, value.dump(2));
}

}  // namespace ctquant::test
