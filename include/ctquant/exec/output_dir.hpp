// The output directory, written atomically.
//
// Everything is written into a temporary sibling of OUTPUT named
// `.<OUTPUT name>.ctquant-tmp-<pid>-<random>` (recognisable after a crash)
// and renamed into place only by commit(), after every file has been written
// and flushed. The destructor removes the temporary directory if commit() was
// not reached, so an error or an interrupt never leaves an OUTPUT behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace ctquant {

// The marker every temporary output directory name contains.
inline constexpr const char* kTempDirMarker = ".ctquant-tmp-";

class StagedOutput {
 public:
  // Checks output against input with the path policy (check_run_paths in
  // path_policy.hpp; callers check every path of the run before INPUT is
  // read, this checks OUTPUT again where its temporary directory is made)
  // and creates the temporary directory. Throws Error{kUsage} when the
  // policy does; Error{kNoSpace} or Error{kIo} when the temporary directory
  // cannot be created.
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
  // force may replace (see check_output_replaceable); otherwise it is put
  // back. Throws Error{kUsage} when OUTPUT appeared and force is false, or
  // changed into something force may not replace; Error{kIo} when a rename
  // fails. Returns "" or, when the replaced OUTPUT could not be removed
  // (OUTPUT holds the new checkpoint; the run succeeded), a warning naming
  // what is left and the command that removes it.
  [[nodiscard]] std::string commit();

 private:
  std::filesystem::path output_;
  std::filesystem::path temp_;
  bool force_ = false;
  bool committed_ = false;
};

// A file written whole beside its final path, into a temporary sibling
// `.<name>.ctquant-tmp-<pid>-<random>`, flushed, and renamed into place only
// by commit(): a reader sees the old file or the new one, whole, and a
// failure leaves the old one (the destructor removes the temporary file).
// Used for --report, --write-recipe and the records of parts.
class StagedFile {
 public:
  // Writes text into the temporary sibling of path (fsync when asked).
  // label names the file in messages ("--report out.json"). Throws
  // Error{kNoSpace} or Error{kIo} naming label and the system's reason.
  StagedFile(const std::filesystem::path& path, std::string_view text, bool fsync,
             std::string label);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  // Renames the file into place (and flushes its directory when fsync was
  // asked). Throws Error{kIo} naming label.
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_;
  bool fsync_ = false;
  std::string label_;
  bool committed_ = false;
};

// Throws Error{kUsage} when an existing OUTPUT may not be replaced: it
// exists and force is false; or force is true and it is not a directory
// force may replace: one (not a symbolic link) that is empty, or whose
// entries are all regular files (no subdirectories, symbolic links, devices,
// FIFOs or sockets), at least one of them a *.safetensors file. The message
// names the first offending entry in name order. Part of check_run_paths.
void check_output_replaceable(const std::filesystem::path& output, bool force);

// Throws Error{kUsage} when the directory that should hold OUTPUT does not
// exist. Part of check_run_paths; StagedOutput checks it again.
void check_output_parent(const std::filesystem::path& output);

// Why the process cannot create files in the directories a run writes in,
// one line each ("cannot write in DIR (Permission denied), where the run
// would create its files"); empty when it can. The directories: OUTPUT's
// (when creates_output), and the staging directory's (itself when it
// exists, else the directory that would hold it) when stage is set.
// Checked with access(2), so root is refused only on a read-only
// filesystem. Throws nothing.
std::vector<std::string> unwritable_run_directories(const std::filesystem::path& output,
                                                    bool creates_output,
                                                    const std::filesystem::path* stage);

// How remove_directory removes.
enum class DirectoryRemoval {
  kTree,     // the directory and everything in it
  kIfEmpty,  // the directory only when it is empty (rmdir)
};

// The one function in ctquant that removes a directory, for the directories
// ctquant made: a temporary output directory, an OUTPUT --force replaced
// (once checked), a part's work directory, a staging directory finalize
// emptied. A path that is not a directory (a symbolic link to one included)
// is left alone. Returns false, with ec set, when it could not remove it
// (a non-empty directory under kIfEmpty: ENOTEMPTY).
bool remove_directory(const std::filesystem::path& dir, DirectoryRemoval how, std::error_code& ec);

// What an earlier run left beside a path it writes: a temporary sibling
// `.<name>.ctquant-tmp-<pid>-*` (a temporary output directory, the old
// OUTPUT moved aside, or a side file's temporary file) whose process no
// longer runs (kill -9, a second SIGINT, a power loss).
struct Leftover {
  std::filesystem::path path;
  int pid = 0;              // the process that made it
  std::uint64_t bytes = 0;  // of the regular files in it
  bool directory = false;
};

// The leftovers beside target (target's parent directory, entries in name
// order). Never removes anything; a pid that still runs (or cannot be told
// apart from one) is not a leftover.
std::vector<Leftover> find_leftovers(const std::filesystem::path& target);

// Bytes of the regular files below path (path itself when it is one),
// without following symbolic links; what can be read of it.
std::uint64_t tree_bytes(const std::filesystem::path& path);

}  // namespace ctquant
