// Private: the pieces verify_checkpoints and verify_against_source share.
//
// A Side is one checkpoint opened tolerantly: every .safetensors file of the
// directory is read (headers validated), the index and config.json are
// parsed but not required to agree with the shards, because that agreement
// is one of the things verified. The compare_* functions compare two sides
// section by section and record what differs in a Collector.
#pragma once

#include <cstddef>
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/matcher.hpp"
#include "ctquant/format/targets.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/verify/verify.hpp"

namespace ctquant::detail {

inline constexpr std::uint64_t kMaxWholeReadBytes = 256u << 20;  // zero-point tensors read whole
inline constexpr std::uint64_t kMaxWholeFileBytes = 64u << 20;   // other files read whole
inline constexpr std::size_t kMaxNamesInMessage = 5;

struct Side {
  std::string label;  // "OUTPUT", "GOLDEN" or "INPUT"
  std::filesystem::path root;
  std::vector<SafetensorsFile> shards;                    // sorted by file name
  std::map<std::string, std::vector<std::size_t>> where;  // tensor -> shards holding it
  bool has_index = false;
  std::optional<nlohmann::json> index;
  std::string index_error;
  bool has_config = false;
  std::optional<nlohmann::json> config;
  std::string config_error;
  std::vector<std::string> other_files;  // sorted

  struct Ref {
    const SafetensorsFile* file = nullptr;
    const TensorEntry* entry = nullptr;
    explicit operator bool() const { return entry != nullptr; }
  };
  Ref find(const std::string& name) const {
    const auto it = where.find(name);
    if (it == where.end()) return {};
    const SafetensorsFile& f = shards[it->second.front()];
    return {&f, f.header().find(name)};
  }
  std::uint64_t tensor_bytes() const {
    std::uint64_t total = 0;
    for (const auto& s : shards) total += s.header().data_size;
    return total;
  }
  std::size_t n_tensors() const { return where.size(); }
};

using Ref = Side::Ref;

// Opens a checkpoint directory or .safetensors file; label ("OUTPUT",
// "GOLDEN", "INPUT") names it in messages. Throws Error{kIo} when path does
// not exist, Error{kBadInput} for a broken shard or a directory without one.
Side open_side(const std::filesystem::path& path, const std::string& label);

// An INPUT as quantize reads it (open_checkpoint): with an index, only the
// files it lists are shards and only the tensors it lists exist; the rest
// is never written, so OUTPUT is not compared with it.
void restrict_to_index(Side& side);

// The scheme groups and ignore list OUTPUT's config.json describes
// (plan_options_from_config of its quantization_config), to plan the INPUT
// it was made from again. Throws Error{kBadInput} naming the side, what is
// wrong and `command` (the option that needs it) when config.json has none.
PlanOptions plan_options_of_output(const Side& output, std::string_view command);

// A whole file's bytes; Error{kIo} naming label when it cannot be read.
std::string read_text(const std::filesystem::path& path, const std::string& label);

// Collecting differences and notes.
class Collector {
 public:
  explicit Collector(VerifyReport& report) : report_(report) {}
  void diff(std::string kind, std::string file, std::string tensor, std::string message,
            nlohmann::json details = nlohmann::json::object()) {
    report_.differences.push_back(VerifyItem{std::move(kind), std::move(file), std::move(tensor),
                                             std::move(message), std::move(details)});
  }
  void note(std::string kind, std::string file, std::string tensor, std::string message,
            nlohmann::json details = nlohmann::json::object()) {
    report_.notes.push_back(VerifyItem{std::move(kind), std::move(file), std::move(tensor),
                                       std::move(message), std::move(details)});
  }
  VerifyReport& report() { return report_; }

 private:
  VerifyReport& report_;
};

// The threads a comparison runs on: options.threads, or one per core.
unsigned verify_threads(const VerifyOptions& options);

// The findings of part of a comparison, made on another thread into a report
// of its own: its differences and notes appended to report's, its tensor
// counts added (in the order parts are merged, so the report does not
// depend on the thread count).
void merge_findings(VerifyReport& report, VerifyReport&& part);

// Labels that name both sides in messages.
struct Labels {
  std::string a;  // OUTPUT
  std::string b;  // GOLDEN / INPUT
};

std::string short_json(const nlohmann::json& value);
// "[i, j]" of a flat element index in shape.
std::string index_string(std::uint64_t flat, const std::vector<std::uint64_t>& shape);

// Reads bytes [offset, offset + out.size()) of a tensor's data.
void read_part(const Ref& t, std::uint64_t offset, std::span<std::byte> out);
std::vector<std::byte> read_whole(const Ref& t);
std::uint32_t load_bits(DType dtype, const std::byte* p);
std::vector<std::uint32_t> as_words(std::span<const std::byte> bytes);

// Calls f(first_unit, bytes_a, bytes_b) over two tensors of equal byte size,
// in steps of whole units of unit bytes, about chunk_bytes per step.
template <class F>
void stream_both(const Ref& a, const Ref& b, std::uint64_t unit, std::uint64_t chunk_bytes, F&& f) {
  const std::uint64_t total = a.entry->byte_size();
  const std::uint64_t step = std::max<std::uint64_t>(1, chunk_bytes / unit) * unit;
  std::vector<std::byte> ba;
  std::vector<std::byte> bb;
  for (std::uint64_t done = 0; done < total;) {
    const std::uint64_t n = std::min(step, total - done);
    ba.resize(n);
    bb.resize(n);
    read_part(a, done, ba);
    read_part(b, done, bb);
    f(done / unit, std::span<const std::byte>(ba), std::span<const std::byte>(bb));
    done += n;
  }
}


// ---- comparisons (compare.cpp) ----

// Any tensor: elements compared bit for bit; float elements also report the
// largest absolute difference. Returns whether they are identical.
bool compare_elements(const Ref& a, const Ref& b, std::uint64_t chunk_bytes, Collector& c,
                      const std::string& kind = "bytes");
// Packed int weights [R, words]: rows unpacked to count differing codes.
bool compare_packed(const Ref& a, const Ref& b, int num_bits, std::uint64_t n_cols,
                    const Labels& labels, std::uint64_t chunk_bytes, Collector& c);
// Scales of a float dtype, in ulps (scale_ulp accepted as notes).
bool compare_scales(const Ref& a, const Ref& b, std::uint64_t scale_ulp, const Labels& labels,
                    std::uint64_t chunk_bytes, Collector& c);
// Packed zero points [ceil(R*b/32), G], unpacked along dim 0.
bool compare_zero_points(const Ref& a, const Ref& b, int num_bits, std::uint64_t rows,
                         const Labels& labels, std::uint64_t chunk_bytes, Collector& c);

// The weights blocks of config.json's config groups, and the group each
// module is read with (GroupTargets, the resolver quantize and lint use:
// vLLM's reading, else compressed-tensors').
struct GroupSchemes {
  std::optional<GroupTargets> targets;  // nullopt: no groups, or targets that do not compile
  std::vector<nlohmann::json> weights;  // per group, in config.json's order
};
GroupSchemes config_groups(const std::optional<nlohmann::json>& config);
// The num_bits of the module's group (1 to 32), or nullopt.
std::optional<int> bits_from_groups(const GroupSchemes& groups, const std::string& module);
// [R, C] of M.weight_shape on a side, when present and well-formed.
std::optional<std::array<std::uint64_t, 2>> read_weight_shape(const Side& side,
                                                              const std::string& module);

// config.json as JSON values (quantization_config too when compare_qc).
void compare_configs(const Side& a, const Side& b, const Labels& labels, bool compare_qc,
                     Collector& c);
// Other files: bytes, or JSON values for .json files whose bytes differ.
void compare_other_files(const Side& a, const Side& b, const Labels& labels, Collector& c);
// Every tensor of a side's shards starts at a multiple of its element size in
// the file (section 5 of the format spec): each one that does not is a
// difference of kind "alignment" (up to 20, then a count).
void check_alignment(const Side& side, Collector& c);
// A side's index against its own shards; returns whether it is consistent.
bool check_index(const Side& side, Collector& c);
// The two indexes against each other. With placement_is_note, tensors held
// by other shards (both indexes consistent with their shards) are notes.
void compare_indexes(const Side& a, const Side& b, const Labels& labels, bool placement_is_note,
                     Collector& c);
// Shard file sets and __metadata__.
void compare_shard_files(const Side& a, const Side& b, const Labels& labels, Collector& c);

bool ends_with_param(const std::string& name, const char* param);

}  // namespace ctquant::detail
