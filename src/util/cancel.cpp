#include "ctquant/util/cancel.hpp"

#include "ctquant/util/error.hpp"

namespace ctquant {

namespace {

struct Watched {
  const std::atomic<bool>* flag = nullptr;
  const char* message = nullptr;
};

thread_local Watched watched;

}  // namespace

CancelScope::CancelScope(const std::atomic<bool>* flag, const char* message)
    : previous_flag_(watched.flag), previous_message_(watched.message) {
  watched = Watched{flag, message};
}

CancelScope::~CancelScope() { watched = Watched{previous_flag_, previous_message_}; }

void poll_cancel() {
  const Watched w = watched;
  if (w.flag != nullptr && w.flag->load(std::memory_order_relaxed)) {
    throw Error(ErrorKind::kInterrupted, w.message);
  }
}

}  // namespace ctquant
