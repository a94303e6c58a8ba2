#include "ctquant/source/hf_cache.hpp"

#include <algorithm>
#include <cstdlib>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxRepoPartChars = 96;
constexpr std::size_t kCommitHashChars = 40;
constexpr std::uint64_t kMaxRefFileBytes = 4096;

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool is_repo_part(std::string_view part) {
  if (part.empty() || part.size() > kMaxRepoPartChars) return false;
  if (!std::all_of(part.begin(), part.end(),
                   [](char c) { return is_word_char(c) || c == '-' || c == '.'; })) {
    return false;
  }
  return is_word_char(part.front()) && is_word_char(part.back());
}

bool is_commit_hash(std::string_view text) {
  return text.size() == kCommitHashChars &&
         std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The cache folder of a model repository: "models--ORG--NAME"
// (huggingface_hub `repo_folder_name`).
std::string repo_folder_name(std::string_view repo_id) {
  std::string name = "models--";
  for (const char c : repo_id) {
    if (c == '/') {
      name += "--";
    } else {
      name += c;
    }
  }
  return name;
}

// Where the cache was looked for, all five places huggingface_hub reads
// (hf_hub_cache_dir), and that ctquant never downloads.
std::string not_cached(std::string_view repo_id, const fs::path& cache_dir,
                       const fs::path& looked_for, const std::string& what) {
  return fmt::format(
      "{}: not a file or directory, and not in the Hugging Face cache: {} ({}); the cache "
      "read is {}, the first of these that is set: $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE, "
      "$HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub (with $HOME); "
      "ctquant never downloads: fetch it first, e.g. `hf download {}`",
      repo_id, what, looked_for.string(), cache_dir.string(), repo_id);
}

}  // namespace

fs::path hf_hub_cache_dir() {
  if (const auto dir = env("HF_HUB_CACHE")) return *dir;
  if (const auto dir = env("HUGGINGFACE_HUB_CACHE")) return *dir;
  if (const auto home = env("HF_HOME")) return fs::path(*home) / "hub";
  if (const auto cache = env("XDG_CACHE_HOME")) return fs::path(*cache) / "huggingface" / "hub";
  const auto home = env("HOME");
  return fs::path(home ? *home : std::string(".")) / ".cache" / "huggingface" / "hub";
}

bool looks_like_repo_id(std::string_view text) {
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos || text.find('/', slash + 1) != std::string_view::npos) {
    return false;
  }
  if (text.find("--") != std::string_view::npos || text.find("..") != std::string_view::npos) {
    return false;
  }
  return is_repo_part(text.substr(0, slash)) && is_repo_part(text.substr(slash + 1));
}

fs::path resolve_hf_snapshot(std::string_view repo_id, std::string_view revision,
                             const fs::path& cache_dir) {
  const fs::path rev(revision);
  const bool plain = !revision.empty() && !rev.is_absolute() &&
                     revision.find('\0') == std::string_view::npos &&
                     std::none_of(rev.begin(), rev.end(), [](const fs::path& part) {
                       return part == ".." || part == "." || part.empty();
                     });
  if (!plain) {
    throw usage_error(fmt::format(
        "--revision '{}': expected a branch or tag name or a commit hash", revision));
  }
  const fs::path repo = cache_dir / repo_folder_name(repo_id);
  std::error_code ec;
  if (!fs::is_directory(repo, ec)) {
    throw io_error(not_cached(repo_id, cache_dir, repo, "no repository folder"));
  }
  std::string commit;
  const fs::path ref = repo / "refs" / rev;
  if (fs::exists(ref, ec)) {
    const std::string label = fmt::format("{} (revision '{}' of {})", ref.string(), revision, repo_id);
    std::string text = detail::read_input_file(ref, label, kMaxRefFileBytes);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
      text.pop_back();
    }
    if (!is_commit_hash(text)) {
      throw bad_input(fmt::format("{}: expected a 40-digit commit hash, found '{}'", label,
                                  text.substr(0, 64)));
    }
    commit = text;
  } else if (is_commit_hash(revision)) {
    commit = std::string(revision);
  } else {
    throw io_error(not_cached(repo_id, cache_dir, ref, fmt::format("no ref '{}'", revision)));
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  if (!fs::is_directory(snapshot, ec)) {
    throw io_error(not_cached(
        repo_id, cache_dir, snapshot,
        fmt::format("revision '{}' is commit {}, whose snapshot is missing", revision, commit)));
  }
  return snapshot;
}

fs::path resolve_checkpoint_input(const fs::path& input, const std::optional<std::string>& revision) {
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(input, ec));
  if (exists || !looks_like_repo_id(input.string())) {
    if (revision) {
      throw usage_error(fmt::format(
          "--revision {}: INPUT {} is a path, not a Hugging Face repository id (ORG/NAME) "
          "to look up in the cache",
          *revision, input.string()));
    }
    return input;
  }
  return resolve_hf_snapshot(input.string(), revision.value_or("main"), hf_hub_cache_dir());
}

std::optional<fs::path> hf_snapshot_blob_store(const fs::path& dir) {
  const fs::path snapshots = dir.parent_path();
  const fs::path repo = snapshots.parent_path();
  if (dir.filename().empty() || snapshots.filename() != "snapshots" ||
      !repo.filename().string().starts_with("models--")) {
    return std::nullopt;
  }
  // The blob store itself must be a directory, not a link to one: a link
  // named blobs could make any directory "the blob store".
  std::error_code ec;
  const fs::path blobs = repo / "blobs";
  if (!fs::is_directory(fs::symlink_status(blobs, ec))) return std::nullopt;
  return blobs;
}

}  // namespace ctquant
