// The text helpers of util/text.hpp (names, lists, byte counts, durations,
// shell words) on exact inputs, and the directory
// flush of util/fs.hpp: what it throws and what it ignores.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "ctquant/util/text.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;

TEST(Plural, AddsAnSUnlessTheCountIsOne) {
  EXPECT_EQ(plural(0, "file"), "0 files");
  EXPECT_EQ(plural(1, "file"), "1 file");
  EXPECT_EQ(plural(2, "tensor"), "2 tensors");
  EXPECT_EQ(plural(1000, "shard"), "1000 shards");
}

TEST(Join, ListsAtMostMaxItemsThenCountsTheRest) {
  const std::vector<std::string> items{"q_proj", "k_proj", "v_proj", "o_proj"};
  EXPECT_EQ(join(items, 10), "q_proj, k_proj, v_proj, o_proj");
  EXPECT_EQ(join(items, 4), "q_proj, k_proj, v_proj, o_proj");
  EXPECT_EQ(join(items, 2), "q_proj, k_proj ... and 2 more");
  EXPECT_EQ(join(items, 0), " ... and 4 more");
  EXPECT_EQ(join(items, 3, " | "), "q_proj | k_proj | v_proj ... and 1 more");
  EXPECT_EQ(join({}, 5), "");
}

TEST(ReplaceAll, ReplacesEveryOccurrenceLikePythonStrReplace) {
  EXPECT_EQ(replace_all("a,b,c", ",", "."), "a.b.c");
  EXPECT_EQ(replace_all("layers.0.gate_proj", "gate_proj", "gate_up_proj"),
            "layers.0.gate_up_proj");
  // What was inserted is not searched again ("aa".replace("a", "aa") == "aaaa").
  EXPECT_EQ(replace_all("aa", "a", "aa"), "aaaa");
  // Matches do not overlap ("aaa".replace("aa", "b") == "ba").
  EXPECT_EQ(replace_all("aaa", "aa", "b"), "ba");
  EXPECT_EQ(replace_all("abc", "x", "y"), "abc");
  // An empty pattern leaves the text unchanged.
  EXPECT_EQ(replace_all("abc", "", "-"), "abc");
}

TEST(Upper, UpperCasesAsciiLettersOnly) {
  EXPECT_EQ(upper("w4a16"), "W4A16");
  EXPECT_EQ(upper("nvfp4a16"), "NVFP4A16");
  EXPECT_EQ(upper("FP8_dynamic"), "FP8_DYNAMIC");
  // Bytes outside ASCII (here UTF-8 for "é") are left as they are.
  EXPECT_EQ(upper("caf\xc3\xa9"), "CAF\xc3\xa9");
  EXPECT_EQ(upper(""), "");
}

TEST(ModuleNames, ModuleOfCutsTheLastComponent) {
  EXPECT_EQ(module_of("model.layers.0.self_attn.q_proj.weight"), "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(module_of("lm_head.weight"), "lm_head");
  EXPECT_EQ(module_of("weight"), "");
  EXPECT_EQ(last_component("model.layers.0.self_attn.q_proj"), "q_proj");
  EXPECT_EQ(last_component("lm_head"), "lm_head");
  EXPECT_EQ(last_component("a."), "");
}

TEST(HumanBytes, BinaryUnitsWithOneOrTwoDecimals) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1024), "1.0 KiB");
  EXPECT_EQ(human_bytes(986'419), "963.3 KiB");
  EXPECT_EQ(human_bytes(880ull << 20), "880.0 MiB");
  EXPECT_EQ(human_bytes(2'233'382'912), "2.08 GiB");
}

TEST(GroupedDigits, GroupsThousandsWithCommas) {
  EXPECT_EQ(grouped_digits(0), "0");
  EXPECT_EQ(grouped_digits(999), "999");
  EXPECT_EQ(grouped_digits(1000), "1,000");
  EXPECT_EQ(grouped_digits(1'234'567), "1,234,567");
  EXPECT_EQ(grouped_digits(18'446'744'073'709'551'615ull), "18,446,744,073,709,551,615");
}

TEST(DurationText, SecondsMinutesHours) {
  EXPECT_EQ(duration_text(0.4), "0 s");
  EXPECT_EQ(duration_text(4.6), "5 s");
  EXPECT_EQ(duration_text(59.4), "59 s");
  EXPECT_EQ(duration_text(125), "2 min 05 s");
  EXPECT_EQ(duration_text(3780), "1 h 03 min");
  EXPECT_EQ(duration_text(-3), "0 s");
}

TEST(ShellWord, QuotesOnlyWhatTheShellWouldSplitOrExpand) {
  EXPECT_EQ(shell_word("/data/.out.ctquant-tmp-41872-9c1e22a0"),
            "/data/.out.ctquant-tmp-41872-9c1e22a0");
  EXPECT_EQ(shell_word("a b"), "'a b'");
  EXPECT_EQ(shell_word("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_word("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_word(""), "''");
  EXPECT_EQ(shell_word(std::string_view("a\0b", 3)), std::string("'a\0b'", 5));
}

TEST(FsyncDirectory, FlushesAnExistingDirectory) {
  TempDir dir;
  EXPECT_NO_THROW(fsync_directory(dir.path()));
  EXPECT_NO_THROW(fsync_directory_best_effort(dir.path()));
}

TEST(FsyncDirectory, MissingDirectoryIsAnIoErrorNamingIt) {
  TempDir dir;
  const fs::path missing = dir / "missing";
  try {
    fsync_directory(missing);
    FAIL() << "no error for a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_EQ(std::string(e.what()),
              missing.string() + ": cannot open to flush: No such file or directory");
  }
}

TEST(FsyncDirectory, RegularFileIsNotADirectory) {
  TempDir dir;
  const fs::path file = dir / "config.json";
  write_file(file, "{}");
  try {
    fsync_directory(file);
    FAIL() << "no error for a regular file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_EQ(std::string(e.what()), file.string() + ": cannot open to flush: Not a directory");
  }
}

TEST(FsyncDirectoryBestEffort, IgnoresEveryFailure) {
  TempDir dir;
  write_file(dir / "config.json", "{}");
  EXPECT_NO_THROW(fsync_directory_best_effort(dir / "missing"));
  EXPECT_NO_THROW(fsync_directory_best_effort(dir / "config.json"));
}

TEST(ThrowWriteError, NoSpaceKindsAndOtherErrors) {
  const auto kind_and_text = [](int errno_value) {
    try {
      throw_write_error("out/model.safetensors", errno_value);
    } catch (const Error& e) {
      return std::make_pair(e.kind(), std::string(e.what()));
    }
    return std::make_pair(ErrorKind::kUsage, std::string("not thrown"));
  };
  EXPECT_EQ(kind_and_text(ENOSPC),
            std::make_pair(ErrorKind::kNoSpace,
                           std::string("out/model.safetensors: no space left for the output "
                                       "(No space left on device)")));
  EXPECT_EQ(kind_and_text(EDQUOT).first, ErrorKind::kNoSpace);
  EXPECT_EQ(kind_and_text(EFBIG),
            std::make_pair(ErrorKind::kNoSpace,
                           std::string("out/model.safetensors: no space left for the output "
                                       "(File too large: the file size limit was reached)")));
  EXPECT_EQ(kind_and_text(EIO),
            std::make_pair(ErrorKind::kIo, std::string("out/model.safetensors: write failed: "
                                                        "Input/output error")));
}

}  // namespace
}  // namespace ctquant::test
