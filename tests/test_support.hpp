// Helpers shared by the tests: temporary directories, hand-made safetensors
// files, reading tensors back, and running the ctquant binary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/job/quantize.hpp"

namespace ctquant::test {

// The golden fixtures copied into tests/golden (see tests/golden/README.md).
std::filesystem::path golden_dir();
// The ctquant executable under test.
std::filesystem::path ctquant_binary();
// The synthetic checkpoint generator (tools/make_checkpoint.cpp) and the
// layout manifests of tests/layouts.
std::filesystem::path make_checkpoint_binary();
std::filesystem::path layouts_dir();

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// A tensor to write into a hand-made safetensors file.
struct FakeTensor {
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> data;  // exactly numel * bits / 8 bytes
};

// Raw little-endian bytes of floats stored as dtype (BF16, F16: rounded to
// nearest even; F32: exact).
std::vector<std::byte> float_bytes(DType dtype, const std::vector<float>& values);
// Raw bytes of 16-bit patterns (BF16/F16 bit patterns given exactly).
std::vector<std::byte> u16_bytes(const std::vector<std::uint16_t>& bits);
// A 2-D float tensor of seeded normal values (std 0.02) stored as dtype.
FakeTensor random_weight(const std::string& name, DType dtype, std::uint64_t rows,
                         std::uint64_t cols, std::uint32_t seed);

// Writes a valid safetensors file with the library's writer (sorted as given).
void write_safetensors(const std::filesystem::path& path, const std::vector<FakeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
// Writes a file made of an 8-byte length prefix of header.size(), header, then data.
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           const std::vector<std::byte>& data);
// Writes any bytes to a file.
void write_file(const std::filesystem::path& path, const std::string& content);
std::string read_file(const std::filesystem::path& path);

// The bytes of one tensor of a safetensors file (validated on open).
std::vector<std::byte> read_tensor(const std::filesystem::path& file, const std::string& name);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the ctquant binary with args (no shell quoting issues: args are
// passed as they are) and captures its exit code, stdout and stderr.
CommandResult run_ctquant(const std::vector<std::string>& args);

// Recursively copies a directory (the golden inputs are read-only).
void copy_dir(const std::filesystem::path& from, const std::filesystem::path& to);

// The real third-party files copied into tests/real (see tests/real/PROVENANCE.md).
std::filesystem::path real_dir();

// Options for a library run in a test: defaults, then 2 threads and no fsync.
QuantizeOptions test_options(const std::filesystem::path& input,
                             const std::filesystem::path& output);

// The arguments of the one scheme group of options (default W4A16).
QuantArgs& args_of(PlanOptions& options);
// Sets the group size of the one integer group: 0 is channel-wise. The group
// is renamed "config_group_0" (a scheme object, not the preset) unless the
// result is the preset itself, as `--group-size` does.
void set_group_size(PlanOptions& options, std::uint64_t group_size);
// An integer scheme group of any width, group size (0: channel-wise) and
// symmetry, named "config_group_0", targets ["Linear"].
SchemeGroup int_group(int bits, bool symmetric, std::uint64_t group_size);
// The quantization_config quantize writes for one group that quantized
// something, with these ignore entries.
nlohmann::json single_group_config(const SchemeGroup& group,
                                   const std::vector<std::string>& ignore);

// Writes a checkpoint directory: model.safetensors with tensors, and config.json
// holding config unless it is null.
void write_checkpoint(const std::filesystem::path& dir, const std::vector<FakeTensor>& tensors,
                      const nlohmann::json& config = nlohmann::json{{"model_type", "llama"}});
nlohmann::json read_json(const std::filesystem::path& path);
// Gives a safetensors file other weights of the same layout: the lowest bit
// of every even byte of its data buffer flipped (the last mantissa bit of
// every BF16 or F16 value, a mantissa bit of every F32 one: finite values
// stay finite). The header is untouched.
void flip_tensor_data(const std::filesystem::path& file);

// Every regular file below dir (path relative to dir -> bytes).
std::map<std::string, std::string> snapshot_files(const std::filesystem::path& dir);
// Names of the entries of dir that contain the temporary-output marker.
std::vector<std::string> temp_leftovers(const std::filesystem::path& dir);

// Adds a test failure for each of `present` missing from message and each of
// `absent` found in it, quoting the whole message.
void expect_message(const std::string& message, const std::vector<std::string>& present,
                    const std::vector<std::string>& absent = {});

// Compares two safetensors files tensor by tensor, in whichever order they are
// stored: the set of names, each tensor's dtype, shape and bytes, and the
// __metadata__. Returns "" when they agree, otherwise the first difference
// (tensor name and byte offset).
std::string diff_safetensors(const std::filesystem::path& actual,
                             const std::filesystem::path& expected);
// Compares two output checkpoint directories: the same set of files;
// safetensors files with diff_safetensors; config.json and the index as JSON
// values; every other file byte for byte. Returns "" when they agree.
std::string diff_checkpoints(const std::filesystem::path& actual,
                             const std::filesystem::path& expected);
// Compares an output checkpoint with a golden fixture's expected/ as the
// fixtures README says it must match: every tensor's name, dtype, shape and
// bytes across the checkpoint (whichever shard holds it), each index
// consistent with its own shards and naming the same tensors, config.json as
// JSON values (config_groups keys compared only when `group_keys`: the
// older fixtures name their one group "group_0", model_free_ptq names it
// after the preset), every other expected file byte for byte. OUTPUT may
// hold an index the expected single-file fixture lacks. "" when they agree.
std::string diff_golden(const std::filesystem::path& actual, const std::filesystem::path& expected,
                        bool group_keys);
// "" when every file below the two directories is byte-identical (and the sets
// of files are equal), otherwise the first difference.
std::string diff_bytes(const std::filesystem::path& actual, const std::filesystem::path& expected);

}  // namespace ctquant::test

// ---- child processes, temporary output directories, large inputs ----

namespace ctquant::test {

// How to run the binary in a child process.
struct RunOptions {
  // RLIMIT_FSIZE of the child in bytes (set between fork and exec); 0 keeps
  // the parent's limit.
  std::uint64_t file_size_limit = 0;
  // Working directory of the child (chdir between fork and exec); empty keeps
  // the parent's.
  std::filesystem::path cwd;
  // RLIMIT_NOFILE of the child, soft and hard (set between fork and exec); 0
  // keeps the parent's.
  std::uint64_t open_files_limit = 0;
  // The program is one of the host's (e.g. /bin/sh), not a binary of this
  // build: it is started directly, never through a cross build's emulator.
  bool host_program = false;
  // Environment variables of the child, "NAME=VALUE", added to (or
  // replacing) the parent's.
  std::vector<std::string> env;
  // The child cannot create a thread: a seccomp filter installed between
  // fork and exec makes clone3 fail with ENOSYS (glibc then calls clone)
  // and clone with CLONE_THREAD fail with EPERM, so pthread_create fails
  // (EAGAIN) wherever it is called from. Processes (fork) are still allowed.
  // Requires filters_threads_supported().
  bool forbid_threads = false;
};

// Whether RunOptions::forbid_threads can be honoured: Linux on x86-64 or
// AArch64, the binary run directly (an emulator would be filtered itself).
bool filters_threads_supported();

// The ctquant binary running in a child process, its stdout and stderr
// captured to files. The destructor kills (SIGKILL) and reaps a child that
// was not waited for.
class CtquantProcess {
 public:
  explicit CtquantProcess(const std::vector<std::string>& args, const RunOptions& options = {});
  // Runs program (an absolute path) with args instead of the ctquant binary.
  CtquantProcess(const std::filesystem::path& program, const std::vector<std::string>& args,
                 const RunOptions& options);
  ~CtquantProcess();
  CtquantProcess(const CtquantProcess&) = delete;
  CtquantProcess& operator=(const CtquantProcess&) = delete;

  int pid() const { return pid_; }
  // True while the child has not exited (does not reap it).
  bool running() const;
  // Sends a signal to the child.
  void signal(int signal_number) const;
  // What the child has written to stderr so far ("" before it starts).
  std::string stderr_so_far() const;
  // Whether the child catches signal_number (its handler is installed):
  // the SigCgt mask of /proc/PID/status.
  bool catches(int signal_number) const;
  // Waits for the child; exit_code is 128 + N when signal N ended it.
  CommandResult wait();

 private:
  TempDir capture_;
  int pid_ = -1;
};

// run_ctquant() with options (e.g. a file size limit).
CommandResult run_ctquant(const std::vector<std::string>& args, const RunOptions& options);

// Runs the synthetic checkpoint generator with args (through the emulator
// in a cross build, as run_ctquant does).
CommandResult run_make_checkpoint(const std::vector<std::string>& args);

// Runs `/bin/sh -c script` with CTQUANT set to the ctquant binary's path in
// its environment, and captures its exit code, stdout and stderr.
CommandResult run_shell(const std::string& script, const RunOptions& options = {});

// Writes a single-file checkpoint (model.safetensors and config.json) of
// n_weights BF16 weights [rows, cols] named model.layers.<i>.mlp.down_proj.weight,
// streamed from a cheap deterministic generator (finite values around 0.01),
// so that inputs of hundreds of MB cost no memory.
void write_large_checkpoint(const std::filesystem::path& dir, std::uint64_t n_weights,
                            std::uint64_t rows, std::uint64_t cols);

}  // namespace ctquant::test
