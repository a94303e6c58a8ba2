// Cancellation of long computations that write nothing: opening a
// checkpoint's headers, planning, lint and rendering a plan. On a checkpoint
// of hundreds of thousands of tensors each of them runs for seconds; a
// signal that arrives meanwhile must stop the run within a fraction of a
// second, as it does while OUTPUT is written (where the executor polls
// ExecuteOptions::cancel between jobs).
//
// These computations are pure functions of their inputs and keep their
// signatures: the flag to watch is set for the calling thread by a
// CancelScope (quantize() opens one on QuantizeOptions::cancel around its
// open, plan and lint phases), and their loops over tensors, modules and
// rules call poll_cancel(), a relaxed load of an atomic flag through a
// thread-local pointer (a few nanoseconds). Without a scope it does nothing.
#pragma once

#include <atomic>

namespace ctquant {

// While it lives, poll_cancel() on this thread throws Error{kInterrupted,
// message} once *flag is true. flag may be null (nothing is watched);
// message must outlive the scope (a string literal). Scopes nest: the
// innermost one is watched, and the one before it again once it ends.
class CancelScope {
 public:
  explicit CancelScope(const std::atomic<bool>* flag,
                       const char* message = "interrupted by a signal");
  ~CancelScope();
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  const std::atomic<bool>* previous_flag_;
  const char* previous_message_;
};

// Throws Error{kInterrupted} with the message of this thread's innermost
// CancelScope when its flag is set; returns at once otherwise (and always
// without a scope).
void poll_cancel();

}  // namespace ctquant
