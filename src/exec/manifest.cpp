#include "ctquant/exec/manifest.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "ctquant/util/sha256.hpp"
#include "util/input_file.hpp"
#include "util/ordered_parallel.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A manifest lists a few dozen files; the bound keeps a hostile one small.
constexpr std::uint64_t kMaxManifestBytes = 16u << 20;

// What a directory entry that is not a regular file is, for messages.
std::string entry_kind(const fs::directory_entry& item) {
  std::error_code ec;
  if (item.is_symlink(ec) && !fs::exists(item.path(), ec)) return "a dangling symbolic link";
  if (item.is_directory(ec)) return "a directory";
  return "a special file (FIFO, socket or device)";
}

struct Listing {
  std::vector<std::string> regular;      // sorted, without the manifest
  std::map<std::string, std::string> other;  // name -> what it is
};

Listing list_directory(const fs::path& dir) {
  Listing listing;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == kManifestFileName) continue;
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) {
      listing.regular.push_back(name);
    } else {
      listing.other.emplace(name, entry_kind(*it));
    }
  }
  if (ec) throw io_error(fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
  std::sort(listing.regular.begin(), listing.regular.end());
  return listing;
}

bool is_hex_digest(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// Whether the file starts with the Git LFS pointer header. Reads at most the
// header's length.
bool is_lfs_pointer(const fs::path& path, const std::string& label) {
  std::uint64_t size = 0;
  const detail::UniqueFd fd = detail::open_input_file(path, label, size);
  if (size < kLfsPointerHeader.size()) return false;
  std::string head(kLfsPointerHeader.size(), '\0');
  std::size_t got = 0;
  while (got < head.size()) {
    const ssize_t n = ::pread(fd.get(), head.data() + got, head.size() - got,
                              static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got == head.size() && head == kLfsPointerHeader;
}

}  // namespace

// ---- hashing while writing ----

namespace {

// Bytes read back from the page cache at a time: small enough to stay in
// the core's cache between the copy and the hash.
constexpr std::size_t kReadBackBytes = 256u << 10;

[[noreturn]] void throw_hash_interrupted() {
  throw Error(ErrorKind::kInterrupted, "interrupted by a signal before OUTPUT was complete");
}

}  // namespace

struct WrittenFilesHasher::State {
  struct File {
    std::string name;
    std::uint64_t size = 0;
    std::map<std::uint64_t, std::uint64_t> pending;  // written ranges past `ready`: begin -> end
    std::uint64_t ready = 0;   // bytes [0, ready) are written
    std::uint64_t hashed = 0;  // bytes [0, hashed) are hashed
    bool busy = false;         // a thread is hashing this file
    Sha256 sha;
  };

  fs::path dir;
  const std::atomic<bool>* cancel = nullptr;
  std::vector<File> files;
  std::map<std::string, std::size_t> by_name;
  std::mutex mutex;  // guards every File's fields but sha, which only the busy thread uses
  std::vector<std::unique_ptr<std::byte[]>> spare_buffers;  // read-back buffers not in use

  bool cancelled() const { return cancel != nullptr && cancel->load(); }

  // With mutex held: records that [offset, end) of f is written and moves
  // the written prefix over every range that now touches it.
  static void add_range(File& f, std::uint64_t offset, std::uint64_t end) {
    std::uint64_t& pending_end = f.pending[offset];
    pending_end = std::max(pending_end, end);
    for (auto r = f.pending.begin(); r != f.pending.end() && r->first <= f.ready;
         r = f.pending.erase(r)) {
      f.ready = std::max(f.ready, r->second);
    }
  }

  // Hashes f from f.hashed to f.ready, and on while other threads move
  // f.ready; f.busy is set by the caller and cleared here, also on error.
  // bytes are [offset, offset + bytes.size()) of f, hashed from memory when
  // the hash reaches offset. lock holds mutex on entry and exit; it is
  // released while hashing.
  void hash_ready(File& f, std::unique_lock<std::mutex>& lock, std::uint64_t offset,
                  std::span<const std::byte> bytes) {
    struct Release {
      State& state;
      File& file;
      std::unique_lock<std::mutex>& lock;
      std::unique_ptr<std::byte[]> buffer;
      detail::UniqueFd fd;
      ~Release() {
        if (!lock.owns_lock()) lock.lock();
        file.busy = false;
        if (buffer) state.spare_buffers.push_back(std::move(buffer));
      }
    } release{*this, f, lock, nullptr, detail::UniqueFd()};
    while (f.hashed < f.ready) {
      const std::uint64_t from = f.hashed;
      const std::uint64_t to = f.ready;
      const bool from_memory = !bytes.empty() && offset <= from && from < offset + bytes.size();
      if (!from_memory && !release.buffer) {
        if (spare_buffers.empty()) {
          release.buffer = std::make_unique_for_overwrite<std::byte[]>(kReadBackBytes);
        } else {
          release.buffer = std::move(spare_buffers.back());
          spare_buffers.pop_back();
        }
      }
      lock.unlock();
      if (cancelled()) throw_hash_interrupted();
      std::uint64_t done = from;
      if (from_memory) {
        const std::uint64_t n = std::min(to, offset + bytes.size()) - from;
        sha_update(f, bytes.subspan(from - offset, n));
        done += n;
      } else {
        // Up to where the reported bytes start, if they are ahead.
        const std::uint64_t stop = !bytes.empty() && offset > from ? std::min(to, offset) : to;
        done = read_back(f, release.fd, release.buffer.get(), from, stop);
      }
      lock.lock();
      f.hashed = done;
    }
  }

  static void sha_update(File& f, std::span<const std::byte> bytes) { f.sha.update(bytes); }

  // Hashes [from, to) of f read back from the page cache (fd opened on first
  // use); returns `to`.
  std::uint64_t read_back(File& f, detail::UniqueFd& fd, std::byte* buffer, std::uint64_t from,
                          std::uint64_t to) {
    const fs::path path = dir / f.name;
    if (fd.get() < 0) {
      fd = detail::UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0) {
        throw io_error(
            fmt::format("{}: cannot open to hash: {}", path.string(), std::strerror(errno)));
      }
    }
    while (from < to) {
      if (cancelled()) throw_hash_interrupted();
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(kReadBackBytes, to - from));
      const ssize_t n = ::pread(fd.get(), buffer, want, static_cast<off_t>(from));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw io_error(fmt::format("{}: cannot read back at byte {} to hash: {}", path.string(),
                                   from, n == 0 ? "unexpected end of file" : std::strerror(errno)));
      }
      f.sha.update(std::span(buffer, static_cast<std::size_t>(n)));
      from += static_cast<std::uint64_t>(n);
    }
    return to;
  }
};

WrittenFilesHasher::WrittenFilesHasher(fs::path dir, const std::vector<ManifestEntry>& expected,
                                       const std::atomic<bool>* cancel)
    : state_(std::make_unique<State>()) {
  state_->dir = std::move(dir);
  state_->cancel = cancel;
  state_->files.resize(expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    state_->files[i].name = expected[i].name;
    state_->files[i].size = expected[i].size;
    state_->by_name.emplace(expected[i].name, i);
  }
}

WrittenFilesHasher::~WrittenFilesHasher() = default;

void WrittenFilesHasher::written(const fs::path& file, std::uint64_t offset, std::uint64_t length,
                                 std::span<const std::byte> bytes) {
  if (length == 0) return;
  State& s = *state_;
  const auto it = s.by_name.find(file.filename().string());
  if (it == s.by_name.end()) return;
  State::File& f = s.files[it->second];
  std::unique_lock lock(s.mutex);
  State::add_range(f, offset, offset + length);
  if (f.busy || f.hashed >= f.ready) return;  // the thread hashing f takes the range
  f.busy = true;
  s.hash_ready(f, lock, offset, bytes.first(std::min<std::size_t>(bytes.size(), length)));
}

std::vector<ManifestEntry> WrittenFilesHasher::finish() {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  for (State::File& f : s.files) {
    // The file is complete now: whatever was not reported is written too.
    f.ready = f.size;
    f.pending.clear();
    f.busy = true;
    s.hash_ready(f, lock, 0, {});
  }
  lock.unlock();
  if (s.cancelled()) throw_hash_interrupted();
  std::vector<ManifestEntry> entries;
  for (State::File& f : s.files) {
    // The file must end where the plan said it would.
    struct stat st {};
    if (f.hashed > 0 && ::stat((s.dir / f.name).c_str(), &st) == 0 &&
        static_cast<std::uint64_t>(st.st_size) != f.size) {
      throw io_error(fmt::format("{}: {} bytes, expected {}", (s.dir / f.name).string(),
                                 st.st_size, f.size));
    }
    entries.push_back(ManifestEntry{f.name, f.hashed, f.sha.hex_digest()});
  }
  std::sort(entries.begin(), entries.end(),
            [](const ManifestEntry& a, const ManifestEntry& b) { return a.name < b.name; });
  return entries;
}

json manifest_json(const std::vector<ManifestEntry>& files) {
  json list = json::array();
  for (const ManifestEntry& f : files) {
    list.push_back(json{{"name", f.name}, {"size", f.size}, {"sha256", f.sha256}});
  }
  return json{{"manifest_version", kManifestVersion}, {"algorithm", "sha256"}, {"files", list}};
}

std::uint64_t manifest_bytes(std::vector<ManifestEntry> files) {
  std::sort(files.begin(), files.end(),
            [](const ManifestEntry& a, const ManifestEntry& b) { return a.name < b.name; });
  for (ManifestEntry& f : files) f.sha256.assign(64, '0');
  return manifest_json(files).dump(2).size() + 1;  // the final newline
}

ManifestEntry write_manifest(const fs::path& dir, const std::vector<ManifestEntry>& files,
                             bool fsync) {
  const std::string text = manifest_json(files).dump(2) + "\n";
  const ManifestEntry entry{kManifestFileName, text.size(), sha256_hex(text)};
  OutputFile file(dir / kManifestFileName);
  file.write_at(0, std::as_bytes(std::span(text)));
  if (!fsync) return entry;
  file.sync_and_close();
  // The manifest's directory entry, so that it survives a power loss with the rest.
  fsync_directory(dir);
  return entry;
}

std::vector<ManifestEntry> read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestFileName;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    throw bad_input(fmt::format(
        "{}: no {} in this directory; only directories written by ctquant quantize carry one "
        "(compare with a golden checkpoint instead: ctquant verify OUTPUT GOLDEN)",
        dir.string(), kManifestFileName));
  }
  const std::string label = path.string();
  const json doc = detail::parse_json_file_text(
      detail::read_input_file(path, label, kMaxManifestBytes), label, true);
  auto fail = [&](const std::string& what) {
    return bad_input(fmt::format("{}: {} (docs/report.md#manifest)", label, what));
  };
  if (!doc.is_object()) throw fail("not a JSON object");
  if (!doc.contains("manifest_version") || doc["manifest_version"] != kManifestVersion) {
    throw fail(fmt::format("manifest_version is {}, expected {}",
                           doc.value("manifest_version", json()).dump(), kManifestVersion));
  }
  if (!doc.contains("algorithm") || doc["algorithm"] != "sha256") {
    throw fail("algorithm must be \"sha256\"");
  }
  if (!doc.contains("files") || !doc["files"].is_array()) throw fail("files must be an array");
  std::vector<ManifestEntry> entries;
  for (std::size_t i = 0; i < doc["files"].size(); ++i) {
    const json& f = doc["files"][i];
    const std::string where = fmt::format("files[{}]", i);
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
        !is_plain_file_name(f["name"].get<std::string>())) {
      throw fail(where + ".name must be a file name without a directory part");
    }
    if (!f.contains("size") || !f["size"].is_number_unsigned()) {
      throw fail(where + ".size must be a whole number of bytes");
    }
    if (!f.contains("sha256") || !f["sha256"].is_string() ||
        !is_hex_digest(f["sha256"].get<std::string>())) {
      throw fail(where + ".sha256 must be 64 lowercase hex digits");
    }
    entries.push_back(ManifestEntry{f["name"].get<std::string>(), f["size"].get<std::uint64_t>(),
                                    f["sha256"].get<std::string>()});
    if (entries.size() > 1 && !(entries[entries.size() - 2].name < entries.back().name)) {
      throw fail(where + ".name: files must be sorted by name, each listed once");
    }
  }
  return entries;
}

ManifestCheck check_manifest(const fs::path& dir, unsigned threads) {
  const std::vector<ManifestEntry> listed = read_manifest(dir);
  const Listing listing = list_directory(dir);
  ManifestCheck check;
  check.dir = dir;
  check.files_listed = listed.size();
  // The listed files checked in parallel and counted in manifest order, then
  // extras; sorted by name at the end.
  const auto check_listed = [&](std::size_t i, unsigned) -> std::optional<ManifestProblem> {
    const ManifestEntry& want = listed[i];
    const fs::path path = dir / want.name;
    if (std::binary_search(listing.regular.begin(), listing.regular.end(), want.name)) {
      if (is_lfs_pointer(path, path.string())) {
        std::error_code ec;
        return ManifestProblem{
            "lfs_pointer", want.name,
            fmt::format("is a Git LFS pointer file ({} bytes), not the file of {} bytes: fetch "
                        "it with git lfs pull",
                        fs::file_size(path, ec), want.size)};
      }
      const FileDigest got = sha256_file(path, path.string());
      if (got.size != want.size) {
        return ManifestProblem{
            "size", want.name,
            fmt::format("{} bytes, the manifest says {} ({})", got.size, want.size,
                        got.size < want.size ? "truncated" : "longer")};
      }
      if (got.sha256 != want.sha256) {
        return ManifestProblem{
            "sha256", want.name,
            fmt::format("sha256 {}, the manifest says {}", got.sha256, want.sha256)};
      }
      return std::nullopt;
    }
    const auto other = listing.other.find(want.name);
    return ManifestProblem{
        "missing", want.name,
        other == listing.other.end()
            ? fmt::format("missing ({} bytes listed)", want.size)
            : fmt::format("is {}, not the regular file of {} bytes listed", other->second,
                          want.size)};
  };
  detail::ordered_parallel<std::optional<ManifestProblem>>(
      listed.size(), threads, check_listed,
      [&](std::size_t, std::optional<ManifestProblem> problem) {
        if (problem) {
          check.problems.push_back(std::move(*problem));
        } else {
          ++check.files_ok;
        }
      });
  std::set<std::string> listed_names;
  for (const ManifestEntry& e : listed) listed_names.insert(e.name);
  auto is_listed = [&](const std::string& name) { return listed_names.count(name) > 0; };
  for (const std::string& name : listing.regular) {
    if (!is_listed(name)) {
      check.problems.push_back(ManifestProblem{"extra", name, "not listed in the manifest"});
    }
  }
  for (const auto& [name, kind] : listing.other) {
    if (!is_listed(name)) {
      check.problems.push_back(
          ManifestProblem{"extra", name, fmt::format("{}, not listed in the manifest", kind)});
    }
  }
  std::stable_sort(check.problems.begin(), check.problems.end(),
                   [](const ManifestProblem& a, const ManifestProblem& b) { return a.file < b.file; });
  return check;
}

std::string render_manifest_check_text(const ManifestCheck& check) {
  std::string text = fmt::format("verify --manifest: OUTPUT {}\n", check.dir.string());
  text += fmt::format("files: {} listed, {} match\n", check.files_listed, check.files_ok);
  if (!check.problems.empty()) {
    text += fmt::format("differences ({}):\n", check.problems.size());
    for (const ManifestProblem& p : check.problems) {
      text += fmt::format("  {}  {}: {}\n", p.kind, p.file, p.message);
    }
  }
  text += check.ok() ? std::string("result: SAME\n")
                     : fmt::format("result: DIFFERENT ({} difference{})\n", check.problems.size(),
                                   check.problems.size() == 1 ? "" : "s");
  return text;
}

json manifest_check_json(const ManifestCheck& check) {
  json problems = json::array();
  for (const ManifestProblem& p : check.problems) {
    problems.push_back(json{{"kind", p.kind}, {"file", p.file}, {"message", p.message}});
  }
  return json{{"mode", "manifest"},
              {"output", check.dir.string()},
              {"same", check.ok()},
              {"summary",
               {{"files_listed", check.files_listed},
                {"files_ok", check.files_ok},
                {"differences", check.problems.size()}}},
              {"differences", problems}};
}

}  // namespace ctquant
