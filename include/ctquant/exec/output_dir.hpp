// The output directory, written atomically.
//
// Everything is written into a temporary sibling of OUTPUT named
// `.<OUTPUT name>.ctquant-tmp-<pid>-<random>` (recognisable after a crash)
// and renamed into place only by commit(), after every file has been written
// and flushed. The destructor removes the temporary directory if commit() was
// not reached, so an error or an interrupt never leaves an OUTPUT behind.
#pragma once

#include <filesystem>

namespace ctquant {

// The marker every temporary output directory name contains.
inline constexpr const char* kTempDirMarker = ".ctquant-tmp-";

class StagedOutput {
 public:
  // Checks output against input (see check_output_path) and creates the
  // temporary directory. Throws Error{kUsage} when check_output_path does;
  // Error{kNoSpace} or Error{kIo} when the temporary directory cannot be
  // created.
  StagedOutput(const std::filesystem::path& output, const std::filesystem::path& input, bool force);
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  // The temporary directory to write into.
  const std::filesystem::path& dir() const { return temp_; }

  // Renames the temporary directory to OUTPUT (never over a directory that
  // appeared meanwhile). With force, an existing OUTPUT is swapped with the
  // new one in one atomic rename (renameat2 RENAME_EXCHANGE; on filesystems
  // without it, moved aside first) and removed only after the new one is in
  // place, and only when, under the temporary name, it is still a directory
  // force may replace (see check_output_path); otherwise it is put back.
  // Throws Error{kUsage} when OUTPUT appeared and force is false, or changed
  // into something force may not replace; Error{kIo} when a rename fails.
  void commit();

 private:
  std::filesystem::path output_;
  std::filesystem::path temp_;
  bool force_ = false;
  bool committed_ = false;
};

// Checks that output can be written for input without creating anything or
// reading input. Throws Error{kUsage} when OUTPUT
//   - equals INPUT, lies inside it or contains it (symbolic links resolved);
//   - is the current working directory or contains it (with or without force);
//   - exists and force is false;
//   - exists, force is true, and it is not a directory that force may
//     replace: one (not a symbolic link) that is empty, or whose entries are
//     all regular files (no subdirectories, symbolic links, devices, FIFOs or
//     sockets), at least one of them a *.safetensors file. The message names
//     the first offending entry in name order.
void check_output_path(const std::filesystem::path& output, const std::filesystem::path& input,
                       bool force);

// Throws Error{kUsage} when the directory that should hold OUTPUT does not
// exist. StagedOutput checks it; quantize checks it before INPUT is read
// when the run writes OUTPUT itself (a --part run writes only its stage).
void check_output_parent(const std::filesystem::path& output);

}  // namespace ctquant
