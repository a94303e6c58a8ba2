// The output manifest: the size and SHA-256 of every file of an output
// directory, in one small JSON file inside it (kManifestFileName,
// `ctquant-manifest.json`), so that a copy, an upload or a download can be
// checked with `ctquant verify OUTPUT --manifest` (or `sha256sum`).
//
// Loaders do not read it: transformers and vLLM open config.json, the index
// and the `*.safetensors` files it names (or that a glob finds), and copy
// nothing else into the model (docs/report.md#manifest cites the code). The
// manifest holds no timestamps, paths or host names: the same input and
// options give the same manifest, byte for byte, on every run and thread
// count.
//
// Format (docs/report.md#manifest, docs/manifest.schema.json):
//   {"manifest_version": 1, "algorithm": "sha256",
//    "files": [{"name": "config.json", "size": 1234, "sha256": "<64 hex>"}, ...]}
// files sorted by name; every regular file of the directory except the
// manifest itself. Written with sorted keys, two-space indent and a final
// newline.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

inline constexpr int kManifestVersion = 1;
// The first line of a Git LFS pointer file (https://git-lfs.com/spec/v1),
// which a clone without LFS leaves in place of a large file.
inline constexpr std::string_view kLfsPointerHeader = "version https://git-lfs.github.com/spec/v1";

struct ManifestEntry {
  std::string name;    // file name inside the directory (no directory part)
  std::uint64_t size = 0;  // bytes
  std::string sha256;  // 64 lowercase hex digits, as sha256sum prints
};

// Hashes files while they are written, so that the manifest costs little
// more than the writing, on the threads that write them: no thread of its
// own. The writer reports each byte range it has written
// (ExecuteOptions::on_written), with the bytes when it wrote them from
// memory; the reporting thread then hashes the file's longest written prefix
// as far as it reaches (SHA-256 is one sequential stream per file): the
// reported bytes themselves while they are still in the core's cache when
// they are next in line, other written ranges (copies made by
// copy_file_range, ranges written before the bytes ahead of them) read back
// from the page cache. One thread hashes a file at a time; a thread that
// reports a range of a file another thread is hashing returns at once, and
// the thread hashing the file takes that range too before it lets go. The
// executor writes each shard roughly front to back, so the digests are
// nearly complete when the last write returns. finish(), called once the
// files are complete, hashes whatever is left on the calling thread and
// returns the digests: a range that was never reported costs time, never
// correctness. Each byte must be written once (the executor's files are).
class WrittenFilesHasher {
 public:
  // The files to hash, by name inside dir, with their final sizes (names
  // and sizes of `expected`; digests ignored). cancel may be null.
  WrittenFilesHasher(std::filesystem::path dir, const std::vector<ManifestEntry>& expected,
                     const std::atomic<bool>* cancel);
  ~WrittenFilesHasher();
  WrittenFilesHasher(const WrittenFilesHasher&) = delete;
  WrittenFilesHasher& operator=(const WrittenFilesHasher&) = delete;

  // [offset, offset + length) of file (a path whose name is one of the
  // expected files; others are ignored) is written; bytes, when not empty,
  // are those length bytes (read only during the call). Hashes what the
  // file's written prefix now holds unless another thread is hashing the
  // file. Thread-safe. Throws Error{kIo} when a range cannot be read back,
  // Error{kInterrupted} on cancel.
  void written(const std::filesystem::path& file, std::uint64_t offset, std::uint64_t length,
               std::span<const std::byte> bytes = {});

  // Hashes the rest of every file and returns the digests, sorted by name.
  // Call it once, when no written() call is running. Throws Error{kIo} when
  // a file cannot be read or is shorter than expected, Error{kInterrupted}
  // on cancel.
  std::vector<ManifestEntry> finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The manifest document for files (sorted by the caller).
nlohmann::json manifest_json(const std::vector<ManifestEntry>& files);

// The size of the manifest of files (names and sizes; digests are always 64
// hex digits, so they need not be known yet), for the expected output size.
std::uint64_t manifest_bytes(std::vector<ManifestEntry> files);

// Writes manifest_json(files) to dir/kManifestFileName (created, not
// replaced) and, when fsync, flushes it and dir. Returns the manifest's own
// entry (its name, size and SHA-256). Throws Error{kIo} or Error{kNoSpace}.
ManifestEntry write_manifest(const std::filesystem::path& dir, const std::vector<ManifestEntry>& files,
                    bool fsync);

// Reads and validates dir/kManifestFileName. Throws Error{kBadInput} when it
// is missing ("no manifest"), is not valid JSON, or breaks the format above
// (naming the field).
std::vector<ManifestEntry> read_manifest(const std::filesystem::path& dir);

// One disagreement between a directory and its manifest.
struct ManifestProblem {
  // "missing" (listed, absent), "extra" (present, not listed, or not a
  // regular file), "size" (size differs: truncated or extended), "sha256"
  // (same size, other bytes), "lfs_pointer" (a Git LFS pointer file stands
  // in for the listed file).
  std::string kind;
  std::string file;
  std::string message;
};

struct ManifestCheck {
  std::filesystem::path dir;
  std::size_t files_listed = 0;  // entries of the manifest
  std::size_t files_ok = 0;      // listed files whose size and sha256 match
  std::vector<ManifestProblem> problems;  // by file name
  bool ok() const { return problems.empty(); }
};

// Re-hashes every file the manifest of dir lists (threads files at a time)
// and lists the problems. Throws what read_manifest throws, and Error{kIo}
// when dir cannot be listed or a file cannot be read.
ManifestCheck check_manifest(const std::filesystem::path& dir, unsigned threads);

// "verify --manifest: OUTPUT <dir>\n" then one line per problem and the result.
std::string render_manifest_check_text(const ManifestCheck& check);
// {"mode": "manifest", "output", "same", "summary": {files_listed, files_ok,
// differences}, "differences": [{kind, file, message}]} (docs/report.md).
nlohmann::json manifest_check_json(const ManifestCheck& check);

}  // namespace ctquant
