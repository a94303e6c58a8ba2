// verify_against_source: OUTPUT against the INPUT it was made from.
//
// The source is planned again with the scheme groups and ignore list of
// OUTPUT's config.json (plan_options_from_config, make_plan), which gives
// every tensor OUTPUT must hold: its name, dtype, shape and shard, and for
// each weight the module it belongs to. Copied tensors must be the source's
// bytes; 16-bit weights (FP8 weights written as BF16, split experts kept)
// the rows WeightRows loads, exactly as quantize read them; quantized
// modules are recomputed row chunk by row chunk with their family's kernel
// (quantize: the vector kernels quantize runs, which the tests check bit for
// bit against quantize_ref at every level) and compared code by code, scale
// by scale, and the values their stored outputs stand for are compared with
// the source rows for the error figures (quant_error.hpp). The chunks of a
// module are checked on VerifyOptions::threads threads and their findings
// taken in row order (ordered_parallel), so the report is the same for every
// thread count.
#include <algorithm>
#include <array>
#include <map>
#include <set>

#include <fmt/format.h>

#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/quant_error.hpp"
#include "ctquant/scheme/scale_check.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "ctquant/transform/transform.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/loadability.hpp"
#include "util/ordered_parallel.hpp"
#include "verify/against_converted.hpp"
#include "verify/output_diff.hpp"
#include "verify/side.hpp"
#include "verify/tensor_checks.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace detail;

namespace {

// The checks of the quantized modules, on top of those of every other
// tensor (TensorChecks, src/verify/tensor_checks.cpp).
class AgainstSource : TensorChecks {
 public:
  AgainstSource(const Side& out, const Checkpoint& checkpoint, const QuantizePlan& plan,
                const VerifyOptions& options, Collector& c)
      : TensorChecks(out, checkpoint, plan, options, c) {}

  // Only the quantized modules (a converted INPUT's run: the other
  // tensors are ConvertedCheck's, against_converted.cpp).
  void run_modules() {
    compute_amax();
    for (std::size_t mi = 0; mi < plan_.modules.size(); ++mi) {
      poll_cancel();
      if (plan_.modules[mi].kind == PlannedModule::Kind::kQuantize) check_quantized(mi);
    }
  }

  void run() {
    for (const ShardPlan& s : plan_.shards) {
      for (const PlannedTensor& t : s.tensors) expected_[t.name] = {&s, &t};
    }
    check_fates();
    compute_amax();
    for (std::size_t mi = 0; mi < plan_.modules.size(); ++mi) {
      poll_cancel();
      const PlannedModule& m = plan_.modules[mi];
      if (handled_modules_.contains(mi)) continue;
      if (m.kind == PlannedModule::Kind::kQuantize) check_quantized(mi);
    }
    poll_cancel();
    check_tensors();
    poll_cancel();
  }

 private:
  // The quantized outputs OUTPUT holds for a module name (names with the
  // module's prefix that a family writes).
  bool holds_quantized(const std::string& module) const {
    for (const char* p : {"weight_packed", "weight_scale", "weight_global_scale",
                          "weight_zero_point", "weight_shape"}) {
      if (out_.find(module + "." + p)) return true;
    }
    return false;
  }

  // Section 2: the fate OUTPUT's ignore list and targets give each weight
  // must be the one OUTPUT holds.
  void check_fates() {
    for (std::size_t mi = 0; mi < plan_.modules.size(); ++mi) {
      const PlannedModule& m = plan_.modules[mi];
      if (m.kind != PlannedModule::Kind::kQuantize) continue;
      const SchemeGroup& g = plan_.group_of(m);
      const auto specs = g.family()->outputs(g.weights, m.dtype, m.source.rows, m.source.cols);
      bool all = true;
      for (const auto& s : specs) all = all && out_.find(m.name + "." + s.suffix);
      const Ref w = out_.find(m.name + ".weight");
      const bool plain = w && is_quantizable_float(w.entry->dtype);
      if (all || !plain) continue;
      c_.diff("fate", ckpt_.shards[m.source.tensor.shard].label(), m.name + ".weight",
              fmt::format("config.json's ignore list and targets select '{}' ({}), so vLLM will "
                          "expect '{}.{}', but OUTPUT does not hold it quantized",
                          m.name, m.rule, m.name, specs.front().suffix));
      handled_modules_.insert(mi);
      for (const auto& s : specs) handled_.insert(m.name + "." + s.suffix);
      handled_.insert(m.name + ".weight");
    }
    for (const auto& [name, e] : expected_) {
      const PlannedTensor& t = *e.tensor;
      if (!name.ends_with(".weight")) continue;
      const bool is_module = t.source == PlannedTensor::Source::kModule && !t.output;
      const bool is_weight_copy =
          t.source == PlannedTensor::Source::kCopy && plan_.decisions[t.decision].selectable;
      if (!is_module && !is_weight_copy) continue;
      const std::string module = module_of(name);
      if (!holds_quantized(module)) continue;
      const std::string rule =
          is_module ? plan_.modules[t.module].rule : plan_.decisions[t.decision].rule;
      c_.diff("fate", e.shard->file_name, name,
              fmt::format("OUTPUT holds '{}' quantized, but config.json's ignore list and "
                          "targets leave it unquantized ({}), so vLLM will look for '{}'",
                          module, rule, name));
      handled_.insert(name);
      for (const auto& [n, shards] : out_.where) {
        if (module_of(n) == module) handled_.insert(n);
      }
    }
  }

  // max |w| of every module that needs it, then of its set (schemes.md 7):
  // the chunks of the set's modules read on threads_ threads, taken in
  // order up to the first that cannot be read as finite values (reported
  // when the module itself is checked).
  void compute_amax() {
    set_amax_.assign(plan_.modules.size(), 0.0f);
    struct Chunk {
      std::size_t source = 0;  // index into sources
      std::size_t module = 0;  // index into plan_.modules
      std::uint64_t r0 = 0;
      std::uint64_t r1 = 0;
    };
    struct ChunkAmax {
      float amax = 0.0f;
      bool ok = true;
    };
    struct AmaxScratch {
      std::vector<std::byte> rows;
      std::vector<std::byte> scales;
      std::vector<float> ranges;
    };
    std::vector<AmaxScratch> buffers(threads_);
    for (const std::vector<std::size_t>& set : plan_.amax_sets) {
      std::vector<Chunk> chunks;
      std::vector<WeightRows> sources;
      std::map<std::size_t, std::uint32_t> cutoff;  // of the modules with an MSE observer
      for (const std::size_t mi : set) {
        sources.emplace_back(ckpt_, plan_.modules[mi].source);
        const WeightRows& source = sources.back();
        if (is_mse_observer(plan_.group_of(plan_.modules[mi]).weights.observer)) {
          cutoff[mi] = mse_cutoff_of(mi);  // before the threads: it reads the module
        }
        const std::uint64_t step = step_rows(source, 1);
        for (std::uint64_t r0 = 0; r0 < source.rows(); r0 += step) {
          chunks.push_back({sources.size() - 1, mi, r0, std::min(source.rows(), r0 + step)});
        }
      }
      float amax = 0.0f;
      bool ok = true;
      ordered_parallel<ChunkAmax>(
          chunks.size(), threads_,
          [&](std::size_t k, unsigned worker) {
            const Chunk& c = chunks[k];
            const WeightRows& source = sources[c.source];
            AmaxScratch& b = buffers[worker];
            ChunkAmax found;
            // Rows that do not load finite are reported when the module itself is checked.
            found.ok = load_finite(plan_.modules[c.module], source, c.r0, c.r1, b.rows, b.scales,
                                   found.amax);
            if (const auto it = cutoff.find(c.module); found.ok && it != cutoff.end()) {
              // The global scale from the observer's ranges, as quantize does.
              const float* ranges =
                  observe(c.module, source, b.rows.data(), c.r1 - c.r0, it->second, b.ranges);
              found.amax = 0.0f;
              const std::uint64_t n = observed_groups(
                  plan_.group_of(plan_.modules[c.module]).weights, c.r1 - c.r0, source.cols());
              for (std::uint64_t g = 0; g < n; ++g)
                found.amax = std::max(found.amax, range_amax(ranges, g));
            }
            return found;
          },
          [&](std::size_t, ChunkAmax&& found) {
            if (!ok) return;
            amax = std::max(amax, found.amax);
            ok = found.ok;
          });
      for (const std::size_t mi : set) set_amax_[mi] = amax;
    }
  }

  // The observer's ranges of rows [r0, r1) of module mi (already loaded):
  // an MSE search up to candidate `cutoff` (observer.hpp), or refit's, in
  // `ranges`.
  // With `improved`: the candidates that improve some group ORed into it
  // (the cutoff's own pass, which searches every candidate). Thread-safe.
  const float* observe(std::size_t mi, const WeightRows& source, const std::byte* rows,
                       std::uint64_t n, std::uint32_t cutoff, std::vector<float>& ranges,
                       ImprovedSteps* improved = nullptr) const {
    const QuantArgs& args = plan_.group_of(plan_.modules[mi]).weights;
    const ObserverParams params = observer_params(args.observer, args.observer_kwargs, "verify");
    ranges.resize(2 * observed_groups(args, n, source.cols()));
    // tensor_amax: refit refits NVFP4 group scales under the set's global scale.
    const ObserveIo io{source.dtype(), n, source.cols(), rows, ranges.data(), set_amax_[mi]};
    observe_ranges(args, params, improved != nullptr ? params.steps() : cutoff, io, improved);
    return ranges.data();
  }

  // Loads rows [r0, r1) of source and their max |w| into amax; false when
  // a value is not finite.
  bool load_finite(const PlannedModule& m, const WeightRows& source, std::uint64_t r0,
                   std::uint64_t r1, std::vector<std::byte>& rows, std::vector<std::byte>& scales,
                   float& amax) const {
    rows.resize((r1 - r0) * source.row_bytes());
    scales.resize(source.scale_bytes(r0, r1));
    if (source.load(r0, r1, rows, scales)) return false;
    rewrite_rows(m, source.dtype(), r0, r1, rows.data());
    return !max_abs(source.dtype(), rows.data(), (r1 - r0) * source.cols(), amax);
  }

  // The last candidate the library searches for module mi: the candidates
  // that improve some group, chunk by chunk until they settle it.
  std::uint32_t mse_cutoff_of(std::size_t mi) {
    if (const auto it = cutoffs_.find(mi); it != cutoffs_.end()) return it->second;
    const PlannedModule& m = plan_.modules[mi];
    const SchemeGroup& g = plan_.group_of(m);
    const ObserverParams params =
        observer_params(g.weights.observer, g.weights.observer_kwargs, "verify");
    ImprovedSteps improved;
    if (!mse_cutoff_settled(params, improved)) {
      const WeightRows source(ckpt_, m.source);
      const std::uint64_t step =
          step_rows(source, std::max<std::uint64_t>(1, g.family()->row_alignment(g.weights)));
      std::vector<std::byte> rows;
      std::vector<std::byte> scales;
      std::vector<float> ranges;
      for (std::uint64_t r0 = 0; r0 < source.rows(); r0 += step) {
        const std::uint64_t r1 = std::min(source.rows(), r0 + step);
        float amax = 0.0f;
        // Rows that do not load finite are reported when the module is checked.
        if (!load_finite(m, source, r0, r1, rows, scales, amax)) break;
        observe(mi, source, rows.data(), r1 - r0, 0, ranges, &improved);
        if (mse_cutoff_settled(params, improved)) break;
      }
    }
    const std::uint32_t cutoff = mse_cutoff_settled(params, improved)
                                     ? (params.steps() == 0 ? 0 : params.steps() - 1)
                                     : mse_cutoff(params, improved);
    cutoffs_[mi] = cutoff;
    return cutoff;
  }

  // What one chunk of rows of a quantized module gives.
  struct ChunkFindings {
    std::string source_problem;  // a source value that cannot have been quantized
    BadScales bad_scales;
    OutputDiff diff;
    std::vector<RowError> row_errors;  // one per row
  };
  // What check_chunk needs of the module being checked.
  struct ModuleChunks {
    const PlannedModule& module;
    const SchemeFamily& family;
    const QuantArgs& args;
    const std::vector<OutputTensorSpec>& specs;
    const std::vector<Ref>& refs;                 // per spec
    const std::vector<std::size_t>& row_outputs;  // indexes into specs of the kRows outputs
    const std::vector<std::vector<std::byte>>& whole_stored;  // the kWhole outputs as stored
    const WeightRows& source;
    float amax = 0;  // of the module's amax set
    std::uint64_t scale_rows = 1;
    std::uint64_t scale_cols = 1;
    std::size_t index = 0;  // into plan_.modules
    // With an observer that chooses ranges: an MSE search's last candidate
    // (0 for refit, which has no cutoff).
    std::optional<std::uint32_t> mse_cutoff;
  };
  // One worker's buffers for check_chunk, reused from chunk to chunk.
  struct ChunkScratch {
    std::vector<std::byte> src_rows;
    std::vector<std::byte> fp8_scales;
    std::array<std::vector<std::byte>, 4> ref;
    std::array<std::vector<std::byte>, 4> stored;
    std::vector<std::byte> kernel;
    std::vector<float> values;
    std::vector<float> ranges;  // an MSE observer's
  };

  // Rows [r0, r1) of module m: the source rows quantized again with the
  // family's kernel (the vector kernels, checked bit for bit against the
  // reference by the tests), compared with what OUTPUT stores, and the
  // weight error of the stored values. Thread-safe: reads files, writes
  // only buf and the result.
  ChunkFindings check_chunk(const ModuleChunks& mc, std::uint64_t r0, std::uint64_t r1,
                            ChunkScratch& buf) const {
    const SchemeFamily& family = mc.family;
    const QuantArgs& args = mc.args;
    const WeightRows& source = mc.source;
    ChunkFindings found;
    const std::uint64_t n = r1 - r0;
    const std::uint64_t cols = mc.module.source.cols;
    if (auto problem = source_problem(source, r0, r1, buf.src_rows, buf.fp8_scales, "quantized")) {
      found.source_problem = std::move(*problem);
      return found;
    }
    rewrite_rows(mc.module, source.dtype(), r0, r1, buf.src_rows.data());
    KernelIo io;
    io.dtype = source.dtype();
    io.n_rows = n;
    io.n_cols = cols;
    io.row_begin = r0;
    io.weight = buf.src_rows.data();
    io.tensor_amax = mc.amax;
    QuantErrorIo e;
    e.dtype = source.dtype();
    e.n_rows = n;
    e.n_cols = cols;
    e.row_begin = r0;
    e.weight = buf.src_rows.data();
    for (std::size_t i = 0; i < mc.row_outputs.size(); ++i) {
      const OutputTensorSpec& s = mc.specs[mc.row_outputs[i]];
      const std::uint64_t first = s.bytes_before(r0);
      const std::uint64_t bytes = s.bytes_before(r1) - first;
      buf.ref[i].assign(bytes, std::byte{0});
      buf.stored[i].resize(bytes);
      read_part(mc.refs[mc.row_outputs[i]], first, buf.stored[i]);
      count_bad_scales(s, first, buf.stored[i], found.bad_scales);
      io.out[i] = buf.ref[i].data();
      e.outputs[i] = buf.stored[i].data();
    }
    for (std::size_t k = 0; k < mc.whole_stored.size() && k < e.whole.size(); ++k) {
      e.whole[k] = mc.whole_stored[k].data();
    }
    buf.kernel.resize(family.scratch_bytes(args, n, cols));
    io.scratch = buf.kernel;
    if (mc.mse_cutoff) {
      float finite = 0.0f;  // a value that is not finite is the kernel's to report
      if (!max_abs(source.dtype(), buf.src_rows.data(), n * cols, finite)) {
        io.ranges = observe(mc.index, source, buf.src_rows.data(), n, *mc.mse_cutoff, buf.ranges);
      }
    }
    if (const auto bad = family.quantize(args, io)) {
      found.source_problem = fmt::format(
          "source value at row {}, column {} is not finite; it cannot have been quantized",
          r0 + *bad / cols, *bad % cols);
      return found;
    }
    for (std::size_t i = 0; i < mc.row_outputs.size(); ++i) {
      diff_rows_output(mc.specs[mc.row_outputs[i]], buf.stored[i], buf.ref[i], r0, n, cols,
                       mc.scale_rows, mc.scale_cols, options_.scale_ulp, found.diff);
    }
    // The error of the stored values against the source rows, as quantize
    // reports it (quant_error.hpp).
    found.row_errors.resize(n);
    quant_error_rows(family, args, e, found.row_errors, buf.values);
    return found;
  }

  // A quantized module being checked: what its family writes and where
  // OUTPUT holds it.
  struct QuantizedOutputs {
    std::size_t index = 0;  // into plan_.modules
    const PlannedModule& module;
    const SchemeFamily& family;
    const QuantArgs& args;
    std::vector<OutputTensorSpec> specs;
    std::string first_name;  // its first output tensor, which the findings name
    std::string file;        // the file of OUTPUT holding it (else the planned one)
    std::vector<Ref> refs;   // per spec, once check_output_layout found them
  };
  // What the chunks of a quantized module found, taken in row order.
  struct ModuleFindings {
    ModuleCheck check;
    BadScales bad_scales;
    std::uint64_t accepted_scales = 0;  // within --scale-ulp
    std::uint64_t max_scale_ulp = 0;
  };

  // Module mi, quantized: its outputs present with their dtypes and shapes,
  // its whole tensors, then every row chunk recomputed and compared; the
  // findings reported.
  void check_quantized(std::size_t mi) {
    QuantizedOutputs q = quantized_outputs(mi);
    if (!check_output_layout(q)) return;
    const WeightRows source(ckpt_, q.module.source);
    const float amax = set_amax_[mi];
    const std::vector<std::vector<std::byte>> whole_stored = check_whole_tensors(q, amax);
    std::optional<ModuleFindings> found = recompute_rows(q, source, amax, whole_stored);
    if (!found) return;  // a source value that cannot have been quantized, reported
    report_module(q, source, std::move(*found));
  }

  QuantizedOutputs quantized_outputs(std::size_t mi) const {
    const PlannedModule& m = plan_.modules[mi];
    const SchemeGroup& g = plan_.group_of(m);
    QuantizedOutputs q{mi, m, *g.family(), g.weights, {}, {}, {}, {}};
    q.specs = q.family.outputs(q.args, m.dtype, m.source.rows, m.source.cols);
    q.first_name = m.name + "." + q.specs.front().suffix;
    const Ref r = out_.find(q.first_name);
    q.file = r ? r.file->label() : plan_.shards[m.shard].file_name;
    return q;
  }

  // Section 4: every output tensor present, of its dtype and shape (each
  // one handled here). False, with the difference reported, when one is not.
  bool check_output_layout(QuantizedOutputs& q) {
    std::vector<std::string> layout;
    for (const OutputTensorSpec& s : q.specs) {
      const std::string name = q.module.name + "." + s.suffix;
      handled_.insert(name);
      const Ref r = out_.find(name);
      q.refs.push_back(r);
      if (!r) {
        layout.push_back(fmt::format("'{}' is missing", name));
      } else if (r.entry->dtype != s.dtype || r.entry->shape != s.shape) {
        layout.push_back(fmt::format("'{}' is {} {}, expected {} {}", name,
                                     dtype_tag(r.entry->dtype), shape_string(r.entry->shape),
                                     dtype_tag(s.dtype), shape_string(s.shape)));
      }
    }
    if (layout.empty()) return true;
    std::string message;
    for (const auto& l : layout) message += (message.empty() ? "" : "; ") + l;
    c_.diff("layout", q.file, q.first_name,
            fmt::format("{} ({}, section 4 of the format spec, docs/format.md)", message,
                        q.family.format));
    return false;
  }

  // Whole tensors (weight_shape, a global scale): exactly what the family
  // writes from amax, the max |w| of the module's amax set. Returns them as
  // stored, in outputs() order among the kWhole tensors.
  std::vector<std::vector<std::byte>> check_whole_tensors(const QuantizedOutputs& q, float amax) {
    const PlannedModule& m = q.module;
    const std::uint64_t rows = m.source.rows;
    const std::uint64_t cols = m.source.cols;
    std::vector<std::vector<std::byte>> whole_stored;
    std::size_t whole_index = 0;
    for (std::size_t o = 0; o < q.specs.size(); ++o) {
      const OutputTensorSpec& spec = q.specs[o];
      if (spec.fill != OutputTensorSpec::Fill::kWhole) continue;
      const Ref& ref = q.refs[o];
      std::vector<std::byte> stored = read_whole(ref);
      BadScales bad;
      count_bad_scales(spec, 0, stored, bad);
      if (bad.count > 0) {
        c_.diff("scale", ref.file->label(), ref.entry->name,
                fmt::format("'{}' is {}: {}", ref.entry->name, bad.value,
                            spec.kind == OutputTensorSpec::Kind::kGlobalScale
                                ? "a global scale must be finite and non-zero (the group "
                                  "scales are divided by it)"
                                : "a scale must be finite and non-zero (the codes are "
                                  "multiplied by it)"));
      }
      const std::vector<std::byte> want =
          q.family.whole_tensor(q.args, m.dtype, rows, cols, amax, whole_index++);
      if (stored != want) {
        c_.diff(spec.kind == OutputTensorSpec::Kind::kShape ? "layout" : "scale", ref.file->label(),
                ref.entry->name,
                spec.kind == OutputTensorSpec::Kind::kShape
                    ? fmt::format("'{}' does not hold [{}, {}]", ref.entry->name, rows, cols)
                    : fmt::format("'{}' is not the value the source gives (from max |w| {} of "
                                  "the module{})",
                                  ref.entry->name, amax,
                                  m.amax_set && plan_.amax_sets[*m.amax_set].size() > 1
                                      ? " and the fused layers it shares it with"
                                      : ""));
      }
      whole_stored.push_back(std::move(stored));
    }
    return whole_stored;
  }

  // Every chunk of rows recomputed (check_chunk) on the worker threads; the
  // findings taken in row order, so the report does not depend on the
  // thread count. Nothing, with the difference reported, when a source
  // value cannot have been quantized.
  std::optional<ModuleFindings> recompute_rows(
      const QuantizedOutputs& q, const WeightRows& source, float amax,
      const std::vector<std::vector<std::byte>>& whole_stored) {
    const PlannedModule& m = q.module;
    const std::uint64_t rows = m.source.rows;
    const std::uint64_t cols = m.source.cols;
    ModuleFindings f;
    ModuleCheck& check = f.check;
    check.module = m.name;
    check.rows = rows;
    check.cols = cols;
    check.fp8_source = source.is_fp8();
    const std::uint64_t scale_rows = std::max<std::uint64_t>(1, q.args.scale_rows(rows));
    const std::uint64_t scale_cols = std::max<std::uint64_t>(1, q.args.scale_cols(cols));
    const std::uint64_t groups_per_row = (cols + scale_cols - 1) / scale_cols;
    check.groups = (rows + scale_rows - 1) / scale_rows * groups_per_row;
    std::set<std::uint64_t> mismatched;  // group indices
    const auto mark = [&](std::uint64_t row, std::uint64_t group_col,
                          std::optional<std::uint64_t> col) {
      const std::uint64_t gi = row / scale_rows * groups_per_row + group_col;
      mismatched.insert(gi);
      if (!check.first_row || row < *check.first_row ||
          (row == *check.first_row && group_col < *check.first_group)) {
        check.first_row = row;
        check.first_group = group_col;
        check.first_column = col;
      } else if (row == *check.first_row && group_col == *check.first_group && col &&
                 (!check.first_column || *col < *check.first_column)) {
        check.first_column = col;
      }
    };

    std::vector<std::size_t> row_outputs;
    for (std::size_t o = 0; o < q.specs.size(); ++o) {
      if (q.specs[o].fill == OutputTensorSpec::Fill::kRows) row_outputs.push_back(o);
    }
    const std::uint64_t align = std::max<std::uint64_t>(1, q.family.row_alignment(q.args));
    const std::uint64_t step = step_rows(source, align);
    QuantError error;
    bool stopped = false;  // a source value that cannot have been quantized
    const ModuleChunks chunks{m,
                              q.family,
                              q.args,
                              q.specs,
                              q.refs,
                              row_outputs,
                              whole_stored,
                              source,
                              amax,
                              scale_rows,
                              scale_cols,
                              q.index,
                              is_mse_observer(q.args.observer)
                                  ? std::optional<std::uint32_t>(mse_cutoff_of(q.index))
                              : is_refit_observer(q.args.observer) ? std::optional<std::uint32_t>(0)
                                                                   : std::nullopt};
    std::vector<ChunkScratch> scratch(threads_);
    ordered_parallel<ChunkFindings>(
        static_cast<std::size_t>((rows + step - 1) / step), threads_,
        [&](std::size_t k, unsigned worker) {
          const std::uint64_t r0 = k * step;
          return check_chunk(chunks, r0, std::min(rows, r0 + step), scratch[worker]);
        },
        [&](std::size_t, ChunkFindings&& found) {
          if (stopped) return;
          if (!found.source_problem.empty()) {
            c_.diff("source", ckpt_.shards[m.source.tensor.shard].label(),
                    ckpt_.entry(m.source.tensor).name, found.source_problem);
            stopped = true;
            return;
          }
          if (found.bad_scales.count > 0 && f.bad_scales.count == 0) {
            f.bad_scales = std::move(found.bad_scales);
          } else {
            f.bad_scales.count += found.bad_scales.count;
          }
          for (const Mismatch& x : found.diff.mismatches) mark(x.row, x.group_col, x.col);
          f.accepted_scales += found.diff.accepted_scales;
          f.max_scale_ulp = std::max(f.max_scale_ulp, found.diff.max_scale_ulp);
          for (const RowError& r : found.row_errors) error.add(r);
        });
    if (stopped) return std::nullopt;
    check.groups_mismatched = mismatched.size();
    check.rel_frobenius = error.rel_frobenius();
    check.max_abs_error = error.max_abs_error();
    return f;
  }

  // The groups that differ (a "codes" difference), the scales --scale-ulp
  // accepted (a note), and the module's check in the report.
  void report_module(const QuantizedOutputs& q, const WeightRows& source, ModuleFindings&& f) {
    const ModuleCheck& check = f.check;
    if (f.bad_scales.count > 0) {
      const BadScales& b = f.bad_scales;
      const ScaleGroup g = scale_group(q.args, *b.spec, check.rows, check.cols, b.element);
      c_.diff("scale", q.file, q.module.name + "." + b.spec->suffix,
              fmt::format("{} of the scales of '{}.{}' are not finite and non-zero, first {} "
                          "[{}, {}], for {}: every scale must be finite and non-zero (codes "
                          "times it are not the weights)",
                          b.count, q.module.name, b.spec->suffix, b.value, g.unit, g.group,
                          describe_scale_group(q.args, g)),
              json{{"scales_bad", b.count},
                   {"first_row", g.row_begin},
                   {"first_group", g.group},
                   {"first_value", b.value}});
    }
    if (check.groups_mismatched > 0) {
      json details = {
          {"groups_mismatched", check.groups_mismatched},
          {"groups", check.groups},
          {"first_row", *check.first_row},
          {"first_group", *check.first_group},
          {"first_column", check.first_column ? json(*check.first_column) : json(nullptr)}};
      if (source.is_fp8()) details["source"] = "dequantized FP8";
      c_.diff("codes", q.file, q.first_name,
              fmt::format(
                  "{} of {} groups are not the RTN codes of the {}source (codes, scale "
                  "or zero point differ), first at row {}, {}",
                  check.groups_mismatched, check.groups, source.is_fp8() ? "dequantized FP8 " : "",
                  *check.first_row,
                  check.first_column
                      ? fmt::format("column {} (group {})", *check.first_column, *check.first_group)
                      : fmt::format("group {} (its scale or zero point)", *check.first_group)),
              std::move(details));
    }
    if (f.accepted_scales > 0) {
      c_.note("scale", q.file, q.module.name + ".weight_scale",
              fmt::format("{} scale values differ from RTN by at most {} ulp; accepted by "
                          "--scale-ulp {}",
                          f.accepted_scales, f.max_scale_ulp, options_.scale_ulp));
    }
    c_.report().modules.push_back(std::move(f.check));
  }

  std::set<std::size_t> handled_modules_;  // modules with a fate difference
  std::vector<float> set_amax_;
  std::map<std::size_t, std::uint32_t> cutoffs_;  // mse_cutoff_of, per module
};

}  // namespace

void detail::check_quantized_modules(const Side& out, const Checkpoint& checkpoint,
                                     const QuantizePlan& plan, const VerifyOptions& options,
                                     Collector& c) {
  AgainstSource(out, checkpoint, plan, options, c).run_modules();
}

VerifyReport verify_against_source(const fs::path& output, const fs::path& input,
                                   const VerifyOptions& options) {
  VerifyReport report;
  report.mode = VerifyMode::kAgainstSource;
  report.output = output.string();
  report.reference = input.string();
  const Side out = open_side(output, "OUTPUT");
  // --transform rotate: the source is INPUT rewritten again as quantize
  // rewrote it (transform/transform.hpp, stage_source_for_output).
  // Signals are polled from here on (a no-op without options.cancel).
  const CancelScope cancel_scope(options.cancel, "interrupted by a signal");
  std::string refused;  // INPUT refused by the recorded rewrite: not OUTPUT's source
  const auto staged = stage_source_for_output(out.config, input, options.before_writing, &refused);
  const fs::path source = staged ? staged->path() : input;
  Side src = open_side(source, "INPUT");
  restrict_to_index(src);
  // An input another tool quantized (AWQ, ModelOpt NVFP4): both sides
  // dequantized (verify/against_converted.hpp).
  if (detail::verify_converted_source(out, src, input, options, report)) return report;
  // Section 6: the kinds of input quantize converts, and only those.
  InputQuantization q;
  try {
    q = classify_input_quantization(src.config);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("--against-source: INPUT {}", e.what()));
  }
  report.input_quantization = q.describe();
  PlanOptions plan_options = plan_options_of_output(out, "--against-source");
  plan_options.default_ignore = false;  // the written list is the whole list
  // config.json's groups are in name order, not the order they were given
  // in: a module goes to the group its readers give it.
  plan_options.group_rule = PlanOptions::GroupRule::kAsRead;
  report.tensors_output = out.n_tensors();
  report.tensors_reference = src.n_tensors();
  Collector c(report);
  if (!refused.empty()) {
    c.diff(
        "fate", "", "",
        fmt::format("OUTPUT's config.json records --transform {}, which INPUT cannot be "
                    "rewritten with, so INPUT is not the checkpoint OUTPUT was quantized from: "
                    "{}",
                    (*out.config)["ctquant_transform"]["transform"].get<std::string>(), refused));
    return report;
  }
  const Labels labels{"OUTPUT", "INPUT"};
  compare_shard_files(out, src, labels, c);
  check_alignment(out, c);
  check_index(out, c);
  compare_configs(out, src, labels, /*compare_qc=*/false, c);
  compare_other_files(out, src, labels, c);
  check_loadability(out.config, out.shards, report);

  // Read-only: links out of the directory (a cache snapshot) are followed.
  const Checkpoint checkpoint = open_checkpoint(source, OpenOptions{.follow_links_outside = true});
  // A staged source holds the rewrite already (its config.json records it).
  if (staged) plan_options.transform.clear();
  QuantizePlan plan;
  try {
    plan = make_plan(checkpoint, plan_options);
  } catch (const Error& e) {
    c.diff("fate", "", "",
           fmt::format("cannot plan INPUT with config.json's scheme groups, ignore list, "
                       "targets and transform: {}",
                       rewrite_refusal_reason(e.what())));
    return report;
  }
  if (plan.rewrite) {
    // --transform: its scales derived from INPUT again, as quantize did.
    plan.rewrite = derive_transform(checkpoint, *plan.rewrite);
  }
  for (const GroupConflict& g : plan.group_conflicts) {
    const auto name = [&](const std::optional<std::size_t>& i) {
      return i ? fmt::format("'{}'", plan.options.groups[*i].name) : std::string("none");
    };
    c.diff("fate", "", g.tensor,
           fmt::format("module '{}' is matched by the targets of several config groups, which "
                       "the readers resolve differently: compressed-tensors (transformers) reads "
                       "it with group {}, vLLM with {}",
                       g.module, name(g.groups.compressed_tensors), name(g.groups.vllm)));
  }
  AgainstSource(out, checkpoint, plan, options, c).run();
  return report;
}

}  // namespace ctquant
