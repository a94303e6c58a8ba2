// Private to src/transform/: writing a rewritten source checkpoint
// (transform/transform.hpp, StagedSource), shared by the rows that write
// one (rotate.cpp) and by the rewrite of a per-element row into a staged
// source (transform.cpp).
#pragma once

#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant::detail {

// Writes `value` as an indented JSON file at path (which must not exist).
// Throws Error{kIo} / Error{kNoSpace}.
void write_json_file(const std::filesystem::path& path, const nlohmann::json& value);

// Creates the shard `path` laid out as `laid` and writes its header. Without
// data (a dry run plans from the headers alone) the data is left a hole,
// the file is closed and false returned; with data, true (the caller writes
// each tensor, then closes the file).
bool open_staged_shard(const std::filesystem::path& path, const ShardLayout& laid, bool with_data,
                       std::optional<OutputFile>& file);

// The files of a rewritten source beside its shards: config.json (`config`),
// the index (`index`, when the checkpoint has one) and the other files of
// `checkpoint`, hard-linked where the filesystem allows (a cache
// snapshot's links resolved first) and copied otherwise.
void write_staged_files(const Checkpoint& checkpoint, const std::filesystem::path& dir,
                        const nlohmann::json& config, const nlohmann::json* index);

}  // namespace ctquant::detail
