// A bounded set of open file descriptors shared by many files.
//
// A checkpoint of thousands of shards must not hold thousands of descriptors
// open: the common soft limit (RLIMIT_NOFILE) is 1024. Each file registers
// its descriptor with a pool and takes a lease on it for every read or write;
// the pool keeps at most `capacity` descriptors, dropping the least recently
// used one when it needs room, and reopens a file on its next use
// through the function the file registered (which repeats the checks of the
// first open and makes sure it is still the same file). A lease keeps its
// descriptor open while it is held, even after the pool dropped it, so a
// descriptor is never closed under a read, a write or a copy.
//
// Thread-safe. Capacity counts cached descriptors; descriptors held only by
// leases come on top (at most one per concurrent user).
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace ctquant {

// An open file descriptor, closed when the last holder lets go of it.
class SharedFd {
 public:
  explicit SharedFd(int fd) noexcept : fd_(fd) {}
  ~SharedFd();
  SharedFd(const SharedFd&) = delete;
  SharedFd& operator=(const SharedFd&) = delete;
  int get() const noexcept { return fd_; }
  // Closes the descriptor now; returns 0, or the errno of a failed close
  // (which on some filesystems reports a failed write). Only the last holder
  // may call it.
  int close() noexcept;

 private:
  int fd_ = -1;
};

using FdLease = std::shared_ptr<SharedFd>;

class FdPool {
 public:
  // Opens the file again and returns its descriptor. Throws ctquant::Error
  // when it cannot be opened or is no longer the file first opened.
  using Reopen = std::function<int()>;

  // At most `capacity` (>= 1) descriptors cached.
  explicit FdPool(std::size_t capacity);
  FdPool(const FdPool&) = delete;
  FdPool& operator=(const FdPool&) = delete;

  // A capacity for one pool from the process's RLIMIT_NOFILE soft limit: a
  // quarter of it (a run holds an input pool and an output pool, verify two
  // inputs), at least 4 and at most 1024.
  static std::size_t default_capacity();

  // Takes ownership of the open descriptor fd of a file and returns the
  // file's slot. Drops the least recently used descriptor when the pool is
  // full (closed at once, or when its last lease ends).
  std::size_t add(int fd, Reopen reopen);
  // A lease on the slot's descriptor, reopening the file when the pool had
  // closed it. Throws what reopen throws.
  FdLease acquire(std::size_t slot);
  // Forgets the slot and returns a lease on its descriptor when one is open
  // (so the caller can flush and close it), otherwise null.
  FdLease remove(std::size_t slot);

  std::size_t capacity() const { return capacity_; }
  // Descriptors the pool holds open now (at most capacity).
  std::size_t open_count() const;
  // Times a file was reopened after the pool had closed its descriptor.
  std::size_t reopen_count() const;

 private:
  struct Slot {
    Reopen reopen;
    FdLease fd;                                // null when closed
    std::list<std::size_t>::iterator in_lru;  // valid when fd is set
    bool live = false;
  };
  // With mutex_ held: caches fd for slot s, evicting to stay within capacity.
  void cache(std::size_t s, FdLease fd);

  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<std::size_t> free_slots_;
  std::list<std::size_t> lru_;  // open slots, most recently used first
  std::size_t reopens_ = 0;
};

}  // namespace ctquant
