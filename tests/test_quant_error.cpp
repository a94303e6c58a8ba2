// The weight error of every module (quant_error.hpp): exact values on
// hand-computed cases, the vector code against the scalar reference bit for
// bit at every level this CPU runs (NaN, infinities, subnormals, every
// column count around the lane width), the row-ordered sum of chunks that
// arrive in any order, and the same figures for any band or chunk split.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/quant_error.hpp"
#include "ctquant/scheme/registry.hpp"
#include "scheme/dequant_simd.hpp"
#include "scheme/quant_error_simd.hpp"
#include "simd/simd.hpp"

namespace ctquant {
namespace {

std::size_t esize(DType dtype) { return static_cast<std::size_t>(dtype_bits(dtype) / 8); }

// value rounded to dtype (nearest even), stored at element i of bytes.
void store(DType dtype, std::vector<std::byte>& bytes, std::size_t i, float value) {
  if (dtype == DType::kF32) {
    std::memcpy(bytes.data() + 4 * i, &value, 4);
    return;
  }
  const std::uint16_t b = dtype == DType::kBF16 ? float_to_bf16(value) : float_to_f16(value);
  std::memcpy(bytes.data() + 2 * i, &b, 2);
}

std::vector<std::byte> weights_of(DType dtype, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * esize(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) store(dtype, bytes, i, values[i]);
  return bytes;
}

// Bits equal, or both NaN.
bool same_double(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}
bool same_row(const RowError& a, const RowError& b) {
  return same_double(a.err2, b.err2) && same_double(a.w2, b.w2) &&
         std::bit_cast<std::uint32_t>(a.max_abs) == std::bit_cast<std::uint32_t>(b.max_abs);
}
std::string show(const RowError& r) {
  return fmt::format("{{err2 {:a}, w2 {:a}, max {:a}}}", r.err2, r.w2, r.max_abs);
}

TEST(QuantError, HandComputedRowsAndModule) {
  // W = [[1, 2, -3], [0.5, 0, 4]], Q = [[1, 1.5, -2], [0.5, 0.25, 4]]:
  // d = [[0, 0.5, -1], [0, -0.25, 0]].
  const std::vector<std::byte> w = weights_of(DType::kBF16, {1, 2, -3, 0.5f, 0, 4});
  const std::vector<float> q = {1, 1.5f, -2, 0.5f, 0.25f, 4};
  std::vector<RowError> rows(2);
  weight_error_rows(DType::kBF16, w.data(), q.data(), 2, 3, rows);
  EXPECT_EQ(rows[0].err2, 1.25);
  EXPECT_EQ(rows[0].w2, 14.0);
  EXPECT_EQ(rows[0].max_abs, 1.0f);
  EXPECT_EQ(rows[1].err2, 0.0625);
  EXPECT_EQ(rows[1].w2, 16.25);
  EXPECT_EQ(rows[1].max_abs, 0.25f);
  QuantError module;
  for (const RowError& r : rows) module.add(r);
  EXPECT_EQ(module.rows, 2u);
  EXPECT_EQ(module.err2, 1.3125);
  EXPECT_EQ(module.w2, 30.25);
  // sqrt(1.3125 / 30.25) = sqrt(21 / 484) = sqrt(21) / 22.
  EXPECT_DOUBLE_EQ(module.rel_frobenius(), std::sqrt(21.0) / 22.0);
  EXPECT_EQ(module.max_abs_error(), 1.0);
}

TEST(QuantError, ZeroWeightsGiveZeroOrInfinity) {
  QuantError zero;
  zero.add(RowError{0.0, 0.0, 0.0f});
  EXPECT_EQ(zero.rel_frobenius(), 0.0);
  QuantError off;
  off.add(RowError{0.25, 0.0, 0.5f});
  EXPECT_EQ(off.rel_frobenius(), std::numeric_limits<double>::infinity());
  QuantError nan;
  nan.add(RowError{std::numeric_limits<double>::quiet_NaN(), 1.0, 0.0f});
  EXPECT_TRUE(std::isnan(nan.rel_frobenius()));
}

TEST(QuantError, W4A16ChannelHandComputed) {
  // One row whose max |w| is 7.5: the int4 scale is 7.5 / 7.5 = 1, so the
  // codes are the weights rounded half to even and clamped to [-8, 7]:
  // W = [7.5, 1.25, -3.5, 0.5, 2.75, -7.5, 0, 6]
  // Q = [7,   1,    -4,   0,   3,    -8,   0, 6]   (7.5 -> 8 -> clamped 7)
  // d = [0.5, 0.25, 0.5,  0.5, -0.25, 0.5, 0, 0]
  const std::vector<float> row = {7.5f, 1.25f, -3.5f, 0.5f, 2.75f, -7.5f, 0.0f, 6.0f};
  const std::vector<std::byte> w = weights_of(DType::kBF16, row);
  const Preset* preset = find_preset("W4A16");
  ASSERT_NE(preset, nullptr);
  QuantArgs args = preset->weights;
  args.strategy = QuantArgs::Strategy::kChannel;
  const SchemeFamily* family = family_for(args, false);
  ASSERT_NE(family, nullptr);
  const auto specs = family->outputs(args, DType::kBF16, 1, 8);
  std::vector<std::vector<std::byte>> out;
  KernelIo io;
  io.dtype = DType::kBF16;
  io.n_rows = 1;
  io.n_cols = 8;
  io.weight = w.data();
  for (const OutputTensorSpec& s : specs) {
    if (s.fill != OutputTensorSpec::Fill::kRows) continue;
    out.emplace_back(s.bytes_before(1));
  }
  for (std::size_t i = 0; i < out.size(); ++i) io.out[i] = out[i].data();
  std::vector<std::byte> scratch(family->scratch_bytes(args, 1, 8));
  io.scratch = scratch;
  ASSERT_FALSE(family->quantize(args, io));
  QuantErrorIo e;
  e.dtype = DType::kBF16;
  e.n_rows = 1;
  e.n_cols = 8;
  e.weight = w.data();
  for (std::size_t i = 0; i < out.size(); ++i) e.outputs[i] = out[i].data();
  std::vector<RowError> rows(1);
  std::vector<float> values;
  quant_error_rows(*family, args, e, rows, values);
  EXPECT_EQ(rows[0].err2, 1.125);
  EXPECT_EQ(rows[0].w2, 170.125);
  EXPECT_EQ(rows[0].max_abs, 0.5f);
}

TEST(RowOrderedError, ChunksInAnyOrderSumInRowOrder) {
  // Values whose sum depends on the order of the additions.
  std::vector<RowError> rows;
  for (int i = 0; i < 10; ++i) {
    rows.push_back(RowError{i % 2 == 0 ? 1e16 : 1.0 + i, 0.1 * i, static_cast<float>(i)});
  }
  QuantError in_order;
  for (const RowError& r : rows) in_order.add(r);
  RowOrderedError any_order;
  const std::span<const RowError> all(rows);
  any_order.add(7, all.subspan(7, 3));
  any_order.add(3, all.subspan(3, 4));
  EXPECT_EQ(any_order.total().rows, 0u);
  any_order.add(0, all.subspan(0, 3));
  EXPECT_EQ(any_order.total(), in_order);
  EXPECT_EQ(any_order.total().max_abs, 9.0f);
}

TEST(RowOrderedError, RowsGivenTwiceAreACallerBug) {
  const std::vector<RowError> rows(4);
  RowOrderedError sum;
  sum.add(0, std::span<const RowError>(rows).subspan(0, 2));
  EXPECT_THROW(sum.add(1, std::span<const RowError>(rows).subspan(0, 2)), std::logic_error);
  sum.add(3, std::span<const RowError>(rows).subspan(0, 1));
  EXPECT_THROW(sum.add(3, std::span<const RowError>(rows).subspan(0, 1)), std::logic_error);
}

// Random weights and values around them, with the inputs a careless vector
// code gets wrong: NaN and infinite values, subnormals, -0.0, huge weights.
struct Case {
  DType dtype;
  std::uint64_t rows;
  std::uint64_t cols;
  std::vector<std::byte> weight;
  std::vector<float> values;
};

Case make_case(DType dtype, std::uint64_t rows, std::uint64_t cols, std::uint32_t seed,
               bool adversarial) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_int_distribution<int> pick(0, 15);
  Case c{dtype, rows, cols, std::vector<std::byte>(rows * cols * esize(dtype)),
         std::vector<float>(rows * cols)};
  for (std::uint64_t i = 0; i < rows * cols; ++i) {
    float w = normal(rng);
    float q = w + normal(rng) * 0.1f;
    if (adversarial) {
      switch (pick(rng)) {
        case 0: q = std::numeric_limits<float>::quiet_NaN(); break;
        case 1: q = std::numeric_limits<float>::infinity(); break;
        case 2: w = 0x1p-140f; q = -0x1p-149f; break;  // F32 subnormals
        case 3: w = -0.0f; q = 0.0f; break;
        case 4: w = 3.0e38f; q = -3.0e38f; break;  // d overflows to -inf... in float
        case 5: w = 6.0e4f; q = 1e-30f; break;
        default: break;
      }
    }
    store(dtype, c.weight, i, w);
    c.values[i] = q;
  }
  return c;
}

std::vector<RowError> run_ref(const Case& c) {
  std::vector<RowError> out(c.rows);
  weight_error_rows_ref(c.dtype, c.weight.data(), c.values.data(), c.rows, c.cols, out);
  return out;
}

TEST(WeightErrorRows, EveryLevelMatchesTheReferenceBitForBit) {
  std::size_t levels = 0;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    detail::WeightErrorRowsKernel* kernel = detail::weight_error_rows_kernel(level);
    if (kernel == nullptr) continue;
    ++levels;
    std::uint32_t seed = 1;
    for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (const std::uint64_t cols :
           {1u, 2u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 48u, 100u, 128u, 1000u, 4096u}) {
        for (const bool adversarial : {false, true}) {
          const Case c = make_case(dtype, 5, cols, seed++, adversarial);
          const std::vector<RowError> ref = run_ref(c);
          std::vector<RowError> fast(c.rows);
          kernel(c.dtype, c.weight.data(), c.values.data(), c.rows, c.cols, fast.data());
          for (std::uint64_t r = 0; r < c.rows; ++r) {
            ASSERT_TRUE(same_row(ref[r], fast[r]))
                << level.name << " " << dtype_tag(dtype) << " cols " << cols << " row " << r
                << (adversarial ? " adversarial" : "") << ": reference " << show(ref[r])
                << ", vector " << show(fast[r]);
          }
        }
      }
    }
  }
  if (levels == 0) GTEST_SKIP() << "this CPU runs none of the vector levels compiled for it";
}

TEST(WeightErrorRows, PublicEntryMatchesTheReference) {
  const Case c = make_case(DType::kBF16, 7, 4096, 99, false);
  const std::vector<RowError> ref = run_ref(c);
  std::vector<RowError> fast(c.rows);
  weight_error_rows(c.dtype, c.weight.data(), c.values.data(), c.rows, c.cols, fast);
  for (std::uint64_t r = 0; r < c.rows; ++r) EXPECT_TRUE(same_row(ref[r], fast[r])) << r;
}


// ---- the vector decoder of dequantize_rows (dequant_simd.hpp) ----

bool same_float(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

TEST(ExpandCodes, EveryLevelMatchesTheReference) {
  using detail::CodeKind;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> real(-3.0f, 3.0f);
  std::size_t levels = 0;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    detail::ExpandCodesKernel* kernel = detail::expand_codes_kernel(level);
    if (kernel == nullptr) continue;
    ++levels;
    for (const CodeKind kind : {CodeKind::kInt4Offset, CodeKind::kInt8Offset, CodeKind::kInt8,
                                CodeKind::kE2M1, CodeKind::kE4M3}) {
      for (const DType round_to : {DType::kBF16, DType::kF16, DType::kF32}) {
        // Group widths below, at and above a vector, odd ones (4-bit codes
        // then take the scalar steps), one group per row, ragged last groups.
        for (const auto& [cols, group] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
                 {64, 16}, {96, 32}, {256, 128}, {40, 8}, {100, 100}, {37, 37}, {45, 9},
                 {130, 64}, {4, 4}}) {
          for (const bool zero_points : {false, true}) {
            const std::uint64_t rows = 3;
            const std::uint64_t row_bytes = cols + 3;  // rows padded, as int32 words pad them
            const std::uint64_t groups = (cols + group - 1) / group;
            std::vector<std::byte> codes(rows * row_bytes);
            for (auto& b : codes) b = static_cast<std::byte>(byte(rng));
            std::vector<float> multipliers(rows * groups);
            std::vector<float> zeros(rows * groups);
            for (std::size_t i = 0; i < multipliers.size(); ++i) {
              multipliers[i] = std::ldexp(real(rng), byte(rng) % 40 - 20);
              zeros[i] = static_cast<float>(byte(rng) % 16);
            }
            // NaN, infinite and subnormal multipliers, and products that
            // overflow the dtype.
            multipliers[0] = std::numeric_limits<float>::quiet_NaN();
            if (multipliers.size() > 1) multipliers[1] = std::numeric_limits<float>::infinity();
            if (multipliers.size() > 2) multipliers[2] = 0x1p-140f;
            multipliers.back() = 3.0e38f;
            detail::ExpandRows x;
            x.kind = kind;
            x.codes = codes.data();
            x.row_bytes = row_bytes;
            x.n_rows = rows;
            x.n_cols = cols;
            x.group_cols = group;
            x.multipliers = multipliers.data();
            x.zero_points = zero_points ? zeros.data() : nullptr;
            x.round_to = round_to;
            std::vector<float> ref(rows * cols, -1.0f);
            std::vector<float> fast(rows * cols, -2.0f);
            x.values = ref.data();
            detail::expand_codes_ref(x);
            x.values = fast.data();
            kernel(x);
            for (std::size_t i = 0; i < ref.size(); ++i) {
              ASSERT_TRUE(same_float(ref[i], fast[i]))
                  << level.name << " kind " << static_cast<int>(kind) << " round "
                  << dtype_tag(round_to) << " cols " << cols << " group " << group
                  << (zero_points ? " zero points" : "") << " element " << i << ": reference "
                  << ref[i] << ", vector " << fast[i];
            }
          }
        }
      }
    }
  }
  if (levels == 0) GTEST_SKIP() << "this CPU runs none of the vector levels compiled for it";
}

// ---- every family's dequantize_rows against its dequantize ----

struct Variant {
  std::string name;
  QuantArgs args;
  bool input_activations = false;
};

QuantArgs preset_args(const char* name) { return find_preset(name)->weights; }

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"W4A16", preset_args("W4A16")});
  v.push_back({"W4A16_ASYM", preset_args("W4A16_ASYM")});
  v.push_back({"W8A16", preset_args("W8A16")});
  QuantArgs a = preset_args("W4A16");
  a.strategy = QuantArgs::Strategy::kChannel;
  v.push_back({"W4A16 channel", a});
  a = preset_args("W4A16");
  a.group_size = 32;
  v.push_back({"W4A16 group 32", a});
  a = preset_args("W8A16");
  a.symmetric = false;
  v.push_back({"W8A16 asymmetric", a});
  a = preset_args("W4A16");
  a.num_bits = 3;
  a.group_size = 64;
  v.push_back({"int3 group 64", a});
  a.symmetric = false;
  v.push_back({"int3 asymmetric group 64", a});
  v.push_back({"FP8_DYNAMIC", preset_args("FP8_DYNAMIC"), true});
  v.push_back({"FP8_BLOCK", preset_args("FP8_BLOCK"), true});
  a = preset_args("FP8_DYNAMIC");
  a.strategy = QuantArgs::Strategy::kTensor;
  v.push_back({"FP8 tensor", a, true});
  v.push_back({"FP8 channel weights only", preset_args("FP8_DYNAMIC"), false});
  v.push_back({"W8A8", preset_args("W8A8"), true});
  a = preset_args("W8A8");
  a.strategy = QuantArgs::Strategy::kTensor;
  v.push_back({"W8A8 tensor", a, true});
  v.push_back({"NVFP4A16", preset_args("NVFP4A16")});
  v.push_back({"MXFP4A16", preset_args("MXFP4A16")});
  v.push_back({"MXFP8A16", preset_args("MXFP8A16")});
  return v;
}

// A module [rows, cols] of one variant: its weight, and its outputs as the
// kernel writes them (or, adversarial, random bytes in their place).
struct Module {
  const SchemeFamily* family = nullptr;
  QuantArgs args;
  DType dtype{};
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::vector<std::byte> weight;
  std::vector<OutputTensorSpec> specs;
  std::vector<std::vector<std::byte>> row_outputs;
  std::vector<std::vector<std::byte>> whole;

  QuantErrorIo io(std::uint64_t r0, std::uint64_t r1) const {
    QuantErrorIo e;
    e.dtype = dtype;
    e.n_rows = r1 - r0;
    e.n_cols = cols;
    e.row_begin = r0;
    e.weight = weight.data() + r0 * cols * esize(dtype);
    std::size_t i = 0;
    for (const OutputTensorSpec& s : specs) {
      if (s.fill != OutputTensorSpec::Fill::kRows) continue;
      e.outputs[i] = row_outputs[i].data() + s.bytes_before(r0);
      ++i;
    }
    for (std::size_t k = 0; k < whole.size() && k < e.whole.size(); ++k) {
      e.whole[k] = whole[k].data();
    }
    return e;
  }
  DequantIo dequant_io(std::uint64_t r0, std::uint64_t r1) const {
    const QuantErrorIo e = io(r0, r1);
    DequantIo d;
    d.dtype = dtype;
    d.n_rows = e.n_rows;
    d.n_cols = cols;
    d.row_begin = r0;
    d.in = e.outputs;
    d.whole = e.whole;
    return d;
  }
};

Module make_module(const Variant& v, DType dtype, std::uint64_t rows, std::uint64_t cols,
                   std::uint32_t seed, bool adversarial) {
  Module m;
  m.family = family_for(v.args, v.input_activations);
  m.args = v.args;
  m.dtype = dtype;
  m.rows = rows;
  m.cols = cols;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.03f);
  std::uniform_int_distribution<int> byte(0, 255);
  m.weight.resize(rows * cols * esize(dtype));
  float amax = 0.0f;
  for (std::uint64_t i = 0; i < rows * cols; ++i) {
    const float w = normal(rng);
    store(dtype, m.weight, i, w);
    amax = std::max(amax, std::fabs(load_as_float(dtype, m.weight.data() + i * esize(dtype))));
  }
  m.specs = m.family->outputs(v.args, dtype, rows, cols);
  KernelIo k;
  k.dtype = dtype;
  k.n_rows = rows;
  k.n_cols = cols;
  k.weight = m.weight.data();
  k.tensor_amax = amax;
  std::size_t whole_index = 0;
  for (const OutputTensorSpec& s : m.specs) {
    if (s.fill == OutputTensorSpec::Fill::kWhole) {
      m.whole.push_back(m.family->whole_tensor(v.args, dtype, rows, cols, amax, whole_index++));
    } else {
      m.row_outputs.emplace_back(s.bytes_before(rows));
    }
  }
  for (std::size_t i = 0; i < m.row_outputs.size(); ++i) k.out[i] = m.row_outputs[i].data();
  std::vector<std::byte> scratch(m.family->scratch_bytes(v.args, rows, cols));
  k.scratch = scratch;
  EXPECT_FALSE(m.family->quantize(v.args, k)) << v.name;
  if (adversarial) {
    for (auto& out : m.row_outputs) {
      for (auto& b : out) b = static_cast<std::byte>(byte(rng));
    }
    for (std::size_t o = 0, w = 0; o < m.specs.size(); ++o) {
      if (m.specs[o].fill != OutputTensorSpec::Fill::kWhole) continue;
      if (m.specs[o].kind != OutputTensorSpec::Kind::kShape) {
        for (auto& b : m.whole[w]) b = static_cast<std::byte>(byte(rng));
      }
      ++w;
    }
  }
  return m;
}

TEST(DequantizeRows, EveryFamilyGivesWhatItsDequantizeGives) {
  std::uint32_t seed = 11;
  for (const Variant& v : variants()) {
    for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (const bool adversarial : {false, true}) {
        // 200 rows: the last 128-row block of block FP8 is ragged.
        const Module m = make_module(v, dtype, 200, 256, seed++, adversarial);
        ASSERT_NE(m.family->dequantize_rows, nullptr) << v.name;
        std::vector<float> ref(m.rows * m.cols);
        DequantIo d = m.dequant_io(0, m.rows);
        d.values = ref.data();
        m.family->dequantize(m.args, d);
        // Bands of every size, starting anywhere.
        for (const std::uint64_t band : {1u, 7u, 64u, 200u}) {
          std::vector<float> fast(m.rows * m.cols, -1.0f);
          for (std::uint64_t r0 = 0; r0 < m.rows; r0 += band) {
            const std::uint64_t r1 = std::min(m.rows, r0 + band);
            m.family->dequantize_rows(m.args, m.dequant_io(0, m.rows), r0, r1,
                                      fast.data() + r0 * m.cols);
          }
          for (std::size_t i = 0; i < ref.size(); ++i) {
            ASSERT_TRUE(same_float(ref[i], fast[i]))
                << v.name << " " << dtype_tag(dtype) << (adversarial ? " random outputs" : "")
                << " band " << band << " element [" << i / m.cols << ", " << i % m.cols
                << "]: dequantize " << ref[i] << ", dequantize_rows " << fast[i];
          }
        }
      }
    }
  }
}

// The module's figures from dequantize and the scalar reference, row by row.
QuantError reference_error(const Module& m) {
  std::vector<float> values(m.rows * m.cols);
  DequantIo d = m.dequant_io(0, m.rows);
  d.values = values.data();
  m.family->dequantize(m.args, d);
  std::vector<RowError> rows(m.rows);
  weight_error_rows_ref(m.dtype, m.weight.data(), values.data(), m.rows, m.cols, rows);
  QuantError total;
  for (const RowError& r : rows) total.add(r);
  return total;
}

TEST(QuantErrorRows, SameFiguresForEveryChunkSplitAndOrder) {
  std::uint32_t seed = 500;
  for (const Variant& v : variants()) {
    const Module m = make_module(v, DType::kBF16, 256, 256, seed++, false);
    const QuantError want = reference_error(m);
    EXPECT_EQ(want.rows, m.rows);
    EXPECT_GT(want.rel_frobenius(), 0.0) << v.name;
    const std::uint64_t align = std::max<std::uint64_t>(1, m.family->row_alignment(m.args));
    for (const std::uint64_t chunk : {align, 32 * align, 128u * align, m.rows}) {
      const std::uint64_t step = std::min(m.rows, chunk);
      // Chunks computed in order, summed last to first.
      std::vector<std::pair<std::uint64_t, std::vector<RowError>>> done;
      std::vector<float> scratch;
      for (std::uint64_t r0 = 0; r0 < m.rows; r0 += step) {
        const std::uint64_t r1 = std::min(m.rows, r0 + step);
        std::vector<RowError> rows(r1 - r0);
        quant_error_rows(*m.family, m.args, m.io(r0, r1), rows, scratch);
        done.emplace_back(r0, std::move(rows));
      }
      RowOrderedError sum;
      for (auto it = done.rbegin(); it != done.rend(); ++it) sum.add(it->first, it->second);
      EXPECT_EQ(sum.total(), want) << v.name << " chunks of " << step << " rows";
    }
  }
}
}  // namespace
}  // namespace ctquant
