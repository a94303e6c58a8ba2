// Rendering verify reports as text and JSON.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "ctquant/source/fp8.hpp"
#include "ctquant/verify/verify.hpp"

namespace ctquant {

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
    // A converted input (AWQ, ModelOpt) is described by its converter: its
    // modules are compared dequantized on both sides.
    const bool fp8 = report.input_quantization.find("FP8") != std::string::npos &&
                     report.input_quantization.find("NVFP4") == std::string::npos &&
                     report.input_quantization.find("AWQ") == std::string::npos;
    text += fmt::format("INPUT: {}; {}\n", report.input_quantization,
                        fp8 ? "FP8 weights compared as their BF16 dequantization"
                            : "its quantized modules compared as their dequantization");
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
