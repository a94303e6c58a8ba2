// `ctquant finalize` refuses what is not one complete run of one plan on
// one input (a missing, incomplete, duplicated or foreign part; parts that
// read checkpoints of the same layout with other weights; a staged file of
// another size, or edited after its part ran), with exit 1, every problem
// named, no OUTPUT created and the stage left byte for byte as it was; and
// assembles the parts of a run from a stage given with --stage. The parts
// themselves run as separate processes (the CLI).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/exec/parts.hpp"
#include "ctquant/exec/path_policy.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::CommandResult;
using test::TempDir;

// The sharded golden case (2 shards) and its ignore list (tests/golden/cases.json).
const fs::path kGoldenInput = test::golden_dir() / "dflash-bf16-sharded" / "input";
const fs::path kGoldenExpected = test::golden_dir() / "dflash-bf16-sharded" / "expected";
const std::vector<std::string> kGoldenIgnore = {"--ignore", "re:.*qkv_proj$", "--ignore",
                                                "re:.*g_proj$"};
// A golden input of 3 shards, quantized W4A16 here: for runs in 3 parts.
const fs::path kThreeShards = test::golden_dir() / "sharded-bf16-nvfp4a16" / "input";
const std::vector<std::string> kThreeShardsIgnore = {"--ignore", "lm_head", "--ignore",
                                                     "model.embed_tokens"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

fs::path stage_of(const fs::path& out) { return default_stage_dir(out); }

json read_record(const fs::path& out, unsigned i, unsigned n) {
  return test::read_json(stage_of(out) / fmt::format("part-{:05d}-of-{:05d}.json", i, n));
}

void write_record(const fs::path& out, unsigned i, unsigned n, const json& record) {
  test::write_file(stage_of(out) / fmt::format("part-{:05d}-of-{:05d}.json", i, n), record.dump(1));
}

CommandResult run_part(const fs::path& in, const fs::path& out, const std::string& part,
                       std::vector<std::string> extra = kGoldenIgnore) {
  return test::run_ctquant(
      with({"quantize", in.string(), out.string(), "--part", part, "-q"}, extra));
}

// Finalize fails with exit 1 naming each problem, creates no OUTPUT and
// leaves the stage byte for byte as it was.
CommandResult expect_finalize_refuses(const fs::path& out, const std::vector<std::string>& problems,
                                      const std::vector<std::string>& absent = {}) {
  const auto before = test::snapshot_files(stage_of(out));
  const CommandResult r = test::run_ctquant({"finalize", out.string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  test::expect_message(r.err,
                       with({"OUTPUT was not created and the staging directory is left as "
                             "it is"},
                            problems),
                       absent);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(test::temp_leftovers(out.parent_path()), std::vector<std::string>{});
  EXPECT_EQ(test::snapshot_files(stage_of(out)), before);
  return r;
}

TEST(Finalize, RefusesAMissingPart) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(kGoldenInput, out, "1/2").exit_code, 0);
  expect_finalize_refuses(out, {"part 2/2: no record in", "--part 2/2"});
}

TEST(Finalize, RefusesAnIncompletePart) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/2", "2/2"}) ASSERT_EQ(run_part(kGoldenInput, out, p).exit_code, 0);
  json record = read_record(out, 2, 2);
  record["complete"] = false;
  record["files"] = json::array();
  write_record(out, 2, 2, record);
  expect_finalize_refuses(out, {"part 2/2: not complete: 0 of", "--resume"});
}

TEST(Finalize, RefusesADuplicatedPart) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(kGoldenInput, out, "1/2").exit_code, 0);
  write_record(out, 2, 2, read_record(out, 1, 2));  // part 1's record copied as part 2's
  expect_finalize_refuses(out, {"part-00002-of-00002.json: holds the record of part 1/2",
                                "duplicated part", "part 2/2: no record"});
}

// A file recorded by two parts (records edited by hand, or from different
// assignments) is named, and so is each tensor it holds twice.
TEST(Finalize, RefusesAFileRecordedTwice) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/2", "2/2"}) ASSERT_EQ(run_part(kGoldenInput, out, p).exit_code, 0);
  json one = read_record(out, 1, 2);
  json two = read_record(out, 2, 2);
  json shard;
  for (const json& f : one["files"]) {
    if (f["name"].get<std::string>().ends_with(".safetensors")) shard = f;
  }
  for (const json& f : two["files"]) {
    if (f["name"].get<std::string>().ends_with(".safetensors")) shard = f;
  }
  ASSERT_TRUE(shard.is_object());
  const std::string name = shard["name"];
  // Whichever part does not hold it claims it too.
  json& other = one["assigned"].dump().find(name) == std::string::npos ? one : two;
  other["files"].push_back(shard);
  write_record(out, 1, 2, one);
  write_record(out, 2, 2, two);
  expect_finalize_refuses(out, {name + ": recorded by part"});
}

TEST(Finalize, RefusesAForeignPart) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/2", "2/2"}) ASSERT_EQ(run_part(kGoldenInput, out, p).exit_code, 0);
  // An older run in 1 part with other options left its record behind.
  ASSERT_EQ(
      run_part(kGoldenInput, out, "1/1", with(kGoldenIgnore, {"--ignore", "re:^(model\\.)?fc$"}))
          .exit_code,
      0);
  expect_finalize_refuses(out, {"part-00001-of-00001.json: part 1/1 of another run than part 1/2",
                                "split in 1 parts, not 2", "options: quantization_config.ignore"});
}

// The same split, another plan: part 2's record was overwritten by a run
// with other options. It is named as foreign, and its slot as to be rerun;
// each option's value says which part had it (the message once read "X
// then, Y now", the foreign part's value first), and how to bring the part
// in line.
TEST(Finalize, RefusesAPartOfAnotherPlanSayingWhichPartHadWhichOptions) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/3", "3/3"}) {
    ASSERT_EQ(run_part(kThreeShards, out, p, kThreeShardsIgnore).exit_code, 0);
  }
  ASSERT_EQ(
      run_part(kThreeShards, out, "2/3", with(kThreeShardsIgnore, {"--ignore", "re:.*o_proj$"}))
          .exit_code,
      0);
  const CommandResult r = expect_finalize_refuses(
      out,
      {"part-00002-of-00003.json: part 2/3 of another run", "options: quantization_config.ignore",
       "part 2/3: its record is of another run (above)",
       "rerun part 2/3 with the input and options of part 1/3 (--part 2/3 --resume), or remove "
       "its record"},
      {"part 2/3: no record", " then, "});
  const std::size_t line = r.err.find("options: quantization_config.ignore: ");
  const std::size_t two = r.err.find(" in part 2/3, ", line);
  const std::size_t one = r.err.find(" in part 1/3", two);
  ASSERT_NE(one, std::string::npos) << r.err;
  EXPECT_NE(r.err.substr(line, two - line).find("o_proj"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.substr(two, one - two).find("o_proj"), std::string::npos) << r.err;
}

// A record another version of ctquant wrote (another record format) is
// named as such, and its part as not run.
TEST(Finalize, RefusesARecordOfAnotherFormat) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/2", "2/2"}) ASSERT_EQ(run_part(kGoldenInput, out, p).exit_code, 0);
  json record = read_record(out, 2, 2);
  record["ctquant_part_record"] = 1;
  write_record(out, 2, 2, record);
  expect_finalize_refuses(out, {"part-00002-of-00002.json: not a part record ctquant can read: "
                                "its format is 1, this ctquant reads format 2",
                                "run the part again", "part 2/2: no record"});
}

TEST(Finalize, StageWithoutPartOrResumeIsAUsageError) {
  TempDir tmp;
  const CommandResult r = test::run_ctquant(
      {"quantize", kGoldenInput.string(), (tmp / "out").string(), "--stage", (tmp / "s").string()});
  EXPECT_EQ(r.exit_code, 2);
  test::expect_message(r.err, {"--stage names the staging directory of --part or --resume"});
}

TEST(Finalize, RefusesAStagedFileOfAnotherSize) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/2", "2/2"}) ASSERT_EQ(run_part(kGoldenInput, out, p).exit_code, 0);
  const fs::path shard = stage_of(out) / "model-00001-of-00002.safetensors";
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 8);
  expect_finalize_refuses(out, {fmt::format("model-00001-of-00002.safetensors (part {}): {} bytes "
                                            "in",
                                            read_record(out, 1, 2)["assigned"].dump().find(
                                                "model-00001") != std::string::npos
                                                ? "1/2"
                                                : "2/2",
                                            size - 8)});
}

TEST(Finalize, RefusesWithoutAStage) {
  TempDir tmp;
  const CommandResult r = test::run_ctquant({"finalize", (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1);
  test::expect_message(r.err, {"no staging directory", "--part I/N"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(Finalize, ExistingOutputNeedsForce) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/2", "2/2"}) ASSERT_EQ(run_part(kGoldenInput, out, p).exit_code, 0);
  test::copy_dir(kGoldenExpected, out);
  const CommandResult r = test::run_ctquant({"finalize", out.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(fs::exists(stage_of(out)));
  const CommandResult forced = test::run_ctquant({"finalize", out.string(), "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(test::diff_golden(out, kGoldenExpected, false), "");
}

TEST(Finalize, ExplicitStageDirectory) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  const fs::path stage = tmp / "shared" / "stage";
  fs::create_directories(tmp / "shared");
  for (const char* p : {"1/2", "2/2"}) {
    ASSERT_EQ(
        run_part(kGoldenInput, out, p, with(kGoldenIgnore, {"--stage", stage.string()})).exit_code,
        0);
  }
  EXPECT_FALSE(fs::exists(stage_of(out)));
  const CommandResult r = test::run_ctquant({"finalize", out.string(), "--stage", stage.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_message(r.err, {"finalize: checking the sha256 of"});
  EXPECT_EQ(test::diff_golden(out, kGoldenExpected, false), "");
  EXPECT_FALSE(fs::exists(stage));
}

TEST(Finalize, PartRefusesAnExistingOutput) {
  TempDir tmp;
  test::copy_dir(kGoldenExpected, tmp / "out");
  const CommandResult r = run_part(kGoldenInput, tmp / "out", "1/2");
  EXPECT_EQ(r.exit_code, 2);
  test::expect_message(r.err, {"already exists"});
}

// A part whose lock another process holds is running: not started twice.
TEST(Finalize, PartAlreadyRunningIsRefused) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  fs::create_directories(stage_of(out));
  test::write_file(stage_of(out) / kStageMarkerName, "");  // a stage ctquant made
  const fs::path lock = stage_of(out) / ".part-00001-of-00002.lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const CommandResult r = run_part(kGoldenInput, out, "1/2");
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2);
  test::expect_message(r.err, {"part 1/2 is already running in another process"});
}

// Two checkpoints of the same layout with other weights, part 1/2 run on
// one and part 2/2 on the other: finalize once joined them into one mixed
// model with exit 0. Each part samples every shard, so the parts disagree
// even though they read no shard in common.
TEST(Finalize, RefusesPartsOfDifferentInputs) {
  TempDir tmp;
  test::copy_dir(kGoldenInput, tmp / "a");
  test::copy_dir(kGoldenInput, tmp / "b");
  for (const char* shard :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    test::flip_tensor_data(tmp / "b" / shard);
  }
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(tmp / "a", out, "1/2").exit_code, 0);
  ASSERT_EQ(run_part(tmp / "b", out, "2/2").exit_code, 0);
  expect_finalize_refuses(
      out,
      {"part-00002-of-00002.json: part 2/2 read other input data than part 1/2",
       "input shard model-00001-of-00002.safetensors: same size and header, other tensor "
       "data",
       "input shard model-00002-of-00002.safetensors: same size and header, other tensor "
       "data",
       fmt::format("INPUT {} for part 2/2, {} for part 1/2", (tmp / "b").string(),
                   (tmp / "a").string()),
       "part 2/2: it read other input data than part 1/2 (above)", "--part 2/2"},
      {"of another run"});
}

// The inputs differ only in the shard part 2/2 writes, which part 1/2 does
// not read: still a mixed model, still refused (every part samples every
// shard, not only those it reads).
TEST(Finalize, RefusesPartsOfInputsThatDifferInOneShard) {
  TempDir tmp;
  test::copy_dir(kGoldenInput, tmp / "a");
  test::copy_dir(kGoldenInput, tmp / "b");
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(tmp / "a", out, "1/2").exit_code, 0);
  const bool one_writes_first =
      read_record(out, 1, 2)["assigned"].dump().find("model-00001") != std::string::npos;
  const std::string twos_shard =
      one_writes_first ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  test::flip_tensor_data(tmp / "b" / twos_shard);
  ASSERT_EQ(run_part(tmp / "b", out, "2/2").exit_code, 0);
  expect_finalize_refuses(
      out, {"part 2/2 read other input data than part 1/2",
            "input shard " + twos_shard + ": same size and header, other tensor data"});
}

// A staged shard edited (same size) after its part recorded it: finalize
// once published it, and `verify --manifest` then disagreed with OUTPUT.
TEST(Finalize, RefusesStagedShardEditedAfterItsPart) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* p : {"1/2", "2/2"}) ASSERT_EQ(run_part(kGoldenInput, out, p).exit_code, 0);
  const std::string name = "model-00002-of-00002.safetensors";
  const std::string part =
      read_record(out, 1, 2)["assigned"].dump().find(name) != std::string::npos ? "1/2" : "2/2";
  const fs::path shard = stage_of(out) / name;
  const auto size = fs::file_size(shard);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.put('\x55');
  }
  ASSERT_EQ(fs::file_size(shard), size);
  expect_finalize_refuses(
      out, {fmt::format("{} (part {}): the file in {} is not the one part {} wrote", name, part,
                        stage_of(out).string(), part),
            "it changed after the part ran", fmt::format("--part {} --resume", part)});
  // Rewritten by its part, the file is published.
  ASSERT_EQ(test::run_ctquant(with({"quantize", kGoldenInput.string(), out.string(), "--part", part,
                                    "--resume", "-q"},
                                   kGoldenIgnore))
                .exit_code,
            0);
  const CommandResult r = test::run_ctquant({"finalize", out.string(), "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::diff_golden(out, kGoldenExpected, false), "");
}

}  // namespace
}  // namespace ctquant
