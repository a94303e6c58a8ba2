// The refit observer (scheme/refit.hpp): the ranges that give back exactly
// the scale and zero point chosen (every BF16 and F16 value), the search on
// hand-made groups whose answer is known (exact bytes), its weighted error
// never above min-max's group by group on random and adversarial rows for
// every preset it takes, HQQ's steps, the vector kernel against the
// reference bit for bit at every level, kwargs and refusals (the command
// line: test_refit_cli.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/minifloat.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/pack.hpp"
#include "ctquant/scheme/refit.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"
#include "scheme/microscale.hpp"
#include "scheme/observer_steps.hpp"
#include "scheme/refit_steps.hpp"
#include "simd/simd.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using json = nlohmann::json;
using S = QuantArgs::Strategy;
using test::expect_message;

std::string usage_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

// A preset's weights with refit and its family.
struct Scheme {
  std::string name;
  QuantArgs args;
  const SchemeFamily* family = nullptr;
};

Scheme scheme(const std::string& preset, std::uint64_t group = 0,
              std::optional<S> strategy = std::nullopt) {
  const Preset* p = find_preset(preset);
  EXPECT_NE(p, nullptr) << preset;
  Scheme s;
  s.name = preset;
  s.args = p->weights;
  if (group != 0) s.args.group_size = group;
  if (strategy) s.args.strategy = *strategy;
  s.args.observer = kRefitObserver;
  s.family = family_for(s.args, !p->input_activations.empty());
  if (group != 0) s.name += "_g" + std::to_string(group);
  if (strategy == S::kChannel) s.name += "_channel";
  return s;
}

RefitParams defaults() { return refit_params(json::object(), "test"); }

// max |w| of a tensor of floats.
float tensor_amax(const std::vector<float>& v) {
  float a = 0.0f;
  for (const float x : v) a = std::max(a, std::fabs(x));
  return a;
}

// Rows quantized by the family's reference kernel with refit's ranges
// (refit) or min-max's, then dequantized as the decompressor does.
struct Quantized {
  std::vector<float> ranges;
  std::array<std::vector<std::byte>, 4> out;
  std::vector<float> values;
};

Quantized quantize(const Scheme& s, const RefitParams* refit, DType w, std::uint64_t rows,
                   std::uint64_t cols, const std::vector<std::byte>& weight, float amax) {
  Quantized q;
  const std::vector<OutputTensorSpec> specs = s.family->outputs(s.args, w, rows, cols);
  KernelIo io;
  io.dtype = w;
  io.n_rows = rows;
  io.n_cols = cols;
  io.weight = weight.data();
  io.tensor_amax = amax;
  if (refit != nullptr) {
    q.ranges.resize(2 * observed_groups(s.args, rows, cols));
    observe_refit_ref(s.args, *refit,
                      ObserveIo{w, rows, cols, weight.data(), q.ranges.data(), amax});
    io.ranges = q.ranges.data();
  }
  std::vector<std::vector<std::byte>> whole;
  std::size_t k = 0;
  for (const OutputTensorSpec& spec : specs) {
    if (spec.fill == OutputTensorSpec::Fill::kWhole) {
      whole.push_back(s.family->whole_tensor(s.args, w, rows, cols, amax, whole.size()));
      continue;
    }
    q.out[k].assign(spec.bytes_before(rows), std::byte{0});
    io.out[k] = q.out[k].data();
    ++k;
  }
  std::vector<std::byte> scratch(s.family->scratch_bytes(s.args, rows, cols));
  io.scratch = scratch;
  EXPECT_FALSE(s.family->quantize_ref(s.args, io)) << s.name;
  DequantIo d;
  d.dtype = w;
  d.n_rows = rows;
  d.n_cols = cols;
  for (std::size_t i = 0; i < k; ++i) d.in[i] = q.out[i].data();
  for (std::size_t i = 0; i < whole.size() && i < d.whole.size(); ++i) d.whole[i] = whole[i].data();
  q.values.resize(rows * cols);
  d.values = q.values.data();
  s.family->dequantize(s.args, d);
  return q;
}

// sum (x - Q)^2 (x2: times x^2) of every scale group, in double, Q what
// compressed-tensors dequantizes: the decompressor's value, held in W
// (integer and MX formats; NVFP4's is the float product).
std::vector<double> group_errors(const Scheme& s, DType w, std::uint64_t rows, std::uint64_t cols,
                                 const std::vector<float>& x, const std::vector<float>& values,
                                 bool x2 = false) {
  const bool in_w = s.args.strategy != S::kTensorGroup;
  const std::uint64_t g = s.args.strategy == S::kChannel ? cols : s.args.group_size;
  std::vector<double> err(rows * (cols / g), 0.0);
  for (std::uint64_t r = 0; r < rows; ++r) {
    for (std::uint64_t c = 0; c < cols; ++c) {
      const float q = in_w ? round_to_dtype(w, values[r * cols + c]) : values[r * cols + c];
      const float xi = x[r * cols + c];
      const float d = xi - q;
      double t = static_cast<double>(d) * static_cast<double>(d);
      if (x2) t *= static_cast<double>(xi) * static_cast<double>(xi);
      err[r * (cols / g) + c / g] += t;
    }
  }
  return err;
}

// Rows of normal values (std 0.02) with adversarial ones: all zero, one
// sign only, subnormals, one outlier, equal values, and (huge) half a row of
// huge values (not for NVFP4, whose global scale they would set for the
// whole tensor).
std::vector<float> adversarial(DType w, std::uint64_t rows, std::uint64_t cols, std::uint32_t seed,
                               bool huge = true) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = round_to_dtype(w, normal(rng));
  for (std::uint64_t r = 0; r < rows; ++r) {
    float* row = v.data() + r * cols;
    switch (r % 8) {
      case 0:
        std::fill(row, row + cols, 0.0f);
        break;
      case 1:
        for (std::uint64_t c = 0; c < cols; ++c) row[c] = -std::fabs(row[c]);
        break;
      case 2:
        for (std::uint64_t c = 0; c < cols; ++c) {
          row[c] = round_to_dtype(w, row[c] * (w == DType::kF16 ? 1e-4f : 1e-37f));
        }
        break;
      case 3:
        row[cols / 3] = 0.9f;
        break;
      case 4:
        std::fill(row, row + cols, round_to_dtype(w, 0.0123f));
        break;
      case 5:
        for (std::uint64_t c = 0; c < cols; ++c) row[c] = std::fabs(row[c]) + 0.01f;
        break;
      case 6:
        for (std::uint64_t c = 0; huge && c < cols / 2; ++c) {
          row[c] = round_to_dtype(w, row[c] * (w == DType::kF16 ? 1e3f : 1e30f));
        }
        break;
      default:
        break;
    }
    for (std::uint64_t c = 0; c < cols; ++c) row[c] = round_to_dtype(w, row[c]);
  }
  return v;
}

// ---- ranges ----

std::vector<float> every_positive(DType w) {
  std::vector<float> out;
  for (std::uint32_t b = 1; b < 0x8000u; ++b) {
    const float v = w == DType::kBF16 ? bf16_to_float(static_cast<std::uint16_t>(b))
                                      : f16_to_float(static_cast<std::uint16_t>(b));
    if (std::isfinite(v)) out.push_back(v);
  }
  return out;
}

TEST(RefitRanges, SymmetricRangeGivesBackEveryBf16AndF16Scale) {
  for (const char* preset : {"W4A16", "W8A16"}) {
    const Scheme s = scheme(preset);
    for (const DType w : {DType::kBF16, DType::kF16}) {
      std::size_t checked = 0;
      std::size_t beyond_float = 0;
      const detail::Candidate proto = detail::candidate(s.args, w, 0.0f, 0.0f);
      const double half = (proto.qmax - proto.qmin) / 2.0;
      for (const float scale : every_positive(w)) {
        const auto r = refit_detail::symmetric_range(s.args, scale);
        // (qmax - qmin) / 2 times a BF16 scale above FLT_MAX / 7.5 (int4),
        // FLT_MAX / 127.5 (int8) is beyond float32: no range gives such a
        // scale, and no amax does either.
        const bool beyond = scale * half > std::numeric_limits<float>::max();
        EXPECT_EQ(!std::isfinite(r[1]), beyond) << scale;
        if (beyond) {
          ++beyond_float;
          continue;
        }
        const detail::Candidate c = detail::candidate(s.args, w, r[0], r[1]);
        ASSERT_EQ(std::bit_cast<std::uint32_t>(c.s), std::bit_cast<std::uint32_t>(scale))
            << preset << " " << dtype_tag(w) << " " << scale;
        ++checked;
      }
      EXPECT_EQ(checked + beyond_float, w == DType::kBF16 ? 32639u : 31743u);
      if (w == DType::kF16) {
        EXPECT_EQ(beyond_float, 0u);
      }
    }
  }
}

TEST(RefitRanges, AsymmetricRangeGivesBackScaleAndEveryZeroPoint) {
  for (const char* preset : {"W4A16_ASYM"}) {
    Scheme s = scheme(preset);
    for (const int bits : {4, 8}) {
      s.args.num_bits = bits;
      const detail::Candidate proto = detail::candidate(s.args, DType::kF32, 0.0f, 0.0f);
      for (const DType w : {DType::kBF16, DType::kF16}) {
        std::size_t checked = 0;
        for (const float width : every_positive(w)) {
          const float scale = round_to_dtype(w, width / (proto.qmax - proto.qmin));
          if (scale == 0.0f || !std::isfinite(scale)) continue;
          for (float z = proto.qmin; z <= proto.qmax; z += 1.0f) {
            const auto r = refit_detail::asymmetric_range(s.args, w, width, z);
            if (!std::isfinite(r[0]) || !std::isfinite(r[1]) || r[1] < 0.0f) continue;
            const detail::Candidate c = detail::candidate(s.args, w, r[0], r[1]);
            ASSERT_EQ(std::bit_cast<std::uint32_t>(c.s), std::bit_cast<std::uint32_t>(scale))
                << bits << " " << dtype_tag(w) << " width " << width << " z " << z;
            ASSERT_EQ(c.z, z) << bits << " " << dtype_tag(w) << " width " << width;
            ++checked;
          }
        }
        EXPECT_GT(checked, 30000u * (bits == 4 ? 15u : 250u));
      }
    }
  }
}

TEST(RefitRanges, Nvfp4AmaxForCodeGivesTheCodeOrNoWValueCan) {
  for (const DType w : {DType::kBF16, DType::kF16}) {
    for (const float tensor_max : {6.0f, 0.07f, 0.5f, 37.0f}) {
      const float gs = microscale::nvfp4_global_scale(w, round_to_dtype(w, tensor_max));
      // Every code any W value gives under gs.
      std::set<std::uint8_t> reachable;
      for (const float s : every_positive(w)) {
        const float t = gs * s;
        if (std::isfinite(t)) reachable.insert(float_to_f8_e4m3(t));
      }
      for (int code = 1; code <= 0x7E; ++code) {
        const auto amax = refit_detail::nvfp4_amax_for_code(w, gs, static_cast<std::uint8_t>(code));
        if (amax) {
          EXPECT_EQ(microscale::nvfp4_group_scale(w, gs, *amax), code)
              << dtype_tag(w) << " gs " << gs << " code " << code;
        } else {
          EXPECT_FALSE(reachable.contains(static_cast<std::uint8_t>(code)))
              << dtype_tag(w) << " gs " << gs << " code " << code;
        }
      }
    }
  }
}

TEST(RefitRanges, MxAmaxForExponentGivesTheExponent) {
  for (const int offset : {microscale::kMxfp4Offset, microscale::kMxfp8Offset}) {
    int bf16 = 0;
    for (int e = 0; e <= 254; ++e) {
      const auto amax = refit_detail::mx_amax_for_exponent(DType::kBF16, offset, e);
      if (!amax) continue;
      EXPECT_EQ(microscale::mx_scale(DType::kBF16, *amax, offset).byte, e);
      ++bf16;
    }
    // Every exponent whose power of two 2^(e - 127 + offset) BF16 holds:
    // 0 .. 254 - offset.
    EXPECT_EQ(bf16, 255 - offset);
    for (int e = 100; e <= 150; ++e) {
      const auto amax = refit_detail::mx_amax_for_exponent(DType::kF16, offset, e);
      if (amax) {
        EXPECT_EQ(microscale::mx_scale(DType::kF16, *amax, offset).byte, e);
      }
    }
  }
}

// ---- the search on groups whose answer is known ----

std::vector<std::int8_t> unpacked_codes(const Quantized& q, int bits, std::uint64_t cols) {
  std::vector<std::uint32_t> words(packed_words_per_row(cols, bits));
  std::memcpy(words.data(), q.out[0].data(), words.size() * 4);
  std::vector<std::int8_t> codes(cols);
  unpack_codes(words, bits, codes);
  return codes;
}

std::uint16_t u16_at(const std::vector<std::byte>& bytes, std::size_t i) {
  std::uint16_t v = 0;
  std::memcpy(&v, bytes.data() + 2 * i, 2);
  return v;
}

// The lowest sum (x - Q)^2 of one group over every scale that some range
// gives (symmetric: every BF16 value; asymmetric: round_W(width / (qmax -
// qmin)) of every BF16 width) between lo and hi and every zero point, the
// codes by round-to-nearest as the kernel computes them: what no search can
// beat.
double exhaustive_best(const QuantArgs& args, const std::vector<float>& x, float lo, float hi) {
  const detail::Candidate proto = detail::candidate(args, DType::kBF16, 0.0f, 0.0f);
  std::set<float> scales;
  for (const float v : every_positive(DType::kBF16)) {
    const float s =
        args.symmetric ? v : round_to_dtype(DType::kBF16, v / (proto.qmax - proto.qmin));
    if (s >= lo && s <= hi) scales.insert(s);
  }
  double best = std::numeric_limits<double>::infinity();
  for (const float s : scales) {
    for (float z = args.symmetric ? 0.0f : proto.qmin; z <= (args.symmetric ? 0.0f : proto.qmax);
         z += 1.0f) {
      detail::Candidate c = proto;
      c.s = s;
      c.z = z;
      double e = 0.0;
      for (const float xi : x) {
        const float d = xi - detail::fake_quantize(c, args, DType::kBF16, xi);
        e += static_cast<double>(d) * d;
      }
      best = std::min(best, e);
    }
  }
  return best;
}

TEST(RefitSearch, SymmetricIntFindsTheScaleMinMaxMisses) {
  // -8 .. 7: min-max's scale 8 / 7.5 rounds to BF16 1.0703125 and wastes
  // the code -8; the least-squares scale of the codes of a smaller
  // candidate is 1, which gives every value exactly.
  const Scheme s = scheme("W4A16", 16);
  std::vector<float> x;
  for (int k = -8; k <= 7; ++k) x.push_back(static_cast<float>(k));
  const auto weight = test::float_bytes(DType::kBF16, x);
  const RefitParams p = defaults();
  const Quantized minmax = quantize(s, nullptr, DType::kBF16, 1, 16, weight, 8.0f);
  const Quantized refit = quantize(s, &p, DType::kBF16, 1, 16, weight, 8.0f);
  EXPECT_EQ(u16_at(minmax.out[1], 0), 0x3F89);  // 1.0703125
  EXPECT_EQ(u16_at(refit.out[1], 0), 0x3F80);   // 1.0
  const std::vector<std::int8_t> codes = unpacked_codes(refit, 4, 16);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(codes[k], k - 8);
  EXPECT_GT(group_errors(s, DType::kBF16, 1, 16, x, minmax.values)[0], 0.0);
  EXPECT_EQ(group_errors(s, DType::kBF16, 1, 16, x, refit.values)[0], 0.0);
}

TEST(RefitSearch, AsymmetricIntReachesTheExhaustiveOptimum) {
  // 0 .. 14 and 15.5: min-max's scale 15.5 / 15 rounds to BF16 1.03125,
  // whose codes drift from the values by k / 32. The best scale and zero
  // point, over every scale a range can give and every zero point, are
  // found by the search, with that error exactly.
  const Scheme s = scheme("W4A16_ASYM", 16);
  std::vector<float> x;
  for (int k = 0; k <= 14; ++k) x.push_back(static_cast<float>(k));
  x.push_back(15.5f);
  std::vector<float> rows;
  for (int r = 0; r < 8; ++r) rows.insert(rows.end(), x.begin(), x.end());  // a zero-point word
  const auto weight = test::float_bytes(DType::kBF16, rows);
  const RefitParams p = defaults();
  const Quantized minmax = quantize(s, nullptr, DType::kBF16, 8, 16, weight, 15.5f);
  const Quantized refit = quantize(s, &p, DType::kBF16, 8, 16, weight, 15.5f);
  EXPECT_EQ(u16_at(minmax.out[1], 0), 0x3F84);  // 1.03125
  const double best = exhaustive_best(s.args, x, 0.5f, 2.0f);
  const auto err_minmax = group_errors(s, DType::kBF16, 8, 16, rows, minmax.values);
  const auto err_refit = group_errors(s, DType::kBF16, 8, 16, rows, refit.values);
  EXPECT_GT(err_minmax[0], 4.0 * best);
  EXPECT_EQ(err_refit[0], best);
  const detail::Candidate c =
      detail::candidate(s.args, DType::kBF16, refit.ranges[0], refit.ranges[1]);
  EXPECT_EQ(c.z, -8.0f);
  EXPECT_EQ(u16_at(refit.out[1], 0), float_to_bf16(c.s));
}

TEST(RefitSearch, MxTakesTheExponentBelowWhenItIsBetter) {
  // 4 and 31 times 0.25: min-max's exponent gives the FP4 grid 0, 0.5, 1,
  // ..., 6 (0.25 is a tie, rounded to 0); the exponent below, 0, 0.25, 0.5,
  // ..., 3: every 0.25 exact and 4 clipped to 3, an error of 1 against 31
  // sixteenths.
  const Scheme s = scheme("MXFP4A16");
  std::vector<float> x(32, 0.25f);
  x[5] = 4.0f;
  const auto weight = test::float_bytes(DType::kBF16, x);
  const RefitParams p = defaults();
  const Quantized minmax = quantize(s, nullptr, DType::kBF16, 1, 32, weight, 4.0f);
  const Quantized refit = quantize(s, &p, DType::kBF16, 1, 32, weight, 4.0f);
  const auto e0 = std::to_integer<int>(minmax.out[1][0]);
  EXPECT_EQ(e0, 127 + 2 - 2);  // 4 = 2^2, offset 2
  EXPECT_EQ(std::to_integer<int>(refit.out[1][0]), e0 - 1);
  EXPECT_EQ(group_errors(s, DType::kBF16, 1, 32, x, minmax.values)[0], 31.0 / 16.0);
  EXPECT_EQ(group_errors(s, DType::kBF16, 1, 32, x, refit.values)[0], 1.0);
}

TEST(RefitSearch, Nvfp4TakesANeighbouringScaleCodeWhenItIsBetter) {
  // Under the global scale of max |w| 6 (448), the group 3 and 15 times
  // 0.375 gets min-max's code 224 (0x76, divisor 0.5): 0.375 rounds to 1 x
  // 0.5. Code 320 (0x7A, four codes up) gives 0.375 / (320 / 448) = 0.525,
  // 0.5 x 0.714 = 0.357, and 3 -> 4 x 0.714 = 2.857: a lower error.
  const Scheme s = scheme("NVFP4A16");
  std::vector<float> x(32, 0.375f);
  x[0] = 3.0f;
  x[16] = 6.0f;  // the second group holds the tensor's max |w|
  const auto weight = test::float_bytes(DType::kBF16, x);
  const RefitParams p = defaults();
  const Quantized minmax = quantize(s, nullptr, DType::kBF16, 1, 32, weight, 6.0f);
  const Quantized refit = quantize(s, &p, DType::kBF16, 1, 32, weight, 6.0f);
  EXPECT_EQ(std::to_integer<int>(minmax.out[1][0]), 0x76);
  EXPECT_EQ(std::to_integer<int>(refit.out[1][0]), 0x7A);
  const auto e_minmax = group_errors(s, DType::kBF16, 1, 32, x, minmax.values);
  const auto e_refit = group_errors(s, DType::kBF16, 1, 32, x, refit.values);
  EXPECT_LT(e_refit[0], e_minmax[0] / 4);
  EXPECT_EQ(e_refit[1], e_minmax[1]);
}

// ---- never worse than min-max ----

struct ErrorCase {
  Scheme scheme;
  std::uint64_t cols;
};

std::vector<ErrorCase> error_cases() {
  return {
      {scheme("W4A16"), 384},      {scheme("W4A16", 32), 96},
      {scheme("W4A16", 64), 128},  {scheme("W4A16", 0, S::kChannel), 200},
      {scheme("W4A16_ASYM"), 256}, {scheme("W4A16_ASYM", 32), 96},
      {scheme("W8A16"), 256},      {scheme("W8A16", 32), 64},
      {scheme("W8A8"), 160},       {scheme("NVFP4A16"), 64},
      {scheme("MXFP4A16"), 128},   {scheme("MXFP8A16"), 96},
  };
}

TEST(RefitSearch, WeightErrorNeverAboveMinMaxGroupByGroup) {
  for (const ErrorCase& c : error_cases()) {
    for (const DType w : {DType::kBF16, DType::kF16, DType::kF32}) {
      const std::uint64_t rows = 32;
      const bool nvfp4 = c.scheme.args.strategy == S::kTensorGroup;
      const std::vector<float> x = adversarial(w, rows, c.cols, 11, !nvfp4);
      const auto weight = test::float_bytes(w, x);
      const float amax = tensor_amax(x);
      for (const json& kwargs :
           {json::object(), json{{"weight", "x2"}}, json{{"steps", 3}, {"refits", 0}}}) {
        const RefitParams p = refit_params(kwargs, "test");
        const Quantized minmax = quantize(c.scheme, nullptr, w, rows, c.cols, weight, amax);
        const Quantized refit = quantize(c.scheme, &p, w, rows, c.cols, weight, amax);
        // The error refit minimises: weighted by x^2 with weight=x2.
        const auto e0 = group_errors(c.scheme, w, rows, c.cols, x, minmax.values, p.weight_x2);
        const auto e1 = group_errors(c.scheme, w, rows, c.cols, x, refit.values, p.weight_x2);
        std::size_t better = 0;
        for (std::size_t g = 0; g < e0.size(); ++g) {
          ASSERT_LE(e1[g], e0[g]) << c.scheme.name << " " << dtype_tag(w) << " " << kwargs
                                  << " group " << g;
          better += e1[g] < e0[g] ? 1 : 0;
        }
        // With the default kwargs most groups improve (MX's exponent below
        // rarely pays: it clips the group's largest values).
        if (c.scheme.name.rfind("MX", 0) != 0 && kwargs.empty()) {
          EXPECT_GT(better, e0.size() / 4) << c.scheme.name << " " << dtype_tag(w) << " " << kwargs;
        }
      }
    }
  }
}

// ---- HQQ ----

TEST(RefitHqq, PowIsWithinTwoParts10000OfStdPow) {
  for (const float t : {-0.3f, -0.9f, -0.01f, 0.0f}) {
    for (float a = 1e-30f; a < 1e30f; a *= 1.37f) {
      const double want = std::pow(static_cast<double>(a), static_cast<double>(t));
      const float got = refit_detail::hqq_pow(a, t);
      if (want > 1e37) continue;
      EXPECT_NEAR(got / want, 1.0, 2e-5) << a << " ^ " << t;
    }
    EXPECT_EQ(refit_detail::hqq_pow(0.0f, t), 0.0f);
    // Subnormals take the same steps after scaling by 2^24.
    EXPECT_NEAR(refit_detail::hqq_pow(1e-40f, -0.3f) / std::pow(1e-40, -0.3), 1.0, 2e-5);
  }
}

TEST(RefitHqq, ShrinkIsZeroBelowItsThresholdAndKeepsTheSign) {
  // sign(r) max(|r| - |r|^(p - 1) / beta, 0): beta 10, p 0.7, zero up to
  // 10^(-1 / 1.3) = 0.170.
  const float inv_beta = 0.1f;
  const float pm1 = -0.3f;
  EXPECT_EQ(refit_detail::hqq_shrink(0.16f, inv_beta, pm1), 0.0f);
  EXPECT_EQ(refit_detail::hqq_shrink(-0.05f, inv_beta, pm1), 0.0f);
  const float r = 0.5f;
  const float want = r - static_cast<float>(std::pow(0.5, -0.3)) * inv_beta;
  EXPECT_NEAR(refit_detail::hqq_shrink(r, inv_beta, pm1), want, 1e-6f);
  EXPECT_NEAR(refit_detail::hqq_shrink(-r, inv_beta, pm1), -want, 1e-6f);
  // The cut the search skips the power below is under the threshold.
  EXPECT_LT(detail::hqq_cut(10.0, 0.7), 0.170f);
  EXPECT_GT(detail::hqq_cut(10.0, 0.7), 0.08f);
}

TEST(RefitHqq, ZeroPointsAreIntegersOfTheFormatsRange) {
  for (const int bits : {4, 8, 3}) {
    Scheme s = scheme("W4A16_ASYM", 32);
    s.args.num_bits = bits;
    for (const DType w : {DType::kBF16, DType::kF16}) {
      const std::vector<float> x = adversarial(w, 16, 128, 5);
      const auto weight = test::float_bytes(w, x);
      std::vector<float> ranges(2 * observed_groups(s.args, 16, 128));
      observe_refit_ref(s.args, defaults(),
                        ObserveIo{w, 16, 128, weight.data(), ranges.data(), 0.0f});
      const detail::Candidate proto = detail::candidate(s.args, w, 0.0f, 0.0f);
      for (std::size_t g = 0; g < ranges.size() / 2; ++g) {
        const detail::Candidate c = detail::candidate(s.args, w, ranges[2 * g], ranges[2 * g + 1]);
        EXPECT_EQ(c.z, std::nearbyint(c.z));
        EXPECT_GE(c.z, proto.qmin);
        EXPECT_LE(c.z, proto.qmax);
        EXPECT_GT(c.s, 0.0f);
      }
    }
  }
}

// ---- the vector kernel ----

struct VectorCase {
  const char* name;
  Scheme scheme;
  json kwargs;
  std::uint64_t cols;
};

std::vector<VectorCase> vector_cases() {
  Scheme int3 = scheme("W4A16_ASYM", 32);
  int3.args.num_bits = 3;
  Scheme int2 = scheme("W4A16", 64);
  int2.args.num_bits = 2;
  return {
      {"int4_g128", scheme("W4A16"), json::object(), 384},
      {"int4_g16", scheme("W4A16", 16), json::object(), 64},
      {"int4_g48", scheme("W4A16", 48), json::object(), 96},
      {"int4_channel", scheme("W4A16", 0, S::kChannel), json::object(), 200},
      {"int4_x2", scheme("W4A16"), json{{"weight", "x2"}}, 256},
      {"int4_steps0", scheme("W4A16", 32), json{{"steps", 0}}, 96},
      {"int4_steps3_refits4", scheme("W4A16", 32), json{{"steps", 3}, {"refits", 4}}, 96},
      {"int4_span", scheme("W4A16", 32), json{{"steps", 20}, {"span", 0.6}, {"refits", 0}}, 64},
      {"int8_g128", scheme("W8A16"), json::object(), 256},
      {"int8_channel", scheme("W8A8"), json::object(), 160},
      {"int2_g64", int2, json::object(), 128},
      {"asym_g128", scheme("W4A16_ASYM"), json::object(), 256},
      {"asym_g16", scheme("W4A16_ASYM", 16), json::object(), 64},
      {"asym_x2", scheme("W4A16_ASYM"), json{{"weight", "x2"}}, 256},
      {"asym_hqq", scheme("W4A16_ASYM", 32),
       json{{"p", 1.0}, {"beta", 0.5}, {"kappa", 1.5}, {"iters", 30}, {"steps", 2}}, 96},
      {"asym_iters0", scheme("W4A16_ASYM", 32), json{{"iters", 0}, {"refits", 1}}, 96},
      {"int3_asym", int3, json::object(), 96},
  };
}

TEST(RefitSearch, VectorKernelEqualsTheReferenceBitForBitAtEveryLevel) {
  for (const VectorCase& c : vector_cases()) {
    const RefitParams p = refit_params(c.kwargs, "test");
    for (const DType w : {DType::kBF16, DType::kF16}) {
      const std::uint64_t rows = 19;
      const std::vector<float> x = adversarial(w, rows, c.cols, 23);
      const auto weight = test::float_bytes(w, x);
      const std::uint64_t groups = observed_groups(c.scheme.args, rows, c.cols);
      std::vector<float> want(2 * groups);
      observe_refit_ref(c.scheme.args, p,
                        ObserveIo{w, rows, c.cols, weight.data(), want.data(), 0.0f});
      std::size_t levels = 0;
      for (const detail::SimdLevel& level : detail::simd_levels()) {
        std::vector<float> got(2 * groups, -1.0f);
        if (!detail::observe_refit_at(
                level, c.scheme.args, p,
                ObserveIo{w, rows, c.cols, weight.data(), got.data(), 0.0f})) {
          continue;
        }
        ++levels;
        for (std::size_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[k]), std::bit_cast<std::uint32_t>(want[k]))
              << c.name << " " << dtype_tag(w) << " " << level.name << " group " << k / 2
              << (k % 2 == 0 ? " lo" : " hi");
        }
      }
      if (levels == 0) std::cout << c.name << ": no vector level on this CPU\n";
      // observe_ranges takes the best level (or the reference).
      std::vector<float> fast(2 * groups);
      ObserverParams op = observer_params(kRefitObserver, c.kwargs, "test");
      observe_ranges(c.scheme.args, op, 0,
                     ObserveIo{w, rows, c.cols, weight.data(), fast.data(), 0.0f}, nullptr);
      EXPECT_EQ(fast, want) << c.name;
    }
  }
}

// ---- kwargs and refusals ----

TEST(RefitKwargs, BadKwargsAreRefusedNamingTheKwargAndTheRule) {
  const auto refused = [](const json& kwargs, std::initializer_list<std::string> fragments) {
    const std::string m =
        usage_message([&] { observer_params(kRefitObserver, kwargs, "--observer-kwarg"); });
    expect_message(m, fragments);
  };
  refused({{"maxshrink", 0.5}}, {"observer_kwargs.maxshrink", "not a parameter of refit"});
  refused({{"steps", 1024}}, {"observer_kwargs.steps", "whole number from 0 to 1023"});
  refused({{"steps", 2.5}}, {"observer_kwargs.steps", "whole number"});
  refused({{"steps", -1}}, {"observer_kwargs.steps"});
  refused({{"span", 1.0}}, {"observer_kwargs.span", "below 1"});
  refused({{"span", -0.1}}, {"observer_kwargs.span"});
  refused({{"weight", "x3"}}, {"observer_kwargs.weight", "\"x2\""});
  refused({{"weight", 2}}, {"observer_kwargs.weight"});
  refused({{"p", 0.0}}, {"observer_kwargs.p", "above 0"});
  refused({{"p", 1.5}}, {"observer_kwargs.p", "at most 1"});
  refused({{"beta", 0}}, {"observer_kwargs.beta", "positive"});
  refused({{"kappa", 0.9}}, {"observer_kwargs.kappa", "at least 1"});
  refused({{"iters", 1025}}, {"observer_kwargs.iters"});
  refused({{"codes", 65}}, {"observer_kwargs.codes", "0 to 64"});
  refused({{"refits", 65}}, {"observer_kwargs.refits"});
  refused({{"beta", 1e30}, {"kappa", 10.0}, {"iters", 100}},
          {"beta", "kappa", "not finite as a float32"});
  refused({{"span", 1e39}}, {"observer_kwargs.span", "not finite as a float32"});
  refused({{"steps", "ten"}}, {"observer_kwargs.steps", "not a number"});
  // Accepted: every kwarg at a bound.
  const ObserverParams p = observer_params(kRefitObserver,
                                           {{"steps", 0},
                                            {"span", 0.0},
                                            {"weight", 1},
                                            {"p", 1},
                                            {"beta", 1e-3},
                                            {"kappa", 1},
                                            {"iters", 0},
                                            {"codes", 0},
                                            {"refits", 0}},
                                           "test");
  EXPECT_TRUE(p.refit);
  EXPECT_FALSE(p.mse);
  EXPECT_TRUE(p.chooses_ranges());
  EXPECT_EQ(p.refit_params.steps, 0u);
}

TEST(RefitKwargs, ACostlySearchIsWarnedWithTheEstimate) {
  take_observer_warnings();
  observer_params(kRefitObserver, {{"steps", 200}}, "--observer-kwarg");
  const std::vector<std::string> w = take_observer_warnings();
  ASSERT_EQ(w.size(), 1u);
  expect_message(w[0], {"observer_kwargs.steps 200", "25.0x refit's default 8"});
}

TEST(RefitRows, FamiliesOutsideIntNvfp4AndMxRefuseRefit) {
  for (const char* preset : {"FP8_DYNAMIC", "FP8_BLOCK"}) {
    Scheme s = scheme(preset);
    expect_message(s.family->supports(s.args), {"refit with FP8 weights", "memoryless_mse"});
  }
  Scheme tensor = scheme("W8A8");
  tensor.args.strategy = S::kTensor;
  expect_message(tensor.family->supports(tensor.args), {"one scale per tensor"});
  for (const char* preset : {"W4A16", "W4A16_ASYM", "W8A16", "W8A8", "NVFP4A16", "MXFP4A16",
                             "MXFP8A16", "MXFP4", "MXFP8"}) {
    const Scheme s = scheme(preset);
    EXPECT_EQ(s.family->supports(s.args), "") << preset;
  }
}

}  // namespace
}  // namespace ctquant
