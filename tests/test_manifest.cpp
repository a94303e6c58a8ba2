// The output manifest (ctquant-manifest.json): what quantize writes, what
// verify --manifest catches (a named test per corruption), and determinism
// of the files and the manifest across runs and thread counts.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/sha256.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using nlohmann::json;
using test::expect_message;
namespace fs = std::filesystem;

fs::path golden_input(const std::string& name) { return test::golden_dir() / name / "input"; }

// `sha256sum` (coreutils) of every regular file of dir: name -> digest.
std::map<std::string, std::string> sha256sum(const fs::path& dir) {
  std::map<std::string, std::string> digests;
  for (const auto& item : fs::directory_iterator(dir)) {
    if (!item.is_regular_file()) continue;
    const std::string command = "sha256sum '" + item.path().string() + "'";
    std::FILE* pipe = ::popen(command.c_str(), "r");
    EXPECT_NE(pipe, nullptr);
    char line[256] = {};
    EXPECT_NE(std::fgets(line, sizeof line, pipe), nullptr);
    ::pclose(pipe);
    digests[item.path().filename().string()] = std::string(line, 64);
  }
  return digests;
}

TEST(Sha256, KnownDigests) {
  // FIPS 180-2 appendix B.1 and the empty string.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  test::TempDir dir;
  test::write_file(dir / "f", std::string(3u << 20, 'x'));  // several read blocks
  const FileDigest d = sha256_file(dir / "f", "f");
  EXPECT_EQ(d.size, 3u << 20);
  EXPECT_EQ(d.sha256, sha256sum(dir.path())["f"]);
}

TEST(WrittenFilesHasher, OutOfOrderAndUnreportedRangesGiveTheFileDigests) {
  test::TempDir dir;
  std::string a(5'000'000, '\0');
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 7 + i / 4096);
  const std::string b = "small file";
  test::write_file(dir / "a.bin", a);
  test::write_file(dir / "b.json", b);
  test::write_file(dir / "c.txt", "");
  WrittenFilesHasher hasher(dir.path(), {{"a.bin", a.size(), {}}, {"b.json", b.size(), {}},
                                         {"c.txt", 0, {}}},
                            nullptr);
  // Ranges of a.bin reported out of order, one overlapping, one never (the
  // last 1000 bytes); b.json whole; unknown files ignored.
  hasher.written(dir / "a.bin", 3'000'000, 1'000'000);
  hasher.written(dir / "a.bin", 0, 1'000'000);
  hasher.written(dir / "x.bin", 0, 10);
  hasher.written(dir / "a.bin", 1'000'000, 2'500'000);
  hasher.written(dir / "a.bin", 4'000'000, 999'000);
  hasher.written(dir / "b.json", 0, b.size());
  const std::vector<ManifestEntry> got = hasher.finish();
  ASSERT_EQ(got.size(), 3u);
  const auto digests = sha256sum(dir.path());
  for (const ManifestEntry& e : got) {
    EXPECT_EQ(e.sha256, digests.at(e.name)) << e.name;
  }
  EXPECT_EQ(got[0].size, a.size());
}

// A range reported with its bytes when the hash has reached it is hashed
// from those bytes, not read back; one reported ahead of the hash is read
// back from the file when the hash gets there. Shown with a file whose
// bytes on disk differ from those reported (which a writer never does).
TEST(WrittenFilesHasher, HashesReportedBytesFromMemoryWhenNextInLine) {
  test::TempDir dir;
  const std::string on_disk(3000, 'd');
  test::write_file(dir / "a.bin", on_disk);
  const std::string in_memory(1000, 'm');
  WrittenFilesHasher hasher(dir.path(), {{"a.bin", on_disk.size(), {}}}, nullptr);
  // [2000, 3000) is ahead of the hash: read back later ("d").
  hasher.written(dir / "a.bin", 2000, 1000, std::as_bytes(std::span(in_memory)));
  // [0, 1000) is next in line: hashed from memory ("m").
  hasher.written(dir / "a.bin", 0, 1000, std::as_bytes(std::span(in_memory)));
  // [1000, 2000) with no bytes: read back ("d").
  hasher.written(dir / "a.bin", 1000, 1000);
  const std::vector<ManifestEntry> got = hasher.finish();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].sha256, sha256_hex(std::string(1000, 'm') + std::string(2000, 'd')));
}

// Writers on several threads report interleaved ranges of two files at
// once, half with their bytes: the digests are those of the files.
TEST(WrittenFilesHasher, ThreadsReportingAtOnceGiveTheFileDigests) {
  test::TempDir dir;
  constexpr std::size_t kPiece = 4096 + 17;
  constexpr std::size_t kPieces = 400;
  std::vector<std::string> content(2);
  for (std::size_t f = 0; f < content.size(); ++f) {
    content[f].resize(kPiece * kPieces);
    for (std::size_t i = 0; i < content[f].size(); ++i) {
      content[f][i] = static_cast<char>(i * 131 + i / 1000 + f);
    }
    test::write_file(dir / fmt::format("f{}.bin", f), content[f]);
  }
  WrittenFilesHasher hasher(dir.path(),
                            {{"f0.bin", content[0].size(), {}}, {"f1.bin", content[1].size(), {}}},
                            nullptr);
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (std::size_t i = next++; i < 2 * kPieces; i = next++) {
        const std::size_t f = i % 2;
        const std::size_t piece = i / 2;
        const std::string_view bytes(content[f].data() + piece * kPiece, kPiece);
        const fs::path file = dir / fmt::format("f{}.bin", f);
        if (piece % 2 == 0) {
          hasher.written(file, piece * kPiece, kPiece, std::as_bytes(std::span(bytes)));
        } else {
          hasher.written(file, piece * kPiece, kPiece);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<ManifestEntry> got = hasher.finish();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].sha256, sha256_hex(content[0]));
  EXPECT_EQ(got[1].sha256, sha256_hex(content[1]));
}

TEST(WrittenFilesHasher, FileShorterThanPlannedIsAnError) {
  test::TempDir dir;
  test::write_file(dir / "a.bin", "12345");
  WrittenFilesHasher hasher(dir.path(), {{"a.bin", 10, {}}}, nullptr);
  try {
    hasher.finish();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    expect_message(e.what(), {"a.bin", "unexpected end of file"});
  }
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    QuantizeOptions options = test::test_options(golden_input("dflash-bf16-sharded"), out());
    options.plan.ignore = {"re:.*qkv_proj$", "re:.*g_proj$"};
    summary_ = quantize(options);
  }
  fs::path out() const { return dir_ / "out"; }
  test::CommandResult verify_manifest() const {
    return test::run_ctquant({"verify", out().string(), "--manifest"});
  }
  // Runs verify --manifest (text and JSON) and checks exit 3 and one
  // difference of kind on file.
  void expect_one_difference(const std::string& kind, const std::string& file,
                             const std::vector<std::string>& message) const {
    const auto r = verify_manifest();
    EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
    expect_message(r.out, {kind + "  " + file, "result: DIFFERENT (1 difference)"});
    const auto j = test::run_ctquant({"verify", out().string(), "--manifest", "--json"});
    EXPECT_EQ(j.exit_code, 3);
    const json report = json::parse(j.out);
    ASSERT_EQ(report["differences"].size(), 1u) << j.out;
    EXPECT_EQ(report["differences"][0]["kind"], kind);
    EXPECT_EQ(report["differences"][0]["file"], file);
    expect_message(report["differences"][0]["message"].get<std::string>(), message);
    EXPECT_EQ(report["same"], false);
    EXPECT_EQ(report["command"], "verify");
  }

  test::TempDir dir_;
  QuantizeSummary summary_;
};

TEST_F(ManifestTest, ListsEveryFileWithItsSha256SumAndNoTimestamp) {
  const json manifest = test::read_json(out() / kManifestFileName);
  EXPECT_EQ(manifest["manifest_version"], 1);
  EXPECT_EQ(manifest["algorithm"], "sha256");
  EXPECT_EQ(manifest.size(), 3u) << manifest.dump();  // no time, host or path
  auto digests = sha256sum(out());
  ASSERT_TRUE(digests.erase(kManifestFileName));
  std::map<std::string, std::string> listed;
  for (const json& f : manifest["files"]) {
    listed[f["name"].get<std::string>()] = f["sha256"].get<std::string>();
    EXPECT_EQ(f["size"].get<std::uint64_t>(), fs::file_size(out() / f["name"].get<std::string>()));
  }
  EXPECT_EQ(listed, digests);
  EXPECT_EQ(listed.size(), 6u);  // 2 shards, index, config.json, 2 copied files
  // The summary lists the manifest too, with the digest sha256sum gives it.
  ASSERT_EQ(summary_.output_files.size(), 7u);
  for (const ManifestEntry& e : summary_.output_files) {
    EXPECT_EQ(e.sha256, sha256sum(out())[e.name]) << e.name;
  }
}

TEST_F(ManifestTest, VerifyManifestPassesOnAnUntouchedOutput) {
  const auto r = verify_manifest();
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_message(r.out, {"files: 6 listed, 6 match", "result: SAME"});
}

TEST_F(ManifestTest, VerifyManifestCatchesAFlippedByte) {
  const fs::path shard = out() / "model-00002-of-00002.safetensors";
  std::string bytes = test::read_file(shard);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x01);
  test::write_file(shard, bytes);
  expect_one_difference("sha256", "model-00002-of-00002.safetensors",
                        {"sha256 ", "the manifest says"});
}

TEST_F(ManifestTest, VerifyManifestCatchesATruncatedShard) {
  const fs::path shard = out() / "model-00001-of-00002.safetensors";
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 100);
  expect_one_difference("size", "model-00001-of-00002.safetensors",
                        {std::to_string(size - 100) + " bytes", std::to_string(size),
                         "truncated"});
}

TEST_F(ManifestTest, VerifyManifestCatchesAMissingFile) {
  fs::remove(out() / "model.safetensors.index.json");
  expect_one_difference("missing", "model.safetensors.index.json", {"missing"});
}

TEST_F(ManifestTest, VerifyManifestCatchesAnLfsPointerForAShard) {
  // What a git clone without git-lfs leaves in place of a large file.
  test::write_file(out() / "model-00002-of-00002.safetensors",
                   "version https://git-lfs.github.com/spec/v1\n"
                   "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
                   "size 635904\n");
  expect_one_difference("lfs_pointer", "model-00002-of-00002.safetensors",
                        {"Git LFS pointer", "git lfs pull"});
}

TEST_F(ManifestTest, VerifyManifestCatchesAnExtraFile) {
  test::write_file(out() / "notes.txt", "hello\n");
  expect_one_difference("extra", "notes.txt", {"not listed"});
}

TEST(VerifyManifest, DirectoryWithoutManifestExitsOne) {
  const auto r = test::run_ctquant(
      {"verify", (test::golden_dir() / "llama-bf16" / "expected").string(), "--manifest"});
  EXPECT_EQ(r.exit_code, 1);
  expect_message(r.err, {"no ctquant-manifest.json", "ctquant verify OUTPUT GOLDEN"});
  EXPECT_EQ(r.out, "");
}

TEST(VerifyManifest, ManifestWithGoldenIsAUsageError) {
  const auto r = test::run_ctquant({"verify", "a", "b", "--manifest"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"--manifest"});
}

TEST(VerifyManifest, MalformedManifestIsBadInput) {
  test::TempDir dir;
  test::write_file(dir / "model.safetensors", "x");
  const std::pair<std::string, std::string> cases[] = {
      {"{", "ctquant-manifest.json"},
      {R"({"manifest_version": 2, "algorithm": "sha256", "files": []})", "manifest_version"},
      {R"({"manifest_version": 1, "algorithm": "md5", "files": []})", "algorithm"},
      {R"({"manifest_version": 1, "algorithm": "sha256", "files": [{"name": "../x", "size": 1,
          "sha256": "00"}]})",
       "files[0].name"},
      {R"({"manifest_version": 1, "algorithm": "sha256", "files": [{"name": "x", "size": -1,
          "sha256": "00"}]})",
       "files[0].size"},
      {R"({"manifest_version": 1, "algorithm": "sha256", "files": [{"name": "x", "size": 1,
          "sha256": "ABC"}]})",
       "files[0].sha256"},
  };
  for (const auto& [text, fragment] : cases) {
    SCOPED_TRACE(text);
    test::write_file(dir / kManifestFileName, text);
    try {
      check_manifest(dir.path(), 1);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      expect_message(e.what(), {fragment});
    }
  }
}

TEST(Manifest, IsNotReadAsPartOfACheckpointNorCopied) {
  // An output quantized again: its manifest is not copied into the new one.
  test::TempDir dir;
  test::copy_dir(golden_input("llama-bf16"), dir / "in");
  test::write_file(dir / "in" / kManifestFileName, "{}");
  quantize(test::test_options(dir / "in", dir / "out"));
  const std::vector<ManifestEntry> listed = read_manifest(dir / "out");
  std::vector<std::string> names;
  for (const ManifestEntry& e : listed) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "generation_config.json",
                                             "model.safetensors", "model.safetensors.index.json",
                                             "tokenizer_config.json"}));
  EXPECT_TRUE(check_manifest(dir / "out", 1).ok());
}

// ---- --no-manifest ----

TEST(NoManifest, WritesTheSameFilesWithoutTheManifest) {
  test::TempDir dir;
  std::vector<QuantizeSummary> summaries;
  for (const bool manifest : {true, false}) {
    QuantizeOptions options = test::test_options(golden_input("dflash-bf16-sharded"),
                                                 dir / (manifest ? "with" : "without"));
    options.plan.ignore = {"re:.*qkv_proj$", "re:.*g_proj$"};
    options.manifest = manifest;
    summaries.push_back(quantize(options));
  }
  EXPECT_FALSE(fs::exists(dir / "without" / kManifestFileName));
  EXPECT_TRUE(summaries[1].output_files.empty());
  fs::remove(dir / "with" / kManifestFileName);
  EXPECT_EQ(test::diff_bytes(dir / "without", dir / "with"), "");
  // verify --manifest says there is none.
  const auto r = test::run_ctquant({"verify", (dir / "without").string(), "--manifest"});
  EXPECT_EQ(r.exit_code, 1);
  expect_message(r.err, {"no ctquant-manifest.json"});
}

TEST(NoManifest, WithPartOrResumeIsAUsageError) {
  test::TempDir dir;
  QuantizeOptions options = test::test_options(golden_input("llama-bf16"), dir / "out");
  options.manifest = false;
  options.part = PartSpec{1, 2};
  try {
    quantize(options);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_message(e.what(), {"--no-manifest cannot be used with --part", "SHA-256"});
  }
  options.part.reset();
  options.resume = true;
  try {
    quantize(options);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_message(e.what(), {"--no-manifest cannot be used with --resume"});
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(NoManifest, WithAReportIsAUsageErrorAndWritesNothing) {
  test::TempDir dir;
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--json"},
        std::vector<std::string>{"--report", (dir / "r.json").string()}}) {
    std::vector<std::string> args = {"quantize", golden_input("llama-bf16").string(),
                                     (dir / "out").string(), "--no-manifest"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = test::run_ctquant(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, {"--no-manifest cannot be used with " + extra[0],
                           "SHA-256 of every output file"});
    EXPECT_FALSE(fs::exists(dir / "out"));
    EXPECT_FALSE(fs::exists(dir / "r.json"));
  }
}

// ---- determinism: same input and options, same bytes and manifest ----

TEST(Determinism, ThreadsOneAndTwoGiveIdenticalFilesAndManifests) {
  struct Case {
    const char* input;
    std::vector<std::string> ignore;
  };
  const Case cases[] = {{"dflash-bf16-sharded", {"re:.*qkv_proj$", "re:.*g_proj$"}},
                        {"llama-bf16", {"lm_head"}},
                        {"fp8-block", {"lm_head", "model.embed_tokens", "re:.*v_proj$",
                                       "re:.*down_proj$"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.input);
    test::TempDir dir;
    std::vector<fs::path> outputs;
    for (const unsigned threads : {1u, 2u, 2u}) {
      const fs::path out = dir / ("out-" + std::to_string(outputs.size()));
      QuantizeOptions options = test::test_options(golden_input(c.input), out);
      options.plan.ignore = c.ignore;
      options.threads = threads;
      options.chunk_bytes = 4096;  // many row chunks, so threads interleave
      options.allow_unloadable = true;  // the fp8-block case splits q/k/v (lint L3)
      quantize(options);
      outputs.push_back(out);
    }
    for (std::size_t i = 1; i < outputs.size(); ++i) {
      EXPECT_EQ(test::diff_bytes(outputs[i], outputs[0]), "");
      EXPECT_EQ(test::read_file(outputs[i] / kManifestFileName),
                test::read_file(outputs[0] / kManifestFileName));
    }
  }
}

TEST(Determinism, BinaryRunsGiveIdenticalManifests) {
  test::TempDir dir;
  for (const char* threads : {"1", "2"}) {
    const auto r = test::run_ctquant({"quantize", golden_input("llama-f16").string(),
                                      (dir / (std::string("out-") + threads)).string(),
                                      "--threads", threads, "-q"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(test::diff_bytes(dir / "out-1", dir / "out-2"), "");
}

}  // namespace
}  // namespace ctquant
