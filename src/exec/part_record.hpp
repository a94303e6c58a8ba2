// Private: what parts leave in the staging directory, shared by run_part
// (src/exec/parts.cpp), finalize_parts (src/exec/finalize.cpp) and the plan
// fingerprint (src/exec/part_fingerprint.cpp): the names of the files of a
// part, its record (part-0000I-of-0000N.json) and its log
// (part-0000I-of-0000N.log), the lock a part holds while it runs. The
// formats are described in include/ctquant/exec/parts.hpp and
// docs/scale-out.md; kRecordFormat versions them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/exec/parts.hpp"
#include "util/input_file.hpp"

namespace ctquant::detail {

// Version of the record and log formats; part of every plan fingerprint (a
// record of another format is of another plan). 2: the fingerprint holds a
// sample digest of every input shard.
inline constexpr int kRecordFormat = 2;

// ---- names in the stage ----

// "part-00002-of-00003".
std::string part_stem(const PartSpec& part);
std::string record_name(const PartSpec& part);  // "part-00002-of-00003.json"
std::string log_name(const PartSpec& part);     // "part-00002-of-00003.log"
std::string lock_name(const PartSpec& part);    // ".part-00002-of-00003.lock"
std::string work_name(const PartSpec& part);    // ".part-00002-of-00003.work"

// The part a record or log file name stands for ("part-00002-of-00003.json"
// with suffix ".json"), or nullopt (not zero-padded to five digits, not a
// part number).
std::optional<PartSpec> part_of_file_name(const std::string& name, std::string_view suffix);

// ---- small file operations ----

// Writes text to path in one step (StagedFile): a reader sees the old
// content or the new, whole.
void write_file_atomically(const std::filesystem::path& path, const std::string& text, bool fsync);

// A JSON file of the stage, read with the bounds of read_json_file.
nlohmann::json read_stage_json(const std::filesystem::path& path);

// An exclusive lock on a part (flock on its lock file in the stage), held
// while the part runs and while finalize assembles it; released when the
// object goes.
class PartLock {
 public:
  // Takes the lock; false when another process holds it. Throws Error{kIo}
  // when the lock file cannot be opened or locked.
  bool try_lock(const std::filesystem::path& path);

 private:
  UniqueFd fd_;
};

// ---- one file's entry in a record or a log ----

struct FileEntry {
  std::string name;
  std::uint64_t size = 0;
  std::string sha256;  // of the file as the part staged it
  std::vector<std::string> tensors;
};

nlohmann::json entry_json(const FileEntry& e);
// nullopt when j is not an entry (a name, size, sha256 and tensor names).
std::optional<FileEntry> entry_from_json(const nlohmann::json& j);

// ---- records ----

struct Record {
  std::string file_name;  // in the stage
  PartSpec part;
  std::string input_path;  // INPUT as the part saw it, absolute
  nlohmann::json plan;     // plan_fingerprint()
  std::vector<std::string> assigned;
  std::vector<FileEntry> files;
  bool complete = false;
  std::size_t files_kept = 0;
  std::size_t files_written = 0;
};

nlohmann::json record_json(const Record& r);

// Parses a record read from the stage file file_name. Throws
// Error{kBadInput} saying what is wrong with it ("no plan fingerprint", a
// record of another format, ...).
Record record_from_json(const nlohmann::json& j, const std::string& file_name);

// The fingerprint's own digest ("fingerprint" of plan_fingerprint()).
std::string fingerprint_of(const nlohmann::json& plan);

// ---- logs ----

// The entries of a log: its header names the plan, then one file per line.
struct Log {
  std::string plan_fingerprint;
  std::vector<FileEntry> files;
};

// The first line of a part's log.
std::string log_header(const PartSpec& part, const std::string& fingerprint);
// One line of a log: j and a newline.
std::string log_line(const nlohmann::json& j);

// Reads a log; a torn last line (the process died while appending it) is
// ignored. nullopt when the file cannot be read or has no valid header.
std::optional<Log> read_log(const std::filesystem::path& path);

// ---- plans ----

// True when the changes fingerprint_changes() named are all of input files
// of the same size and header whose sampled data differs: the same layout,
// other weights.
bool only_input_data_changed(const std::vector<std::string>& changes);

// ---- messages ----

// "\n  - a\n  - b": the lines of an error message's list.
std::string bullet_list(const std::vector<std::string>& lines);

}  // namespace ctquant::detail
