#include "ctquant/util/error.hpp"

namespace ctquant {

int exit_status(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kUsage:
      return 2;
    case ErrorKind::kDifferent:
      return 3;
    default:
      return 1;
  }
}

}  // namespace ctquant
