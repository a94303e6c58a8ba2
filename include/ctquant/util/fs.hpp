// Flushing a directory's entries to storage.
//
// A file created, renamed or linked into a directory survives a power loss
// only once the directory itself is flushed (fsync(2) on the directory).
// The callers differ in what a failed flush means, so there are two entry
// points over one implementation:
//   - fsync_directory, where the flush is part of writing the result (the
//     directory execute_plan writes the shards into, the manifest's
//     directory): a failure fails the run;
//   - fsync_directory_best_effort, after a rename has already put the result
//     in place (StagedOutput, StagedFile), where failing would report as
//     lost an output that is there, and for the stage directory of a split
//     run (run_part, finalize_parts): a failure is ignored.
#pragma once

#include <filesystem>

namespace ctquant {

// fsync(2) of the directory `dir` (opened O_RDONLY | O_DIRECTORY). Throws
// Error{kIo} "DIR: cannot open to flush: REASON" when it cannot be opened,
// and throw_write_error(DIR, errno) (Error{kNoSpace} or Error{kIo}) when
// fsync fails, except EINVAL: some filesystems cannot fsync a directory,
// and then there is nothing to flush.
void fsync_directory(const std::filesystem::path& dir);

// fsync(2) of the directory `dir`, every failure (open or fsync) ignored.
void fsync_directory_best_effort(const std::filesystem::path& dir) noexcept;

}  // namespace ctquant
