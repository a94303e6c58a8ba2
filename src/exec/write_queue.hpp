// Private: the executor's output write queue.
//
// Output writes go through one queue and are made by one thread at a time,
// whichever worker holds the write token: a buffered write holds the file's
// inode lock while it copies, so two workers writing one shard wait on each
// other in the kernel, and longer still when the holder is preempted. A
// worker queues its chunk and writes the queue if the write token is free;
// if not, it goes back to computing and the holder writes its chunk too.
// Buffer writes (a worker's output set) go before copies, which are made in
// slices of kCopySliceBytes so that buffer writes do not wait long behind a
// large copy. When the output is to be flushed, the token holder starts the
// write-back of the files every kWritebackBytes written, so that the device
// writes while the workers compute and the final fsync waits only for the
// tail. The token is held for one write at a time: the thread that made it
// then reports it (on_bytes: the manifest hashes the bytes, still in the
// core's cache) without the token, while another thread writes, and only
// then releases the write's buffers.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "exec/phase_times.hpp"

namespace ctquant::detail {

// Memory a queued write reads from: in flight until the write is done (or
// dropped after a failure), when it may be refilled or freed.
struct WriteBuffers {
  bool in_flight = false;  // guarded by the queue's mutex
};

struct WriteRequest {
  struct Piece {
    std::uint64_t offset = 0;
    std::span<const std::byte> bytes;
  };
  std::size_t job = 0;
  const OutputFile* file = nullptr;
  // Buffer write: the pieces, read from `buffers`. Copy (buffers == nullptr):
  // `length` bytes of in_file at in_offset to out_offset (its descriptor is
  // taken from its pool when the copy is made, so that queued copies hold
  // no descriptor); `last` marks the job's last slice.
  WriteBuffers* buffers = nullptr;
  std::array<Piece, 4> pieces{};
  std::size_t n_pieces = 0;
  const SafetensorsFile* in_file = nullptr;
  std::uint64_t in_offset = 0;
  std::uint64_t out_offset = 0;
  std::uint64_t length = 0;
  bool last = true;
};

class WriteQueue {
 public:
  // on_bytes(file, offset, length, bytes) is called after each write by the
  // thread that made it, without the write token (so from several threads
  // at once), with the bytes written when they came from memory (empty for
  // a copy), before the write's buffers are released; then on_written(job)
  // after a job's last write. on_error(job, e) after a failed write or
  // on_bytes call; once `failed` is set no more writes are made (their
  // buffers are released).
  using BytesWritten = std::function<void(const OutputFile&, std::uint64_t, std::uint64_t,
                                          std::span<const std::byte>)>;
  // The CPU time of writes (Phase::kWrite) and of on_bytes
  // (Phase::kReport), and the time waited, go to times.
  WriteQueue(bool writeback, std::function<void(std::size_t)> on_written,
             std::function<void(std::size_t, std::exception_ptr)> on_error,
             const std::atomic<bool>& failed, BytesWritten on_bytes, PhaseTimes& times)
      : writeback_(writeback),
        on_written_(std::move(on_written)),
        on_error_(std::move(on_error)),
        on_bytes_(std::move(on_bytes)),
        failed_(failed),
        times_(times) {}

  // Queues a write, then writes the queue if no other thread is writing.
  void submit(WriteRequest request);
  // Blocks until `buffers` is written and reported (or dropped after a
  // failure); writes the queue itself when the write token is free.
  void wait_written(const WriteBuffers& buffers);
  // Blocks until every queued write is made (another thread may still be
  // reporting its last one).
  void drain();

 private:
  bool queued() const { return !buffer_writes_.empty() || !copies_.empty(); }
  void write_queued(std::unique_lock<std::mutex>& lock);
  WriteRequest take_one();
  void perform(const WriteRequest& write);
  void report(const WriteRequest& write);
  void wrote(const OutputFile& file, std::uint64_t bytes);
  void wait(std::unique_lock<std::mutex>& lock);

  const bool writeback_;
  const std::function<void(std::size_t)> on_written_;
  const std::function<void(std::size_t, std::exception_ptr)> on_error_;
  const BytesWritten on_bytes_;
  const std::atomic<bool>& failed_;
  PhaseTimes& times_;
  std::mutex mutex_;
  std::condition_variable written_cv_;  // the token or a write's buffers were released
  std::deque<WriteRequest> buffer_writes_;
  std::deque<WriteRequest> copies_;
  bool writing_ = false;               // a thread holds the write token
  std::uint64_t unflushed_bytes_ = 0;  // written since the last write-back (token holder only)
};

}  // namespace ctquant::detail
