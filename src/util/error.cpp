#include "ctquant/util/error.hpp"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace ctquant {

int exit_status(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kUsage:
    case ErrorKind::kUnsupported:
      return 2;
    case ErrorKind::kDifferent:
      return 3;
    default:
      return 1;
  }
}

void throw_write_error(const std::string& what, int errno_value) {
  if (errno_value == ENOSPC || errno_value == EDQUOT || errno_value == EFBIG) {
    throw Error(ErrorKind::kNoSpace,
                fmt::format("{}: no space left for the output ({}{})", what,
                            std::strerror(errno_value),
                            errno_value == EFBIG ? ": the file size limit was reached" : ""));
  }
  throw io_error(fmt::format("{}: write failed: {}", what, std::strerror(errno_value)));
}

}  // namespace ctquant
