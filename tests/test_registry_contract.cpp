// Contract tests over every row of the scheme registry, generated from it at
// run time (as ggml's test-quantize-fns walks its type_traits table): every
// family of scheme_families(), for each of its presets and for every other
// QuantizationArgs in the neighbourhood of the presets that compressed-tensors
// would give it (format inference, family_for) and that it supports (bit
// widths, symmetry, group sizes, strategies). A new row, or a new preset,
// gets every test below without new test code. For each one, on
// deterministic random weights of several shapes (one row; rows not a
// multiple of the row alignment; columns not a multiple of a vector) in
// BF16, F16 and F32:
//
//   FastKernelEqualsReference   `quantize` gives `quantize_ref`'s bytes and
//                               first non-finite index, at every SIMD level
//                               of simd_levels() (one test per level; a level
//                               this CPU does not run is skipped)
//   DequantizeRowsEqualsDequantize  the vector decoder gives the decoder's bits
//   DequantizedWithinFormatBound    |w - dequantize(quantize(w))| within the
//                               bound the format's arithmetic allows
//   OutputSizesEqualBytesWritten    each output's size (what the planner
//                               reserves) is the bytes the kernel writes: all
//                               of them, and none outside its chunk
//   RowAlignmentHolds           chunks starting at multiples of row_alignment
//                               own whole units of every output and give the
//                               bytes of one whole run, in any order
//   RefusesExactlyColumnsOffTheGroup  a weight whose columns are not a
//                               multiple of the group (block) width is
//                               refused, and only such a weight
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/microscale.hpp"
#include "simd/simd.hpp"
#include "scheme_test_support.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

using S = QuantArgs::Strategy;

constexpr DType kWeightTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

// ---- The cases: one per preset, and per further args a row takes ----

struct ContractCase {
  const SchemeFamily* family = nullptr;
  std::string name;  // the test name's suffix: family id, then preset or args
  QuantArgs args;
};

std::string identifier(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return out;
}

// "int4_asym_group32", "float8_sym_block128x128", ...
std::string args_name(const QuantArgs& a) {
  std::string name =
      fmt::format("{}{}_{}_{}", a.type == QuantArgs::Type::kInt ? "int" : "float", a.num_bits,
                  a.symmetric ? "sym" : "asym", strategy_name(a.strategy));
  if (a.strategy == S::kGroup || a.strategy == S::kTensorGroup) {
    name += std::to_string(a.group_size);
  }
  if (a.strategy == S::kBlock) name += fmt::format("{}x{}", a.block[0], a.block[1]);
  if (a.scale_dtype) name += "_scale_" + std::string(dtype_tag(*a.scale_dtype));
  return name;
}

// The args around one preset's: other bit widths (integers), both
// symmetries, and every strategy with the group sizes vLLM's kernels take.
std::vector<QuantArgs> neighbours(const QuantArgs& base) {
  std::vector<int> bits{base.num_bits};
  if (base.type == QuantArgs::Type::kInt) bits = {2, 3, 4, 8};
  std::vector<QuantArgs> out;
  for (const int b : bits) {
    for (const bool symmetric : {true, false}) {
      QuantArgs a = base;
      a.num_bits = b;
      a.symmetric = symmetric;
      a.block = {0, 0};
      for (const S strategy : {S::kChannel, S::kTensor}) {
        a.strategy = strategy;
        a.group_size = 0;
        out.push_back(a);
      }
      for (const std::uint64_t g : {16, 32, 64, 128}) {
        a.strategy = S::kGroup;
        a.group_size = g;
        out.push_back(a);
        a.strategy = S::kTensorGroup;
        out.push_back(a);
      }
      a.strategy = S::kBlock;
      a.group_size = 0;
      a.block = {128, 128};
      out.push_back(a);
    }
  }
  return out;
}

std::vector<ContractCase> contract_cases() {
  std::vector<ContractCase> cases;
  std::vector<QuantArgs> bases;
  for (const SchemeFamily* family : scheme_families()) {
    for (const Preset& preset : family->presets) {
      if (!preset.refused.empty()) continue;
      cases.push_back(
          {family, identifier(family->id) + "_" + identifier(preset.name), preset.weights});
      bases.push_back(preset.weights);
    }
  }
  for (const QuantArgs& base : bases) {
    for (const QuantArgs& args : neighbours(base)) {
      for (const bool has_input_activations : {false, true}) {
        const SchemeFamily* family = family_for(args, has_input_activations);
        if (family == nullptr || !family->supports(args).empty()) continue;
        const bool seen = std::any_of(cases.begin(), cases.end(), [&](const ContractCase& c) {
          return c.family == family && c.args == args;
        });
        if (!seen) {
          cases.push_back({family, identifier(family->id) + "_" + args_name(args), args});
        }
      }
    }
  }
  return cases;
}

const std::vector<ContractCase>& all_cases() {
  static const std::vector<ContractCase> cases = contract_cases();
  return cases;
}

// ---- Weights ----

struct Shape {
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
};

// Columns one scale covers, or 1 when a scale covers whole rows.
std::uint64_t group_width(const QuantArgs& a) {
  switch (a.strategy) {
    case S::kGroup:
    case S::kTensorGroup:
      return a.group_size;
    case S::kBlock:
      return a.block[1];
    default:
      return 1;
  }
}

// The shapes a case runs on: one row, rows one past a multiple of the row
// alignment, a whole number of alignments, and 33; one group, three, eight
// (or, for per-row scales, 1, 37 and 200 columns); those the row refuses
// are left out (RefusesExactlyColumnsOffTheGroup checks the refusals).
std::vector<Shape> shapes(const ContractCase& c) {
  const std::uint64_t align = c.family->row_alignment(c.args);
  const std::uint64_t g = group_width(c.args);
  std::vector<std::uint64_t> rows{1, 33, 2 * align + 1, 3 * align};
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const std::vector<std::uint64_t> cols =
      g == 1 ? std::vector<std::uint64_t>{1, 37, 200} : std::vector<std::uint64_t>{g, 3 * g, 8 * g};
  std::vector<Shape> out;
  for (const std::uint64_t r : rows) {
    for (const std::uint64_t k : cols) {
      if (r * k > 200'000) continue;  // enough to cover every path, quick under an emulator
      if (c.family->refuse(c.args, r, k).empty()) out.push_back({r, k});
    }
  }
  return out;
}

// Seeded normal weights stored as dtype: rows scaled by 2^-2..2^2, some
// exact zeros, a few outliers, and (from 5 rows) row 3 all zero.
std::vector<std::byte> random_weights(const std::string& seed_text, DType dtype, Shape shape) {
  std::uint32_t seed = 2166136261u;  // FNV-1a of the case, shape and dtype
  for (const char ch :
       fmt::format("{}/{}x{}/{}", seed_text, shape.rows, shape.cols, dtype_tag(dtype))) {
    seed = (seed ^ static_cast<unsigned char>(ch)) * 16777619u;
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 96);
  std::vector<float> values(shape.rows * shape.cols);
  for (std::uint64_t r = 0; r < shape.rows; ++r) {
    const float row_scale = std::ldexp(1.0f, static_cast<int>(r % 5) - 2);
    for (std::uint64_t c = 0; c < shape.cols; ++c) {
      const int p = pick(rng);
      float v = normal(rng) * row_scale;
      if (p == 0) v = 0.0f;
      if (p == 1) v *= 8.0f;
      if (shape.rows >= 5 && r == 3) v = 0.0f;
      values[r * shape.cols + c] = v;
    }
  }
  return float_bytes(dtype, values);
}

// ---- Running a kernel as the executor does ----

// What a kernel wrote for a whole weight, every output in outputs() order,
// and what it did wrong: a byte of its chunk it left unwritten, a byte
// written outside its chunk.
struct Written {
  std::optional<std::uint64_t> bad;
  std::vector<OutputTensorSpec> specs;
  std::vector<std::vector<std::byte>> tensors;
  std::vector<std::string> faults;
};

constexpr std::size_t kGuard = 64;  // bytes watched on each side of a chunk's output

// Runs kernel over weight [rows, cols] in chunks of chunk_rows (0: one chunk;
// rounded up to the row alignment), last chunk first when `reverse`. Each
// chunk writes into buffers of exactly bytes_before(r1) - bytes_before(r0)
// bytes per kRows output, as the executor sizes them, between guard bytes;
// it runs twice, over buffers filled with two patterns, so that a byte it
// does not write shows up as a difference. kWhole outputs come from
// whole_tensor with the weight's max |w|.
Written run_kernel(const SchemeFamily& family, KernelFn kernel, const QuantArgs& args, DType dtype,
                   Shape shape, std::span<const std::byte> weight, std::uint64_t chunk_rows = 0,
                   bool reverse = false) {
  Written out;
  out.specs = family.outputs(args, dtype, shape.rows, shape.cols);
  const float amax = family.needs_tensor_amax(args) ? max_magnitude(dtype, weight) : 0.0f;
  std::size_t whole_index = 0;
  for (const OutputTensorSpec& spec : out.specs) {
    if (spec.fill == OutputTensorSpec::Fill::kWhole) {
      out.tensors.push_back(
          family.whole_tensor(args, dtype, shape.rows, shape.cols, amax, whole_index++));
    } else {
      out.tensors.emplace_back(spec.byte_size(), std::byte{0});
    }
  }
  const std::uint64_t align = family.row_alignment(args);
  std::uint64_t step = chunk_rows == 0 ? shape.rows : chunk_rows;
  step = std::max<std::uint64_t>(align, (step + align - 1) / align * align);
  std::vector<std::uint64_t> starts;
  for (std::uint64_t r0 = 0; r0 < shape.rows; r0 += step) starts.push_back(r0);
  if (reverse) std::reverse(starts.begin(), starts.end());
  const std::size_t esize = element_size(dtype);
  for (const std::uint64_t r0 : starts) {
    const std::uint64_t r1 = std::min(shape.rows, r0 + step);
    std::vector<std::vector<std::byte>> first;
    for (const std::byte fill : {std::byte{0xA5}, std::byte{0x5A}}) {
      std::vector<std::vector<std::byte>> buffers;
      std::vector<std::byte> scratch(family.scratch_bytes(args, r1 - r0, shape.cols));
      KernelIo io;
      io.dtype = dtype;
      io.n_rows = r1 - r0;
      io.n_cols = shape.cols;
      io.row_begin = r0;
      io.weight = weight.data() + r0 * shape.cols * esize;
      io.tensor_amax = amax;
      io.scratch = scratch;
      std::vector<std::size_t> rows_outputs;
      for (std::size_t i = 0; i < out.specs.size(); ++i) {
        if (out.specs[i].fill != OutputTensorSpec::Fill::kRows) continue;
        const std::uint64_t size = out.specs[i].bytes_before(r1) - out.specs[i].bytes_before(r0);
        buffers.emplace_back(size + 2 * kGuard, fill);
        io.out[rows_outputs.size()] = buffers.back().data() + kGuard;
        rows_outputs.push_back(i);
      }
      const std::optional<std::uint64_t> bad = kernel(args, io);
      if (bad) {
        out.bad = r0 * shape.cols + *bad;
        return out;  // outputs are unspecified after a non-finite weight
      }
      for (std::size_t k = 0; k < rows_outputs.size(); ++k) {
        const OutputTensorSpec& spec = out.specs[rows_outputs[k]];
        const std::vector<std::byte>& b = buffers[k];
        for (std::size_t j = 0; j < kGuard; ++j) {
          if (b[j] != fill || b[b.size() - 1 - j] != fill) {
            out.faults.push_back(fmt::format("{}: rows [{}, {}) write outside their {} bytes",
                                             spec.suffix, r0, r1, b.size() - 2 * kGuard));
            break;
          }
        }
        if (first.size() > k) {
          for (std::size_t j = kGuard; j < b.size() - kGuard; ++j) {
            if (b[j] != first[k][j]) {
              out.faults.push_back(fmt::format("{}: rows [{}, {}) leave byte {} unwritten",
                                               spec.suffix, r0, r1, j - kGuard));
              break;
            }
          }
        } else {
          std::copy(b.begin() + kGuard, b.end() - kGuard,
                    out.tensors[rows_outputs[k]].begin() +
                        static_cast<std::ptrdiff_t>(spec.bytes_before(r0)));
        }
      }
      first = std::move(buffers);
    }
  }
  return out;
}

// "" when both runs wrote the same bytes and found the same first
// non-finite element, otherwise the first difference.
std::string compare(const Written& actual, const Written& expected) {
  if (actual.bad != expected.bad) {
    return fmt::format("first non-finite index {}, expected {}",
                       actual.bad ? std::to_string(*actual.bad) : "none",
                       expected.bad ? std::to_string(*expected.bad) : "none");
  }
  if (actual.bad) return {};
  for (std::size_t i = 0; i < expected.tensors.size(); ++i) {
    const std::string d = first_difference(actual.tensors[i], expected.tensors[i]);
    if (!d.empty()) return expected.specs[i].suffix + " " + d;
  }
  return {};
}

std::string describe(const ContractCase& c, DType dtype, Shape shape) {
  return fmt::format("{} ({}), {} [{}, {}]", c.name, args_name(c.args), dtype_tag(dtype),
                     shape.rows, shape.cols);
}

// ---- The format's error bound ----

// The largest |w - dequantized w| allowed for weight w of a scale group
// whose largest magnitude is group_amax, lowest value lo and highest hi,
// in a module whose largest magnitude is tensor_amax; nullopt for args
// whose format this function does not know (a new format states its bound
// here). u is the unit roundoff of the weight dtype T (half of eps(T)):
// every value the reference rounds to T moves by at most u relative.
std::optional<double> format_bound(const QuantArgs& a, DType t, double w, double lo, double hi,
                                   double group_amax, double tensor_amax) {
  const double u = dtype_eps(t) / 2.0;
  // Below T's normal range a rounding moves a value by up to half the
  // smallest subnormal instead (F16 2^-24, BF16 2^-133, F32 2^-149).
  const double tiny = std::ldexp(1.0, t == DType::kF16 ? -25 : t == DType::kBF16 ? -134 : -150);
  const double aw = std::fabs(w);
  // An all-zero group: every format stores zero codes, which its scale
  // (eps, 0x20, 1.0 when the computed one is zero) decodes to zero.
  if (group_amax == 0.0) return 0.0;
  // A minifloat code with m mantissa bits and smallest normal exponent
  // emin is within half a step of x: |x| 2^-(m+1) in the normal range,
  // 2^(emin-m-1) among the subnormals (schemes.md 2.1-2.3: E4M3 m 3,
  // emin -6, largest 448; E2M1 m 1, emin 0, largest 6).
  const auto code_error = [](double x, int m, int emin) {
    return std::max(std::fabs(x) * std::ldexp(1.0, -(m + 1)), std::ldexp(1.0, emin - m - 1));
  };
  if (a.type == QuantArgs::Type::kInt) {
    // schemes.md 3 (int8.hpp, kernel.hpp): s = amax / ((qmax - qmin) / 2)
    // symmetric, (max(hi, 0) - min(lo, 0)) / (qmax - qmin) asymmetric, in
    // T; code = round_half_even(clamp(round_T(w / s) (+ z), qmin, qmax)).
    // Half a step from the integer rounding (and the clamp at the range's
    // edge), plus the roundings of the quotient to T: |w / s| <= 2^(b-1)
    // steps symmetric; asymmetric also the zero point's and the sum's,
    // each at most 2^b steps: 3 * 2^b * u steps in all. The scale itself
    // is rounded to T (twice, asymmetric: 2u relative, 2 tiny), and a scale
    // rounded down shortens the range the codes cover, by at most
    // range - levels * s_min; the decoded value is rounded to T (u |w|).
    const double levels = std::ldexp(1.0, a.num_bits) - 1.0;
    const double range = a.symmetric ? 2.0 * group_amax : std::max(hi, 0.0) - std::min(lo, 0.0);
    const double s = range / levels;
    const double s_max = s * (1.0 + 2.0 * u) + 2.0 * tiny;
    const double s_min = std::max(s * (1.0 - 2.0 * u) - 2.0 * tiny, 0.0);
    const double steps =
        0.5 +
        (a.symmetric ? std::ldexp(1.0, a.num_bits - 1) : 3.0 * std::ldexp(1.0, a.num_bits)) * u;
    return steps * s_max + std::max(0.0, range - levels * s_min) + u * (aw + s_max);
  }
  if (a.num_bits == 8 && !a.scale_dtype) {
    // FP8 E4M3 codes, scale in T (schemes.md 4, fp8.hpp): s = round_T(amax
    // / 448), code = e4m3(clamp(round_T(w / s), +-448)). The code's half
    // step, the quotient's rounding (u |x|), the clamp of a quotient the
    // scale's rounding took past 448.
    const double s = group_amax / 448.0 * (1.0 + u) + tiny;
    const double s_min = std::max(group_amax / 448.0 * (1.0 - u) - tiny, tiny);
    const double x = aw / s_min;
    return s * (code_error(x, 3, -6) + u * x) + std::max(0.0, aw - 448.0 * s_min) + u * aw;
  }
  if (a.num_bits == 4 && a.strategy == S::kTensorGroup && a.scale_dtype == DType::kF8_E4M3) {
    // NVFP4 (schemes.md 5.3): the divisor is e4m3(gs * round_T(amax_g /
    // 6)) / gs, gs the global scale of the module: amax_g / 6 within the
    // E4M3 scale's half step (2^-4 relative, 2^-10 / gs among its
    // subnormals) and four roundings to T or F32 (round_T(amax_g / 6) by
    // up to tiny below T's normal range); a zero scale code becomes 0x20
    // (0.125). Codes E2M1 of w / divisor, clamped to 6.
    const double gs = microscale::nvfp4_global_scale(t, static_cast<float>(tensor_amax));
    const double d = group_amax / 6.0;
    const double spread = 0x1p-4 + 4.0 * u;
    const double d_max = std::max((d + tiny) * (1.0 + spread) + 0x1p-10 / gs, 0.125 / gs);
    const double d_min = std::max((d - tiny) * (1.0 - spread) - 0x1p-10 / gs, 0.0);
    // Within [-6, 6]: divisor * max(|x| / 4, 1 / 4) = max(|w|, divisor) / 4.
    return std::max(aw, d_max) / 4.0 + std::max(0.0, aw - 6.0 * d_min) + u * aw;
  }
  if (a.strategy == S::kGroup && a.scale_dtype == DType::kU8 &&
      (a.num_bits == 4 || a.num_bits == 8)) {
    // MXFP4 / MXFP8 (schemes.md 6.1-6.4): the scale X is amax_g rounded to
    // a power of two (mantissas from 1.75 up), divided by 2^offset (2 for
    // E2M1, 8 for E4M3), so amax_g / X lies in [0.875, 1.75) * 2^offset;
    // codes E2M1 or E4M3 of w / X, clamped to the format's largest value.
    // An X below T's smallest subnormal becomes 1.0 (step 3).
    const bool fp4 = a.num_bits == 4;
    const int offset = fp4 ? microscale::kMxfp4Offset : microscale::kMxfp8Offset;
    const double largest = fp4 ? 6.0 : 448.0;
    double x_max = group_amax / (0.875 * std::ldexp(1.0, offset));
    const double x_min = group_amax / (1.75 * std::ldexp(1.0, offset));
    if (x_min < 2.0 * tiny) x_max = std::max(x_max, 1.0);
    // Within range: X * code_error(w / X), the relative half step times
    // |w|, or X times the subnormal one.
    const int m = fp4 ? 1 : 3;
    const int emin = fp4 ? 0 : -6;
    return std::max(aw * std::ldexp(1.0, -(m + 1)), x_max * std::ldexp(1.0, emin - m - 1)) +
           std::max(0.0, aw - largest * x_min) + u * aw;
  }
  return std::nullopt;
}

// ---- The tests ----

void PrintTo(const ContractCase& c, std::ostream* os) { *os << c.name; }

class RegistryContract : public ::testing::TestWithParam<ContractCase> {};

std::string case_name(const ::testing::TestParamInfo<ContractCase>& info) {
  return info.param.name;
}

// Calls check(dtype, shape, weight) for every shape of the case and every
// weight dtype, with the case's seeded weights.
template <class Check>
void for_each_weight(const ContractCase& c, Check check) {
  const std::vector<Shape> all = shapes(c);
  ASSERT_FALSE(all.empty()) << c.name << ": the row refuses every shape tried";
  for (const Shape shape : all) {
    for (const DType dtype : kWeightTypes) {
      const std::vector<std::byte> weight = random_weights(c.name, dtype, shape);
      check(dtype, shape, weight);
    }
  }
}

// What dequantize reads for the outputs q holds: each kRows output in
// `in`, each kWhole one in `whole`, both in outputs() order.
DequantIo decoder_input(const Written& q, DType dtype, Shape shape, std::vector<float>& values) {
  DequantIo io;
  io.dtype = dtype;
  io.n_rows = shape.rows;
  io.n_cols = shape.cols;
  std::size_t in = 0;
  std::size_t whole = 0;
  for (std::size_t i = 0; i < q.specs.size(); ++i) {
    if (q.specs[i].fill == OutputTensorSpec::Fill::kRows) {
      io.in[in++] = q.tensors[i].data();
    } else {
      io.whole[whole++] = q.tensors[i].data();
    }
  }
  io.values = values.data();
  return io;
}

TEST_P(RegistryContract, DequantizeRowsEqualsDequantize) {
  const ContractCase& c = GetParam();
  if (c.family->dequantize_rows == nullptr) {
    GTEST_SKIP() << c.family->id << " has no vector decoder (quant_error runs dequantize)";
  }
  for_each_weight(c, [&](DType dtype, Shape shape, const std::vector<std::byte>& weight) {
    const Written q = run_kernel(*c.family, c.family->quantize_ref, c.args, dtype, shape, weight);
    ASSERT_FALSE(q.bad.has_value()) << describe(c, dtype, shape);
    std::vector<float> values(shape.rows * shape.cols);
    const DequantIo io = decoder_input(q, dtype, shape, values);
    c.family->dequantize(c.args, io);
    // Every band [r0, r1) the weight error takes: single rows and the rest.
    for (const auto& [r0, r1] : {std::pair<std::uint64_t, std::uint64_t>{0, shape.rows},
                                 {shape.rows - 1, shape.rows},
                                 {shape.rows / 2, shape.rows}}) {
      std::vector<float> band((r1 - r0) * shape.cols, -1.0f);
      c.family->dequantize_rows(c.args, io, r0, r1, band.data());
      for (std::size_t i = 0; i < band.size(); ++i) {
        const float expected = values[r0 * shape.cols + i];
        ASSERT_EQ(std::bit_cast<std::uint32_t>(band[i]), std::bit_cast<std::uint32_t>(expected))
            << describe(c, dtype, shape) << ": rows [" << r0 << ", " << r1 << ") element " << i
            << ": " << band[i] << ", dequantize gives " << expected;
      }
    }
  });
}

TEST_P(RegistryContract, DequantizedWithinFormatBound) {
  const ContractCase& c = GetParam();
  for_each_weight(c, [&](DType dtype, Shape shape, const std::vector<std::byte>& weight) {
    const Written q = run_kernel(*c.family, c.family->quantize_ref, c.args, dtype, shape, weight);
    ASSERT_FALSE(q.bad.has_value()) << describe(c, dtype, shape);
    std::vector<float> values(shape.rows * shape.cols);
    const DequantIo io = decoder_input(q, dtype, shape, values);
    c.family->dequantize(c.args, io);
    const std::size_t esize = element_size(dtype);
    const auto w_at = [&](std::uint64_t r, std::uint64_t k) {
      return static_cast<double>(
          load_as_float(dtype, weight.data() + (r * shape.cols + k) * esize));
    };
    const double tensor_amax = max_magnitude(dtype, weight);
    // Scale groups as compressed-tensors lays them out: scale_rows x
    // scale_cols tiles (the last ones cut short).
    const std::uint64_t gr = c.args.scale_rows(shape.rows);
    const std::uint64_t gc = c.args.scale_cols(shape.cols);
    double worst = 0.0;
    for (std::uint64_t r0 = 0; r0 < shape.rows; r0 += gr) {
      for (std::uint64_t k0 = 0; k0 < shape.cols; k0 += gc) {
        const std::uint64_t r1 = std::min(shape.rows, r0 + gr);
        const std::uint64_t k1 = std::min(shape.cols, k0 + gc);
        double lo = 0.0;
        double hi = 0.0;
        double amax = 0.0;
        for (std::uint64_t r = r0; r < r1; ++r) {
          for (std::uint64_t k = k0; k < k1; ++k) {
            lo = std::min(lo, w_at(r, k));
            hi = std::max(hi, w_at(r, k));
            amax = std::max(amax, std::fabs(w_at(r, k)));
          }
        }
        for (std::uint64_t r = r0; r < r1; ++r) {
          for (std::uint64_t k = k0; k < k1; ++k) {
            const double w = w_at(r, k);
            const std::optional<double> bound =
                format_bound(c.args, dtype, w, lo, hi, amax, tensor_amax);
            ASSERT_TRUE(bound.has_value()) << c.name << ": no error bound is known for "
                                           << args_name(c.args) << " (format_bound in this file)";
            const double error = std::fabs(w - static_cast<double>(values[r * shape.cols + k]));
            worst = std::max(worst, error / std::max(*bound, 1e-300));
            ASSERT_LE(error, *bound)
                << describe(c, dtype, shape) << ": element [" << r << ", " << k << "] " << w
                << " dequantizes to " << values[r * shape.cols + k] << " (group amax " << amax
                << ")";
          }
        }
      }
    }
    // The bound is not vacuous: somewhere the error comes near it.
    if (shape.rows * shape.cols >= 1024) {
      EXPECT_GT(worst, 0.1) << describe(c, dtype, shape) << ": largest error / bound " << worst;
    }
  });
}

TEST_P(RegistryContract, OutputSizesEqualBytesWritten) {
  const ContractCase& c = GetParam();
  for_each_weight(c, [&](DType dtype, Shape shape, const std::vector<std::byte>& weight) {
    for (const auto& [label, kernel] :
         {std::pair<const char*, KernelFn>{"quantize_ref", c.family->quantize_ref},
          {"quantize", c.family->quantize}}) {
      const std::string where = describe(c, dtype, shape) + ", " + label;
      // One row per chunk: every chunk boundary the alignment allows.
      for (const std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{1}}) {
        const Written w = run_kernel(*c.family, kernel, c.args, dtype, shape, weight, chunk);
        ASSERT_FALSE(w.bad.has_value()) << where;
        EXPECT_TRUE(w.faults.empty())
            << where << ": " << fmt::format("{}", fmt::join(w.faults, "; "));
        for (std::size_t i = 0; i < w.specs.size(); ++i) {
          const OutputTensorSpec& spec = w.specs[i];
          // The planner reserves byte_size() bytes for each output tensor
          // (its shape times its dtype); the executor writes rows [r0, r1)
          // at [bytes_before(r0), bytes_before(r1)).
          if (spec.fill == OutputTensorSpec::Fill::kRows) {
            EXPECT_EQ(spec.bytes_before(0), 0u) << where << ": " << spec.suffix;
            EXPECT_EQ(spec.bytes_before(shape.rows), spec.byte_size())
                << where << ": " << spec.suffix << " shape "
                << fmt::format("[{}]", fmt::join(spec.shape, ", "));
            // The logical elements of a unit fit in its bytes (verify
            // locates a byte's element with them).
            EXPECT_LE(spec.elements_per_unit * static_cast<std::uint64_t>(spec.element_bits),
                      8 * spec.bytes_per_unit)
                << where << ": " << spec.suffix;
          } else {
            EXPECT_EQ(w.tensors[i].size(), spec.byte_size()) << where << ": " << spec.suffix;
          }
        }
      }
    }
  });
}

TEST_P(RegistryContract, RowAlignmentHolds) {
  const ContractCase& c = GetParam();
  const std::uint64_t align = c.family->row_alignment(c.args);
  ASSERT_GE(align, 1u) << c.name;
  for_each_weight(c, [&](DType dtype, Shape shape, const std::vector<std::byte>& weight) {
    const Written whole =
        run_kernel(*c.family, c.family->quantize_ref, c.args, dtype, shape, weight);
    ASSERT_FALSE(whole.bad.has_value()) << describe(c, dtype, shape);
    for (const OutputTensorSpec& spec : whole.specs) {
      // A chunk boundary (a multiple of the alignment) falls on a unit of
      // the tensor, so two chunks never share a byte.
      if (spec.fill == OutputTensorSpec::Fill::kRows) {
        EXPECT_EQ(align * spec.units_num % spec.units_den, 0u)
            << c.name << ": " << spec.suffix << " has " << spec.units_num << "/" << spec.units_den
            << " units per row, row alignment " << align;
      }
    }
    for (const auto& [label, kernel] :
         {std::pair<const char*, KernelFn>{"quantize_ref", c.family->quantize_ref},
          {"quantize", c.family->quantize}}) {
      for (const std::uint64_t chunk : {align, 3 * align}) {
        for (const bool reverse : {false, true}) {
          const Written chunked =
              run_kernel(*c.family, kernel, c.args, dtype, shape, weight, chunk, reverse);
          EXPECT_EQ(compare(chunked, whole), "")
              << describe(c, dtype, shape) << ", " << label << " in chunks of " << chunk << " rows"
              << (reverse ? ", last chunk first" : "");
        }
      }
    }
  });
}

TEST_P(RegistryContract, RefusesExactlyColumnsOffTheGroup) {
  const ContractCase& c = GetParam();
  const std::uint64_t g = group_width(c.args);
  const std::uint64_t align = c.family->row_alignment(c.args);
  if (g == 1) {
    // Scales cover whole rows: any number of columns is taken.
    for (const std::uint64_t cols : {1, 37, 4097}) {
      EXPECT_EQ(c.family->refuse(c.args, align, cols), "") << c.name << ": " << cols << " columns";
    }
    return;
  }
  for (const std::uint64_t cols : {g + g / 2, 3 * g - 1, g + 1}) {
    EXPECT_NE(c.family->refuse(c.args, align, cols), "")
        << c.name << ": [" << align << ", " << cols << "] with groups of " << g;
  }
  EXPECT_EQ(c.family->refuse(c.args, align, 2 * g), "") << c.name;
}

INSTANTIATE_TEST_SUITE_P(Registry, RegistryContract, ::testing::ValuesIn(all_cases()), case_name);

// ---- The fast kernel at every SIMD level ----

struct LevelCase {
  ContractCase contract;
  detail::SimdLevel level;
};

std::vector<LevelCase> level_cases() {
  std::vector<detail::SimdLevel> levels = detail::simd_levels();
  std::vector<LevelCase> out;
  for (const ContractCase& c : all_cases()) {
    for (const detail::SimdLevel& level : levels) out.push_back({c, level});
  }
  return out;
}

void PrintTo(const LevelCase& c, std::ostream* os) {
  *os << c.contract.name << " at " << c.level.name;
}

class RegistryContractAtLevel : public ::testing::TestWithParam<LevelCase> {};

TEST_P(RegistryContractAtLevel, FastKernelEqualsReference) {
  const ContractCase& c = GetParam().contract;
  const detail::SimdLevel& level = GetParam().level;
  if (!level.supported) GTEST_SKIP() << "this CPU does not run " << level.name;
  for_each_weight(c, [&](DType dtype, Shape shape, std::vector<std::byte> weight) {
    const std::string where = describe(c, dtype, shape) + " at " + level.name;
    const Written ref = run_kernel(*c.family, c.family->quantize_ref, c.args, dtype, shape, weight);
    ASSERT_FALSE(ref.bad.has_value()) << where;
    const detail::ScopedSimdLevel at(level);
    ASSERT_STREQ(kernel_path_name(), level.name);
    const std::uint64_t align = c.family->row_alignment(c.args);
    for (const std::uint64_t chunk : {std::uint64_t{0}, 3 * align}) {
      const Written fast =
          run_kernel(*c.family, c.family->quantize, c.args, dtype, shape, weight, chunk);
      EXPECT_TRUE(fast.faults.empty())
          << where << ": " << fmt::format("{}", fmt::join(fast.faults, "; "));
      EXPECT_EQ(compare(fast, ref), "") << where << ", chunks of " << chunk << " rows";
    }
    // A NaN two thirds in and an infinity after it: both kernels name the NaN.
    const std::uint64_t n = shape.rows * shape.cols;
    const std::size_t esize = element_size(dtype);
    const std::vector<std::byte> nan = float_bytes(
        dtype, {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()});
    const std::uint64_t at_nan = n * 2 / 3;
    std::memcpy(weight.data() + at_nan * esize, nan.data(), esize);
    if (at_nan + 1 < n)
      std::memcpy(weight.data() + (at_nan + 1) * esize, nan.data() + esize, esize);
    const Written ref_nan =
        run_kernel(*c.family, c.family->quantize_ref, c.args, dtype, shape, weight);
    const Written fast_nan =
        run_kernel(*c.family, c.family->quantize, c.args, dtype, shape, weight);
    EXPECT_EQ(ref_nan.bad, std::optional<std::uint64_t>(at_nan)) << where;
    EXPECT_EQ(compare(fast_nan, ref_nan), "") << where << ", NaN at element " << at_nan;
  });
}

std::string level_case_name(const ::testing::TestParamInfo<LevelCase>& info) {
  return info.param.contract.name + "_" + identifier(info.param.level.name);
}

INSTANTIATE_TEST_SUITE_P(Registry, RegistryContractAtLevel, ::testing::ValuesIn(level_cases()),
                         level_case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RegistryContractAtLevel);  // no levels compiled

// The generator itself: every family and every preset it writes has cases.
TEST(RegistryContractCases, EveryFamilyAndPresetHasCases) {
  for (const SchemeFamily* family : scheme_families()) {
    EXPECT_TRUE(std::any_of(all_cases().begin(), all_cases().end(), [&](const ContractCase& c) {
      return c.family == family;
    })) << family->id;
    for (const Preset& preset : family->presets) {
      if (!preset.refused.empty()) continue;
      EXPECT_TRUE(std::any_of(all_cases().begin(), all_cases().end(), [&](const ContractCase& c) {
        return c.family == family && c.args == preset.weights;
      })) << preset.name;
    }
  }
}

// The questions lint and verify ask a family (SchemeFamily::
// vllm_one_global_scale, writes_weight_shape, vllm_int_weight_only) are
// answered by its row in agreement with what it writes: a weight_shape
// tensor exactly when the row says so, a global scale where vLLM is said to
// serve fused partners with one, and integer weight-only presets exactly in
// the family vLLM serves them from.
TEST(RegistryQuestions, AnswersAgreeWithWhatEachFamilyWrites) {
  std::size_t int_weight_only_families = 0;
  for (const SchemeFamily* family : scheme_families()) {
    SCOPED_TRACE(std::string(family->id));
    bool shape = false;
    bool global_scale = false;
    bool int_weight_only = false;
    for (const Preset& preset : family->presets) {
      if (!preset.refused.empty()) continue;
      for (const OutputTensorSpec& spec : family->outputs(preset.weights, DType::kBF16, 256, 256)) {
        shape |= spec.kind == OutputTensorSpec::Kind::kShape;
        global_scale |= spec.kind == OutputTensorSpec::Kind::kGlobalScale;
      }
      int_weight_only |=
          preset.weights.type == QuantArgs::Type::kInt && preset.input_activations.empty();
    }
    EXPECT_EQ(family->writes_weight_shape, shape);
    if (family->vllm_one_global_scale) {
      EXPECT_TRUE(global_scale);
    }
    EXPECT_EQ(family->vllm_int_weight_only, int_weight_only);
    int_weight_only_families += family->vllm_int_weight_only ? 1 : 0;
  }
  // verify names the one format vLLM reads integer weight-only groups from.
  EXPECT_EQ(int_weight_only_families, 1u);
  EXPECT_TRUE(family_by_format("nvfp4-pack-quantized")->vllm_one_global_scale);
  EXPECT_FALSE(family_by_format("float-quantized")->vllm_one_global_scale);
}

}  // namespace
}  // namespace ctquant::test
