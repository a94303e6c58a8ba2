// The Hugging Face hub cache: where `ctquant quantize ORG/NAME OUTPUT` finds
// a checkpoint, and which symbolic links of a cache snapshot are trusted.
//
// huggingface_hub stores a repository as
//   CACHE/models--ORG--NAME/refs/REVISION    a commit hash (refs/main, ...)
//   CACHE/models--ORG--NAME/snapshots/HASH/  the files of that commit, each
//                                            a symbolic link into ../../blobs/
//   CACHE/models--ORG--NAME/blobs/           the file contents
// (huggingface_hub `file_download.py`, "Understand caching" in its docs).
// Nothing here touches the network: a repository that is not in the cache is
// an error naming where ctquant looked.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace ctquant {

// The hub cache directory, as huggingface_hub computes it from the
// environment: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE (its older name),
// else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub ($HOME).
std::filesystem::path hf_hub_cache_dir();

// True when text is a Hugging Face repository id of the form ORG/NAME: two
// parts of letters, digits, '-', '_' and '.', each starting and ending with a
// letter, digit or '_', no "--" or "..", at most 96 characters each
// (huggingface_hub `validate_repo_id`).
bool looks_like_repo_id(std::string_view text);

// The snapshot directory of repo_id at revision in the cache at cache_dir.
// revision is a branch or tag (read from refs/REVISION) or a commit hash (40
// hexadecimal digits, a snapshots/ directory of that name). Throws
// Error{kIo} when the repository, the ref or the snapshot is not in the
// cache, naming the path looked for and saying that ctquant never downloads;
// Error{kUsage} for a revision that is not a plain ref name (empty, absolute,
// with a ".." component).
std::filesystem::path resolve_hf_snapshot(std::string_view repo_id, std::string_view revision,
                                          const std::filesystem::path& cache_dir);

// INPUT as given when it exists (a path wins over a repository id of the
// same spelling); otherwise, when it looks like ORG/NAME, its snapshot in
// hf_hub_cache_dir() at revision (default "main"). A revision given with an
// INPUT that is a path is a usage error (Error{kUsage}). Throws as
// resolve_hf_snapshot() does; an INPUT that neither exists nor looks like a
// repository id is returned unchanged (opening it reports it missing).
std::filesystem::path resolve_checkpoint_input(const std::filesystem::path& input,
                                               const std::optional<std::string>& revision);

// When dir (absolute, symbolic links resolved) is a snapshot of a hub cache
// (`.../models--ORG--NAME/snapshots/HASH`) whose `blobs` directory is a
// directory itself and not a symbolic link: that blob store, whose files the
// snapshot's links may point to without --follow-symlinks. Otherwise nullopt.
std::optional<std::filesystem::path> hf_snapshot_blob_store(const std::filesystem::path& dir);

}  // namespace ctquant
