#include "ctquant/scheme/observer.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "ctquant/format/minifloat.hpp"
#include "ctquant/scheme/refit.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "ctquant/util/error.hpp"
#include "scheme/microscale.hpp"
#include "scheme/observer_steps.hpp"

namespace ctquant {

using json = nlohmann::json;
using S = QuantArgs::Strategy;

// ---- names and parameters ----

ObserverChoice resolve_observer(const std::string& name, const std::string& where) {
  if (name == "memoryless_minmax" || name == "static_minmax" || name == "memoryless_mse" ||
      name == "nvfp4_expanded_mse" || name == kRefitObserver) {
    return {name, ""};
  }
  if (name == "minmax") return {"static_minmax", ""};
  if (name == "mse" || name == "static_mse") {
    return {"memoryless_mse",
            fmt::format("{}: observer \"{}\" runs as memoryless_mse (model_free_ptq rewrites "
                        "\"mse\" to \"static_mse\", which llm-compressor has not registered, and "
                        "fails; a weight is observed once, so the memoryless search is the one "
                        "meant); config.json records \"memoryless_mse\"",
                        where, name)};
  }
  if (name == "imatrix_mse") {
    throw usage_error(fmt::format(
        "{}: observer \"imatrix_mse\" weights each column by the mean square of its input "
        "activations, which needs calibration data; ctquant is data-free (memoryless_mse, "
        "nvfp4_expanded_mse and memoryless_minmax need none)",
        where));
  }
  if (name == "auto") {
    throw usage_error(fmt::format(
        "{}: observer \"auto\" is ctquant's choice per module for the whole run: give it as "
        "--observer auto (or a recipe's weight_observer), not per group",
        where));
  }
  throw usage_error(fmt::format(
      "{}: observer \"{}\" is not a weight observer ctquant knows (memoryless_minmax, "
      "static_minmax, minmax, memoryless_mse, mse, nvfp4_expanded_mse, refit; imatrix_mse "
      "needs calibration data; --observer auto chooses per module)",
      where, name));
}

namespace {
std::mutex& notes_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& notes() {
  static std::vector<std::string> n;
  return n;
}
std::vector<std::string>& warnings() {
  static std::vector<std::string> w;
  return w;
}
void add_once(std::vector<std::string>& list, const std::string& text) {
  const std::lock_guard lock(notes_mutex());
  if (std::find(list.begin(), list.end(), text) == list.end()) list.push_back(text);
}
}  // namespace

void add_observer_note(const std::string& note) { add_once(notes(), note); }

std::vector<std::string> take_observer_notes() {
  const std::lock_guard lock(notes_mutex());
  return std::exchange(notes(), {});
}

void add_observer_warning(const std::string& warning) { add_once(warnings(), warning); }

std::vector<std::string> take_observer_warnings() {
  const std::lock_guard lock(notes_mutex());
  return std::exchange(warnings(), {});
}

bool is_mse_observer(const std::string& observer) {
  return observer == "memoryless_mse" || observer == "nvfp4_expanded_mse";
}

bool is_refit_observer(const std::string& observer) { return observer == kRefitObserver; }

std::uint32_t ObserverParams::steps() const {
  const double n = maxshrink * grid;  // Python int(): truncation toward zero
  if (!(n >= 1.0)) return 0;          // also NaN
  // Saturated rather than converted out of range (observer_params refuses
  // more than kMaxMseSteps anyway).
  if (n >= static_cast<double>(std::numeric_limits<std::uint32_t>::max())) {
    return std::numeric_limits<std::uint32_t>::max();
  }
  return static_cast<std::uint32_t>(n);
}

namespace {

double number_kwarg(const json& v, const std::string& key, const std::string& where) {
  if (!v.is_number() || v.is_boolean()) {
    throw usage_error(fmt::format("{}: observer_kwargs.{} {} is not a number", where, key, v.dump()));
  }
  const double d = v.get<double>();
  // The search multiplies ranges by the kwargs in float32 (a Python float
  // times a float32 tensor): a value beyond float32 is an infinity there.
  if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
    throw usage_error(fmt::format(
        "{}: observer_kwargs.{} {} is not finite as a float32 (every observer kwarg must be a "
        "finite number of magnitude at most {}: the search computes with it in float32)",
        where, key, v.dump(), std::numeric_limits<float>::max()));
  }
  return d;
}

}  // namespace

ObserverParams observer_params(const std::string& observer, const json& kwargs,
                               const std::string& where) {
  ObserverParams p;
  if (!kwargs.is_null() && !kwargs.is_object()) {
    throw usage_error(fmt::format("{}: observer_kwargs {} is not an object", where, kwargs.dump()));
  }
  const bool has_kwargs = kwargs.is_object() && !kwargs.empty();
  if (is_refit_observer(observer)) {
    p.refit = true;
    p.refit_params = refit_params(kwargs, where);
    return p;
  }
  if (!is_mse_observer(observer)) {
    if (has_kwargs) {
      throw usage_error(fmt::format("{}: observer_kwargs {}: {} takes none", where, kwargs.dump(),
                                    observer));
    }
    return p;
  }
  p.mse = true;
  // llm-compressor `observers/mse.py`: NVFP4ExpandedMSEObserver's defaults.
  const bool expanded = observer == "nvfp4_expanded_mse";
  if (expanded) {
    p.expand = 1.8;
    p.maxshrink = 1.0 - 0.8 / 1.8;
    p.grid = 200.0;
    p.patience = 1000;
  }
  if (!has_kwargs) return p;
  for (const auto& [key, value] : kwargs.items()) {
    if (key == "maxshrink") {
      p.maxshrink = number_kwarg(value, key, where);
    } else if (key == "grid") {
      p.grid = number_kwarg(value, key, where);
      if (p.grid == 0.0) {
        throw usage_error(fmt::format("{}: observer_kwargs.grid must not be 0", where));
      }
    } else if (key == "norm") {
      p.norm = number_kwarg(value, key, where);
      if (!(p.norm > 0.0)) {
        throw usage_error(fmt::format("{}: observer_kwargs.norm {} must be greater than 0", where,
                                      value.dump()));
      }
    } else if (key == "patience") {
      if (!value.is_number_integer()) {
        throw usage_error(fmt::format("{}: observer_kwargs.patience {} is not a whole number",
                                      where, value.dump()));
      }
      // Beyond long long: never stops early, as any patience above the
      // candidate count.
      p.patience = value.is_number_unsigned() &&
                           value.get<std::uint64_t>() >
                               static_cast<std::uint64_t>(std::numeric_limits<long long>::max())
                       ? std::numeric_limits<long long>::max()
                       : value.get<long long>();
    } else if (key == "expand") {
      p.expand = number_kwarg(value, key, where);
      if (p.expand < 1.0) {
        throw usage_error(fmt::format(
            "{}: observer_kwargs.expand {} must be at least 1.0 (llm-compressor refuses it)", where,
            value.dump()));
      }
    } else if (key == "chunk_size") {
      // Only the compiled search uses it (candidates per torch.compile
      // call); the library still refuses a non-positive one.
      if (!(number_kwarg(value, key, where) > 0.0)) {
        throw usage_error(fmt::format("{}: observer_kwargs.chunk_size must be positive", where));
      }
    } else if (key == "averaging_constant") {
      number_kwarg(value, key, where);  // the moving average of "mse": one observation
    } else {
      throw usage_error(fmt::format(
          "{}: observer_kwargs.{} is not a parameter of {} (maxshrink, grid, norm, patience, "
          "expand, chunk_size)",
          where, key, observer));
    }
  }
  // The count in double, before any conversion: int(1e23 * 0.2) is no
  // small number.
  const double candidates = std::trunc(p.maxshrink * p.grid);
  if (candidates > static_cast<double>(kMaxMseSteps)) {
    throw usage_error(fmt::format(
        "{}: observer_kwargs: int(maxshrink * grid) = int({} * {}) = {} candidates; ctquant "
        "searches at most {}",
        where, p.maxshrink, p.grid, candidates, kMaxMseSteps));
  }
  if (p.steps() == 0) {
    add_observer_note(fmt::format(
        "{}: observer_kwargs give {} no candidates (int(maxshrink * grid) = int({} * {}) <= 0): "
        "every group keeps its min-max range, as llm-compressor does, and config.json records "
        "the observer as given",
        where, observer, p.maxshrink, p.grid));
  }
  const std::uint32_t default_steps = expanded ? kExpandedMseSteps : kMemorylessMseSteps;
  if (p.steps() > kMseCostWarningFactor * default_steps) {
    add_observer_warning(fmt::format(
        "{}: observer_kwargs make {} search up to {} candidates per group (int(maxshrink * "
        "grid) = int({} * {})), {:.1f}x the {} of its default kwargs: expect the search to take "
        "about {:.1f}x as long (docs/observers.md)",
        where, observer, p.steps(), p.maxshrink, p.grid,
        static_cast<double>(p.steps()) / default_steps, default_steps,
        static_cast<double>(p.steps()) / default_steps));
  }
  // The narrowest candidate range, as a multiple of the group's min-max
  // range: expand times the shrink factor 1 - i / grid nearest 0 (with no
  // candidates the search keeps the expanded range itself).
  double narrowest = std::fabs(p.expand);
  for (std::uint32_t i = 0; i < p.steps(); ++i) {
    narrowest = std::min(narrowest, std::fabs(p.expand * (1.0 - i / p.grid)));
  }
  if (narrowest > kObserverRangeWarningFactor) {
    const double default_expand = expanded ? 1.8 : 1.0;
    add_observer_warning(fmt::format(
        "{}: observer_kwargs make every candidate range of {} at least {:.3g}x the weights' "
        "min-max range (expand {} times the shrink factors 1 - i / grid): scales that wide "
        "leave most quantization levels unused and the weights lose most of their precision "
        "(every weight rounds to 0 when expand is large); give observer_kwargs.expand at most "
        "{:.3g} (its default for {} is {})",
        where, observer, narrowest, p.expand,
        p.expand * kObserverRangeWarningFactor / narrowest, observer, default_expand));
  }
  return p;
}

std::string mse_unsupported(const QuantArgs& args) {
  if (args.strategy == S::kTensor) {
    return "an MSE observer with one scale per tensor: llm-compressor sums the error of the whole "
           "tensor over PyTorch's threads, so its result depends on the machine's thread count; "
           "use strategy channel, group or block";
  }
  if (args.type == QuantArgs::Type::kFloat && args.num_bits != 4 && args.num_bits != 8) {
    return fmt::format("{}-bit float weights", args.num_bits);
  }
  if (!args.symmetric && args.type != QuantArgs::Type::kInt) {
    return "asymmetric float weights";
  }
  if (args.scale_dtype && args.strategy != S::kTensorGroup && !detail::is_mx(args)) {
    return "a scale_dtype outside NVFP4 and MX";
  }
  return {};
}

std::string refit_unsupported(const QuantArgs& args) {
  if (args.strategy == S::kTensor) {
    return "refit with one scale per tensor: refit chooses each group's scale, and a per-tensor "
           "scale has no groups; use strategy channel or group";
  }
  if (args.type == QuantArgs::Type::kFloat && args.strategy != S::kTensorGroup &&
      !detail::is_mx(args)) {
    return "refit with FP8 weights: refit searches integer grids and the NVFP4 and MX scale "
           "codes, and FP8's own grid is left to round-to-nearest; use memoryless_minmax or "
           "memoryless_mse";
  }
  if (args.type == QuantArgs::Type::kFloat && !args.symmetric) {
    return "asymmetric float weights";
  }
  return {};
}

std::pair<json, json> split_auto_kwargs(const json& kwargs) {
  json mse = json::object();
  json refit = json::object();
  if (kwargs.is_object()) {
    for (const auto& [key, value] : kwargs.items()) {
      const bool of_refit =
          std::find(kRefitKwargs.begin(), kRefitKwargs.end(), key) != kRefitKwargs.end();
      (of_refit ? refit : mse)[key] = value;
    }
  }
  return {mse, refit};
}

std::uint64_t observed_groups(const QuantArgs& args, std::uint64_t n_rows, std::uint64_t n_cols) {
  switch (args.strategy) {
    case S::kGroup:
    case S::kTensorGroup:
      return n_rows * (n_cols / args.group_size);
    case S::kChannel:
      return n_rows;
    case S::kBlock:
      return ((n_rows + args.block[0] - 1) / args.block[0]) *
             ((n_cols + args.block[1] - 1) / args.block[1]);
    case S::kTensor:
      return 1;
  }
  return 0;
}

std::uint32_t mse_cutoff(const ObserverParams& params, const ImprovedSteps& improved) {
  const std::uint32_t steps = params.steps();
  long long no_improve = 0;
  for (std::uint32_t i = 0; i < steps; ++i) {
    const bool any = i / 64 < improved.size() && ((improved[i / 64] >> (i % 64)) & 1u) != 0;
    if (any) {
      no_improve = 0;
    } else if (++no_improve >= params.patience) {
      return i;
    }
  }
  return steps == 0 ? 0 : steps - 1;
}

bool mse_cutoff_settled(const ObserverParams& params, const ImprovedSteps& improved) {
  const std::uint32_t steps = params.steps();
  if (params.patience > static_cast<long long>(steps)) return true;  // never stops early
  long long no_improve = 0;
  for (std::uint32_t i = 0; i < steps; ++i) {
    const bool any = i / 64 < improved.size() && ((improved[i / 64] >> (i % 64)) & 1u) != 0;
    no_improve = any ? 0 : no_improve + 1;
    if (no_improve >= params.patience) return false;
  }
  return true;
}

// ---- PyTorch's arithmetic ----

namespace mse_detail {

std::uint16_t pow_w(DType w, std::uint16_t magnitude_bits, double norm) {
  // PyTorch rounds the exponent to the tensor's dtype; 2 and 3 are
  // multiplications (BF16: x*x*x rounded after each product), anything
  // else pow in float, correctly rounded, then rounded to W (checked on
  // every BF16 and F16 value against torch 2.14 on CPU).
  const float x = w == DType::kBF16 ? bf16_to_float(magnitude_bits) : f16_to_float(magnitude_bits);
  const float e = round_to_dtype(w, static_cast<float>(norm));
  float y = 0.0f;
  if (e == 2.0f) {
    y = x * x;
  } else if (e == 3.0f && w == DType::kBF16) {
    y = round_to_dtype(w, x * x) * x;
  } else {
    y = static_cast<float>(std::pow(static_cast<double>(x), static_cast<double>(e)));
  }
  return w == DType::kBF16 ? float_to_bf16(y) : float_to_f16(y);
}

float torch_sum_w(DType w, std::span<const float> values) {
  return detail::torch_sum(w, values.data(), values.size());
}

}  // namespace mse_detail

namespace detail {

const PowTable& pow_table(DType w, double norm) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::uint64_t>, std::unique_ptr<PowTable>> tables;
  const std::lock_guard lock(mutex);
  auto& slot = tables[{static_cast<int>(w), std::bit_cast<std::uint64_t>(norm)}];
  if (!slot) {
    slot = std::make_unique<PowTable>();
    for (std::uint32_t b = 0; b < 0x8000u; ++b) {
      const std::uint16_t r = mse_detail::pow_w(w, static_cast<std::uint16_t>(b), norm);
      slot->bits[b] = r;
      slot->value[b] = w == DType::kBF16 ? bf16_to_float(r) : f16_to_float(r);
    }
  }
  return *slot;
}

namespace {

// A value of the sum recorded as a slot (-1: zero).
struct SumSymbol {
  std::int64_t slot = -1;
  SumProgram* program = nullptr;
  SumSymbol& operator+=(const SumSymbol& o) {
    if (o.slot < 0) return *this;
    if (slot < 0) {
      slot = o.slot;
      program = o.program;
      return *this;
    }
    const auto dst = program->slots++;
    program->steps.push_back({dst, static_cast<std::uint32_t>(slot),
                              static_cast<std::uint32_t>(o.slot)});
    slot = dst;
    return *this;
  }
};

}  // namespace

const SumProgram& torch_sum_program(DType w, std::size_t n) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::size_t>, std::unique_ptr<SumProgram>> programs;
  const std::lock_guard lock(mutex);
  auto& slot = programs[{static_cast<int>(w), n}];
  if (!slot) {
    auto program = std::make_unique<SumProgram>();
    program->slots = static_cast<std::uint32_t>(n);
    SumProgram* p = program.get();
    const SumSymbol r = torch_sum_order<SumSymbol>(w, n, [&](std::size_t k) {
      return SumSymbol{static_cast<std::int64_t>(k), p};
    });
    program->result = r.slot;
    slot = std::move(program);
  }
  return *slot;
}

}  // namespace detail

// ---- the scalar reference search ----

namespace {

// The candidate range of step i: round_W(base * float32(1 - i / grid)).
float shrink(DType w, float base, double grid, std::uint32_t i) {
  const float p = static_cast<float>(1.0 - static_cast<double>(i) / grid);
  return round_to_dtype(w, base * p);
}

// Sum |fake_quantize(x) - x|^norm over one group, as _calculate_error does.
float group_error(const detail::Candidate& cand, const QuantArgs& args, DType w,
                  const float* x, std::size_t n, const detail::PowTable* table, double norm,
                  std::vector<float>& terms) {
  terms.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    const float d = round_to_dtype(w, detail::fake_quantize(cand, args, w, x[k]) - x[k]);
    if (table != nullptr) {
      const std::uint16_t mag = (w == DType::kBF16 ? float_to_bf16(d) : float_to_f16(d)) & 0x7FFFu;
      terms[k] = table->value[mag];
    } else {
      const float e = static_cast<float>(norm);
      terms[k] = e == 2.0f ? d * d : std::pow(std::fabs(d), e);
    }
  }
  return detail::torch_sum(w, terms.data(), n);
}

}  // namespace

void observe_ranges_ref(const QuantArgs& args, const ObserverParams& params, std::uint32_t cutoff,
                        const ObserveIo& io, ImprovedSteps* improved) {
  if (params.refit) {
    observe_refit_ref(args, params.refit_params, io);
    return;
  }
  const DType w = io.dtype;
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(w) / 8);
  const detail::GroupLayout layout = detail::group_layout(args, io.n_rows, io.n_cols);
  const detail::PowTable* table =
      params.mse && w != DType::kF32 ? &detail::pow_table(w, params.norm) : nullptr;
  const float expand = static_cast<float>(params.expand);
  const float start_error = w == DType::kBF16 ? 0x1.FEp127f
                            : w == DType::kF16 ? 65504.0f
                                               : std::numeric_limits<float>::max();
  std::vector<float> x;
  std::vector<float> terms;
  const std::uint32_t steps = params.steps();
  if (improved != nullptr && params.mse) improved->resize((steps + 63) / 64, 0);
  for (std::uint64_t g = 0; g < layout.n_groups; ++g) {
    // The group's elements in the order the library flattens them
    // (block: row-major inside the block, zero padding included).
    layout.gather(g, io.weight, esize, w, x);
    float lo = 0.0f;
    float hi = 0.0f;
    // torch.amin / amax over the group (not clamped to 0 here).
    lo = *std::min_element(x.begin(), x.end());
    hi = *std::max_element(x.begin(), x.end());
    if (params.mse) {
      const float lo0 = round_to_dtype(w, lo * expand);
      const float hi0 = round_to_dtype(w, hi * expand);
      float best = start_error;
      lo = lo0;
      hi = hi0;
      for (std::uint32_t i = 0; i <= cutoff && i < steps; ++i) {
        const float clo = shrink(w, lo0, params.grid, i);
        const float chi = shrink(w, hi0, params.grid, i);
        const detail::Candidate cand = detail::candidate(args, w, clo, chi);
        const float err = group_error(cand, args, w, x.data(), x.size(), table, params.norm, terms);
        if (err < best) {
          best = err;
          lo = clo;
          hi = chi;
          if (improved != nullptr) (*improved)[i / 64] |= std::uint64_t{1} << (i % 64);
        }
      }
    }
    io.ranges[2 * g] = lo;
    io.ranges[2 * g + 1] = hi;
  }
}

}  // namespace ctquant

