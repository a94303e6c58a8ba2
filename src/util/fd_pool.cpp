#include "ctquant/util/fd_pool.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace ctquant {

SharedFd::~SharedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int SharedFd::close() noexcept {
  if (fd_ < 0) return 0;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) return errno;
  return 0;
}

FdPool::FdPool(std::size_t capacity) : capacity_(std::max<std::size_t>(1, capacity)) {}

std::size_t FdPool::default_capacity() {
  constexpr std::size_t kMin = 4;
  constexpr std::size_t kMax = 1024;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kMax;
  return std::clamp<std::size_t>(static_cast<std::size_t>(limit.rlim_cur / 4), kMin, kMax);
}

void FdPool::cache(std::size_t s, FdLease fd) {
  while (lru_.size() >= capacity_) {
    const std::size_t victim = lru_.back();
    lru_.pop_back();
    slots_[victim].fd.reset();  // closes it unless a lease still holds it
  }
  lru_.push_front(s);
  slots_[s].fd = std::move(fd);
  slots_[s].in_lru = lru_.begin();
}

std::size_t FdPool::add(int fd, Reopen reopen) {
  auto lease = std::make_shared<SharedFd>(fd);
  std::lock_guard lock(mutex_);
  std::size_t s = 0;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    s = slots_.size();
    slots_.emplace_back();
  }
  slots_[s].reopen = std::move(reopen);
  slots_[s].live = true;
  cache(s, std::move(lease));
  return s;
}

FdLease FdPool::acquire(std::size_t s) {
  std::lock_guard lock(mutex_);
  Slot& slot = slots_.at(s);
  if (slot.fd) {
    lru_.splice(lru_.begin(), lru_, slot.in_lru);  // most recently used
    return slot.fd;
  }
  // Reopened with the lock held: reopens are rare (a file used again after
  // capacity other files), and this keeps one descriptor per file.
  auto lease = std::make_shared<SharedFd>(slot.reopen());
  ++reopens_;
  cache(s, lease);
  return lease;
}

FdLease FdPool::remove(std::size_t s) {
  std::lock_guard lock(mutex_);
  Slot& slot = slots_.at(s);
  FdLease lease = std::move(slot.fd);
  if (lease) lru_.erase(slot.in_lru);
  slot = Slot{};
  free_slots_.push_back(s);
  return lease;
}

std::size_t FdPool::open_count() const {
  std::lock_guard lock(mutex_);
  return lru_.size();
}

std::size_t FdPool::reopen_count() const {
  std::lock_guard lock(mutex_);
  return reopens_;
}

}  // namespace ctquant
