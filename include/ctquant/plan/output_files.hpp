// The files a plan writes into OUTPUT, the one list quantize's manifest,
// inspect's expected size and the parts' assignment of files are made from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ctquant/plan/plan.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

// One output file of a plan.
struct PlannedFile {
  std::string name;         // file name inside OUTPUT
  std::uint64_t size = 0;   // bytes of the output file
  std::uint64_t work = 0;   // what it costs to write: input bytes read plus bytes written
  std::vector<std::string> tensors;  // the tensors a shard holds; empty for other files
};

// The output files of a plan in plan order: the shards (size from their
// layout; input bytes read: the data of the input shard they come from),
// then the index and config.json (size as serialised by dump_json, nothing
// read), then the copied files (size of the input file, read once; 0 when
// it cannot be read, which the copy reports). The manifest is not listed.
// Reads only file sizes; throws nothing of its own.
std::vector<PlannedFile> plan_output_files(const Checkpoint& checkpoint, const QuantizePlan& plan);

}  // namespace ctquant
