// finalize_parts (exec/parts.hpp): the records of one run checked against
// each other, the plan and the staged files, then OUTPUT assembled from
// them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/exec/output_dir.hpp"
#include "ctquant/exec/parts.hpp"
#include "ctquant/exec/path_policy.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "ctquant/util/sha256.hpp"
#include "exec/part_record.hpp"
#include "util/input_file.hpp"
#include "util/ordered_parallel.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using detail::bullet_list;
using detail::FileEntry;
using detail::fingerprint_of;
using detail::lock_name;
using detail::log_name;
using detail::part_of_file_name;
using detail::PartLock;
using detail::read_log;
using detail::read_stage_json;
using detail::Record;
using detail::record_from_json;
using detail::record_name;
using detail::work_name;
using nlohmann::json;

namespace {

// Problems listed by finalize before "... and N more".
constexpr std::size_t kMaxProblemsListed = 40;

// Links (or, across filesystems, copies) a staged file into the output
// directory.
void place_file(const fs::path& from, const fs::path& to, bool fsync) {
  if (::link(from.c_str(), to.c_str()) == 0) return;
  const int error = errno;
  if (error != EXDEV && error != EPERM && error != EMLINK && error != ENOTSUP) {
    throw_write_error(fmt::format("{}: cannot link into {}", from.string(), to.string()), error);
  }
  std::uint64_t size = 0;
  const detail::UniqueFd in = detail::open_input_file(from, from.string(), size);
  OutputFile out(to);
  out.reserve(size);
  out.copy_from(in.get(), 0, 0, size);
  if (fsync) out.sync_and_close();
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : std::string(separator)) + item;
  return text;
}

void check_cancel(const std::atomic<bool>* cancel) {
  if (cancel != nullptr && cancel->load()) {
    throw Error(ErrorKind::kInterrupted, "interrupted by a signal before OUTPUT was complete");
  }
}

// One finalize, stage by stage: the records in the stage read, the run
// most of them belong to chosen, its parts checked complete and locked, the
// files they staged checked against the plan, every problem reported at
// once; then OUTPUT assembled and committed, and the stage cleaned.
class Finalization {
 public:
  explicit Finalization(const FinalizeOptions& options)
      : options_(options),
        log_(options.logger),
        stage_(options.stage.value_or(default_stage_dir(options.output))) {
    summary_.stage = stage_;
  }

  // The stage must exist; OUTPUT and the stage against each other and the
  // working directory, the stage a stage ctquant made; against INPUT once
  // the records name it.
  void check_paths() {
    std::error_code ec;
    if (!fs::is_directory(stage_, ec)) {
      throw bad_input(fmt::format(
          "no staging directory {}: nothing to finalize (run `ctquant quantize INPUT {} --part "
          "I/N` for each part first{})",
          stage_.string(), options_.output.string(),
          options_.stage ? "" : ", or give the parts' --stage DIR"));
    }
    paths_.output = options_.output;
    paths_.force = options_.force;
    paths_.stage = stage_;
    paths_.stage_named = options_.stage.has_value();
    check_run_paths(paths_);
  }

  // Every record in the stage (and which parts left a log); none at all is
  // an error at once.
  void read_records() {
    std::error_code ec;
    std::vector<std::string> names;
    for (auto it = fs::directory_iterator(stage_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    if (ec) throw io_error(fmt::format("{}: cannot list: {}", stage_.string(), ec.message()));
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      if (const auto part = part_of_file_name(name, ".log")) {
        if (!options_.parts || part->count == *options_.parts) logs_.insert(name);
        continue;
      }
      const auto part = part_of_file_name(name, ".json");
      if (!part || (options_.parts && part->count != *options_.parts)) continue;
      try {
        Record r = record_from_json(read_stage_json(stage_ / name), name);
        if (r.part != *part) {
          problems_.push_back(
              fmt::format("{}: holds the record of part {} (a copied or renamed "
                          "record: a duplicated part)",
                          name, part_name(r.part)));
          continue;
        }
        records_.push_back(std::move(r));
      } catch (const Error& e) {
        problems_.push_back(e.what());
      }
    }
    if (records_.empty()) {
      problems_.push_back(
          fmt::format("{}: no part record: run `ctquant quantize INPUT {} --part "
                      "I/N` for each part first",
                      stage_.string(), options_.output.string()));
      throw bad_input(
          fmt::format("cannot finalize {}; OUTPUT was not created and the staging "
                      "directory is left as it is:{}",
                      options_.output.string(), bullet_list(problems_)));
    }
  }

  // The run: the plan and part count most records agree on (on a tie, the
  // one of the lowest part); the records of other runs are problems, named
  // with what differs from the run's first part. Parts of the same split
  // whose inputs differ only in their data (the same layout, other weights)
  // are named as such.
  void choose_run() {
    struct Votes {
      std::size_t records = 0;
      unsigned lowest_part = 0;
    };
    std::map<std::pair<unsigned, std::string>, Votes> votes;
    for (const Record& r : records_) {
      Votes& v = votes[{r.part.count, fingerprint_of(r.plan)}];
      v.lowest_part = v.records++ == 0 ? r.part.index : std::min(v.lowest_part, r.part.index);
    }
    const auto [count, fingerprint] =
        std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) {
          return a.second.records != b.second.records ? a.second.records < b.second.records
                                                      : a.second.lowest_part > b.second.lowest_part;
        })->first;
    count_ = count;
    fingerprint_ = fingerprint;
    for (const Record& r : records_) {
      if (r.part.count == count_ && fingerprint_of(r.plan) == fingerprint_) {
        by_part_[r.part.index] = &r;
      }
    }
    reference_ = by_part_.begin()->second;
    for (const Record& r : records_) {
      if (r.part.count == count_ && fingerprint_of(r.plan) == fingerprint_) continue;
      const std::vector<std::string> changes =
          fingerprint_changes(r.plan, reference_->plan,
                              {fmt::format("in part {}", part_name(r.part)),
                               fmt::format("in part {}", part_name(reference_->part))});
      if (r.part.count == count_ && detail::only_input_data_changed(changes)) {
        other_input_.insert(r.part.index);
        problems_.push_back(fmt::format(
            "{}: part {} read other input data than part {}: {} (INPUT {} for part {}, {} for "
            "part {}: two checkpoints of the same layout, or one changed while the parts ran); "
            "rerun the parts that read the wrong one",
            r.file_name, part_name(r.part), part_name(reference_->part), join(changes, "; "),
            r.input_path, part_name(r.part), reference_->input_path, part_name(reference_->part)));
        continue;
      }
      std::vector<std::string> why;
      if (r.part.count != count_) {
        why.push_back(fmt::format("split in {} parts, not {}", r.part.count, count_));
      }
      if (fingerprint_of(r.plan) != fingerprint_) {
        for (const std::string& c : changes) why.push_back(c);
      }
      // The same split: the part can be run again as the others ran.
      const std::string rerun =
          r.part.count == count_
              ? fmt::format(
                    "rerun part {} with the input and options of part {} (--part {} "
                    "--resume), or remove its record",
                    part_name(r.part), part_name(reference_->part), part_name(r.part))
              : std::string("remove it");
      problems_.push_back(fmt::format(
          "{}: part {} of another run than part {} ({}); {}, or the staging directory, if that "
          "run is abandoned",
          r.file_name, part_name(r.part), part_name(reference_->part), join(why, "; "), rerun));
    }
  }

  // Every part of the run, complete, and none running (each part's lock is
  // held from here on).
  void lock_complete_parts() {
    for (unsigned i = 1; i <= count_; ++i) {
      const PartSpec part{i, count_};
      const auto it = by_part_.find(i);
      if (it == by_part_.end()) {
        all_complete_ = false;
        const bool foreign = std::any_of(records_.begin(), records_.end(),
                                         [&](const Record& r) { return r.part == part; });
        if (other_input_.count(i) > 0) {
          problems_.push_back(fmt::format(
              "part {}: it read other input data than part {} (above): run it again on the "
              "INPUT the other parts read (ctquant quantize INPUT {} --part {})",
              part_name(part), part_name(reference_->part), options_.output.string(),
              part_name(part)));
        } else if (foreign) {
          problems_.push_back(fmt::format(
              "part {}: its record is of another run (above): run this part again (ctquant "
              "quantize INPUT {} --part {})",
              part_name(part), options_.output.string(), part_name(part)));
        } else {
          problems_.push_back(fmt::format(
              "part {}: no record in {}: it has not run (ctquant quantize INPUT {} --part {})",
              part_name(part), stage_.string(), options_.output.string(), part_name(part)));
        }
        continue;
      }
      locks_.emplace_back();
      if (!locks_.back().try_lock(stage_ / lock_name(part))) {
        all_complete_ = false;
        problems_.push_back(fmt::format("part {}: running now ({} is locked)", part_name(part),
                                        (stage_ / lock_name(part)).string()));
        continue;
      }
      const Record& r = *it->second;
      if (!r.complete) {
        all_complete_ = false;
        std::size_t done = r.files.size();
        if (logs_.count(log_name(part)) > 0) {
          if (const auto l = read_log(stage_ / log_name(part))) done = l->files.size();
        }
        problems_.push_back(
            fmt::format("part {}: not complete: {} of {} file(s) written; it "
                        "stopped (rerun it with --resume to finish it)",
                        part_name(part), done, r.assigned.size()));
      }
    }
  }

  // Every planned file written once, by a complete part, staged with its
  // size; with every part complete, the plan's tensors and bytes all there.
  void check_staged_files() {
    std::error_code ec;
    const json& output = reference_->plan.at("output");
    std::map<std::string, std::uint64_t> planned;
    for (const json& f : output.at("files")) {
      planned[f.at("name").get<std::string>()] = f.at("size").get<std::uint64_t>();
      plan_order_.push_back(f.at("name").get<std::string>());
    }
    std::map<std::string, std::string> tensor_file;
    for (const auto& [index, r] : by_part_) {
      if (!r->complete) continue;
      for (const FileEntry& e : r->files) {
        const auto p = planned.find(e.name);
        if (p == planned.end()) {
          problems_.push_back(
              fmt::format("{} (part {}): not a file of the plan", e.name, part_name(r->part)));
          continue;
        }
        if (const auto [at, inserted] = written_by_.emplace(e.name, r); !inserted) {
          problems_.push_back(fmt::format("{}: recorded by part {} and by part {}", e.name,
                                          part_name(at->second->part), part_name(r->part)));
          continue;
        }
        if (e.size != p->second) {
          problems_.push_back(fmt::format("{} (part {}): {} bytes recorded, the plan has {}",
                                          e.name, part_name(r->part), e.size, p->second));
        }
        const fs::path staged = stage_ / e.name;
        if (!fs::is_regular_file(fs::symlink_status(staged, ec))) {
          problems_.push_back(fmt::format("{} (part {}): missing from {}", e.name,
                                          part_name(r->part), stage_.string()));
        } else if (const auto size = fs::file_size(staged, ec); size != e.size) {
          problems_.push_back(fmt::format("{} (part {}): {} bytes in {}, {} recorded", e.name,
                                          part_name(r->part), size, stage_.string(), e.size));
        }
        total_ += e.size;
        for (const std::string& t : e.tensors) {
          if (const auto [at, inserted] = tensor_file.emplace(t, e.name); !inserted) {
            problems_.push_back(fmt::format("tensor '{}': in {} and in {}", t, at->second, e.name));
          }
        }
      }
    }
    if (!all_complete_) return;
    for (const std::string& name : plan_order_) {
      if (written_by_.count(name) == 0) {
        problems_.push_back(fmt::format("{}: written by no part", name));
      }
    }
    std::vector<std::string> tensors;
    for (const auto& [t, file] : tensor_file) tensors.push_back(t);  // sorted
    Sha256 hash;
    for (const std::string& t : tensors) {
      hash.update(t);
      hash.update(std::string_view("\n", 1));
    }
    if (tensors.size() != output.at("tensors").get<std::size_t>() ||
        hash.hex_digest() != output.at("tensors_sha256").get<std::string>()) {
      problems_.push_back(fmt::format("the parts hold {} tensors, not the {} tensors of the plan",
                                      tensors.size(), output.at("tensors").get<std::size_t>()));
    }
    if (total_ != output.at("bytes").get<std::uint64_t>()) {
      problems_.push_back(fmt::format("the parts' files hold {} bytes, the plan {}", total_,
                                      output.at("bytes").get<std::uint64_t>()));
    }
    summary_.tensors = tensors.size();
  }

  // Once nothing else is wrong: every staged file hashed again (threads
  // files at a time) and compared with the sha256 its part recorded, so that
  // OUTPUT holds the bytes the parts wrote and its manifest says so. The
  // files this process hashed itself (FinalizeOptions::hashed) are not read
  // again.
  void check_staged_digests() {
    if (!problems_.empty()) return;
    std::map<std::string, const ManifestEntry*> known;
    for (const ManifestEntry& e : options_.hashed) known[e.name] = &e;
    struct Check {
      const FileEntry* entry;
      const Record* part;
    };
    std::vector<Check> checks;
    std::uint64_t bytes = 0;
    for (const std::string& name : plan_order_) {
      const auto by = written_by_.find(name);
      if (by == written_by_.end()) continue;
      const auto e = std::find_if(by->second->files.begin(), by->second->files.end(),
                                  [&](const FileEntry& f) { return f.name == name; });
      const auto k = known.find(name);
      if (k != known.end() && k->second->sha256 == e->sha256 && k->second->size == e->size) {
        continue;
      }
      checks.push_back({&*e, by->second});
      bytes += e->size;
    }
    if (checks.empty()) return;
    const unsigned threads = std::max(1u, options_.threads);
    if (log_) {
      log_->info("finalize: checking the sha256 of {} staged file(s), {} bytes, {} at a time",
                 checks.size(), bytes, threads);
    }
    detail::ordered_parallel<std::optional<std::string>>(
        checks.size(), threads,
        [&](std::size_t i, unsigned) -> std::optional<std::string> {
          check_cancel(options_.cancel);
          const FileEntry& e = *checks[i].entry;
          const std::string part = part_name(checks[i].part->part);
          const fs::path staged = stage_ / e.name;
          const FileDigest got = sha256_file(staged, staged.string(), options_.cancel);
          if (got.size == e.size && got.sha256 == e.sha256) return std::nullopt;
          return fmt::format(
              "{} (part {}): the file in {} is not the one part {} wrote: sha256 {} ({} bytes), "
              "recorded {} ({} bytes); it changed after the part ran: rerun the part to write it "
              "again (ctquant quantize INPUT {} --part {} --resume)",
              e.name, part, stage_.string(), part, got.sha256, got.size, e.sha256, e.size,
              options_.output.string(), part);
        },
        [&](std::size_t, std::optional<std::string> problem) {
          if (problem) problems_.push_back(std::move(*problem));
        });
  }

  // Throws Error{kBadInput} listing the problems found (the first
  // kMaxProblemsListed of them).
  void throw_problems() const {
    if (problems_.empty()) return;
    std::vector<std::string> listed(
        problems_.begin(), problems_.begin() + static_cast<std::ptrdiff_t>(
                                                   std::min(problems_.size(), kMaxProblemsListed)));
    if (problems_.size() > kMaxProblemsListed) {
      listed.push_back(fmt::format("... and {} more", problems_.size() - kMaxProblemsListed));
    }
    throw bad_input(
        fmt::format("cannot finalize {} from {}; OUTPUT was not created and the "
                    "staging directory is left as it is:{}",
                    options_.output.string(), stage_.string(), bullet_list(listed)));
  }

  // Assemble: every file into the temporary output directory, the manifest,
  // then the rename.
  void assemble() {
    check_cancel(options_.cancel);
    paths_.input = reference_->input_path;
    check_run_paths(paths_);
    StagedOutput staged(options_.output, reference_->input_path, options_.force);
    for (const std::string& name : plan_order_) {
      check_cancel(options_.cancel);
      place_file(stage_ / name, staged.dir() / name, options_.fsync);
    }
    // The manifest from the digests each part computed of the file it staged
    // (`ctquant verify OUTPUT --manifest` hashes the files again).
    for (const auto& [name, r] : written_by_) {
      for (const FileEntry& e : r->files) {
        if (e.name == name) summary_.manifest.push_back(ManifestEntry{e.name, e.size, e.sha256});
      }
    }
    std::sort(summary_.manifest.begin(), summary_.manifest.end(),
              [](const ManifestEntry& a, const ManifestEntry& b) { return a.name < b.name; });
    const ManifestEntry manifest = write_manifest(staged.dir(), summary_.manifest, options_.fsync);
    summary_.manifest.push_back(manifest);
    std::sort(summary_.manifest.begin(), summary_.manifest.end(),
              [](const ManifestEntry& a, const ManifestEntry& b) { return a.name < b.name; });
    if (options_.fsync) fsync_directory_best_effort(staged.dir());
    summary_.parts = count_;
    summary_.files = plan_order_.size();
    summary_.bytes = total_ + manifest.size;
    if (options_.before_commit) options_.before_commit(summary_);
    check_cancel(options_.cancel);
    if (const std::string left = staged.commit(); !left.empty() && log_) log_->warn("{}", left);
  }

  // The stage: the files placed, the records, logs, locks and work
  // directories of this run; the directory itself when nothing else is left.
  void clean_stage() {
    std::error_code ec;
    for (const std::string& name : plan_order_) fs::remove(stage_ / name, ec);
    for (unsigned i = 1; i <= count_; ++i) {
      const PartSpec part{i, count_};
      fs::remove(stage_ / record_name(part), ec);
      fs::remove(stage_ / log_name(part), ec);
      fs::remove(stage_ / lock_name(part), ec);
      remove_directory(stage_ / work_name(part), DirectoryRemoval::kTree, ec);
    }
    // The marker goes last, and only when nothing else is left: a stage that
    // still holds another run's files stays a stage ctquant made.
    std::size_t others = 0;
    for (auto it = fs::directory_iterator(stage_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      if (it->path().filename() != kStageMarkerName) ++others;
    }
    if (!ec && others == 0) fs::remove(stage_ / kStageMarkerName, ec);
    if ((ec || others > 0 || !remove_directory(stage_, DirectoryRemoval::kIfEmpty, ec)) && log_) {
      log_->warn("{}: not removed: it holds files of another run ({})", stage_.string(),
                 ec ? ec.message() : "not empty");
    }
  }

  FinalizeSummary done() const {
    if (log_) {
      log_->info("finalize: {} from {} part(s): {} file(s), {} bytes", options_.output.string(),
                 count_, summary_.files, summary_.bytes);
    }
    return summary_;
  }

 private:
  const FinalizeOptions& options_;
  const std::shared_ptr<spdlog::logger>& log_;
  const fs::path stage_;
  FinalizeSummary summary_;
  RunPaths paths_;
  std::vector<std::string> problems_;  // every problem found, reported at once
  std::vector<Record> records_;
  std::set<std::string> logs_;  // file names of the part logs in the stage
  unsigned count_ = 0;          // the run's part count and plan fingerprint
  std::string fingerprint_;
  const Record* reference_ = nullptr;  // the run's record of its lowest part
  std::set<unsigned> other_input_;     // parts whose record differs from the run's in input data
  std::map<unsigned, const Record*> by_part_;  // the run's records by part index
  std::vector<PartLock> locks_;                // held until the end
  bool all_complete_ = true;
  std::vector<std::string> plan_order_;              // the plan's files
  std::map<std::string, const Record*> written_by_;  // file -> the part that wrote it
  std::uint64_t total_ = 0;                          // bytes of the staged files
};

}  // namespace

FinalizeSummary finalize_parts(const FinalizeOptions& options) {
  Finalization run(options);
  run.check_paths();
  run.read_records();
  run.choose_run();
  run.lock_complete_parts();
  run.check_staged_files();
  run.check_staged_digests();
  run.throw_problems();
  run.assemble();
  run.clean_stage();
  return run.done();
}

}  // namespace ctquant
