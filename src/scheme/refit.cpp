#include "ctquant/scheme/refit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ctquant/format/minifloat.hpp"
#include "ctquant/util/error.hpp"
#include "scheme/microscale.hpp"
#include "scheme/observer_steps.hpp"
#include "scheme/refit_steps.hpp"

namespace ctquant {

using json = nlohmann::json;

// ---- kwargs ----

namespace {

double refit_number(const json& v, const std::string& key, const std::string& where) {
  if (!v.is_number() || v.is_boolean()) {
    throw usage_error(
        fmt::format("{}: observer_kwargs.{} {} is not a number", where, key, v.dump()));
  }
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
    throw usage_error(fmt::format(
        "{}: observer_kwargs.{} {} is not finite as a float32 (every observer kwarg must be a "
        "finite number of magnitude at most {}: refit computes with it in float32)",
        where, key, v.dump(), std::numeric_limits<float>::max()));
  }
  return d;
}

std::uint32_t refit_count(const json& v, const std::string& key, const std::string& where,
                          std::uint64_t max) {
  const double d = refit_number(v, key, where);
  if (d != std::floor(d) || d < 0.0 || d > static_cast<double>(max)) {
    throw usage_error(fmt::format("{}: observer_kwargs.{} {} must be a whole number from 0 to {}",
                                  where, key, v.dump(), max));
  }
  return static_cast<std::uint32_t>(d);
}

void warn_cost(const std::string& where, const char* key, std::uint32_t given,
               std::uint32_t fallback) {
  if (given <= kMseCostWarningFactor * fallback) return;
  add_observer_warning(fmt::format(
      "{}: observer_kwargs.{} {} is {:.1f}x refit's default {}: expect its search to take about "
      "{:.1f}x as long for the schemes that use it (docs/observers.md)",
      where, key, given, static_cast<double>(given) / fallback, fallback,
      static_cast<double>(given) / fallback));
}

}  // namespace

RefitParams refit_params(const json& kwargs, const std::string& where) {
  RefitParams p;
  const RefitParams defaults;
  if (!kwargs.is_object()) return p;
  for (const auto& [key, value] : kwargs.items()) {
    if (key == "steps") {
      p.steps = refit_count(value, key, where, kMaxMseSteps - 1);
    } else if (key == "span") {
      p.span = refit_number(value, key, where);
      if (!(*p.span >= 0.0 && *p.span < 1.0)) {
        throw usage_error(fmt::format(
            "{}: observer_kwargs.span {} must be at least 0 and below 1 (candidate scales are "
            "the min-max scale times 1 - span .. 1 + span, and must be positive)",
            where, value.dump()));
      }
    } else if (key == "weight") {
      if (value.is_string() && value.get<std::string>() == "x2") {
        p.weight_x2 = true;
      } else if (value.is_number() && !value.is_boolean() && value.get<double>() == 1.0) {
        p.weight_x2 = false;
      } else {
        throw usage_error(fmt::format(
            "{}: observer_kwargs.weight {} must be 1 (every element counts the same) or \"x2\" "
            "(each element's squared error weighted by its square)",
            where, value.dump()));
      }
    } else if (key == "p") {
      p.p = refit_number(value, key, where);
      if (!(p.p > 0.0 && p.p <= 1.0)) {
        throw usage_error(
            fmt::format("{}: observer_kwargs.p {} must be above 0 and at most 1 (HQQ's lp norm)",
                        where, value.dump()));
      }
    } else if (key == "beta") {
      p.beta = refit_number(value, key, where);
      if (!(p.beta > 0.0)) {
        throw usage_error(
            fmt::format("{}: observer_kwargs.beta {} must be positive", where, value.dump()));
      }
    } else if (key == "kappa") {
      p.kappa = refit_number(value, key, where);
      if (!(p.kappa >= 1.0)) {
        throw usage_error(fmt::format(
            "{}: observer_kwargs.kappa {} must be at least 1 (HQQ's penalty beta grows by kappa "
            "each iteration)",
            where, value.dump()));
      }
    } else if (key == "refits") {
      p.refits = refit_count(value, key, where, 64);
    } else if (key == "iters") {
      p.iters = refit_count(value, key, where, kMaxMseSteps);
    } else if (key == "codes") {
      p.codes = refit_count(value, key, where, 64);
    } else {
      throw usage_error(fmt::format("{}: observer_kwargs.{} is not a parameter of refit ({})",
                                    where, key, fmt::join(kRefitKwargs, ", ")));
    }
  }
  // HQQ divides by beta * kappa^i in float32.
  const double last_beta = p.beta * std::pow(p.kappa, static_cast<double>(p.iters));
  if (!(last_beta <= static_cast<double>(std::numeric_limits<float>::max())) ||
      !(1.0 / p.beta >= static_cast<double>(std::numeric_limits<float>::min()))) {
    throw usage_error(fmt::format(
        "{}: observer_kwargs: beta {} * kappa {} ^ iters {} = {:g} is not finite as a float32, "
        "or 1 / beta underflows it",
        where, p.beta, p.kappa, p.iters, last_beta));
  }
  warn_cost(where, "steps", p.steps, defaults.steps);
  warn_cost(where, "iters", p.iters, defaults.iters);
  warn_cost(where, "codes", p.codes, defaults.codes);
  return p;
}

// ---- ranges ----

namespace refit_detail {

std::array<float, 2> symmetric_range(const QuantArgs& args, float s) {
  const detail::Candidate proto = detail::candidate(args, DType::kF32, 0.0f, 0.0f);
  const float h = s * ((proto.qmax - proto.qmin) / 2.0f);
  return {-h, h};
}

std::array<float, 2> asymmetric_range(const QuantArgs& args, DType w, float width, float z) {
  const detail::Candidate proto = detail::candidate(args, DType::kF32, 0.0f, 0.0f);
  const float s = round_to_dtype(w, width / (proto.qmax - proto.qmin));
  const float lo = (proto.qmin - z) * s;
  return {lo, lo + width};
}

namespace {
// The next value of W above (up) or below a positive value v of W.
float w_neighbour(DType w, float v, bool up) {
  if (w == DType::kBF16) {
    return bf16_to_float(static_cast<std::uint16_t>(float_to_bf16(v) + (up ? 1 : -1)));
  }
  if (w == DType::kF16) {
    return f16_to_float(static_cast<std::uint16_t>(float_to_f16(v) + (up ? 1 : -1)));
  }
  return std::nextafter(v, up ? std::numeric_limits<float>::infinity() : 0.0f);
}
}  // namespace

std::optional<float> nvfp4_amax_for_code(DType w, float gs, std::uint8_t code) {
  if (code == 0 || code > 0x7E) return std::nullopt;
  float s = round_to_dtype(w, f8_e4m3_to_float(code) / gs);
  // Walk by values of W towards the code (gs * s is monotone in s): an E4M3
  // code spans several W values (3 mantissa bits against 7 or more), so a
  // few steps do.
  for (int i = 0; i < 64; ++i) {
    if (!(s > 0.0f) || !std::isfinite(s)) return std::nullopt;
    const std::uint8_t raw = float_to_f8_e4m3(gs * s);
    if (raw == code) {
      const float amax = 6.0f * s;
      if (microscale::nvfp4_group_scale(w, gs, amax) != code) return std::nullopt;
      return amax;
    }
    s = w_neighbour(w, s, raw < code);
  }
  return std::nullopt;
}

std::optional<float> mx_amax_for_exponent(DType w, int offset, int e) {
  if (e < 0 || e > 254) return std::nullopt;
  const float amax = std::ldexp(1.0f, e - 127 + offset);
  if (!std::isfinite(amax) || round_to_dtype(w, amax) != amax) return std::nullopt;
  if (microscale::mx_scale(w, amax, offset).byte != e) return std::nullopt;
  return amax;
}

float hqq_pow(float a, float t) { return detail::hqq_pow_steps(a, t); }

float hqq_shrink(float r, float inv_beta, float p_minus_1) {
  return detail::hqq_shrink_steps(r, inv_beta, p_minus_1, 0.0f);
}

}  // namespace refit_detail

// ---- the scalar reference ----

namespace {

using detail::Candidate;

// A candidate's error over one group, sum w (x - Q)^2 in double, and the
// least-squares sums of its codes (refit_steps.hpp), in element order.
struct Sums {
  double err = 0.0;
  detail::LsSums ls;
};

// The group under candidate c as the kernel writes it and compressed-tensors
// dequantizes it (fake_quantize of observer_steps.hpp, with the code kept).
Sums evaluate(const Candidate& c, DType w, const std::vector<float>& x, bool x2) {
  Sums out;
  for (const float xi : x) {
    float v = round_to_dtype(w, xi / c.s);
    if (c.asymmetric) v = round_to_dtype(w, v + c.z);
    v = std::clamp(v, c.qmin, c.qmax);
    float q = 0.0f;
    switch (c.kind) {
      case Candidate::Kind::kInt:
        q = std::nearbyint(v);
        break;
      case Candidate::Kind::kFp8:
        q = f8_e4m3_to_float(float_to_f8_e4m3(v));
        break;
      case Candidate::Kind::kFp4:
        q = e2m1_to_float(e2m1_code(v));
        break;
    }
    const float u = c.asymmetric ? round_to_dtype(w, q - c.z) : q;
    const float d = xi - round_to_dtype(w, u * c.s);
    double dd = static_cast<double>(d) * static_cast<double>(d);
    float xq = xi * q;
    float qq = q * q;
    float xw = xi;
    float qw = q;
    float ww = 1.0f;
    if (x2) {
      dd *= static_cast<double>(xi) * static_cast<double>(xi);
      const float wt = xi * xi;
      xq *= wt;
      qq *= wt;
      xw *= wt;
      qw *= wt;
      ww = wt;
    }
    out.err += dd;
    out.ls.a += xq;
    out.ls.b += qq;
    // sum w x, sum w q and sum w: only the asymmetric refit uses them.
    if (c.asymmetric) {
      out.ls.x += xw;
      out.ls.q += qw;
      out.ls.w += ww;
    }
  }
  return out;
}

// The NVFP4 group under E4M3 scale code `code` and global scale gs
// (schemes.md 5.3 steps 7-8, the decompressor's fp4 * divisor), stopping
// once the sum reaches `bound` (the best error so far: a sum of
// non-negative terms only grows, so such a code cannot win; the sum it
// returns then is at least bound). The code of x / divisor is e2m1_code's,
// counted without branches: each threshold of its grid that |x / divisor|
// passes adds one (|x| - q divisor is x - Q up to the sign, so the square is
// the same).
double nvfp4_error(std::uint8_t code, float gs, const std::vector<float>& x, bool x2,
                   double bound) {
  const float divisor = microscale::nvfp4_divisor(code, gs);
  double err = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float ax = std::fabs(x[i]);
    const float a = ax / divisor;
    const int k = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                  (a >= 3.5f) + (a > 5.0f);
    const float d = ax - kE2M1Values[k] * divisor;
    double dd = static_cast<double>(d) * static_cast<double>(d);
    if (x2) dd *= static_cast<double>(x[i]) * static_cast<double>(x[i]);
    err += dd;
    // Checked every 4 elements (a group's 16 in four steps).
    if ((i & 3) == 3 && !(err < bound)) return err;
  }
  return err;
}

// The best candidate so far: its range and error. A candidate replaces it
// only with a strictly lower error (a NaN error never does).
struct Best {
  std::array<float, 2> range{};
  double err = 0.0;
  void consider(const std::array<float, 2>& r, double e) {
    if (e < err) {
      err = e;
      range = r;
    }
  }
};

// The refits of a search: the best predicted one (Proposal of
// refit_steps.hpp; a tie keeps the earlier).
struct Proposals {
  detail::Proposal best;
  void offer(const detail::Proposal& p) {
    if (p.predicted < best.predicted || (std::isnan(best.predicted) && !std::isnan(p.predicted))) {
      best = p;
    }
  }
};

// Lloyd's iteration from the best proposal: its range evaluated (consider),
// the refit of its codes proposed (next), evaluated, ..., `refits` ranges in
// all, stopping where a refit gives the qparams it came from.
template <class Consider, class Next>
void refit_lloyd(const QuantArgs& args, DType w, std::uint32_t refits, std::array<float, 2> r,
                 const Consider& consider, const Next& next) {
  Candidate last;
  for (std::uint32_t i = 0; i < refits; ++i) {
    if (!std::isfinite(r[0]) || !std::isfinite(r[1])) return;
    const Candidate c = detail::candidate(args, w, r[0], r[1]);
    if (i > 0 && c.s == last.s && c.z == last.z) return;
    last = c;
    r = next(consider(r));
  }
}

// The candidate of range r (its qparams as calculate_qparams derives them
// from r) evaluated; a range that is not finite is no candidate (NaN sums,
// which no comparison prefers).
Sums evaluate_range(const QuantArgs& args, DType w, const std::array<float, 2>& r,
                    const std::vector<float>& x, bool x2) {
  if (!std::isfinite(r[0]) || !std::isfinite(r[1])) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {static_cast<double>(nan), {nan, nan, nan, nan, nan}};
  }
  return evaluate(detail::candidate(args, w, r[0], r[1]), w, x, x2);
}

void refit_symmetric(const QuantArgs& args, const RefitParams& p, DType w,
                     const std::vector<float>& x, Best& best) {
  // Evaluates the candidate of range r, returns its sums.
  const auto consider = [&](const std::array<float, 2>& r) {
    const Sums s = evaluate_range(args, w, r, x, p.weight_x2);
    best.consider(r, s.err);
    return s;
  };
  // The closed-form refit of a candidate's codes: sum w x q / sum w q^2.
  const auto refit = [&](const Sums& s) {
    return refit_detail::symmetric_range(args, detail::refit_scale(w, s.ls.a, s.ls.b));
  };
  Proposals proposals;
  const auto offer = [&](const Sums& s) {
    proposals.offer(detail::propose(args, w, refit(s), s.ls));
  };
  const Candidate c0 = detail::candidate(args, w, best.range[0], best.range[1]);
  const Sums s0 = evaluate(c0, w, x, p.weight_x2);
  best.err = s0.err;
  offer(s0);
  for (std::uint32_t k = 0; p.steps > 0 && k <= p.steps; ++k) {
    const float f = detail::refit_factor(p, args, k);
    if (f == 1.0f) continue;  // min-max itself
    const std::array<float, 2> r = refit_detail::symmetric_range(args, round_to_dtype(w, c0.s * f));
    const Sums s = consider(r);
    if (std::isfinite(r[0]) && std::isfinite(r[1])) offer(s);
  }
  refit_lloyd(args, w, p.refits, proposals.best.range, consider, refit);
}

void refit_asymmetric(const QuantArgs& args, const RefitParams& p, const detail::HqqSchedule& hqq,
                      DType w, const std::vector<float>& x, Best& best) {
  Candidate best_c = detail::candidate(args, w, best.range[0], best.range[1]);
  Sums best_sums = evaluate(best_c, w, x, p.weight_x2);
  best.err = best_sums.err;
  const float qmin = best_c.qmin;
  const float qmax = best_c.qmax;
  // Evaluates the candidate of range r; a better one's qparams and sums are
  // kept for HQQ and the scale refit. Returns its qparams' sums.
  const auto consider = [&](const std::array<float, 2>& r) {
    if (!std::isfinite(r[0]) || !std::isfinite(r[1])) return Sums{};
    const Candidate c = detail::candidate(args, w, r[0], r[1]);
    const Sums sums = evaluate(c, w, x, p.weight_x2);
    if (sums.err < best.err) {
      best.consider(r, sums.err);
      best_c = c;
      best_sums = sums;
    }
    return sums;
  };
  // The closed-form refit of a candidate's codes: the line x = s q + c.
  const auto refit = [&](const Sums& s) {
    return detail::asymmetric_fit(args, w, s.ls, qmin, qmax);
  };
  Proposals proposals;
  const auto offer = [&](const Sums& s) {
    proposals.offer(detail::propose(args, w, refit(s), s.ls));
  };
  // min-max, then min-max's range times f_k (both ends, rounded to W:
  // calculate_qparams gives each its scale and zero point), then the best
  // predicted refit.
  const std::array<float, 2> range0 = best.range;
  offer(best_sums);
  for (std::uint32_t k = 0; p.steps > 0 && k <= p.steps; ++k) {
    const float f = detail::refit_factor(p, args, k);
    if (f == 1.0f) continue;  // min-max itself
    const std::array<float, 2> r = {round_to_dtype(w, range0[0] * f),
                                    round_to_dtype(w, range0[1] * f)};
    const Sums s = consider(r);
    if (std::isfinite(r[0]) && std::isfinite(r[1])) offer(s);
  }
  refit_lloyd(args, w, p.refits, proposals.best.range, consider, refit);
  // HQQ (optimize_weights_proximal_legacy) in float32 at the best scale so
  // far, s: codes q = clamp(round(x / s + z)), residual r = x - (q - z) s,
  // its shrink e, then the zero point z = mean(q - (x - e) / s); each
  // iterate's zero point rounded to an integer of [qmin, qmax] is a
  // candidate at that scale (one equal to the previous candidate's is the
  // same range).
  const float width =
      round_to_dtype(w, std::max(best.range[1], 0.0f) - std::min(best.range[0], 0.0f));
  const float s = best_c.s;
  const float inv = 1.0f / s;
  const float pm1 = static_cast<float>(p.p - 1.0);
  float z = best_c.z;
  float last = std::numeric_limits<float>::quiet_NaN();
  for (std::uint32_t it = 0; it < p.iters && std::isfinite(inv); ++it) {
    float acc = 0.0f;
    float max_r = 0.0f;
    for (const float xi : x) {
      const float q = std::clamp(std::nearbyint(xi * inv + z), qmin, qmax);
      const float r = xi - (q - z) * s;
      const float e = detail::hqq_shrink_steps(r, hqq.inv_beta[it], pm1, hqq.cut[it]);
      acc += q - (xi - e) * inv;
      max_r = std::max(max_r, std::fabs(r));
    }
    const float before = z;
    z = acc / static_cast<float>(x.size());
    const float zr = std::clamp(std::nearbyint(z), qmin, qmax);
    if (zr != last) {
      last = zr;
      consider(refit_detail::asymmetric_range(args, w, width, zr));
    }
    if (z == before && max_r < hqq.min_cut) break;  // nothing changes any more
  }
  // The closed-form scale with the best zero point fixed.
  consider(detail::asymmetric_fixed_z(args, w, best_sums.ls, best_c.z, qmin, qmax));
}

void refit_nvfp4(const RefitParams& p, DType w, float gs, const std::vector<float>& x, Best& best) {
  const float amax0 = range_amax(best.range.data(), 0);
  const std::uint8_t code0 = microscale::nvfp4_group_scale(w, gs, amax0);
  best.err = nvfp4_error(code0, gs, x, p.weight_x2, std::numeric_limits<double>::infinity());
  const int c0 = code0 & 0x7F;
  for (int d = -static_cast<int>(p.codes); d <= static_cast<int>(p.codes); ++d) {
    if (d == 0 || c0 + d < 1 || c0 + d > 0x7E) continue;
    const auto code = static_cast<std::uint8_t>(c0 + d);
    // The error depends on the code alone; the range that gives it is
    // looked for only when the code would win (a code no W value reaches is
    // no candidate).
    const double err = nvfp4_error(code, gs, x, p.weight_x2, best.err);
    if (!(err < best.err)) continue;
    if (const std::optional<float> amax = refit_detail::nvfp4_amax_for_code(w, gs, code)) {
      best.consider({-*amax, *amax}, err);
    }
  }
}

void refit_mx(const QuantArgs& args, const RefitParams& p, DType w, const std::vector<float>& x,
              Best& best) {
  const Candidate c0 = detail::candidate(args, w, best.range[0], best.range[1]);
  best.err = evaluate(c0, w, x, p.weight_x2).err;
  const int offset = args.num_bits == 4 ? microscale::kMxfp4Offset : microscale::kMxfp8Offset;
  const int e0 = microscale::mx_scale(w, range_amax(best.range.data(), 0), offset).byte;
  const std::optional<float> amax = refit_detail::mx_amax_for_exponent(w, offset, e0 - 1);
  if (!amax || e0 == 0xFF) return;
  const Candidate c = detail::candidate(args, w, -*amax, *amax);
  best.consider({-*amax, *amax}, evaluate(c, w, x, p.weight_x2).err);
}

}  // namespace

void observe_refit_ref(const QuantArgs& args, const RefitParams& params, const ObserveIo& io) {
  const DType w = io.dtype;
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(w) / 8);
  const detail::GroupLayout layout = detail::group_layout(args, io.n_rows, io.n_cols);
  const bool nvfp4 = args.strategy == QuantArgs::Strategy::kTensorGroup;
  const float gs = nvfp4 ? microscale::nvfp4_global_scale(w, io.tensor_amax) : 0.0f;
  const detail::HqqSchedule hqq = detail::hqq_schedule(params);
  std::vector<float> x;
  for (std::uint64_t g = 0; g < layout.n_groups; ++g) {
    layout.gather(g, io.weight, esize, w, x);
    Best best;
    best.range = {*std::min_element(x.begin(), x.end()), *std::max_element(x.begin(), x.end())};
    if (nvfp4) {
      refit_nvfp4(params, w, gs, x, best);
    } else if (detail::is_mx(args)) {
      refit_mx(args, params, w, x, best);
    } else if (args.symmetric) {
      refit_symmetric(args, params, w, x, best);
    } else {
      refit_asymmetric(args, params, hqq, w, x, best);
    }
    io.ranges[2 * g] = best.range[0];
    io.ranges[2 * g + 1] = best.range[1];
  }
}

}  // namespace ctquant
