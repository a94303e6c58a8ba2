#include "ctquant/verify/verify.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/source/fp8.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/plan/matcher.hpp"
#include "ctquant/scheme/pack.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/format/safetensors.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

std::uint64_t ulp_distance(DType dtype, std::uint32_t bits_a, std::uint32_t bits_b) {
  if (bits_a == bits_b) return 0;
  std::uint32_t sign = 0x80000000u;
  std::uint32_t nan_above = 0x7f800000u;
  if (dtype == DType::kBF16) {
    sign = 0x8000u;
    nan_above = 0x7f80u;
  } else if (dtype == DType::kF16) {
    sign = 0x8000u;
    nan_above = 0x7c00u;
  }
  const std::uint32_t mag_mask = sign - 1u;
  if ((bits_a & mag_mask) > nan_above || (bits_b & mag_mask) > nan_above) {
    return std::numeric_limits<std::uint64_t>::max();
  }
  // Map sign-magnitude to a line where consecutive values are 1 apart.
  const auto ordered = [&](std::uint32_t bits) {
    const auto mag = static_cast<std::int64_t>(bits & mag_mask);
    return (bits & sign) != 0 ? -mag : mag;
  };
  const std::int64_t d = ordered(bits_a) - ordered(bits_b);
  return static_cast<std::uint64_t>(d < 0 ? -d : d);
}

namespace {

constexpr std::uint64_t kMaxWholeReadBytes = 256u << 20;  // zero-point tensors read whole
constexpr std::uint64_t kMaxWholeFileBytes = 64u << 20;   // other files read whole
constexpr std::size_t kMaxNamesInMessage = 5;

// ---------------------------------------------------------------------------
// One side of the comparison, opened tolerantly: every .safetensors file of
// the directory is read (headers validated), the index and config.json are
// parsed but not required to agree with the shards, because that agreement
// is one of the things verified.

struct Side {
  std::string label;  // "OUTPUT", "GOLDEN" or "INPUT"
  fs::path root;
  std::vector<SafetensorsFile> shards;                    // sorted by file name
  std::map<std::string, std::vector<std::size_t>> where;  // tensor -> shards holding it
  bool has_index = false;
  std::optional<json> index;
  std::string index_error;
  bool has_config = false;
  std::optional<json> config;
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

std::string read_text(const fs::path& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error(fmt::format("{}: cannot open for reading", label));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw io_error(fmt::format("{}: read failed", label));
  return text.str();
}

void parse_json_file(const fs::path& path, const std::string& label, std::optional<json>& out,
                     std::string& error) {
  try {
    out = json::parse(read_text(path, label));
  } catch (const json::parse_error& e) {
    error = fmt::format("not valid JSON ({})", e.what());
  }
}

Side open_side(const fs::path& path, const std::string& label) {
  Side side;
  side.label = label;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw io_error(fmt::format("{} {}: no such file or directory", label, path.string()));
  }
  std::vector<std::string> shard_names;
  if (fs::is_regular_file(status)) {
    if (!is_safetensors_name(path.filename().string())) {
      throw bad_input(fmt::format("{} {}: expected a checkpoint directory or a .safetensors file",
                                  label, path.string()));
    }
    side.root = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    shard_names.push_back(path.filename().string());
  } else if (fs::is_directory(status)) {
    side.root = path;
    std::vector<std::string> files;
    std::vector<std::string> skipped;  // not part of either checkpoint
    try {
      // Read-only: links out of the directory (a cache snapshot) are followed.
      files = list_checkpoint_files(path, /*follow_links_outside=*/true, skipped);
    } catch (const Error& e) {
      // Its messages start with the directory: say which side it is.
      throw Error(e.kind(), fmt::format("{} {}", label, e.what()));
    }
    for (const auto& name : files) {
      if (is_safetensors_name(name)) {
        shard_names.push_back(name);
      } else if (name == kIndexFileName) {
        side.has_index = true;
        parse_json_file(path / name, name, side.index, side.index_error);
      } else if (name == kConfigFileName) {
        side.has_config = true;
        parse_json_file(path / name, name, side.config, side.config_error);
      } else {
        side.other_files.push_back(name);
      }
    }
  } else {
    throw bad_input(fmt::format("{} {}: not a regular file or directory", label, path.string()));
  }
  if (shard_names.empty()) {
    throw bad_input(fmt::format("{} {}: no .safetensors file", label, path.string()));
  }
  // One bounded set of descriptors for the side's shards (any number of them).
  const auto descriptors = std::make_shared<FdPool>(FdPool::default_capacity());
  for (const auto& name : shard_names) {
    try {
      side.shards.emplace_back(side.root / name, name, descriptors);
    } catch (const Error& e) {
      // Say which of the two checkpoints holds the bad file.
      throw Error(e.kind(), fmt::format("{} {}: {}", label, side.root.string(), e.what()));
    }
  }
  for (std::size_t s = 0; s < side.shards.size(); ++s) {
    for (const TensorEntry& t : side.shards[s].header().tensors) side.where[t.name].push_back(s);
  }
  return side;
}

// ---------------------------------------------------------------------------
// Collecting differences and notes.

class Collector {
 public:
  explicit Collector(VerifyReport& report) : report_(report) {}
  void diff(std::string kind, std::string file, std::string tensor, std::string message,
            json details = json::object()) {
    report_.differences.push_back(VerifyItem{std::move(kind), std::move(file), std::move(tensor),
                                             std::move(message), std::move(details)});
  }
  void note(std::string kind, std::string file, std::string tensor, std::string message,
            json details = json::object()) {
    report_.notes.push_back(VerifyItem{std::move(kind), std::move(file), std::move(tensor),
                                       std::move(message), std::move(details)});
  }
  VerifyReport& report() { return report_; }

 private:
  VerifyReport& report_;
};

std::string short_json(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

std::string names_list(const std::vector<std::string>& names,
                       std::size_t max = kMaxNamesInMessage) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < max; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  if (names.size() > max) out += fmt::format(" ... and {} more", names.size() - max);
  return out;
}

std::string index_string(std::uint64_t flat, const std::vector<std::uint64_t>& shape) {
  if (shape.empty()) return "[]";
  std::vector<std::uint64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::uint64_t n = shape[d] == 0 ? 1 : shape[d];
    idx[d] = flat % n;
    flat /= n;
  }
  return shape_string(idx);
}

// ---------------------------------------------------------------------------
// Streaming tensor comparison.

using Ref = Side::Ref;

void read_part(const Ref& t, std::uint64_t offset, std::span<std::byte> out) {
  t.file->read(t.entry->begin + offset, out);
}

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

std::uint32_t load_bits(DType dtype, const std::byte* p) {
  if (dtype_bits(dtype) == 16) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::vector<std::uint32_t> as_words(std::span<const std::byte> bytes) {
  std::vector<std::uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), words.size() * 4);
  return words;
}

std::vector<std::byte> read_whole(const Ref& t) {
  std::vector<std::byte> bytes(t.entry->byte_size());
  read_part(t, 0, bytes);
  return bytes;
}

// Labels that name both sides in messages.
struct Labels {
  std::string a;  // OUTPUT
  std::string b;  // GOLDEN / INPUT
};

// Any tensor: elements compared bit for bit; float elements also report the
// largest absolute difference.
bool compare_elements(const Ref& a, const Ref& b, std::uint64_t chunk_bytes, Collector& c,
                      const std::string& kind = "bytes") {
  const DType dtype = a.entry->dtype;
  const int bits = dtype_bits(dtype);
  const std::uint64_t unit = bits >= 8 ? static_cast<std::uint64_t>(bits / 8) : 1;
  const bool is_float = is_quantizable_float(dtype);
  std::uint64_t n_diff = 0;
  std::optional<std::uint64_t> first;
  double max_abs = 0;
  stream_both(
      a, b, unit, chunk_bytes,
      [&](std::uint64_t first_unit, std::span<const std::byte> x, std::span<const std::byte> y) {
        if (std::memcmp(x.data(), y.data(), x.size()) == 0) return;
        for (std::uint64_t i = 0; i < x.size() / unit; ++i) {
          if (std::memcmp(x.data() + i * unit, y.data() + i * unit, unit) == 0) continue;
          ++n_diff;
          if (!first) first = first_unit + i;
          if (is_float) {
            const double d =
                std::fabs(static_cast<double>(load_as_float(dtype, x.data() + i * unit)) -
                          static_cast<double>(load_as_float(dtype, y.data() + i * unit)));
            max_abs =
                std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(max_abs, d);
          }
        }
      });
  if (n_diff == 0) return true;
  const std::uint64_t n_units = a.entry->byte_size() / unit;
  const std::string where =
      unit == 1 && bits < 8 ? fmt::format("byte {}", *first) : index_string(*first, a.entry->shape);
  json details = {{"elements_differ", n_diff}, {"elements", n_units}, {"first_index", *first}};
  std::string message = fmt::format("{} of {} {} differ, first at {}", n_diff, n_units,
                                    bits < 8 ? "bytes" : "elements", where);
  if (is_float) {
    details["max_abs_difference"] = max_abs;
    message += fmt::format("; largest absolute difference {:.6g}", max_abs);
  }
  c.diff(kind, a.file->label(), a.entry->name, message, std::move(details));
  return false;
}

// Packed weights [R, words]: rows unpacked to count differing codes.
bool compare_packed(const Ref& a, const Ref& b, int num_bits, std::uint64_t n_cols,
                    const Labels& labels, std::uint64_t chunk_bytes, Collector& c) {
  const std::uint64_t row_bytes = a.entry->shape[1] * 4;
  if (row_bytes == 0) return true;
  std::uint64_t n_diff = 0;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> first;
  std::optional<std::uint64_t> padding_row;  // first row differing only past the last code
  int first_a = 0;
  int first_b = 0;
  std::vector<std::int8_t> ca(n_cols);
  std::vector<std::int8_t> cb(n_cols);
  stream_both(
      a, b, row_bytes, chunk_bytes,
      [&](std::uint64_t first_row, std::span<const std::byte> x, std::span<const std::byte> y) {
        for (std::uint64_t r = 0; r < x.size() / row_bytes; ++r) {
          const auto xr = x.subspan(r * row_bytes, row_bytes);
          const auto yr = y.subspan(r * row_bytes, row_bytes);
          if (std::memcmp(xr.data(), yr.data(), row_bytes) == 0) continue;
          unpack_codes(as_words(xr), num_bits, ca);
          unpack_codes(as_words(yr), num_bits, cb);
          bool codes_differ = false;
          for (std::uint64_t col = 0; col < n_cols; ++col) {
            if (ca[col] == cb[col]) continue;
            codes_differ = true;
            ++n_diff;
            if (!first) {
              first = {first_row + r, col};
              first_a = ca[col];
              first_b = cb[col];
            }
          }
          if (!codes_differ && !padding_row) padding_row = first_row + r;
        }
      });
  if (n_diff == 0 && !padding_row) return true;
  if (n_diff == 0) {
    c.diff("codes", a.file->label(), a.entry->name,
           fmt::format("every code is equal, but the packed words differ in padding bits past the "
                       "last column, first in row {}",
                       *padding_row),
           json{{"codes_differ", 0}, {"first_row", *padding_row}});
    return false;
  }
  const std::uint64_t rows = a.entry->shape[0];
  c.diff(
      "codes", a.file->label(), a.entry->name,
      fmt::format("{} of {} codes differ, first at row {}, column {} ({} {}, {} {})", n_diff,
                  rows * n_cols, first->first, first->second, labels.a, first_a, labels.b, first_b),
      json{{"codes_differ", n_diff},
           {"codes", rows * n_cols},
           {"num_bits", num_bits},
           {"first_row", first->first},
           {"first_column", first->second},
           {"first_codes", {first_a, first_b}}});
  return false;
}

// Scales: values compared in units in the last place. Returns whether they are
// bit-identical; values within scale_ulp are a note, not a difference.
bool compare_scales(const Ref& a, const Ref& b, std::uint64_t scale_ulp, const Labels& labels,
                    std::uint64_t chunk_bytes, Collector& c) {
  const DType dtype = a.entry->dtype;
  const std::uint64_t unit = static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
  std::uint64_t n_diff = 0;
  std::uint64_t max_ulp = 0;
  std::optional<std::uint64_t> first;
  float first_a = 0;
  float first_b = 0;
  stream_both(
      a, b, unit, chunk_bytes,
      [&](std::uint64_t first_unit, std::span<const std::byte> x, std::span<const std::byte> y) {
        if (std::memcmp(x.data(), y.data(), x.size()) == 0) return;
        for (std::uint64_t i = 0; i < x.size() / unit; ++i) {
          const std::uint32_t va = load_bits(dtype, x.data() + i * unit);
          const std::uint32_t vb = load_bits(dtype, y.data() + i * unit);
          if (va == vb) continue;
          ++n_diff;
          max_ulp = std::max(max_ulp, ulp_distance(dtype, va, vb));
          if (!first) {
            first = first_unit + i;
            first_a = load_as_float(dtype, x.data() + i * unit);
            first_b = load_as_float(dtype, y.data() + i * unit);
          }
        }
      });
  if (n_diff == 0) return true;
  const std::uint64_t n = a.entry->byte_size() / unit;
  const std::string ulp_text = max_ulp == std::numeric_limits<std::uint64_t>::max()
                                   ? std::string("NaN")
                                   : fmt::format("{} ulp", max_ulp);
  json details = {{"values_differ", n_diff},
                  {"values", n},
                  {"max_ulp", max_ulp == std::numeric_limits<std::uint64_t>::max() ? json(nullptr)
                                                                                   : json(max_ulp)},
                  {"first_index", *first},
                  {"scale_ulp", scale_ulp}};
  std::string message = fmt::format(
      "{} of {} scale values differ, largest distance {}, first at {} ({} {:.9g}, {} {:.9g})",
      n_diff, n, ulp_text, index_string(*first, a.entry->shape), labels.a, first_a, labels.b,
      first_b);
  if (scale_ulp > 0 && max_ulp <= scale_ulp) {
    c.note("scale", a.file->label(), a.entry->name,
           message + fmt::format("; accepted by --scale-ulp {}", scale_ulp), std::move(details));
    return false;
  }
  if (scale_ulp > 0)
    message += fmt::format("; --scale-ulp {} accepts up to {} ulp", scale_ulp, scale_ulp);
  c.diff("scale", a.file->label(), a.entry->name, message, std::move(details));
  return false;
}

// Zero points [ceil(R*b/32), G], packed along dim 0: unpacked column by column.
std::vector<std::int8_t> unpack_zero_points(std::span<const std::byte> bytes, std::uint64_t words,
                                            std::uint64_t n_groups, std::uint64_t rows,
                                            int num_bits) {
  const std::vector<std::uint32_t> all = as_words(bytes);
  std::vector<std::int8_t> z(rows * n_groups);
  std::vector<std::uint32_t> column(words);
  std::vector<std::int8_t> codes(rows);
  for (std::uint64_t g = 0; g < n_groups; ++g) {
    for (std::uint64_t w = 0; w < words; ++w) column[w] = all[w * n_groups + g];
    unpack_codes(column, num_bits, codes);
    for (std::uint64_t r = 0; r < rows; ++r) z[r * n_groups + g] = codes[r];
  }
  return z;
}

bool compare_zero_points(const Ref& a, const Ref& b, int num_bits, std::uint64_t rows,
                         const Labels& labels, std::uint64_t chunk_bytes, Collector& c) {
  if (a.entry->byte_size() > kMaxWholeReadBytes) {
    return compare_elements(a, b, chunk_bytes, c, "zero_point");
  }
  const auto xa = read_whole(a);
  const auto xb = read_whole(b);
  if (xa == xb) return true;
  const std::uint64_t words = a.entry->shape[0];
  const std::uint64_t n_groups = a.entry->shape[1];
  rows = std::min(rows, words * 32 / static_cast<std::uint64_t>(num_bits));
  const auto za = unpack_zero_points(xa, words, n_groups, rows, num_bits);
  const auto zb = unpack_zero_points(xb, words, n_groups, rows, num_bits);
  std::uint64_t n_diff = 0;
  std::optional<std::uint64_t> first;
  for (std::uint64_t i = 0; i < za.size(); ++i) {
    if (za[i] == zb[i]) continue;
    ++n_diff;
    if (!first) first = i;
  }
  if (n_diff == 0) {
    c.diff("zero_point", a.file->label(), a.entry->name,
           "the packed words differ only in padding bits past the last row",
           json{{"zero_points_differ", 0}});
    return false;
  }
  c.diff("zero_point", a.file->label(), a.entry->name,
         fmt::format("{} of {} zero points differ, first at row {}, group {} ({} {}, {} {})",
                     n_diff, za.size(), *first / n_groups, *first % n_groups, labels.a, za[*first],
                     labels.b, zb[*first]),
         json{{"zero_points_differ", n_diff},
              {"zero_points", za.size()},
              {"first_row", *first / n_groups},
              {"first_group", *first % n_groups}});
  return false;
}

// ---------------------------------------------------------------------------
// The quantization_config of a side: num_bits per module.

struct GroupScheme {
  ModuleMatcher targets;
  json weights;
};

std::vector<GroupScheme> config_groups(const std::optional<json>& config) {
  std::vector<GroupScheme> out;
  if (!config || !config->is_object()) return out;
  const auto qc = config->find("quantization_config");
  if (qc == config->end() || !qc->is_object()) return out;
  const auto groups = qc->find("config_groups");
  if (groups == qc->end() || !groups->is_object()) return out;
  for (const auto& [name, group] : groups->items()) {
    if (!group.is_object() || !group.contains("targets") || !group["targets"].is_array() ||
        !group.contains("weights") || !group["weights"].is_object()) {
      continue;
    }
    std::vector<std::string> targets;
    for (const auto& t : group["targets"]) {
      if (t.is_string()) targets.push_back(t.get<std::string>());
    }
    try {
      out.push_back(
          GroupScheme{ModuleMatcher(targets, ModuleMatcher::Role::kTargets), group["weights"]});
    } catch (const Error&) {
      // A target that does not compile matches nothing here.
    }
  }
  return out;
}

std::optional<int> bits_from_groups(const std::vector<GroupScheme>& groups,
                                    const std::string& module) {
  for (const auto& g : groups) {
    if (!g.targets.first_match(module)) continue;
    const auto it = g.weights.find("num_bits");
    if (it != g.weights.end() && it->is_number_integer()) {
      const int bits = it->get<int>();
      if (bits >= 1 && bits <= 32) return bits;
    }
  }
  return std::nullopt;
}

// [R, C] of M.weight_shape on a side, when present and well-formed.
std::optional<std::array<std::uint64_t, 2>> read_weight_shape(const Side& side,
                                                              const std::string& module) {
  const Ref r = side.find(module + ".weight_shape");
  if (!r || r.entry->dtype != DType::kI64 || r.entry->byte_size() != 16) return std::nullopt;
  std::int64_t v[2];
  std::vector<std::byte> bytes(16);
  read_part(r, 0, bytes);
  std::memcpy(v, bytes.data(), 16);
  if (v[0] < 0 || v[1] < 0) return std::nullopt;
  return std::array<std::uint64_t, 2>{static_cast<std::uint64_t>(v[0]),
                                      static_cast<std::uint64_t>(v[1])};
}

// ---------------------------------------------------------------------------
// JSON differences.

struct JsonDelta {
  std::vector<std::string> path;
  std::optional<json> a;  // OUTPUT's value, absent when it lacks the key
  std::optional<json> b;
};

void json_diff(const json& a, const json& b, std::vector<std::string>& path,
               std::vector<JsonDelta>& out) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : a.items()) keys.insert(k);
    for (const auto& [k, v] : b.items()) keys.insert(k);
    for (const auto& k : keys) {
      path.push_back(k);
      const auto ia = a.find(k);
      const auto ib = b.find(k);
      if (ia == a.end()) {
        out.push_back(JsonDelta{path, std::nullopt, *ib});
      } else if (ib == b.end()) {
        out.push_back(JsonDelta{path, *ia, std::nullopt});
      } else {
        json_diff(*ia, *ib, path, out);
      }
      path.pop_back();
    }
    return;
  }
  if (a != b) out.push_back(JsonDelta{path, a, b});
}

std::string path_string(const std::vector<std::string>& path) {
  std::string out;
  for (const auto& p : path) out += (out.empty() ? "" : ".") + p;
  return out;
}

std::string delta_text(const JsonDelta& d, const Labels& labels) {
  const auto value = [](const std::optional<json>& v) {
    return v ? short_json(*v) : std::string("(absent)");
  };
  return fmt::format("{}: {} in {}, {} in {}", path_string(d.path), value(d.a), labels.a,
                     value(d.b), labels.b);
}

// Section 5 of the format spec: fields of quantization_config readers act on.
bool acted_on(const std::vector<std::string>& p) {
  static const std::set<std::string> kTop = {"format", "ignore", "quant_method",
                                             "quantization_status", "kv_cache_scheme"};
  static const std::set<std::string> kWeights = {"num_bits",        "type",       "symmetric",
                                                 "strategy",        "group_size", "actorder",
                                                 "block_structure", "dynamic"};
  if (p.size() >= 2 && p[0] == "quantization_config" && kTop.contains(p[1])) return true;
  if (p.size() >= 4 && p[1] == "config_groups" && (p[3] == "targets" || p[3] == "format")) {
    return true;
  }
  return p.size() >= 5 && p[1] == "config_groups" && p[3] == "weights" && kWeights.contains(p[4]);
}

// Fields reported as notes: they do not change how the checkpoint loads.
bool note_only(const std::vector<std::string>& p) {
  if (p.size() == 2 && p[0] == "quantization_config" &&
      (p[1] == "version" || p[1] == "global_compression_ratio")) {
    return true;
  }
  return p.size() >= 5 && p[1] == "config_groups" &&
         (p[4] == "observer" || p[4] == "observer_kwargs");
}

void compare_config_values(nlohmann::json ca, nlohmann::json cb, const Labels& labels,
                           bool compare_qc, Collector& c);

// Compares two config.json files. With compare_qc false the
// quantization_config key is skipped (--against-source: the source has none).
void compare_configs(const Side& a, const Side& b, const Labels& labels, bool compare_qc,
                     Collector& c) {
  const std::string file = kConfigFileName;
  if (!a.config_error.empty())
    c.diff("config", file, "", fmt::format("{}: {}", labels.a, a.config_error));
  if (!b.config_error.empty())
    c.diff("config", file, "", fmt::format("{}: {}", labels.b, b.config_error));
  if (!a.config_error.empty() || !b.config_error.empty()) return;
  if (!compare_qc && a.has_config && !b.has_config) {
    // quantize writes a config.json holding only quantization_config when
    // the source has none.
    compare_config_values(*a.config, json::object(), labels, compare_qc, c);
    return;
  }
  if (a.has_config != b.has_config) {
    c.diff(a.has_config ? "extra_file" : "missing_file", file, "",
           fmt::format("config.json is in {} only", a.has_config ? labels.a : labels.b));
    return;
  }
  if (!a.has_config) return;
  compare_config_values(*a.config, *b.config, labels, compare_qc, c);
}

void compare_config_values(json ca, json cb, const Labels& labels, bool compare_qc, Collector& c) {
  const std::string file = kConfigFileName;
  if (!compare_qc) {
    if (ca.is_object()) ca.erase("quantization_config");
    if (cb.is_object()) cb.erase("quantization_config");
  } else if (ca.is_object() && cb.is_object() && ca.contains("quantization_config") &&
             cb.contains("quantization_config") && ca["quantization_config"].is_object() &&
             cb["quantization_config"].is_object() &&
             ca["quantization_config"].contains("config_groups") &&
             cb["quantization_config"].contains("config_groups")) {
    // Config group names are not read by anyone: pair groups in name order.
    json& ga = ca["quantization_config"]["config_groups"];
    const json& gb = cb["quantization_config"]["config_groups"];
    if (ga.is_object() && gb.is_object() && ga.size() == gb.size() && ga != gb) {
      std::vector<std::string> na;
      std::vector<std::string> nb;
      for (const auto& [k, v] : ga.items()) na.push_back(k);
      for (const auto& [k, v] : gb.items()) nb.push_back(k);
      if (na != nb) {
        json renamed = json::object();
        for (std::size_t i = 0; i < na.size(); ++i) renamed[nb[i]] = ga[na[i]];
        ga = renamed;
        c.note("config", file, "",
               fmt::format("quantization_config.config_groups names: {} in {}, {} in {}",
                           names_list(na), labels.a, names_list(nb), labels.b));
      }
    }
  }
  std::vector<std::string> path;
  std::vector<JsonDelta> deltas;
  json_diff(ca, cb, path, deltas);
  for (const auto& d : deltas) {
    json details = {{"path", path_string(d.path)},
                    {"output", d.a ? *d.a : json(nullptr)},
                    {"reference", d.b ? *d.b : json(nullptr)}};
    if (note_only(d.path)) {
      c.note("config", file, "", delta_text(d, labels), std::move(details));
    } else {
      const bool read = acted_on(d.path);
      details["acted_on"] = read;
      c.diff("config", file, "", delta_text(d, labels) + (read ? " (a field vLLM acts on)" : ""),
             std::move(details));
    }
  }
}

// Other files: bytes, or JSON values for .json files whose bytes differ.
void compare_other_files(const Side& a, const Side& b, const Labels& labels, Collector& c) {
  std::set<std::string> names(a.other_files.begin(), a.other_files.end());
  names.insert(b.other_files.begin(), b.other_files.end());
  for (const auto& name : names) {
    const bool in_a = std::binary_search(a.other_files.begin(), a.other_files.end(), name);
    const bool in_b = std::binary_search(b.other_files.begin(), b.other_files.end(), name);
    if (!in_a || !in_b) {
      c.diff(in_a ? "extra_file" : "missing_file", name, "",
             fmt::format("file is in {} only", in_a ? labels.a : labels.b));
      continue;
    }
    ++c.report().files_compared;
    const fs::path pa = a.root / name;
    const fs::path pb = b.root / name;
    std::error_code ea;
    std::error_code eb;
    const auto sa = fs::file_size(pa, ea);
    const auto sb = fs::file_size(pb, eb);
    if (ea || eb) throw io_error(fmt::format("{}: cannot read its size", name));
    if (sa > kMaxWholeFileBytes || sb > kMaxWholeFileBytes) {
      // Large files: compare in chunks.
      std::ifstream fa(pa, std::ios::binary);
      std::ifstream fb(pb, std::ios::binary);
      std::vector<char> xa(1u << 20);
      std::vector<char> xb(1u << 20);
      bool equal = sa == sb;
      while (equal && fa && fb) {
        fa.read(xa.data(), static_cast<std::streamsize>(xa.size()));
        fb.read(xb.data(), static_cast<std::streamsize>(xb.size()));
        equal = fa.gcount() == fb.gcount() &&
                std::memcmp(xa.data(), xb.data(), static_cast<std::size_t>(fa.gcount())) == 0;
      }
      if (!equal) {
        c.diff("file", name, "",
               fmt::format("bytes differ ({} bytes in {}, {} in {})", sa, labels.a, sb, labels.b));
      }
      continue;
    }
    const std::string ta = read_text(pa, name);
    const std::string tb = read_text(pb, name);
    if (ta == tb) continue;
    if (name.ends_with(".json")) {
      try {
        const json ja = json::parse(ta);
        const json jb = json::parse(tb);
        if (ja == jb) {
          c.note("file", name, "", "same JSON value, different bytes (whitespace or key order)");
          continue;
        }
        std::vector<std::string> path;
        std::vector<JsonDelta> deltas;
        json_diff(ja, jb, path, deltas);
        std::vector<std::string> texts;
        for (const auto& d : deltas) texts.push_back(delta_text(d, labels));
        c.diff("file", name, "",
               fmt::format("JSON differs at {} place{}: {}", deltas.size(),
                           deltas.size() == 1 ? "" : "s", names_list(texts, 3)),
               json{{"json_differences", deltas.size()}});
        continue;
      } catch (const json::parse_error&) {
        // Not JSON on one side: compare as bytes.
      }
    }
    std::size_t at = 0;
    while (at < ta.size() && at < tb.size() && ta[at] == tb[at]) ++at;
    c.diff("file", name, "",
           fmt::format("bytes differ from offset {} ({} bytes in {}, {} in {})", at, ta.size(),
                       labels.a, tb.size(), labels.b),
           json{{"first_offset", at}});
  }
}

// The index of one side against that side's own shards.
void check_index(const Side& side, Collector& c) {
  const std::string file = kIndexFileName;
  if (!side.has_index) return;
  if (!side.index_error.empty()) {
    c.diff("index", file, "", fmt::format("{}: {}", side.label, side.index_error));
    return;
  }
  const json& index = *side.index;
  const auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || wm == index.end() || !wm->is_object()) {
    c.diff("index", file, "",
           fmt::format("{}: expected an object with a \"weight_map\" object", side.label));
    return;
  }
  std::map<std::string, std::size_t> shard_of_label;
  for (std::size_t s = 0; s < side.shards.size(); ++s) shard_of_label[side.shards[s].label()] = s;
  for (const auto& [tensor, value] : wm->items()) {
    if (!value.is_string()) {
      c.diff("index", file, tensor,
             fmt::format("{}: weight_map entry is {}, expected a file name", side.label,
                         short_json(value)));
      continue;
    }
    const std::string& shard = value.get_ref<const std::string&>();
    const auto s = shard_of_label.find(shard);
    if (s == shard_of_label.end()) {
      c.diff("index", file, tensor,
             fmt::format("{}: weight_map names '{}', which does not exist", side.label, shard));
    } else if (side.shards[s->second].header().find(tensor) == nullptr) {
      const Ref actual = side.find(tensor);
      c.diff("index", file, tensor,
             actual ? fmt::format("{}: weight_map lists it in '{}', but '{}' holds it", side.label,
                                  shard, actual.file->label())
                    : fmt::format("{}: weight_map lists it in '{}', which does not hold it; no "
                                  "shard does",
                                  side.label, shard));
    }
  }
  for (const auto& shard : side.shards) {
    for (const TensorEntry& t : shard.header().tensors) {
      if (!wm->contains(t.name)) {
        c.diff("index", file, t.name,
               fmt::format("{}: held by '{}' but not listed in weight_map", side.label,
                           shard.label()));
      }
    }
  }
  const std::uint64_t sum = side.tensor_bytes();
  const json* total = nullptr;
  if (index.contains("metadata") && index["metadata"].is_object() &&
      index["metadata"].contains("total_size")) {
    total = &index["metadata"]["total_size"];
  }
  if (total == nullptr) {
    c.diff("index", file, "", fmt::format("{}: metadata.total_size is missing", side.label));
  } else if (!total->is_number_unsigned() || total->get<std::uint64_t>() != sum) {
    c.diff("index", file, "",
           fmt::format("{}: metadata.total_size is {}, but the shards hold {} bytes of tensors",
                       side.label, short_json(*total), sum),
           json{{"total_size", *total}, {"tensor_bytes", sum}});
  }
}

// The two indexes against each other (golden mode).
void compare_indexes(const Side& a, const Side& b, const Labels& labels, Collector& c) {
  const std::string file = kIndexFileName;
  if (a.has_index != b.has_index) {
    c.diff(a.has_index ? "extra_file" : "missing_file", file, "",
           fmt::format("{} is in {} only", file, a.has_index ? labels.a : labels.b));
    return;
  }
  if (!a.index || !b.index || !a.index->is_object() || !b.index->is_object()) return;
  const json& ia = *a.index;
  const json& ib = *b.index;
  const json wa = ia.value("weight_map", json::object());
  const json wb = ib.value("weight_map", json::object());
  if (wa != wb && wa.is_object() && wb.is_object()) {
    std::vector<std::string> differing;
    for (const auto& [k, v] : wa.items()) {
      if (!wb.contains(k) || wb[k] != v) differing.push_back(k);
    }
    for (const auto& [k, v] : wb.items()) {
      if (!wa.contains(k)) differing.push_back(k);
    }
    c.diff("index", file, "",
           fmt::format("weight_map differs for {} tensor{}: {}", differing.size(),
                       differing.size() == 1 ? "" : "s", names_list(differing)),
           json{{"tensors", differing}});
  }
  json ra = ia;
  json rb = ib;
  ra.erase("weight_map");
  rb.erase("weight_map");
  std::vector<std::string> path;
  std::vector<JsonDelta> deltas;
  json_diff(ra, rb, path, deltas);
  for (const auto& d : deltas) c.diff("index", file, "", delta_text(d, labels));
}

// Shard file sets and __metadata__.
void compare_shard_files(const Side& a, const Side& b, const Labels& labels, Collector& c) {
  std::map<std::string, const SafetensorsFile*> fa;
  std::map<std::string, const SafetensorsFile*> fb;
  for (const auto& s : a.shards) fa[s.label()] = &s;
  for (const auto& s : b.shards) fb[s.label()] = &s;
  for (const auto& [name, f] : fb) {
    if (!fa.contains(name)) {
      c.diff("missing_file", name, "",
             fmt::format("shard is in {} only ({} tensors)", labels.b, f->header().tensors.size()));
    } else if (f->header().metadata != fa[name]->header().metadata) {
      const auto meta = [](const SafetensorsFile* s) {
        return short_json(json(s->header().metadata));
      };
      c.note("metadata", name, "",
             fmt::format("__metadata__: {} in {}, {} in {}", meta(fa[name]), labels.a, meta(f),
                         labels.b));
    }
  }
  for (const auto& [name, f] : fa) {
    if (!fb.contains(name)) {
      c.diff("extra_file", name, "",
             fmt::format("shard is in {} only ({} tensors)", labels.a, f->header().tensors.size()));
    }
  }
}

bool ends_with_param(const std::string& name, const char* param) {
  const std::string suffix = std::string(".") + param;
  return name.size() > suffix.size() && name.ends_with(suffix);
}

// One tensor present on both sides: dtype, shape, then the bytes, with the
// comparison its role calls for.
void compare_tensor(const std::string& name, const Side& a, const Side& b,
                    const std::vector<GroupScheme>& groups, const Labels& labels,
                    const VerifyOptions& options, Collector& c) {
  const Ref ra = a.find(name);
  const Ref rb = b.find(name);
  const std::string& file = ra.file->label();
  if (ra.entry->dtype != rb.entry->dtype) {
    c.diff("dtype", file, name,
           fmt::format("dtype {} in {}, {} in {}", dtype_tag(ra.entry->dtype), labels.a,
                       dtype_tag(rb.entry->dtype), labels.b));
    return;
  }
  if (ra.entry->shape != rb.entry->shape) {
    c.diff("shape", file, name,
           fmt::format("shape {} in {}, {} in {}", shape_string(ra.entry->shape), labels.a,
                       shape_string(rb.entry->shape), labels.b));
    return;
  }
  ++c.report().tensors_compared;
  const DType dtype = ra.entry->dtype;
  const std::string module = module_of(name);
  bool same = true;
  if (ends_with_param(name, "weight_packed") && dtype == DType::kI32 &&
      ra.entry->shape.size() == 2) {
    const std::uint64_t words = ra.entry->shape[1];
    const auto shape = read_weight_shape(b, module);
    std::optional<int> bits = bits_from_groups(groups, module);
    if (!bits && shape) {
      for (int k = 2; k <= 8 && !bits; ++k) {
        if (packed_words_per_row((*shape)[1], k) == words) bits = k;
      }
    }
    if (bits && *bits >= 1 && *bits <= 8) {
      const std::uint64_t cols =
          shape ? std::min((*shape)[1], words * 32 / static_cast<std::uint64_t>(*bits))
                : words * 32 / static_cast<std::uint64_t>(*bits);
      same = compare_packed(ra, rb, *bits, cols, labels, options.chunk_bytes, c);
    } else {
      same = compare_elements(ra, rb, options.chunk_bytes, c, "codes");
    }
  } else if (ends_with_param(name, "weight_scale") && is_quantizable_float(dtype)) {
    same = compare_scales(ra, rb, options.scale_ulp, labels, options.chunk_bytes, c);
  } else if (ends_with_param(name, "weight_zero_point") && dtype == DType::kI32 &&
             ra.entry->shape.size() == 2) {
    const std::optional<int> bits = bits_from_groups(groups, module);
    const Ref scale = b.find(module + ".weight_scale");
    const auto shape = read_weight_shape(b, module);
    if (bits && *bits >= 1 && *bits <= 8) {
      const std::uint64_t rows = shape ? (*shape)[0]
                                 : scale && !scale.entry->shape.empty()
                                     ? scale.entry->shape[0]
                                     : ra.entry->shape[0] * 32 / static_cast<std::uint64_t>(*bits);
      same = compare_zero_points(ra, rb, *bits, rows, labels, options.chunk_bytes, c);
    } else {
      same = compare_elements(ra, rb, options.chunk_bytes, c, "zero_point");
    }
  } else {
    same = compare_elements(ra, rb, options.chunk_bytes, c);
  }
  if (same) ++c.report().tensors_identical;
}

// Tensor sets and contents (golden mode).
void compare_tensors(const Side& a, const Side& b, const Labels& labels,
                     const VerifyOptions& options, Collector& c) {
  std::vector<GroupScheme> groups = config_groups(b.config);
  if (groups.empty()) groups = config_groups(a.config);
  std::set<std::string> names;
  for (const auto& [n, w] : a.where) names.insert(n);
  for (const auto& [n, w] : b.where) names.insert(n);
  for (const auto& name : names) {
    const auto ia = a.where.find(name);
    const auto ib = b.where.find(name);
    for (const Side* side : {&a, &b}) {
      const auto it = side->where.find(name);
      if (it != side->where.end() && it->second.size() > 1) {
        std::vector<std::string> files;
        for (std::size_t s : it->second) files.push_back(side->shards[s].label());
        c.diff("duplicate_tensor", files.front(), name,
               fmt::format("{} holds it in {} shards: {}", side->label, files.size(),
                           names_list(files)));
      }
    }
    if (ia == a.where.end()) {
      c.diff("missing_tensor", b.shards[ib->second.front()].label(), name,
             fmt::format("in {} only ({} {})", labels.b, dtype_tag(b.find(name).entry->dtype),
                         shape_string(b.find(name).entry->shape)));
      continue;
    }
    if (ib == b.where.end()) {
      c.diff("extra_tensor", a.shards[ia->second.front()].label(), name,
             fmt::format("in {} only ({} {})", labels.a, dtype_tag(a.find(name).entry->dtype),
                         shape_string(a.find(name).entry->shape)));
      continue;
    }
    const std::string& fa = a.shards[ia->second.front()].label();
    const std::string& fb = b.shards[ib->second.front()].label();
    if (fa != fb) {
      c.diff("misplaced_tensor", fa, name,
             fmt::format("held by '{}' in {}, by '{}' in {}", fa, labels.a, fb, labels.b));
    }
    if (options.logger) options.logger->debug("comparing {}", name);
    compare_tensor(name, a, b, groups, labels, options, c);
  }
}

// ---------------------------------------------------------------------------
// --against-source

struct SourceScheme {
  QuantScheme scheme;
  std::vector<std::string> ignore;
  std::vector<std::string> targets;
};

SourceScheme scheme_from_config(const Side& output) {
  const auto fail = [&](const std::string& what) {
    return bad_input(
        fmt::format("{} config.json: {}; --against-source needs the pack-quantized "
                    "int quantization_config ctquant writes (section 5 of the format "
                    "spec)",
                    output.label, what));
  };
  if (!output.config_error.empty()) throw fail(output.config_error);
  if (!output.config || !output.config->is_object()) throw fail("missing");
  const auto qc = output.config->find("quantization_config");
  if (qc == output.config->end() || !qc->is_object()) throw fail("no quantization_config");
  const auto groups = qc->find("config_groups");
  if (groups == qc->end() || !groups->is_object() || groups->size() != 1) {
    throw fail("config_groups must hold exactly one group");
  }
  const json& group = groups->begin().value();
  if (!group.is_object() || !group.contains("weights") || !group["weights"].is_object()) {
    throw fail("the config group has no weights");
  }
  const json& w = group["weights"];
  SourceScheme out;
  try {
    if (w.value("type", std::string()) != "int") throw fail("weights.type is not \"int\"");
    if (group.value("format", qc->value("format", std::string())) != "pack-quantized") {
      throw fail("format is not \"pack-quantized\"");
    }
    out.scheme.name = "config";
    out.scheme.num_bits = w.at("num_bits").get<int>();
    if (out.scheme.num_bits < 2 || out.scheme.num_bits > 8) throw fail("num_bits is outside 2..8");
    out.scheme.symmetric = w.at("symmetric").get<bool>();
    const std::string strategy = w.at("strategy").get<std::string>();
    if (strategy == "channel") {
      out.scheme.group_size = 0;
    } else if (strategy == "group") {
      const auto g = w.at("group_size").get<std::int64_t>();
      if (g <= 0) throw fail("group_size is not positive");
      out.scheme.group_size = static_cast<std::uint64_t>(g);
    } else {
      throw fail(fmt::format("strategy \"{}\" is not group or channel", strategy));
    }
    for (const auto& t : group.at("targets")) out.targets.push_back(t.get<std::string>());
    if (qc->contains("ignore") && (*qc)["ignore"].is_array()) {
      for (const auto& e : (*qc)["ignore"]) out.ignore.push_back(e.get<std::string>());
    }
  } catch (const json::exception& e) {
    throw fail(fmt::format("unexpected quantization_config ({})", e.what()));
  }
  return out;
}

std::size_t element_size(DType dtype) { return static_cast<std::size_t>(dtype_bits(dtype) / 8); }

// An FP8 source weight's scale (section 6).
struct SourceFp8 {
  Ref scale;
  Fp8ScaleLayout layout;
};

// The scale of a 2-D F8_E4M3 / F8_E5M2 source weight and how it covers the
// weight (fp8_scale_layout, section 6); nullopt for other weights. Sets
// problem, and returns nullopt, when the weight is FP8 but cannot be
// dequantized: no FP8 quantization_config, no scale, or a scale of the wrong
// dtype or shape.
std::optional<SourceFp8> find_fp8_source(const Side& src, const InputQuantization& q, const Ref& w,
                                         std::string& problem) {
  const TensorEntry& we = *w.entry;
  if (!is_dequantizable_fp8(we.dtype) || we.shape.size() != 2) return std::nullopt;
  if (!q.is_fp8()) {
    problem = fmt::format(
        "source '{}' is {}, but INPUT config.json has no FP8 quantization_config to say how it "
        "is scaled",
        we.name, dtype_tag(we.dtype));
    return std::nullopt;
  }
  const std::string scale_name = module_of(we.name) + "." + std::string(q.scale_param());
  const Ref scale = src.find(scale_name);
  if (!scale) {
    problem =
        fmt::format("FP8 source '{}' has no scale '{}' ({})", we.name, scale_name, q.describe());
    return std::nullopt;
  }
  try {
    return SourceFp8{scale, fp8_scale_layout(q, we.shape[0], we.shape[1], scale.entry->dtype,
                                             scale.entry->shape)};
  } catch (const Error& e) {
    problem =
        fmt::format("scale '{}' of FP8 source '{}' ({} {}): {}", scale_name, we.name,
                    dtype_tag(scale.entry->dtype), shape_string(scale.entry->shape), e.what());
    return std::nullopt;
  }
}

// How the rows of a 2-D source weight are read: the stored rows of a BF16,
// F16 or F32 weight, or the rows of an FP8 weight dequantized to BF16 with
// dequantize_fp8_rows, exactly as quantize does (section 6), so everything
// downstream compares with the values quantize saw. Reads one chunk of rows
// (and the scale grid rows it uses) at a time.
class SourceRows {
 public:
  SourceRows(const Ref& weight, std::optional<SourceFp8> fp8)
      : w_(weight), fp8_(std::move(fp8)), cols_(weight.entry->shape[1]) {}

  // The dtype of the loaded rows: the weight's own, BF16 for FP8.
  DType dtype() const { return fp8_ ? DType::kBF16 : w_.entry->dtype; }
  std::uint64_t row_bytes() const { return cols_ * element_size(dtype()); }
  bool is_fp8() const { return fp8_.has_value(); }

  // Loads rows [row_begin, row_begin + n_rows) into out, resized to
  // n_rows * row_bytes(). For an FP8 weight the codes are read into the
  // second half of out and dequantized in place with dequantize_fp8_rows;
  // returns the index within the chunk of the first value that is not finite
  // once dequantized (out is then unspecified).
  std::optional<std::uint64_t> load(std::uint64_t row_begin, std::uint64_t n_rows,
                                    std::vector<std::byte>& out) {
    out.resize(n_rows * row_bytes());
    if (!fp8_) {
      read_part(w_, row_begin * row_bytes(), out);
      return std::nullopt;
    }
    const Fp8ScaleLayout& layout = fp8_->layout;
    const std::uint64_t n = n_rows * cols_;
    read_part(w_, row_begin * cols_, std::span<std::byte>(out.data() + n, n));
    const std::uint64_t grid_begin = layout.grid_row_begin(row_begin);
    scale_rows_.resize((layout.grid_row_end(row_begin + n_rows) - grid_begin) *
                       layout.scale_bytes_per_grid_row());
    read_part(fp8_->scale, grid_begin * layout.scale_bytes_per_grid_row(), scale_rows_);
    Fp8Rows rows;
    rows.code_dtype = w_.entry->dtype;
    rows.row_begin = row_begin;
    rows.n_rows = n_rows;
    rows.n_cols = cols_;
    rows.codes = out.data() + n;
    rows.scales = scale_rows_.data();
    rows.out = out.data();
    return dequantize_fp8_rows(layout, rows);
  }

  // Why element [row, col] is not finite, for messages: its value, or its
  // FP8 code and scale. Reads the element again.
  std::string describe(std::uint64_t row, std::uint64_t col) const {
    if (!fp8_) return "is not finite";
    std::array<std::byte, 1> code_byte{};
    read_part(w_, row * cols_ + col, code_byte);
    const auto code = std::to_integer<std::uint8_t>(code_byte[0]);
    const DType code_dtype = w_.entry->dtype;
    const float value = load_as_float(code_dtype, code_byte.data());
    if (!std::isfinite(value)) {
      return fmt::format("is code 0x{:02X}, which is {} in {}", code, value, dtype_tag(code_dtype));
    }
    const Fp8ScaleLayout& layout = fp8_->layout;
    const std::uint64_t grid_row = row / layout.block_rows;
    const std::uint64_t grid_col = col / layout.block_cols;
    const std::uint64_t scale_size = element_size(layout.dtype);
    std::array<std::byte, 4> scale_bytes{};
    read_part(fp8_->scale, (grid_row * layout.grid_cols + grid_col) * scale_size,
              std::span<std::byte>(scale_bytes.data(), scale_size));
    const float s = load_as_float(layout.dtype, scale_bytes.data());
    return fmt::format("is code 0x{:02X} ({}) times scale {} ('{}' [{}, {}]), which is {} in BF16",
                       code, value, s, fp8_->scale.entry->name, grid_row, grid_col,
                       bf16_to_float(dequantize_fp8_value(code_dtype, code, s)));
  }

 private:
  Ref w_;
  std::optional<SourceFp8> fp8_;
  std::uint64_t cols_;
  std::vector<std::byte> scale_rows_;
};

// Why an input tensor of an FP8 checkpoint is not written (section 6): the
// scale of an FP8 weight, consumed by its dequantization, or an activation or
// KV-cache parameter. nullopt for every other tensor.
std::optional<std::string> dropped_reason(const Side& src, const InputQuantization& q,
                                          const std::string& name) {
  if (!q.is_fp8()) return std::nullopt;
  const std::string module = module_of(name);
  if (module.empty()) return std::nullopt;
  const std::string param = name.substr(module.size() + 1);
  if (param == q.scale_param()) {
    const Ref w = src.find(module + ".weight");
    if (w && is_fp8(w.entry->dtype)) {
      return fmt::format("the scale of FP8 weight '{}.weight', consumed by its dequantization",
                         module);
    }
    return std::nullopt;
  }
  if (is_activation_param(param)) {
    return fmt::format("an activation or KV-cache parameter ('{}') of the FP8 INPUT", param);
  }
  return std::nullopt;
}

// An FP8 source weight written as BF16 M.weight (fate kDequantize): its
// bytes must be the exact dequantization of the source, row chunk by row
// chunk. Returns whether they are.
bool compare_dequantized(const Ref& o, SourceRows& source, const Ref& s,
                         const VerifyOptions& options, Collector& c) {
  const std::uint64_t rows = o.entry->shape[0];
  const std::uint64_t cols = o.entry->shape[1];
  const std::uint64_t row_bytes = source.row_bytes();
  if (rows == 0 || cols == 0) return true;
  const std::uint64_t step = std::max<std::uint64_t>(1, options.chunk_bytes / row_bytes);
  std::vector<std::byte> expected;
  std::vector<std::byte> actual;
  std::uint64_t n_diff = 0;
  std::optional<std::uint64_t> first;
  float first_a = 0;
  float first_b = 0;
  double max_abs = 0;
  for (std::uint64_t r0 = 0; r0 < rows; r0 += step) {
    const std::uint64_t n = std::min(step, rows - r0);
    if (const auto bad = source.load(r0, n, expected)) {
      const std::uint64_t row = r0 + *bad / cols;
      const std::uint64_t col = *bad % cols;
      c.diff("source", s.file->label(), s.entry->name,
             fmt::format("source element [{}, {}] {}; it cannot have been dequantized (section 6)",
                         row, col, source.describe(row, col)));
      return false;
    }
    actual.resize(expected.size());
    read_part(o, r0 * row_bytes, actual);
    if (std::memcmp(actual.data(), expected.data(), actual.size()) == 0) continue;
    for (std::uint64_t i = 0; i < n * cols; ++i) {
      if (std::memcmp(actual.data() + 2 * i, expected.data() + 2 * i, 2) == 0) continue;
      const float a = load_as_float(DType::kBF16, actual.data() + 2 * i);
      const float b = load_as_float(DType::kBF16, expected.data() + 2 * i);
      ++n_diff;
      if (!first) {
        first = r0 * cols + i;
        first_a = a;
        first_b = b;
      }
      const double d = std::fabs(static_cast<double>(a) - static_cast<double>(b));
      max_abs = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(max_abs, d);
    }
  }
  if (n_diff == 0) return true;
  c.diff("bytes", o.file->label(), o.entry->name,
         fmt::format("{} of {} elements differ from the BF16 dequantization of the FP8 source "
                     "(section 6), first at [{}, {}] (OUTPUT {:.9g}, dequantized INPUT {:.9g}); "
                     "largest absolute difference {:.6g}",
                     n_diff, rows * cols, *first / cols, *first % cols, first_a, first_b, max_abs),
         json{{"elements_differ", n_diff},
              {"elements", rows * cols},
              {"first_index", *first},
              {"first_row", *first / cols},
              {"first_column", *first % cols},
              {"max_abs_difference", max_abs}});
  return false;
}

// Checks one packed module against its source weight: the layout of its
// tensors (section 4), then its codes, scales and zero points against RTN of
// the source rows (section 3), and the error of its dequantized weight.
// Records differences; appends a ModuleCheck when the layout is right.
void check_module(const std::string& module, const Side& out, const Side& src,
                  const SourceScheme& s, const InputQuantization& q, const VerifyOptions& options,
                  Collector& c) {
  const Ref w = src.find(module + ".weight");
  const Ref packed = out.find(module + ".weight_packed");
  const std::string& file = packed.file->label();
  if (!w) {
    c.diff("source", file, packed.entry->name,
           fmt::format("the source has no '{}.weight' to compare with", module));
    return;
  }
  const TensorEntry& we = *w.entry;
  std::string fp8_problem;
  std::optional<SourceFp8> fp8 = find_fp8_source(src, q, w, fp8_problem);
  if (!fp8_problem.empty()) {
    c.diff("source", file, packed.entry->name, fp8_problem);
    return;
  }
  if (we.shape.size() != 2 || (!is_quantizable_float(we.dtype) && !fp8)) {
    c.diff("source", file, packed.entry->name,
           fmt::format("source '{}' is {} {}; --against-source compares 2-D BF16, F16 or F32 "
                       "weights, or FP8 weights with their scale",
                       we.name, dtype_tag(we.dtype), shape_string(we.shape)));
    return;
  }
  SourceRows source_rows(w, std::move(fp8));
  const DType loaded = source_rows.dtype();  // of the values quantize saw
  const std::uint64_t rows = we.shape[0];
  const std::uint64_t cols = we.shape[1];
  if (rows == 0 || cols == 0) {
    c.diff("layout", file, packed.entry->name,
           fmt::format("source '{}' is empty ({}); quantize never packs an empty weight", we.name,
                       shape_string(we.shape)));
    return;
  }
  const QuantScheme& scheme = s.scheme;
  const std::uint64_t g_size = scheme.effective_group_size(cols);
  const std::uint64_t n_groups = cols % g_size == 0 ? cols / g_size : 0;
  const std::uint64_t words = packed_words_per_row(cols, scheme.num_bits);
  const Ref scale = out.find(module + ".weight_scale");
  const Ref shape = out.find(module + ".weight_shape");
  const Ref zp = out.find(module + ".weight_zero_point");
  const std::uint64_t zp_rows = packed_words_per_row(rows, scheme.num_bits);
  // Section 4: the layout of the module's tensors.
  std::vector<std::string> layout;
  const auto expect = [&](const Ref& r, const std::string& suffix, DType dtype,
                          std::vector<std::uint64_t> dims) {
    if (!r) {
      layout.push_back(fmt::format("'{}.{}' is missing", module, suffix));
    } else if (r.entry->dtype != dtype || r.entry->shape != dims) {
      layout.push_back(fmt::format("'{}.{}' is {} {}, expected {} {}", module, suffix,
                                   dtype_tag(r.entry->dtype), shape_string(r.entry->shape),
                                   dtype_tag(dtype), shape_string(dims)));
    }
  };
  if (n_groups == 0)
    layout.push_back(
        fmt::format("in_features {} is not a multiple of the group size {}", cols, g_size));
  expect(packed, "weight_packed", DType::kI32, {rows, words});
  expect(scale, "weight_scale", loaded, {rows, n_groups});
  expect(shape, "weight_shape", DType::kI64, {2});
  if (!scheme.symmetric) expect(zp, "weight_zero_point", DType::kI32, {zp_rows, n_groups});
  if (layout.empty()) {
    const auto stored = read_weight_shape(out, module);
    if (!stored || (*stored)[0] != rows || (*stored)[1] != cols) {
      layout.push_back(fmt::format("'{}.weight_shape' does not hold [{}, {}]", module, rows, cols));
    }
  }
  if (!layout.empty()) {
    std::string message;
    for (const auto& l : layout) message += (message.empty() ? "" : "; ") + l;
    c.diff("layout", file, packed.entry->name, message + " (section 4 of the format spec)");
    return;
  }

  ModuleCheck m;
  m.module = module;
  m.rows = rows;
  m.cols = cols;
  m.groups = rows * n_groups;
  m.fp8_source = source_rows.is_fp8();
  std::vector<std::int8_t> z_stored;
  if (!scheme.symmetric) {
    if (zp.entry->byte_size() > kMaxWholeReadBytes) {
      throw bad_input(fmt::format("{}: '{}' is {} bytes, more than --against-source reads",
                                  zp.file->label(), zp.entry->name, zp.entry->byte_size()));
    }
    z_stored = unpack_zero_points(read_whole(zp), zp_rows, n_groups, rows, scheme.num_bits);
  }
  const std::size_t esize = element_size(loaded);
  const std::uint64_t row_bytes = source_rows.row_bytes();
  const std::uint64_t step = std::max<std::uint64_t>(1, options.chunk_bytes / row_bytes);
  std::vector<std::byte> src_rows;
  std::vector<std::byte> packed_bytes;
  std::vector<std::byte> scale_bytes;
  std::vector<std::uint32_t> ref_packed;
  std::vector<std::byte> ref_scale;
  std::vector<std::int8_t> ref_zp;
  std::vector<std::int8_t> codes(cols);
  std::vector<std::int8_t> ref_codes(cols);
  double sum_err2 = 0;
  double sum_w2 = 0;
  std::uint64_t accepted_scales = 0;
  std::uint64_t max_scale_ulp = 0;
  for (std::uint64_t r0 = 0; r0 < rows; r0 += step) {
    const std::uint64_t n = std::min(step, rows - r0);
    packed_bytes.resize(n * words * 4);
    scale_bytes.resize(n * n_groups * esize);
    ref_packed.assign(n * words, 0);
    ref_scale.assign(n * n_groups * esize, std::byte{0});
    ref_zp.assign(n * n_groups, 0);
    if (const auto bad = source_rows.load(r0, n, src_rows)) {
      const std::uint64_t row = r0 + *bad / cols;
      const std::uint64_t col = *bad % cols;
      c.diff("source", w.file->label(), we.name,
             fmt::format("source element [{}, {}] {}; it cannot have been quantized", row, col,
                         source_rows.describe(row, col)));
      return;
    }
    read_part(packed, r0 * words * 4, packed_bytes);
    read_part(scale, r0 * n_groups * esize, scale_bytes);
    const KernelBlock block{loaded,
                            n,
                            cols,
                            src_rows.data(),
                            ref_packed.data(),
                            ref_scale.data(),
                            scheme.symmetric ? nullptr : ref_zp.data()};
    if (const auto bad = quantize_block_ref(scheme, block)) {
      c.diff("source", w.file->label(), we.name,
             fmt::format("source value at row {}, column {} is not finite; it cannot have been "
                         "quantized",
                         r0 + *bad / cols, *bad % cols));
      return;
    }
    const std::vector<std::uint32_t> stored_words = as_words(packed_bytes);
    for (std::uint64_t r = 0; r < n; ++r) {
      unpack_codes(std::span<const std::uint32_t>(stored_words).subspan(r * words, words),
                   scheme.num_bits, codes);
      unpack_codes(std::span<const std::uint32_t>(ref_packed).subspan(r * words, words),
                   scheme.num_bits, ref_codes);
      const std::byte* row = src_rows.data() + r * row_bytes;
      for (std::uint64_t g = 0; g < n_groups; ++g) {
        const std::uint64_t at = r * n_groups + g;
        const std::uint32_t s_bits = load_bits(loaded, scale_bytes.data() + at * esize);
        const std::uint32_t ref_bits = load_bits(loaded, ref_scale.data() + at * esize);
        const float s_val = load_as_float(loaded, scale_bytes.data() + at * esize);
        const int z = scheme.symmetric ? 0 : z_stored[(r0 + r) * n_groups + g];
        const int z_ref = scheme.symmetric ? 0 : ref_zp[at];
        bool codes_ok = z == z_ref;
        std::optional<std::uint64_t> first_col;  // first code of the group that is not RTN's
        for (std::uint64_t col = g * g_size; col < (g + 1) * g_size; ++col) {
          if (codes[col] != ref_codes[col]) {
            codes_ok = false;
            if (!first_col) first_col = col;
          }
          const float source = load_as_float(loaded, row + col * esize);
          const float dequant = static_cast<float>(codes[col] - z) * s_val;
          const double err = static_cast<double>(source) - static_cast<double>(dequant);
          sum_err2 += err * err;
          sum_w2 += static_cast<double>(source) * static_cast<double>(source);
          m.max_abs_error = std::max(m.max_abs_error, std::fabs(err));
        }
        bool scale_ok = s_bits == ref_bits;
        if (!scale_ok) {
          const std::uint64_t d = ulp_distance(loaded, s_bits, ref_bits);
          max_scale_ulp = std::max(max_scale_ulp, d);
          if (d <= options.scale_ulp) {
            scale_ok = true;
            ++accepted_scales;
          }
        }
        if (!codes_ok || !scale_ok) {
          ++m.groups_mismatched;
          if (!m.first_row) {
            m.first_row = r0 + r;
            m.first_group = g;
            m.first_column = first_col;
          }
        }
      }
    }
  }
  m.rel_frobenius = sum_w2 > 0 ? std::sqrt(sum_err2 / sum_w2)
                               : (sum_err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  if (m.groups_mismatched > 0) {
    json details = {{"groups_mismatched", m.groups_mismatched},
                    {"groups", m.groups},
                    {"first_row", *m.first_row},
                    {"first_group", *m.first_group},
                    {"first_column", m.first_column ? json(*m.first_column) : json(nullptr)}};
    if (source_rows.is_fp8()) details["source"] = "dequantized FP8";
    c.diff("codes", file, packed.entry->name,
           fmt::format("{} of {} groups are not the RTN codes of the {}source (codes, scale or "
                       "zero point differ), first at row {}, {}",
                       m.groups_mismatched, m.groups,
                       source_rows.is_fp8() ? "dequantized FP8 " : "", *m.first_row,
                       m.first_column
                           ? fmt::format("column {} (group {})", *m.first_column, *m.first_group)
                           : fmt::format("group {} (its scale or zero point)", *m.first_group)),
           std::move(details));
  }
  if (accepted_scales > 0) {
    c.note("scale", file, module + ".weight_scale",
           fmt::format("{} scale values differ from RTN by at most {} ulp; accepted by "
                       "--scale-ulp {}",
                       accepted_scales, max_scale_ulp, options.scale_ulp));
  }
  c.report().modules.push_back(m);
}

}  // namespace

VerifyReport verify_checkpoints(const fs::path& output, const fs::path& golden,
                                const VerifyOptions& options) {
  VerifyReport report;
  report.mode = VerifyMode::kGolden;
  report.output = output.string();
  report.reference = golden.string();
  const Side a = open_side(output, "OUTPUT");
  const Side b = open_side(golden, "GOLDEN");
  report.tensors_output = a.n_tensors();
  report.tensors_reference = b.n_tensors();
  Collector c(report);
  const Labels labels{"OUTPUT", "GOLDEN"};
  compare_shard_files(a, b, labels, c);
  compare_tensors(a, b, labels, options, c);
  check_index(a, c);
  check_index(b, c);
  compare_indexes(a, b, labels, c);
  compare_configs(a, b, labels, /*compare_qc=*/true, c);
  compare_other_files(a, b, labels, c);
  return report;
}

VerifyReport verify_against_source(const fs::path& output, const fs::path& input,
                                   const VerifyOptions& options) {
  VerifyReport report;
  report.mode = VerifyMode::kAgainstSource;
  report.output = output.string();
  report.reference = input.string();
  const Side out = open_side(output, "OUTPUT");
  const Side src = open_side(input, "INPUT");
  // Section 6: the kinds of input quantize converts, and only those.
  InputQuantization q;
  try {
    q = classify_input_quantization(src.config);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("--against-source: INPUT {}", e.what()));
  }
  report.input_quantization = q.describe();
  const SourceScheme scheme = scheme_from_config(out);
  report.tensors_output = out.n_tensors();
  report.tensors_reference = src.n_tensors();
  Collector c(report);
  const Labels labels{"OUTPUT", "INPUT"};

  // Section 5: same shard files, each holding the outputs of its input shard.
  compare_shard_files(out, src, labels, c);
  check_index(out, c);
  if (out.has_index != src.has_index) {
    c.diff(out.has_index ? "extra_file" : "missing_file", kIndexFileName, "",
           fmt::format("{} is in {} only (section 5: an index is written when the input has one)",
                       kIndexFileName, out.has_index ? "OUTPUT" : "INPUT"));
  }
  compare_configs(out, src, labels, /*compare_qc=*/false, c);
  compare_other_files(out, src, labels, c);

  // Modules OUTPUT holds packed, in OUTPUT order.
  std::vector<std::string> packed_modules;
  std::set<std::string> packed_set;
  for (const auto& shard : out.shards) {
    for (const TensorEntry& t : shard.header().tensors) {
      if (ends_with_param(t.name, "weight_packed")) {
        packed_modules.push_back(module_of(t.name));
        packed_set.insert(module_of(t.name));
      }
    }
  }

  // Section 2: the fate config.json's ignore list and targets give each
  // module must be the one OUTPUT holds.
  try {
    // Read-only: links out of the directory (a cache snapshot) are followed.
    const Checkpoint checkpoint = open_checkpoint(input, OpenOptions{.follow_links_outside = true});
    PlanOptions plan_options;
    plan_options.scheme = scheme.scheme;
    plan_options.ignore = scheme.ignore;
    plan_options.targets = scheme.targets;
    const QuantizePlan plan = make_plan(checkpoint, plan_options);
    for (const TensorDecision& d : plan.decisions) {
      const bool expected = d.fate == Fate::kQuantize;
      const bool actual = packed_set.contains(d.module) && d.name == d.module + ".weight";
      if (expected && !actual) {
        c.diff("fate", checkpoint.shards[d.source.shard].label(), d.name,
               fmt::format("config.json's ignore list and targets select '{}' ({}), so vLLM will "
                           "expect '{}.weight_packed', but OUTPUT does not hold it packed",
                           d.module, d.rule, d.module));
      } else if (!expected && actual) {
        c.diff("fate", checkpoint.shards[d.source.shard].label(), d.name,
               fmt::format("OUTPUT holds '{}' packed, but config.json's ignore list and targets "
                           "leave it unquantized ({}), so vLLM will look for '{}.weight'",
                           d.module, d.rule, d.name));
      }
    }
  } catch (const Error& e) {
    c.diff("fate", "", "",
           fmt::format("cannot check fates against config.json's ignore list and targets: {}",
                       e.what()));
  }

  for (const auto& module : packed_modules) {
    if (options.logger) options.logger->debug("checking {} against the source", module);
    check_module(module, out, src, scheme, q, options, c);
  }

  // Every other tensor must be the source's, in the same shard.
  std::set<std::string> produced;
  for (const auto& m : packed_modules) {
    for (const char* p : {"weight_packed", "weight_scale", "weight_shape", "weight_zero_point"}) {
      produced.insert(m + "." + p);
    }
  }
  for (const auto& [name, shards] : out.where) {
    if (produced.contains(name)) continue;
    const Ref o = out.find(name);
    const Ref s = src.find(name);
    if (!s) {
      c.diff("extra_tensor", o.file->label(), name,
             "in OUTPUT only; the source has no such tensor");
      continue;
    }
    if (const auto dropped = dropped_reason(src, q, name)) {
      c.diff("extra_tensor", o.file->label(), name,
             fmt::format("in OUTPUT, but it is {}; section 6: it is not written", *dropped));
      continue;
    }
    if (o.file->label() != s.file->label()) {
      c.diff("misplaced_tensor", o.file->label(), name,
             fmt::format("held by '{}' in OUTPUT, by '{}' in INPUT", o.file->label(),
                         s.file->label()));
    }
    if (is_dequantizable_fp8(s.entry->dtype) && s.entry->shape.size() == 2) {
      // Section 6: an FP8 weight not quantized is written as BF16 M.weight.
      std::string problem;
      std::optional<SourceFp8> fp8 = find_fp8_source(src, q, s, problem);
      if (!problem.empty()) {
        c.diff("source", s.file->label(), name, problem);
        continue;
      }
      if (o.entry->dtype != DType::kBF16 || o.entry->shape != s.entry->shape) {
        c.diff(o.entry->dtype != DType::kBF16 ? "dtype" : "shape", o.file->label(), name,
               fmt::format("{} {} in OUTPUT; the FP8 source {} {} is written as its BF16 "
                           "dequantization, BF16 {} (section 6)",
                           dtype_tag(o.entry->dtype), shape_string(o.entry->shape),
                           dtype_tag(s.entry->dtype), shape_string(s.entry->shape),
                           shape_string(s.entry->shape)));
        continue;
      }
      ++report.tensors_compared;
      SourceRows source(s, std::move(fp8));
      if (compare_dequantized(o, source, s, options, c)) ++report.tensors_identical;
      continue;
    }
    if (o.entry->dtype != s.entry->dtype || o.entry->shape != s.entry->shape) {
      c.diff(o.entry->dtype != s.entry->dtype ? "dtype" : "shape", o.file->label(), name,
             fmt::format("{} {} in OUTPUT, {} {} in INPUT", dtype_tag(o.entry->dtype),
                         shape_string(o.entry->shape), dtype_tag(s.entry->dtype),
                         shape_string(s.entry->shape)));
      continue;
    }
    ++report.tensors_compared;
    if (compare_elements(o, s, options.chunk_bytes, c)) ++report.tensors_identical;
  }
  for (const auto& [name, shards] : src.where) {
    if (out.where.contains(name)) continue;
    if (packed_set.contains(module_of(name)) && ends_with_param(name, "weight")) continue;
    if (dropped_reason(src, q, name)) continue;
    const Ref s = src.find(name);
    c.diff("missing_tensor", s.file->label(), name,
           fmt::format("in INPUT only ({} {}): OUTPUT neither {} nor quantizes it",
                       dtype_tag(s.entry->dtype), shape_string(s.entry->shape),
                       is_fp8(s.entry->dtype) ? "dequantizes" : "copies"));
  }
  // Packed modules whose shard is not the source weight's shard.
  for (const auto& module : packed_modules) {
    const Ref p = out.find(module + ".weight_packed");
    const Ref s = src.find(module + ".weight");
    if (s && p.file->label() != s.file->label()) {
      c.diff("misplaced_tensor", p.file->label(), p.entry->name,
             fmt::format("held by '{}', but the source weight is in '{}'", p.file->label(),
                         s.file->label()));
    }
  }
  return report;
}

// ---------------------------------------------------------------------------
// Rendering.

namespace {

void render_items(std::string& text, const char* title, const std::vector<VerifyItem>& items,
                  std::size_t max_listed) {
  if (items.empty()) return;
  text += fmt::format("{} ({}):\n", title, items.size());
  std::map<std::string, std::size_t> shown;
  std::map<std::string, std::size_t> hidden;
  std::size_t width = 0;
  for (const auto& item : items) width = std::max(width, item.kind.size());
  for (const auto& item : items) {
    if (shown[item.kind] >= max_listed) {
      ++hidden[item.kind];
      continue;
    }
    ++shown[item.kind];
    std::string where = item.file;
    if (!item.tensor.empty()) where += (where.empty() ? "" : ": ") + item.tensor;
    text += fmt::format("  {:<{}}  {}{}{}\n", item.kind, width, where, where.empty() ? "" : ": ",
                        item.message);
  }
  for (const auto& [kind, n] : hidden) {
    text += fmt::format("  ... and {} more {} (see --json)\n", n, kind);
  }
}

// Per shard file: tensors missing, extra and misplaced (files with none omitted).
std::map<std::string, std::array<std::size_t, 3>> per_file_sets(const VerifyReport& report) {
  std::map<std::string, std::array<std::size_t, 3>> out;
  for (const auto& d : report.differences) {
    const int at = d.kind == "missing_tensor"     ? 0
                   : d.kind == "extra_tensor"     ? 1
                   : d.kind == "misplaced_tensor" ? 2
                                                  : -1;
    if (at >= 0) ++out[d.file][static_cast<std::size_t>(at)];
  }
  return out;
}

json item_json(const VerifyItem& item) {
  return json{{"kind", item.kind},
              {"file", item.file},
              {"tensor", item.tensor},
              {"message", item.message},
              {"details", item.details}};
}

}  // namespace

std::string render_verify_text(const VerifyReport& report, std::size_t max_listed) {
  const bool golden = report.mode == VerifyMode::kGolden;
  const char* ref = golden ? "GOLDEN" : "INPUT";
  std::string text =
      fmt::format("verify{}: OUTPUT {} against {} {}\n", golden ? "" : " --against-source",
                  report.output, ref, report.reference);
  std::map<std::string, std::size_t> kinds;
  for (const auto& d : report.differences) ++kinds[d.kind];
  text += fmt::format(
      "tensors: {} in OUTPUT, {} in {}; {} compared, {} identical; {} missing, {} extra\n",
      report.tensors_output, report.tensors_reference, ref, report.tensors_compared,
      report.tensors_identical, kinds["missing_tensor"], kinds["extra_tensor"]);
  for (const auto& [file, counts] : per_file_sets(report)) {
    text += fmt::format("  {}: {} missing, {} extra, {} misplaced\n", file, counts[0], counts[1],
                        counts[2]);
  }
  if (!report.input_quantization.empty() &&
      report.input_quantization != InputQuantization{}.describe()) {
    text += fmt::format("INPUT: {}; FP8 weights compared as their BF16 dequantization\n",
                        report.input_quantization);
  }
  if (report.files_compared > 0) {
    text +=
        fmt::format("other files: {} compared, {} differ\n", report.files_compared, kinds["file"]);
  }
  if (!golden && !report.modules.empty()) {
    std::size_t width = 6;
    for (const auto& m : report.modules) width = std::max(width, m.module.size());
    text += fmt::format("modules ({}):\n  {:<{}}  {:>14}  {:>9}  {:>9}  {:>11}  {:>11}\n",
                        report.modules.size(), "MODULE", width, "SHAPE", "GROUPS", "MISMATCH",
                        "REL_FROB", "MAX_ABS");
    for (const auto& m : report.modules) {
      text += fmt::format("  {:<{}}  {:>14}  {:>9}  {:>9}  {:>11.4e}  {:>11.4e}\n", m.module, width,
                          fmt::format("[{}, {}]", m.rows, m.cols), m.groups, m.groups_mismatched,
                          m.rel_frobenius, m.max_abs_error);
    }
  }
  render_items(text, "differences", report.differences, max_listed);
  render_items(text, "notes", report.notes, max_listed);
  if (report.same()) {
    text += fmt::format("result: SAME ({} note{})\n", report.notes.size(),
                        report.notes.size() == 1 ? "" : "s");
  } else {
    text += fmt::format("result: DIFFERENT ({} difference{}, {} note{})\n",
                        report.differences.size(), report.differences.size() == 1 ? "" : "s",
                        report.notes.size(), report.notes.size() == 1 ? "" : "s");
  }
  return text;
}

json verify_json(const VerifyReport& report) {
  json differences = json::array();
  for (const auto& d : report.differences) differences.push_back(item_json(d));
  json notes = json::array();
  for (const auto& n : report.notes) notes.push_back(item_json(n));
  json per_file = json::object();
  for (const auto& [file, counts] : per_file_sets(report)) {
    per_file[file] = json{{"missing", counts[0]}, {"extra", counts[1]}, {"misplaced", counts[2]}};
  }
  json modules = json::array();
  for (const auto& m : report.modules) {
    modules.push_back(json{
        {"module", m.module},
        {"shape", {m.rows, m.cols}},
        {"groups", m.groups},
        {"groups_mismatched", m.groups_mismatched},
        {"first_row", m.first_row ? json(*m.first_row) : json(nullptr)},
        {"first_group", m.first_group ? json(*m.first_group) : json(nullptr)},
        {"first_column", m.first_column ? json(*m.first_column) : json(nullptr)},
        {"fp8_source", m.fp8_source},
        {"rel_frobenius", std::isfinite(m.rel_frobenius) ? json(m.rel_frobenius) : json(nullptr)},
        {"max_abs_error", std::isfinite(m.max_abs_error) ? json(m.max_abs_error) : json(nullptr)}});
  }
  return json{{"mode", report.mode == VerifyMode::kGolden ? "golden" : "against-source"},
              {"output", report.output},
              {"reference", report.reference},
              {"input_quantization",
               report.input_quantization.empty() ? json(nullptr) : json(report.input_quantization)},
              {"same", report.same()},
              {"summary",
               {{"tensors_output", report.tensors_output},
                {"tensors_reference", report.tensors_reference},
                {"tensors_compared", report.tensors_compared},
                {"tensors_identical", report.tensors_identical},
                {"files_compared", report.files_compared},
                {"differences", report.differences.size()},
                {"notes", report.notes.size()},
                {"tensor_sets_per_file", per_file}}},
              {"differences", differences},
              {"notes", notes},
              {"modules", modules}};
}

}  // namespace ctquant
