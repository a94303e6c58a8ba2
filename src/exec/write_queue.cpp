#include "exec/write_queue.hpp"

#include <algorithm>

namespace ctquant::detail {

namespace {

// Copied tensors are written in slices of this size, so that buffer writes,
// which go first, do not wait long behind them.
constexpr std::uint64_t kCopySliceBytes = 8u << 20;
// When the output is to be flushed at the end, its dirty pages are sent to
// the device after every this many bytes written.
constexpr std::uint64_t kWritebackBytes = 16u << 20;

}  // namespace

void WriteQueue::submit(WriteRequest request) {
  std::unique_lock lock(mutex_);
  if (request.buffers != nullptr) {
    request.buffers->in_flight = true;
    buffer_writes_.push_back(request);
  } else {
    copies_.push_back(request);
  }
  write_queued(lock);
}

// With mutex_ held: while writes are queued and no other thread holds the
// write token, takes the token, makes one write (buffer writes first, as
// they hold a worker's buffers; then a slice of a copy) and releases the
// token; then reports the write without it and releases its buffers. After
// a failure it drops the writes instead, releasing the buffers.
void WriteQueue::write_queued(std::unique_lock<std::mutex>& lock) {
  while (!writing_ && queued()) {
    writing_ = true;
    const WriteRequest write = take_one();
    lock.unlock();
    std::exception_ptr error;
    const bool dropped = failed_.load();
    PhaseLap lap(times_);
    if (!dropped) {
      try {
        perform(write);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lap.lap(Phase::kWrite);
    lock.lock();
    writing_ = false;
    written_cv_.notify_all();
    lock.unlock();
    lap.reset();
    if (!dropped && !error) {
      try {
        report(write);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lap.lap(Phase::kReport);
    if (error) on_error_(write.job, error);
    lock.lock();
    if (write.buffers != nullptr) {
      write.buffers->in_flight = false;
      written_cv_.notify_all();
    }
  }
}

// With mutex_ held: the next write, a buffer write or a slice of a copy.
WriteRequest WriteQueue::take_one() {
  if (!buffer_writes_.empty()) {
    const WriteRequest request = buffer_writes_.front();
    buffer_writes_.pop_front();
    return request;
  }
  WriteRequest& front = copies_.front();
  WriteRequest slice = front;
  slice.length = std::min(front.length, kCopySliceBytes);
  front.in_offset += slice.length;
  front.out_offset += slice.length;
  front.length -= slice.length;
  slice.last = front.length == 0;
  if (slice.last) copies_.pop_front();
  return slice;
}

// The I/O of a write, with the token held.
void WriteQueue::perform(const WriteRequest& write) {
  if (write.buffers != nullptr) {
    for (std::size_t p = 0; p < write.n_pieces; ++p) {
      write.file->write_at(write.pieces[p].offset, write.pieces[p].bytes);
      wrote(*write.file, write.pieces[p].bytes.size());
    }
    return;
  }
  const FdLease in = write.in_file->descriptor();
  write.file->copy_from(in->get(), write.in_offset, write.out_offset, write.length);
  wrote(*write.file, write.length);
}

void WriteQueue::report(const WriteRequest& write) {
  if (write.buffers != nullptr) {
    if (on_bytes_) {
      for (std::size_t p = 0; p < write.n_pieces; ++p) {
        on_bytes_(*write.file, write.pieces[p].offset, write.pieces[p].bytes.size(),
                  write.pieces[p].bytes);
      }
    }
    on_written_(write.job);
    return;
  }
  if (on_bytes_) on_bytes_(*write.file, write.out_offset, write.length, {});
  if (write.last) on_written_(write.job);
}

void WriteQueue::wrote(const OutputFile& file, std::uint64_t bytes) {
  if (!writeback_) return;
  unflushed_bytes_ += bytes;
  if (unflushed_bytes_ < kWritebackBytes) return;
  file.start_writeback(0, 0);
  unflushed_bytes_ = 0;
}

void WriteQueue::wait(std::unique_lock<std::mutex>& lock) {
  const auto start = std::chrono::steady_clock::now();
  written_cv_.wait(lock);
  times_.add_waiting(std::chrono::steady_clock::now() - start);
}

void WriteQueue::wait_written(const WriteBuffers& buffers) {
  std::unique_lock lock(mutex_);
  while (buffers.in_flight) {
    if (!writing_ && queued()) {
      write_queued(lock);
    } else {
      wait(lock);
    }
  }
}

void WriteQueue::drain() {
  std::unique_lock lock(mutex_);
  for (;;) {
    write_queued(lock);
    if (!writing_ && !queued()) return;
    wait(lock);
  }
}

}  // namespace ctquant::detail
