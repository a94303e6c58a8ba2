// plan_fingerprint, sample_input and fingerprint_changes (exec/parts.hpp):
// what identifies a plan, and the names of what differs between two.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/exec/parts.hpp"
#include "ctquant/format/config.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/sha256.hpp"
#include "ctquant/util/version.hpp"
#include "exec/part_record.hpp"
#include "util/input_file.hpp"
#include "util/ordered_parallel.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Sampled ranges closer than this are read in one read (the bytes between
// them are read, not hashed): adjacent small tensors, and one tensor's last
// bytes with the next one's first, cost one read.
constexpr std::uint64_t kSampleMergeGap = 64 << 10;
// Largest read of the sample.
constexpr std::uint64_t kSampleReadBytes = 1 << 20;
// Other files (copied unchanged) up to this size are hashed whole.
constexpr std::uint64_t kOtherFileWholeBytes = 64 << 20;

// How fingerprint_changes names an input file whose sampled bytes differ.
constexpr std::string_view kOtherTensorData = "same size and header, other tensor data";
constexpr std::string_view kOtherContent = "same size, other content";

struct Range {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// The first and last kInputSampleBytes of every tensor, the whole tensor when
// it is no longer than both, in data order.
std::vector<Range> sample_ranges(const SafetensorsHeader& header) {
  std::vector<Range> ranges;
  for (const TensorEntry& t : header.tensors) {
    if (t.end <= t.begin) continue;
    if (t.byte_size() <= 2 * kInputSampleBytes) {
      ranges.push_back({t.begin, t.end});
    } else {
      ranges.push_back({t.begin, t.begin + kInputSampleBytes});
      ranges.push_back({t.end - kInputSampleBytes, t.end});
    }
  }
  return ranges;
}

struct ShardSample {
  std::string sha256;
  std::uint64_t bytes_read = 0;
  std::uint64_t reads = 0;
};

void check_cancel(const std::atomic<bool>* cancel) {
  if (cancel != nullptr && cancel->load()) {
    throw Error(ErrorKind::kInterrupted, "interrupted by a signal while the input was sampled");
  }
}

ShardSample sample_shard(const SafetensorsFile& shard, const std::atomic<bool>* cancel) {
  const std::vector<Range> ranges = sample_ranges(shard.header());
  ShardSample out;
  Sha256 hash;
  std::vector<std::byte> buffer;
  for (std::size_t i = 0; i < ranges.size();) {
    check_cancel(cancel);
    // One read: ranges[i, j), close together and at most kSampleReadBytes.
    std::size_t j = i + 1;
    while (j < ranges.size() && ranges[j].begin - ranges[j - 1].end <= kSampleMergeGap &&
           ranges[j].end - ranges[i].begin <= kSampleReadBytes) {
      ++j;
    }
    const std::uint64_t begin = ranges[i].begin;
    buffer.resize(ranges[j - 1].end - begin);
    shard.read(begin, buffer);
    out.bytes_read += buffer.size();
    ++out.reads;
    for (std::size_t k = i; k < j; ++k) {
      hash.update(std::span<const std::byte>(buffer).subspan(ranges[k].begin - begin,
                                                             ranges[k].end - ranges[k].begin));
    }
    i = j;
  }
  out.sha256 = hash.hex_digest();
  return out;
}

// A copied file: whole up to kOtherFileWholeBytes, else its first and last
// kInputSampleBytes. Empty when it cannot be read (the copy reports that).
ShardSample sample_other_file(const fs::path& path, const std::string& label) {
  ShardSample out;
  try {
    std::uint64_t size = 0;
    const detail::UniqueFd fd = detail::open_input_file(path, label, size);
    std::vector<Range> ranges;
    if (size <= kOtherFileWholeBytes) {
      ranges.push_back({0, size});
    } else {
      ranges.push_back({0, kInputSampleBytes});
      ranges.push_back({size - kInputSampleBytes, size});
    }
    Sha256 hash;
    std::vector<std::byte> buffer(std::min<std::uint64_t>(size, kSampleReadBytes));
    for (const Range& r : ranges) {
      for (std::uint64_t at = r.begin; at < r.end;) {
        const std::size_t want = std::min<std::uint64_t>(buffer.size(), r.end - at);
        const ssize_t got = ::pread(fd.get(), buffer.data(), want, static_cast<off_t>(at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return ShardSample{};
        hash.update(std::span<const std::byte>(buffer.data(), static_cast<std::size_t>(got)));
        at += static_cast<std::uint64_t>(got);
        out.bytes_read += static_cast<std::uint64_t>(got);
        ++out.reads;
      }
    }
    out.sha256 = hash.hex_digest();
  } catch (const Error&) {
    return ShardSample{};
  }
  return out;
}

std::string header_digest(const SafetensorsHeader& h) {
  Sha256 hash;
  hash.update(fmt::format("{}\n", h.header_size));
  for (const auto& [key, value] : h.metadata) {
    hash.update(key);
    hash.update(std::string_view("\0", 1));
    hash.update(value);
    hash.update(std::string_view("\n", 1));
  }
  for (const TensorEntry& t : h.tensors) {
    hash.update(fmt::format("{}\t{}\t{}\t{}\t{}\n", t.name, dtype_tag(t.dtype),
                            shape_string(t.shape), t.begin, t.end));
  }
  return hash.hex_digest();
}

std::string json_digest(const std::optional<json>& value) {
  return value ? sha256_hex(value->dump()) : std::string();
}

std::uint64_t other_file_size(const Checkpoint& ckpt, const std::string& name) {
  std::error_code ec;
  const auto size = fs::file_size(ckpt.root / name, ec);
  return ec ? 0 : size;
}

// A JSON value as a message shows it: short.
std::string short_value(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// Paths where two JSON values differ ("ignore", "config_groups.group_0..."),
// at most `limit`.
void json_changes(const json& before, const json& now, const std::string& path,
                  const FingerprintSides& sides, std::vector<std::string>& out, std::size_t limit) {
  if (out.size() >= limit || before == now) return;
  if (before.is_object() && now.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : before.items()) keys.insert(k);
    for (const auto& [k, v] : now.items()) keys.insert(k);
    // One object key gone and one come (a config group renamed because its
    // weights changed, e.g. W4A16 to config_group_0 with --group-size 64):
    // the two are compared field by field, so the change itself is shown.
    std::vector<std::string> gone;
    std::vector<std::string> came;
    for (const std::string& k : keys) {
      if (!now.contains(k)) gone.push_back(k);
      if (!before.contains(k)) came.push_back(k);
    }
    if (gone.size() == 1 && came.size() == 1 && before[gone[0]].is_object() &&
        now[came[0]].is_object()) {
      const std::string sub = path.empty() ? gone[0] : path + "." + gone[0];
      out.push_back(
          fmt::format("{}: named {} {}, {} {}", sub, gone[0], sides.before, came[0], sides.now));
      json_changes(before[gone[0]], now[came[0]], sub, sides, out, limit);
      keys.erase(gone[0]);
      keys.erase(came[0]);
    }
    for (const std::string& k : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!before.contains(k)) {
        out.push_back(
            fmt::format("{}: absent {}, {} {}", sub, sides.before, short_value(now[k]), sides.now));
      } else if (!now.contains(k)) {
        out.push_back(fmt::format("{}: {} {}, absent {}", sub, short_value(before[k]), sides.before,
                                  sides.now));
      } else {
        json_changes(before[k], now[k], sub, sides, out, limit);
      }
      if (out.size() >= limit) return;
    }
    return;
  }
  out.push_back(fmt::format("{}: {} {}, {} {}", path.empty() ? "(value)" : path,
                            short_value(before), sides.before, short_value(now), sides.now));
}

}  // namespace

InputSample sample_input(const Checkpoint& checkpoint, unsigned threads,
                         const std::atomic<bool>* cancel) {
  const auto start = std::chrono::steady_clock::now();
  InputSample sample;
  const std::size_t n_shards = checkpoint.shards.size();
  const std::size_t n = n_shards + checkpoint.other_files.size();
  sample.shard_sha256.resize(n_shards);
  sample.other_file_sha256.resize(checkpoint.other_files.size());
  detail::ordered_parallel<ShardSample>(
      n, std::max(1u, threads),
      [&](std::size_t i, unsigned) {
        check_cancel(cancel);
        if (i < n_shards) return sample_shard(checkpoint.shards[i], cancel);
        const std::string& name = checkpoint.other_files[i - n_shards];
        return sample_other_file(checkpoint.root / name, name);
      },
      [&](std::size_t i, ShardSample s) {
        (i < n_shards ? sample.shard_sha256[i] : sample.other_file_sha256[i - n_shards]) = s.sha256;
        sample.bytes_read += s.bytes_read;
        sample.reads += s.reads;
      });
  sample.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return sample;
}

json plan_fingerprint(const Checkpoint& checkpoint, const QuantizePlan& plan,
                      const InputSample& sample) {
  const auto sample_of = [](const std::vector<std::string>& digests, std::size_t i) {
    return i < digests.size() ? digests[i] : std::string();
  };
  json input;
  json shards = json::array();
  for (std::size_t i = 0; i < checkpoint.shards.size(); ++i) {
    const SafetensorsFile& shard = checkpoint.shards[i];
    shards.push_back(json{{"name", shard.label()},
                          {"size", shard.file_size()},
                          {"header_sha256", header_digest(shard.header())},
                          {"sample_sha256", sample_of(sample.shard_sha256, i)}});
  }
  input["shards"] = shards;
  input["config_sha256"] = json_digest(checkpoint.config);
  input["index_sha256"] =
      checkpoint.has_index ? json_digest(std::optional<json>(checkpoint.index)) : std::string();
  json others = json::array();
  for (std::size_t i = 0; i < checkpoint.other_files.size(); ++i) {
    const std::string& name = checkpoint.other_files[i];
    others.push_back(json{{"name", name},
                          {"size", other_file_size(checkpoint, name)},
                          {"sample_sha256", sample_of(sample.other_file_sha256, i)}});
  }
  input["other_files"] = others;

  json output;
  json files = json::array();
  Sha256 layout;
  std::vector<std::string> tensors;
  std::uint64_t bytes = 0;
  for (const PlannedFile& f : plan_output_files(checkpoint, plan)) {
    files.push_back(json{{"name", f.name}, {"size", f.size}});
    bytes += f.size;
    tensors.insert(tensors.end(), f.tensors.begin(), f.tensors.end());
  }
  for (const ShardPlan& shard : plan.shards) layout.update(shard.header);
  layout.update(dump_json(plan.index));
  layout.update(dump_json(plan.config));
  std::sort(tensors.begin(), tensors.end());
  Sha256 names;
  for (const std::string& t : tensors) {
    names.update(t);
    names.update(std::string_view("\n", 1));
  }
  output["files"] = files;
  output["bytes"] = bytes;
  output["layout_sha256"] = layout.hex_digest();
  output["tensors"] = tensors.size();
  output["tensors_sha256"] = names.hex_digest();

  json fingerprint;
  fingerprint["ctquant_version"] = ctquant_version();
  fingerprint["record_format"] = detail::kRecordFormat;
  fingerprint["input"] = input;
  fingerprint["options"] = plan.config.contains("quantization_config")
                               ? plan.config["quantization_config"]
                               : json(nullptr);
  fingerprint["output"] = output;
  fingerprint["fingerprint"] = sha256_hex(fingerprint.dump());
  return fingerprint;
}

std::vector<std::string> fingerprint_changes(const json& before, const json& now,
                                             const FingerprintSides& sides) {
  std::vector<std::string> changes;
  if (before.value("fingerprint", "") == now.value("fingerprint", "")) return changes;
  constexpr std::size_t kLimit = 12;
  if (before.value("ctquant_version", "") != now.value("ctquant_version", "") ||
      before.value("record_format", 0) != now.value("record_format", 0)) {
    changes.push_back(fmt::format(
        "ctquant version: {} (record format {}) {}, {} (record format {}) {}",
        before.value("ctquant_version", "?"), before.value("record_format", 0), sides.before,
        now.value("ctquant_version", "?"), now.value("record_format", 0), sides.now));
  }
  const json bi = before.value("input", json::object());
  const json ni = now.value("input", json::object());
  const auto by_name = [](const json& list) {
    std::map<std::string, json> out;
    if (list.is_array()) {
      for (const json& item : list) {
        if (item.is_object() && item.contains("name")) out[item.value("name", "")] = item;
      }
    }
    return out;
  };
  const auto compare_files = [&](const char* key, const char* what) {
    const auto b = by_name(bi.value(key, json::array()));
    const auto n = by_name(ni.value(key, json::array()));
    for (const auto& [name, item] : b) {
      if (changes.size() >= kLimit) return;
      const auto it = n.find(name);
      if (it == n.end()) {
        changes.push_back(
            fmt::format("input {} {}: present {}, absent {}", what, name, sides.before, sides.now));
      } else if (item.value("size", 0ull) != it->second.value("size", 0ull)) {
        changes.push_back(fmt::format("input {} {}: {} bytes {}, {} {}", what, name,
                                      item.value("size", 0ull), sides.before,
                                      it->second.value("size", 0ull), sides.now));
      } else if (item.value("header_sha256", "") != it->second.value("header_sha256", "")) {
        changes.push_back(fmt::format("input {} {}: its header differs", what, name));
      } else if (item.value("sample_sha256", "") != it->second.value("sample_sha256", "")) {
        changes.push_back(
            fmt::format("input {} {}: {}", what, name,
                        key == std::string_view("shards") ? kOtherTensorData : kOtherContent));
      }
    }
    for (const auto& [name, item] : n) {
      if (changes.size() >= kLimit) return;
      if (b.count(name) == 0) {
        changes.push_back(
            fmt::format("input {} {}: absent {}, present {}", what, name, sides.before, sides.now));
      }
    }
  };
  compare_files("shards", "shard");
  compare_files("other_files", "file");
  if (bi.value("config_sha256", "") != ni.value("config_sha256", "")) {
    changes.push_back(fmt::format("input {}: differs", kConfigFileName));
  }
  if (bi.value("index_sha256", "") != ni.value("index_sha256", "")) {
    changes.push_back(fmt::format("input {}: differs", kIndexFileName));
  }
  std::vector<std::string> options;
  json_changes(before.value("options", json()), now.value("options", json()), "", sides, options,
               kLimit);
  for (const std::string& o : options) changes.push_back("options: quantization_config." + o);
  if (changes.empty()) changes.push_back("the output layout differs");
  return changes;
}

namespace detail {

bool only_input_data_changed(const std::vector<std::string>& changes) {
  return !changes.empty() && std::all_of(changes.begin(), changes.end(), [](const std::string& c) {
    return c.starts_with("input ") && (c.ends_with(kOtherTensorData) || c.ends_with(kOtherContent));
  });
}

}  // namespace detail
}  // namespace ctquant
