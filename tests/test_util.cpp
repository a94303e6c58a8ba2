// The directory flush of util/fs.hpp: what it throws and what it ignores;
// the write errors of util/error.hpp.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>

#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;

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
