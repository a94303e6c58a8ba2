// An input checkpoint: its safetensors shards, index, config.json and the
// other files of its directory.
//
// open_checkpoint() accepts a checkpoint directory (config.json, one
// `*.safetensors` file or shards listed by `model.safetensors.index.json`,
// other files) or a single `.safetensors` file, validates every shard header
// (section 1 of the format spec) and the index against the shards, and reads
// config.json. It opens files read-only and never writes to them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"

namespace ctquant {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kConfigFileName = "config.json";
// The manifest ctquant writes into every output directory (exec/manifest.hpp):
// the directory's own checksums, never read as part of a checkpoint nor copied.
inline constexpr const char* kManifestFileName = "ctquant-manifest.json";

// Where a tensor lives: shard index and entry index in that shard's header.
struct TensorLocation {
  std::size_t shard = 0;
  std::size_t entry = 0;
};

struct Checkpoint {
  std::filesystem::path root;            // the input directory (a file's parent for a single file)
  bool single_file = false;              // INPUT was a .safetensors file, not a directory
  bool config_beside_file = false;       // single_file, and config.json was read from root
  bool has_index = false;                // model.safetensors.index.json was present
  nlohmann::json index;                  // its content, when has_index
  std::vector<SafetensorsFile> shards;   // sorted by file name
  std::optional<nlohmann::json> config;  // config.json, when present
  std::vector<std::string> other_files;  // regular files to copy unchanged, sorted
  // Entries of the directory that are not read or copied (subdirectories,
  // FIFOs, ...), each "name (what it is)", sorted.
  std::vector<std::string> skipped_entries;
  // Every tensor of every shard (with an index, of every file it lists).
  std::unordered_map<std::string, TensorLocation> tensors;
  // With an index: .safetensors files of the directory it does not list (a
  // consolidated copy beside the shards), sorted. Neither read nor copied.
  std::vector<std::string> unlisted_files;
  // With an index: tensors a listed shard holds that its weight_map omits,
  // as (shard file, tensor), in shard order. They are part of the model
  // (vLLM reads every tensor of each listed file) and in `tensors` like any
  // other; the index was incomplete, which callers report. A tensor the
  // index lists for another shard is an error.
  std::vector<std::pair<std::string, std::string>> unindexed;

  const TensorEntry& entry(const TensorLocation& at) const {
    return shards[at.shard].header().tensors[at.entry];
  }
  const TensorEntry* find(const std::string& name) const;
  std::uint64_t total_tensor_bytes() const;
  std::uint64_t total_file_bytes() const;  // shards plus copied files
};

struct OpenOptions {
  // Read files that symbolic links in the directory point to outside it (and,
  // for a Hugging Face cache snapshot, outside its blob store, whose links
  // are always followed). Off: such a link is refused, so that a downloaded
  // checkpoint cannot make ctquant read or copy a file it was not given
  // (docs/security.md).
  bool follow_links_outside = false;
};

// One line per shard whose tensors the index's weight_map omits
// (Checkpoint::unindexed), naming the shard, how many and the first few, and
// saying they are written and listed in OUTPUT's index; empty when the
// index is complete or absent.
std::vector<std::string> index_omission_lines(const Checkpoint& checkpoint);

// True for a file name ending in ".safetensors" with at least one character
// before it.
bool is_safetensors_name(std::string_view name);

// The regular files of the checkpoint directory dir, sorted by name. A
// symbolic link is followed when it resolves to a regular file inside dir or,
// when dir is a Hugging Face cache snapshot, inside the cache's blob store
// for that repository (hf_snapshot_blob_store), and when it resolves to one
// elsewhere only with follow_links_outside.
// Other entries (subdirectories, devices, FIFOs, sockets, dangling links) are
// appended to skipped as "name (what it is)", sorted, except that under the
// name of a config.json, index or .safetensors file they are refused. The
// manifest (kManifestFileName) is left out. Throws Error{kBadInput} listing
// every refused entry, Error{kIo} when dir cannot be listed.
std::vector<std::string> list_checkpoint_files(const std::filesystem::path& dir,
                                               bool follow_links_outside,
                                               std::vector<std::string>& skipped);

// Opens and validates the checkpoint at input. A single .safetensors file is
// a checkpoint of its own, with the config.json of its directory when there
// is one; a file of a sharded checkpoint (named NAME-0000i-of-0000N with
// N > 1, or listed by the index beside it) is refused with Error{kUsage}
// naming the directory to give instead. Only regular files are read:
// in a directory, a symbolic link is followed when it resolves to a regular
// file inside the directory (or inside the blob store of the Hugging Face
// cache snapshot the directory is), and when it resolves to one elsewhere
// only with options.follow_links_outside (refused otherwise); subdirectories,
// devices and FIFOs are ignored, except that a config.json, index or
// .safetensors entry that is not a regular file (such as a dangling link
// into a download cache) is refused. config.json and the index are read
// only up to 100,000,000 bytes and 128 levels of JSON nesting. Throws
// Error{kBadInput} for a checkpoint that breaks section 1 of the format spec
// (each shard's header; the index naming a missing file, a path outside the
// directory or a tensor its file does not hold, or naming a tensor twice; a
// the same tensor in two shards;
// several safetensors files without an index; a config.json that is not a
// JSON object) or has such entries, listing every problem of the phase at
// once; Error{kIo} when a file cannot be read. With an index, a .safetensors
// file it does not list goes to unlisted_files (not read: vLLM reads only
// the listed files) and a tensor of a listed shard that weight_map omits
// goes to unindexed as well as tensors (callers warn about both): neither
// is an error.
Checkpoint open_checkpoint(const std::filesystem::path& input, const OpenOptions& options = {});

}  // namespace ctquant
