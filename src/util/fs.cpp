#include "ctquant/util/fs.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "ctquant/util/error.hpp"

namespace ctquant {

namespace {

// The directory's descriptor, or -1 with errno set.
int open_directory(const std::filesystem::path& dir) noexcept {
  return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

}  // namespace

void fsync_directory(const std::filesystem::path& dir) {
  const int fd = open_directory(dir);
  if (fd < 0) {
    throw io_error(fmt::format("{}: cannot open to flush: {}", dir.string(), std::strerror(errno)));
  }
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) throw_write_error(dir.string(), error);
}

void fsync_directory_best_effort(const std::filesystem::path& dir) noexcept {
  const int fd = open_directory(dir);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace ctquant
