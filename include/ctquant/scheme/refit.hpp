// The refit observer: per scale group, the scale (and integer zero point)
// with the lowest weighted squared error of what compressed-tensors
// dequantizes, with no change of format: the same tensors, dtypes and
// shapes as min-max, read by vLLM and transformers as any other
// checkpoint. ctquant's own method; llm-compressor cannot reproduce it
// (docs/observers.md, "refit").
//
// Like the MSE observers, refit hands the kernels a range [lo, hi] per
// group (ObserveIo::ranges) from which compressed-tensors'
// calculate_qparams derives the scale (docs/schemes.md 3.2): the range is
// synthesized so that it gives exactly the chosen scale and zero point
// (refit_detail below), and the unchanged kernels write the outputs. Every
// candidate is evaluated as the kernel would write it: its qparams derived
// from its range by calculate_qparams' arithmetic, its codes by the
// format's own round-to-nearest of x / scale rounded to the weight's dtype
// W (the double rounding of schemes.md 3.3), its error
// sum w_i (x_i - Q_i)^2 with Q_i the dequantized value as
// `fake_quantize` gives it (rounded to W). The error is accumulated in
// double, element by element in the group's order; a candidate replaces the
// best one only when its error is strictly lower, and min-max is always the
// first, so refit's weighted error is never above min-max's.
//
// - Symmetric int (W4A16, W8A16, W8A8 per channel; any group size):
//   min-max's scale s0, then candidates s_k = round_W(s0 * f_k),
//   f_k = float32(1 + span * (2k / steps - 1)), k = 0 .. steps (the one
//   with f_k = 1 is min-max itself and skipped). Each candidate is
//   evaluated, then refitted: with its codes q, the closed-form scale
//   s* = sum w x q / sum w q^2 (double), round_W(float32(s*)), evaluated
//   with the codes that scale gives. w = 1, or x^2 (kwarg weight=x2).
// - Asymmetric int (W4A16_ASYM): HQQ's half-quadratic search for the zero
//   point at min-max's scale (lp norm p, beta, kappa, iters; Badri and
//   Shaji, "Half-Quadratic Quantization of Large Machine Learning Models",
//   2023, optimize_weights_proximal_legacy), each iterate's zero point
//   rounded to an integer in [qmin, qmax] and evaluated (vLLM deprecated
//   float zero points, vLLM pull request 32681); then, with the best zero
//   point fixed, the closed-form scale sum w x (q - z) / sum w (q - z)^2.
// - NVFP4: the group's E4M3 scale code, among the `codes` codes on either
//   side of min-max's, under the module's min-max global scale (which
//   refit leaves as it is: fused partners keep sharing it).
// - MX (MXFP4, MXFP8): the E8M0 exponent of min-max, or that exponent
//   minus one, whichever gives the lower error.
//
// Refused (refit_unsupported in observer.hpp): per-tensor scales and FP8
// weights.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/scheme.hpp"

namespace ctquant {

// refit's observer_kwargs: steps (a whole number, at most kMaxMseSteps - 1:
// steps + 1 candidates), span (in [0, 1)), weight (1 or "x2"), p (in
// (0, 1]), beta (positive), kappa (at least 1; beta * kappa^iters finite as
// a float32), iters (a whole number, at most kMaxMseSteps), codes (a whole
// number, at most 64). Every number must be finite as a float32. Throws
// usage_error naming `where` and the kwarg; warns (add_observer_warning)
// when steps, iters or codes exceed kMseCostWarningFactor times the
// default.
RefitParams refit_params(const nlohmann::json& kwargs, const std::string& where);

// The ranges refit chooses for every group of the chunk (io.tensor_amax:
// the NVFP4 global scale's max |w|). The scalar reference, which reads like
// the algorithm, and the vector kernel (refit_simd.cpp: BF16 and F16
// integer weights in groups of columns; the reference otherwise), with the
// same results bit for bit.
void observe_refit_ref(const QuantArgs& args, const RefitParams& params, const ObserveIo& io);
void observe_refit(const QuantArgs& args, const RefitParams& params, const ObserveIo& io);

// The ranges that give a chosen scale and zero point, and the pieces of the
// search, exposed for tests.
namespace refit_detail {

// A symmetric int scale s as a range: {-h, h}, h = float32(s * (qmax -
// qmin) / 2) (7.5 s for int4, 127.5 s for int8), exact in float32 for BF16
// and F16 s, so that calculate_qparams' round_W(h / ((qmax - qmin) / 2)) is
// s.
std::array<float, 2> symmetric_range(const QuantArgs& args, float s);

// An asymmetric int candidate as a range: the zero point z (an integer in
// [qmin, qmax]) and the range's width `width` (a value of W; the scale is
// round_W(width / (qmax - qmin)), calculate_qparams' rule):
// lo = (qmin - z) * s, hi = lo + width, with s = round_W(width / (qmax -
// qmin)). For BF16 and F16 every product and the sum are exact in float32,
// so calculate_qparams gives s and z back whenever hi >= 0.
std::array<float, 2> asymmetric_range(const QuantArgs& args, DType w, float width, float z);

// NVFP4: a group amax whose E4M3 scale code under global scale gs is
// `code` (nvfp4_group_scale of microscale.hpp): 6 s for the W value s
// nearest code / gs with that code, or nullopt when no W value has it (a
// code below what W can reach under gs, or above 448).
std::optional<float> nvfp4_amax_for_code(DType w, float gs, std::uint8_t code);

// MX: a group amax whose E8M0 exponent byte is e (2^(e - 127 + offset)), or
// nullopt when W cannot hold it (F16) or mx_scale gives another byte.
std::optional<float> mx_amax_for_exponent(DType w, int offset, int e);

// |a|^t for a != 0 and t in (-1, 0], as exp2(t log2 |a|) with the float
// steps both kernels compute (a relative error of about 1e-5: HQQ's shrink
// operator only needs to be the same in both); 0 for a == 0.
float hqq_pow(float a, float t);

// HQQ's shrink operator sign(r) max(|r| - |r|^(p - 1) / beta, 0), with
// inv_beta = float32(1 / beta). (The search skips the power where |r| is
// below half the point where the operator becomes non-zero, where it is
// zero anyway: refit_steps.hpp, hqq_cut.)
float hqq_shrink(float r, float inv_beta, float p_minus_1);

}  // namespace refit_detail

}  // namespace ctquant
