// A run split into parts (`quantize --part I/N`, `finalize`) and resumed
// runs (`--resume`): parts run as separate processes through `xargs -P`
// give output byte-identical to one process, on the sharded golden cases
// and a 20-shard synthetic checkpoint; a split with more parts than output
// shards is refused by every part; kill -9 of a part, then --resume, writes
// only the files it had not finished, with identical output; a changed plan
// (options, headers, weights) is not resumed. Finalize's refusals are
// tests/test_finalize.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/exec/parts.hpp"
#include "ctquant/exec/path_policy.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::CommandResult;
using test::TempDir;

// The sharded golden case and its ignore list (tests/golden/cases.json).
const fs::path kGoldenInput = test::golden_dir() / "dflash-bf16-sharded" / "input";
const fs::path kGoldenExpected = test::golden_dir() / "dflash-bf16-sharded" / "expected";
const std::vector<std::string> kGoldenIgnore = {"--ignore", "re:.*qkv_proj$", "--ignore",
                                                "re:.*g_proj$"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// `'a' 'b' ...` for a shell command line (the paths here hold no quote).
std::string shell_words(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& w : words) text += " '" + w + "'";
  return text;
}

// Runs parts 1..n of `quantize IN OUT EXTRA...` as n processes at once
// through xargs -P, then `finalize OUT`.
void run_parts_with_xargs(const fs::path& in, const fs::path& out, unsigned n,
                          const std::vector<std::string>& extra) {
  std::string parts;
  for (unsigned i = 1; i <= n; ++i) parts += fmt::format("{}/{}\\n", i, n);
  const CommandResult r = test::run_shell(
      fmt::format("printf '{}' | xargs -P {} -I PART \"$CTQUANT\" quantize{} --part PART -q", parts,
                  n, shell_words(with({in.string(), out.string()}, extra))));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(out)) << "a part created OUTPUT";
  const CommandResult f = test::run_ctquant({"finalize", out.string()});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_FALSE(fs::exists(default_stage_dir(out))) << "finalize left the staging directory";
}

// The 20-shard synthetic checkpoint, generated once for the suite.
class Parts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const CommandResult r = test::run_make_checkpoint(
        {(test::layouts_dir() / "llama-20-shards.manifest.json").string(), synthetic().string(),
         "--seed", "7", "--shard-size", "7500000", "--threads", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // The reference: one process.
    const CommandResult q =
        test::run_ctquant({"quantize", synthetic().string(), reference().string(), "-q"});
    ASSERT_EQ(q.exit_code, 0) << q.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path synthetic() { return dir_->path() / "synthetic"; }
  static fs::path reference() { return dir_->path() / "reference"; }

  TempDir tmp_;

 private:
  static TempDir* dir_;
};
TempDir* Parts::dir_ = nullptr;

std::size_t count_shards(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() == ".safetensors") ++n;
  }
  return n;
}

TEST_F(Parts, SyntheticCheckpointHasTwentyShards) {
  EXPECT_EQ(count_shards(synthetic()), 20u);
  EXPECT_EQ(count_shards(reference()), 20u);
}

TEST_F(Parts, TwoPartsThroughXargsEqualOneProcessOnTheGoldenCase) {
  const fs::path one = tmp_ / "one";
  ASSERT_EQ(test::run_ctquant(
                with({"quantize", kGoldenInput.string(), one.string(), "-q"}, kGoldenIgnore))
                .exit_code,
            0);
  const fs::path out = tmp_ / "out";
  run_parts_with_xargs(kGoldenInput, out, 2, kGoldenIgnore);
  EXPECT_EQ(test::diff_bytes(out, one), "");
  EXPECT_EQ(test::diff_golden(out, kGoldenExpected, false), "");
}

// NVFP4 over 3 shards: fused partners in different shards share one global
// scale (tests/golden/cases.json), so a part computes the max |w| of modules
// it does not write.
TEST_F(Parts, PartsEqualOneProcessOnTheShardedNvfp4Case) {
  const fs::path in = test::golden_dir() / "sharded-bf16-nvfp4a16" / "input";
  const std::vector<std::string> args = {"--scheme", "NVFP4A16", "--ignore",
                                         "lm_head",  "--ignore", "model.embed_tokens"};
  const fs::path one = tmp_ / "one";
  const CommandResult r =
      test::run_ctquant(with({"quantize", in.string(), one.string(), "-q"}, args));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const unsigned n : {2u, 3u}) {
    SCOPED_TRACE(fmt::format("{} parts", n));
    const fs::path out = tmp_ / fmt::format("out{}", n);
    run_parts_with_xargs(in, out, n, args);
    EXPECT_EQ(test::diff_bytes(out, one), "");
    EXPECT_EQ(
        test::diff_golden(out, test::golden_dir() / "sharded-bf16-nvfp4a16" / "expected", true),
        "");
  }
}

TEST_F(Parts, ThreePartsThroughXargsEqualOneProcessOnTwentyShards) {
  const fs::path out = tmp_ / "out";
  run_parts_with_xargs(synthetic(), out, 3, {});
  EXPECT_EQ(test::diff_bytes(out, reference()), "");
}

TEST(PartSpecs, ParseAndRefuse) {
  EXPECT_EQ(parse_part("2/3"), (PartSpec{2, 3}));
  EXPECT_EQ(parse_part("1/1"), (PartSpec{1, 1}));
  for (const char* bad :
       {"0/3", "4/3", "x", "1/0", "/3", "3/", "1/3/4", "-1/3", " 1/3", "1/100001", "2"}) {
    try {
      parse_part(bad);
      ADD_FAILURE() << "accepted --part " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << bad;
    }
  }
}

TEST(PartSpecs, BadPartIsAUsageError) {
  TempDir tmp;
  for (const char* bad : {"0/3", "4/3", "x"}) {
    const CommandResult r = test::run_ctquant(
        {"quantize", kGoldenInput.string(), (tmp / "out").string(), "--part", bad});
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    test::expect_message(r.err, {fmt::format("--part {}: expected I/N", bad)});
    EXPECT_FALSE(fs::exists(default_stage_dir(tmp / "out"))) << bad;
  }
}

TEST(PartSpecs, DefaultStageBesideOutput) {
  EXPECT_EQ(default_stage_dir("/data/models/out"), fs::path("/data/models/.out.ctquant-parts"));
  EXPECT_EQ(default_stage_dir("/data/models/out/"), fs::path("/data/models/.out.ctquant-parts"));
  EXPECT_EQ(default_stage_dir("out"), fs::current_path() / ".out.ctquant-parts");
}

// Balanced by work, every file to exactly one part, the same answer every time.
TEST(PartSpecs, AssignmentIsBalancedAndDeterministic) {
  std::vector<PlannedFile> files;
  for (const std::uint64_t work : {10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 1, 1}) {
    files.push_back(PlannedFile{fmt::format("f{}", files.size()), work, work, {}});
  }
  const std::vector<unsigned> owner = assign_parts(files, 3);
  EXPECT_EQ(owner, assign_parts(files, 3));
  std::vector<std::uint64_t> load(3, 0);
  for (std::size_t i = 0; i < files.size(); ++i) {
    ASSERT_LT(owner[i], 3u);
    load[owner[i]] += files[i].work;
  }
  // 57 units of work: LPT gives 19 each here.
  EXPECT_EQ(load, (std::vector<std::uint64_t>{19, 19, 19}));
  // Largest first: the three largest files go to the three parts.
  EXPECT_EQ((std::set<unsigned>{owner[0], owner[1], owner[2]}), (std::set<unsigned>{0, 1, 2}));
  const std::vector<unsigned> one = assign_parts(files, 1);
  EXPECT_TRUE(std::all_of(one.begin(), one.end(), [](unsigned p) { return p == 0; }));
}

// ---- helpers of the finalize and resume tests ----

fs::path stage_of(const fs::path& out) { return default_stage_dir(out); }

json read_record(const fs::path& out, unsigned i, unsigned n) {
  return test::read_json(stage_of(out) / fmt::format("part-{:05d}-of-{:05d}.json", i, n));
}

CommandResult run_part(const fs::path& in, const fs::path& out, const std::string& part,
                       std::vector<std::string> extra = kGoldenIgnore) {
  return test::run_ctquant(
      with({"quantize", in.string(), out.string(), "--part", part, "-q"}, extra));
}

// ---- splits with more parts than output shards ----

// A single-file checkpoint has one output shard, which one part writes
// whole: --part 2/2 once wrote only config.json and the copied files, said
// nothing, and exited 0. Every part of such a split is refused before
// anything is created; --part 1/1 is the whole run, staged and finalized.
TEST(PartSpecs, SingleFileCheckpointIsNotSplit) {
  const test::GoldenCase c = test::find_case("llama-bf16");
  const std::vector<std::string> ignore = {"--ignore", "lm_head", "--ignore", "model.embed_tokens"};
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const fs::path& in : {test::input_of(c), test::input_of(c) / "model.safetensors"}) {
    for (const char* part : {"1/2", "2/2", "3/5"}) {
      SCOPED_TRACE(fmt::format("{} --part {}", in.string(), part));
      const CommandResult r = run_part(in, out, part, ignore);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      test::expect_message(
          r.err, {fmt::format("--part {}: the output is one shard (model.safetensors: INPUT is a "
                              "single-file checkpoint)",
                              part),
                  "one shard cannot be split between parts", "without --part", "--part 1/1"});
      EXPECT_FALSE(fs::exists(stage_of(out)));
      EXPECT_FALSE(fs::exists(out));
    }
  }
  ASSERT_EQ(run_part(test::input_of(c), out, "1/1", ignore).exit_code, 0);
  const CommandResult f = test::run_ctquant({"finalize", out.string(), "-q"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(test::diff_golden(out, test::expected_of(c), c.by_library), "");
}

// A checkpoint of 2 shards split in 3: the third part would have no shard to
// write (it once wrote config.json alone, or nothing, and exited 0). Every
// part refuses alike, naming the shards and the largest split that works.
TEST(PartSpecs, MorePartsThanOutputShardsAreRefusedByEveryPart) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  for (const char* part : {"1/3", "2/3", "3/3", "8/8"}) {
    SCOPED_TRACE(part);
    const CommandResult r = run_part(kGoldenInput, out, part);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    const unsigned n = parse_part(part).count;
    test::expect_message(
        r.err, {fmt::format("--part {}: the output has 2 shards (model-00001-of-00002.safetensors, "
                            "model-00002-of-00002.safetensors)",
                            part),
                fmt::format("with {} parts, {} of them would have no shard to write", n, n - 2),
                "Split the run in at most 2 parts (--part I/2)"});
    EXPECT_FALSE(fs::exists(stage_of(out)));
  }
  // Through the library: Error{kUsage}, before the stage is made.
  QuantizeOptions options = test::test_options(kGoldenInput, out);
  options.plan.ignore = {"re:.*qkv_proj$", "re:.*g_proj$"};
  options.part = PartSpec{1, 3};
  try {
    quantize(options);
    ADD_FAILURE() << "part 1/3 of a 2-shard checkpoint ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
  }
  EXPECT_FALSE(fs::exists(stage_of(out)));
}

// ---- resume ----

std::size_t log_lines(const fs::path& log) {
  std::ifstream in(log);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Starts `ctquant ARGS`, waits until its log at log_path has min_files
// finished files (lines after the header), then kill -9. Returns the number
// of files logged at that moment, or 0 when the run finished first.
std::size_t kill_after_files(const std::vector<std::string>& args, const fs::path& log_path,
                             std::size_t min_files) {
  test::CtquantProcess child(args);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && child.running()) {
    if (fs::exists(log_path) && log_lines(log_path) >= 1 + min_files) {
      child.signal(SIGKILL);
      child.wait();
      return log_lines(log_path) - 1;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  child.wait();
  return 0;
}

// The acceptance case: part 2 of 3 killed mid-run; rerun with --resume it
// keeps the files it had finished (its record counts them) and writes only
// the others; the finalized output equals one process.
TEST_F(Parts, KillDashNineThenResumeRedoesOnlyUnfinishedFiles) {
  const fs::path out = tmp_ / "out";
  const fs::path log = stage_of(out) / "part-00002-of-00003.log";
  const std::vector<std::string> args = {"quantize", synthetic().string(), out.string(), "--part",
                                         "2/3",      "--threads",          "1"};
  std::size_t finished = 0;
  for (int attempt = 0; attempt < 5 && finished == 0; ++attempt) {
    fs::remove_all(stage_of(out));
    finished = kill_after_files(args, log, 1);
  }
  ASSERT_GT(finished, 0u) << "every run of part 2/3 finished before kill -9 reached it";
  const json killed = read_record(out, 2, 3);
  EXPECT_FALSE(killed["complete"].get<bool>());
  const std::size_t assigned = killed["assigned"].size();
  ASSERT_LT(finished, assigned);

  const CommandResult resumed = test::run_ctquant(with(args, {"--resume"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  test::expect_message(resumed.err,
                       {fmt::format("part 2/3: {} of {} file(s) kept from an earlier run (sha256 "
                                    "checked), {} to write",
                                    finished, assigned, assigned - finished)});
  const json record = read_record(out, 2, 3);
  EXPECT_TRUE(record["complete"].get<bool>());
  EXPECT_EQ(record["files_kept"], finished);
  EXPECT_EQ(record["files_written"], assigned - finished);
  EXPECT_FALSE(fs::exists(log));

  for (const char* p : {"1/3", "3/3"}) {
    ASSERT_EQ(test::run_ctquant({"quantize", synthetic().string(), out.string(), "--part", p, "-q"})
                  .exit_code,
              0);
  }
  const CommandResult f = test::run_ctquant({"finalize", out.string()});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(test::diff_bytes(out, reference()), "");
}

// One process with --resume: kill -9, rerun, the same output; without
// --resume nothing is kept in the stage when a run fails.
TEST_F(Parts, OneProcessResumeAfterKillDashNine) {
  const fs::path out = tmp_ / "out";
  const fs::path log = stage_of(out) / "part-00001-of-00001.log";
  const std::vector<std::string> args = {"quantize", synthetic().string(), out.string(),
                                         "--resume", "--threads",          "1"};
  std::size_t finished = 0;
  for (int attempt = 0; attempt < 5 && finished == 0; ++attempt) {
    fs::remove_all(stage_of(out));
    fs::remove_all(out);
    finished = kill_after_files(args, log, 2);
  }
  ASSERT_GT(finished, 0u) << "every run finished before kill -9 reached it";
  EXPECT_FALSE(fs::exists(out));
  const CommandResult resumed = test::run_ctquant(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  // Every staged file was hashed by the resumed run itself (kept or
  // written), so its finalize does not read them again.
  test::expect_message(
      resumed.err,
      {fmt::format("part 1/1: {} of", finished), "kept from an earlier run (sha256 checked)"},
      {"finalize: checking the sha256"});
  EXPECT_EQ(test::diff_bytes(out, reference()), "");
  EXPECT_FALSE(fs::exists(stage_of(out)));
}

// A staged file damaged after it was logged is written again.
TEST(Resume, DamagedFileIsWrittenAgain) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(kGoldenInput, out, "1/1").exit_code, 0);
  const fs::path shard = stage_of(out) / "model-00002-of-00002.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  const CommandResult r = test::run_ctquant(
      with({"quantize", kGoldenInput.string(), out.string(), "--part", "1/1", "--resume"},
           kGoldenIgnore));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json record = read_record(out, 1, 1);
  EXPECT_EQ(record["files_written"], 1);
  EXPECT_EQ(record["files_kept"], record["assigned"].size() - 1);
  ASSERT_EQ(test::run_ctquant({"finalize", out.string()}).exit_code, 0);
  EXPECT_EQ(test::diff_golden(out, kGoldenExpected, false), "");
}

// Each changed value says which run had it ("[...] then, [...] now" left
// the reader to guess), and the message says how to go on.
TEST(Resume, ChangedOptionsAreRefusedSayingWhichRunHadWhich) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(kGoldenInput, out, "1/2").exit_code, 0);
  const CommandResult r = test::run_ctquant(
      with({"quantize", kGoldenInput.string(), out.string(), "--part", "1/2", "--resume"},
           with(kGoldenIgnore, {"--ignore", "re:.*o_proj$"})));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  test::expect_message(
      r.err,
      {"cannot resume part 1/2: the plan changed", "options: quantization_config.ignore",
       "resume with the input and options of the part written earlier "
       "(--resume)",
       "write every part into a fresh OUTPUT"},
      {" then, "});
  // The o_proj entry is this run's, not the earlier part's.
  const std::size_t line = r.err.find("options: quantization_config.ignore: ");
  const std::size_t earlier = r.err.find(" in the part written earlier, ", line);
  const std::size_t now = r.err.find(" in this run", earlier);
  ASSERT_NE(now, std::string::npos) << r.err;
  EXPECT_EQ(r.err.substr(line, earlier - line).find("o_proj"), std::string::npos) << r.err;
  EXPECT_NE(r.err.substr(earlier, now - earlier).find("o_proj"), std::string::npos) << r.err;
}

// A group whose weights change is renamed (W4A16 is config_group_0 at group
// size 64): the two are compared field by field, so the changed field is
// shown, not two cut-off dumps of the whole group.
TEST(Resume, RenamedGroupShowsTheFieldThatChanged) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(kGoldenInput, out, "1/2").exit_code, 0);
  const CommandResult r =
      test::run_ctquant(with({"quantize", kGoldenInput.string(), out.string(), "--part", "1/2",
                              "--resume", "--group-size", "64"},
                             kGoldenIgnore));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  test::expect_message(
      r.err,
      {"  - options: quantization_config.config_groups.W4A16: named W4A16 in the part written "
       "earlier, config_group_0 in this run\n",
       "  - options: quantization_config.config_groups.W4A16.weights.group_size: 128 in the part "
       "written earlier, 64 in this run\n"},
      {"...", "absent"});
}

TEST(Resume, ChangedInputIsRefusedNamingIt) {
  TempDir tmp;
  test::copy_dir(kGoldenInput, tmp / "in");
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(tmp / "in", out, "1/2").exit_code, 0);
  json config = test::read_json(tmp / "in" / "config.json");
  config["rope_theta"] = 12345;
  test::write_file(tmp / "in" / "config.json", config.dump(2));
  const CommandResult r = test::run_ctquant(
      with({"quantize", (tmp / "in").string(), out.string(), "--part", "1/2", "--resume"},
           kGoldenIgnore));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  test::expect_message(r.err,
                       {"cannot resume part 1/2: the plan changed", "input config.json: differs"});
}

// The input's weights changed since the part ran, its layout did not:
// --resume once kept the files written from the old weights.
TEST(Resume, ChangedWeightsAreRefusedNamingTheShard) {
  TempDir tmp;
  test::copy_dir(kGoldenInput, tmp / "in");
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(tmp / "in", out, "1/2").exit_code, 0);
  test::flip_tensor_data(tmp / "in" / "model-00002-of-00002.safetensors");
  const CommandResult r = test::run_ctquant(
      with({"quantize", (tmp / "in").string(), out.string(), "--part", "1/2", "--resume"},
           kGoldenIgnore));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  test::expect_message(r.err, {"cannot resume part 1/2: the plan changed",
                               "input shard model-00002-of-00002.safetensors: same size and "
                               "header, other tensor data"});
}

// A part that completed, resumed, keeps everything and writes nothing.
TEST(Resume, CompletePartKeepsEverything) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(kGoldenInput, out, "2/2").exit_code, 0);
  const CommandResult r = test::run_ctquant(
      with({"quantize", kGoldenInput.string(), out.string(), "--part", "2/2", "--resume"},
           kGoldenIgnore));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json record = read_record(out, 2, 2);
  EXPECT_EQ(record["files_written"], 0);
  EXPECT_EQ(record["files_kept"], record["assigned"].size());
}

// Files another part split (other N) finished for the same plan are kept
// too: a run re-split from 2 parts into 1 keeps what the 2 parts wrote.
TEST(Resume, KeepsFilesOfTheSamePlanWrittenByAnotherSplit) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  ASSERT_EQ(run_part(kGoldenInput, out, "1/2").exit_code, 0);
  const std::size_t by_part_one = read_record(out, 1, 2)["files"].size();
  ASSERT_GT(by_part_one, 0u);
  const CommandResult r = test::run_ctquant(
      with({"quantize", kGoldenInput.string(), out.string(), "--resume"}, kGoldenIgnore));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_message(r.err, {fmt::format("part 1/1: {} of", by_part_one)});
  EXPECT_EQ(test::diff_golden(out, kGoldenExpected, false), "");
  // The 2-part run's record was left in the stage, which is therefore kept.
  EXPECT_TRUE(fs::exists(stage_of(out) / "part-00001-of-00002.json"));
}

// SIGINT during a --resume run keeps the staged files and says how to go on.
TEST_F(Parts, InterruptedResumeRunKeepsTheStage) {
  const fs::path out = tmp_ / "out";
  test::CtquantProcess child(
      {"quantize", synthetic().string(), out.string(), "--resume", "--threads", "1"});
  const fs::path log = stage_of(out) / "part-00001-of-00001.log";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && child.running() &&
         !(fs::exists(log) && log_lines(log) >= 2)) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  child.signal(SIGINT);
  const CommandResult r = child.wait();
  if (r.exit_code == 0) GTEST_SKIP() << "the run finished before SIGINT reached it";
  EXPECT_EQ(r.exit_code, 1) << r.err;
  test::expect_message(r.err, {"(SIGINT)", "kept in the staging directory", "--resume"});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::exists(stage_of(out) / "part-00001-of-00001.json"));
  EXPECT_GE(log_lines(log), 2u);
}

// Every golden case (every scheme of the registry) split in 1, 2 and 3
// parts run through the library, then finalized: the same bytes as one
// process, manifest included, and the case's expected tensors. NVFP4's
// fused partners in other shards (sharded-bf16-nvfp4a16) get the global
// scale of their whole set, as in one process. A split in more parts than
// the case has shards is refused (Error{kUsage}) before the stage is made.
class PartsOfEveryCase : public ::testing::TestWithParam<std::string> {};

TEST_P(PartsOfEveryCase, FinalizedPartsEqualOneProcess) {
  const test::GoldenCase c = test::find_case(GetParam());
  TempDir tmp;
  QuantizeOptions options = test::test_options(test::input_of(c), tmp / "one");
  options.plan = test::plan_of(c);
  options.threads = 2;
  options.allow_unloadable = test::unloadable_in_vllm(c.name);
  quantize(options);
  ASSERT_EQ(test::diff_golden(tmp / "one", test::expected_of(c), c.by_library), "");
  const std::size_t shards = count_shards(tmp / "one");
  for (const unsigned n : {1u, 2u, 3u}) {
    SCOPED_TRACE(fmt::format("{} parts", n));
    const fs::path out = tmp / fmt::format("parts{}", n);
    if (n > shards) {
      QuantizeOptions part = options;
      part.output = out;
      part.part = PartSpec{n, n};
      try {
        quantize(part);
        ADD_FAILURE() << "a split in " << n << " parts of " << shards << " shard(s) ran";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      }
      EXPECT_FALSE(fs::exists(default_stage_dir(out)));
      continue;
    }
    for (unsigned i = 1; i <= n; ++i) {
      QuantizeOptions part = options;
      part.output = out;
      part.part = PartSpec{i, n};
      const QuantizeSummary summary = quantize(part);
      ASSERT_TRUE(summary.part.has_value());
      EXPECT_FALSE(fs::exists(out)) << "part " << i << " created OUTPUT";
    }
    FinalizeOptions finalize;
    finalize.output = out;
    finalize.threads = 2;
    const FinalizeSummary summary = finalize_parts(finalize);
    EXPECT_EQ(summary.parts, n);
    EXPECT_EQ(test::diff_bytes(out, tmp / "one"), "");
    const ManifestCheck check = check_manifest(out, 1);
    EXPECT_TRUE(check.ok()) << render_manifest_check_text(check);
    EXPECT_EQ(check.files_listed, summary.manifest.size() - 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PartsOfEveryCase, ::testing::ValuesIn(test::case_names()),
                         [](const auto& param) { return test::case_test_name(param.param); });

}  // namespace
}  // namespace ctquant
