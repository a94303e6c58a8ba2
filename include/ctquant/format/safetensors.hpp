// Reading safetensors files: header parsing, validation and positioned reads.
//
// A file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON,
// then the data buffer (section 1 of the format spec). parse_header() applies
// every check the reference safetensors reader makes, plus the ones a
// streaming tool needs (duplicate names, checked arithmetic), and throws
// Error{kBadInput} naming the file, the tensor and the rule. Nothing here
// reads tensor data into memory beyond what the caller asks for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/util/fd_pool.hpp"

namespace ctquant {

// Largest header the reference reader accepts (section 1 of the format spec).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// One tensor of a safetensors header.
struct TensorEntry {
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;  // row-major; [] is a scalar
  std::uint64_t begin = 0;           // byte offsets relative to the data buffer
  std::uint64_t end = 0;

  std::uint64_t numel() const;  // product of shape (1 for a scalar); validated not to overflow
  std::uint64_t byte_size() const { return end - begin; }
};

// A validated header. Tensors are kept in data order (sorted by begin).
struct SafetensorsHeader {
  std::uint64_t header_size = 0;  // N: bytes of JSON after the 8-byte prefix
  std::uint64_t data_start = 0;   // 8 + N: file offset of the data buffer
  std::uint64_t data_size = 0;    // bytes of the data buffer
  bool has_metadata = false;  // an __metadata__ object was present (null counts as absent)
  std::map<std::string, std::string> metadata;  // __metadata__
  std::vector<TensorEntry> tensors;

  // The entry with this name, or nullptr.
  const TensorEntry* find(std::string_view name) const;

  // Indexes into tensors, sorted by tensor name (find() searches it): 4
  // bytes per tensor, where a hash map would copy every name.
  std::vector<std::uint32_t> by_name;
};

// Validates the JSON header of a file of file_size bytes whose header length
// prefix is header_json.size(). file_label names the file in messages.
// Throws Error{kBadInput} at the first breach of section 1 of the format spec:
// header over kMaxHeaderBytes, longer than the file, not UTF-8, not JSON, not
// an object; a tensor name or an entry key repeated (JSON parsers would keep
// the last one silently); __metadata__ not an object of strings (null counts
// as absent, as for the reference reader); an entry without dtype, shape or
// data_offsets, with an unknown dtype, a negative, fractional, too large or
// non-numeric dimension or offset, a shape whose element or bit count
// overflows 64 bits, or a byte size that is not a whole number; data_offsets
// out of order, overlapping, leaving a gap, past the end of the file, or a
// buffer that ends before the file does. Values of keys an entry does not
// define are ignored. Runs in time linear in the header and never builds a
// JSON tree of it.
SafetensorsHeader parse_header(std::string_view header_json, std::uint64_t file_size,
                               const std::string& file_label);

// An open input safetensors file; move-only.
//
// Its descriptor lives in an FdPool: the pool given (shared by the shards of
// one checkpoint, so that thousands of shards cost a bounded number of
// descriptors) or a pool of its own. When the pool has closed it, the next
// read reopens the file by path with the checks of the first open (a
// regular file, opened non-blocking) and refuses a file that is no longer
// the one first opened (another device, inode or size).
class SafetensorsFile {
 public:
  // Opens and validates path. label names the file in messages (usually the
  // file name relative to the checkpoint). Throws Error{kIo} when the file
  // cannot be opened or read, Error{kBadInput} when it is not valid (a Git
  // LFS pointer file in place of the data is named as such).
  SafetensorsFile(const std::filesystem::path& path, std::string label,
                  std::shared_ptr<FdPool> pool = nullptr);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  const std::string& label() const { return label_; }
  std::uint64_t file_size() const { return file_size_; }
  // An open descriptor of the file, kept open while the lease is held (for
  // copy_file_range and read-ahead advice). Throws Error{kIo} when the file
  // has to be reopened and cannot be, or changed.
  FdLease descriptor() const;

  // Reads out.size() bytes at data-buffer offset `offset` (thread-safe,
  // positioned read). Throws Error{kIo} on a short read, a read error, a
  // range that does not lie inside the data buffer, or a file that has to
  // be reopened and cannot be, or changed.
  void read(std::uint64_t offset, std::span<std::byte> out) const;

 private:
  void release() noexcept;

  std::filesystem::path path_;
  std::string label_;
  std::shared_ptr<FdPool> pool_;
  std::size_t slot_ = 0;
  std::uint64_t file_size_ = 0;
  SafetensorsHeader header_;
};

// Reads and validates only the header of a file (no data).
SafetensorsHeader read_header(const std::filesystem::path& path, const std::string& label);

// "[a, b, c]" for messages.
std::string shape_string(const std::vector<std::uint64_t>& shape);

}  // namespace ctquant
