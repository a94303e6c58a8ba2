// Private: where the executor's threads spend their CPU time, for
// ExecuteStats::cpu (printed by `quantize -v`, read by tools/bench).
//
// Each phase adds the thread CPU time (CLOCK_THREAD_CPUTIME_ID) spent in
// it, summed over threads, so the figures do not count time a thread was
// runnable but not running, as wall clocks on a busy machine would. Waiting
// is wall time a worker spent blocked (nothing to run while another thread
// held the write token or its buffers were still being written).
#pragma once

#include <time.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace ctquant::detail {

enum class Phase {
  kRead,      // input rows read from the page cache (pread)
  kDecode,    // FP8 codes dequantized to BF16
  kAmax,      // max |w| of the pre-pass
  kQuantize,  // the families' kernels
  kError,     // the weight error of each module (scheme/quant_error.hpp)
  kWrite,     // output writes and copies (pwrite, copy_file_range), with the write token
  kReport,    // ExecuteOptions::on_written: hashing the written bytes for the manifest
  kCount
};

inline std::int64_t thread_cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

class PhaseTimes {
 public:
  void add(Phase phase, std::int64_t ns) {
    ns_[static_cast<std::size_t>(phase)].fetch_add(ns, std::memory_order_relaxed);
  }
  void add_waiting(std::chrono::steady_clock::duration d) {
    waiting_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(),
                          std::memory_order_relaxed);
  }
  double seconds(Phase phase) const {
    return static_cast<double>(ns_[static_cast<std::size_t>(phase)].load()) * 1e-9;
  }
  double waiting_seconds() const { return static_cast<double>(waiting_ns_.load()) * 1e-9; }

 private:
  std::array<std::atomic<std::int64_t>, static_cast<std::size_t>(Phase::kCount)> ns_{};
  std::atomic<std::int64_t> waiting_ns_{0};
};

// A thread's CPU clock read at phase boundaries: lap(p) gives the time since
// the last lap (or reset) to p; reset() starts over without giving the time
// to a phase (after a call that accounts for its own time).
class PhaseLap {
 public:
  explicit PhaseLap(PhaseTimes& times) : times_(times), last_(thread_cpu_ns()) {}
  void lap(Phase phase) {
    const std::int64_t now = thread_cpu_ns();
    times_.add(phase, now - last_);
    last_ = now;
  }
  void reset() { last_ = thread_cpu_ns(); }

 private:
  PhaseTimes& times_;
  std::int64_t last_;
};

}  // namespace ctquant::detail
