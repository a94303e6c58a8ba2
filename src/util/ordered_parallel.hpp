// Private: running numbered tasks on several threads while their results
// are used in order, for work whose outcome must not depend on the thread
// count (verify's chunk comparisons: the report lists differences in file
// order, and sums are added in row order; the files hashed for the run
// report and checked by verify --manifest, listed in name order; the modules
// --observer auto measures, kept in plan order).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace ctquant::detail {

// Calls produce(i, worker) for every i in [0, n), on `threads` threads (the
// calling thread and threads - 1 others; worker in [0, threads) names the
// thread, for per-thread scratch buffers), and consume(i, result) on the
// calling thread in index order as soon as result i and those before it are
// ready. At most 2 * threads results wait to be consumed, so memory does not
// grow with n. With threads <= 1, or n <= 1, everything runs on the calling
// thread and no thread is created. When produce or consume throws, no new
// task is started, the threads are joined and the exception of the lowest
// index is rethrown (consume is not called for the results after it).
//
// With an idle function, the calling thread also calls idle() at least every
// `period` while it waits for the other threads (for progress lines; idle
// runs on the calling thread only, never under the lock). An exception
// from idle counts as one of the next result to consume.
struct NoIdle {
  void operator()() const {}
};

template <class Result, class Produce, class Consume, class Idle = NoIdle>
void ordered_parallel(std::size_t n, unsigned threads, Produce produce, Consume consume,
                      Idle idle = {}, std::chrono::milliseconds period = {}) {
  if (threads <= 1 || n <= 1) {
    for (std::size_t i = 0; i < n; ++i) consume(i, produce(i, 0u));
    return;
  }
  const std::size_t window = 2 * static_cast<std::size_t>(threads);
  std::vector<std::optional<Result>> slots(window);
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t next = 0;      // the next task to start
  std::size_t consumed = 0;  // the next result to consume
  std::exception_ptr error;
  std::size_t error_index = n;
  const auto fail = [&](std::size_t i, std::exception_ptr e) {
    if (i < error_index) {
      error_index = i;
      error = e;
    }
    changed.notify_all();
  };
  // Starts tasks while the window has room; the calling thread (worker 0)
  // also consumes what is ready, in order.
  const auto work = [&](unsigned worker) {
    std::unique_lock lock(mutex);
    for (;;) {
      if (worker == 0) {
        while (!error && consumed < n && slots[consumed % window]) {
          Result result = std::move(*slots[consumed % window]);
          slots[consumed % window].reset();
          const std::size_t i = consumed++;
          changed.notify_all();
          lock.unlock();
          try {
            consume(i, std::move(result));
          } catch (...) {
            lock.lock();
            fail(i, std::current_exception());
            continue;
          }
          lock.lock();
        }
        if (consumed == n) return;
      }
      if (error) return;
      if (next < n && next - consumed < window) {
        const std::size_t i = next++;
        lock.unlock();
        std::optional<Result> result;
        try {
          result.emplace(produce(i, worker));
        } catch (...) {
          lock.lock();
          fail(i, std::current_exception());
          continue;
        }
        lock.lock();
        slots[i % window] = std::move(result);
        changed.notify_all();
        continue;
      }
      if (worker != 0 && next >= n) return;
      if constexpr (std::is_same_v<Idle, NoIdle>) {
        changed.wait(lock);
      } else if (worker != 0) {
        changed.wait(lock);
      } else {
        changed.wait_for(lock, period);
        lock.unlock();
        try {
          idle();
        } catch (...) {
          lock.lock();
          fail(consumed, std::current_exception());
          continue;
        }
        lock.lock();
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned n_threads =
      static_cast<unsigned>(std::min<std::size_t>(threads, n));
  try {
    for (unsigned t = 1; t < n_threads; ++t) pool.emplace_back(work, t);
  } catch (...) {
    {
      const std::lock_guard lock(mutex);
      fail(0, std::current_exception());
    }
    for (std::thread& t : pool) t.join();
    std::rethrow_exception(error);
  }
  work(0);
  {
    // The calling thread stops on an error: the others leave at their next
    // look at the state.
    const std::lock_guard lock(mutex);
    changed.notify_all();
  }
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace ctquant::detail
