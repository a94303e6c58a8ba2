// The weight observers (scheme/observer.hpp): PyTorch's pow and sum as the
// MSE search computes its errors (against values PyTorch 2.14 computed,
// tests/golden/torch-ops), the vector search against the scalar reference
// at every level, the library's patience rule, observer names and kwargs,
// and the command line (--observer, --observer-kwarg, --scheme-for
// PATTERN=PRESET@OBSERVER). The search's bytes against the real library are
// the golden cases whose names end in -mse (test_golden.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "ctquant/format/dtype.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/plan/recipe.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"
#include "golden_support.hpp"
#include "scheme/observer_steps.hpp"
#include "simd/simd.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using json = nlohmann::json;
using S = QuantArgs::Strategy;
using test::expect_message;
using test::TempDir;

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

DType dtype_of(const std::string& name) { return name == "bf16" ? DType::kBF16 : DType::kF16; }

json torch_vectors() {
  return test::read_json(test::golden_dir() / "torch-ops" / "torch_vectors.json");
}

TEST(MseObserver, PowMatchesPyTorchOnBf16AndF16Values) {
  std::size_t checked = 0;
  const json vectors = torch_vectors();
  for (const json& c : vectors.at("pow")) {
    const DType w = dtype_of(c.at("dtype"));
    const double norm = c.at("norm");
    const auto in = c.at("in").get<std::vector<std::uint16_t>>();
    const auto out = c.at("out").get<std::vector<std::uint16_t>>();
    ASSERT_EQ(in.size(), out.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(mse_detail::pow_w(w, in[i] & 0x7FFFu, norm), out[i])
          << c.at("dtype") << " " << norm << " of 0x" << std::hex << in[i];
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10u * 56u);
}

// PyTorch's sums of random rows, of near-tie rows (the exact sum within one
// float32 step of a BF16/F16 rounding midpoint, so the order of the float
// additions decides the rounding), of built rows that tell the float lanes
// apart, and of F32 rows (the rounding of every addition shows). Summing in
// 16 lanes as AVX-512 vectors would (BF16 elements l and l + 16 into lane l)
// gets 21 of these wrong, among them 2 BF16 and 2 F16 near-tie rows.
TEST(MseObserver, SumFollowsPyTorchsCascadeOrderBitForBit) {
  const json vectors = torch_vectors();
  std::map<std::string, int> checked;
  for (const json& c : vectors.at("sum")) {
    const std::string name = c.at("dtype");
    const DType w = name == "f32" ? DType::kF32 : dtype_of(name);
    std::vector<float> values;
    for (const std::uint32_t b : c.at("in").get<std::vector<std::uint32_t>>()) {
      values.push_back(w == DType::kF32    ? std::bit_cast<float>(b)
                       : w == DType::kBF16 ? bf16_to_float(static_cast<std::uint16_t>(b))
                                           : f16_to_float(static_cast<std::uint16_t>(b)));
    }
    const float sum = mse_detail::torch_sum_w(w, values);
    const std::uint32_t bits = w == DType::kF32    ? std::bit_cast<std::uint32_t>(sum)
                               : w == DType::kBF16 ? float_to_bf16(sum)
                                                   : float_to_f16(sum);
    EXPECT_EQ(bits, c.at("out").get<std::uint32_t>())
        << name << " " << c.value("kind", "random") << " n=" << c.at("n");
    ++checked[name + " " + c.value("kind", "random")];
    // The recorded program adds the same values in the same order.
    const detail::SumProgram& p = detail::torch_sum_program(w, values.size());
    std::vector<float> slots(values);
    slots.resize(p.slots);
    for (const detail::SumStep& s : p.steps) slots[s.dst] = slots[s.a] + slots[s.b];
    const float replay = p.result < 0 ? 0.0f : slots[static_cast<std::size_t>(p.result)];
    EXPECT_EQ(std::bit_cast<std::uint32_t>(round_to_dtype(w, replay)),
              std::bit_cast<std::uint32_t>(sum))
        << "n=" << c.at("n");
  }
  const std::map<std::string, int> expected = {
      {"bf16 random", 10},  {"f16 random", 10}, {"f32 random", 12}, {"bf16 near-tie", 20},
      {"f16 near-tie", 20}, {"bf16 built", 8},  {"f16 built", 8}};
  EXPECT_EQ(checked, expected);
}

QuantArgs args_for(QuantArgs::Type type, int bits, bool symmetric, S strategy, std::uint64_t group,
                   std::optional<DType> scale_dtype = std::nullopt) {
  QuantArgs a;
  a.type = type;
  a.num_bits = bits;
  a.symmetric = symmetric;
  a.strategy = strategy;
  a.group_size = group;
  a.scale_dtype = scale_dtype;
  a.observer = "memoryless_mse";
  return a;
}

// Rows of normal values with adversarial groups: all zero, one sign only,
// subnormals, a dominant outlier, equal values.
std::vector<std::byte> adversarial_rows(DType w, std::uint64_t rows, std::uint64_t cols,
                                        std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = normal(rng);
  for (std::uint64_t r = 0; r < rows; ++r) {
    float* row = v.data() + r * cols;
    switch (r % 6) {
      case 0:
        std::fill(row, row + cols / 2, 0.0f);
        break;
      case 1:
        for (std::uint64_t c = 0; c < cols; ++c) row[c] = -std::fabs(row[c]);
        break;
      case 2:
        for (std::uint64_t c = 0; c < cols; ++c) row[c] *= w == DType::kF16 ? 1e-4f : 1e-37f;
        break;
      case 3:
        row[cols / 3] = 0.9f;
        break;
      case 4:
        std::fill(row, row + cols, 0.0123f);
        break;
      default:
        break;
    }
  }
  return test::float_bytes(w, v);
}

struct SearchCase {
  const char* name;
  QuantArgs args;
  ObserverParams params;
  std::uint64_t cols;
};

std::vector<SearchCase> search_cases() {
  const auto mse = [](const char* observer, json kwargs = json::object()) {
    return observer_params(observer, kwargs, "test");
  };
  using T = QuantArgs::Type;
  return {
      {"int4_g128", args_for(T::kInt, 4, true, S::kGroup, 128), mse("memoryless_mse"), 384},
      {"int4_asym_g128", args_for(T::kInt, 4, false, S::kGroup, 128), mse("memoryless_mse"), 256},
      {"int8_g128", args_for(T::kInt, 8, true, S::kGroup, 128), mse("memoryless_mse"), 256},
      {"int4_g32", args_for(T::kInt, 4, true, S::kGroup, 32), mse("memoryless_mse"), 96},
      {"int4_g48", args_for(T::kInt, 4, true, S::kGroup, 48), mse("memoryless_mse"), 96},
      {"fp8_g128", args_for(T::kFloat, 8, true, S::kGroup, 128), mse("memoryless_mse"), 256},
      {"nvfp4_expanded", args_for(T::kFloat, 4, true, S::kTensorGroup, 16, DType::kF8_E4M3),
       mse("nvfp4_expanded_mse"), 64},
      {"mxfp4", args_for(T::kFloat, 4, true, S::kGroup, 32, DType::kU8), mse("memoryless_mse"),
       128},
      {"mxfp8", args_for(T::kFloat, 8, true, S::kGroup, 32, DType::kU8), mse("memoryless_mse"), 64},
      {"int4_kwargs", args_for(T::kInt, 4, true, S::kGroup, 64),
       mse("memoryless_mse", {{"maxshrink", 0.5}, {"grid", 40}, {"norm", 3.0}, {"expand", 1.2}}),
       128},
      {"int4_norm2", args_for(T::kInt, 4, true, S::kGroup, 32),
       mse("memoryless_mse", {{"norm", 2.0}}), 96},
      {"int4_norm2_2", args_for(T::kInt, 4, true, S::kGroup, 128),
       mse("memoryless_mse", {{"norm", 2.2}}), 256},
      {"int4_g128_wide", args_for(T::kInt, 4, true, S::kGroup, 128), mse("memoryless_mse"), 3072},
      {"int4_g1024", args_for(T::kInt, 4, true, S::kGroup, 1024), mse("memoryless_mse"), 2048},
      {"int4_g1008", args_for(T::kInt, 4, true, S::kGroup, 1008), mse("memoryless_mse"), 2016},
      {"int4_asym_g16", args_for(T::kInt, 4, false, S::kGroup, 16), mse("memoryless_mse"), 64},
      {"int2_g64", args_for(T::kInt, 2, true, S::kGroup, 64), mse("memoryless_mse"), 192},
      {"int3_asym_g32", args_for(T::kInt, 3, false, S::kGroup, 32), mse("memoryless_mse"), 96},
  };
}

TEST(MseObserver, VectorSearchEqualsTheReferenceBitForBitAtEveryLevel) {
  for (const SearchCase& c : search_cases()) {
    for (const DType w : {DType::kBF16, DType::kF16}) {
      const std::uint64_t rows = 13;
      const std::vector<std::byte> weight = adversarial_rows(w, rows, c.cols, 7);
      const std::uint64_t groups = observed_groups(c.args, rows, c.cols);
      const std::uint32_t steps = c.params.steps();
      for (const std::uint32_t cutoff : {steps - 1, steps / 3}) {
        ObserveIo io;
        io.dtype = w;
        io.n_rows = rows;
        io.n_cols = c.cols;
        io.weight = weight.data();
        std::vector<float> want(2 * groups);
        io.ranges = want.data();
        ImprovedSteps want_improved;
        observe_ranges_ref(c.args, c.params, cutoff, io, &want_improved);
        std::size_t levels_run = 0;
        for (const detail::SimdLevel& level : detail::simd_levels()) {
          std::vector<float> got(2 * groups, -1.0f);
          io.ranges = got.data();
          ImprovedSteps got_improved;
          if (!detail::observe_ranges_at(level, c.args, c.params, cutoff, io, &got_improved)) {
            continue;
          }
          ++levels_run;
          for (std::uint64_t k = 0; k < 2 * groups; ++k) {
            ASSERT_EQ(std::bit_cast<std::uint32_t>(got[k]), std::bit_cast<std::uint32_t>(want[k]))
                << c.name << " " << dtype_tag(w) << " " << level.name << " cutoff " << cutoff
                << " group " << k / 2;
          }
          EXPECT_EQ(got_improved, want_improved) << c.name << " " << level.name;
        }
        if (levels_run == 0) std::cout << c.name << ": no vector level on this CPU\n";
      }
    }
  }
}

// At AVX-512 the search takes BF16 |x|^norm from tables in registers; the
// path is used only after it gave pow_table's value for every finite BF16
// magnitude it does not flag (pow_reg_check_at). It is used for every norm
// whose BF16 value has at most 5 fraction bits (2.4 rounds to 77/32), and
// it flags few magnitudes (under 128 of 32,640) besides those it leaves to
// the table by range: x below max(2^-126, 2^ceil(-124/e)) or above
// 2^floor(125/e), at most three binades (384 magnitudes) on each side
// beyond those whose power is not a normal float.
TEST(MseObserver, RegisterPowEqualsTheTableOnEveryBf16Magnitude) {
  std::size_t levels = 0;
  for (const detail::SimdLevel& level : detail::simd_levels()) {
    if (std::string(level.name) != "avx512" || !level.supported) continue;
    ++levels;
    for (const double norm : {2.4, 2.5, 1.5, 0.5, 4.0, 3.03125}) {
      const detail::PowRegCheck c = detail::pow_reg_check_at(level, norm);
      EXPECT_TRUE(c.used) << norm;
      const double e = round_to_dtype(DType::kBF16, static_cast<float>(norm));
      const double lo = std::max(0x1p-126, std::exp2(std::ceil(-124.0 / e)));
      const double hi = std::min(0x1p127, std::exp2(std::floor(125.0 / e)));
      std::uint32_t by_range = 0;
      std::uint32_t not_normal = 0;
      for (std::uint32_t b = 1; b < 0x7F80u; ++b) {
        const double x = bf16_to_float(static_cast<std::uint16_t>(b));
        const double y = std::pow(x, e);
        if (x < lo || x > hi) ++by_range;
        if (x < 0x1p-126 || y < 0x1p-126 || y >= 0x1p127) ++not_normal;
      }
      EXPECT_LE(by_range, not_normal + 2 * 384) << norm;
      EXPECT_LE(c.flagged, by_range + 128) << norm;
    }
    // More fraction bits (2.2 rounds to 141/64): no register tables, the
    // search gathers from pow_table.
    for (const double norm : {2.2, 1.7, 0.003}) {
      EXPECT_FALSE(detail::pow_reg_check_at(level, norm).used) << norm;
    }
  }
  if (levels == 0) GTEST_SKIP() << "no AVX-512 on this CPU";
}

// Every family's fast kernel with observer ranges gives the reference's
// bytes (int-packed has a vector path of its own for them).
TEST(MseObserver, FamiliesTakeObserverRangesInBothKernels) {
  for (const SearchCase& c : search_cases()) {
    const QuantArgs& args = c.args;
    const SchemeFamily* family = family_for(args, false);
    ASSERT_NE(family, nullptr) << c.name;
    if (!family->supports(args).empty()) continue;  // e.g. FP8 groups of 128
    for (const DType w : {DType::kBF16, DType::kF16, DType::kF32}) {
      const std::uint64_t rows = 16;
      const std::vector<std::byte> weight = adversarial_rows(w, rows, c.cols, 11);
      std::vector<float> ranges(2 * observed_groups(args, rows, c.cols));
      ObserveIo oio{w, rows, c.cols, weight.data(), ranges.data()};
      observe_ranges(args, c.params, c.params.steps() - 1, oio, nullptr);
      const std::vector<OutputTensorSpec> specs = family->outputs(args, w, rows, c.cols);
      std::array<std::vector<std::byte>, 2> outs[2];
      for (int k = 0; k < 2; ++k) {
        KernelIo io;
        io.dtype = w;
        io.n_rows = rows;
        io.n_cols = c.cols;
        io.weight = weight.data();
        io.tensor_amax = 0.5f;
        io.ranges = ranges.data();
        std::vector<std::byte> scratch(family->scratch_bytes(args, rows, c.cols));
        io.scratch = scratch;
        std::size_t o = 0;
        std::vector<std::vector<std::byte>> buffers;
        for (const OutputTensorSpec& spec : specs) {
          if (spec.fill != OutputTensorSpec::Fill::kRows) continue;
          buffers.emplace_back(spec.bytes_before(rows), std::byte{0x5A});
        }
        for (auto& b : buffers) io.out[o++] = b.data();
        const KernelFn fn = k == 0 ? family->quantize_ref : family->quantize;
        ASSERT_FALSE(fn(args, io).has_value()) << c.name;
        outs[k][0] = buffers.size() > 0 ? buffers[0] : std::vector<std::byte>{};
        outs[k][1] = buffers.size() > 1 ? buffers[1] : std::vector<std::byte>{};
      }
      EXPECT_EQ(outs[0][0], outs[1][0]) << c.name << " " << dtype_tag(w) << " codes";
      EXPECT_EQ(outs[0][1], outs[1][1]) << c.name << " " << dtype_tag(w) << " scales";
    }
  }
}

TEST(MseObserver, SearchShrinksAnOutlierGroupsRange) {
  // One group of 128: small values and one outlier. Min-max keeps the
  // outlier exact and rounds the rest coarsely; the search gives up some of
  // the outlier's range for the other 127 values.
  std::vector<float> v(128);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  v[5] = 0.3f;
  const std::vector<std::byte> bytes = test::float_bytes(DType::kBF16, v);
  const QuantArgs args = args_for(QuantArgs::Type::kInt, 4, true, S::kGroup, 128);
  const ObserverParams params = observer_params("memoryless_mse", json::object(), "test");
  std::vector<float> ranges(2);
  ObserveIo io{DType::kBF16, 1, 128, bytes.data(), ranges.data()};
  observe_ranges_ref(args, params, params.steps() - 1, io, nullptr);
  EXPECT_LT(ranges[1], round_to_dtype(DType::kBF16, 0.3f));
  EXPECT_GT(ranges[1], 0.8f * 0.3f);
  // The same factor shrinks the negative end.
  EXPECT_LT(ranges[0], 0.0f);
  EXPECT_GT(ranges[0], round_to_dtype(DType::kBF16, -0.03f));
}

ImprovedSteps bits(std::initializer_list<int> set) {
  ImprovedSteps s(2, 0);
  for (const int i : set) s[static_cast<std::size_t>(i) / 64] |= std::uint64_t{1} << (i % 64);
  return s;
}

TEST(MseObserver, SearchStopsAfterPatienceCandidatesThatImproveNoGroup) {
  const ObserverParams p = observer_params("memoryless_mse", json::object(), "test");  // 20, 5
  EXPECT_EQ(p.steps(), 20u);
  EXPECT_EQ(mse_cutoff(p, bits({0, 1, 2})), 7u);  // 3..7 improve nothing: stop at 7
  EXPECT_EQ(mse_cutoff(p, bits({0, 1, 2, 7, 12, 17})), 19u);
  EXPECT_EQ(mse_cutoff(p, bits({0, 6, 12})), 5u);  // 1..5
  EXPECT_EQ(mse_cutoff(p, bits({0, 3, 8})), 13u);  // 9..13
  EXPECT_FALSE(mse_cutoff_settled(p, bits({0, 6, 12})));
  EXPECT_TRUE(mse_cutoff_settled(p, bits({0, 4, 9, 14, 19})));
  EXPECT_FALSE(mse_cutoff_settled(p, bits({0, 4, 9, 14})));  // 15..19
  const ObserverParams expanded = observer_params("nvfp4_expanded_mse", json::object(), "test");
  EXPECT_EQ(expanded.steps(), 111u);              // int((1 - 0.8 / 1.8) * 200)
  EXPECT_TRUE(mse_cutoff_settled(expanded, {}));  // patience 1000: never stops early
}

TEST(ObserverNames, MseRunsAsMemorylessMseAndSaysSo) {
  take_observer_notes();
  const ObserverChoice c = resolve_observer("mse", "here");
  EXPECT_EQ(c.written, "memoryless_mse");
  expect_message(c.note, {"here", "static_mse", "memoryless_mse"});
  EXPECT_EQ(resolve_observer("static_mse", "x").written, "memoryless_mse");
  EXPECT_EQ(resolve_observer("minmax", "x").written, "static_minmax");
  EXPECT_EQ(resolve_observer("memoryless_minmax", "x").note, "");
  json w = {{"num_bits", 4}, {"type", "int"}, {"group_size", 128}, {"observer", "mse"}};
  EXPECT_EQ(quant_args_from_json(w, "w").observer, "memoryless_mse");
  const std::vector<std::string> notes = take_observer_notes();
  ASSERT_EQ(notes.size(), 1u);
  expect_message(notes[0], {"w.observer", "memoryless_mse"});
}

TEST(ObserverNames, ImatrixMseIsRefusedAsNeedingCalibrationData) {
  expect_message(usage_message([] { resolve_observer("imatrix_mse", "w.observer"); }),
                 {"w.observer", "imatrix_mse", "calibration data"});
  expect_message(usage_message([] { resolve_observer("histogram", "w.observer"); }),
                 {"histogram", "memoryless_mse", "nvfp4_expanded_mse"});
}

TEST(ObserverKwargs, BadKwargsAreRefusedNamingTheKey) {
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"maxshrnk", 0.2}}, "g");
                 }),
                 {"g", "maxshrnk", "maxshrink"});
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"expand", 0.9}}, "g");
                 }),
                 {"expand", "at least 1.0"});
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"norm", 0}}, "g");
                 }),
                 {"norm"});
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"patience", 1.5}}, "g");
                 }),
                 {"patience", "whole number"});
  expect_message(usage_message([] {
                   observer_params("memoryless_minmax", {{"norm", 2}}, "g");
                 }),
                 {"memoryless_minmax takes none"});
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"grid", 1e6}, {"maxshrink", 0.5}}, "g");
                 }),
                 {"500000 candidates"});
  const ObserverParams p =
      observer_params("nvfp4_expanded_mse", {{"patience", 3}, {"grid", 50}}, "g");
  EXPECT_EQ(p.patience, 3);
  EXPECT_EQ(p.grid, 50.0);
  EXPECT_EQ(p.expand, 1.8);
}

// A search with no candidates (int(maxshrink * grid) <= 0) keeps the
// min-max ranges, as the library's loop does; ctquant says so.
TEST(ObserverKwargs, NoCandidatesSaysEveryGroupKeepsItsMinMaxRange) {
  take_observer_notes();
  for (const json& kwargs : {json{{"grid", -5}}, json{{"maxshrink", 0}}, json{{"grid", 2.5}}}) {
    const ObserverParams p = observer_params("memoryless_mse", kwargs, "test");
    EXPECT_EQ(p.steps(), 0u) << kwargs.dump();
    const std::vector<std::string> notes = take_observer_notes();
    ASSERT_EQ(notes.size(), 1u) << kwargs.dump();
    EXPECT_NE(notes[0].find("no candidates"), std::string::npos) << notes[0];
    EXPECT_NE(notes[0].find("keeps its min-max range"), std::string::npos) << notes[0];
  }
  observer_params("memoryless_mse", json{{"grid", 40}}, "test");
  EXPECT_TRUE(take_observer_notes().empty());
}

// The search multiplies ranges by the kwargs in float32: a kwarg beyond
// float32 (1e39, 1e300) would be an infinity there, and an infinite
// expand makes every scale inf (and NVFP4's global scale 0).
TEST(ObserverKwargs, NonFiniteAsFloat32IsRefusedNamingTheKwarg) {
  for (const char* key :
       {"maxshrink", "grid", "norm", "expand", "chunk_size", "averaging_constant"}) {
    for (const double v : {1e39, -1e39, 1e300, 3.5e38}) {
      SCOPED_TRACE(std::string(key) + " " + std::to_string(v));
      expect_message(
          usage_message([&] {
            observer_params("memoryless_mse", {{key, v}}, "g");
          }),
          {"g: observer_kwargs." + std::string(key), "not finite as a float32", "3.40282"});
    }
  }
  // A whole number beyond long long never stops the search early (it once
  // wrapped to a negative patience, which stops it at once).
  EXPECT_EQ(
      observer_params("memoryless_mse", json::parse(R"({"patience": 18446744073709551615})"), "g")
          .patience,
      std::numeric_limits<long long>::max());
  // float32's largest is finite: accepted (it is within the type; an
  // overflow it causes in a range is the run's to refuse, per group).
  EXPECT_EQ(observer_params("memoryless_mse", {{"expand", 3.4028234663852886e38}}, "g").expand,
            3.4028234663852886e38);
}

TEST(ObserverCli, InfNanAnd1e39KwargsAreRefusedNamingTheKwarg) {
  TempDir tmp;
  const std::string in = (test::golden_dir() / "llama-bf16" / "input").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"expand=inf", "observer_kwargs.expand inf is not finite"},
      {"norm=nan", "observer_kwargs.norm nan is not finite"},
      {"grid=-Infinity", "observer_kwargs.grid -Infinity is not finite"},
      {"maxshrink=1e39", "observer_kwargs.maxshrink 1e+39 is not finite as a float32"},
  };
  for (const auto& [kwarg, message] : cases) {
    SCOPED_TRACE(kwarg);
    const test::CommandResult r =
        test::run_ctquant({"quantize", in, (tmp / "out").string(), "--observer", "memoryless_mse",
                           "--observer-kwarg", kwarg});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, {message});
    EXPECT_FALSE(std::filesystem::exists(tmp / "out"));
  }
  // patience takes whole numbers only.
  const test::CommandResult r =
      test::run_ctquant({"quantize", in, (tmp / "out").string(), "--observer", "memoryless_mse",
                         "--observer-kwarg", "patience=1e39"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"observer_kwargs.patience 1e+39 is not a whole number"});
  // A kwarg given twice is refused, not resolved silently to the last value.
  const test::CommandResult twice =
      test::run_ctquant({"quantize", in, (tmp / "out").string(), "--observer", "memoryless_mse",
                         "--observer-kwarg", "grid=20", "--observer-kwarg", "grid=30"});
  EXPECT_EQ(twice.exit_code, 2) << twice.err;
  expect_message(twice.err, {"--observer-kwarg 'grid=30': grid is given twice"});
  EXPECT_FALSE(std::filesystem::exists(tmp / "out"));
}

// int(maxshrink * grid) is counted in double before any conversion: 1e23 *
// 0.2 once overflowed the conversion to 32 bits, passed the 1,024-candidate
// cap and printed "no candidates".
TEST(ObserverKwargs, CandidateCapCannotBeBypassedByAConversionOverflow) {
  take_observer_notes();
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"grid", 1e23}}, "g");
                 }),
                 {"int(maxshrink * grid) = int(0.2 * 1e+23) = 2e+22 candidates", "at most 1024"},
                 {"no candidates"});
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"grid", 2e10}}, "g");
                 }),
                 {"int(0.2 * 20000000000) = 4000000000 candidates", "at most 1024"});
  expect_message(usage_message([] {
                   observer_params("memoryless_mse", {{"maxshrink", 1e308}}, "g");
                 }),
                 {"observer_kwargs.maxshrink 1e+308 is not finite as a float32"});
  expect_message(
      usage_message([] {
        observer_params("nvfp4_expanded_mse", {{"maxshrink", 3e38}, {"grid", 3e38}}, "g");
      }),
      {"int(maxshrink * grid) = int(3e+38 * 3e+38)", "at most 1024"});
  EXPECT_TRUE(take_observer_notes().empty());
  EXPECT_EQ(observer_params("memoryless_mse", {{"grid", 5120}}, "g").steps(), 1024u);
  // steps() saturates rather than converting out of range.
  ObserverParams p;
  p.grid = 1e23;
  EXPECT_EQ(p.steps(), std::numeric_limits<std::uint32_t>::max());
  p.grid = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(p.steps(), 0u);
}

TEST(ObserverKwargs, SearchOverTenTimesTheDefaultCostIsWarnedWithTheEstimate) {
  EXPECT_EQ(observer_params("memoryless_mse", json::object(), "g").steps(), kMemorylessMseSteps);
  EXPECT_EQ(observer_params("nvfp4_expanded_mse", json::object(), "g").steps(), kExpandedMseSteps);
  take_observer_warnings();
  observer_params("memoryless_mse", {{"grid", 1000}}, "g");  // 200 = 10x: no warning
  EXPECT_TRUE(take_observer_warnings().empty());
  observer_params("memoryless_mse", {{"grid", 1000}, {"maxshrink", 0.5}}, "g");
  std::vector<std::string> w = take_observer_warnings();
  ASSERT_EQ(w.size(), 1u);
  expect_message(w[0], {"g: observer_kwargs make memoryless_mse search up to 500 candidates",
                        "int(0.5 * 1000)), 25.0x the 20 of its default kwargs",
                        "expect the search to take about 25.0x as long"});
  // nvfp4_expanded_mse's default is 111: 1024, the cap, is 9.2x.
  observer_params("nvfp4_expanded_mse", {{"grid", 1024}, {"maxshrink", 1}}, "g");
  EXPECT_TRUE(take_observer_warnings().empty());
}

// expand=1000 exited 0 with every weight rounded to 0, expand=10 with a
// weight error of 0.81, both without a word.
TEST(ObserverKwargs, CandidateRangesWiderThanTwiceTheMinMaxRangeAreWarnedNamingExpand) {
  take_observer_warnings();
  observer_params("memoryless_mse", json::object(), "g");
  observer_params("nvfp4_expanded_mse", json::object(), "g");  // narrowest 1.8 * 0.45
  observer_params("memoryless_mse", {{"expand", 2.4}}, "g");   // narrowest 2.4 * 0.81
  EXPECT_TRUE(take_observer_warnings().empty());
  observer_params("memoryless_mse", {{"expand", 10}}, "--observer-kwarg");
  std::vector<std::string> w = take_observer_warnings();
  ASSERT_EQ(w.size(), 1u);
  expect_message(w[0], {"--observer-kwarg: observer_kwargs make every candidate range of "
                        "memoryless_mse at least 8.1x the weights' min-max range",
                        "give observer_kwargs.expand at most 2.47 (its default for "
                        "memoryless_mse is 1)"});
  observer_params("nvfp4_expanded_mse", {{"expand", 3.4e38}}, "g");
  w = take_observer_warnings();
  ASSERT_EQ(w.size(), 1u);
  expect_message(w[0], {"every candidate range of nvfp4_expanded_mse",
                        "(its default for "
                        "nvfp4_expanded_mse is 1.8)"});
  // No candidates: the expanded range itself is kept.
  observer_params("memoryless_mse", {{"expand", 5}, {"grid", 1}}, "g");
  EXPECT_EQ(take_observer_warnings().size(), 1u);
}

TEST(ObserverRows, PerTensorScalesRefuseMseObservers) {
  json w = {
      {"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"observer", "memoryless_mse"}};
  SchemeGroup g;
  g.weights = quant_args_from_json(w, "w");
  ASSERT_NE(g.family(), nullptr);
  expect_message(g.family()->supports(g.weights), {"one scale per tensor", "thread count"});
  g.weights.observer = "memoryless_minmax";
  EXPECT_EQ(g.family()->supports(g.weights), "");
}

// ---- the command line ----

// Every tensor of the expected single-file checkpoint has the same bytes
// in actual (names from the expected header); "" when they all do.
std::string diff_tensors(const std::filesystem::path& actual,
                         const std::filesystem::path& expected) {
  const std::string bytes = test::read_file(expected);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  std::size_t compared = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (test::read_tensor(actual, name) != test::read_tensor(expected, name)) return name;
    ++compared;
  }
  return compared > 0 ? "" : "no tensor compared";
}

std::vector<std::string> llama_ignores() {
  return {"--no-default-ignore", "--ignore", "lm_head", "--ignore", "model.embed_tokens"};
}

TEST(ObserverCli, ObserverMseWritesMemorylessMseAndSaysSo) {
  TempDir tmp;
  std::vector<std::string> args = {"quantize",
                                   (test::golden_dir() / "llama-bf16" / "input").string(),
                                   (tmp / "out").string(), "--observer", "mse"};
  for (const std::string& a : llama_ignores()) args.push_back(a);
  const test::CommandResult r = test::run_ctquant(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"info", "observer \"mse\" runs as memoryless_mse"});
  const json qc = test::read_json(tmp / "out" / "config.json").at("quantization_config");
  EXPECT_EQ(qc.at("config_groups").at("W4A16").at("weights").at("observer"), "memoryless_mse");
  // The same tensors as the library's memoryless_mse run of this input.
  EXPECT_EQ(diff_tensors(tmp / "out" / "model.safetensors",
                         test::golden_dir() / "llama-bf16-mse" / "expected" / "model.safetensors"),
            "");
}

TEST(ObserverCli, ImatrixObserverIsAUsageError) {
  TempDir tmp;
  const test::CommandResult r =
      test::run_ctquant({"quantize", (test::golden_dir() / "llama-bf16" / "input").string(),
                         (tmp / "out").string(), "--observer", "imatrix_mse"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"--observer", "imatrix_mse", "calibration data"});
  EXPECT_FALSE(std::filesystem::exists(tmp / "out"));
}

TEST(ObserverCli, ObserverKwargNeedsANumberAndAnObserver) {
  TempDir tmp;
  const std::string in = (test::golden_dir() / "llama-bf16" / "input").string();
  test::CommandResult r =
      test::run_ctquant({"quantize", in, (tmp / "a").string(), "--observer-kwarg", "norm=2"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"--observer-kwarg needs --observer"});
  r = test::run_ctquant({"quantize", in, (tmp / "b").string(), "--observer", "memoryless_mse",
                         "--observer-kwarg", "norm=two"});
  EXPECT_EQ(r.exit_code, 2);
  // A word is taken as a string kwarg (refit's weight=x2); norm must be a number.
  expect_message(r.err, {"observer_kwargs.norm \"two\" is not a number"});
  r = test::run_ctquant({"quantize", in, (tmp / "c").string(), "--observer", "memoryless_mse",
                         "--observer-kwarg", "norm=2..4"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"norm=2..4", "VALUE must be a number"});
}

TEST(ObserverCli, ObserverKwargsReachConfigAndBytes) {
  // The fixture's kwargs given on the command line give its bytes.
  TempDir tmp;
  std::vector<std::string> args = {
      "quantize",
      (test::golden_dir() / "llama-bf16-mse-kwargs" / "input").string(),
      (tmp / "out").string(),
      "--observer",
      "memoryless_mse",
      "--observer-kwarg",
      "maxshrink=0.3",
      "--observer-kwarg",
      "grid=60",
      "--observer-kwarg",
      "norm=2.2",
      "--observer-kwarg",
      "patience=2"};
  for (const std::string& a : llama_ignores()) args.push_back(a);
  const test::CommandResult r = test::run_ctquant(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json w = test::read_json(tmp / "out" / "config.json")
                     .at("quantization_config")
                     .at("config_groups")
                     .at("W4A16")
                     .at("weights");
  EXPECT_EQ(w.at("observer_kwargs"),
            json({{"maxshrink", 0.3}, {"grid", 60}, {"norm", 2.2}, {"patience", 2}}));
  EXPECT_EQ(
      diff_tensors(tmp / "out" / "model.safetensors",
                   test::golden_dir() / "llama-bf16-mse-kwargs" / "expected" / "model.safetensors"),
      "");
}

TEST(ObserverCli, SchemeForTakesAnObserverPerGroup) {
  TempDir tmp;
  std::vector<std::string> args = {"quantize",
                                   (test::golden_dir() / "llama-bf16" / "input").string(),
                                   (tmp / "out").string(),
                                   "--scheme-for",
                                   "re:.*mlp.*=W4A16@memoryless_mse",
                                   "--scheme",
                                   "W4A16"};
  for (const std::string& a : llama_ignores()) args.push_back(a);
  const test::CommandResult r = test::run_ctquant(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json groups =
      test::read_json(tmp / "out" / "config.json").at("quantization_config").at("config_groups");
  EXPECT_EQ(groups.at("W4A16_memoryless_mse").at("weights").at("observer"), "memoryless_mse");
  EXPECT_EQ(groups.at("W4A16").at("weights").at("observer"), "memoryless_minmax");
  const auto out = tmp / "out" / "model.safetensors";
  const auto mse = test::golden_dir() / "llama-bf16-mse" / "expected" / "model.safetensors";
  const auto minmax = test::golden_dir() / "llama-bf16" / "expected" / "model.safetensors";
  for (const char* t : {"model.layers.0.mlp.down_proj.weight_packed",
                        "model.layers.0.mlp.down_proj.weight_scale"}) {
    EXPECT_EQ(test::read_tensor(out, t), test::read_tensor(mse, t)) << t;
  }
  for (const char* t : {"model.layers.0.self_attn.q_proj.weight_packed",
                        "model.layers.0.self_attn.q_proj.weight_scale"}) {
    EXPECT_EQ(test::read_tensor(out, t), test::read_tensor(minmax, t)) << t;
  }
}

// A group's own @OBSERVER is the more specific choice: --observer names the
// observer of the other groups only. --observer auto, which chooses every
// module's observer, refuses it; so is an '@' naming nothing, and a bad
// pattern is named by --scheme-for.
TEST(ObserverCli, SchemeForObserverWinsOverObserverOption) {
  TempDir tmp;
  const std::string input = (test::golden_dir() / "llama-bf16" / "input").string();
  std::vector<std::string> args = {"quantize",
                                   input,
                                   (tmp / "out").string(),
                                   "--scheme-for",
                                   "re:.*mlp.*=W4A16@memoryless_mse",
                                   "--observer",
                                   "memoryless_minmax"};
  for (const std::string& a : llama_ignores()) args.push_back(a);
  const test::CommandResult r = test::run_ctquant(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json groups =
      test::read_json(tmp / "out" / "config.json").at("quantization_config").at("config_groups");
  EXPECT_EQ(groups.at("W4A16_memoryless_mse").at("weights").at("observer"), "memoryless_mse");
  EXPECT_EQ(groups.at("W4A16").at("weights").at("observer"), "memoryless_minmax");
  const auto out = tmp / "out" / "model.safetensors";
  const auto mse = test::golden_dir() / "llama-bf16-mse" / "expected" / "model.safetensors";
  EXPECT_EQ(test::read_tensor(out, "model.layers.0.mlp.down_proj.weight_scale"),
            test::read_tensor(mse, "model.layers.0.mlp.down_proj.weight_scale"));

  const auto refused = [&](std::vector<std::string> extra, const std::string& message) {
    std::vector<std::string> a = {"quantize", input, (tmp / "refused").string()};
    a.insert(a.end(), extra.begin(), extra.end());
    const test::CommandResult e = test::run_ctquant(a);
    EXPECT_EQ(e.exit_code, 2) << e.err;
    EXPECT_NE(e.err.find(message), std::string::npos) << e.err;
    EXPECT_FALSE(std::filesystem::exists(tmp / "refused"));
  };
  refused({"--scheme-for", "re:.*mlp.*=W4A16@memoryless_mse", "--observer", "auto"},
          "--observer auto chooses every module's observer, and --scheme-for group "
          "W4A16_memoryless_mse names one");
  refused({"--scheme-for", "re:.*mlp.*=W8A16@"},
          "--scheme-for 're:.*mlp.*=W8A16@': '@' names no "
          "observer");
  refused({"--scheme-for", "re:(=W8A16"},
          "--scheme-for 're:(': invalid regular expression at offset 1");
}

TEST(ObserverCli, ProgressCountsEachTensorOnceBesideTheCutoffPrePass) {
  TempDir tmp;
  QuantizeOptions options =
      test::test_options(test::golden_dir() / "llama-bf16" / "input", tmp / "out");
  for (SchemeGroup& g : options.plan.groups) g.weights.observer = "memoryless_mse";
  Progress last;
  options.on_progress = [&](const Progress& p) { last = p; };
  const QuantizeSummary s = quantize(options);
  EXPECT_EQ(s.execute.module_errors.size(), s.plan.n_quantized);
  EXPECT_EQ(last.tensors_done, last.tensors_total);
  EXPECT_EQ(last.bytes_done, last.bytes_total);
}

TEST(ObserverCli, RecipeWeightObserverAppliesToEveryGroup) {
  const RecipeSpec spec = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: NVFP4A16\n"
      "      weight_observer: nvfp4_expanded_mse\n",
      "r.yaml");
  const EffectiveRecipe r = resolve_recipe(&spec, {});
  const PlanOptions options = plan_options_for(r);
  ASSERT_EQ(options.groups.size(), 1u);
  EXPECT_EQ(options.groups[0].weights.observer, "nvfp4_expanded_mse");
  CommandLinePlan cli;
  cli.observer = "memoryless_minmax";
  EXPECT_EQ(plan_options_for(resolve_recipe(&spec, cli)).groups[0].weights.observer,
            "memoryless_minmax");
}

TEST(ObserverCli, ExpandOf1e300IsRefusedBeforeAnythingIsWritten) {
  TempDir tmp;
  std::vector<std::string> args = {"quantize",
                                   (test::golden_dir() / "llama-bf16" / "input").string(),
                                   (tmp / "out").string(),
                                   "--observer",
                                   "memoryless_mse",
                                   "--observer-kwarg",
                                   "expand=1e300"};
  for (const std::string& a : llama_ignores()) args.push_back(a);
  const test::CommandResult r = test::run_ctquant(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"observer_kwargs.expand 1e+300 is not finite as a float32"});
  EXPECT_FALSE(std::filesystem::exists(tmp / "out"));
  EXPECT_TRUE(test::temp_leftovers(tmp.path()).empty());
}

TEST(ObserverCli, CostlySearchIsAWarningOnStderr) {
  TempDir tmp;
  std::vector<std::string> args = {"quantize",
                                   (test::golden_dir() / "llama-bf16" / "input").string(),
                                   (tmp / "out").string(),
                                   "--observer",
                                   "memoryless_mse",
                                   "--observer-kwarg",
                                   "grid=1000",
                                   "--observer-kwarg",
                                   "maxshrink=0.25",
                                   "--dry-run"};
  for (const std::string& a : llama_ignores()) args.push_back(a);
  const test::CommandResult r = test::run_ctquant(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"warning",
                         "--observer-kwarg: observer_kwargs make memoryless_mse "
                         "search up to 250 candidates",
                         "12.5x"});
}

}  // namespace
}  // namespace ctquant
