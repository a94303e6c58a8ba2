// Checkpoints in a Hugging Face hub cache: a snapshot (files linked into the
// cache's blob store) is read without --follow-symlinks, `quantize ORG/NAME`
// finds it by repository id and revision, a repository that is not cached is
// an error naming where ctquant looked, and a Git LFS pointer in place of a
// shard is named as such. The caches are built here in the layout
// huggingface_hub writes (models--ORG--NAME/{blobs,refs,snapshots}).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/job/quantize.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/source/hf_cache.hpp"
#include "ctquant/util/error.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;
using test::TempDir;

constexpr const char* kCommitMain = "0123456789abcdef0123456789abcdef01234567";
constexpr const char* kCommitOld = "89abcdef0123456789abcdef0123456789abcdef";

fs::path golden_case(const std::string& name) { return test::golden_dir() / name; }

// The llama golden cases' ignore list (tests/golden/cases.json).
const std::vector<std::string> kIgnore = {"lm_head", "model.embed_tokens"};

QuantizeOptions llama_options(const fs::path& input, const fs::path& output) {
  QuantizeOptions options = test::test_options(input, output);
  options.plan.ignore = kIgnore;
  return options;
}

// ctquant ARGS... with the llama cases' ignore list.
std::vector<std::string> llama_args(std::vector<std::string> args) {
  for (const std::string& entry : kIgnore) {
    args.push_back("--ignore");
    args.push_back(entry);
  }
  return args;
}

// Puts every file of `from` into the cache at cache/models--ORG--NAME as
// commit `commit`: contents in blobs/ (named after the commit and the file,
// as unique as real blob hashes), snapshots/COMMIT/FILE a relative link
// ../../blobs/BLOB, and refs/REF holding the commit when ref is given.
fs::path add_to_cache(const fs::path& cache, const std::string& repo_id, const fs::path& from,
                      const std::string& commit, const std::optional<std::string>& ref) {
  std::string folder = "models--" + repo_id;
  folder.replace(folder.find('/'), 1, "--");
  const fs::path repo = cache / folder;
  const fs::path snapshot = repo / "snapshots" / commit;
  fs::create_directories(repo / "blobs");
  fs::create_directories(snapshot);
  for (const auto& item : fs::directory_iterator(from)) {
    const std::string name = item.path().filename().string();
    const std::string blob = commit.substr(0, 8) + "-" + name;
    fs::copy_file(item.path(), repo / "blobs" / blob);
    fs::create_symlink(fs::path("../../blobs") / blob, snapshot / name);
  }
  if (ref) {
    fs::create_directories((repo / "refs" / *ref).parent_path());
    test::write_file(repo / "refs" / *ref, commit);
  }
  return snapshot;
}

// The golden llama case in a cache as acme/llama-tiny, refs/main.
struct Cache {
  TempDir tmp;
  fs::path dir = tmp / "hub";
  fs::path snapshot = add_to_cache(dir, "acme/llama-tiny", golden_case("llama-bf16") / "input",
                                   kCommitMain, "main");
  std::string env() const { return "HF_HUB_CACHE=" + dir.string(); }
};

TEST(HfCache, SnapshotIsReadWithoutFollowSymlinks) {
  Cache cache;
  const fs::path out = cache.tmp / "out";
  quantize(llama_options(cache.snapshot, out));  // follow_symlinks is off
  EXPECT_EQ(test::diff_golden(out, golden_case("llama-bf16") / "expected", false), "");
  EXPECT_FALSE(fs::is_symlink(out / "config.json"));
}

TEST(HfCache, RepoIdResolvesThroughRefsMain) {
  Cache cache;
  test::RunOptions run;
  run.env = {cache.env()};
  const fs::path out = cache.tmp / "out";
  const CommandResult r = test::run_ctquant(llama_args({"quantize", "acme/llama-tiny", out.string()}), run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::diff_golden(out, golden_case("llama-bf16") / "expected", false), "");
  test::expect_message(r.err, {"acme/llama-tiny: the Hugging Face cache snapshot",
                               std::string("snapshots/") + kCommitMain});
}

// --revision takes a branch (refs/NAME, also with a slash: refs/pr/1) or a
// commit hash whose snapshot is cached.
TEST(HfCache, RevisionSelectsABranchOrACommit) {
  Cache cache;
  add_to_cache(cache.dir, "acme/llama-tiny", golden_case("llama-f16") / "input", kCommitOld,
               "pr/1");
  const fs::path expected_old = golden_case("llama-f16") / "expected";
  EXPECT_EQ(resolve_hf_snapshot("acme/llama-tiny", "pr/1", cache.dir),
            cache.dir / "models--acme--llama-tiny" / "snapshots" / kCommitOld);
  EXPECT_EQ(resolve_hf_snapshot("acme/llama-tiny", kCommitOld, cache.dir),
            cache.dir / "models--acme--llama-tiny" / "snapshots" / kCommitOld);
  EXPECT_EQ(resolve_hf_snapshot("acme/llama-tiny", "main", cache.dir), cache.snapshot);

  test::RunOptions run;
  run.env = {cache.env()};
  const fs::path out = cache.tmp / "out";
  const CommandResult r = test::run_ctquant(
      llama_args({"quantize", "acme/llama-tiny", out.string(), "--revision", kCommitOld}), run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::diff_golden(out, expected_old, false), "");
}

TEST(HfCache, NotCachedNamesWhereItLooked) {
  Cache cache;
  test::RunOptions run;
  run.env = {cache.env()};
  const fs::path out = cache.tmp / "out";
  const CommandResult r = test::run_ctquant({"quantize", "acme/absent", out.string()}, run);
  EXPECT_EQ(r.exit_code, 1);
  test::expect_message(r.err, {"acme/absent: not a file or directory, and not in the Hugging "
                               "Face cache",
                               (cache.dir / "models--acme--absent").string(), "never downloads"});
  EXPECT_FALSE(fs::exists(out));

  const CommandResult no_ref = test::run_ctquant(
      {"quantize", "acme/llama-tiny", out.string(), "--revision", "v2"}, run);
  EXPECT_EQ(no_ref.exit_code, 1);
  test::expect_message(no_ref.err,
                       {"no ref 'v2'", (cache.dir / "models--acme--llama-tiny" / "refs" / "v2").string()});

  // A ref whose snapshot was never downloaded (or was deleted).
  test::write_file(cache.dir / "models--acme--llama-tiny" / "refs" / "v3", kCommitOld);
  const CommandResult no_snapshot = test::run_ctquant(
      {"quantize", "acme/llama-tiny", out.string(), "--revision", "v3"}, run);
  EXPECT_EQ(no_snapshot.exit_code, 1);
  test::expect_message(no_snapshot.err, {fmt::format("revision 'v3' is commit {}, whose snapshot "
                                                     "is missing",
                                                     kCommitOld)});
  EXPECT_FALSE(fs::exists(out));
}

TEST(HfCache, RevisionMustBeAPlainRefName) {
  Cache cache;
  for (const char* bad : {"", "../../etc", "/abs", "a/../b"}) {
    try {
      resolve_hf_snapshot("acme/llama-tiny", bad, cache.dir);
      ADD_FAILURE() << "accepted revision '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << bad;
    }
  }
}

// An existing path that also reads as ORG/NAME is the path.
TEST(HfCache, ExistingPathWinsOverRepoId) {
  Cache cache;
  const fs::path work = cache.tmp / "work";
  test::copy_dir(golden_case("llama-f16") / "input", work / "acme" / "llama-tiny");
  test::RunOptions run;
  run.env = {cache.env()};
  run.cwd = work;
  const CommandResult r =
      test::run_ctquant(llama_args({"quantize", "acme/llama-tiny", (cache.tmp / "out").string()}), run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::diff_golden(cache.tmp / "out", golden_case("llama-f16") / "expected", false), "");

  const CommandResult with_revision = test::run_ctquant(
      {"quantize", "acme/llama-tiny", (cache.tmp / "out2").string(), "--revision", "main"}, run);
  EXPECT_EQ(with_revision.exit_code, 2);
  test::expect_message(with_revision.err, {"--revision main: INPUT acme/llama-tiny"});
}

// Inside a snapshot, a link that leaves the cache's blob store is still
// refused unless --follow-symlinks.
TEST(HfCache, LinkOutsideTheBlobStoreStillNeedsFollowSymlinks) {
  Cache cache;
  test::write_file(cache.tmp / "secret.txt", "do not publish");
  fs::create_symlink(cache.tmp / "secret.txt", cache.snapshot / "notes.txt");
  const fs::path out = cache.tmp / "out";
  try {
    quantize(llama_options(cache.snapshot, out));
    FAIL() << "a link out of the blob store was followed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    test::expect_message(e.what(), {"notes.txt: is a symbolic link to " +
                                        (cache.tmp / "secret.txt").string(),
                                    "blob store"});
  }
  EXPECT_FALSE(fs::exists(out));
  QuantizeOptions follow = llama_options(cache.snapshot, out);
  follow.follow_symlinks = true;
  quantize(follow);
  EXPECT_EQ(test::read_file(out / "notes.txt"), "do not publish");
}

// A blob store that is itself a link could make any directory trusted: then
// the snapshot's links are treated like any link out of INPUT.
TEST(HfCache, BlobStoreThatIsALinkIsNotTrusted) {
  TempDir tmp;
  const fs::path cache = tmp / "hub";
  const fs::path snapshot = add_to_cache(cache, "acme/llama-tiny",
                                         golden_case("llama-bf16") / "input", kCommitMain, "main");
  const fs::path repo = cache / "models--acme--llama-tiny";
  fs::rename(repo / "blobs", tmp / "elsewhere");
  fs::create_symlink(tmp / "elsewhere", repo / "blobs");
  EXPECT_EQ(hf_snapshot_blob_store(fs::canonical(snapshot)), std::nullopt);
  try {
    quantize(llama_options(snapshot, tmp / "out"));
    FAIL() << "links through a linked blob store were followed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    test::expect_message(e.what(), {"is a symbolic link to", "outside the checkpoint directory"});
  }
}

TEST(HfCache, BlobStoreOfASnapshot) {
  EXPECT_EQ(hf_snapshot_blob_store("/c/hub/models--a--b/snapshots/abc"), std::nullopt)
      << "no such directory: not a cache";
  TempDir tmp;
  const fs::path snapshot = add_to_cache(tmp / "hub", "acme/x", golden_case("llama-bf16") / "input",
                                         kCommitMain, std::nullopt);
  EXPECT_EQ(hf_snapshot_blob_store(fs::canonical(snapshot)),
            fs::canonical(tmp / "hub" / "models--acme--x" / "blobs"));
  EXPECT_EQ(hf_snapshot_blob_store(fs::canonical(tmp / "hub")), std::nullopt);
}

TEST(HfCache, RepoIdSyntax) {
  for (const char* ok : {"deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-8B", "a/b", "org_1/name.v2"}) {
    EXPECT_TRUE(looks_like_repo_id(ok)) << ok;
  }
  for (const char* bad : {"gpt2", "a/b/c", "/abs/path", "./x", "a/", "/b", "a--b/c", "a/b..c",
                          "-a/b", "a/b-", "a b/c", "../x"}) {
    EXPECT_FALSE(looks_like_repo_id(bad)) << bad;
  }
}

// The environment variables, in huggingface_hub's order.
TEST(HfCache, CacheDirectoryFromTheEnvironment) {
  struct Saved {
    std::vector<std::pair<std::string, std::optional<std::string>>> values;
    Saved() {
      for (const char* name :
           {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"}) {
        const char* v = std::getenv(name);
        values.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
        ::unsetenv(name);
      }
    }
    ~Saved() {
      for (const auto& [name, value] : values) {
        if (value) {
          ::setenv(name.c_str(), value->c_str(), 1);
        } else {
          ::unsetenv(name.c_str());
        }
      }
    }
  } saved;
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(hf_hub_cache_dir(), fs::path("/home/u/.cache/huggingface/hub"));
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(hf_hub_cache_dir(), fs::path("/xdg/huggingface/hub"));
  ::setenv("HF_HOME", "/hf", 1);
  EXPECT_EQ(hf_hub_cache_dir(), fs::path("/hf/hub"));
  ::setenv("HUGGINGFACE_HUB_CACHE", "/legacy", 1);
  EXPECT_EQ(hf_hub_cache_dir(), fs::path("/legacy"));
  ::setenv("HF_HUB_CACHE", "/hub", 1);
  EXPECT_EQ(hf_hub_cache_dir(), fs::path("/hub"));
}

// A clone made without `git lfs pull` holds pointer files in place of the
// shards: named as such, not as a header of absurd length.
TEST(HfCache, LfsPointerInPlaceOfAShardIsNamed) {
  TempDir tmp;
  test::copy_dir(golden_case("dflash-bf16-sharded") / "input", tmp / "in");
  test::write_file(tmp / "in" / "model-00002-of-00002.safetensors",
                   "version https://git-lfs.github.com/spec/v1\n"
                   "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
                   "size 1315992\n");
  const CommandResult r =
      test::run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1);
  test::expect_message(r.err, {"model-00002-of-00002.safetensors: is a Git LFS pointer file "
                               "(132 bytes of text for 1315992 bytes of data)",
                               "git lfs pull"},
                       {"header length"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

}  // namespace
}  // namespace ctquant
