// libFuzzer target: the safetensors reader and the planner on arbitrary bytes.
//
// The input is a whole .safetensors file. It goes through parse_header() as
// the reader hands it a header, then through SafetensorsFile (the real read
// path: length prefix, bounds, UTF-8, JSON, entries, tiling) on an in-memory
// file. When the file is accepted, the target checks what acceptance
// promises: the tensors tile the data buffer, each holds exactly
// numel * bits / 8 bytes and can be read back. It then plans a quantization
// with a scheme, group size, ignore list and input config (none, or block
// FP8 with a block size up to 2^64 - 1) chosen by the last input bytes (and
// threads and chunk size by the third last), and
// checks that every planned output header is one the reader accepts and
// every planned tensor lies inside its shard. Small inputs are also executed
// into a scratch directory, and every output shard must read back as a valid
// file of the planned size. A broken promise aborts (a crash for libFuzzer);
// ASan and UBSan catch the rest. Built only with clang and
// -DCTQUANT_BUILD_FUZZERS=ON; run by tools/fuzz.sh.
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <limits>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/exec/executor.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/format/safetensors.hpp"

namespace {

using namespace ctquant;

[[noreturn]] void broken(const char* promise) {
  std::fprintf(stderr, "fuzz_header: broken promise: %s\n", promise);
  std::abort();
}

void check(bool ok, const char* promise) {
  if (!ok) broken(promise);
}

// An in-memory file the reader opens by path, as it opens real files.
class MemoryFile {
 public:
  MemoryFile() : fd_(::memfd_create("fuzz.safetensors", MFD_CLOEXEC)) {
    if (fd_ < 0) broken("memfd_create works");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  void set(const std::uint8_t* data, std::size_t size) {
    check(::ftruncate(fd_, 0) == 0, "ftruncate works");
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      check(n > 0, "pwrite works");
      done += static_cast<std::size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// What an accepted header promises.
void check_header(const SafetensorsHeader& h, std::uint64_t file_size) {
  check(h.data_start == 8 + h.header_size, "data_start is 8 + N");
  check(h.data_start + h.data_size == file_size, "the buffer ends at the end of the file");
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorEntry& t = h.tensors[i];
    check(t.begin == cursor, "tensors tile the buffer without gap or overlap");
    check(t.end >= t.begin, "offsets are in order");
    unsigned __int128 bits = dtype_bits(t.dtype);
    for (const std::uint64_t d : t.shape) bits *= d;
    const bool empty = t.numel() == 0;
    check(empty ? t.byte_size() == 0 : bits == static_cast<unsigned __int128>(t.byte_size()) * 8,
          "byte size is numel * bits / 8");
    check(h.find(t.name) == &t, "find() returns the tensor of that name");
    cursor = t.end;
  }
  check(cursor == h.data_size, "the tensors fill the buffer");
  check(h.by_name.size() == h.tensors.size(), "by_name indexes every tensor");
  for (std::size_t i = 1; i < h.by_name.size(); ++i) {
    check(h.tensors[h.by_name[i - 1]].name < h.tensors[h.by_name[i]].name,
          "by_name is sorted and the names are unique");
  }
}

void check_plan(const QuantizePlan& plan, const Checkpoint& ckpt) {
  for (const ShardPlan& shard : plan.shards) {
    check(shard.header.size() == shard.data_start, "the planned header ends at data_start");
    check(shard.data_start % 8 == 0, "the data buffer is 8-byte aligned");
    const std::string_view json = std::string_view(shard.header).substr(8);
    SafetensorsHeader reread;
    try {
      reread = parse_header(json, shard.file_size, shard.file_name);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      broken("the reader accepts every planned output header");
    }
    check(reread.tensors.size() == shard.tensors.size(), "the output header lists every tensor");
    for (const PlannedTensor& t : shard.tensors) {
      check(t.offset + t.byte_size <= shard.file_size - shard.data_start,
            "planned tensors lie inside their shard");
      const TensorEntry* e = reread.find(t.name);
      check(e != nullptr && e->begin == t.offset && e->byte_size() == t.byte_size,
            "the output header places each tensor where the plan does");
    }
  }
  check(plan.decisions.size() == ckpt.tensors.size(), "every input tensor has a decision");
}

// A directory for the outputs of executed plans, emptied after each run and
// removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fuzz_header-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) broken("mkdtemp works");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

const std::filesystem::path& scratch_dir() {
  static const ScratchDir dir;
  return dir.path();
}

// Executes the plan into the scratch directory; every output shard must read
// back as a valid safetensors file of the planned size.
void check_execution(const Checkpoint& ckpt, const QuantizePlan& plan, std::uint8_t pick) {
  const std::filesystem::path& dir = scratch_dir();
  ExecuteOptions options;
  options.fsync = false;
  options.threads = 1 + (pick & 1u);
  // Tiny chunks (many row jobs) or the default (whole small tensors).
  options.chunk_bytes = (pick & 2u) != 0 ? 1 + (pick >> 2) : ExecuteOptions{}.chunk_bytes;
  try {
    execute_plan(ckpt, plan, dir, options);
    for (const ShardPlan& shard : plan.shards) {
      try {
        const SafetensorsFile out(dir / shard.file_name, shard.file_name);
        check(out.file_size() == shard.file_size, "an output shard has its planned size");
        check(out.header().tensors.size() == shard.tensors.size(),
              "an output shard holds its planned tensors");
      } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        broken("every output shard reads back as a valid file");
      }
    }
  } catch (const Error& e) {
    // A non-finite weight (or dequantized FP8 value) is the one refusal
    // left once the plan is made.
    if (e.kind() != ErrorKind::kBadInput) std::fprintf(stderr, "%s\n", e.what());
    check(e.kind() == ErrorKind::kBadInput, "execution refuses only non-finite values");
  }
  std::error_code ec;
  for (const auto& item : std::filesystem::directory_iterator(dir)) {
    std::filesystem::remove_all(item.path(), ec);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // 1. parse_header() alone, as read_header_fd hands it the JSON.
  if (size >= 8) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    if (n <= size - 8) {
      const std::string_view json(reinterpret_cast<const char*>(data) + 8, n);
      try {
        check_header(parse_header(json, size, "fuzz.safetensors"), size);
      } catch (const Error& e) {
        check(e.kind() == ErrorKind::kBadInput, "parse_header throws only kBadInput");
      }
    }
  }

  // 2. The real read path on an in-memory file, then the planner.
  static MemoryFile file;
  file.set(data, size);
  Checkpoint ckpt;
  try {
    ckpt.shards.emplace_back(file.path(), "fuzz.safetensors");
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kBadInput, "a bad file is kBadInput");
    return 0;
  }
  const SafetensorsFile& shard = ckpt.shards.front();
  check_header(shard.header(), size);
  std::vector<std::byte> buffer;
  for (const TensorEntry& t : shard.header().tensors) {
    buffer.resize(t.byte_size());
    try {
      shard.read(t.begin, buffer);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      broken("every accepted tensor can be read");
    }
  }

  ckpt.single_file = true;
  ckpt.root = ".";
  for (std::size_t e = 0; e < shard.header().tensors.size(); ++e) {
    ckpt.tensors.emplace(shard.header().tensors[e].name, TensorLocation{0, e});
  }
  PlanOptions options;
  const std::uint8_t pick = size > 0 ? data[size - 1] : 0;
  const std::uint8_t pick2 = size > 1 ? data[size - 2] : 0;
  // Any preset of the registry that ctquant writes (the refused ones throw a
  // usage error before any header is read); integer ones also channel-wise
  // or g32.
  std::vector<const Preset*> presets;
  for (const SchemeFamily* f : scheme_families()) {
    for (const Preset& p : f->presets) {
      if (p.refused.empty()) presets.push_back(&p);
    }
  }
  options.groups = {preset_group(std::string(presets[pick % presets.size()]->name))};
  try {
    if (pick & 0x10) apply_group_size(options.groups[0], -1);  // channel-wise
    if (pick & 0x20) apply_group_size(options.groups[0], 32);
  } catch (const Error&) {
    // Not an integer preset: its layout is fixed.
  }
  if (pick & 0x40) options.ignore = {"re:.*(qkv|g)_proj$"};
  if (pick & 0x80) {
    // Block FP8 input; a block dimension of 16 stands for 2^64 - 1.
    const auto block = [](unsigned v) -> std::uint64_t {
      return v == 16 ? std::numeric_limits<std::uint64_t>::max() : v;
    };
    ckpt.config = nlohmann::json{
        {"quantization_config",
         {{"quant_method", "fp8"},
          {"weight_block_size", {block(1 + (pick2 >> 4)), block(1 + (pick2 & 0x0F))}}}}};
  }
  try {
    const QuantizePlan plan = make_plan(ckpt, options);
    check_plan(plan, ckpt);
    if (size <= 16384) check_execution(ckpt, plan, size > 2 ? data[size - 3] : 0);
  } catch (const Error& e) {
    // kBadInput: the header breaks a rule; kUsage: its shapes do not fit the
    // picked scheme (a weight the scheme cannot quantize, as --scheme would
    // be told).
    check(e.kind() == ErrorKind::kBadInput || e.kind() == ErrorKind::kUsage,
          "the planner refuses a header only as kBadInput or kUsage");
  }
  return 0;
}
