// verify_checkpoints: OUTPUT against a golden checkpoint.
#include <fmt/format.h>

#include "ctquant/scheme/kernel.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/verify/loadability.hpp"
#include "ctquant/util/text.hpp"
#include "util/ordered_parallel.hpp"
#include "verify/side.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace detail;

namespace {

// One tensor present on both sides: dtype, shape, then the bytes, with the
// comparison its role calls for.
void compare_tensor(const std::string& name, const Side& a, const Side& b,
                    const GroupSchemes& groups, const Labels& labels,
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

// The set differences of one tensor name: held twice, on one side only, or
// by another shard.
void list_tensor(const std::string& name, const Side& a, const Side& b, const Labels& labels,
                 bool placement_is_note, const VerifyOptions& options, Collector& c) {
  const auto ia = a.where.find(name);
  const auto ib = b.where.find(name);
  for (const Side* side : {&a, &b}) {
    const auto it = side->where.find(name);
    if (it != side->where.end() && it->second.size() > 1) {
      std::vector<std::string> files;
      for (std::size_t s : it->second) files.push_back(side->shards[s].label());
      c.diff("duplicate_tensor", files.front(), name,
             fmt::format("{} holds it in {} shards: {}", side->label, files.size(),
                         join(files, kMaxNamesInMessage)));
    }
  }
  if (ia == a.where.end()) {
    c.diff("missing_tensor", b.shards[ib->second.front()].label(), name,
           fmt::format("in {} only ({} {})", labels.b, dtype_tag(b.find(name).entry->dtype),
                       shape_string(b.find(name).entry->shape)));
    return;
  }
  if (ib == b.where.end()) {
    c.diff("extra_tensor", a.shards[ia->second.front()].label(), name,
           fmt::format("in {} only ({} {})", labels.a, dtype_tag(a.find(name).entry->dtype),
                       shape_string(a.find(name).entry->shape)));
    return;
  }
  const std::string& fa = a.shards[ia->second.front()].label();
  const std::string& fb = b.shards[ib->second.front()].label();
  if (fa != fb) {
    // Both indexes consistent with their shards: it loads the same.
    const std::string text =
        fmt::format("held by '{}' in {}, by '{}' in {}", fa, labels.a, fb, labels.b);
    if (placement_is_note) {
      c.note("misplaced_tensor", fa, name, text);
    } else {
      c.diff("misplaced_tensor", fa, name, text);
    }
  }
  if (options.logger) options.logger->debug("comparing {}", name);
}

// Tensor sets and contents (golden mode). The contents of the tensors
// present on both sides are compared on options.threads threads, each
// tensor's findings merged in name order after the set differences before
// it, so the report does not depend on the thread count.
void compare_tensors(const Side& a, const Side& b, const Labels& labels,
                     const VerifyOptions& options, bool placement_is_note, Collector& c) {
  GroupSchemes groups = config_groups(b.config);
  if (!groups.targets) groups = config_groups(a.config);
  std::set<std::string> name_set;
  for (const auto& [n, w] : a.where) name_set.insert(n);
  for (const auto& [n, w] : b.where) name_set.insert(n);
  const std::vector<std::string> names(name_set.begin(), name_set.end());
  const auto on_both = [&](const std::string& name) {
    return a.where.contains(name) && b.where.contains(name);
  };
  ordered_parallel<VerifyReport>(
      names.size(), verify_threads(options),
      [&](std::size_t i, unsigned) {
        VerifyReport part;
        if (on_both(names[i])) {
          Collector pc(part);
          compare_tensor(names[i], a, b, groups, labels, options, pc);
        }
        return part;
      },
      [&](std::size_t i, VerifyReport&& part) {
        list_tensor(names[i], a, b, labels, placement_is_note, options, c);
        merge_findings(c.report(), std::move(part));
      });
}

}  // namespace

namespace {

bool has_quantization_config(const Side& side) {
  return side.config && side.config->is_object() && side.config->contains("quantization_config");
}

// A GOLDEN without quantization_config beside a quantized OUTPUT is most
// likely the checkpoint OUTPUT was made from: that comparison is
// --against-source, said first among the notes.
void note_unquantized_golden(const Side& output, const Side& golden, VerifyReport& report) {
  if (report.same() || !has_quantization_config(output) || has_quantization_config(golden)) {
    return;
  }
  report.notes.insert(
      report.notes.begin(),
      VerifyItem{"golden_is_unquantized", "config.json", "",
                 fmt::format("GOLDEN {} has no quantization_config: it looks like an unquantized "
                             "checkpoint, such as the INPUT OUTPUT was made from; to check OUTPUT "
                             "against its source, run `ctquant verify {} {} --against-source`",
                             report.reference, report.output, report.reference)});
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
  // Where a tensor is stored matters only when an index is wrong about it.
  const auto consistent = [](const Side& side) {
    VerifyReport scratch;
    Collector quiet(scratch);
    return check_index(side, quiet) && (side.has_index || side.shards.size() == 1);
  };
  const bool placement_is_note = consistent(a) && consistent(b);
  compare_tensors(a, b, labels, options, placement_is_note, c);
  check_alignment(a, c);
  check_index(a, c);
  check_index(b, c);
  compare_indexes(a, b, labels, placement_is_note, c);
  compare_configs(a, b, labels, /*compare_qc=*/true, c);
  compare_other_files(a, b, labels, c);
  check_loadability(a.config, a.shards, report);
  note_unquantized_golden(a, b, report);
  return report;
}


}  // namespace ctquant
