// run_part and the small pieces of a split (exec/parts.hpp): the part
// specification, the staging directory's default, the assignment of files
// to parts, the refusal of a split with more parts than shards, and a part's
// run. finalize_parts is src/exec/finalize.cpp, the fingerprint
// src/exec/part_fingerprint.cpp, the record and log formats
// src/exec/part_record.{hpp,cpp}.
#include "ctquant/exec/parts.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/exec/output_dir.hpp"
#include "ctquant/exec/path_policy.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "ctquant/util/sha256.hpp"
#include "exec/part_record.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using detail::bullet_list;
using detail::entry_json;
using detail::FileEntry;
using detail::fingerprint_of;
using detail::lock_name;
using detail::log_header;
using detail::log_line;
using detail::log_name;
using detail::part_of_file_name;
using detail::PartLock;
using detail::read_log;
using detail::read_stage_json;
using detail::Record;
using detail::record_from_json;
using detail::record_json;
using detail::record_name;
using detail::work_name;
using detail::write_file_atomically;
using nlohmann::json;

PartSpec parse_part(std::string_view text) {
  const auto fail = [&] {
    return usage_error(fmt::format(
        "--part {}: expected I/N, the part I (from 1) of N parts, e.g. --part 2/3 (N at most {})",
        text, kMaxParts));
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) throw fail();
  const auto number = [&](std::string_view digits) -> unsigned {
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      throw fail();
    }
    return static_cast<unsigned>(std::stoul(std::string(digits)));
  };
  const PartSpec part{number(text.substr(0, slash)), number(text.substr(slash + 1))};
  if (part.count < 1 || part.count > kMaxParts || part.index < 1 || part.index > part.count) {
    throw fail();
  }
  return part;
}

std::string part_name(const PartSpec& part) { return fmt::format("{}/{}", part.index, part.count); }

fs::path default_stage_dir(const fs::path& output) {
  fs::path abs = fs::absolute(output).lexically_normal();
  if (!abs.has_filename() && abs.has_parent_path()) abs = abs.parent_path();
  return abs.parent_path() / fmt::format(".{}.ctquant-parts", abs.filename().string());
}

std::vector<unsigned> assign_parts(const std::vector<PlannedFile>& files, unsigned count) {
  std::vector<std::size_t> order(files.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return files[a].work > files[b].work;
  });
  std::vector<std::uint64_t> load(std::max(1u, count), 0);
  std::vector<unsigned> owner(files.size(), 0);
  for (const std::size_t f : order) {
    const auto least = static_cast<unsigned>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[f] = least;
    load[least] += files[f].work;
  }
  return owner;
}

void check_part_count(const QuantizePlan& plan, const PartSpec& part) {
  const std::size_t shards = plan.shards.size();
  if (part.count <= std::max<std::size_t>(shards, 1)) return;
  std::string names;
  for (std::size_t i = 0; i < shards && i < 3; ++i) {
    names += (i == 0 ? "" : ", ") + plan.shards[i].file_name;
  }
  if (shards > 3) names += fmt::format(", ... ({} more)", shards - 3);
  const std::string why =
      "a part writes whole output files, which finalize links into OUTPUT unchanged, so one "
      "shard cannot be split between parts";
  if (shards == 1) {
    throw usage_error(fmt::format(
        "--part {}: the output is one shard ({}: INPUT is a single-file checkpoint) and {}: "
        "{} would have no shard to write. Quantize it in one process: without --part (with "
        "--resume to make the run resumable), or with --part 1/1",
        part_name(part), names, why,
        part.count == 2 ? std::string("part 2") : fmt::format("parts 2 to {}", part.count)));
  }
  throw usage_error(fmt::format(
      "--part {}: the output has {} shards ({}) and {}: with {} parts, {} of them would have "
      "no shard to write. Split the run in at most {} parts (--part I/{})",
      part_name(part), shards, names, why, part.count, part.count - shards, shards, shards));
}

// ---------------------------------------------------------------------------
// A part.

namespace {

bool only_options_changed(const std::vector<std::string>& changes) {
  return std::all_of(changes.begin(), changes.end(), [](const std::string& c) {
    return c.starts_with("options: ") || c.starts_with("ctquant version");
  });
}

// Files finished by earlier runs of this plan, from every record and log in
// the stage whose plan fingerprint is `fingerprint`.
std::map<std::string, FileEntry> logged_files(const fs::path& stage, const std::string& fingerprint) {
  std::map<std::string, FileEntry> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(stage, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (part_of_file_name(name, ".json")) {
      try {
        const Record r = record_from_json(read_stage_json(it->path()), name);
        if (fingerprint_of(r.plan) != fingerprint) continue;
        for (const FileEntry& e : r.files) found.emplace(e.name, e);
      } catch (const std::exception&) {
        // Not a record this run can use; finalize reports it.
      }
    } else if (part_of_file_name(name, ".log")) {
      const auto log = read_log(it->path());
      if (!log || log->plan_fingerprint != fingerprint) continue;
      for (const FileEntry& e : log->files) found.emplace(e.name, e);
    }
  }
  return found;
}

// One run of a part, stage by stage: the stage adopted and the part locked,
// its files assigned, those an earlier run finished kept (--resume), the
// record and log started, the other files written one by one, the record
// completed.
class PartRun {
 public:
  PartRun(const Checkpoint& checkpoint, const QuantizePlan& plan, const PartOptions& options,
          const ExecuteOptions& execute)
      : checkpoint_(checkpoint),
        plan_(plan),
        options_(options),
        execute_(execute),
        log_(options.logger),
        part_(options.part),
        who_(fmt::format("part {}", part_name(part_))),
        stage_(options.stage) {}

  // A split with a part that has no shard to write is refused before
  // anything is created (check_part_count).
  void check_split() const { check_part_count(plan_, part_); }

  // quantize() checked the stage with the path policy before INPUT was read;
  // checked again here, where it is created or adopted. Takes the part's lock.
  void adopt_stage() {
    const fs::path& stage = stage_;
    std::error_code ec;
    if (const std::string why = stage_refusal(stage); !why.empty()) {
      throw usage_error(fmt::format("staging directory {}: it {}; choose another", stage.string(),
                                    why));
    }
    if (!fs::is_directory(stage, ec)) {
      if (!fs::is_directory(fs::absolute(stage).parent_path(), ec)) {
        throw usage_error(fmt::format("the directory {} that should hold the staging directory {} "
                                      "does not exist",
                                      fs::absolute(stage).parent_path().string(), stage.string()));
      }
      fs::create_directory(stage, ec);
      if (ec && !fs::is_directory(stage)) {
        throw io_error(fmt::format("{}: cannot create the staging directory: {}", stage.string(),
                                   ec.message()));
      }
    }
    // An absent or empty directory becomes a stage ctquant made: the marker is
    // its first entry, created in place (parts started together find either an
    // empty directory or the marker, never a temporary file instead of it).
    const fs::path marker = stage / kStageMarkerName;
    detail::UniqueFd marker_fd(::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                                      0644));
    if (marker_fd.get() < 0) {
      throw_write_error(fmt::format("{}: cannot create", marker.string()), errno);
    }
    marker_fd = detail::UniqueFd();
    if (!lock_.try_lock(stage / lock_name(part_))) {
      throw usage_error(fmt::format("{} is already running in another process ({} is locked)",
                                    who_, (stage / lock_name(part_)).string()));
    }
  }

  // What identifies the input and the plan: a sample of every shard, then
  // the fingerprint the record holds and finalize compares between parts.
  void identify_input() {
    summary_.input_sample = sample_input(checkpoint_, execute_.threads, execute_.cancel);
    const InputSample& sample = summary_.input_sample;
    fingerprint_ = plan_fingerprint(checkpoint_, plan_, sample);
    fp_ = fingerprint_of(fingerprint_);
    if (log_) {
      log_->info(
          "{}: input identified by a sample (the first and last {} bytes of every "
          "tensor): {} shard(s), {} read(s), {} bytes in {:.2f} s",
          who_, kInputSampleBytes, checkpoint_.shards.size(), sample.reads, sample.bytes_read,
          sample.seconds);
    }
  }

  // The files of the plan this part writes (assign_parts), and the record
  // that names them.
  void assign_files() {
    files_ = plan_output_files(checkpoint_, plan_);
    const std::vector<unsigned> owner = assign_parts(files_, part_.count);
    record_.file_name = record_name(part_);
    record_.part = part_;
    record_.input_path = fs::absolute(checkpoint_.root).lexically_normal().string();
    record_.plan = fingerprint_;
    for (std::size_t i = 0; i < files_.size(); ++i) {
      if (owner[i] != part_.index - 1) continue;
      assigned_.push_back(&files_[i]);
      record_.assigned.push_back(files_[i].name);
      summary_.bytes_assigned += files_[i].size;
    }
    summary_.files_assigned = assigned_.size();
    summary_.record = stage_ / record_.file_name;
  }

  // What an earlier run left: with --resume, the files it finished that are
  // still intact; a changed plan is refused.
  void keep_finished_files() {
    if (!options_.resume) return;
    std::error_code ec;
    const fs::path previous = stage_ / record_.file_name;
    if (fs::exists(previous, ec)) {
      const Record before = record_from_json(read_stage_json(previous), record_.file_name);
      const std::vector<std::string> changes = fingerprint_changes(
          before.plan, fingerprint_, {"in the part written earlier", "in this run"});
      if (!changes.empty()) {
        const std::string message = fmt::format(
            "cannot resume {}: the plan changed since {} was written:{}\nto finish that run, "
            "resume with the input and options of the part written earlier (--resume); to run "
            "with this run's, write every part into a fresh OUTPUT",
            who_, previous.string(), bullet_list(changes));
        throw only_options_changed(changes) ? usage_error(message) : bad_input(message);
      }
    }
    const std::map<std::string, FileEntry> logged = logged_files(stage_, fp_);
    for (const PlannedFile* f : assigned_) {
      const auto it = logged.find(f->name);
      if (it == logged.end() || it->second.size != f->size || it->second.tensors != f->tensors) {
        continue;
      }
      const fs::path staged = stage_ / f->name;
      if (!fs::is_regular_file(fs::symlink_status(staged, ec)) ||
          fs::file_size(staged, ec) != f->size) {
        continue;
      }
      if (sha256_file(staged, staged.string()).sha256 == it->second.sha256) {
        kept_.emplace(f->name, it->second);
      }
    }
  }

  // A fresh work directory; the record and the log started with what is
  // kept, the log left open for appending.
  void start_record_and_log() {
    std::error_code ec;
    remove_directory(work_, DirectoryRemoval::kTree, ec);
    fs::create_directory(work_, ec);
    if (ec) {
      throw io_error(fmt::format("{}: cannot create the work directory: {}", work_.string(),
                                 ec.message()));
    }
    for (const PlannedFile* f : assigned_) {
      if (const auto it = kept_.find(f->name); it != kept_.end()) {
        record_.files.push_back(it->second);
      }
    }
    record_.files_kept = record_.files.size();
    write_file_atomically(stage_ / record_.file_name, record_json(record_).dump(1) + "\n",
                          execute_.fsync);
    std::string log_text = log_header(part_, fp_);
    for (const FileEntry& e : record_.files) log_text += log_line(entry_json(e));
    write_file_atomically(log_path_, log_text, execute_.fsync);
    log_fd_ = detail::UniqueFd(::open(log_path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
    if (log_fd_.get() < 0) {
      throw io_error(fmt::format("{}: cannot open: {}", log_path_.string(), std::strerror(errno)));
    }
    summary_.files_kept = kept_.size();
    if (log_) {
      if (options_.resume) {
        log_->info("{}: {} of {} file(s) kept from an earlier run (sha256 checked), {} to write",
                   who_, kept_.size(), assigned_.size(), assigned_.size() - kept_.size());
      } else {
        log_->info("{}: {} file(s) to write, {} bytes, into {}", who_, assigned_.size(),
                   summary_.bytes_assigned, stage_.string());
      }
    }
  }

  // Writes the files not kept one after another, each into the work
  // directory, then hashed, renamed into the stage and logged; the progress
  // over the whole part.
  void write_files() {
    // The input bytes still to read, as plan_output_files estimates them.
    std::uint64_t input_total = 0;
    for (const PlannedFile* f : assigned_) {
      if (kept_.count(f->name) == 0) input_total += f->work - f->size;
    }
    Progress before;  // what the files written so far consumed
    for (const PlannedFile* f : assigned_) {
      if (kept_.count(f->name) > 0) continue;
      if (execute_.cancel != nullptr && execute_.cancel->load()) {
        throw Error(ErrorKind::kInterrupted,
                    "interrupted by a signal before the part was complete");
      }
      ExecuteOptions one = execute_;
      one.files = std::set<std::string>{f->name};
      Progress last;
      if (execute_.on_progress) {
        one.on_progress = [&](const Progress& p) {
          if (p.phase != ProgressPhase::kWrite) return execute_.on_progress(p);  // own totals
          last = p;
          Progress all;
          all.bytes_done = before.bytes_done + p.bytes_done;
          all.bytes_total = std::max(input_total, all.bytes_done);
          all.tensors_done = before.tensors_done + p.tensors_done;
          all.tensors_total = before.tensors_total + p.tensors_total;
          execute_.on_progress(all);
        };
      }
      const ExecuteStats stats = execute_plan(checkpoint_, plan_, work_, one);
      before.bytes_done += last.bytes_done;
      before.tensors_done += last.tensors_done;
      before.tensors_total += last.tensors_total;
      add_stats(stats);
      stage_file(*f);
    }
    if (log_) {
      for (const std::string& w : summary_.execute.warnings) log_->warn("{}: {}", who_, w);
    }
    std::sort(summary_.execute.module_errors.begin(), summary_.execute.module_errors.end(),
              [](const ModuleError& a, const ModuleError& b) { return a.module < b.module; });
  }

  // Complete: the record in plan order, the log and work directory gone.
  PartSummary complete() {
    std::error_code ec;
    std::map<std::string, FileEntry> by_name;
    for (const FileEntry& e : record_.files) by_name.emplace(e.name, e);
    record_.files.clear();
    for (const PlannedFile* f : assigned_) record_.files.push_back(by_name.at(f->name));
    // Each of them hashed by this run from the staged file: written, or kept
    // after its sha256 was checked.
    for (const FileEntry& e : record_.files) {
      summary_.hashed.push_back(ManifestEntry{e.name, e.size, e.sha256});
    }
    record_.complete = true;
    record_.files_written = summary_.files_written;
    write_file_atomically(stage_ / record_.file_name, record_json(record_).dump(1) + "\n",
                          execute_.fsync);
    log_fd_ = detail::UniqueFd();
    fs::remove(log_path_, ec);
    remove_directory(work_, DirectoryRemoval::kTree, ec);
    if (execute_.fsync) fsync_directory_best_effort(stage_);
    if (log_) {
      log_->info("{}: complete: {} file(s) written, {} kept; record {}", who_,
                 summary_.files_written, summary_.files_kept, summary_.record.string());
    }
    return summary_;
  }

 private:
  // Adds what execute_plan() measured of one file to the part's summary
  // (each warning once).
  void add_stats(const ExecuteStats& stats) {
    summary_.execute.seconds_stream += stats.seconds_stream;
    summary_.execute.seconds_flush += stats.seconds_flush;
    summary_.execute.bytes_read += stats.bytes_read;
    summary_.execute.bytes_written += stats.bytes_written;
    ExecuteStats::MseRows& mse = summary_.execute.mse_rows;
    mse.cutoff += stats.mse_rows.cutoff;
    mse.amax += stats.mse_rows.amax;
    mse.quantize += stats.mse_rows.quantize;
    mse.reused_amax += stats.mse_rows.reused_amax;
    mse.reused_quantize += stats.mse_rows.reused_quantize;
    mse.kept_bytes = std::max(mse.kept_bytes, stats.mse_rows.kept_bytes);
    summary_.execute.module_errors.insert(summary_.execute.module_errors.end(),
                                          stats.module_errors.begin(), stats.module_errors.end());
    for (const std::string& w : stats.warnings) {
      if (std::find(summary_.execute.warnings.begin(), summary_.execute.warnings.end(), w) ==
          summary_.execute.warnings.end()) {
        summary_.execute.warnings.push_back(w);
      }
    }
  }

  // Moves a file written into the work directory into the stage, with its
  // digest in the log and the record.
  void stage_file(const PlannedFile& f) {
    std::error_code ec;
    const FileDigest digest = sha256_file(work_ / f.name, (work_ / f.name).string());
    fs::rename(work_ / f.name, stage_ / f.name, ec);
    if (ec) {
      throw io_error(fmt::format("{}: cannot move into the staging directory: {}",
                                 (work_ / f.name).string(), ec.message()));
    }
    if (execute_.fsync) fsync_directory_best_effort(stage_);
    const FileEntry entry{f.name, digest.size, digest.sha256, f.tensors};
    const std::string line = log_line(entry_json(entry));
    if (::write(log_fd_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      throw_write_error(log_path_.string(), errno);
    }
    if (execute_.fsync && ::fsync(log_fd_.get()) != 0) {
      throw_write_error(log_path_.string(), errno);
    }
    record_.files.push_back(entry);
    ++summary_.files_written;
    if (log_) {
      log_->debug("{}: {} written ({} bytes, sha256 {})", who_, f.name, digest.size,
                  digest.sha256);
    }
  }

  const Checkpoint& checkpoint_;
  const QuantizePlan& plan_;
  const PartOptions& options_;
  const ExecuteOptions& execute_;
  const std::shared_ptr<spdlog::logger>& log_;
  const PartSpec part_;
  const std::string who_;  // "part I/N", for messages
  const fs::path& stage_;
  const fs::path work_ = stage_ / work_name(part_);
  const fs::path log_path_ = stage_ / log_name(part_);
  PartLock lock_;
  std::vector<PlannedFile> files_;  // every file of the plan
  json fingerprint_;
  std::string fp_;  // fingerprint_of(fingerprint_)
  Record record_;
  PartSummary summary_;
  std::vector<const PlannedFile*> assigned_;  // this part's, in plan order
  std::map<std::string, FileEntry> kept_;     // --resume: finished by an earlier run, intact
  detail::UniqueFd log_fd_;                   // the log, open for appending
};

}  // namespace

PartSummary run_part(const Checkpoint& checkpoint, const QuantizePlan& plan,
                     const PartOptions& options, const ExecuteOptions& execute) {
  PartRun run(checkpoint, plan, options, execute);
  run.check_split();
  run.adopt_stage();
  run.identify_input();
  run.assign_files();
  run.keep_finished_files();
  run.start_record_and_log();
  run.write_files();
  return run.complete();
}

bool stage_in_use(const fs::path& stage) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(stage, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(".part-") || !name.ends_with(".lock")) continue;
    const detail::UniqueFd fd(::open(it->path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0) continue;
    // A shared lock is refused while a part (or finalize) holds its
    // exclusive one; taken, it is released when fd closes.
    if (::flock(fd.get(), LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) return true;
  }
  return false;
}

}  // namespace ctquant
