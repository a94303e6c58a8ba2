#include "ctquant/exec/observer_choice.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "ctquant/model/roles.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "ctquant/util/error.hpp"
#include "util/ordered_parallel.hpp"

namespace ctquant {

std::size_t ObserverChoices::modules_using_mse() const {
  return static_cast<std::size_t>(
      std::count_if(modules.begin(), modules.end(), [](const auto& m) { return m.use_mse(); }));
}

std::size_t ObserverChoices::modules_using_refit() const {
  return static_cast<std::size_t>(
      std::count_if(modules.begin(), modules.end(), [](const auto& m) { return m.use_refit(); }));
}

QuantError ObserverChoices::total_minmax() const {
  QuantError all;
  for (const ModuleObserverChoice& m : modules) all.add(m.minmax);
  return all;
}

QuantError ObserverChoices::total_chosen() const {
  QuantError all;
  for (const ModuleObserverChoice& m : modules) all.add(m.chosen_error());
  return all;
}

std::string auto_mse_observer(const QuantArgs& weights) {
  return weights.strategy == QuantArgs::Strategy::kTensorGroup ? "nvfp4_expanded_mse"
                                                                : "memoryless_mse";
}

namespace {

[[noreturn]] void throw_interrupted() {
  throw Error(ErrorKind::kInterrupted, "interrupted by a signal before OUTPUT was complete");
}

// One observer's run over a set of modules that share a global scale (or
// one module): each module's weight error with that observer (min-max, an
// MSE observer or refit).
class SetMeasure {
 public:
  SetMeasure(const Checkpoint& checkpoint, const QuantizePlan& plan,
             const std::vector<std::size_t>& set, const QuantArgs& args,
             const ObserverChoiceOptions& options, std::atomic<std::uint64_t>& bytes_done,
             const std::function<void()>& after_chunk, const SchemeFamily* family = nullptr)
      : ckpt_(checkpoint),
        plan_(plan),
        set_(set),
        args_(args),
        options_(options),
        bytes_done_(bytes_done),
        after_chunk_(after_chunk),
        family_(family != nullptr ? family : plan.group_of(plan.modules[set.front()]).family()),
        params_(observer_params(args.observer, args.observer_kwargs,
                                "--observer auto: " + args.observer)) {}

  std::vector<QuantError> run() {
    std::vector<std::uint32_t> cutoffs;
    for (const std::size_t mi : set_) cutoffs.push_back(cutoff(mi));
    if (family_->needs_tensor_amax(args_)) {
      for (std::size_t k = 0; k < set_.size(); ++k) {
        set_amax_ = std::max(set_amax_, amax(set_[k], cutoffs[k]));
      }
    }
    std::vector<QuantError> errors;
    for (std::size_t k = 0; k < set_.size(); ++k) {
      errors.push_back(measure(set_[k], cutoffs[k], set_amax_));
    }
    return errors;
  }

 private:
  const PlannedModule& module(std::size_t mi) const { return plan_.modules[mi]; }

  std::uint64_t step_rows(const WeightRows& rows) const {
    const std::uint64_t align = std::max<std::uint64_t>(1, family_->row_alignment(args_));
    const std::uint64_t n = std::max<std::uint64_t>(
        1, options_.chunk_bytes / std::max<std::uint64_t>(1, rows.row_bytes()));
    return std::max(align, n / align * align);
  }

  // Rows [r0, r1) into input_, checked finite (as the run checks them).
  void load(const WeightRows& rows, std::uint64_t r0, std::uint64_t r1) {
    if (options_.cancel != nullptr && options_.cancel->load()) throw_interrupted();
    input_.resize((r1 - r0) * rows.row_bytes());
    scales_.resize(rows.scale_bytes(r0, r1));
    if (const auto bad = rows.load(r0, r1, input_, scales_)) {
      const std::uint64_t row = r0 + *bad / rows.cols();
      const std::uint64_t col = *bad % rows.cols();
      throw bad_input(fmt::format(
          "{} {} (a dequantized weight must be finite; section 6 of the format spec, "
          "docs/format.md)",
          rows.element(row, col), rows.describe_fp8(row, col)));
    }
    float amax = 0.0f;
    if (const auto bad = max_abs(rows.dtype(), input_.data(), (r1 - r0) * rows.cols(), amax)) {
      const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(rows.dtype()) / 8);
      throw bad_input(fmt::format(
          "{} is {} (a weight to be quantized must be finite; section 3 of the format spec, "
          "docs/format.md)",
          rows.element(r0 + *bad / rows.cols(), *bad % rows.cols()),
          load_as_float(rows.dtype(), input_.data() + *bad * esize)));
    }
    last_amax_ = amax;
    bytes_done_ += (r1 - r0) * rows.row_bytes();
    if (after_chunk_) after_chunk_();
  }

  // The observer's ranges of the rows in input_: an MSE search up to cutoff
  // (improved: to the last candidate, ORing in the candidates that improve),
  // or refit's (NVFP4 group scales under the set's global scale).
  const float* observe(const WeightRows& rows, std::uint64_t n, std::uint32_t cutoff,
                       ImprovedSteps* improved = nullptr) {
    ranges_.resize(2 * observed_groups(args_, n, rows.cols()));
    const ObserveIo io{rows.dtype(), n, rows.cols(), input_.data(), ranges_.data(), set_amax_};
    observe_ranges(args_, params_, cutoff, io, improved);
    return ranges_.data();
  }

  // The last candidate the library searches for the module (the executor's
  // cutoff pre-pass: chunk by chunk until the improvements settle it).
  std::uint32_t cutoff(std::size_t mi) {
    if (!params_.mse) return 0;
    const std::uint32_t steps = params_.steps();
    if (params_.patience > static_cast<long long>(steps)) return steps == 0 ? 0 : steps - 1;
    const WeightRows rows(ckpt_, module(mi).source);
    const std::uint64_t step = step_rows(rows);
    ImprovedSteps improved;
    for (std::uint64_t r0 = 0; r0 < rows.rows(); r0 += step) {
      const std::uint64_t r1 = std::min(rows.rows(), r0 + step);
      load(rows, r0, r1);
      observe(rows, r1 - r0, steps, &improved);
      if (mse_cutoff_settled(params_, improved)) return steps == 0 ? 0 : steps - 1;
    }
    return mse_cutoff(params_, improved);
  }

  // max |w| of the module, or with an MSE observer the largest |range| of
  // its chosen ranges (Observer.get_global_scale).
  float amax(std::size_t mi, std::uint32_t cutoff) {
    const WeightRows rows(ckpt_, module(mi).source);
    const std::uint64_t step = step_rows(rows);
    float amax = 0.0f;
    for (std::uint64_t r0 = 0; r0 < rows.rows(); r0 += step) {
      const std::uint64_t r1 = std::min(rows.rows(), r0 + step);
      load(rows, r0, r1);
      float chunk = last_amax_;
      if (params_.mse) {
        const float* ranges = observe(rows, r1 - r0, cutoff);
        chunk = 0.0f;
        const std::uint64_t groups = observed_groups(args_, r1 - r0, rows.cols());
        for (std::uint64_t g = 0; g < groups; ++g) chunk = std::max(chunk, range_amax(ranges, g));
      }
      amax = std::max(amax, chunk);
    }
    return amax;
  }

  // The module quantized chunk by chunk into memory, and its weight error.
  QuantError measure(std::size_t mi, std::uint32_t cutoff, float set_amax) {
    const PlannedModule& m = module(mi);
    const WeightRows rows(ckpt_, m.source);
    const std::vector<OutputTensorSpec> specs =
        family_->outputs(args_, m.dtype, m.source.rows, m.source.cols);
    std::vector<std::vector<std::byte>> whole;
    std::vector<const OutputTensorSpec*> row_specs;
    for (const OutputTensorSpec& s : specs) {
      if (s.fill == OutputTensorSpec::Fill::kRows) {
        row_specs.push_back(&s);
      } else {
        whole.push_back(family_->whole_tensor(args_, m.dtype, m.source.rows, m.source.cols,
                                              set_amax, whole.size()));
      }
    }
    const std::uint64_t step = step_rows(rows);
    QuantError error;
    for (std::uint64_t r0 = 0; r0 < rows.rows(); r0 += step) {
      const std::uint64_t r1 = std::min(rows.rows(), r0 + step);
      load(rows, r0, r1);
      KernelIo io;
      io.dtype = rows.dtype();
      io.n_rows = r1 - r0;
      io.n_cols = rows.cols();
      io.row_begin = r0;
      io.weight = input_.data();
      io.tensor_amax = set_amax;
      if (params_.chooses_ranges()) io.ranges = observe(rows, io.n_rows, cutoff);
      outputs_.resize(row_specs.size());
      for (std::size_t o = 0; o < row_specs.size(); ++o) {
        outputs_[o].resize(row_specs[o]->bytes_before(r1) - row_specs[o]->bytes_before(r0));
        io.out[o] = outputs_[o].data();
      }
      scratch_.resize(family_->scratch_bytes(args_, io.n_rows, io.n_cols));
      io.scratch = std::span<std::byte>(scratch_);
      if (family_->quantize(args_, io)) {
        // load() found every element finite; a kernel reports nothing else.
        throw Error(ErrorKind::kBadInput,
                    fmt::format("{}: not finite when quantized", rows.element(r0, 0)));
      }
      QuantErrorIo e;
      e.dtype = io.dtype;
      e.n_rows = io.n_rows;
      e.n_cols = io.n_cols;
      e.row_begin = r0;
      e.weight = io.weight;
      for (std::size_t o = 0; o < row_specs.size() && o < e.outputs.size(); ++o) {
        e.outputs[o] = outputs_[o].data();
      }
      for (std::size_t k = 0; k < whole.size() && k < e.whole.size(); ++k) {
        e.whole[k] = whole[k].data();
      }
      row_errors_.resize(io.n_rows);
      quant_error_rows(*family_, args_, e, row_errors_, error_values_);
      for (const RowError& r : row_errors_) error.add(r);
    }
    return error;
  }

  const Checkpoint& ckpt_;
  const QuantizePlan& plan_;
  const std::vector<std::size_t>& set_;
  const QuantArgs& args_;
  const ObserverChoiceOptions& options_;
  std::atomic<std::uint64_t>& bytes_done_;
  const std::function<void()>& after_chunk_;  // called after each chunk is read
  const SchemeFamily* family_;
  ObserverParams params_;
  std::vector<std::byte> input_;
  std::vector<std::byte> scales_;
  std::vector<float> ranges_;
  std::vector<std::vector<std::byte>> outputs_;
  std::vector<std::byte> scratch_;
  std::vector<RowError> row_errors_;
  std::vector<float> error_values_;
  float last_amax_ = 0.0f;
  float set_amax_ = 0.0f;  // max |w| of the set (families that need it), before measure()
};

// A set of modules measured together (a fused set sharing a global scale,
// or one module), with each observer's arguments (mse, refit: when the
// scheme takes it).
struct MeasureSet {
  std::vector<std::size_t> modules;
  QuantArgs minmax;
  std::optional<QuantArgs> mse;
  std::optional<QuantArgs> refit;
  std::uint64_t bytes = 0;  // input bytes read in all, about
};

// Union-find over plan modules: the modules that keep one observer together.
struct Units {
  std::map<std::size_t, std::size_t> parent;
  std::size_t find(std::size_t m) {
    auto it = parent.try_emplace(m, m).first;
    if (it->second == m) return m;
    return it->second = find(it->second);
  }
  void join(std::size_t a, std::size_t b) { parent[find(a)] = find(b); }
};

// The input bytes a measurement reads from `modules`, `reads` times each.
std::uint64_t bytes_read(const Checkpoint& checkpoint, const QuantizePlan& plan,
                         const std::vector<std::size_t>& modules, std::uint64_t reads) {
  std::uint64_t bytes = 0;
  for (const std::size_t k : modules) {
    const WeightRows rows(checkpoint, plan.modules[k].source);
    bytes += reads * rows.rows() * rows.row_bytes();
  }
  return bytes;
}

// What choose_observers and measure_errors share: `tasks` measurements run
// by `run(i, after_chunk)` on the threads of ordered_parallel (the calling
// thread one of them, at most options.threads), results in order. Progress
// in `phase` from the calling thread only: between its own chunks
// (after_chunk, which the other threads get empty), between results and
// while it waits for the other threads, at most every 200 ms, and once at
// the end; bytes_done is what SetMeasure adds as it reads. modules[i]: the
// modules task i measures, for the module count.
template <class Result, class Run>
std::vector<Result> measure_in_parallel(std::size_t tasks, std::uint64_t bytes_total,
                                        const std::vector<std::uint64_t>& modules,
                                        const ObserverChoiceOptions& options, ProgressPhase phase,
                                        std::atomic<std::uint64_t>& bytes_done, const Run& run) {
  std::uint64_t modules_total = 0;
  for (const std::uint64_t n : modules) modules_total += n;
  std::uint64_t modules_done = 0;  // of the tasks whose results came (the calling thread's)
  auto last_progress = std::chrono::steady_clock::now();
  const auto progress = [&] {
    if (!options.on_progress) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_progress < std::chrono::milliseconds(200)) return;
    last_progress = now;
    options.on_progress(Progress{std::min(bytes_done.load(), bytes_total), bytes_total,
                                 modules_done, modules_total, phase});
  };
  const std::function<void()> progress_fn = progress;
  const std::function<void()> no_progress;
  std::vector<Result> out(tasks);
  const unsigned threads = static_cast<unsigned>(
      std::max<std::size_t>(1, std::min<std::size_t>(options.threads, tasks)));
  detail::ordered_parallel<Result>(
      tasks, threads,
      [&](std::size_t i, unsigned worker) {
        return run(i, worker == 0 ? progress_fn : no_progress);
      },
      [&](std::size_t i, Result r) {
        out[i] = std::move(r);
        modules_done += modules[i];
        progress();
      },
      progress, std::chrono::milliseconds(200));
  if (options.on_progress) {
    options.on_progress(Progress{bytes_total, bytes_total, modules_total, modules_total, phase});
  }
  return out;
}

}  // namespace

ObserverChoices choose_observers(const Checkpoint& checkpoint, const QuantizePlan& plan,
                                 const ObserverChoiceOptions& options) {
  ObserverChoices choices;
  std::map<std::size_t, std::size_t> slot;  // plan module -> index into choices.modules
  std::vector<MeasureSet> sets;
  std::set<std::size_t> in_set;
  Units units;
  std::map<std::string, std::size_t> by_layer;  // vLLM layer -> a module of it
  const auto [mse_kwargs, refit_kwargs] = split_auto_kwargs(options.kwargs);
  for (std::size_t mi = 0; mi < plan.modules.size(); ++mi) {
    const PlannedModule& m = plan.modules[mi];
    if (m.kind != PlannedModule::Kind::kQuantize) continue;
    slot[mi] = choices.modules.size();
    ModuleObserverChoice& c = choices.modules.emplace_back();
    c.module = mi;
    // The shards of a layer vLLM builds fused (q/k/v, gate/up, a MoE
    // layer's experts) keep one observer: vLLM reads the layer with one
    // config group.
    const ModuleInfo* info = plan.roles.find(m.name);
    const std::string layer = info != nullptr && !info->vllm_layer.empty() ? info->vllm_layer
                                                                            : m.name;
    if (const auto [it, fresh] = by_layer.try_emplace(layer, mi); !fresh) units.join(mi, it->second);
    if (m.amax_set) {
      for (const std::size_t k : plan.amax_sets[*m.amax_set]) units.join(mi, k);
    }
    const SchemeGroup& g = plan.group_of(m);
    QuantArgs mse = g.weights;
    mse.observer = auto_mse_observer(g.weights);
    mse.observer_kwargs = mse_kwargs;
    QuantArgs refit = g.weights;
    refit.observer = kRefitObserver;
    refit.observer_kwargs = refit_kwargs;
    c.not_measured = g.family()->supports(mse);
    if (c.not_measured.empty()) c.mse_observer = mse.observer;
    c.refit_not_measured = g.family()->supports(refit);
    c.refit_measured = c.refit_not_measured.empty();
    if ((c.mse_observer.empty() && !c.refit_measured) || in_set.contains(mi)) continue;
    MeasureSet u;
    u.modules = m.amax_set ? plan.amax_sets[*m.amax_set] : std::vector<std::size_t>{mi};
    u.minmax = g.weights;
    u.minmax.observer = "memoryless_minmax";
    u.minmax.observer_kwargs = nlohmann::json::object();
    if (!c.mse_observer.empty()) u.mse = mse;
    if (c.refit_measured) u.refit = refit;
    // Each observer reads a module once, the MSE one up to twice more (its
    // cutoff and a set's global scale), refit once more for a set's global
    // scale: the estimate only drives progress.
    for (const std::size_t k : u.modules) in_set.insert(k);
    const std::uint64_t reads = (m.amax_set ? 2 : 1) * (1 + (u.mse ? 2 : 0) + (u.refit ? 1 : 0));
    u.bytes = bytes_read(checkpoint, plan, u.modules, reads);
    sets.push_back(std::move(u));
  }
  // The kwargs are checked once, before any weight is read.
  if (!sets.empty()) {
    observer_params(auto_mse_observer(sets.front().minmax), mse_kwargs, "--observer-kwarg");
    observer_params(kRefitObserver, refit_kwargs, "--observer-kwarg");
  }

  std::uint64_t bytes_total = 0;
  std::vector<std::uint64_t> modules;
  for (const MeasureSet& u : sets) {
    bytes_total += u.bytes;
    modules.push_back(u.modules.size());
  }
  std::atomic<std::uint64_t> bytes_done{0};
  // Per set: the errors with min-max, the MSE observer and refit (empty
  // when not measured).
  using Measured = std::array<std::vector<QuantError>, 3>;
  const std::vector<Measured> measured = measure_in_parallel<Measured>(
      sets.size(), bytes_total, modules, options, ProgressPhase::kChooseObserver, bytes_done,
      [&](std::size_t u, const std::function<void()>& after_chunk) {
        const auto run = [&](const QuantArgs& args) {
          return SetMeasure(checkpoint, plan, sets[u].modules, args, options, bytes_done,
                            after_chunk)
              .run();
        };
        Measured m;
        m[0] = run(sets[u].minmax);
        if (sets[u].mse) m[1] = run(*sets[u].mse);
        if (sets[u].refit) m[2] = run(*sets[u].refit);
        return m;
      });

  for (std::size_t u = 0; u < sets.size(); ++u) {
    for (std::size_t k = 0; k < sets[u].modules.size(); ++k) {
      ModuleObserverChoice& c = choices.modules[slot.at(sets[u].modules[k])];
      c.minmax = measured[u][0][k];
      if (!measured[u][1].empty()) c.mse = measured[u][1][k];
      if (!measured[u][2].empty()) c.refit = measured[u][2][k];
    }
  }
  // A unit keeps the scales whose ||W - Q|| together is lowest, another
  // observer's only when all its modules were measured with it and it is
  // strictly lower (min-max first, then the MSE observer, then refit: a
  // tie keeps the earlier).
  struct Sum {
    QuantError minmax;
    QuantError mse;
    QuantError refit;
    bool mse_measured = true;
    bool refit_measured = true;
  };
  std::map<std::size_t, Sum> sums;
  for (const ModuleObserverChoice& c : choices.modules) {
    Sum& s = sums[units.find(c.module)];
    s.minmax.add(c.minmax);
    s.mse.add(c.mse);
    s.refit.add(c.refit);
    s.mse_measured = s.mse_measured && !c.mse_observer.empty();
    s.refit_measured = s.refit_measured && c.refit_measured;
  }
  for (ModuleObserverChoice& c : choices.modules) {
    const Sum& s = sums.at(units.find(c.module));
    double best = s.minmax.err2;
    c.chosen = "memoryless_minmax";
    if (s.mse_measured && s.mse.err2 < best) {
      best = s.mse.err2;
      c.chosen = c.mse_observer;
    }
    if (s.refit_measured && s.refit.err2 < best) c.chosen = kRefitObserver;
  }
  return choices;
}

PlanOptions split_groups_by_observer(const PlanOptions& given, const QuantizePlan& plan,
                                     const ObserverChoices& choices, const nlohmann::json& kwargs) {
  const auto [mse_kwargs, refit_kwargs] = split_auto_kwargs(kwargs);
  // Per group, the modules of each observer: min-max, the MSE observer, refit.
  std::vector<std::array<std::vector<std::string>, 3>> by(plan.options.groups.size());
  for (const ModuleObserverChoice& c : choices.modules) {
    const PlannedModule& m = plan.modules[c.module];
    by[m.group][c.use_mse() ? 1 : c.use_refit() ? 2 : 0].push_back(m.name);
  }
  std::set<std::string> names;
  for (const SchemeGroup& g : plan.options.groups) names.insert(g.name);
  PlanOptions out = given;
  out.groups.clear();
  for (std::size_t gi = 0; gi < plan.options.groups.size(); ++gi) {
    const SchemeGroup& g = plan.options.groups[gi];
    std::array<SchemeGroup, 3> split{g, g, g};
    split[1].weights.observer = auto_mse_observer(g.weights);
    split[1].weights.observer_kwargs = mse_kwargs;
    split[2].weights.observer = kRefitObserver;
    split[2].weights.observer_kwargs = refit_kwargs;
    const auto used = std::count_if(by[gi].begin(), by[gi].end(),
                                    [](const auto& modules) { return !modules.empty(); });
    for (std::size_t k = 0; k < 3; ++k) {
      if (by[gi][k].empty() && !(used == 0 && k == 0)) continue;
      SchemeGroup& part = split[k];
      if (used > 1) {
        // Entries each engine finds under its own names (model/roles.hpp).
        part.targets = exact_target_entries(plan.roles, by[gi][k]);
        if (k > 0) {
          part.name = g.name + "_" + part.weights.observer;
          for (int n = 2; names.contains(part.name); ++n) {
            part.name = fmt::format("{}_{}_{}", g.name, part.weights.observer, n);
          }
          names.insert(part.name);
        }
      }
      out.groups.push_back(std::move(part));
    }
  }
  return out;
}

std::vector<std::vector<QuantError>> measure_errors(const Checkpoint& checkpoint,
                                                    const QuantizePlan& plan,
                                                    const std::vector<ErrorMeasure>& measures,
                                                    const ObserverChoiceOptions& options,
                                                    ProgressPhase phase) {
  for (const ErrorMeasure& m : measures) {
    observer_params(m.weights.observer, m.weights.observer_kwargs, "--observer");
  }
  std::uint64_t bytes_total = 0;
  std::vector<std::uint64_t> modules;
  for (const ErrorMeasure& m : measures) {
    const SchemeFamily* family =
        m.family != nullptr ? m.family : plan.group_of(plan.modules[m.modules.front()]).family();
    // Each module read once, once more for a global scale and for an MSE
    // search's cutoff: the estimate only drives progress.
    const std::uint64_t passes = 1 + (family->needs_tensor_amax(m.weights) ? 1 : 0) +
                                 (m.weights.observer == "memoryless_minmax" ? 0 : 1);
    bytes_total += bytes_read(checkpoint, plan, m.modules, passes);
    modules.push_back(m.modules.size());
  }
  std::atomic<std::uint64_t> bytes_done{0};
  const std::vector<std::vector<QuantError>> out = measure_in_parallel<std::vector<QuantError>>(
      measures.size(), bytes_total, modules, options, phase, bytes_done,
      [&](std::size_t i, const std::function<void()>& after_chunk) {
        return SetMeasure(checkpoint, plan, measures[i].modules, measures[i].weights, options,
                          bytes_done, after_chunk, measures[i].family)
            .run();
      });
  return out;
}

}  // namespace ctquant
