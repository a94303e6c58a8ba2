#include "ctquant/plan/output_files.hpp"

#include <filesystem>
#include <system_error>

#include "ctquant/format/config.hpp"

namespace ctquant {

namespace {

// The size of a file of INPUT, 0 when it cannot be read.
std::uint64_t input_file_size(const Checkpoint& checkpoint, const std::string& name) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(checkpoint.root / name, ec);
  return ec ? 0 : size;
}

}  // namespace

std::vector<PlannedFile> plan_output_files(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  std::vector<PlannedFile> files;
  for (const ShardPlan& shard : plan.shards) {
    PlannedFile f;
    f.name = shard.file_name;
    f.size = shard.file_size;
    f.work = checkpoint.shards[shard.input_shard].header().data_size + shard.file_size;
    for (const PlannedTensor& t : shard.tensors) f.tensors.push_back(t.name);
    files.push_back(std::move(f));
  }
  const std::uint64_t index_size = dump_json(plan.index).size();
  files.push_back(PlannedFile{kIndexFileName, index_size, index_size, {}});
  const std::uint64_t config_size = dump_json(plan.config).size();
  files.push_back(PlannedFile{kConfigFileName, config_size, config_size, {}});
  for (const std::string& name : plan.copied_files) {
    const std::uint64_t size = input_file_size(checkpoint, name);
    files.push_back(PlannedFile{name, size, 2 * size, {}});
  }
  return files;
}

}  // namespace ctquant
