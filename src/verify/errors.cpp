#include "ctquant/verify/errors.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "ctquant/report/weight_error.hpp"
#include "ctquant/scheme/quant_error.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "ctquant/util/cancel.hpp"
#include "verify/side.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using detail::Ref;
using nlohmann::json;

namespace {

// One module's figures, or why it has none.
std::optional<QuantError> module_error(const detail::Side& out, const Checkpoint& checkpoint,
                                       const QuantizePlan& plan, const PlannedModule& m,
                                       std::uint64_t chunk_bytes, std::string& why) {
  const SchemeGroup& g = plan.group_of(m);
  const SchemeFamily& family = *g.family();
  const QuantArgs& args = g.weights;
  const std::uint64_t rows = m.source.rows;
  const std::uint64_t cols = m.source.cols;
  const std::vector<OutputTensorSpec> specs = family.outputs(args, m.dtype, rows, cols);
  std::vector<Ref> refs;
  for (const OutputTensorSpec& s : specs) {
    const std::string name = m.name + "." + s.suffix;
    const Ref r = out.find(name);
    if (!r) {
      why = fmt::format("OUTPUT has no '{}'", name);
      return std::nullopt;
    }
    if (r.entry->dtype != s.dtype || r.entry->shape != s.shape) {
      why = fmt::format("OUTPUT holds '{}' as {} {}, not {} {} ({})", name,
                        dtype_tag(r.entry->dtype), shape_string(r.entry->shape), dtype_tag(s.dtype),
                        shape_string(s.shape), family.format);
      return std::nullopt;
    }
    refs.push_back(r);
  }
  std::vector<std::vector<std::byte>> whole;
  std::vector<std::size_t> row_outputs;
  for (std::size_t o = 0; o < specs.size(); ++o) {
    if (specs[o].fill == OutputTensorSpec::Fill::kWhole) {
      whole.push_back(detail::read_whole(refs[o]));
    } else {
      row_outputs.push_back(o);
    }
  }
  const WeightRows source(checkpoint, m.source);
  const std::uint64_t align = std::max<std::uint64_t>(1, family.row_alignment(args));
  const std::uint64_t per_chunk =
      std::max<std::uint64_t>(1, chunk_bytes / std::max<std::uint64_t>(1, source.row_bytes()));
  const std::uint64_t step = std::max(align, per_chunk / align * align);
  std::vector<std::byte> src_rows;
  std::vector<std::byte> fp8_scales;
  std::vector<std::vector<std::byte>> stored(row_outputs.size());
  std::vector<RowError> row_errors;
  std::vector<float> values;
  QuantError error;
  for (std::uint64_t r0 = 0; r0 < rows; r0 += step) {
    const std::uint64_t r1 = std::min(rows, r0 + step);
    src_rows.resize((r1 - r0) * source.row_bytes());
    fp8_scales.resize(source.scale_bytes(r0, r1));
    if (const auto bad = source.load(r0, r1, src_rows, fp8_scales)) {
      const std::uint64_t row = r0 + *bad / cols;
      why = fmt::format("source element [{}, {}] of '{}' {}", row, *bad % cols,
                        checkpoint.entry(m.source.tensor).name,
                        source.describe_fp8(row, *bad % cols));
      return std::nullopt;
    }
    // --transform: the error against the source as quantize rewrote it.
    if (const TensorRewrite* r =
            plan.rewrite ? plan.rewrite->find(plan.decisions[m.decision].name) : nullptr) {
      apply_rewrite(*plan.rewrite, *r, source.dtype(), r0 * cols, (r1 - r0) * cols,
                    src_rows.data());
    }
    QuantErrorIo e;
    e.dtype = source.dtype();
    e.n_rows = r1 - r0;
    e.n_cols = cols;
    e.row_begin = r0;
    e.weight = src_rows.data();
    for (std::size_t i = 0; i < row_outputs.size(); ++i) {
      const OutputTensorSpec& s = specs[row_outputs[i]];
      stored[i].resize(s.bytes_before(r1) - s.bytes_before(r0));
      detail::read_part(refs[row_outputs[i]], s.bytes_before(r0), stored[i]);
      e.outputs[i] = stored[i].data();
    }
    for (std::size_t k = 0; k < whole.size() && k < e.whole.size(); ++k) {
      e.whole[k] = whole[k].data();
    }
    row_errors.resize(r1 - r0);
    quant_error_rows(family, args, e, row_errors, values);
    for (const RowError& r : row_errors) error.add(r);
  }
  return error;
}

}  // namespace

CheckpointErrors checkpoint_errors(const fs::path& output, const fs::path& input,
                                   std::uint64_t chunk_bytes, const std::atomic<bool>* cancel,
                                   const std::function<void()>& before_writing) {
  const CancelScope cancel_scope(cancel, "interrupted by a signal");
  CheckpointErrors result;
  result.output = output.string();
  result.input = input.string();
  const detail::Side out = detail::open_side(output, "OUTPUT");
  PlanOptions options = detail::plan_options_of_output(out, "inspect --errors");
  options.default_ignore = false;  // the written list is the whole list
  // --transform rotate: against INPUT rewritten again as quantize rewrote it.
  const auto staged = stage_source_for_output(out.config, input, before_writing);
  if (staged) options.transform.clear();
  // Read-only: links out of the directory (a cache snapshot) are followed.
  const Checkpoint checkpoint =
      open_checkpoint(staged ? staged->path() : input, OpenOptions{.follow_links_outside = true});
  result.plan = make_plan(checkpoint, options);
  if (result.plan.rewrite) result.plan.rewrite = derive_transform(checkpoint, *result.plan.rewrite);
  result.input_quantization = result.plan.input_quantization.describe();
  for (std::size_t mi = 0; mi < result.plan.modules.size(); ++mi) {
    poll_cancel();
    const PlannedModule& m = result.plan.modules[mi];
    if (m.kind != PlannedModule::Kind::kQuantize) continue;
    std::string why;
    if (const auto e = module_error(out, checkpoint, result.plan, m, chunk_bytes, why)) {
      result.modules.push_back(ModuleError{mi, *e});
    } else {
      result.skipped.push_back(fmt::format("{}: {}", m.name, why));
    }
  }
  return result;
}

json checkpoint_errors_json(const CheckpointErrors& errors) {
  return json{{"mode", "errors"},
              {"output", errors.output},
              {"input", errors.input},
              {"input_quantization", errors.input_quantization},
              {"weight_error", weight_error_json(errors.plan, errors.modules)},
              {"skipped", errors.skipped}};
}

std::string render_checkpoint_errors_text(const CheckpointErrors& errors) {
  std::string text =
      fmt::format("weight error of {} against its source {} ({}): {} quantized module(s)\n",
                  errors.output, errors.input, errors.input_quantization, errors.modules.size());
  text += render_weight_error_table(errors.plan, errors.modules);
  text += render_worst_errors(errors.plan, errors.modules);
  if (!errors.skipped.empty()) {
    text += fmt::format("{} module(s) without figures:\n", errors.skipped.size());
    for (const std::string& s : errors.skipped) text += "  " + s + "\n";
  }
  return text;
}

}  // namespace ctquant
