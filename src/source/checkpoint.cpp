#include "ctquant/source/checkpoint.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/source/hf_cache.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "util/input_file.hpp"

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

// Problems of one phase, reported together (a user fixes them in one go).
class Problems {
 public:
  void add(std::string message) { messages_.push_back(std::move(message)); }
  bool empty() const { return messages_.empty(); }
  // Throws Error{kBadInput} listing the problems (the first kMaxListed).
  void throw_if_any() const {
    if (messages_.empty()) return;
    constexpr std::size_t kMaxListed = 20;
    std::string text;
    for (std::size_t i = 0; i < messages_.size() && i < kMaxListed; ++i) {
      if (i > 0) text += '\n';
      text += messages_[i];
    }
    if (messages_.size() > kMaxListed) {
      text += fmt::format("\n... and {} more problem(s) of the same kind",
                          messages_.size() - kMaxListed);
    }
    throw bad_input(text);
  }

 private:
  std::vector<std::string> messages_;
};

json read_json_file(const fs::path& path, const std::string& label, bool reject_duplicate_keys) {
  const std::string text = detail::read_input_file(path, label, detail::kMaxJsonFileBytes);
  return detail::parse_json_file_text(text, label, reject_duplicate_keys);
}

// Index weight_map file names must be plain names of files in the
// checkpoint directory: no directory part, no "..", not absolute.
bool is_plain_file_name(const std::string& name) {
  const fs::path p(name);
  return !name.empty() && !p.is_absolute() && !p.has_parent_path() && name != "." && name != ".." &&
         name.find('\0') == std::string::npos;
}

// What a directory entry that is not a regular file is, for messages.
std::string directory_entry_kind(const fs::directory_entry& item) {
  std::error_code ec;
  const fs::file_status own = item.symlink_status(ec);
  if (fs::is_symlink(own)) return "a symbolic link whose target is missing or not a regular file";
  if (fs::is_directory(own)) return "a directory";
  return "a special file (FIFO, socket or device)";
}

// When `name` is a shard's (NAME-0000i-of-0000N.safetensors with N > 1): the
// names of the other shards of its set (same NAME, same digit widths) that
// dir does not hold. Empty for any other name or a complete set.
std::vector<std::string> missing_sibling_shards(const std::string& name, const fs::path& dir) {
  static const std::regex kShard(R"((.+)-(\d+)-of-(\d+)\.safetensors)");
  std::smatch match;
  std::vector<std::string> missing;
  if (!std::regex_match(name, match, kShard) || match[3].length() > 6) return missing;
  const int n = std::stoi(match[3].str());
  const int width = static_cast<int>(match[2].length());
  for (int i = 1; i <= n; ++i) {
    const std::string sibling = fmt::format("{}-{:0{}d}-of-{}.safetensors", match[1].str(), i,
                                            width, match[3].str());
    std::error_code ec;
    if (sibling != name && !fs::exists(dir / sibling, ec)) missing.push_back(sibling);
  }
  return missing;
}

// Refuses one file of a sharded checkpoint given as INPUT (Error{kUsage}):
// its name is a shard's (NAME-0000i-of-0000N.safetensors with N > 1), or the
// index beside it lists it. A file the index does not list (a consolidated
// copy beside the shards) is a checkpoint of its own.
void refuse_shard_of_directory(const fs::path& file, const fs::path& dir) {
  const std::string name = file.filename().string();
  const auto why = [&]() -> std::string {
    static const std::regex kShard(R"((.+)-(\d+)-of-(\d+)\.safetensors)");
    std::smatch match;
    if (std::regex_match(name, match, kShard)) {
      const std::string n = match[3].str();
      const auto first = n.find_first_not_of('0');
      if (first != std::string::npos && (n.size() - first > 1 || n[first] > '1')) {
        return fmt::format("its name says it is shard {} of {}", match[2].str(), n);
      }
    }
    const fs::path index = dir / kIndexFileName;
    std::error_code ec;
    if (!fs::is_regular_file(index, ec)) return {};
    json parsed;
    try {
      parsed = read_json_file(index, kIndexFileName, /*reject_duplicate_keys=*/false);
    } catch (const Error&) {
      return fmt::format("{} sits beside it", kIndexFileName);
    }
    const json* map = parsed.is_object() && parsed.contains("weight_map")
                          ? &parsed["weight_map"] : nullptr;
    if (map == nullptr || !map->is_object()) {
      return fmt::format("{} sits beside it", kIndexFileName);
    }
    for (const auto& [tensor, shard] : map->items()) {
      if (shard.is_string() && shard.get_ref<const std::string&>() == name) {
        return fmt::format("{} beside it lists it as a shard (tensor '{}')", kIndexFileName,
                           tensor);
      }
    }
    return {};
  }();
  if (why.empty()) return;
  const std::vector<std::string> missing = missing_sibling_shards(name, dir);
  if (!missing.empty() && !fs::exists(dir / kIndexFileName)) {
    throw usage_error(fmt::format(
        "{}: one file of a sharded checkpoint ({}); quantizing it alone would write part of the "
        "model, and {} lacks the other shards ({}): give the directory that holds every shard "
        "and {} as INPUT",
        file.string(), why, dir.string(), join(missing, 4), kIndexFileName));
  }
  throw usage_error(fmt::format(
      "{}: one file of a sharded checkpoint ({}); quantizing it alone would write part of the "
      "model: give the directory as INPUT instead: {}",
      file.string(), why, dir.string()));
}

// A symbolic link at path must resolve inside dir (or the Hugging Face
// cache's blob store of the snapshot dir is) unless follow_links_outside,
// as list_checkpoint_files() requires of the files of a directory.
void check_link_inside(const fs::path& path, const fs::path& dir, bool follow_links_outside) {
  std::error_code ec;
  if (follow_links_outside || !fs::is_symlink(fs::symlink_status(path, ec))) return;
  const fs::path root = fs::canonical(dir, ec);
  const fs::path target = fs::canonical(path, ec);
  const std::optional<fs::path> blob_store = ec ? std::nullopt : hf_snapshot_blob_store(root);
  if (!ec && (detail::path_is_within(target, root) ||
              (blob_store && detail::path_is_within(target, *blob_store)))) {
    return;
  }
  throw bad_input(fmt::format(
      "{}: is a symbolic link to {}, outside the checkpoint directory {}; ctquant reads only "
      "files inside INPUT's directory unless --follow-symlinks is given",
      path.string(), ec ? std::string("a missing file") : target.string(), dir.string()));
}

// Why a directory without a .safetensors file cannot be read, and, when it
// holds PyTorch weights (pytorch_model*.bin, *.pt, *.pth), how to convert
// them: transformers' save_pretrained writes safetensors.
std::string no_safetensors_message(const fs::path& dir, const std::vector<std::string>& files) {
  std::vector<std::string> pickles;
  for (const std::string& name : files) {
    if (name.ends_with(".bin") || name.ends_with(".pt") || name.ends_with(".pth")) {
      pickles.push_back(name);
    }
  }
  if (pickles.empty()) {
    return fmt::format("{}: no .safetensors file in the directory", dir.string());
  }
  std::string base = dir.string();
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return fmt::format(
      "{}: no .safetensors file in the directory, only PyTorch weights ({}), which ctquant does "
      "not read (a pickle runs code when it is loaded); convert them to safetensors first, e.g. "
      "python3 -c \"from transformers import AutoModelForCausalLM as M; "
      "M.from_pretrained('{}', torch_dtype='auto').save_pretrained('{}-safetensors')\" "
      "(save_pretrained writes model.safetensors shards and config.json), then quantize that "
      "directory",
      dir.string(), join(pickles, 3), base, base);
}

}  // namespace

std::vector<std::string> index_omission_lines(const Checkpoint& checkpoint) {
  constexpr std::size_t kNamed = 5;
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < checkpoint.unindexed.size();) {
    const std::string& file = checkpoint.unindexed[i].first;
    std::size_t end = i;
    std::string names;
    while (end < checkpoint.unindexed.size() && checkpoint.unindexed[end].first == file) {
      if (end - i < kNamed) {
        names += fmt::format("{}'{}'", end == i ? "" : ", ", checkpoint.unindexed[end].second);
      }
      ++end;
    }
    if (end - i > kNamed) names += fmt::format(" ... and {} more", end - i - kNamed);
    lines.push_back(fmt::format(
        "{}: incomplete: weight_map omits {} tensor(s) that the listed shard {} holds ({}); "
        "vLLM reads every tensor of a listed shard, so they are part of the model: planned "
        "like any other tensor and listed in OUTPUT's index",
        kIndexFileName, end - i, file, names));
    i = end;
  }
  return lines;
}

bool is_safetensors_name(std::string_view name) {
  return name.size() > 12 && name.ends_with(".safetensors");
}

// The regular files of a checkpoint directory, sorted. A symbolic link is
// followed when it resolves to a regular file inside the directory, or inside
// the blob store of the Hugging Face cache snapshot the directory is; one
// that resolves to a regular file elsewhere is refused (a downloaded
// checkpoint must not make ctquant read or copy, say, ~/.ssh/id_rsa) unless
// follow_links_outside. Directories, devices, FIFOs, sockets and dangling
// links are ignored, except under the name of a config, index or shard: those
// must not be skipped as if absent (a dangling link into a download cache).
std::vector<std::string> list_checkpoint_files(const fs::path& dir, bool follow_links_outside,
                                               std::vector<std::string>& skipped) {
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  if (ec) throw io_error(fmt::format("{}: cannot resolve: {}", dir.string(), ec.message()));
  const std::optional<fs::path> blob_store = hf_snapshot_blob_store(root);
  std::vector<std::string> files;
  Problems problems;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const fs::directory_entry& item = *it;
    const std::string name = item.path().filename().string();
    // A ctquant output's manifest lists that directory's files: it is not
    // part of the checkpoint, and an output made from it gets its own.
    if (name == kManifestFileName) continue;
    std::error_code type_ec;
    if (!item.is_regular_file(type_ec)) {  // follows links
      if (name == kConfigFileName || name == kIndexFileName || is_safetensors_name(name)) {
        problems.add(fmt::format("{}: {} is not a regular file: it is {}", dir.string(), name,
                                 directory_entry_kind(item)));
      } else {
        skipped.push_back(fmt::format("{} ({})", name, directory_entry_kind(item)));
      }
      continue;
    }
    if (item.is_symlink(type_ec) && !follow_links_outside) {
      std::error_code link_ec;
      const fs::path target = fs::canonical(item.path(), link_ec);
      const bool inside = !link_ec && (detail::path_is_within(target, root) ||
                                       (blob_store && detail::path_is_within(target, *blob_store)));
      if (!inside) {
        problems.add(fmt::format(
            "{}: is a symbolic link to {}, outside the checkpoint directory {}{}; ctquant reads "
            "only files inside INPUT (or, for a Hugging Face cache snapshot, inside its blob "
            "store) unless --follow-symlinks is given (or copy the checkpoint with cp -rL)",
            name, link_ec ? fs::read_symlink(item.path(), link_ec).string() : target.string(),
            dir.string(),
            blob_store ? fmt::format(" and its cache's blob store {}", blob_store->string()) : ""));
        continue;
      }
    }
    files.push_back(name);
  }
  if (ec) throw io_error(fmt::format("{}: cannot list directory: {}", dir.string(), ec.message()));
  problems.throw_if_any();
  std::sort(files.begin(), files.end());
  std::sort(skipped.begin(), skipped.end());
  return files;
}

Checkpoint open_checkpoint(const fs::path& input, const OpenOptions& options) {
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
    refuse_shard_of_directory(input, ckpt.root);
    shard_names.push_back(input.filename().string());
    // The model's config.json beside the file: the architecture and the
    // flags the module roles are read from (a draft's defaults).
    const fs::path config = ckpt.root / kConfigFileName;
    std::error_code config_ec;
    if (fs::is_regular_file(config, config_ec)) {  // follows links
      check_link_inside(config, ckpt.root, options.follow_links_outside);
      ckpt.config = read_json_file(config, kConfigFileName, /*reject_duplicate_keys=*/true);
      if (!ckpt.config->is_object()) {
        throw bad_input(fmt::format("{}: is a JSON {}, expected an object", config.string(),
                                    ckpt.config->type_name()));
      }
      ckpt.config_beside_file = true;
    }
  } else if (fs::is_directory(status)) {
    ckpt.root = input;
    const std::vector<std::string> files =
        list_checkpoint_files(input, options.follow_links_outside, ckpt.skipped_entries);
    const auto listed = [&](const std::string& name) {
      return std::binary_search(files.begin(), files.end(), name);
    };
    std::vector<std::string> safetensors_files;
    for (const std::string& name : files) {
      if (is_safetensors_name(name)) safetensors_files.push_back(name);
    }

    if (listed(kIndexFileName)) {
      ckpt.has_index = true;
      const std::string label = kIndexFileName;
      ckpt.index = read_json_file(input / kIndexFileName, label, /*reject_duplicate_keys=*/true);
      if (!ckpt.index.is_object() || !ckpt.index.contains("weight_map") ||
          !ckpt.index["weight_map"].is_object()) {
        throw bad_input(fmt::format("{}: expected an object with a \"weight_map\" object", label));
      }
      std::set<std::string> names;
      Problems problems;
      // Missing shard files, each with the number of tensors mapped to it and
      // the first of them: reported together, one line per file.
      std::map<std::string, std::pair<std::size_t, std::string>> missing;
      for (auto it = ckpt.index["weight_map"].begin(); it != ckpt.index["weight_map"].end(); ++it) {
        if (!it->is_string()) {
          problems.add(fmt::format("{}: weight_map entry '{}' is {}, expected a file name", label,
                                   it.key(), it->type_name()));
          continue;
        }
        const std::string& file = it->get_ref<const std::string&>();
        if (!is_plain_file_name(file)) {
          problems.add(
              fmt::format("{}: weight_map entry '{}' names file '{}', which is not a plain "
                          "file name inside the checkpoint directory (no directory part, "
                          "no '..', not absolute)",
                          label, it.key(), file));
        } else if (!listed(file)) {
          auto& [count, first_tensor] = missing[file];
          if (count++ == 0) first_tensor = it.key();
        } else {
          names.insert(file);
        }
      }
      for (const auto& [file, what] : missing) {
        problems.add(fmt::format(
            "{}: weight_map names file '{}' for {} tensor(s) (first '{}'), which does not "
            "exist in {}; every shard the index names is part of the model (section 1 of the "
            "format spec, docs/format.md)",
            label, file, what.first, what.second, input.string()));
      }
      problems.throw_if_any();
      if (names.empty()) throw bad_input(fmt::format("{}: weight_map is empty", label));
      shard_names.assign(names.begin(), names.end());
    } else if (safetensors_files.size() == 1) {
      // A lone file named as one shard of several is part of a model.
      if (const auto missing = missing_sibling_shards(safetensors_files[0], input);
          !missing.empty()) {
        throw bad_input(fmt::format(
            "{}: holds only '{}', whose name says it is one shard of {}, and no {}: the other "
            "shards ({}) are missing, so quantizing it would write part of the model; copy "
            "every shard and the index into the directory",
            input.string(), safetensors_files[0], missing.size() + 1, kIndexFileName,
            join(missing, 4)));
      }
      shard_names = safetensors_files;
    } else if (safetensors_files.empty()) {
      throw bad_input(no_safetensors_message(input, files));
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
        (ckpt.has_index && is_safetensors_name(name) ? ckpt.unlisted_files : ckpt.other_files)
            .push_back(name);
      }
    }
    if (listed(kConfigFileName)) {
      // A repeated key is refused: Python's json keeps the last one and
      // other readers may not, and the output config.json (the input's with
      // quantization_config set) would carry only one of them. verify
      // reads config.json with the same reader (src/verify/side.cpp).
      ckpt.config = read_json_file(input / kConfigFileName, kConfigFileName,
                                   /*reject_duplicate_keys=*/true);
      if (!ckpt.config->is_object()) {
        throw bad_input(fmt::format("{}: is a JSON {}, expected an object", kConfigFileName,
                                    ckpt.config->type_name()));
      }
    }
  } else {
    throw bad_input(fmt::format("{}: not a regular file or directory", input.string()));
  }

  // Every shard's header, each problem reported. The shards share one
  // bounded set of descriptors, so any number of shards can be opened.
  {
    Problems problems;
    const auto descriptors = std::make_shared<FdPool>(FdPool::default_capacity());
    for (const std::string& name : shard_names) {
      try {
        ckpt.shards.emplace_back(ckpt.root / name, name, descriptors);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kBadInput) throw;
        problems.add(e.what());
      }
    }
    problems.throw_if_any();
  }

  Problems problems;
  for (std::size_t s = 0; s < ckpt.shards.size(); ++s) {
    const auto& header = ckpt.shards[s].header();
    for (std::size_t e = 0; e < header.tensors.size(); ++e) {
      poll_cancel();
      const std::string& name = header.tensors[e].name;
      if (ckpt.has_index && !ckpt.index["weight_map"].contains(name)) {
        // Still part of the model: vLLM reads every tensor of each file the
        // index lists (weight_utils.py: filter_duplicate_safetensors_files
        // keeps the listed files, safetensors_weights_iterator yields all
        // of a file's keys). The index was incomplete; callers say so.
        ckpt.unindexed.emplace_back(ckpt.shards[s].label(), name);
      }
      const auto [it, inserted] = ckpt.tensors.emplace(name, TensorLocation{s, e});
      if (!inserted) {
        problems.add(
            fmt::format("{}: tensor '{}' is also in {} (a tensor may be in one shard "
                        "only)",
                        ckpt.shards[s].label(), name, ckpt.shards[it->second.shard].label()));
      }
    }
  }
  problems.throw_if_any();
  if (ckpt.has_index) {
    const json& weight_map = ckpt.index["weight_map"];
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      const auto found = ckpt.tensors.find(it.key());
      const std::string& file = it->get_ref<const std::string&>();
      if (found == ckpt.tensors.end() || ckpt.shards[found->second.shard].label() != file) {
        problems.add(
            fmt::format("{}: weight_map lists tensor '{}' in '{}', but that file does "
                        "not hold it",
                        kIndexFileName, it.key(), file));
      }
    }
  }
  problems.throw_if_any();
  return ckpt;
}

}  // namespace ctquant
