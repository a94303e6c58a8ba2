// Writing safetensors files: header layout and positioned, bounded writes.
//
// The writer never builds a file in memory. layout_shard() decides every
// tensor's data_offsets and serialises the header (compact JSON, keys in
// data order, `__metadata__` first, padded with spaces so that the data
// buffer starts at a multiple of 8: section 1 of the format spec); the
// executor then writes the header first and each tensor's bytes at their
// planned offsets with OutputFile::write_at().
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/util/error.hpp"  // throw_write_error
#include "ctquant/util/fd_pool.hpp"

namespace ctquant {

// A tensor to lay out: name, dtype, shape and byte size.
struct TensorSpec {
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::uint64_t byte_size = 0;
};

struct ShardLayout {
  std::string header;                  // 8-byte length prefix + JSON + padding
  std::vector<std::uint64_t> offsets;  // data-buffer offset of each tensor, in input order
  std::uint64_t data_start = 0;        // == header.size()
  std::uint64_t file_size = 0;         // data_start + sum of byte sizes
};

// Lays tensors out in the order given. metadata becomes `__metadata__`
// (omitted when empty). Throws Error{kBadInput} if the sizes overflow.
ShardLayout layout_shard(std::span<const TensorSpec> tensors,
                         const std::map<std::string, std::string>& metadata);

// An output file opened for positioned writes; closing without
// sync_and_close() is allowed (the caller removes the file on error). Its
// descriptor lives in an FdPool, the one given (shared by the shards of one
// output, so that thousands of shards cost a bounded number of descriptors)
// or one of its own; when the pool has closed it, the next write reopens the
// file (O_NOFOLLOW) and checks that it is still the file created.
class OutputFile {
 public:
  // Creates path (which must not exist). Throws Error{kIo} / Error{kNoSpace}.
  explicit OutputFile(const std::filesystem::path& path, std::shared_ptr<FdPool> pool = nullptr);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Reserves size bytes up front where the filesystem supports it, so that a
  // full disk is found before any data is written. Throws Error{kNoSpace}.
  void reserve(std::uint64_t size);
  // Writes bytes at file offset (thread-safe). Throws Error{kNoSpace} on
  // ENOSPC/EDQUOT/EFBIG, Error{kIo} otherwise (also when the file had to be
  // reopened and is not the file created any more).
  void write_at(std::uint64_t offset, std::span<const std::byte> bytes) const;
  // Copies length bytes from in_fd at in_offset to offset in this file
  // (copy_file_range, falling back to read/write through a bounded buffer).
  void copy_from(int in_fd, std::uint64_t in_offset, std::uint64_t offset,
                 std::uint64_t length) const;
  // Starts writing the dirty pages of bytes [offset, offset + length) (length
  // 0: to the end of the file) to the device without waiting for them
  // (sync_file_range SYNC_FILE_RANGE_WRITE), so that a later fsync has less
  // left to wait for. Advisory: errors are left for fsync to report.
  void start_writeback(std::uint64_t offset, std::uint64_t length) const;
  // fsync, then close. Throws Error{kIo} (Error{kNoSpace} for a write the
  // flush found had no room).
  void sync_and_close();

  const std::filesystem::path& path() const { return path_; }

 private:
  FdLease descriptor() const;

  std::filesystem::path path_;
  std::shared_ptr<FdPool> pool_;  // null once closed
  std::size_t slot_ = 0;
};

}  // namespace ctquant
