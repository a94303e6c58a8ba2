// A bounded set of open descriptors (FdPool) behind every input shard and
// output file: eviction and reopening, the identity checks on reopen, and a
// checkpoint of 1,500 shards quantized and verified under `ulimit -n 256`.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fd_pool.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// A one-tensor safetensors file whose F32 values are all `value`.
void write_constant_file(const fs::path& path, float value, std::uint64_t n = 64) {
  test::write_safetensors(path, {test::FakeTensor{"t", DType::kF32, {n},
                                                  test::float_bytes(DType::kF32,
                                                                    std::vector<float>(n, value))}});
}

float first_value(const SafetensorsFile& file) {
  std::array<std::byte, 4> bytes{};
  file.read(file.header().find("t")->begin, bytes);
  float value = 0;
  std::memcpy(&value, bytes.data(), 4);
  return value;
}

TEST(FdPool, KeepsAtMostCapacityOpenAndReopensOnUse) {
  TempDir tmp;
  const auto pool = std::make_shared<FdPool>(2);
  std::vector<SafetensorsFile> files;
  for (int i = 0; i < 5; ++i) {
    const fs::path path = tmp / fmt::format("f{}.safetensors", i);
    write_constant_file(path, static_cast<float>(i));
    files.emplace_back(path, path.filename().string(), pool);
    EXPECT_LE(pool->open_count(), 2u);
  }
  EXPECT_EQ(pool->reopen_count(), 0u);
  // f3 and f4 are open. Reading f0..f4 in order closes the least recently
  // used each time: every read reopens its file.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(first_value(files[static_cast<std::size_t>(i)]), i);
  EXPECT_EQ(pool->reopen_count(), 5u);
  EXPECT_LE(pool->open_count(), 2u);
  // The most recently used two are open: reading them again reopens nothing.
  EXPECT_EQ(first_value(files[4]), 4.0f);
  EXPECT_EQ(first_value(files[3]), 3.0f);
  EXPECT_EQ(pool->reopen_count(), 5u);
}

// A lease keeps its descriptor open after the pool dropped it.
TEST(FdPool, LeaseOutlivesEviction) {
  TempDir tmp;
  const auto pool = std::make_shared<FdPool>(1);
  write_constant_file(tmp / "a.safetensors", 1.0f);
  write_constant_file(tmp / "b.safetensors", 2.0f);
  const SafetensorsFile a(tmp / "a.safetensors", "a.safetensors", pool);
  const FdLease lease = a.descriptor();
  const SafetensorsFile b(tmp / "b.safetensors", "b.safetensors", pool);  // evicts a
  EXPECT_EQ(pool->open_count(), 1u);
  std::array<char, 8> prefix{};
  ASSERT_EQ(::pread(lease->get(), prefix.data(), prefix.size(), 0), 8);
  EXPECT_EQ(first_value(b), 2.0f);
}

// Destroying a file forgets its slot and closes its descriptor.
TEST(FdPool, ClosingAFileFreesItsSlot) {
  TempDir tmp;
  const auto pool = std::make_shared<FdPool>(4);
  write_constant_file(tmp / "a.safetensors", 1.0f);
  {
    const SafetensorsFile a(tmp / "a.safetensors", "a.safetensors", pool);
    EXPECT_EQ(pool->open_count(), 1u);
  }
  EXPECT_EQ(pool->open_count(), 0u);
}

// Reopened, a shard must be the file first read: replaced (another inode) or
// rewritten (another size) is an I/O error naming it.
TEST(FdPool, RefusesAShardReplacedWhileClosed) {
  TempDir tmp;
  const auto pool = std::make_shared<FdPool>(1);
  write_constant_file(tmp / "a.safetensors", 1.0f);
  write_constant_file(tmp / "b.safetensors", 2.0f);
  const SafetensorsFile a(tmp / "a.safetensors", "a.safetensors", pool);
  const SafetensorsFile b(tmp / "b.safetensors", "b.safetensors", pool);  // closes a
  write_constant_file(tmp / "new.safetensors", 3.0f);
  fs::rename(tmp / "new.safetensors", tmp / "a.safetensors");
  try {
    first_value(a);
    FAIL() << "a replaced shard was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    test::expect_message(e.what(), {"a.safetensors: was replaced while ctquant ran"});
  }
}

TEST(FdPool, RefusesAShardThatChangedSizeWhileClosed) {
  TempDir tmp;
  const auto pool = std::make_shared<FdPool>(1);
  write_constant_file(tmp / "a.safetensors", 1.0f);
  write_constant_file(tmp / "b.safetensors", 2.0f);
  const SafetensorsFile a(tmp / "a.safetensors", "a.safetensors", pool);
  const std::uint64_t size = a.file_size();
  const SafetensorsFile b(tmp / "b.safetensors", "b.safetensors", pool);  // closes a
  ASSERT_EQ(::truncate((tmp / "a.safetensors").c_str(), static_cast<off_t>(size + 16)), 0);
  try {
    first_value(a);
    FAIL() << "a shard of another size was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    test::expect_message(e.what(), {fmt::format("a.safetensors: changed size while ctquant ran "
                                                "({} bytes when first read, {} now)",
                                                size, size + 16)});
  }
}

// Output files written alternately through a pool of one descriptor.
TEST(FdPool, OutputFilesWrittenThroughOneDescriptor) {
  TempDir tmp;
  const auto pool = std::make_shared<FdPool>(1);
  OutputFile a(tmp / "a.bin", pool);
  OutputFile b(tmp / "b.bin", pool);
  for (int i = 0; i < 4; ++i) {
    const std::string text_a = fmt::format("a{}", i);
    const std::string text_b = fmt::format("b{}", i);
    a.write_at(static_cast<std::uint64_t>(2 * i), std::as_bytes(std::span(text_a)));
    b.write_at(static_cast<std::uint64_t>(2 * i), std::as_bytes(std::span(text_b)));
    EXPECT_LE(pool->open_count(), 1u);
  }
  a.sync_and_close();
  b.sync_and_close();
  EXPECT_EQ(pool->open_count(), 0u);
  EXPECT_EQ(test::read_file(tmp / "a.bin"), "a0a1a2a3");
  EXPECT_EQ(test::read_file(tmp / "b.bin"), "b0b1b2b3");
}

// An output file replaced behind ctquant's back is not written to.
TEST(FdPool, RefusesAnOutputFileReplacedWhileClosed) {
  TempDir tmp;
  const auto pool = std::make_shared<FdPool>(1);
  OutputFile a(tmp / "a.bin", pool);
  OutputFile b(tmp / "b.bin", pool);  // closes a
  // Moved aside (kept, so that the new file cannot get its inode number).
  fs::rename(tmp / "a.bin", tmp / "a.old");
  test::write_file(tmp / "a.bin", "someone else's");
  const std::string text = "x";
  try {
    a.write_at(0, std::as_bytes(std::span(text)));
    FAIL() << "wrote into a replaced file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    test::expect_message(e.what(), {"a.bin: was replaced while ctquant wrote it"});
  }
  EXPECT_EQ(test::read_file(tmp / "a.bin"), "someone else's");
}

// n shards of one small BF16 weight each, with an index: a checkpoint whose
// shard count, not size, is large.
void write_many_shards(const fs::path& dir, int n) {
  fs::create_directories(dir);
  nlohmann::json index;
  index["metadata"]["total_size"] = 0;
  std::uint64_t total = 0;
  for (int i = 0; i < n; ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
    const std::string name = fmt::format("model.layers.{}.mlp.down_proj.weight", i);
    test::FakeTensor w = test::random_weight(name, DType::kBF16, 64, 128,
                                             static_cast<std::uint32_t>(i + 1));
    // A norm in every shard: copied tensors, whose input is read by the
    // writer rather than the workers.
    const std::string norm = fmt::format("model.layers.{}.post_attention_layernorm.weight", i);
    test::FakeTensor norm_tensor{norm, DType::kBF16, {128},
                       test::float_bytes(DType::kBF16, std::vector<float>(128, 1.0f))};
    total += w.data.size() + norm_tensor.data.size();
    test::write_safetensors(dir / file, {norm_tensor, w});
    index["weight_map"][name] = file;
    index["weight_map"][norm] = file;
  }
  index["metadata"]["total_size"] = total;
  test::write_file(dir / "model.safetensors.index.json", index.dump(2));
  test::write_file(dir / "config.json", "{\"model_type\": \"llama\"}\n");
}

constexpr int kManyShards = 1500;
constexpr std::uint64_t kOpenFilesLimit = 256;

// The issue this guards: every shard held open made 1,500 shards fail with
// "Too many open files" under the common limit. quantize, verify (against
// the golden run and against the source) and inspect all run under 256.
TEST(ManyShards, QuantizeAndVerifyUnderOpenFileLimit) {
  TempDir tmp;
  write_many_shards(tmp / "in", kManyShards);
  // The reference: the library in this process, without a tight limit.
  quantize(test::test_options(tmp / "in", tmp / "reference"));

  test::RunOptions limited;
  limited.open_files_limit = kOpenFilesLimit;
  const test::CommandResult q = test::run_ctquant(
      {"quantize", (tmp / "in").string(), (tmp / "out").string(), "--threads", "2", "--no-sync"},
      limited);
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_EQ(test::diff_bytes(tmp / "out", tmp / "reference"), "");

  const test::CommandResult v = test::run_ctquant(
      {"verify", (tmp / "out").string(), (tmp / "reference").string()}, limited);
  EXPECT_EQ(v.exit_code, 0) << v.err << v.out.substr(0, 2000);
  const test::CommandResult s = test::run_ctquant(
      {"verify", (tmp / "out").string(), (tmp / "in").string(), "--against-source"}, limited);
  EXPECT_EQ(s.exit_code, 0) << s.err << s.out.substr(0, 2000);
  const test::CommandResult i =
      test::run_ctquant({"inspect", (tmp / "in").string(), "--plan"}, limited);
  EXPECT_EQ(i.exit_code, 0) << i.err;
  EXPECT_NE(i.out.find(fmt::format("({} shards, with index)", kManyShards)), std::string::npos);
}

// The same limit set by the shell, as a user would: `ulimit -n 256`.
TEST(ManyShards, QuantizeUnderShellUlimit) {
  TempDir tmp;
  write_many_shards(tmp / "in", kManyShards);
  const test::CommandResult r = test::run_shell(fmt::format(
      "ulimit -n {} && \"$CTQUANT\" quantize '{}' '{}' -q --no-sync", kOpenFilesLimit,
      (tmp / "in").string(), (tmp / "out").string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_json(tmp / "out" / "model.safetensors.index.json")["weight_map"].size(),
            4u * kManyShards);
}

}  // namespace
}  // namespace ctquant
