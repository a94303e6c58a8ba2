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

void WriteQueue::write_queued(std::unique_lock<std::mutex>& lock) {
  if (writing_) return;
  writing_ = true;
  while (write_one(lock)) {
  }
  writing_ = false;
  written_cv_.notify_all();
}

// With mutex_ held: performs one queued write (buffer writes first, as they
// hold a worker's buffers; then a slice of a copy), unlocking around the
// I/O. After a failure it drops the write instead, releasing the buffers.
// Returns false when the queues are empty.
bool WriteQueue::write_one(std::unique_lock<std::mutex>& lock) {
  if (!buffer_writes_.empty()) {
    const WriteRequest request = buffer_writes_.front();
    buffer_writes_.pop_front();
    lock.unlock();
    if (!failed_.load()) {
      try {
        for (std::size_t p = 0; p < request.n_pieces; ++p) {
          request.file->write_at(request.pieces[p].offset, request.pieces[p].bytes);
          wrote(*request.file, request.pieces[p].offset, request.pieces[p].bytes.size());
        }
        on_written_(request.job);
      } catch (...) {
        on_error_(request.job, std::current_exception());
      }
    }
    lock.lock();
    request.buffers->in_flight = false;
    written_cv_.notify_all();
    return true;
  }
  if (!copies_.empty()) {
    WriteRequest& front = copies_.front();
    const WriteRequest slice = front;
    const std::uint64_t n = std::min(front.length, kCopySliceBytes);
    front.in_offset += n;
    front.out_offset += n;
    front.length -= n;
    const bool last = front.length == 0;
    if (last) copies_.pop_front();
    lock.unlock();
    if (!failed_.load()) {
      try {
        const FdLease in = slice.in_file->descriptor();
        slice.file->copy_from(in->get(), slice.in_offset, slice.out_offset, n);
        wrote(*slice.file, slice.out_offset, n);
        if (last) on_written_(slice.job);
      } catch (...) {
        on_error_(slice.job, std::current_exception());
      }
    }
    lock.lock();
    return true;
  }
  return false;
}

void WriteQueue::wrote(const OutputFile& file, std::uint64_t offset, std::uint64_t bytes) {
  if (on_bytes_) on_bytes_(file, offset, bytes);
  if (!writeback_) return;
  unflushed_bytes_ += bytes;
  if (unflushed_bytes_ < kWritebackBytes) return;
  file.start_writeback(0, 0);
  unflushed_bytes_ = 0;
}

void WriteQueue::wait_written(const WriteBuffers& buffers) {
  std::unique_lock lock(mutex_);
  while (buffers.in_flight) {
    if (writing_) {
      written_cv_.wait(lock);
    } else {
      write_queued(lock);
    }
  }
}

void WriteQueue::drain() {
  std::unique_lock lock(mutex_);
  for (;;) {
    write_queued(lock);
    if (!writing_ && buffer_writes_.empty() && copies_.empty()) return;
    written_cv_.wait(lock);
  }
}

}  // namespace ctquant::detail
