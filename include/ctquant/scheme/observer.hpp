// Weight observers: how the range [lo, hi] that a scale is computed from is
// chosen for each scale group (a group of columns, a row, a block), as
// llm-compressor's observers choose it (`observers/min_max.py`,
// `observers/mse.py`, `observers/mse_quant.py`; docs/observers.md).
//
// - memoryless_minmax (the default, also "minmax" and "static_minmax"):
//   lo = min(group), hi = max(group).
// - memoryless_mse and nvfp4_expanded_mse: a grid search over shrink
//   factors p_i = 1 - i / grid, i = 0 .. int(maxshrink * grid) - 1, of the
//   group's range times `expand`: for each candidate the group is
//   quantized and dequantized as compressed-tensors' `calculate_qparams`
//   and `fake_quantize` do in the weight's dtype W, its error is
//   sum |Q - W|^norm as PyTorch's CPU kernels compute it (`pow` with the
//   exponent rounded to W, the sum accumulated in float32 in the order of
//   PyTorch's x86-64 cascade sum, rounded to W), and the first candidate
//   with the smallest error is kept. The search stops after `patience`
//   consecutive candidates that improve no group of the whole tensor
//   (`mse_cutoff`).
// - refit (ctquant's own; the library cannot reproduce it): per group the
//   scale (and integer zero point) with the lowest weighted squared error
//   of what compressed-tensors dequantizes, expressed as a range, with no
//   change of format (scheme/refit.hpp; docs/observers.md, "refit").
//
// The search is exact for BF16 and F16 weights (every pow of a W value is
// tabulated); for F32 weights PyTorch's pow is SLEEF's (1 ulp), which this
// does not reproduce, so near-ties may pick another candidate.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/scheme.hpp"

namespace ctquant {

// The observer_kwargs of refit (scheme/refit.hpp; docs/observers.md says
// what each does and why its default).
struct RefitParams {
  // Int: candidate k = 0 .. steps is the min-max scale (asymmetric: range)
  // times 1 + span * (2k / steps - 1) (span in [0, 1): positive scales
  // only). Each is evaluated, and the least-squares refit of its codes
  // predicted; the best predicted refit is evaluated, and refitted again,
  // `refits` times in all. span unset: span_for's default.
  std::uint32_t steps = 8;
  std::optional<double> span;
  std::uint32_t refits = 2;
  // The importance weight of each element in the error: 1, or x^2 ("x2").
  bool weight_x2 = false;
  // Asymmetric int: HQQ's half-quadratic zero-point search (lp norm p,
  // penalty beta growing by kappa per iteration, iters iterations).
  double p = 0.7;
  double beta = 10.0;
  double kappa = 1.01;
  std::uint32_t iters = 20;
  // NVFP4: the E4M3 group-scale codes tried on either side of min-max's.
  std::uint32_t codes = 4;

  // The span of an integer format of num_bits bits: the one given, else
  // 0.2 up to 4 bits and 0.05 above (the finer grid of 8-bit codes makes
  // their best scale lie closer to min-max's: measured on the Laguna-S-2.1
  // layout, docs/observers.md).
  double span_for(int num_bits) const { return span ? *span : num_bits <= 4 ? 0.2 : 0.05; }
};

// The parameters of an observer, from its name and observer_kwargs
// (defaults of llm-compressor `observers/mse.py`).
struct ObserverParams {
  bool mse = false;    // false: min-max (or refit)
  bool refit = false;  // refit: its kwargs in refit_params
  RefitParams refit_params;
  double maxshrink = 0.20;  // memoryless_mse; nvfp4_expanded_mse 1 - 0.8 / 1.8
  double grid = 100.0;      // nvfp4_expanded_mse 200
  double norm = 2.4;
  long long patience = 5;   // nvfp4_expanded_mse 1000
  double expand = 1.0;      // nvfp4_expanded_mse 1.8

  // int(maxshrink * grid): the number of candidates (0 when not positive,
  // saturated at the largest uint32).
  std::uint32_t steps() const;
  // Whether the observer chooses ranges before the kernel runs (an MSE
  // search or refit): false for min-max, whose kernels take each group's
  // own min and max.
  bool chooses_ranges() const { return mse || refit; }
};

// What an observer name means to ctquant.
struct ObserverChoice {
  std::string written;  // the name config.json gets
  std::string note;     // an info line for the user when the name was mapped, else ""
};

// Resolves a weights `observer` name as model_free_ptq takes it. Throws
// usage_error (exit 2) naming `where` for an observer that needs
// calibration data or activations (imatrix_mse) or is unknown.
// "minmax" -> "static_minmax" (the library's rewrite; one observation, same
// scales); "mse" and "static_mse" -> "memoryless_mse" (the library rewrites
// "mse" to "static_mse", which it has not registered, and fails; the
// memoryless observer of that name is what a user means).
ObserverChoice resolve_observer(const std::string& name, const std::string& where);

// The observer's parameters from its (resolved) name and observer_kwargs.
// Throws usage_error naming `where` and the kwarg for an unknown key, a
// value of the wrong type, a number that is not finite as a float32
// (magnitude above 3.4028235e38: the search computes with the kwargs in
// float32, where it would be an infinity), or out of range (chunk_size <=
// 0, grid 0, expand < 1 and norm <= 0, as llm-compressor refuses them; more
// than kMaxMseSteps candidates, counted in double before any conversion).
// Adds an info line (add_observer_note) when the kwargs leave no candidates,
// and a warning (add_observer_warning) when they make the search cost more
// than kMseCostWarningFactor times the observer's default candidates, with
// the estimate, or when every candidate range is wider than
// kObserverRangeWarningFactor times the group's min-max range (expand too
// large: the scales then leave most levels unused), naming the kwarg and the
// expand that would not be.
ObserverParams observer_params(const std::string& observer, const nlohmann::json& kwargs,
                               const std::string& where);
inline constexpr std::uint32_t kMaxMseSteps = 1024;
// Candidates of the default kwargs: memoryless_mse int(0.2 * 100);
// nvfp4_expanded_mse int((1 - 0.8 / 1.8) * 200).
inline constexpr std::uint32_t kMemorylessMseSteps = 20;
inline constexpr std::uint32_t kExpandedMseSteps = 111;
// A search of more candidates than this many times the default's is
// announced with a warning (the cost of a group's search is proportional to
// its candidates).
inline constexpr std::uint32_t kMseCostWarningFactor = 10;
// A search whose narrowest candidate range is more than this many times the
// group's min-max range is announced with a warning.
inline constexpr double kObserverRangeWarningFactor = 2.0;

bool is_mse_observer(const std::string& observer);
inline constexpr const char* kRefitObserver = "refit";
// The observer_kwargs refit takes (RefitParams; refit_params of refit.hpp).
inline constexpr std::array<std::string_view, 9> kRefitKwargs = {
    "steps", "span", "refits", "weight", "p", "beta", "kappa", "iters", "codes"};
bool is_refit_observer(const std::string& observer);

// The info lines of resolve_observer's mappings ("mse" runs as
// memoryless_mse) met while reading options, each once, for the CLI to print;
// take_observer_notes() returns them and starts a new list. Thread-safe.
void add_observer_note(const std::string& note);
std::vector<std::string> take_observer_notes();
// The same for warnings (observer_kwargs that make the search much slower).
void add_observer_warning(const std::string& warning);
std::vector<std::string> take_observer_warnings();

// Why a family cannot search scales for these args with an MSE observer,
// or "" when it can. Per-tensor scales are refused: the library sums the
// error of the whole tensor in an order that depends on PyTorch's thread
// count, so its bytes depend on the machine.
std::string mse_unsupported(const QuantArgs& args);

// Why refit cannot choose the scales of these args, or "" when it can:
// integer weights with group or channel scales (symmetric or asymmetric),
// NVFP4 and MX. Refused: per-tensor scales (one scale for the whole tensor,
// no groups to refit) and FP8 weights (channel, block, tensor: refit
// searches integer grids and the NVFP4 and MX scale codes; use
// memoryless_mse for FP8).
std::string refit_unsupported(const QuantArgs& args);

// The kwargs given to --observer auto split between the two searches it
// measures: {MSE observer's, refit's} (the keys are disjoint; a key
// neither takes goes to the MSE observer, which refuses it).
std::pair<nlohmann::json, nlohmann::json> split_auto_kwargs(const nlohmann::json& kwargs);

// A family row's `supports` with the observer's rule added
// (SchemeFamily::supports): the family's own reason, else mse_unsupported
// for an MSE observer.
template <std::string (*Supports)(const QuantArgs&)>
std::string supports_with_observer(const QuantArgs& args);

// max(|min(lo, 0)|, max(hi, 0)) of group g of observer ranges: what a
// symmetric scale is computed from (calculate_qparams).
inline float range_amax(const float* ranges, std::uint64_t g) {
  const float lo = ranges[2 * g] < 0.0f ? -ranges[2 * g] : 0.0f;
  const float hi = ranges[2 * g + 1] > 0.0f ? ranges[2 * g + 1] : 0.0f;
  return lo > hi ? lo : hi;
}

// ---- the search ----

// One chunk of whole rows of a weight [R, C] and the scale groups it holds
// (group/tensor_group: n_rows x C / g; channel: n_rows x 1; block: the
// block rows of the chunk x ceil(C / bw), n_rows a multiple of the block
// height or the weight's last rows).
struct ObserveIo {
  DType dtype = DType::kBF16;
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  const std::byte* weight = nullptr;
  // Per scale group, row-major over the chunk's groups: lo, hi. Written by
  // observe_ranges. The MSE searches give values of dtype; refit gives
  // floats that calculate_qparams turns into exactly the scale (and zero
  // point) it chose (scheme/refit.hpp).
  float* ranges = nullptr;
  // refit under NVFP4: max |w| of the module's fused set (KernelIo's
  // tensor_amax), whose global scale the group scales are refitted under.
  float tensor_amax = 0.0f;
};

// Scale groups of a chunk of n_rows rows (the size of ObserveIo::ranges / 2).
std::uint64_t observed_groups(const QuantArgs& args, std::uint64_t n_rows, std::uint64_t n_cols);

// Bit i set when candidate i lowered the error of some group.
using ImprovedSteps = std::vector<std::uint64_t>;

// Search every group of the chunk over candidates 0 .. cutoff and write
// the chosen ranges; or the group's min and max for min-max; refit
// (params.refit) runs observe_refit_ref / observe_refit of
// scheme/refit.hpp, whatever cutoff and improved say. When improved is
// given, OR into it the candidates that improved some group. The scalar
// reference and the vector kernel (same results, bit for bit).
void observe_ranges_ref(const QuantArgs& args, const ObserverParams& params, std::uint32_t cutoff,
                        const ObserveIo& io, ImprovedSteps* improved);
void observe_ranges(const QuantArgs& args, const ObserverParams& params, std::uint32_t cutoff,
                    const ObserveIo& io, ImprovedSteps* improved);

// The last candidate the library evaluates, given the candidates that
// improved some group of the whole tensor: the search stops at the first
// candidate that ends a run of `patience` candidates improving nothing.
std::uint32_t mse_cutoff(const ObserverParams& params, const ImprovedSteps& improved);

// Whether more rows can change mse_cutoff: false once every run of
// `patience` candidates after the first has an improvement (the cutoff is
// then the last candidate whatever the other rows do).
bool mse_cutoff_settled(const ObserverParams& params, const ImprovedSteps& improved);

// The PyTorch CPU steps the search is built from, exposed for tests.
namespace mse_detail {
// |d|^e as PyTorch's `pow` gives it in W (BF16 and F16 bits in, bits out).
std::uint16_t pow_w(DType w, std::uint16_t magnitude_bits, double norm);
// sum of n values of W (as float) in the order of PyTorch's CPU cascade sum
// over a contiguous inner dimension on x86-64 (256-bit vectors, which
// PyTorch's sum runs on AVX-512 CPUs too), rounded to W.
float torch_sum_w(DType w, std::span<const float> values);
}  // namespace mse_detail

template <std::string (*Supports)(const QuantArgs&)>
std::string supports_with_observer(const QuantArgs& args) {
  std::string why = Supports(args);
  if (why.empty() && is_mse_observer(args.observer)) why = mse_unsupported(args);
  if (why.empty() && is_refit_observer(args.observer)) why = refit_unsupported(args);
  return why;
}

}  // namespace ctquant
