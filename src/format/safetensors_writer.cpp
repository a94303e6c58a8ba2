#include "ctquant/format/safetensors_writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ctquant/util/cancel.hpp"
#include "ctquant/util/checked.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant {

namespace {
std::string json_string(const std::string& s) { return nlohmann::json(s).dump(); }
}  // namespace

ShardLayout layout_shard(std::span<const TensorSpec> tensors,
                         const std::map<std::string, std::string>& metadata) {
  ShardLayout layout;
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first_meta = true;
    for (const auto& [key, value] : metadata) {
      if (!first_meta) json += ',';
      json += json_string(key) + ":" + json_string(value);
      first_meta = false;
    }
    json += '}';
    first = false;
  }
  std::uint64_t cursor = 0;
  for (const TensorSpec& t : tensors) {
    poll_cancel();  // the plan lays out shards of any size (util/cancel.hpp)
    if (!first) json += ',';
    first = false;
    std::uint64_t end = 0;
    if (!checked_add(cursor, t.byte_size, end)) {
      throw bad_input(fmt::format("tensor '{}': output offsets overflow 64 bits", t.name));
    }
    json += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                        json_string(t.name), dtype_tag(t.dtype), fmt::join(t.shape, ","), cursor,
                        end);
    layout.offsets.push_back(cursor);
    cursor = end;
  }
  json += '}';
  // Pad with spaces so that the data buffer starts at a multiple of 8.
  const std::size_t padded = (8 + json.size() + 7) / 8 * 8 - 8;
  json.resize(padded, ' ');
  layout.header.resize(8);
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) layout.header[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  layout.header += json;
  layout.data_start = layout.header.size();
  if (!checked_add(layout.data_start, cursor, layout.file_size)) {
    throw bad_input("output shard size overflows 64 bits");
  }
  return layout;
}

OutputFile::OutputFile(const std::filesystem::path& path, std::shared_ptr<FdPool> pool)
    : path_(path), pool_(std::move(pool)) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOSPC || error == EDQUOT) throw_write_error(path.string(), error);
    throw io_error(fmt::format("{}: cannot create: {}", path.string(), std::strerror(error)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw io_error(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(error)));
  }
  if (!pool_) pool_ = std::make_shared<FdPool>(1);
  slot_ = pool_->add(fd, [path, device = st.st_dev, inode = st.st_ino] {
    const int again = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (again < 0) {
      throw io_error(fmt::format("{}: cannot reopen: {}", path.string(), std::strerror(errno)));
    }
    struct stat now {};
    if (::fstat(again, &now) != 0 || now.st_dev != device || now.st_ino != inode) {
      ::close(again);
      throw io_error(fmt::format(
          "{}: was replaced while ctquant wrote it (reopened, it is another file)", path.string()));
    }
    return again;
  });
}

OutputFile::~OutputFile() {
  if (pool_) pool_->remove(slot_);
}

FdLease OutputFile::descriptor() const {
  if (!pool_) throw io_error(fmt::format("{}: written after it was closed", path_.string()));
  return pool_->acquire(slot_);
}

void OutputFile::reserve(std::uint64_t size) {
  if (size == 0) return;
  if (size > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    throw_write_error(path_.string(), EFBIG);
  }
  const FdLease fd = descriptor();
  int rc = 0;
  do {
    rc = ::posix_fallocate(fd->get(), 0, static_cast<off_t>(size));
  } while (rc == EINTR);
  if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL) return;  // unsupported: writes will tell
  throw_write_error(path_.string(), rc);
}

void OutputFile::write_at(std::uint64_t offset, std::span<const std::byte> bytes) const {
  const FdLease fd = descriptor();
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd->get(), bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(offset + done));
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      throw_write_error(path_.string(), error);
    }
    if (n == 0) throw_write_error(path_.string(), ENOSPC);
    done += static_cast<std::size_t>(n);
  }
}

void OutputFile::copy_from(int in_fd, std::uint64_t in_offset, std::uint64_t offset,
                           std::uint64_t length) const {
  const FdLease fd = descriptor();
  auto in_pos = static_cast<off_t>(in_offset);
  auto out_pos = static_cast<off_t>(offset);
  std::uint64_t left = length;
  while (left > 0) {
    const ssize_t n = ::copy_file_range(in_fd, &in_pos, fd->get(), &out_pos,
                                        static_cast<std::size_t>(std::min<std::uint64_t>(left, 1u << 30)), 0);
    if (n > 0) {
      left -= static_cast<std::uint64_t>(n);
      continue;
    }
    const int error = n < 0 ? errno : 0;
    if (error == EINTR) continue;
    if (error == ENOSPC || error == EDQUOT || error == EFBIG) {
      throw_write_error(path_.string(), error);
    }
    if (n < 0 && error != EXDEV && error != EINVAL && error != ENOSYS && error != EOPNOTSUPP &&
        error != EBADF) {
      throw io_error(fmt::format("{}: copy failed: {}", path_.string(), std::strerror(error)));
    }
    // copy_file_range cannot copy here (or returned 0, which some filesystems
    // do for files they cannot copy): copy through a bounded buffer, which
    // also tells a real end of file apart.
    std::vector<std::byte> buffer(std::min<std::uint64_t>(left, 8u << 20));
    while (left > 0) {
      const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(left, buffer.size()));
      const ssize_t r = ::pread(in_fd, buffer.data(), chunk, in_pos);
      const int read_error = r < 0 ? errno : 0;
      if (read_error == EINTR) continue;
      if (r <= 0) {
        throw io_error(fmt::format("{}: read failed while copying: {}", path_.string(),
                                   r == 0 ? "unexpected end of file (was the input truncated?)"
                                          : std::strerror(read_error)));
      }
      write_at(static_cast<std::uint64_t>(out_pos),
               std::span<const std::byte>(buffer.data(), static_cast<std::size_t>(r)));
      in_pos += r;
      out_pos += r;
      left -= static_cast<std::uint64_t>(r);
    }
  }
}

void OutputFile::start_writeback(std::uint64_t offset, std::uint64_t length) const {
  if (!pool_) return;
  const FdLease fd = descriptor();
  ::sync_file_range(fd->get(), static_cast<off_t>(offset), static_cast<off_t>(length),
                    SYNC_FILE_RANGE_WRITE);
}

void OutputFile::sync_and_close() {
  if (!pool_) return;
  FdLease fd = descriptor();
  pool_->remove(slot_);
  pool_.reset();
  int rc = 0;
  do {
    rc = ::fsync(fd->get());
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int error = errno;
    throw_write_error(path_.string(), error);
  }
  // Close here, when this is the last holder, to see a close that reports a
  // failed write (NFS); another holder's lease closes it otherwise.
  if (fd.use_count() == 1) {
    if (const int error = fd->close(); error != 0) throw_write_error(path_.string(), error);
  }
}

}  // namespace ctquant
