// plan_output_files (plan/output_files.hpp): the one list of the files a
// plan writes, from which quantize's manifest, inspect's expected size and
// the parts' assignment are made. Checked against what quantize writes for
// every golden case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/output_files.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

class PlanOutputFilesOfEveryCase : public ::testing::TestWithParam<std::string> {};

// The files, in plan order (the shards, the index, config.json, the copied
// files), are those quantize writes besides the manifest, with the sizes
// they have on disk; each shard lists the tensors of its header; the work
// of a file is the input bytes it reads plus its size.
TEST_P(PlanOutputFilesOfEveryCase, ListTheFilesQuantizeWritesWithTheirSizes) {
  const test::GoldenCase c = test::find_case(GetParam());
  TempDir tmp;
  QuantizeOptions options = test::test_options(test::input_of(c), tmp / "out");
  options.plan = test::plan_of(c);
  options.allow_unloadable = test::unloadable_in_vllm(c.name);
  const QuantizeSummary summary = quantize(options);
  const Checkpoint input = open_checkpoint(test::input_of(c));
  const std::vector<PlannedFile> files = plan_output_files(input, summary.plan);

  std::vector<std::string> written;
  for (const auto& e : fs::directory_iterator(tmp / "out")) {
    if (e.path().filename() != kManifestFileName) written.push_back(e.path().filename().string());
  }
  std::sort(written.begin(), written.end());
  std::vector<std::string> listed;
  for (const PlannedFile& f : files) listed.push_back(f.name);
  std::vector<std::string> listed_sorted = listed;
  std::sort(listed_sorted.begin(), listed_sorted.end());
  EXPECT_EQ(listed_sorted, written);

  const std::size_t shards = summary.plan.shards.size();
  ASSERT_EQ(files.size(), shards + 2 + summary.plan.copied_files.size());
  EXPECT_EQ(files[shards].name, kIndexFileName);
  EXPECT_EQ(files[shards + 1].name, kConfigFileName);
  for (std::size_t i = 0; i < files.size(); ++i) {
    const PlannedFile& f = files[i];
    SCOPED_TRACE(f.name);
    EXPECT_EQ(f.size, fs::file_size(tmp / "out" / f.name));
    if (i < shards) {
      std::vector<std::string> names;
      for (const TensorEntry& t : read_header(tmp / "out" / f.name, f.name).tensors) {
        names.push_back(t.name);
      }
      std::vector<std::string> tensors = f.tensors;
      std::sort(names.begin(), names.end());
      std::sort(tensors.begin(), tensors.end());
      EXPECT_EQ(tensors, names);
      const auto& from = input.shards[summary.plan.shards[i].input_shard];
      EXPECT_EQ(f.work, from.header().data_size + f.size);
    } else if (i < shards + 2) {
      EXPECT_TRUE(f.tensors.empty());
      EXPECT_EQ(f.work, f.size);
    } else {
      EXPECT_TRUE(f.tensors.empty());
      EXPECT_EQ(f.size, fs::file_size(test::input_of(c) / f.name));
      EXPECT_EQ(f.work, 2 * f.size);
    }
  }

  // inspect's expected output: the same files, and their bytes with the
  // manifest's are what quantize wrote.
  const std::vector<ManifestEntry> expected = expected_output_files(input, summary.plan);
  ASSERT_EQ(expected.size(), files.size());
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(expected[i].name, files[i].name);
    EXPECT_EQ(expected[i].size, files[i].size);
    bytes += files[i].size;
  }
  EXPECT_EQ(expected_output_bytes(input, summary.plan),
            bytes + fs::file_size(tmp / "out" / kManifestFileName));
}

INSTANTIATE_TEST_SUITE_P(Cases, PlanOutputFilesOfEveryCase, ::testing::ValuesIn(test::case_names()),
                         [](const auto& param) { return test::case_test_name(param.param); });

}  // namespace
}  // namespace ctquant
