#include "ctquant/checkpoint.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/error.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

const TensorEntry* Checkpoint::find(const std::string& name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &entry(it->second);
}

std::uint64_t Checkpoint::total_tensor_bytes() const {
  std::uint64_t total = 0;
  for (const auto& shard : shards) total += shard.header().data_size;
  return total;
}

std::uint64_t Checkpoint::total_file_bytes() const {
  std::uint64_t total = 0;
  for (const auto& shard : shards) total += shard.file_size();
  for (const auto& name : other_files) {
    std::error_code ec;
    const auto size = fs::file_size(root / name, ec);
    if (!ec) total += size;
  }
  return total;
}

namespace {

std::string read_text_file(const fs::path& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error(fmt::format("{}: cannot open for reading", label));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw io_error(fmt::format("{}: read failed", label));
  return text.str();
}

json read_json_file(const fs::path& path, const std::string& label) {
  const std::string text = read_text_file(path, label);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw bad_input(fmt::format("{}: not valid JSON ({})", label, e.what()));
  }
}

// Index weight_map file names must be plain names of files in the
// checkpoint directory: no directory part, no "..", not absolute.
void check_shard_name(const std::string& name, const std::string& tensor) {
  const fs::path p(name);
  if (name.empty() || p.is_absolute() || p.has_parent_path() || name == "." || name == "..") {
    throw bad_input(fmt::format("{}: weight_map entry '{}' names file '{}', which is not a plain "
                                "file name inside the checkpoint directory",
                                kIndexFileName, tensor, name));
  }
}

bool is_safetensors_name(const std::string& name) {
  return name.size() > 12 && name.ends_with(".safetensors");
}

}  // namespace

Checkpoint open_checkpoint(const fs::path& input) {
  Checkpoint ckpt;
  std::error_code ec;
  const auto status = fs::status(input, ec);
  if (ec || !fs::exists(status)) {
    throw io_error(fmt::format("{}: no such file or directory", input.string()));
  }

  std::vector<std::string> shard_names;
  if (fs::is_regular_file(status)) {
    if (!is_safetensors_name(input.filename().string())) {
      throw bad_input(fmt::format("{}: expected a checkpoint directory or a .safetensors file",
                                  input.string()));
    }
    ckpt.single_file = true;
    ckpt.root = input.parent_path().empty() ? fs::path(".") : input.parent_path();
    shard_names.push_back(input.filename().string());
  } else if (fs::is_directory(status)) {
    ckpt.root = input;
    std::vector<std::string> safetensors_files;
    std::vector<std::string> files;
    for (const auto& item : fs::directory_iterator(input, ec)) {
      const std::string name = item.path().filename().string();
      std::error_code type_ec;
      if (!item.is_regular_file(type_ec)) {
        // Subdirectories and special files are not copied, but a config,
        // index or shard that is not a regular file (a dangling link into a
        // download cache) must not be skipped as if it were absent.
        if (name == kConfigFileName || name == kIndexFileName || is_safetensors_name(name)) {
          throw bad_input(fmt::format("{}: {} is not a regular file (a dangling symbolic link?)",
                                      input.string(), name));
        }
        continue;
      }
      files.push_back(name);
      if (is_safetensors_name(name)) safetensors_files.push_back(name);
    }
    if (ec) throw io_error(fmt::format("{}: cannot list directory: {}", input.string(), ec.message()));
    std::sort(files.begin(), files.end());
    std::sort(safetensors_files.begin(), safetensors_files.end());

    const bool has_index = std::find(files.begin(), files.end(), kIndexFileName) != files.end();
    if (has_index) {
      ckpt.has_index = true;
      const std::string label = kIndexFileName;
      ckpt.index = read_json_file(input / kIndexFileName, label);
      if (!ckpt.index.is_object() || !ckpt.index.contains("weight_map") ||
          !ckpt.index["weight_map"].is_object()) {
        throw bad_input(fmt::format("{}: expected an object with a \"weight_map\" object", label));
      }
      std::set<std::string> names;
      // Missing shard files, each with the number of tensors mapped to it and
      // the first of them: reported together, one line per file.
      std::map<std::string, std::pair<std::size_t, std::string>> missing;
      for (auto it = ckpt.index["weight_map"].begin(); it != ckpt.index["weight_map"].end(); ++it) {
        if (!it->is_string()) {
          throw bad_input(fmt::format("{}: weight_map entry '{}' is {}, expected a file name",
                                      label, it.key(), it->dump()));
        }
        const std::string& file = it->get_ref<const std::string&>();
        check_shard_name(file, it.key());
        if (std::find(files.begin(), files.end(), file) == files.end()) {
          auto& [count, first_tensor] = missing[file];
          if (count++ == 0) first_tensor = it.key();
        }
        names.insert(file);
      }
      if (!missing.empty()) {
        std::string message;
        for (const auto& [file, what] : missing) {
          message += fmt::format(
              "{}{}: weight_map names file '{}' for {} tensor(s) (first '{}'), which does not "
              "exist in {}",
              message.empty() ? "" : "\n", label, file, what.first, what.second, input.string());
        }
        throw bad_input(message);
      }
      if (names.empty()) throw bad_input(fmt::format("{}: weight_map is empty", label));
      shard_names.assign(names.begin(), names.end());
    } else if (safetensors_files.size() == 1) {
      shard_names = safetensors_files;
    } else if (safetensors_files.empty()) {
      throw bad_input(fmt::format("{}: no .safetensors file in the directory", input.string()));
    } else {
      throw bad_input(
          fmt::format("{}: {} .safetensors files but no {} to say which are shards of "
                      "the checkpoint (to quantize one file alone, give that file as "
                      "INPUT)",
                      input.string(), safetensors_files.size(), kIndexFileName));
    }

    for (const std::string& name : files) {
      const bool is_shard =
          std::find(shard_names.begin(), shard_names.end(), name) != shard_names.end();
      if (!is_shard && name != kIndexFileName && name != kConfigFileName) {
        ckpt.other_files.push_back(name);
      }
    }
    if (std::find(files.begin(), files.end(), kConfigFileName) != files.end()) {
      ckpt.config = read_json_file(input / kConfigFileName, kConfigFileName);
      if (!ckpt.config->is_object()) {
        throw bad_input(fmt::format("{}: is a JSON {}, expected an object", kConfigFileName,
                                    ckpt.config->type_name()));
      }
    }
  } else {
    throw bad_input(fmt::format("{}: not a regular file or directory", input.string()));
  }

  for (const std::string& name : shard_names) {
    ckpt.shards.emplace_back(ckpt.root / name, name);
  }
  for (std::size_t s = 0; s < ckpt.shards.size(); ++s) {
    const auto& header = ckpt.shards[s].header();
    for (std::size_t e = 0; e < header.tensors.size(); ++e) {
      const std::string& name = header.tensors[e].name;
      const auto [it, inserted] = ckpt.tensors.emplace(name, TensorLocation{s, e});
      if (!inserted) {
        throw bad_input(fmt::format("{}: tensor '{}' is also in {} (a tensor may be in one shard "
                                    "only)",
                                    ckpt.shards[s].label(), name,
                                    ckpt.shards[it->second.shard].label()));
      }
    }
  }
  if (ckpt.has_index) {
    const json& weight_map = ckpt.index["weight_map"];
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      const auto found = ckpt.tensors.find(it.key());
      const std::string& file = it->get_ref<const std::string&>();
      if (found == ckpt.tensors.end() || ckpt.shards[found->second.shard].label() != file) {
        throw bad_input(fmt::format("{}: weight_map lists tensor '{}' in '{}', but that file does "
                                    "not hold it",
                                    kIndexFileName, it.key(), file));
      }
    }
    for (const SafetensorsFile& shard : ckpt.shards) {
      for (const TensorEntry& t : shard.header().tensors) {
        if (!weight_map.contains(t.name)) {
          throw bad_input(fmt::format("{}: tensor '{}' is not listed in {}'s weight_map",
                                      shard.label(), t.name, kIndexFileName));
        }
      }
    }
  }
  return ckpt;
}

}  // namespace ctquant
