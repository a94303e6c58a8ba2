#include "verify/side.hpp"

#include <algorithm>
#include <cstring>
#include <set>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "ctquant/plan/quant_config.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"

namespace ctquant::detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// config.json or the index of one side, through the JSON reader and its
// bounds (size, nesting, repeated keys); what is wrong with it is a
// difference verify reports, not an error that stops it.
void parse_json_file(const fs::path& path, const std::string& label, std::optional<json>& out,
                     std::string& error) {
  try {
    out = read_json_file(path, label);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kBadInput) throw;
    error = e.what();
  }
}

}  // namespace

std::string read_text(const fs::path& path, const std::string& label) {
  return read_input_file(path, label, kMaxWholeFileBytes);
}


PlanOptions plan_options_of_output(const Side& output, std::string_view command) {
  // what: "config.json: <the problem>" (the JSON reader's message, which
  // names the file) or the problem of its quantization_config.
  const auto fail = [&](const std::string& what) {
    return bad_input(
        fmt::format("{} {}; {} needs the quantization_config quantize writes "
                    "(section 5 of the format spec, docs/format.md)",
                    output.label, what, command));
  };
  if (!output.config_error.empty()) throw fail(output.config_error);
  const auto fail_config = [&](const std::string& what) {
    return fail(fmt::format("{}: {}", kConfigFileName, what));
  };
  if (!output.config || !output.config->is_object()) throw fail_config("missing");
  const auto qc = output.config->find("quantization_config");
  if (qc == output.config->end() || !qc->is_object()) throw fail_config("no quantization_config");
  PlanOptions options;
  try {
    options = plan_options_from_config(*qc, "quantization_config");
  } catch (const Error& e) {
    throw fail_config(e.what());
  }
  // --transform: the rewrite quantize applied (transform/transform.hpp),
  // derived again from the source by whoever plans it.
  const auto transform = output.config->find("ctquant_transform");
  if (transform != output.config->end()) {
    if (!transform->is_object() || !transform->contains("transform") ||
        !(*transform)["transform"].is_string()) {
      throw fail("ctquant_transform is not an object with a string 'transform'");
    }
    options.transform = (*transform)["transform"].get<std::string>();
  }
  return options;
}

void restrict_to_index(Side& side) {
  if (!side.index || !side.index->is_object() || !side.index->contains("weight_map") ||
      !(*side.index)["weight_map"].is_object()) {
    return;
  }
  const json& weight_map = (*side.index)["weight_map"];
  std::set<std::string> listed;
  for (const auto& [tensor, file] : weight_map.items()) {
    if (file.is_string()) listed.insert(file.get<std::string>());
  }
  std::vector<SafetensorsFile> kept;
  for (SafetensorsFile& shard : side.shards) {
    if (listed.contains(shard.label())) kept.push_back(std::move(shard));
  }
  side.shards = std::move(kept);
  side.where.clear();
  for (std::size_t s = 0; s < side.shards.size(); ++s) {
    for (const TensorEntry& t : side.shards[s].header().tensors) {
      if (weight_map.contains(t.name)) side.where[t.name].push_back(s);
    }
  }
}

Side open_side(const fs::path& path, const std::string& label) {
  Side side;
  side.label = label;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw io_error(fmt::format("{} {}: no such file or directory", label, path.string()));
  }
  std::vector<std::string> shard_names;
  if (fs::is_regular_file(status)) {
    if (!is_safetensors_name(path.filename().string())) {
      throw bad_input(fmt::format("{} {}: expected a checkpoint directory or a .safetensors file",
                                  label, path.string()));
    }
    side.root = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    shard_names.push_back(path.filename().string());
  } else if (fs::is_directory(status)) {
    side.root = path;
    std::vector<std::string> files;
    std::vector<std::string> skipped;  // not part of either checkpoint
    try {
      // Read-only: links out of the directory (a cache snapshot) are followed.
      files = list_checkpoint_files(path, /*follow_links_outside=*/true, skipped);
    } catch (const Error& e) {
      // Its messages start with the directory: say which side it is.
      throw Error(e.kind(), fmt::format("{} {}", label, e.what()));
    }
    for (const auto& name : files) {
      if (is_safetensors_name(name)) {
        shard_names.push_back(name);
      } else if (name == kIndexFileName) {
        side.has_index = true;
        parse_json_file(path / name, name, side.index, side.index_error);
      } else if (name == kConfigFileName) {
        side.has_config = true;
        parse_json_file(path / name, name, side.config, side.config_error);
      } else {
        side.other_files.push_back(name);
      }
    }
  } else {
    throw bad_input(fmt::format("{} {}: not a regular file or directory", label, path.string()));
  }
  if (shard_names.empty()) {
    throw bad_input(fmt::format("{} {}: no .safetensors file", label, path.string()));
  }
  // One bounded set of descriptors for the side's shards (any number of them).
  const auto descriptors = std::make_shared<FdPool>(FdPool::default_capacity());
  for (const auto& name : shard_names) {
    try {
      side.shards.emplace_back(side.root / name, name, descriptors);
    } catch (const Error& e) {
      // Say which of the two checkpoints holds the bad file.
      throw Error(e.kind(), fmt::format("{} {}: {}", label, side.root.string(), e.what()));
    }
  }
  for (std::size_t s = 0; s < side.shards.size(); ++s) {
    for (const TensorEntry& t : side.shards[s].header().tensors) side.where[t.name].push_back(s);
  }
  return side;
}

std::string short_json(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) {
    text.resize(77);
    text += "...";
  }
  return text;
}

std::string index_string(std::uint64_t flat, const std::vector<std::uint64_t>& shape) {
  if (shape.empty()) return "[]";
  std::vector<std::uint64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::uint64_t n = shape[d] == 0 ? 1 : shape[d];
    idx[d] = flat % n;
    flat /= n;
  }
  return shape_string(idx);
}

unsigned verify_threads(const VerifyOptions& options) {
  return options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
}

void merge_findings(VerifyReport& report, VerifyReport&& part) {
  for (VerifyItem& item : part.differences) report.differences.push_back(std::move(item));
  for (VerifyItem& item : part.notes) report.notes.push_back(std::move(item));
  report.tensors_compared += part.tensors_compared;
  report.tensors_identical += part.tensors_identical;
}

void read_part(const Ref& t, std::uint64_t offset, std::span<std::byte> out) {
  t.file->read(t.entry->begin + offset, out);
}

std::uint32_t load_bits(DType dtype, const std::byte* p) {
  if (dtype_bits(dtype) == 16) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::vector<std::uint32_t> as_words(std::span<const std::byte> bytes) {
  std::vector<std::uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), words.size() * 4);
  return words;
}

std::vector<std::byte> read_whole(const Ref& t) {
  std::vector<std::byte> bytes(t.entry->byte_size());
  read_part(t, 0, bytes);
  return bytes;
}



}  // namespace ctquant::detail
