// Every computed scale and global scale is finite and non-zero
// (scheme/scale_check.hpp): the rule on every scale dtype; quantize refusing
// weights that break it (huge weights with an asymmetric scheme, MX, an
// observer's expand) naming the tensor and the group, with no OUTPUT left;
// verify --against-source reporting stored scales that break it (exit 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/scheme/scale_check.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "fake_checkpoint.hpp"
#include "test_support.hpp"
#include "verify_test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kModule = "model.layers.0.mlp.down_proj";
const json kConfig = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", 256},
                      {"torch_dtype", "bfloat16"}};

std::optional<std::uint64_t> bad_bf16(std::vector<std::uint16_t> bits) {
  return first_bad_scale(DType::kBF16, std::as_bytes(std::span(bits)));
}
std::optional<std::uint64_t> bad_bytes(DType dtype, std::vector<std::uint8_t> bytes) {
  return first_bad_scale(dtype, std::as_bytes(std::span(bytes)));
}

TEST(ScaleRule, FirstBadScaleFindsZeroInfinityAndNanInEveryScaleDtype) {
  EXPECT_EQ(bad_bf16({0x3F80, 0x0001, 0x7F7F}), std::nullopt);  // 1, a subnormal, the largest
  EXPECT_EQ(bad_bf16({0x3F80, 0x7F80}), 1u);                    // inf
  EXPECT_EQ(bad_bf16({0x3F80, 0x3F80, 0xFF80}), 2u);            // -inf
  EXPECT_EQ(bad_bf16({0x7FC1}), 0u);                            // nan
  EXPECT_EQ(bad_bf16({0x3F80, 0x8000}), 1u);                    // -0
  // Past the first block of 256 elements.
  std::vector<std::uint16_t> many(1000, 0x3C00);
  many[700] = 0;
  EXPECT_EQ(bad_bf16(many), 700u);
  std::vector<std::uint16_t> f16 = {0x3C00, 0x7C00};
  EXPECT_EQ(first_bad_scale(DType::kF16, std::as_bytes(std::span(f16))), 1u);
  std::vector<float> f32 = {1.0f, 0x1p-149f, 0.0f};
  EXPECT_EQ(first_bad_scale(DType::kF32, std::as_bytes(std::span(f32))), 2u);
  f32 = {std::numeric_limits<float>::max(), std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(first_bad_scale(DType::kF32, std::as_bytes(std::span(f32))), 1u);
  // E4M3FN: no infinity; 0x7E (448) is fine, 0x7F NaN, 0x80 -0.
  EXPECT_EQ(bad_bytes(DType::kF8_E4M3, {0x20, 0x7E, 0x01}), std::nullopt);
  EXPECT_EQ(bad_bytes(DType::kF8_E4M3, {0x20, 0x7F}), 1u);
  EXPECT_EQ(bad_bytes(DType::kF8_E4M3, {0x80}), 0u);
  // E8M0 (MX): 0x00 is 2^-127, 0xFF is NaN.
  EXPECT_EQ(bad_bytes(DType::kU8, {0x00, 0xFE}), std::nullopt);
  EXPECT_EQ(bad_bytes(DType::kU8, {0x7F, 0xFF}), 1u);
  // Codes and zero points are not scales.
  EXPECT_EQ(bad_bytes(DType::kI8, {0, 0}), std::nullopt);
  const std::byte e8m0_nan{0xFF};
  EXPECT_EQ(scale_value_text(DType::kU8, &e8m0_nan), "0xFF (NaN in E8M0)");
}

// Every code of the 8- and 16-bit scale dtypes, alone and at the end of a
// run of good scales: the rule is the value's (finite and non-zero).
TEST(ScaleRule, FirstBadScaleAgreesWithTheValueOnEveryCode) {
  const auto check = [](DType dtype, std::uint32_t code, bool bad) {
    const std::size_t size = static_cast<std::size_t>(dtype_bits(dtype) / 8);
    std::vector<std::byte> one(size);
    std::memcpy(one.data(), &code, size);
    EXPECT_EQ(first_bad_scale(dtype, one).has_value(), bad) << dtype_tag(dtype) << " " << code;
    std::vector<std::byte> run(40 * size, std::byte{0x38});  // 0x3838 / 0x38: finite, non-zero
    std::memcpy(run.data() + 39 * size, &code, size);
    EXPECT_EQ(first_bad_scale(dtype, run), bad ? std::optional<std::uint64_t>(39) : std::nullopt)
        << dtype_tag(dtype) << " " << code;
  };
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const float bf16 = bf16_to_float(static_cast<std::uint16_t>(c));
    const float f16 = f16_to_float(static_cast<std::uint16_t>(c));
    check(DType::kBF16, c, !std::isfinite(bf16) || bf16 == 0.0f);
    check(DType::kF16, c, !std::isfinite(f16) || f16 == 0.0f);
  }
  for (std::uint32_t c = 0; c < 0x100; ++c) {
    const float e4m3 = f8_e4m3_to_float(static_cast<std::uint8_t>(c));
    check(DType::kF8_E4M3, c, !std::isfinite(e4m3) || e4m3 == 0.0f);
    check(DType::kU8, c, c == 0xFF);  // E8M0: 2^(c - 127), NaN at 0xFF
  }
  for (const float v : {1.0f, -2.0f, 0x1p-149f, std::numeric_limits<float>::max()}) {
    check(DType::kF32, std::bit_cast<std::uint32_t>(v), false);
  }
  for (const float v :
       {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    check(DType::kF32, std::bit_cast<std::uint32_t>(v), true);
  }
}

// A checkpoint of one BF16 weight [64, 256] (seeded normal values) with the
// given elements replaced.
void write_weight(const fs::path& dir,
                  const std::vector<std::pair<std::pair<int, int>, float>>& set,
                  DType dtype = DType::kBF16) {
  FakeTensor w = random_weight(std::string(kModule) + ".weight", dtype, 64, 256, 3);
  for (const auto& [at, value] : set) {
    const std::vector<std::byte> b = float_bytes(dtype, {value});
    std::memcpy(w.data.data() + (at.first * 256 + at.second) * b.size(), b.data(), b.size());
  }
  write_checkpoint(dir, {w}, kConfig);
}

struct Refusal {
  std::string library;  // the library's message
  std::string binary;   // the binary's stderr
};

// quantize() and the binary both refuse the run with Error{kBadInput} /
// exit 1, and leave no OUTPUT and no temporary directory.
Refusal refuse(const fs::path& input, const std::string& preset, const std::string& observer,
               const std::vector<std::pair<std::string, double>>& kwargs = {}) {
  Refusal r;
  const fs::path out = input.parent_path() / "out";
  QuantizeOptions options = test_options(input, out);
  options.plan.groups = {preset_group(preset)};
  options.plan.groups[0].weights.observer = observer;
  for (const auto& [k, v] : kwargs) options.plan.groups[0].weights.observer_kwargs[k] = v;
  try {
    quantize(options);
    ADD_FAILURE() << "quantize() accepted it";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    r.library = e.what();
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(temp_leftovers(input.parent_path()).empty());
  std::vector<std::string> args = {"quantize", input.string(), out.string(), "--scheme",
                                   preset,     "--observer",   observer};
  for (const auto& [k, v] : kwargs) {
    args.push_back("--observer-kwarg");
    args.push_back(fmt::format("{}={}", k, v));
  }
  const CommandResult c = run_ctquant(args);
  EXPECT_EQ(c.exit_code, 1) << c.err;
  r.binary = c.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(temp_leftovers(input.parent_path()).empty());
  return r;
}

// max - min = 6e38 overflows BF16: the library writes an infinite scale
// (and a zero point of -8); ctquant stops.
TEST(ScaleRule, HugeWeightsWithW4A16AsymStopTheRunNamingTensorAndGroup) {
  TempDir tmp;
  write_weight(tmp / "in", {{{3, 130}, 3e38f}, {{3, 200}, -3e38f}});
  const Refusal r = refuse(tmp / "in", "W4A16_ASYM", "memoryless_minmax");
  for (const std::string& m : {r.library, r.binary}) {
    expect_message(m, {"model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight': row 3, "
                       "group 1 (columns 128-255): scale is inf",
                       "'model.layers.0.mlp.down_proj.weight_scale' [3, 1]",
                       "its weights span [-3.0040553e+38, 3.0040553e+38]",
                       "every scale and global scale must be finite and non-zero",
                       "--ignore 'model.layers.0.mlp.down_proj'", "use a symmetric scheme"});
  }
}

// NVFP4's expanded search starts from max |w| * 1.8, past BF16 for 1.9e38:
// the group's range is inf, its scale would be NaN and the global scale 0.
TEST(ScaleRule, HugeWeightsWithNvfp4ExpandedMseStopTheRunNamingTensorAndGroup) {
  TempDir tmp;
  write_weight(tmp / "in", {{{5, 40}, 1.9e38f}});
  const Refusal r = refuse(tmp / "in", "NVFP4A16", "nvfp4_expanded_mse");
  for (const std::string& m : {r.library, r.binary}) {
    expect_message(m, {"tensor 'model.layers.0.mlp.down_proj.weight'",
                       "row 5, group 2 (columns 32-47): the observer's range",
                       "is not finite (nvfp4_expanded_mse searches from the group's range",
                       "times expand 1.8, in BF16)", "global scale 0",
                       "give the observer a smaller expand (now 1.8)"});
  }
}

// The same weights with min-max keep a finite global scale (2688 / 1.9e38)
// and finite group scales: nothing to refuse.
TEST(ScaleRule, HugeWeightsWithNvfp4MinMaxKeepFiniteScales) {
  TempDir tmp;
  write_weight(tmp / "in", {{{5, 40}, 1.9e38f}});
  QuantizeOptions options = test_options(tmp / "in", tmp / "out");
  options.plan.groups = {preset_group("NVFP4A16")};
  quantize(options);
  const std::vector<std::byte> gs =
      read_tensor(tmp / "out" / "model.safetensors", std::string(kModule) + ".weight_global_scale");
  float v = 0;
  std::memcpy(&v, gs.data(), 4);
  EXPECT_GT(v, 0.0f);
  EXPECT_TRUE(std::isfinite(v));
}

// The same weights near +-3e38 with W4A16_ASYM from F16's top: 40000 -
// (-40000) overflows F16 too.
TEST(ScaleRule, F16WeightsWhoseRangeOverflowsF16StopTheRun) {
  TempDir tmp;
  write_weight(tmp / "in", {{{0, 0}, 40000.0f}, {{0, 1}, -40000.0f}}, DType::kF16);
  const Refusal r = refuse(tmp / "in", "W4A16_ASYM", "memoryless_minmax");
  expect_message(r.library, {"row 0, group 0 (columns 0-127): scale is inf",
                             "its weights span [-40000, 40000]"});
}

// An MX group whose max |w| rounds up to 2^128 gets the E8M0 exponent 255
// (NaN; the library's stored byte is undefined there).
TEST(ScaleRule, MxGroupWhoseMaxRoundsUpToInfinityStopsTheRun) {
  TempDir tmp;
  write_weight(tmp / "in", {{{9, 70}, 3.3e38f}});
  const Refusal r = refuse(tmp / "in", "MXFP4A16", "memoryless_minmax");
  expect_message(r.library, {"row 9, group 2 (columns 64-95): scale is 0xFF (NaN in E8M0)",
                             "'model.layers.0.mlp.down_proj.weight_scale' [9, 2]"});
}

// An expand the kwargs accept (finite in float32) can still overflow a
// group's range: the run stops at that group.
TEST(ScaleRule, ExpandThatOverflowsAGroupsRangeStopsTheRunNamingTheGroup) {
  TempDir tmp;
  write_weight(tmp / "in", {{{7, 3}, 1e10f}});
  const Refusal r = refuse(tmp / "in", "W4A16", "memoryless_mse", {{"expand", 1e30}});
  for (const std::string& m : {r.library, r.binary}) {
    expect_message(
        m, {"row 7, group 0 (columns 0-127): the observer's range", "times expand 1e+30, in BF16)",
            "'model.layers.0.mlp.down_proj.weight_scale' "
            "would be inf",
            "smaller expand (now 1e+30)"});
  }
}

// ---- verify --against-source ----

// Sets bytes of a tensor in a safetensors file, in place.
void set_tensor_bytes(const fs::path& file, const std::string& tensor, std::uint64_t offset,
                      const std::vector<std::uint8_t>& bytes) {
  const std::vector<std::byte> now = read_tensor(file, tensor);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto mask =
        static_cast<std::uint8_t>(std::to_integer<std::uint8_t>(now[offset + i]) ^ bytes[i]);
    if (mask != 0) xor_tensor_byte(file, tensor, offset + i, mask);
  }
}

std::vector<VerifyItem> scale_findings(const VerifyReport& r) {
  return of_kind(r.differences, "scale");
}

// llama-bf16's down_proj has 384 columns: 3 groups a row. Its scale [3, 1]
// (element 10, BF16) patched to inf and to 0.
TEST(VerifyAgainstSource, StoredScaleOfInfOrZeroIsAFailureNamingTensorAndGroup) {
  for (const auto& [bits, text] : std::vector<std::pair<std::vector<std::uint8_t>, std::string>>{
           {{0x80, 0x7F}, "inf"}, {{0x00, 0x00}, "0"}, {{0xC0, 0xFF}, "nan"}}) {
    SCOPED_TRACE(text);
    GoldenCopy out("llama-bf16");
    set_tensor_bytes(out.path / "model.safetensors", std::string(kModule) + ".weight_scale", 20,
                     bits);
    const VerifyReport r = verify_against_source(out.path, golden("llama-bf16") / "input", {});
    EXPECT_FALSE(r.same());
    const std::vector<VerifyItem> s = scale_findings(r);
    ASSERT_EQ(s.size(), 1u) << describe(r);
    EXPECT_EQ(s[0].tensor, std::string(kModule) + ".weight_scale");
    expect_message(s[0].message,
                   {"1 of the scales of 'model.layers.0.mlp.down_proj.weight_scale' are not "
                    "finite and non-zero, first " +
                    text +
                    " [3, 1], for row 3, group 1 "
                    "(columns 128-255)"});
    EXPECT_EQ(s[0].details["first_row"], 3);
    EXPECT_EQ(s[0].details["first_group"], 1);
  }
}

TEST(VerifyAgainstSource, StoredGlobalScaleOfZeroIsAFailure) {
  GoldenCopy out("llama-bf16-nvfp4a16");
  const std::string name = "model.layers.0.self_attn.o_proj.weight_global_scale";
  set_tensor_bytes(out.path / "model.safetensors", name, 0, {0, 0, 0, 0});
  const VerifyReport r =
      verify_against_source(out.path, golden("llama-bf16-nvfp4a16") / "input", {});
  const std::vector<VerifyItem> s = scale_findings(r);
  const std::string rule = "'" + name + "' is 0: a global scale must be finite and non-zero";
  const auto it = std::find_if(s.begin(), s.end(),
                               [&](const VerifyItem& i) { return contains(i.message, rule); });
  ASSERT_NE(it, s.end()) << describe(r);
  EXPECT_EQ(it->tensor, name);
  EXPECT_FALSE(r.same());
  // Through the binary: exit 3, the tensor named.
  const CommandResult c =
      run_ctquant({"verify", out.path.string(), (golden("llama-bf16-nvfp4a16") / "input").string(),
                   "--against-source"});
  EXPECT_EQ(c.exit_code, 3) << c.err;
  expect_message(c.out, {name, "a global scale must be finite and non-zero"});
}

// An OUTPUT whose infinite scales are exactly what the source gives (as
// model_free_ptq writes them): recomputing agrees byte for byte, and verify
// still fails it.
TEST(VerifyAgainstSource, InfScalesTheSourceGivesAreStillAFailure) {
  TempDir tmp;
  write_weight(tmp / "huge", {{{3, 130}, 3e38f}, {{3, 200}, -3e38f}});
  write_weight(tmp / "tame", {});
  QuantizeOptions options = test_options(tmp / "tame", tmp / "out");
  options.plan.groups = {preset_group("W4A16_ASYM")};
  quantize(options);
  // The module's outputs replaced by what the kernel gives for the huge weights.
  const SchemeGroup g = preset_group("W4A16_ASYM");
  const FakeTensor w = [&] {
    const std::vector<std::byte> b =
        read_tensor(tmp / "huge" / "model.safetensors", std::string(kModule) + ".weight");
    return FakeTensor{"w", DType::kBF16, {64, 256}, b};
  }();
  const std::vector<OutputTensorSpec> specs = g.family()->outputs(g.weights, DType::kBF16, 64, 256);
  KernelIo io;
  io.dtype = DType::kBF16;
  io.n_rows = 64;
  io.n_cols = 256;
  io.weight = w.data.data();
  std::vector<std::vector<std::byte>> outs;
  for (const OutputTensorSpec& s : specs) {
    if (s.fill == OutputTensorSpec::Fill::kRows) outs.emplace_back(s.byte_size());
  }
  for (std::size_t i = 0; i < outs.size(); ++i) io.out[i] = outs[i].data();
  std::vector<std::byte> scratch(g.family()->scratch_bytes(g.weights, 64, 256));
  io.scratch = scratch;
  ASSERT_EQ(g.family()->quantize(g.weights, io), std::nullopt);
  std::size_t k = 0;
  for (const OutputTensorSpec& s : specs) {
    if (s.fill != OutputTensorSpec::Fill::kRows) continue;
    std::vector<std::uint8_t> bytes(outs[k].size());
    std::memcpy(bytes.data(), outs[k].data(), bytes.size());
    set_tensor_bytes(tmp / "out" / "model.safetensors", std::string(kModule) + "." + s.suffix, 0,
                     bytes);
    ++k;
  }
  const VerifyReport r = verify_against_source(tmp / "out", tmp / "huge", {});
  EXPECT_TRUE(of_kind(r.differences, "codes").empty()) << describe(r);
  const std::vector<VerifyItem> s = scale_findings(r);
  ASSERT_EQ(s.size(), 1u) << describe(r);
  expect_message(s[0].message, {"first inf [3, 1], for row 3, group 1 (columns 128-255)"});
  const CommandResult c =
      run_ctquant({"verify", (tmp / "out").string(), (tmp / "huge").string(), "--against-source"});
  EXPECT_EQ(c.exit_code, 3) << c.err;
}

// An OUTPUT whose config.json records an expand beyond float32 (as
// model_free_ptq writes it, with infinite scales) is refused, the kwarg
// named, rather than planned and found SAME.
TEST(VerifyAgainstSource, OutputConfigWithExpand1e300IsRefusedNamingTheKwarg) {
  GoldenCopy out("llama-bf16-mse");
  json config = read_json(out.path / "config.json");
  config["quantization_config"]["config_groups"]["config_group_0"]["weights"]["observer_kwargs"] = {
      {"expand", 1e300}};
  write_file(out.path / "config.json", config.dump(2));
  try {
    verify_against_source(out.path, golden("llama-bf16-mse") / "input", {});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    expect_message(e.what(), {"OUTPUT config.json",
                              "observer_kwargs.expand 1e+300 is not finite "
                              "as a float32"});
  }
}

}  // namespace
}  // namespace ctquant::test
