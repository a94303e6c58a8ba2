#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/pack.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "util/input_file.hpp"
#include "verify/side.hpp"

namespace ctquant::detail {

namespace fs = std::filesystem;
using nlohmann::json;

// Any tensor: elements compared bit for bit; float elements also report the
// largest absolute difference.
bool compare_elements(const Ref& a, const Ref& b, std::uint64_t chunk_bytes, Collector& c,
                      const std::string& kind) {
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

namespace {

// One bit per differing code of a word pair's XOR d, at the code's lowest
// bit, for codes of `bits` bits that tile a 32-bit word (1, 2, 4 or 8).
std::uint32_t differing_codes(std::uint32_t d, int bits) {
  std::uint32_t any = d;
  for (int k = 1; k < bits; k *= 2) any |= any >> k;
  const std::uint32_t low_bits = bits == 1   ? 0xFFFFFFFFu
                                 : bits == 2 ? 0x55555555u
                                 : bits == 4 ? 0x11111111u
                                             : 0x01010101u;
  return any & low_bits;
}

}  // namespace

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
          bool codes_differ = false;
          if (32 % num_bits == 0) {
            // Codes tile the words: count the differing ones word by word
            // (the codes past the last column are padding).
            const std::uint64_t per_word = 32 / static_cast<std::uint64_t>(num_bits);
            const std::uint32_t code_mask = (1u << num_bits) - 1u;
            for (std::uint64_t w = 0; w * per_word < n_cols; ++w) {
              std::uint32_t wa = 0;
              std::uint32_t wb = 0;
              std::memcpy(&wa, xr.data() + 4 * w, 4);
              std::memcpy(&wb, yr.data() + 4 * w, 4);
              std::uint32_t marks = differing_codes(wa ^ wb, num_bits);
              const std::uint64_t in_word = std::min(per_word, n_cols - w * per_word);
              if (in_word < per_word) marks &= (1u << (in_word * num_bits)) - 1u;
              if (marks == 0) continue;
              codes_differ = true;
              n_diff += static_cast<std::uint64_t>(std::popcount(marks));
              if (!first) {
                const int shift = std::countr_zero(marks);
                const int offset = 1 << (num_bits - 1);
                first = {first_row + r,
                         w * per_word + static_cast<std::uint64_t>(shift / num_bits)};
                first_a = static_cast<int>((wa >> shift) & code_mask) - offset;
                first_b = static_cast<int>((wb >> shift) & code_mask) - offset;
              }
            }
          } else {
            unpack_codes(as_words(xr), num_bits, ca);
            unpack_codes(as_words(yr), num_bits, cb);
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

GroupSchemes config_groups(const std::optional<json>& config) {
  GroupSchemes out;
  if (!config || !config->is_object()) return out;
  const auto qc = config->find("quantization_config");
  if (qc == config->end() || !qc->is_object()) return out;
  const auto groups = qc->find("config_groups");
  if (groups == qc->end() || !groups->is_object()) return out;
  std::vector<std::vector<std::string>> targets;
  std::vector<std::string> names;
  for (const auto& [name, group] : groups->items()) {
    if (!group.is_object()) continue;
    std::vector<std::string> listed;
    if (const auto t = group.find("targets"); t != group.end() && t->is_array()) {
      for (const auto& e : *t) {
        if (e.is_string()) listed.push_back(e.get<std::string>());
      }
    }
    const auto w = group.find("weights");
    out.weights.push_back(w != group.end() && w->is_object() ? *w : json());
    targets.push_back(std::move(listed));
    names.push_back(name);
  }
  if (names.empty()) return out;
  try {
    out.targets.emplace(targets, names);
  } catch (const Error&) {
    // A target that does not compile: no module's group is known here
    // (loadability reports the targets).
  }
  return out;
}

std::optional<int> bits_from_groups(const GroupSchemes& groups, const std::string& module) {
  if (!groups.targets) return std::nullopt;
  GroupResolution r;
  try {
    r = groups.targets->resolve(module);
  } catch (const Error&) {
    return std::nullopt;
  }
  const std::optional<std::size_t> g = r.vllm ? r.vllm : r.compressed_tensors;
  if (!g) return std::nullopt;
  const json& weights = groups.weights[*g];
  const auto it = weights.find("num_bits");
  if (it != weights.end() && it->is_number_integer()) {
    const int bits = it->get<int>();
    if (bits >= 1 && bits <= 32) return bits;
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
    // What quantize adds: the quantization_config, and the record of a
    // --transform (ctquant_transform), which --against-source plans with.
    // A rewritten source (rotate) holds the record too: then it must agree.
    const bool both_record = ca.is_object() && cb.is_object() &&
                             ca.contains("ctquant_transform") && cb.contains("ctquant_transform");
    for (json* cfg : {&ca, &cb}) {
      if (!cfg->is_object()) continue;
      cfg->erase("quantization_config");
      if (!both_record) cfg->erase("ctquant_transform");
    }
  } else if (ca.is_object() && cb.is_object() && ca.contains("quantization_config") &&
             cb.contains("quantization_config") && ca["quantization_config"].is_object() &&
             cb["quantization_config"].is_object() &&
             ca["quantization_config"].contains("config_groups") &&
             cb["quantization_config"].contains("config_groups")) {
    // Config group names are not read by anyone: pair groups by content.
    json& ga = ca["quantization_config"]["config_groups"];
    const json& gb = cb["quantization_config"]["config_groups"];
    if (ga.is_object() && gb.is_object() && ga.size() == gb.size() && ga != gb) {
      std::vector<std::string> na;
      std::vector<std::string> nb;
      for (const auto& [k, v] : ga.items()) na.push_back(k);
      for (const auto& [k, v] : gb.items()) nb.push_back(k);
      if (na != nb) {
        // Pair each reference group with the output group that equals it,
        // else with the one of the same targets, else in name order: a
        // converter's group and a new scheme's are named differently by
        // ctquant and model_free_ptq (docs/converters.md).
        std::vector<std::size_t> pair_of(nb.size(), na.size());
        std::vector<bool> taken(na.size(), false);
        const auto pair_by = [&](const auto& same) {
          for (std::size_t j = 0; j < nb.size(); ++j) {
            for (std::size_t i = 0; i < na.size() && pair_of[j] == na.size(); ++i) {
              if (!taken[i] && same(ga[na[i]], gb[nb[j]])) {
                pair_of[j] = i;
                taken[i] = true;
              }
            }
          }
        };
        pair_by([](const json& x, const json& y) { return x == y; });
        pair_by([](const json& x, const json& y) {
          return x.is_object() && y.is_object() && x.contains("targets") && y.contains("targets") &&
                 x["targets"] == y["targets"];
        });
        pair_by([](const json&, const json&) { return true; });
        json renamed = json::object();
        for (std::size_t j = 0; j < nb.size(); ++j) renamed[nb[j]] = ga[na[pair_of[j]]];
        ga = renamed;
        c.note("config", file, "",
               fmt::format("quantization_config.config_groups names: {} in {}, {} in {}",
                           join(na, kMaxNamesInMessage), labels.a, join(nb, kMaxNamesInMessage),
                           labels.b));
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
    std::string not_json;  // why the two files were not compared as JSON
    if (name.ends_with(".json")) {
      try {
        // The JSON reader's bounds (nesting, repeated keys) hold here too.
        const json ja = parse_json_file_text(ta, fmt::format("{} of {}", name, labels.a), true);
        const json jb = parse_json_file_text(tb, fmt::format("{} of {}", name, labels.b), true);
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
                           deltas.size() == 1 ? "" : "s", join(texts, 3)),
               json{{"json_differences", deltas.size()}});
        continue;
      } catch (const Error& e) {
        // Not JSON within the reader's bounds on one side: compare as bytes.
        if (e.kind() != ErrorKind::kBadInput) throw;
        not_json = fmt::format("; not compared as JSON: {}", e.what());
      }
    }
    std::size_t at = 0;
    while (at < ta.size() && at < tb.size() && ta[at] == tb[at]) ++at;
    c.diff("file", name, "",
           fmt::format("bytes differ from offset {} ({} bytes in {}, {} in {}){}", at, ta.size(),
                       labels.a, tb.size(), labels.b, not_json),
           json{{"first_offset", at}});
  }
}

// The index of one side against that side's own shards.
void check_index_entries(const Side& side, Collector& c) {
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

void check_alignment(const Side& side, Collector& c) {
  constexpr std::size_t kMaxListed = 20;
  std::size_t misaligned = 0;
  for (const SafetensorsFile& shard : side.shards) {
    const std::uint64_t data_start = shard.header().data_start;
    for (const TensorEntry& t : shard.header().tensors) {
      const int bits = dtype_bits(t.dtype);
      if (bits < 8 || bits % 8 != 0 || t.byte_size() == 0) continue;
      const std::uint64_t item = static_cast<std::uint64_t>(bits) / 8;
      const std::uint64_t at = data_start + t.begin;
      if (at % item == 0) continue;
      if (++misaligned > kMaxListed) continue;
      c.diff("alignment", shard.label(), t.name,
             fmt::format("{}: its data starts at byte {} of the file (offset {} of the data "
                         "buffer), not a multiple of its element size ({} bytes for {}); the "
                         "safetensors writer aligns every tensor (section 5 of the format spec, "
                         "docs/format.md) and readers that map the file need it",
                         side.label, at, t.begin, item, dtype_tag(t.dtype)),
             json{{"file_offset", at}, {"element_bytes", item}});
    }
  }
  if (misaligned > kMaxListed) {
    c.diff("alignment", "", "",
           fmt::format("{}: {} more tensors are not aligned to their element size", side.label,
                       misaligned - kMaxListed));
  }
}

bool check_index(const Side& side, Collector& c) {
  const std::size_t before = c.report().differences.size();
  check_index_entries(side, c);
  return c.report().differences.size() == before;
}

// The two indexes against each other (golden mode).
void compare_indexes(const Side& a, const Side& b, const Labels& labels, bool placement_is_note,
                     Collector& c) {
  const std::string file = kIndexFileName;
  if (a.has_index != b.has_index) {
    // A single-file checkpoint loads the same with or without an index
    // (model_free_ptq always writes one, schemes.md 1 step 8).
    const Side& without = a.has_index ? b : a;
    const std::string text =
        fmt::format("{} is in {} only", file, a.has_index ? labels.a : labels.b);
    if (without.shards.size() == 1 && placement_is_note) {
      c.note("index", file, "", text + "; a single-shard checkpoint loads the same either way");
    } else {
      c.diff(a.has_index ? "extra_file" : "missing_file", file, "", text);
    }
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
    // Tensors held by other shards, with both indexes consistent with
    // their shards, load the same: a note.
    const bool placement_only =
        placement_is_note && std::all_of(differing.begin(), differing.end(), [&](const auto& k) {
          return wa.contains(k) && wb.contains(k);
        });
    const std::string text =
        fmt::format("weight_map differs for {} tensor{}: {}", differing.size(),
                    differing.size() == 1 ? "" : "s", join(differing, kMaxNamesInMessage));
    if (placement_only) {
      c.note("index", file, "",
             text +
                 " (held by other shards; both indexes agree with their "
                 "shards)",
             json{{"tensors", differing}});
    } else {
      c.diff("index", file, "", text, json{{"tensors", differing}});
    }
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

}  // namespace ctquant::detail
