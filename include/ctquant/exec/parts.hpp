// One quantize run split into parts that run as separate processes, on one
// machine or many, and assembled by `ctquant finalize`.
//
// `ctquant quantize INPUT OUTPUT --part I/N` writes only the output files
// assigned to part I (1-based) of N: a deterministic assignment balanced by
// bytes and computed from the plan alone, so every part agrees on it without
// talking to the others (assign_parts). A part writes whole files, so N may
// not exceed the plan's output shards (check_part_count). Every part writes
// into one staging directory on a filesystem they share, by default
// `.<OUTPUT name>.ctquant-parts` beside OUTPUT (default_stage_dir), which
// every part and `finalize` derive from the same OUTPUT argument:
//
//   STAGE/part-00002-of-00003.json   the part's record: the plan
//                                    fingerprint (which holds what
//                                    identifies the input: every shard's
//                                    size, header and sample digest), INPUT's
//                                    path, the files assigned, each file
//                                    written with its size, tensors and
//                                    sha256, and whether the part is complete
//   STAGE/part-00002-of-00003.log    while the part runs: one JSON line per
//                                    file finished (what --resume keeps)
//   STAGE/.part-00002-of-00003.work/ the file being written
//   STAGE/<output file>              each finished file, under its own name
//
// The record and log formats are private (src/exec/part_record.hpp).
// A file is written in the work directory, flushed, hashed, then renamed into
// STAGE and logged, so a part that dies leaves every finished file usable and
// nothing half-written under an output name. Rerun with `--resume`, a part
// keeps each assigned file whose logged sha256 still matches the file in
// STAGE (logged by any part of the same plan) and writes the others; a plan
// that changed (input headers or sampled data, config.json, index, file
// list, options or ctquant version) is refused, naming what changed.
//
// `ctquant finalize OUTPUT` (finalize_parts) checks that the parts of one
// plan (the same input, options and version) are all there and complete,
// that every output file and tensor appears exactly once and that the sizes
// add up to the plan's, then that every staged file still has the sha256 its
// part recorded; then links the files into the temporary output directory
// and renames it into place as a one-process run does (output_dir.hpp), with
// the manifest (exec/manifest.hpp) of those digests. The result is
// byte-identical to a one-process run. On any problem it lists them all
// (Error{kBadInput}), creates no OUTPUT and leaves STAGE as it is.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include "ctquant/exec/executor.hpp"
#include "ctquant/exec/manifest.hpp"
#include "ctquant/plan/output_files.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

// Part I of N, 1-based.
struct PartSpec {
  unsigned index = 1;
  unsigned count = 1;
  bool operator==(const PartSpec&) const = default;
};

// Most parts a run may be split into.
inline constexpr unsigned kMaxParts = 100000;

// Parses "I/N" (decimal, 1 <= I <= N <= kMaxParts). Throws Error{kUsage}
// naming the text otherwise ("0/3", "4/3", "x").
PartSpec parse_part(std::string_view text);

// "2/3".
std::string part_name(const PartSpec& part);

// The staging directory every part and finalize use for OUTPUT unless told
// otherwise: `.<OUTPUT name>.ctquant-parts` in OUTPUT's parent directory
// (OUTPUT made absolute, a trailing separator ignored).
std::filesystem::path default_stage_dir(const std::filesystem::path& output);

// For each file, the 0-based part that writes it: longest processing time
// first (files by decreasing work, ties in plan order; each to the part with
// the least work so far, ties to the lowest part), so parts get about the
// same number of bytes. Depends only on the files and count.
std::vector<unsigned> assign_parts(const std::vector<PlannedFile>& files, unsigned count);

// Bytes sampled at each end of every input tensor (sample_input).
inline constexpr std::uint64_t kInputSampleBytes = 4096;

// What identifies the data of the input without reading all of it: for each
// shard, the sha256 of the first and last kInputSampleBytes of every tensor
// (the whole tensor when it is no longer than both), in data order; for each
// copied file, the sha256 of the file (its first and last kInputSampleBytes
// when it is over 64 MiB). Every part samples every shard, so two parts that
// read the same layout from different checkpoints (other weights) record
// different digests even when they read no shard in common. A change that
// leaves every tensor's first and last 4 KiB as they were is not seen
// (docs/scale-out.md, "What identifies the input", has the cost and the
// reasons).
struct InputSample {
  std::vector<std::string> shard_sha256;       // per Checkpoint::shards entry
  std::vector<std::string> other_file_sha256;  // per Checkpoint::other_files entry; "" unreadable
  std::uint64_t bytes_read = 0;                // the reads' bytes (the gaps merged in included)
  std::uint64_t reads = 0;                     // positioned reads made
  double seconds = 0;
};

// Samples checkpoint (threads files at a time; ranges less than 64 KiB apart
// read in one read of at most 1 MiB). Throws Error{kIo} when a shard cannot
// be read, Error{kInterrupted} on *cancel (checked between reads; may be
// null). A copied file that cannot be read gets "" (its copy reports it).
InputSample sample_input(const Checkpoint& checkpoint, unsigned threads,
                         const std::atomic<bool>* cancel = nullptr);

// The identity of a plan: the input (each shard's name, size, header and
// sample digest; config.json; the index; the other files' names, sizes and
// digests), the options (the output's quantization_config), the output
// (every file's name and size, each shard's header bytes), the ctquant
// version and the record format. Two runs with the same fingerprint write
// the same bytes, unless their inputs differ only outside the sample.
// Reads no file itself: sample is sample_input(checkpoint, ...).
nlohmann::json plan_fingerprint(const Checkpoint& checkpoint, const QuantizePlan& plan,
                                const InputSample& sample);

// Whose each fingerprint is, as the lines of fingerprint_changes say it:
// {"in the part written earlier", "in this run"} (--resume), {"in part
// 2/3", "in part 1/3"} (finalize).
struct FingerprintSides {
  std::string before;
  std::string now;
};

// What changed between two fingerprints, one line each, every value with
// the side it is of ("input shard model-00002-of-00004.safetensors: its
// header differs", "input shard model-00002-of-00004.safetensors: same
// size and header, other tensor data", "options:
// quantization_config.ignore: [...] in the part written earlier, [...] in
// this run", "input shard S: present in part 2/3, absent in part 1/3",
// ...); empty when they are the same plan.
std::vector<std::string> fingerprint_changes(const nlohmann::json& before,
                                             const nlohmann::json& now,
                                             const FingerprintSides& sides);

// Refuses a split whose parts would not each have an output shard to write:
// part.count larger than the plan's output shards (a single-file checkpoint:
// any count but 1). A part writes whole output files and finalize links
// them into OUTPUT unchanged, so one shard cannot be shared between parts.
// Every part of such a split refuses alike. Throws Error{kUsage} naming the
// shards and the largest count that works.
void check_part_count(const QuantizePlan& plan, const PartSpec& part);

struct PartOptions {
  PartSpec part;
  // The staging directory: created if missing (its parent must exist); an
  // existing one must be empty or hold kStageMarkerName (path_policy.hpp),
  // which run_part writes first into an absent or empty one.
  std::filesystem::path stage;
  bool resume = false;          // keep the files an earlier run of this plan wrote and logged
  std::shared_ptr<spdlog::logger> logger;  // may be null
};

struct PartSummary {
  std::size_t files_assigned = 0;
  std::size_t files_kept = 0;     // written by an earlier run, sha256 checked (--resume)
  std::size_t files_written = 0;  // written by this run
  std::uint64_t bytes_assigned = 0;
  ExecuteStats execute;           // summed over the files written
  std::filesystem::path record;   // the part's record
  InputSample input_sample;       // what identifies the input (sample_input)
  // Every assigned file with the size and sha256 this run computed from the
  // file in the stage (written, or kept after its check), by name.
  std::vector<ManifestEntry> hashed;
};

// Writes the files of options.part into options.stage and records them
// (see the top of this file); samples the input first (sample_input, with
// execute.threads). Throws Error{kUsage} when the split is refused
// (check_part_count: nothing is created), when the stage is not
// one ctquant made (stage_refusal), when the part is already running in
// another process, or when resuming against a changed plan
// (options changed); Error{kBadInput} when resuming against a changed input;
// and what execute_plan() throws. Whatever was finished stays in the stage
// and logged.
PartSummary run_part(const Checkpoint& checkpoint, const QuantizePlan& plan,
                     const PartOptions& options, const ExecuteOptions& execute);

// True when a process holds the lock of a part in stage: a part or finalize
// runs there now.
bool stage_in_use(const std::filesystem::path& stage);

struct FinalizeSummary;

struct FinalizeOptions {
  std::filesystem::path output;
  std::optional<std::filesystem::path> stage;  // default_stage_dir(output) when unset
  bool force = false;  // replace an existing OUTPUT, as quantize --force does
  bool fsync = true;   // flush OUTPUT's directory entries before and after the rename
  unsigned threads = 1;  // staged files hashed at once
  // Files whose sha256 this process computed from the staged file itself
  // (quantize --resume: the part it just ran): not hashed again when the
  // record holds that digest and the staged file that size.
  std::vector<ManifestEntry> hashed;
  // Only consider the records of runs split in this many parts (the
  // one-process --resume run finalizes its own 1/1 record, whatever other
  // runs left in the stage). Unset: every record in the stage.
  std::optional<unsigned> parts;
  std::shared_ptr<spdlog::logger> logger;   // may be null
  const std::atomic<bool>* cancel = nullptr;
  // Called with the summary (every field set) once OUTPUT is assembled and
  // flushed in its temporary directory, just before the rename that commits
  // it (quantize --resume writes its report and recipe here). May be empty.
  std::function<void(const FinalizeSummary&)> before_commit;
};

struct FinalizeSummary {
  unsigned parts = 0;
  std::size_t files = 0;    // files of the plan (the manifest not counted)
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;  // of every file of OUTPUT, the manifest included
  // OUTPUT's files with their sizes and SHA-256 as the manifest lists them,
  // and the manifest's own entry; sorted by name.
  std::vector<ManifestEntry> manifest;
  std::filesystem::path stage;
};

// Assembles OUTPUT from the parts' files in the stage (see the top of this
// file), then removes the stage. Throws Error{kBadInput} listing every
// problem (a missing, incomplete, duplicated or foreign part: of another
// split, options or version, or of an input with other data, naming the
// parts and the shards that differ; a file or tensor missing or recorded
// twice; a staged file of another size; sizes that do not add up; once
// none of these, a staged file whose sha256 is not the one its part
// recorded), with nothing created and the stage untouched;
// Error{kUsage} for an OUTPUT that exists (without force), or an OUTPUT or
// stage the path policy refuses (check_run_paths: misplaced against each
// other, the working directory or the INPUT the records name; a stage
// ctquant did not make); Error{kIo} for a stage that cannot be read;
// Error{kInterrupted} on cancel.
FinalizeSummary finalize_parts(const FinalizeOptions& options);

}  // namespace ctquant
