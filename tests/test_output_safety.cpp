// ctquant never leaves something that looks like a finished checkpoint when it
// did not finish, and never writes where it must not (docs/security.md):
// signals, kill -9, --force, OUTPUT placed relative to INPUT, symbolic links
// in INPUT, a full disk and a file size limit.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ctquant/exec/output_dir.hpp"
#include "ctquant/exec/parts.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/util/error.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;
using test::CtquantProcess;
using test::TempDir;

constexpr const char* kWeight = "model.layers.0.mlp.down_proj.weight";

// A small valid checkpoint: one 4 x 256 BF16 weight, a norm, config.json and
// a tokenizer file to copy.
void write_small_checkpoint(const fs::path& dir, bool with_nan = false) {
  fs::create_directories(dir);
  test::FakeTensor w = test::random_weight(kWeight, DType::kBF16, 4, 256, 3);
  if (with_nan) {
    const auto nan = test::float_bytes(DType::kBF16, {std::numeric_limits<float>::quiet_NaN()});
    std::copy(nan.begin(), nan.end(), w.data.begin() + 2 * (256 + 9));
  }
  test::write_safetensors(
      dir / "model.safetensors",
      {w, test::FakeTensor{"model.norm.weight",
                           DType::kBF16,
                           {256},
                           test::float_bytes(DType::kBF16, std::vector<float>(256, 1.0f))}});
  test::write_file(dir / "config.json", "{\"model_type\": \"llama\"}\n");
  test::write_file(dir / "tokenizer.json", "{\"version\": \"1.0\"}\n");
}

// A previous OUTPUT as --force finds it: a shard, config.json and a copied
// file, all regular files.
void write_previous_output(const fs::path& dir) {
  fs::create_directories(dir);
  test::write_safetensors(
      dir / "model.safetensors",
      {test::FakeTensor{
          "old.weight", DType::kBF16, {2}, test::float_bytes(DType::kBF16, {1.0f, 2.0f})}});
  test::write_file(dir / "config.json", "{\"model_type\": \"old\"}\n");
  test::write_file(dir / "keep.txt", "old");
}

void expect_nothing_beside(const fs::path& output) {
  EXPECT_FALSE(fs::exists(fs::symlink_status(output))) << output << " exists";
  EXPECT_TRUE(test::temp_leftovers(output.parent_path()).empty())
      << "a temporary output directory was left in " << output.parent_path();
}

// ---- OUTPUT placed relative to INPUT: usage errors (exit 2), nothing written ----

TEST(OutputSafety, RefusesOutputEqualToInput) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  write_small_checkpoint(input);
  const auto before = test::snapshot_files(input);
  const CommandResult r = test::run_ctquant({"quantize", input.string(), input.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("is the INPUT"), std::string::npos) << r.err;
  EXPECT_EQ(test::snapshot_files(input), before);
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

TEST(OutputSafety, RefusesOutputEqualToInputThroughSymlink) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  write_small_checkpoint(input);
  fs::create_directory_symlink(input, tmp / "alias");
  const CommandResult r =
      test::run_ctquant({"quantize", input.string(), (tmp / "alias").string(), "--force"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("is the INPUT"), std::string::npos) << r.err;
}

TEST(OutputSafety, RefusesOutputInsideInput) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  write_small_checkpoint(input);
  const auto before = test::snapshot_files(input);
  const CommandResult r =
      test::run_ctquant({"quantize", input.string(), (input / "w4a16").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("lies inside INPUT"), std::string::npos) << r.err;
  EXPECT_EQ(test::snapshot_files(input), before);
  EXPECT_TRUE(test::temp_leftovers(input).empty());
}

TEST(OutputSafety, RefusesOutputContainingInput) {
  TempDir tmp;
  const fs::path input = tmp / "models" / "ckpt";
  write_small_checkpoint(input);
  const auto before = test::snapshot_files(tmp / "models");
  const CommandResult r =
      test::run_ctquant({"quantize", input.string(), (tmp / "models").string(), "--force"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("contains INPUT"), std::string::npos) << r.err;
  EXPECT_EQ(test::snapshot_files(tmp / "models"), before);
}

TEST(OutputSafety, RefusesExistingOutputWithoutForce) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  fs::create_directories(tmp / "out");
  test::write_file(tmp / "out" / "keep.txt", "old");
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("already exists (use --force"), std::string::npos) << r.err;
  EXPECT_EQ(test::read_file(tmp / "out" / "keep.txt"), "old");
}

// ---- --force replaces OUTPUT only once the new one is complete ----

TEST(OutputSafety, ForceKeepsOldOutputWhenTheNewRunFails) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt", /*with_nan=*/true);
  write_previous_output(tmp / "out");
  const auto before = test::snapshot_files(tmp / "out");
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), (tmp / "out").string(), "--force"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("element [1, 9] is nan"), std::string::npos) << r.err;
  EXPECT_EQ(test::snapshot_files(tmp / "out"), before);
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

TEST(OutputSafety, ForceReplacesOldOutputWhenTheNewRunSucceeds) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  write_previous_output(tmp / "out");
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), (tmp / "out").string(), "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out" / "keep.txt"));
  EXPECT_EQ(test::read_tensor(tmp / "out" / "model.safetensors", "model.norm.weight"),
            test::read_tensor(tmp / "ckpt" / "model.safetensors", "model.norm.weight"));
  EXPECT_EQ(test::read_tensor(tmp / "out" / "model.safetensors",
                              "model.layers.0.mlp.down_proj.weight_shape")
                .size(),
            16u);
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

// ctquant's own earlier OUTPUT, run again with --force: replaced by the new
// one, including a file added to it since.
TEST(OutputSafety, ForceReplacesPreviousOutput) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  const fs::path output = tmp / "out";
  // Nothing quantized (lint L9): written anyway under --allow-unloadable.
  const CommandResult first =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), output.string(), "--ignore",
                         "re:.*down_proj$", "--allow-unloadable"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  test::write_file(output / "notes.txt", "added later");
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), output.string(), "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(output / "notes.txt"));
  EXPECT_EQ(
      test::read_tensor(output / "model.safetensors", "model.layers.0.mlp.down_proj.weight_shape")
          .size(),
      16u);
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

TEST(OutputSafety, ForceReplacesEmptyDirectory) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  fs::create_directories(tmp / "out");
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), (tmp / "out").string(), "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_tensor(tmp / "out" / "model.safetensors", "model.norm.weight"),
            test::read_tensor(tmp / "ckpt" / "model.safetensors", "model.norm.weight"));
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

// --force on an OUTPUT that does not look like a checkpoint directory: a
// usage error naming OUTPUT, the reason (fragment) and the fix, raised before
// INPUT is read (a missing INPUT gives the same error), through the binary
// (exit 2) and the library (kUsage); OUTPUT keeps every file byte for byte.
void expect_force_refused(const TempDir& tmp, const fs::path& output, const std::string& fragment) {
  write_small_checkpoint(tmp / "ckpt");
  const auto before = test::snapshot_files(output);
  const std::vector<std::string> present = {
      "OUTPUT " + output.string() + " does not look like a checkpoint directory: it " + fragment,
      "--force replaces only an empty directory or one that holds nothing but regular files",
      "remove it yourself, or choose another OUTPUT"};
  for (const fs::path& input : {tmp / "ckpt", tmp / "absent"}) {
    SCOPED_TRACE(input.string());
    const CommandResult r =
        test::run_ctquant({"quantize", input.string(), output.string(), "--force"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    test::expect_message(r.err, present);
    EXPECT_EQ(test::snapshot_files(output), before);
    EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
  }
  QuantizeOptions options = test::test_options(tmp / "ckpt", output);
  options.force = true;
  try {
    quantize(options);
    ADD_FAILURE() << output << " was replaced";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    test::expect_message(e.what(), present);
  }
  EXPECT_EQ(test::snapshot_files(output), before);
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

// A home directory: a shard among other files, but also a subdirectory.
TEST(OutputSafety, ForceRefusesDirectoryWithSubdirectory) {
  TempDir tmp;
  const fs::path home = tmp / "home";
  write_previous_output(home);
  fs::create_directories(home / "projects" / "src");
  test::write_file(home / "projects" / "src" / "main.cpp", "int main() {}\n");
  test::write_file(home / "zzz.txt", "last");
  expect_force_refused(tmp, home, "holds the subdirectory 'projects'");
  EXPECT_TRUE(fs::is_directory(home / "projects" / "src"));
}

// Regular files only, but none of them a .safetensors file.
TEST(OutputSafety, ForceRefusesDirectoryWithoutSafetensors) {
  TempDir tmp;
  const fs::path docs = tmp / "docs";
  fs::create_directories(docs);
  test::write_file(docs / ".profile", "export PATH\n");
  test::write_file(docs / "config.json", "{}\n");
  test::write_file(docs / "notes.safetensors.txt", "not a shard");
  expect_force_refused(tmp, docs, "holds no .safetensors file");
}

// A symbolic link among the files, even one to a regular file: removing the
// directory would remove the link, and what it stands for is not known.
TEST(OutputSafety, ForceRefusesSymlinkEntry) {
  TempDir tmp;
  const fs::path output = tmp / "out";
  write_previous_output(output);
  fs::create_directories(tmp / "shared");
  test::write_file(tmp / "shared" / "tokenizer.json", "{\"version\": \"shared\"}\n");
  fs::create_symlink(tmp / "shared" / "tokenizer.json", output / "tokenizer.json");
  expect_force_refused(tmp, output, "holds the symbolic link 'tokenizer.json'");
  EXPECT_EQ(fs::read_symlink(output / "tokenizer.json"), tmp / "shared" / "tokenizer.json");
  EXPECT_EQ(test::read_file(tmp / "shared" / "tokenizer.json"), "{\"version\": \"shared\"}\n");
}

// A FIFO (or a device or socket) among the files.
TEST(OutputSafety, ForceRefusesSpecialFileEntry) {
  TempDir tmp;
  const fs::path output = tmp / "out";
  write_previous_output(output);
  ASSERT_EQ(::mkfifo((output / "pipe").c_str(), 0600), 0) << std::strerror(errno);
  expect_force_refused(tmp, output, "holds 'pipe', which is not a regular file");
  EXPECT_TRUE(fs::is_fifo(output / "pipe"));
}

// A file as OUTPUT is not a checkpoint directory: --force does not replace it.
TEST(OutputSafety, ForceDoesNotReplaceAFile) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  test::write_file(tmp / "out", "a file");
  QuantizeOptions options = test::test_options(tmp / "in", tmp / "out");
  options.force = true;
  try {
    quantize(options);
    ADD_FAILURE() << "the file was replaced";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    test::expect_message(e.what(), {"exists and is a file, not a directory"});
  }
  EXPECT_EQ(test::read_file(tmp / "out"), "a file");
}

// The working directory of ctquant, or a directory above it, is never
// replaced, with or without --force, even when it holds a checkpoint.
TEST(OutputSafety, ForceRefusesCurrentDirectory) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  const fs::path work = tmp / "work";
  write_previous_output(work);
  fs::create_directories(work / "run");
  test::write_file(work / "run" / "model.safetensors", "a shard");
  const auto before = test::snapshot_files(work);
  struct Case {
    fs::path cwd;
    std::string output;
    bool force;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {work / "run", ".", true, "OUTPUT . is the current working directory"},
      {work / "run", ".", false, "OUTPUT . is the current working directory"},
      {work / "run", "./", true, "OUTPUT ./ is the current working directory"},
      {work / "run", (work / "run").string(), true, "is the current working directory"},
      {work / "run", "../run", true, "is the current working directory"},
      {work / "run", "..", true,
       "OUTPUT .. contains the current working directory " + fs::canonical(work / "run").string()},
      {work / "run", work.string(), true, "contains the current working directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.output + (c.force ? " --force" : ""));
    std::vector<std::string> args = {"quantize", (tmp / "ckpt").string(), c.output};
    if (c.force) args.push_back("--force");
    test::RunOptions options;
    options.cwd = c.cwd;
    const CommandResult r = test::run_ctquant(args, options);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    test::expect_message(r.err, {c.fragment, "ctquant never replaces it: choose another OUTPUT"});
    EXPECT_EQ(test::snapshot_files(work), before);
    EXPECT_TRUE(test::temp_leftovers(work).empty());
    EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
  }
}

// What --force would remove is checked again at the rename, under the
// temporary name: an OUTPUT that changed, or appeared, while ctquant ran and
// no longer qualifies is put back untouched and the new output discarded.
TEST(OutputSafety, ForceRefusesOutputThatChangedDuringTheRun) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  const fs::path output = tmp / "out";
  write_previous_output(output);
  {
    StagedOutput staged(output, tmp / "ckpt", /*force=*/true);
    test::write_file(staged.dir() / "model.safetensors", "new");
    fs::create_directories(output / "projects");
    test::write_file(output / "projects" / "plan.txt", "mine");
    const auto before = test::snapshot_files(output);
    try {
      (void)staged.commit();
      ADD_FAILURE() << output << " was replaced";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      test::expect_message(e.what(), {"holds the subdirectory 'projects'",
                                      "remove it yourself, or choose another OUTPUT"});
    }
    EXPECT_EQ(test::snapshot_files(output), before);
  }
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

TEST(OutputSafety, ForceRefusesOutputThatAppearedDuringTheRun) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  const fs::path output = tmp / "out";
  {
    StagedOutput staged(output, tmp / "ckpt", /*force=*/true);
    test::write_file(staged.dir() / "model.safetensors", "new");
    fs::create_directories(output);
    test::write_file(output / "notes.txt", "mine");
    try {
      (void)staged.commit();
      ADD_FAILURE() << output << " was replaced";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      test::expect_message(e.what(), {"holds no .safetensors file"});
    }
    EXPECT_EQ(test::snapshot_files(output),
              (std::map<std::string, std::string>{{"notes.txt", "mine"}}));
  }
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

// ---- symbolic links in INPUT ----

// A link that leads out of INPUT is refused (exit 1) and its target is
// neither read nor copied.
TEST(OutputSafety, RefusesSymlinkLeadingOutOfInput) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  write_small_checkpoint(input);
  test::write_file(tmp / "secret.txt", "do not publish");
  fs::remove(input / "tokenizer.json");
  fs::create_symlink(tmp / "secret.txt", input / "tokenizer.json");
  const fs::path output = tmp / "out";
  const CommandResult r = test::run_ctquant({"quantize", input.string(), output.string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tokenizer.json: is a symbolic link to " + (tmp / "secret.txt").string() +
                       ", outside the checkpoint directory"),
            std::string::npos)
      << r.err;
  expect_nothing_beside(output);
}

// The same through a relative link with "..", and for a shard.
TEST(OutputSafety, RefusesRelativeSymlinkToShardOutsideInput) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  write_small_checkpoint(input);
  fs::rename(input / "model.safetensors", tmp / "model.safetensors");
  fs::create_symlink("../model.safetensors", input / "model.safetensors");
  const QuantizeOptions options = test::test_options(input, tmp / "out");
  try {
    quantize(options);
    FAIL() << "a shard outside INPUT was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("model.safetensors: is a symbolic link"),
              std::string::npos)
        << e.what();
  }
  expect_nothing_beside(tmp / "out");
}

// A link that stays inside INPUT is followed and its target copied as a
// regular file.
TEST(OutputSafety, FollowsSymlinkInsideInput) {
  TempDir tmp;
  const fs::path input = tmp / "ckpt";
  write_small_checkpoint(input);
  fs::create_directories(input / "files");
  fs::rename(input / "tokenizer.json", input / "files" / "tokenizer.json");
  fs::create_symlink("files/tokenizer.json", input / "tokenizer.json");
  const CommandResult r = test::run_ctquant({"quantize", input.string(), (tmp / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::is_symlink(tmp / "out" / "tokenizer.json"));
  EXPECT_EQ(test::read_file(tmp / "out" / "tokenizer.json"), "{\"version\": \"1.0\"}\n");
  EXPECT_FALSE(fs::exists(tmp / "out" / "files"));  // subdirectories are not copied
  EXPECT_NE(r.err.find("files (a directory): not a regular file; not copied to OUTPUT"),
            std::string::npos)
      << r.err;
}

// ---- full disk and file size limit ----

// RLIMIT_FSIZE set in the child: writes fail with EFBIG, reported as no space.
TEST(OutputSafety, FileSizeLimitEndsWithNoSpace) {
  TempDir tmp;
  test::write_large_checkpoint(tmp / "ckpt", 4, 256, 1024);  // 2 MiB in, ~0.5 MiB out
  const fs::path output = tmp / "out";
  test::RunOptions options;
  options.file_size_limit = 64 * 1024;
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), output.string()}, options);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("no space"), std::string::npos) << r.err;
  expect_nothing_beside(output);
}

// A tmpfs mounted for the test, unmounted (lazily) at the end.
class SmallTmpfs {
 public:
  SmallTmpfs(const fs::path& where, const std::string& size) : path_(where) {
    fs::create_directories(path_);
    const std::string options = "size=" + size;
    if (::mount("ctquant-test", path_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) ==
        0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  fs::path path_;
  bool mounted_ = false;
  std::string error_;
};

TEST(OutputSafety, FullTmpfsEndsWithNoSpace) {
  TempDir tmp;
  test::write_large_checkpoint(tmp / "ckpt", 4, 256, 1024);
  const SmallTmpfs disk(tmp / "disk", "256k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << disk.error();
  const fs::path output = tmp / "disk" / "out";
  const CommandResult r = test::run_ctquant({"quantize", (tmp / "ckpt").string(), output.string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("no space"), std::string::npos) << r.err;
  expect_nothing_beside(output);
  EXPECT_TRUE(fs::is_empty(tmp / "disk"));
}

// --report on a full disk: the report is written before OUTPUT is renamed
// into place, so its failure leaves no OUTPUT, and the same command succeeds
// once there is room (no "OUTPUT exists" in the way).
TEST(OutputSafety, ReportThatCannotBeWrittenLeavesNoOutput) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  const SmallTmpfs disk(tmp / "disk", "64k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << disk.error();
  {
    std::ofstream fill(tmp / "disk" / "fill", std::ios::binary);
    const std::string block(4096, 'x');
    while (fill.write(block.data(), static_cast<std::streamsize>(block.size()))) fill.flush();
  }
  const fs::path output = tmp / "out";
  const std::vector<std::string> args = {"quantize", (tmp / "ckpt").string(), output.string(),
                                         "--report", (tmp / "disk" / "r.json").string(),
                                         "--write-recipe", (tmp / "recipe.yaml").string()};
  const CommandResult full = test::run_ctquant(args);
  EXPECT_EQ(full.exit_code, 1) << full.err;
  test::expect_message(full.err, {"--report " + (tmp / "disk" / "r.json").string(), "no space"},
                       {"Success"});
  expect_nothing_beside(output);
  EXPECT_FALSE(fs::exists(tmp / "recipe.yaml")) << "the recipe of a run that failed was written";
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
  EXPECT_EQ(test::snapshot_files(tmp / "disk").size(), 1u);  // only the filler
  fs::remove(tmp / "disk" / "fill");
  const CommandResult retry = test::run_ctquant(args);
  EXPECT_EQ(retry.exit_code, 0) << retry.err;
  EXPECT_TRUE(fs::exists(output / "model.safetensors"));
  EXPECT_EQ(test::read_json(tmp / "disk" / "r.json")["output"]["path"], output.string());
  EXPECT_TRUE(fs::exists(tmp / "recipe.yaml"));
}

// QuantizeOptions::before_commit runs once OUTPUT is complete in its
// temporary directory and before the rename: what it throws leaves no
// OUTPUT, for a one-process run and for a --resume run (which keeps its
// stage).
TEST(OutputSafety, BeforeCommitRunsBeforeTheRenameAndItsFailureLeavesNoOutput) {
  for (const bool resume : {false, true}) {
    SCOPED_TRACE(resume ? "--resume" : "one process");
    TempDir tmp;
    QuantizeOptions options = test::test_options(tmp / "ckpt", tmp / "out");
    write_small_checkpoint(tmp / "ckpt");
    options.resume = resume;
    bool called = false;
    options.before_commit = [&](const QuantizeSummary& summary) {
      called = true;
      EXPECT_FALSE(fs::exists(tmp / "out"));
      EXPECT_FALSE(summary.output_files.empty());  // digests known: the report can be made
      throw io_error("--report r.json: write failed: Input/output error");
    };
    try {
      quantize(options);
      ADD_FAILURE() << "the run succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    }
    EXPECT_TRUE(called);
    expect_nothing_beside(tmp / "out");
    if (resume) {
      EXPECT_TRUE(fs::exists(default_stage_dir(tmp / "out")));
    }
  }
}

// ---- what earlier runs left: named, never removed ----

// A pid that no longer runs: a child that exited and was reaped.
int dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// A temporary directory of a run that died (kill -9, a second SIGINT) is
// named on the next run with its size and the command that removes it; a
// live process's is not; neither is removed.
TEST(OutputSafety, LeftoverOfADeadRunIsNamedWithItsSizeAndNeverRemoved) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  const fs::path dead = tmp / fmt::format(".out.ctquant-tmp-{}-0badc0de", dead_pid());
  fs::create_directories(dead);
  test::write_file(dead / "model.safetensors", std::string(3 * 1024 * 1024, 'x'));
  const fs::path live = tmp / fmt::format(".out.ctquant-tmp-{}-12345678", ::getpid());
  fs::create_directories(live);
  const fs::path other = tmp / fmt::format(".other.ctquant-tmp-{}-0badc0de", dead_pid());
  fs::create_directories(other);
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "ckpt").string(), (tmp / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_message(r.err, {"ctquant: warning: " + dead.string() + " (3.0 MiB) was left by an "
                               "earlier ctquant run that did not finish",
                               "ctquant does not remove it: rm -rf " + dead.string()},
                       {live.string(), other.string()});
  EXPECT_TRUE(fs::exists(dead / "model.safetensors"));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
}

// The default staging directory of a --part or --resume run that no process
// uses is named by a plain run for the same OUTPUT.
TEST(OutputSafety, AbandonedStageIsNamedByTheNextRun) {
  TempDir tmp;
  write_small_checkpoint(tmp / "ckpt");
  const fs::path out = tmp / "out";
  ASSERT_EQ(test::run_ctquant({"quantize", (tmp / "ckpt").string(), out.string(), "--part", "1/1"})
                .exit_code,
            0);
  const CommandResult r = test::run_ctquant({"quantize", (tmp / "ckpt").string(), out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_message(r.err, {default_stage_dir(out).string() + " (",
                               "the staging directory of an earlier --part or --resume run",
                               "rm -rf " + default_stage_dir(out).string()});
  EXPECT_TRUE(fs::exists(default_stage_dir(out)));
}

// ---- cancel (the flag a signal handler sets) at every phase ----

QuantizeOptions small_job(const TempDir& tmp) {
  write_small_checkpoint(tmp / "ckpt");
  return test::test_options(tmp / "ckpt", tmp / "out");
}

void expect_interrupted(const QuantizeOptions& options) {
  try {
    quantize(options);
    FAIL() << "the run was not interrupted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInterrupted) << e.what();
    EXPECT_NE(std::string(e.what()).find("interrupted by a signal"), std::string::npos);
  }
  expect_nothing_beside(options.output);
}

// A signal that arrives while the checkpoint is opened or planned.
TEST(OutputSafety, CancelBeforeWritingLeavesNothing) {
  TempDir tmp;
  QuantizeOptions options = small_job(tmp);
  std::atomic<bool> cancel{true};
  options.cancel = &cancel;
  expect_interrupted(options);
}

// A signal that arrives after the last tensor job, while the JSON files and
// copied files are written and everything is flushed: still no OUTPUT.
TEST(OutputSafety, CancelAfterTheLastTensorJobLeavesNothing) {
  TempDir tmp;
  QuantizeOptions options = small_job(tmp);
  std::atomic<bool> cancel{false};
  bool reached_end = false;
  options.cancel = &cancel;
  options.on_progress = [&](const Progress& p) {
    if (p.bytes_done == p.bytes_total) {
      reached_end = true;
      cancel.store(true);
    }
  };
  expect_interrupted(options);
  EXPECT_TRUE(reached_end);
}

// ---- real signals and kill -9 on the binary, mid-run ----

// Waits until a temporary output directory appears in dir, or the child
// exits. Returns its name, or "".
std::string wait_for_temp_dir(const CtquantProcess& child, const fs::path& dir) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto found = test::temp_leftovers(dir);
    if (!found.empty()) return found.front();
    if (!child.running()) return "";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return "";
}

// Signals on the binary mid-run. The test sends the signal as soon as it
// sees the temporary directory; a run that completed before the signal could
// take effect (exit 0, complete OUTPUT: also a correct outcome) is retried
// with an input twice as large (128, 256, 512 MiB), so that the test always
// checks a run that was really interrupted, however fast the machine.
class Interrupt : public ::testing::Test {
 protected:
  TempDir tmp_;
  const fs::path input_ = tmp_ / "ckpt";
  const fs::path output_ = tmp_ / "out";

  CommandResult interrupt_with(int signal_number) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      fs::remove_all(input_);
      test::write_large_checkpoint(input_, 16u << attempt, 2048, 2048);
      CtquantProcess child({"quantize", input_.string(), output_.string(), "--threads", "1"});
      const std::string temp = wait_for_temp_dir(child, tmp_.path());
      EXPECT_FALSE(temp.empty()) << "no temporary directory appeared";
      child.signal(signal_number);
      CommandResult result = child.wait();
      if (result.exit_code == 0 && fs::exists(output_ / "model.safetensors")) {
        fs::remove_all(output_);  // finished first: try again, larger
        continue;
      }
      return result;
    }
    ADD_FAILURE() << "every run finished before the signal reached it";
    return {};
  }
};

TEST_F(Interrupt, SigintRemovesTheTemporaryDirectory) {
  const CommandResult r = interrupt_with(SIGINT);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("interrupted by a signal before OUTPUT was complete (SIGINT)"),
            std::string::npos)
      << r.err;
  expect_nothing_beside(output_);
}

TEST_F(Interrupt, SigtermRemovesTheTemporaryDirectory) {
  const CommandResult r = interrupt_with(SIGTERM);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("interrupted by a signal before OUTPUT was complete (SIGTERM)"),
            std::string::npos)
      << r.err;
  expect_nothing_beside(output_);
}

// kill -9 cannot be handled: OUTPUT must not exist, and what is left is a
// directory recognisable as ctquant's temporary output by its name.
TEST_F(Interrupt, KillDashNineLeavesOnlyARecognisableTemporaryDirectory) {
  const CommandResult r = interrupt_with(SIGKILL);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_FALSE(fs::exists(output_));
  const auto left = test::temp_leftovers(tmp_.path());
  ASSERT_EQ(left.size(), 1u);
  const std::string& name = left.front();
  EXPECT_TRUE(name.starts_with(".out.ctquant-tmp-")) << name;
  // The next run (a dry run here: it reads only the headers) names it.
  const CommandResult next =
      test::run_ctquant({"quantize", input_.string(), output_.string(), "--dry-run"});
  EXPECT_EQ(next.exit_code, 0) << next.err;
  test::expect_message(next.err, {(tmp_ / name).string(), "was left by an earlier ctquant run",
                                  "rm -rf " + (tmp_ / name).string()});
  EXPECT_TRUE(fs::exists(tmp_ / name));
}

}  // namespace
}  // namespace ctquant
