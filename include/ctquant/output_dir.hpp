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
  // Checks output against input and creates the temporary directory.
  // Throws Error{kUsage} when OUTPUT equals INPUT, lies inside it or contains
  // it, or exists and force is false; Error{kNoSpace} or Error{kIo} when
  // the temporary directory cannot be created.
  StagedOutput(const std::filesystem::path& output, const std::filesystem::path& input,
               bool force);
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  // The temporary directory to write into.
  const std::filesystem::path& dir() const { return temp_; }

  // Renames the temporary directory to OUTPUT (never over a directory that
  // appeared meanwhile). With force, an existing OUTPUT is swapped with the
  // new one in one atomic rename (renameat2 RENAME_EXCHANGE; on filesystems
  // without it, moved aside first) and removed only after the new one is in
  // place. Throws Error{kUsage} when OUTPUT appeared and force is false,
  // Error{kIo} when a rename fails.
  void commit();

 private:
  std::filesystem::path output_;
  std::filesystem::path temp_;
  bool force_ = false;
  bool committed_ = false;
};

// Checks that output can be written for input (see StagedOutput) without
// creating anything. Throws Error{kUsage}.
void check_output_path(const std::filesystem::path& output, const std::filesystem::path& input,
                       bool force);

}  // namespace ctquant
