#include "ctquant/quantize.hpp"

#include <chrono>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ctquant/config.hpp"
#include "ctquant/error.hpp"
#include "ctquant/kernel.hpp"
#include "ctquant/output_dir.hpp"

namespace ctquant {

namespace fs = std::filesystem;

QuantizeOptions default_quantize_options() {
  QuantizeOptions options;
  options.threads = std::max(1u, std::thread::hardware_concurrency());
  return options;
}

namespace {

std::uint64_t directory_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    if (item.is_regular_file(ec)) total += item.file_size(ec);
  }
  return total;
}

}  // namespace

QuantizeSummary quantize(const QuantizeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const auto log = options.logger;
  if (options.threads == 0) throw usage_error("--threads must be at least 1");

  check_output_path(options.output, options.input, options.force);
  Checkpoint checkpoint = open_checkpoint(options.input);
  if (log) {
    log->info("{}: {} shard(s), {} tensors, {} bytes of tensor data", options.input.string(),
              checkpoint.shards.size(), checkpoint.tensors.size(), checkpoint.total_tensor_bytes());
  }
  QuantizeSummary summary;
  summary.plan = make_plan(checkpoint, options.plan);
  summary.tensors_quantized = summary.plan.n_quantized;
  summary.tensors_copied = summary.plan.n_copied;
  summary.bytes_in = checkpoint.total_file_bytes();
  if (checkpoint.has_index) summary.bytes_in += fs::file_size(checkpoint.root / kIndexFileName);
  if (checkpoint.config) summary.bytes_in += fs::file_size(checkpoint.root / kConfigFileName);
  if (log && !checkpoint.config) {
    log->warn("{}: no config.json; writing one that holds only quantization_config",
              options.input.string());
  }
  if (options.dry_run) {
    summary.bytes_out = summary.plan.shard_bytes_out;
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return summary;
  }

  StagedOutput staged(options.output, options.input, options.force);
  if (log) log->debug("writing into {}", staged.dir().string());
  ExecuteOptions exec;
  exec.threads = options.threads;
  exec.chunk_bytes = options.chunk_bytes;
  exec.on_progress = options.on_progress;
  exec.cancel = options.cancel;
  exec.fsync = options.fsync;
  summary.execute = execute_plan(checkpoint, summary.plan, staged.dir(), exec);
  if (log) {
    const ExecuteStats& st = summary.execute;
    log->debug(
        "streamed {} bytes in, {} bytes out in {:.3f} s ({:.2f} GB/s of input) on {} "
        "thread(s), kernel {}; flushed to disk in {:.3f} s",
        st.bytes_read, st.bytes_written, st.seconds_stream,
        st.seconds_stream > 0 ? static_cast<double>(st.bytes_read) / st.seconds_stream / 1e9 : 0.0,
        options.threads, kernel_path_name(), st.seconds_flush);
  }
  summary.bytes_out = directory_bytes(staged.dir());
  staged.commit();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace ctquant
