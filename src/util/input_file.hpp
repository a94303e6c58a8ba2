// Private: opening and reading input files defensively.
//
// Every input file ctquant reads goes through open_input_file(): it never
// blocks on a FIFO or a device, and refuses anything that is not a regular
// file once open (fstat on the descriptor, so a path swapped after a check
// cannot slip a device in). Small JSON files (config.json, the index) are read
// whole with a size bound and checked for nesting depth and repeated keys
// before nlohmann/json builds a tree of them (docs/security.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ctquant::detail {

// Largest config.json or index ctquant reads: the bound of a safetensors
// header (section 1 of the format spec, docs/format.md), far above any real one.
inline constexpr std::uint64_t kMaxJsonFileBytes = 100'000'000;
// Deepest JSON nesting accepted in config.json and the index (Python's json
// module and serde_json stop near this depth too).
inline constexpr int kMaxJsonDepth = 128;

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Opens path read-only as a regular file and returns its descriptor and size
// in bytes. label names the file in messages. Throws Error{kIo} when it cannot
// be opened, Error{kBadInput} when it is not a regular file.
UniqueFd open_input_file(const std::filesystem::path& path, const std::string& label,
                         std::uint64_t& size);

// What makes an open file the same file when it is opened again.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size = 0;
};

// The identity of an open descriptor (fstat). Throws Error{kIo}.
FileIdentity file_identity(int fd);

// Opens path again as open_input_file() does and checks that it is still the
// file whose identity was taken at the first open (a descriptor pool closes
// and reopens input files). Throws as open_input_file() does, and
// Error{kIo} naming label when it is another file now (another device or
// inode: replaced or moved) or has another size (rewritten).
UniqueFd reopen_input_file(const std::filesystem::path& path, const std::string& label,
                           const FileIdentity& identity);

// Reads a whole input file of at most max_bytes bytes. Throws Error{kBadInput}
// when it is larger, Error{kIo} on a read error.
std::string read_input_file(const std::filesystem::path& path, const std::string& label,
                            std::uint64_t max_bytes);

// The JSON reader: every JSON file ctquant reads (config.json and the index
// of INPUT, of verify's two sides and any other .json file verify compares,
// part records and logs, the manifest, --quantization-config) goes through
// these functions, with the bounds of docs/security.md.

// Parses text as JSON. Throws Error{kBadInput} naming label when it is not
// valid JSON, nests deeper than kMaxJsonDepth, or (when reject_duplicate_keys)
// repeats a key inside one object: JSON parsers keep the last value of a
// repeated key, which would silently drop an entry. The structure is checked
// by a SAX pass before any tree is built, so a hostile nesting never reaches
// a recursive function.
nlohmann::json parse_json_file_text(std::string_view text, const std::string& label,
                                    bool reject_duplicate_keys);

// The same, keeping the order of object keys (--quantization-config: its
// groups are tried in the order written).
nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& label,
                                               bool reject_duplicate_keys);

// Reads path (a regular file of at most max_bytes) and parses it as
// parse_json_file_text() does. Throws what read_input_file() and
// parse_json_file_text() throw.
nlohmann::json read_json_file(const std::filesystem::path& path, const std::string& label,
                              std::uint64_t max_bytes = kMaxJsonFileBytes,
                              bool reject_duplicate_keys = true);

// True when inner is outer or lies below it, comparing path components
// (both should be absolute and normalised, e.g. by fs::canonical).
bool path_is_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

// Whether every page of [offset, offset + length) of fd is in the page
// cache, by cachestat(2) (Linux 6.5; the same number on every
// architecture); false when the kernel cannot tell. Telling costs about a
// quarter of what posix_fadvise(WILLNEED) costs on cached pages, which
// walks them all too. The executor reads ahead only what is not cached.
bool all_cached(int fd, std::uint64_t offset, std::uint64_t length);

}  // namespace ctquant::detail
