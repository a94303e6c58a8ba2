// The path policy (include/ctquant/exec/path_policy.hpp): every path ctquant
// writes, renames or removes is checked against INPUT, the others and the
// working directory before INPUT is read; a stage is absent, empty or one
// ctquant made. The five ways the input could once be destroyed are each a
// regression test here, through the binary, with INPUT checked byte for byte
// afterwards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/exec/output_dir.hpp"
#include "ctquant/exec/parts.hpp"
#include "ctquant/exec/path_policy.hpp"
#include "ctquant/util/error.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;
using test::TempDir;

// A copy of the golden llama-bf16 input (config.json, model.safetensors,
// generation and tokenizer configs), writable.
fs::path copy_model(const TempDir& tmp, const std::string& name = "model") {
  const fs::path dir = tmp / name;
  test::copy_dir(test::golden_dir() / "llama-bf16" / "input", dir);
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dir;
}

Error policy_error(const RunPaths& paths) {
  try {
    check_run_paths(paths);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "check_run_paths accepted the paths";
  return Error(ErrorKind::kIo, "");
}

// ---- the five ways INPUT could be destroyed: each refused, INPUT intact ----

// `cd model && ctquant quantize . ../model-w4 --resume --stage .` once
// renamed the part's files over the input's and then removed the directory.
TEST(PathPolicy, ResumeWithTheStageInInputLeavesInputIntact) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  const auto before = test::snapshot_files(model);
  test::RunOptions in_model;
  in_model.cwd = model;
  const CommandResult r =
      test::run_ctquant({"quantize", ".", "../model-w4", "--resume", "--stage", "."}, in_model);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  test::expect_message(r.err, {"--stage . is the INPUT .", "choose a directory outside INPUT"});
  EXPECT_EQ(test::snapshot_files(model), before);
  EXPECT_FALSE(fs::exists(tmp / "model-w4"));
}

// `quantize IN OUT --part 1/1 --stage IN && finalize OUT --stage IN` once
// deleted IN: the part is refused, and finalize does not take IN for a stage.
TEST(PathPolicy, PartAndFinalizeWithTheStageEqualToInputLeaveInputIntact) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  const auto before = test::snapshot_files(model);
  const std::string out = (tmp / "out").string();
  const CommandResult part = test::run_ctquant(
      {"quantize", model.string(), out, "--part", "1/1", "--stage", model.string()});
  EXPECT_EQ(part.exit_code, 2) << part.err;
  test::expect_message(part.err, {"--stage " + model.string() + " is the INPUT " + model.string()});
  const CommandResult fin = test::run_ctquant({"finalize", out, "--stage", model.string()});
  EXPECT_EQ(fin.exit_code, 2) << fin.err;
  test::expect_message(fin.err, {"--stage " + model.string(),
                                 "holds 'config.json' but no " + std::string(kStageMarkerName)});
  EXPECT_EQ(test::snapshot_files(model), before);
  EXPECT_FALSE(fs::exists(out));
}

// A --stage that holds the user's own config.json once had it overwritten by
// the part's config.json, then removed by finalize.
TEST(PathPolicy, StageHoldingTheUsersFilesIsRefused) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  const fs::path mine = tmp / "mine";
  fs::create_directories(mine);
  test::write_file(mine / "config.json", "{\"mine\": true}\n");
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--resume"}, std::vector<std::string>{"--part", "1/2"}}) {
    std::vector<std::string> args = {"quantize", model.string(), (tmp / "out").string(), "--stage",
                                     mine.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = test::run_ctquant(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    test::expect_message(r.err, {"--stage " + mine.string(), "holds 'config.json'",
                                 "a staging directory must be absent, empty, or one ctquant made"});
  }
  EXPECT_EQ(test::snapshot_files(mine),
            (std::map<std::string, std::string>{{"config.json", "{\"mine\": true}\n"}}));
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// --report IN/model.safetensors and --write-recipe IN/config.json once
// overwrote input files after a successful run.
TEST(PathPolicy, ReportAndRecipeInsideInputAreRefusedBeforeTheRun) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  const auto before = test::snapshot_files(model);
  const std::string shard = (model / "model.safetensors").string();
  const std::string config = (model / "config.json").string();
  const std::string out = (tmp / "out").string();
  const CommandResult report =
      test::run_ctquant({"quantize", model.string(), out, "--report", shard});
  EXPECT_EQ(report.exit_code, 2) << report.err;
  test::expect_message(report.err, {"--report " + shard + " lies inside INPUT " + model.string()});
  const CommandResult recipe =
      test::run_ctquant({"quantize", model.string(), out, "--write-recipe", config});
  EXPECT_EQ(recipe.exit_code, 2) << recipe.err;
  test::expect_message(recipe.err,
                       {"--write-recipe " + config + " lies inside INPUT " + model.string()});
  EXPECT_EQ(test::snapshot_files(model), before);
  EXPECT_FALSE(fs::exists(out));
}

// --stage equal to OUTPUT once ran the whole job, then exited 2 leaving stage
// files where OUTPUT should be. Now nothing is written at all.
TEST(PathPolicy, StageEqualToOutputIsRefusedBeforeAnythingIsWritten) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  const std::string out = (tmp / "out").string();
  const CommandResult r =
      test::run_ctquant({"quantize", model.string(), out, "--resume", "--stage", out});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  test::expect_message(r.err, {"--stage " + out + " is OUTPUT " + out});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

// ---- the table, rule by rule, through check_run_paths ----

TEST(PathPolicy, EveryRuleOfTheTableNamesBothPaths) {
  TempDir tmp;
  const fs::path in = tmp / "in";
  fs::create_directories(in);
  test::write_file(in / "model.safetensors", "x");
  const fs::path out = tmp / "out";
  struct Case {
    const char* rule;
    RunPaths paths;
    std::vector<std::string> fragments;
  };
  const auto paths = [&](auto edit) {
    RunPaths p;
    p.input = in;
    p.output = out;
    edit(p);
    return p;
  };
  const std::string i = in.string();
  const std::string o = out.string();
  const std::vector<Case> cases = {
      {"OUTPUT in INPUT",
       paths([&](RunPaths& p) { p.output = in / "w4"; }),
       {"OUTPUT " + i + "/w4 lies inside INPUT " + i}},
      {"OUTPUT over INPUT",
       paths([&](RunPaths& p) {
         p.output = tmp.path();
         p.force = true;
       }),
       {"OUTPUT " + tmp.path().string() + " contains INPUT " + i}},
      {"stage is INPUT",
       paths([&](RunPaths& p) { p.stage = in; }),
       {"--stage " + i + " is the INPUT " + i}},
      {"stage in INPUT",
       paths([&](RunPaths& p) { p.stage = in / "st"; }),
       {"--stage " + i + "/st lies inside INPUT " + i}},
      {"stage over INPUT",
       paths([&](RunPaths& p) { p.stage = tmp.path(); }),
       {"--stage " + tmp.path().string() + " contains INPUT " + i}},
      {"default stage over INPUT",
       paths([&](RunPaths& p) {
         p.stage = tmp.path();
         p.stage_named = false;
       }),
       {"the staging directory " + tmp.path().string() + " contains INPUT"}},
      {"report is an input file",
       paths([&](RunPaths& p) { p.report = in / "model.safetensors"; }),
       {"--report " + i + "/model.safetensors lies inside INPUT " + i}},
      {"recipe in INPUT",
       paths([&](RunPaths& p) { p.recipe = in / "recipe.yaml"; }),
       {"--write-recipe " + i + "/recipe.yaml lies inside INPUT " + i}},
      {"stage is OUTPUT",
       paths([&](RunPaths& p) { p.stage = out; }),
       {"--stage " + o + " is OUTPUT " + o}},
      {"stage in OUTPUT",
       paths([&](RunPaths& p) { p.stage = out / "st"; }),
       {"--stage " + o + "/st lies inside OUTPUT " + o}},
      {"OUTPUT in stage",
       paths([&](RunPaths& p) {
         p.stage = tmp / "st";
         p.output = tmp / "st" / "o";
       }),
       {"--stage " + (tmp / "st").string() + " contains OUTPUT"}},
      {"report in OUTPUT",
       paths([&](RunPaths& p) { p.report = out / "r.json"; }),
       {"--report " + o + "/r.json lies inside OUTPUT " + o}},
      {"recipe in OUTPUT",
       paths([&](RunPaths& p) { p.recipe = out / "r.yaml"; }),
       {"--write-recipe " + o + "/r.yaml lies inside OUTPUT " + o}},
      {"report in stage",
       paths([&](RunPaths& p) {
         p.stage = tmp / "st";
         p.report = tmp / "st" / "r";
       }),
       {"--report " + (tmp / "st" / "r").string() + " lies inside --stage"}},
      {"recipe is report",
       paths([&](RunPaths& p) {
         p.report = tmp / "r";
         p.recipe = tmp / "x" / ".." / "r";
       }),
       {"--write-recipe", "is --report " + (tmp / "r").string(),
        "give the two files separate paths"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rule);
    const Error e = policy_error(c.paths);
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    test::expect_message(e.what(), c.fragments);
  }
  // None of it created anything.
  EXPECT_EQ(test::snapshot_files(tmp.path()),
            (std::map<std::string, std::string>{{"in/model.safetensors", "x"}}));
}

// The rules hold through symbolic links: a path is compared as the entry a
// rename replaces and as what it resolves to.
TEST(PathPolicy, SymbolicLinksDoNotHideInput) {
  TempDir tmp;
  const fs::path in = tmp / "in";
  fs::create_directories(in);
  test::write_file(in / "config.json", "{}");
  fs::create_directory_symlink(in, tmp / "alias");
  RunPaths p;
  p.input = in;
  p.output = tmp / "out";
  p.report = tmp / "alias" / "config.json";
  test::expect_message(policy_error(p).what(), {"--report", "lies inside INPUT"});
  p.report.reset();
  p.stage = tmp / "alias";
  test::expect_message(policy_error(p).what(), {"--stage", "is the INPUT"});
}

// A single .safetensors file as INPUT is read with the config.json beside
// it: that file is guarded too; a new directory beside it is not.
TEST(PathPolicy, SingleFileInputGuardsItsConfig) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  RunPaths p;
  p.input = model / "model.safetensors";
  p.output = model / "w4";
  EXPECT_NO_THROW(check_run_paths(p));
  p.recipe = model / "config.json";
  test::expect_message(
      policy_error(p).what(),
      {"--write-recipe " + (model / "config.json").string() + " is INPUT's config.json"});
}

// ---- the state of each path ----

TEST(PathPolicy, ReportAndRecipeMustBeFilesInAWritableDirectory) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  fs::create_directories(tmp / "reports");
  const std::string out = (tmp / "out").string();
  struct Case {
    std::vector<std::string> option;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {{"--report", (tmp / "reports").string()}, {"is a directory; give the path of a file"}},
      {{"--write-recipe", (tmp / "reports").string() + "/"}, {"is a directory"}},
      {{"--report", (tmp / "none" / "r.json").string()},
       {"the directory " + (tmp / "none").string() + " that should hold it does not exist"}},
      {{"--report", "/dev/null"}, {"exists and is not a regular file", "use --json"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.option[0] + " " + c.option[1]);
    std::vector<std::string> args = {"quantize", model.string(), out};
    args.insert(args.end(), c.option.begin(), c.option.end());
    const CommandResult r = test::run_ctquant(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    test::expect_message(r.err, c.fragments, {"Success"});
    EXPECT_FALSE(fs::exists(out));
  }
  if (::geteuid() != 0) {  // root writes anywhere
    fs::permissions(tmp / "reports", fs::perms::owner_write, fs::perm_options::remove);
    const CommandResult r = test::run_ctquant(
        {"quantize", model.string(), out, "--report", (tmp / "reports" / "r.json").string()});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    test::expect_message(r.err, {"cannot write in " + (tmp / "reports").string()});
    fs::permissions(tmp / "reports", fs::perms::owner_write, fs::perm_options::add);
  }
}

// For the tests of what an unprivileged user may not write: a copy of the
// model every user can read (tmp made traversable), and the prefix that runs
// a shell command as such a user (setpriv to nobody when the tests run as
// root, who writes anywhere; "" otherwise), or kCannotDrop.
constexpr fs::perms kEveryoneReads = fs::perms::owner_all | fs::perms::group_read |
                                     fs::perms::group_exec | fs::perms::others_read |
                                     fs::perms::others_exec;
constexpr const char* kCannotDrop = "the ctquant binary cannot be run as an unprivileged user here";

fs::path readable_model(const TempDir& tmp) {
  const fs::path model = copy_model(tmp);
  fs::permissions(tmp.path(), kEveryoneReads);
  for (const auto& e : fs::recursive_directory_iterator(model)) {
    fs::permissions(e.path(), fs::perms::others_read, fs::perm_options::add);
  }
  fs::permissions(model, kEveryoneReads);
  return model;
}

std::string unprivileged_prefix() {
  if (::geteuid() != 0) return "";
  const std::string prefix = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  return test::run_shell(prefix + "\"$CTQUANT\" --version >/dev/null").exit_code == 0 ? prefix
                                                                                      : kCannotDrop;
}

// A directory the run cannot create its files in is refused before INPUT is
// read (exit 1, nothing written; the refusal once came after planning and
// any --observer auto measuring), and a dry run warns. Run as an
// unprivileged user (setpriv when the tests run as root, who writes
// anywhere).
TEST(PathPolicy, UnwritableOutputDirectoryIsRefusedBeforeAnyWork) {
  TempDir tmp;
  const fs::path model = readable_model(tmp);
  fs::create_directory(tmp / "ro");
  fs::permissions(tmp / "ro", kEveryoneReads & ~fs::perms::owner_write);
  const std::string as_user = unprivileged_prefix();
  if (as_user == kCannotDrop) GTEST_SKIP() << kCannotDrop;
  const std::string out = (tmp / "ro" / "out").string();
  const auto run = [&](const std::string& options) {
    return test::run_shell(as_user + "\"$CTQUANT\" quantize '" + model.string() + "' '" + out +
                           "' --ignore lm_head " + options);
  };
  const std::string why = "cannot write in " + (tmp / "ro").string() + " (Permission denied)";
  const CommandResult measured = run("--observer auto");
  EXPECT_EQ(measured.exit_code, 1) << measured.err;
  test::expect_message(measured.err,
                       {why + ", where the run would create its files. Nothing "
                              "was written"},
                       {"choosing", "temporary directory"});
  const CommandResult part = run("--part 1/1");
  EXPECT_EQ(part.exit_code, 1) << part.err;
  test::expect_message(part.err, {why + ", where the run would create its staging directory"});
  const CommandResult dry = run("--dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  test::expect_message(dry.err, {"warning: a run would fail: " + why});
  EXPECT_FALSE(fs::exists(out));
  fs::permissions(tmp / "ro", fs::perms::owner_write, fs::perm_options::add);
}

// --force replaces an OUTPUT whose entries the user may not remove (its
// directory is read-only to them): the run succeeds, OUTPUT holds the new
// checkpoint, and the old one, left under its temporary name, is named
// with the command that removes it (it was left silently, and the next run
// took it for a run that did not finish).
TEST(PathPolicy, ForceNamesTheReplacedOutputItCouldNotRemove) {
  TempDir tmp;
  const fs::path model = readable_model(tmp);
  fs::create_directory(tmp / "rw");
  fs::permissions(tmp / "rw", fs::perms::all);
  fs::create_directory(tmp / "rw" / "out");
  test::write_file(tmp / "rw" / "out" / "model.safetensors", "old");
  fs::permissions(tmp / "rw" / "out", kEveryoneReads & ~fs::perms::owner_write);
  const std::string as_user = unprivileged_prefix();
  if (as_user == kCannotDrop) GTEST_SKIP() << kCannotDrop;
  const CommandResult r =
      test::run_shell(as_user + "\"$CTQUANT\" quantize '" + model.string() + "' '" +
                      (tmp / "rw" / "out").string() + "' --ignore lm_head --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  test::expect_message(r.err, {"warning: OUTPUT holds the new checkpoint, but the one --force "
                               "replaced could not be removed",
                               "rm -rf "});
  EXPECT_TRUE(fs::exists(tmp / "rw" / "out" / "config.json"));
  EXPECT_EQ(test::temp_leftovers(tmp / "rw").size(), 1u);
  for (const std::string& left : test::temp_leftovers(tmp / "rw")) {
    EXPECT_NE(r.err.find(left), std::string::npos) << left << "\n" << r.err;
  }
}

// A stage ctquant made carries the marker; it is accepted again (resume),
// and finalize removes the marker with the stage.
TEST(PathPolicy, StageCtquantMadeIsMarkedAndRemovedByFinalize) {
  TempDir tmp;
  const fs::path model = copy_model(tmp);
  const fs::path out = tmp / "out";
  const fs::path stage = tmp / "st";
  fs::create_directories(stage);  // empty: adopted
  const CommandResult part = test::run_ctquant(
      {"quantize", model.string(), out.string(), "--part", "1/1", "--stage", stage.string()});
  ASSERT_EQ(part.exit_code, 0) << part.err;
  EXPECT_TRUE(fs::is_regular_file(stage / kStageMarkerName));
  EXPECT_EQ(stage_refusal(stage), "");
  const CommandResult again = test::run_ctquant({"quantize", model.string(), out.string(), "--part",
                                                 "1/1", "--stage", stage.string(), "--resume"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const CommandResult fin =
      test::run_ctquant({"finalize", out.string(), "--stage", stage.string()});
  ASSERT_EQ(fin.exit_code, 0) << fin.err;
  EXPECT_FALSE(fs::exists(stage));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
}

TEST(PathPolicy, StageRefusalSaysWhy) {
  TempDir tmp;
  EXPECT_EQ(stage_refusal(tmp / "absent"), "");
  fs::create_directories(tmp / "empty");
  EXPECT_EQ(stage_refusal(tmp / "empty"), "");
  test::write_file(tmp / "file", "x");
  EXPECT_EQ(stage_refusal(tmp / "file"), "is not a directory");
  fs::create_directories(tmp / "user");
  test::write_file(tmp / "user" / "b.txt", "x");
  test::write_file(tmp / "user" / "a.txt", "x");
  test::expect_message(stage_refusal(tmp / "user"), {"holds 'a.txt' but no .ctquant-stage"});
  test::write_file(tmp / "user" / kStageMarkerName, "");
  EXPECT_EQ(stage_refusal(tmp / "user"), "");
}

// ---- one function removes directories ----

TEST(PathPolicy, RemoveDirectoryRemovesOnlyDirectories) {
  TempDir tmp;
  fs::create_directories(tmp / "tree" / "sub");
  test::write_file(tmp / "tree" / "sub" / "f", "x");
  fs::create_directories(tmp / "kept" / "sub");
  fs::create_directory_symlink(tmp / "kept", tmp / "link");
  test::write_file(tmp / "file", "x");
  std::error_code ec;
  // A link to a directory is not followed, a file is not removed.
  EXPECT_FALSE(remove_directory(tmp / "link", DirectoryRemoval::kTree, ec));
  EXPECT_TRUE(fs::exists(tmp / "kept" / "sub"));
  EXPECT_FALSE(remove_directory(tmp / "file", DirectoryRemoval::kTree, ec));
  EXPECT_TRUE(fs::exists(tmp / "file"));
  // kIfEmpty leaves a directory that holds something.
  EXPECT_FALSE(remove_directory(tmp / "tree", DirectoryRemoval::kIfEmpty, ec));
  EXPECT_TRUE(fs::exists(tmp / "tree" / "sub" / "f"));
  EXPECT_TRUE(remove_directory(tmp / "tree", DirectoryRemoval::kTree, ec)) << ec.message();
  EXPECT_FALSE(fs::exists(tmp / "tree"));
}

}  // namespace
}  // namespace ctquant
