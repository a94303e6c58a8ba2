// Converters (source/converter.hpp, docs/converters.md): every case of
// tests/golden/converter_cases.json. A conversion or a mix is run through
// the library and the binary and must equal tests/golden/<case>/expected/
// tensor by tensor, config.json as JSON values; each refusal of
// tests/golden/converter-refusals/ exits 2 with a message naming the file,
// key or tensor and the rule, and writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json converter_cases() { return read_json(golden_dir() / "converter_cases.json"); }

json find_converter_case(const std::string& name) {
  for (const json& c : converter_cases()) {
    if (c["case"] == name) return c;
  }
  throw std::runtime_error("no converter case " + name);
}

std::vector<std::string> output_case_names() {
  std::vector<std::string> out;
  for (const json& c : converter_cases()) {
    if (c["kind"] == "conversion" || c["kind"] == "mixed") out.push_back(c["case"]);
  }
  return out;
}

std::vector<std::string> strings(const json& a) {
  std::vector<std::string> out;
  for (const json& s : a) out.push_back(s.get<std::string>());
  return out;
}

// The plan options of a case as the library call took them: the
// converter's targets and ignore when given; a pure conversion asks for no
// scheme; the mix quantizes with the case's preset on its targets, keyed as
// model_free_ptq keys a QuantizationScheme (config_group_0).
PlanOptions plan_of_case(const json& c) {
  PlanOptions options;
  const json& args = c["converter_args"];
  if (args.contains("targets")) options.convert.targets = strings(args["targets"]);
  if (args.contains("ignore")) options.convert.ignore = strings(args["ignore"]);
  if (c["kind"] == "mixed") {
    // ModelOptNvfp4Converter(targets=...) without ignore: none.
    if (!args.contains("ignore")) options.convert.ignore = std::vector<std::string>{};
    SchemeGroup g = preset_group(c["config"]["preset"].get<std::string>());
    g.name = c["scheme"].get<std::string>();
    g.targets = strings(c["config"]["targets"]);
    options.groups = {g};
    options.ignore = strings(c["ignore"]);
  } else {
    options.scheme_given = false;
  }
  return options;
}

class ConverterGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ConverterGolden, LibraryOutputEqualsExpected) {
  const json c = find_converter_case(GetParam());
  const fs::path input = golden_dir() / GetParam() / "input";
  TempDir tmp;
  const auto before = snapshot_files(input);
  QuantizeOptions options = test_options(input, tmp / "out");
  options.plan = plan_of_case(c);
  const QuantizeSummary summary = quantize(options);
  EXPECT_EQ(diff_golden(tmp / "out", golden_dir() / GetParam() / "expected", true), "");
  EXPECT_EQ(snapshot_files(input), before) << "the input was modified";
  EXPECT_GT(summary.plan.n_converted, 0u);
  EXPECT_TRUE(summary.plan.source_format.has_value());
  EXPECT_EQ(summary.tensors_quantized, c["kind"] == "mixed" ? 4u : 0u);
}

// The same bytes with one thread and with small chunks.
TEST_P(ConverterGolden, SameBytesWithOneThread) {
  const json c = find_converter_case(GetParam());
  const fs::path input = golden_dir() / GetParam() / "input";
  TempDir tmp;
  QuantizeOptions options = test_options(input, tmp / "out");
  options.plan = plan_of_case(c);
  options.threads = 1;
  options.chunk_bytes = 4096;
  quantize(options);
  EXPECT_EQ(diff_golden(tmp / "out", golden_dir() / GetParam() / "expected", true), "");
}

// Through the binary: a pure conversion needs no option; its summary says
// the conversion is lossless. Its dry run's plan line says that only the
// converted modules are written, not the default W4A16 group nothing takes.
TEST_P(ConverterGolden, BinaryConvertsWithNoOptions) {
  const json c = find_converter_case(GetParam());
  if (c["kind"] != "conversion") GTEST_SKIP() << "the mix needs its scheme";
  TempDir tmp;
  std::vector<std::string> args{"quantize", (golden_dir() / GetParam() / "input").string(),
                                (tmp / "out").string()};
  for (const std::string& t : strings(c["converter_args"].value("targets", json::array()))) {
    args.insert(args.end(), {"--convert-targets", t});
  }
  std::vector<std::string> dry = args;
  dry.push_back("--dry-run");
  const CommandResult plan = run_ctquant(dry);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::string converter = GetParam().starts_with("awq") ? "AWQ" : "ModelOpt NVFP4";
  EXPECT_TRUE(plan.out.starts_with("plan: convert the " + converter +
                                   " modules only; 16-bit modules kept (give --scheme to "
                                   "quantize them)\n"))
      << plan.out;
  EXPECT_EQ(plan.out.find("plan: W4A16"), std::string::npos) << plan.out;
  const CommandResult r = run_ctquant(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"modules converted (", "lossless: no requantization"});
  EXPECT_EQ(diff_golden(tmp / "out", golden_dir() / GetParam() / "expected", true), "");
}

INSTANTIATE_TEST_SUITE_P(Cases, ConverterGolden, ::testing::ValuesIn(output_case_names()),
                         [](const auto& p) {
                           std::string n = p.param;
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

// The DeepSeek-R1 example through the binary: --scheme FP8_BLOCK on the
// attention, the ModelOpt MLP converted. Group names follow ctquant's
// (FP8_BLOCK), so config.json is compared with the groups as a list.
TEST(ConverterMix, BinaryConvertsTheMlpAndQuantizesTheAttention) {
  const std::string name = "modelopt-nvfp4-mlp-fp8-block-attn";
  TempDir tmp;
  const CommandResult r = run_ctquant(
      {"quantize", (golden_dir() / name / "input").string(), (tmp / "out").string(), "--scheme",
       "FP8_BLOCK", "--targets", "re:.*self_attn.(q|k|v|o)_proj$", "--ignore", "lm_head",
       "--convert-targets", "re:.*mlp.*(gate_up|gate|up|down)_proj$"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(
      r.err, {"3 modules converted (ModelOpt NVFP4, lossless", "4 tensors quantized (FP8_BLOCK)"});
  // Tensors equal; config: the converter's ignore ("lm_head" from
  // exclude_modules, which the library call did not pass) aside.
  json config = read_json(tmp / "out" / "config.json");
  EXPECT_EQ(config["quantization_config"]["ignore"], json::array({"lm_head"}));
  EXPECT_EQ(config["quantization_config"]["format"], "mixed-precision");
  EXPECT_EQ(config["quantization_config"]["config_groups"]["FP8_BLOCK"]["format"],
            "float-quantized");
  EXPECT_EQ(config["quantization_config"]["transform_config"], json::object());
}

// probe/mix-scheme-targets-linear: the scheme targets "Linear" and the run
// ignores lm_head and the embedding. The library writes ignore [] and a
// config that reads lm_head as FP8; ctquant keeps the run's entry that a
// new target would otherwise take (lm_head), and the tensors are the
// library's: attention FP8_BLOCK, the MLP converted, lm_head BF16.
TEST(ConverterMix, KeepsTheRunsIgnoreEntryWhereANewTargetWouldTakeTheModule) {
  const std::string name = "modelopt-nvfp4-mlp-fp8-block-attn";
  PlanOptions options;
  options.convert.targets = std::vector<std::string>{"re:.*mlp.*(gate_up|gate|up|down)_proj$"};
  options.convert.ignore = std::vector<std::string>{};
  SchemeGroup g = preset_group("FP8_BLOCK");
  g.name = "config_group_0";
  options.groups = {g};
  options.ignore = {"lm_head", "model.embed_tokens"};
  TempDir tmp;
  QuantizeOptions q = test_options(golden_dir() / name / "input", tmp / "out");
  q.plan = options;
  const QuantizeSummary summary = quantize(q);
  EXPECT_EQ(summary.plan.n_converted, 3u);
  EXPECT_EQ(summary.tensors_quantized, 4u);
  const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], json::array({"lm_head"}));
  EXPECT_EQ(qc["config_groups"]["config_group_1"]["targets"], json::array({"Linear"}));
  const json probe = find_converter_case("probe/mix-scheme-targets-linear")["library"]["tensors"];
  for (const auto& [tensor, dtype_shape] : probe.items()) {
    const std::vector<std::byte> bytes = read_tensor(tmp / "out" / "model.safetensors", tensor);
    EXPECT_FALSE(bytes.empty()) << tensor;
  }
}

// A fused layer split between the converter and a new scheme: vLLM reads
// one scheme per fused layer. An AutoAWQ checkpoint whose k_proj and v_proj
// stayed F16 (modules_to_not_convert) beside a converted q_proj: quantizing
// them with W4A16 (after --convert-ignore lifts the converter's entries)
// is refused, naming the layer; keeping them is not.
TEST(ConverterMix, RefusesAFusedLayerSplitBetweenConvertedAndQuantized) {
  TempDir tmp;
  const auto zeros = [](std::uint64_t n) { return std::vector<std::byte>(n, std::byte{0}); };
  const std::string a = "model.layers.0.self_attn.";
  write_checkpoint(tmp / "in",
                   {FakeTensor{a + "q_proj.qweight", DType::kI32, {128, 16}, zeros(128 * 16 * 4)},
                    FakeTensor{a + "q_proj.qzeros", DType::kI32, {1, 16}, zeros(16 * 4)},
                    FakeTensor{a + "q_proj.scales",
                               DType::kF16,
                               {1, 128},
                               float_bytes(DType::kF16, std::vector<float>(128, 0.01f))},
                    random_weight(a + "k_proj.weight", DType::kF16, 128, 128, 1),
                    random_weight(a + "v_proj.weight", DType::kF16, 128, 128, 2)},
                   json{{"model_type", "llama"},
                        {"architectures", {"LlamaForCausalLM"}},
                        {"quantization_config",
                         {{"quant_method", "awq"},
                          {"version", "gemm"},
                          {"bits", 4},
                          {"group_size", 128},
                          {"zero_point", true},
                          {"modules_to_not_convert", {"k_proj", "v_proj"}}}}});
  const CommandResult kept =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "kept").string()});
  EXPECT_EQ(kept.exit_code, 0) << kept.err;
  // --convert-ignore drops the converter's own entries for k/v (which keep
  // them 16-bit otherwise), so the scheme takes them.
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(),
                                       "--scheme", "W4A16", "--convert-ignore", "lm_head"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"fused layer 'model.layers.0.self_attn.qkv_proj'",
                         "'model.layers.0.self_attn.q_proj' is converted (AWQ)",
                         "'model.layers.0.self_attn.k_proj' would be quantized with group 'W4A16'",
                         "compressed_tensors.py", "nothing was written"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// verify --against-source dequantizes both sides of a converted module
// (INPUT as AutoAWQ or ModelOpt does, OUTPUT as compressed-tensors does):
// every expected output is SAME against its input, and a changed code is
// DIFFERENT, named by module.
TEST_P(ConverterGolden, AgainstSourceDequantizesBothSides) {
  const fs::path input = golden_dir() / GetParam() / "input";
  const VerifyReport same =
      verify_against_source(golden_dir() / GetParam() / "expected", input, VerifyOptions{});
  EXPECT_TRUE(same.same()) << render_verify_text(same);
  EXPECT_FALSE(same.modules.empty());
  // Converted modules are lossless; the mix's FP8_BLOCK attention (checked
  // as any quantized module, ConverterMix.AgainstSourceChecksTheNewly...)
  // is not.
  for (const ModuleCheck& m : same.modules) {
    if (m.module.find("self_attn") == std::string::npos) {
      EXPECT_EQ(m.max_abs_error, 0.0) << m.module;
    }
  }
  TempDir tmp;
  copy_dir(golden_dir() / GetParam() / "expected", tmp / "out");
  const std::string module = same.modules.front().module;
  const fs::path shard = tmp / "out" / "model.safetensors";
  std::vector<std::byte> packed = read_tensor(shard, module + ".weight_packed");
  ASSERT_FALSE(packed.empty());
  // Rewrite the first byte of the module's codes in place.
  fs::permissions(shard, fs::perms::owner_write, fs::perm_options::add);
  const SafetensorsFile file(shard, "model.safetensors");
  const TensorEntry* e = file.header().find(module + ".weight_packed");
  ASSERT_NE(e, nullptr);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(file.header().data_start + e->begin));
    const char flipped = static_cast<char>(static_cast<unsigned char>(packed[0]) ^ 0x11u);
    f.write(&flipped, 1);
  }
  const VerifyReport changed = verify_against_source(tmp / "out", input, VerifyOptions{});
  EXPECT_FALSE(changed.same());
  expect_message(render_verify_text(changed), {module, "not lossless"});
}

// The mix's FP8_BLOCK attention, quantized in the same run as the MLP is
// converted, is checked as verify checks any quantized module: recomputed
// from INPUT code by code. SAME on the library's output with the four
// attention modules among the checked ones; one FP8 code of q_proj changed
// in a copy: DIFFERENT, naming it.
TEST(ConverterMix, AgainstSourceChecksTheNewlyQuantizedModulesToo) {
  const std::string name = "modelopt-nvfp4-mlp-fp8-block-attn";
  const fs::path input = golden_dir() / name / "input";
  const VerifyReport same =
      verify_against_source(golden_dir() / name / "expected", input, VerifyOptions{});
  EXPECT_TRUE(same.same()) << render_verify_text(same);
  std::vector<std::string> attention;
  for (const ModuleCheck& m : same.modules) {
    if (m.module.find("self_attn") == std::string::npos) continue;
    attention.push_back(m.module);
    EXPECT_GT(m.groups, 0u) << m.module;
    EXPECT_EQ(m.groups_mismatched, 0u) << m.module;
    EXPECT_GT(m.max_abs_error, 0.0) << m.module;  // FP8 is not lossless
  }
  const std::string a = "model.layers.0.self_attn.";
  std::sort(attention.begin(), attention.end());
  EXPECT_EQ(attention,
            (std::vector<std::string>{a + "k_proj", a + "o_proj", a + "q_proj", a + "v_proj"}));
  expect_message(render_verify_text(same), {}, {"not checked"});

  TempDir tmp;
  copy_dir(golden_dir() / name / "expected", tmp / "out");
  const fs::path shard = tmp / "out" / "model.safetensors";
  const std::string tensor = a + "q_proj.weight";
  const std::vector<std::byte> codes = read_tensor(shard, tensor);
  ASSERT_FALSE(codes.empty());
  fs::permissions(shard, fs::perms::owner_write, fs::perm_options::add);
  const SafetensorsFile file(shard, "model.safetensors");
  const TensorEntry* e = file.header().find(tensor);
  ASSERT_NE(e, nullptr);
  {
    // The next E4M3 code (never NaN, 0x7f / 0xff).
    const auto b = static_cast<unsigned char>(codes[0]);
    const unsigned char flipped = (b & 0x7fu) == 0x7eu ? b ^ 0x02u : b ^ 0x01u;
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(file.header().data_start + e->begin));
    const char c = static_cast<char>(flipped);
    f.write(&c, 1);
  }
  const VerifyReport changed = verify_against_source(tmp / "out", input, VerifyOptions{});
  EXPECT_FALSE(changed.same());
  ASSERT_EQ(changed.differences.size(), 1u) << render_verify_text(changed);
  EXPECT_EQ(changed.differences[0].kind, "codes");
  EXPECT_EQ(changed.differences[0].tensor, tensor);
  expect_message(render_verify_text(changed), {tensor, "not the RTN codes"});
}

// ---- refusals ----

struct Refusal {
  std::string name;
  std::vector<std::string> fragments;
};

class ConverterRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(ConverterRefusal, ExitsTwoNamingTheRuleAndWritesNothing) {
  const Refusal& c = GetParam();
  const fs::path input = golden_dir() / "converter-refusals" / c.name;
  ASSERT_TRUE(fs::exists(input)) << c.name;
  TempDir tmp;
  const auto before = snapshot_files(input);
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, c.fragments);
  expect_message(r.err, {"nothing was written"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
  EXPECT_EQ(snapshot_files(input), before);
}

const Refusal kRefusals[] = {
    {"awq-gemv",
     {"config.json: quantization_config.version \"gemv\"", "Unsupported AutoAWQ version: gemv",
      "GEMV packs"}},
    {"awq-marlin", {"Unsupported AutoAWQ version: marlin", "permuted 16x16 tiles"}},
    {"awq-exllama", {"Unsupported AutoAWQ version: exllama"}},
    {"awq-gemm-uppercase-version",
     {"Unsupported AutoAWQ version: GEMM", "write \"gemm\" in config.json"}},
    {"awq-8bit",
     {"quantization_config.bits 8", "AutoAWQConverter currently supports only 4-bit weights"}},
    {"awq-not-converted-module-quantized",
     {"model.safetensors: tensor 'model.layers.0.mlp.down_proj.qweight'",
      "Found unexpected non-targeted tensor model.layers.0.mlp.down_proj.qweight",
      "modules_to_not_convert"}},
    {"modelopt-fp8",
     {"hf_quant_config.json: quantization.quant_algo", "quant_algo \"FP8\" is not converted"}},
    {"modelopt-mixed-precision", {"quant_algo \"MIXED_PRECISION\"", "quantized_layers"}},
    {"modelopt-mixed-precision-fp8-ignored", {"quant_algo \"MIXED_PRECISION\""}},
    {"modelopt-w4a16-nvfp4", {"quant_algo \"W4A16_NVFP4\"", "no input_scale"}},
};

INSTANTIATE_TEST_SUITE_P(Cases, ConverterRefusal, ::testing::ValuesIn(kRefusals),
                         [](const auto& p) {
                           std::string n = p.param.name;
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

// Every refusal folder has a named test above.
TEST(ConverterRefusals, EveryFixtureHasANamedCase) {
  std::vector<std::string> named;
  for (const Refusal& r : kRefusals) named.push_back(r.name);
  for (const auto& e : fs::directory_iterator(golden_dir() / "converter-refusals")) {
    EXPECT_NE(std::find(named.begin(), named.end(), e.path().filename().string()), named.end())
        << e.path().filename();
  }
}

// ---- new schemes beside a converter ----

// The modules the converter keeps (AutoAWQ's modules_to_not_convert, its
// ignore entries in config.json) stay 16-bit whatever a new scheme's
// targets say: vLLM skips them and loads their .weight. A Linear-targeted
// scheme or --no-default-ignore (lm_head) quantize none of them, say so
// (L1), and the output verifies SAME against the input.
TEST(ConverterMix, NewSchemeLeavesTheModulesTheConverterIgnores) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g128" / "input";
  const std::vector<std::vector<std::string>> runs{{"--scheme", "NVFP4A16"},
                                                   {"--scheme", "W8A16"},
                                                   {"--scheme", "W4A16", "--no-default-ignore"}};
  for (const auto& extra : runs) {
    TempDir tmp;
    std::vector<std::string> args{"quantize", input.string(), (tmp / "out").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = run_ctquant(args);
    ASSERT_EQ(r.exit_code, 0) << extra[1] << r.err;
    // Not silent: the group the user asked for adds nothing (lint L1).
    expect_message(r.err, {"warning: L1: scheme group '" + extra[1] +
                               "' quantizes no module: its targets match only modules the "
                               "input's converter takes",
                           "it is not written to config.json", "name the 16-bit modules"});
    const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
    EXPECT_EQ(qc["ignore"], json::array({"lm_head", "re:.*self_attn\\.o_proj.*"})) << extra[1];
    const fs::path shard = tmp / "out" / "model.safetensors";
    for (const std::string m :
         {"model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj", "lm_head"}) {
      EXPECT_FALSE(read_tensor(shard, m + ".weight").empty()) << m;
    }
    const VerifyReport v = verify_against_source(tmp / "out", input, VerifyOptions{});
    EXPECT_TRUE(v.same()) << render_verify_text(v);
  }
}

// When the converter's ignore list is lifted (--convert-ignore) and a new
// group also targets "Linear", vLLM keeps one scheme per target string
// (the group sorting last in config.json) for every Linear: the quantized
// o_proj would be read as AWQ. Refused at plan time, nothing written; a
// `re:` target for the new scheme is accepted and verifies SAME.
TEST(ConverterMix, RefusesTwoGroupsVllmReadsWithOneTarget) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g128" / "input";
  TempDir tmp;
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string(),
                                       "--scheme", "W4A16", "--convert-ignore", "lm_head"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"module 'model.layers.0.self_attn.o_proj' is quantized with group "
                         "'W4A16' but vLLM's find_matched_target would read it with group "
                         "'config_group_0'",
                         "utils.py find_matched_target", "--targets", "nothing was written"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  const CommandResult ok =
      run_ctquant({"quantize", input.string(), (tmp / "ok").string(), "--scheme", "W4A16",
                   "--convert-ignore", "lm_head", "--targets", "re:.*o_proj$"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const json qc = read_json(tmp / "ok" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], json::array({"lm_head"}));
  EXPECT_EQ(qc["config_groups"]["W4A16"]["targets"], json::array({"re:.*o_proj$"}));
  EXPECT_FALSE(
      read_tensor(tmp / "ok" / "model.safetensors", "model.layers.0.self_attn.o_proj.weight_packed")
          .empty());
  const VerifyReport v = verify_against_source(tmp / "ok", input, VerifyOptions{});
  EXPECT_TRUE(v.same()) << render_verify_text(v);
}

// --target-bits and --observer auto choose for the modules a scheme
// quantizes; on an AutoAWQ input nothing is quantized (the converted
// modules are not requantized): exit 2 with a message, as --more-bits
// layers does, nothing written (not a silent 0-module run, not an empty
// "ctquant: " line).
TEST(ConverterMix, BitAndObserverChoicesRefuseAPlanThatQuantizesNone) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g128" / "input";
  const std::vector<std::vector<std::string>> runs{
      {"--target-bits", "5"}, {"--observer", "auto"}, {"--observer", "auto", "--dry-run"}};
  for (const auto& extra : runs) {
    TempDir tmp;
    std::vector<std::string> args{"quantize", input.string(), (tmp / "out").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = run_ctquant(args);
    EXPECT_EQ(r.exit_code, 2) << extra[0] << r.err;
    expect_message(r.err, {extra[0] + " " + extra[1] +
                               " chooses for the modules the scheme "
                               "quantizes, and this plan quantizes none",
                           "converted modules are not requantized"});
    EXPECT_EQ(r.err.find("ctquant: \n"), std::string::npos);
    EXPECT_TRUE(r.err.ends_with("\n"));
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
}

// AutoAWQ layouts whose sizes do not fill the converter's 16x16-word tiles
// (in/8 and out/8 not multiples of 16): every code, zero point and scale of
// the output is where compressed-tensors' AutoAWQConverter puts it, checked
// element by element against AWQ's own order (awq/utils/packing_utils.py
// AWQ_REVERSE_ORDER: output 8c + j is nibble {0,4,1,5,2,6,3,7}[j] of word c).
TEST(ConverterAwq, TileEdgesMoveEveryCodeZeroPointAndScale) {
  constexpr int kReverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const std::uint64_t n_in = 136, n_out = 200, group = 8, groups = n_in / group;
  std::mt19937 rng(7);
  auto random_words = [&](std::uint64_t count) {
    std::vector<std::uint32_t> w(count);
    for (auto& x : w) x = static_cast<std::uint32_t>(rng());
    return w;
  };
  auto word_bytes = [](const std::vector<std::uint32_t>& w) {
    std::vector<std::byte> b(w.size() * 4);
    std::memcpy(b.data(), w.data(), b.size());
    return b;
  };
  const std::vector<std::uint32_t> qweight = random_words(n_in * n_out / 8);
  const std::vector<std::uint32_t> qzeros = random_words(groups * n_out / 8);
  std::vector<std::uint16_t> scales(groups * n_out);
  for (std::size_t i = 0; i < scales.size(); ++i) {
    scales[i] = static_cast<std::uint16_t>(0x2000 + i);  // finite F16, all distinct
  }
  TempDir tmp;
  const fs::path input = tmp / "in";
  const std::string m = "model.layers.0.mlp.down_proj";
  write_checkpoint(input,
                   {{m + ".qweight", DType::kI32, {n_in, n_out / 8}, word_bytes(qweight)},
                    {m + ".qzeros", DType::kI32, {groups, n_out / 8}, word_bytes(qzeros)},
                    {m + ".scales", DType::kF16, {groups, n_out}, u16_bytes(scales)}},
                   json{{"model_type", "llama"},
                        {"quantization_config",
                         {{"quant_method", "awq"},
                          {"version", "gemm"},
                          {"bits", 4},
                          {"group_size", group},
                          {"zero_point", true}}}});
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path shard = tmp / "out" / "model.safetensors";
  auto words_of = [&](const std::string& name) {
    const std::vector<std::byte> b = read_tensor(shard, name);
    std::vector<std::uint32_t> w(b.size() / 4);
    std::memcpy(w.data(), b.data(), b.size());
    return w;
  };
  const std::vector<std::uint32_t> packed = words_of(m + ".weight_packed");
  const std::vector<std::uint32_t> zeros = words_of(m + ".weight_zero_point");
  const std::vector<std::byte> scale = read_tensor(shard, m + ".weight_scale");
  ASSERT_EQ(packed.size(), n_out * n_in / 8);
  ASSERT_EQ(zeros.size(), n_out / 8 * groups);
  ASSERT_EQ(scale.size(), n_out * groups * 2);
  auto nibble = [](std::uint32_t w, int p) { return (w >> (4 * p)) & 15u; };
  int wrong = 0;
  for (std::uint64_t o = 0; o < n_out; ++o) {
    for (std::uint64_t i = 0; i < n_in; ++i) {
      const std::uint32_t awq = nibble(qweight[i * (n_out / 8) + o / 8], kReverse[o % 8]);
      const std::uint32_t ct = nibble(packed[o * (n_in / 8) + i / 8], static_cast<int>(i % 8));
      if (awq != ct && ++wrong <= 3) ADD_FAILURE() << "code of output " << o << " input " << i;
    }
    for (std::uint64_t k = 0; k < groups; ++k) {
      const std::uint32_t awq = nibble(qzeros[k * (n_out / 8) + o / 8], kReverse[o % 8]);
      const std::uint32_t ct = nibble(zeros[(o / 8) * groups + k], static_cast<int>(o % 8));
      if (awq != ct && ++wrong <= 3)
        ADD_FAILURE() << "zero point of output " << o << " group " << k;
      std::uint16_t s = 0;
      std::memcpy(&s, scale.data() + (o * groups + k) * 2, 2);
      if (s != scales[k * n_out + o] && ++wrong <= 3) ADD_FAILURE() << "scale " << o << "," << k;
    }
  }
  EXPECT_EQ(wrong, 0);
}

// ModelOpt's exclude_modules wildcards (fnmatch, "model.layers.0.self_attn*")
// become anchored `re:` ignore entries: the default run converts the MLP,
// keeps the attention 16-bit and ignored, and verifies SAME.
TEST(ConverterMix, ModelOptWildcardExcludeBecomesAnAnchoredRegex) {
  const fs::path input = golden_dir() / "modelopt-nvfp4-mlp-fp8-block-attn" / "input";
  TempDir tmp;
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"3 modules converted (ModelOpt NVFP4"});
  const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], json::array({"lm_head", "re:model\\.layers\\.0\\.self_attn.*"}));
  EXPECT_FALSE(
      read_tensor(tmp / "out" / "model.safetensors", "model.layers.0.self_attn.q_proj.weight")
          .empty());
  const VerifyReport v = verify_against_source(tmp / "out", input, VerifyOptions{});
  EXPECT_TRUE(v.same()) << render_verify_text(v);
}

// The other fnmatch wildcards, as Python's fnmatch.translate reads them:
// '?' is one character, "[!...]" a negated set, "[...]" a set; the
// entries stay anchored (re.match from the start, '$' unless the pattern
// ends in '*'), and the attention they name stays 16-bit.
TEST(ConverterMix, ModelOptQuestionMarkAndSetWildcardsBecomeRegexes) {
  const fs::path golden = golden_dir() / "modelopt-nvfp4-mlp-fp8-block-attn" / "input";
  TempDir tmp;
  const fs::path input = tmp / "in";
  copy_dir(golden, input);
  const json exclude = json::array(
      {"lm_head", "model.layers.?.self_attn.[!kq]_proj", "model.layers.[0-3].self_attn.[kq]_proj"});
  json hf = read_json(input / "hf_quant_config.json");
  hf["quantization"]["exclude_modules"] = exclude;
  write_file(input / "hf_quant_config.json", hf.dump(4));
  json config = read_json(input / "config.json");
  config["quantization_config"]["ignore"] = exclude;
  write_file(input / "config.json", config.dump(2));
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], json::array({"lm_head", "re:model\\.layers\\..\\.self_attn\\.[^kq]_proj$",
                                       "re:model\\.layers\\.[0-3]\\.self_attn\\.[kq]_proj$"}));
  for (const std::string p : {"q", "k", "v", "o"}) {
    EXPECT_FALSE(read_tensor(tmp / "out" / "model.safetensors",
                             "model.layers.0.self_attn." + p + "_proj.weight")
                     .empty())
        << p;
  }
  const VerifyReport v = verify_against_source(tmp / "out", input, VerifyOptions{});
  EXPECT_TRUE(v.same()) << render_verify_text(v);
}

// A bad pattern in --convert-targets or --convert-ignore is named by its
// own option (not --targets / --ignore), exit 2, nothing written.
TEST(ConverterMix, BadConverterPatternIsNamedByItsOption) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g128" / "input";
  for (const std::string option : {"--convert-targets", "--convert-ignore"}) {
    TempDir tmp;
    const CommandResult r =
        run_ctquant({"quantize", input.string(), (tmp / "out").string(), option, "re:(("});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, {option + " 're:((': invalid regular expression at offset 2"});
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
}

// --convert-ignore or --convert-targets that leaves out a module holding the
// format's quantized tensors is refused by the option, exit 2, nothing
// written: ctquant converts such a module as stored or not at all (it has no
// 16-bit weight to keep).
TEST(ConverterMix, ConverterOptionLeavingAQuantizedModuleOutIsRefused) {
  struct Case {
    std::string golden;
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"modelopt-nvfp4-kv",
       {"--convert-ignore", "re:.*self_attn.*"},
       "--convert-ignore 're:.*self_attn.*' leaves 4 module(s) out of the conversion that hold "
       "ModelOpt NVFP4 tensors: model.layers.0.self_attn.k_proj, "
       "model.layers.0.self_attn.o_proj, model.layers.0.self_attn.q_proj, "
       "model.layers.0.self_attn.v_proj."},
      {"awq-gemm-zp-g128",
       {"--convert-ignore", "re:.*self_attn.*"},
       "--convert-ignore 're:.*self_attn.*' leaves 6 module(s) out of the conversion that hold "
       "AWQ tensors: model.layers.0.self_attn.k_proj"},
      {"awq-gemm-zp-g128",
       {"--convert-targets", "re:.*mlp.*"},
       "--convert-targets 're:.*mlp.*' leaves 6 module(s) out"},
  };
  for (const Case& c : cases) {
    TempDir tmp;
    std::vector<std::string> args = {"quantize", (golden_dir() / c.golden / "input").string(),
                                     (tmp / "out").string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CommandResult r = run_ctquant(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, {c.message, "Nothing was written"});
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
}

// A new group named as the converter's ("config_group_0") is written as
// "config_group_1" (compressed-tensors' find_unique_name, as
// model_free_ptq merges it), and the summary calls it that too.
TEST(ConverterMix, NewGroupIsNamedAsConfigJsonWritesIt) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g128" / "input";
  TempDir tmp;
  const json qc = {{"config_groups",
                    {{"config_group_0",
                      {{"targets", {"re:.*o_proj$"}},
                       {"format", "pack-quantized"},
                       {"weights",
                        {{"num_bits", 8},
                         {"type", "int"},
                         {"symmetric", true},
                         {"strategy", "group"},
                         {"group_size", 128}}}}}}}};
  write_file(tmp / "qc.json", qc.dump());
  const CommandResult r =
      run_ctquant({"quantize", input.string(), (tmp / "out").string(), "--quantization-config",
                   (tmp / "qc.json").string(), "--convert-ignore", "lm_head"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"2 tensors quantized (config_group_1)"}, {"(config_group_0)"});
  const json groups =
      read_json(tmp / "out" / "config.json")["quantization_config"]["config_groups"];
  EXPECT_EQ(groups["config_group_0"]["targets"], json::array({"Linear"}));
  EXPECT_EQ(groups["config_group_1"]["targets"], json::array({"re:.*o_proj$"}));
  const CommandResult verify =
      run_ctquant({"verify", (tmp / "out").string(), input.string(), "--against-source"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

// A pure conversion asks for no scheme: its default group quantizing
// nothing is by design, not a finding (no L1), so --strict converts too.
TEST(ConverterMix, PureConversionHasNoFindingEvenUnderStrict) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g64" / "input";
  TempDir tmp;
  const CommandResult r =
      run_ctquant({"quantize", input.string(), (tmp / "out").string(), "--strict"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"modules converted (AWQ"}, {"L1", "warning"});
}

// The run's own ignore entry keeps a module 16-bit that the converter's
// "Linear" target would take once --convert-ignore lifts AutoAWQ's
// modules_to_not_convert: the entry is written into config.json (with no
// scheme given too), and the output verifies SAME, loadability included.
TEST(ConverterMix, RunIgnoreEntryIsWrittenWhereTheConverterTargetTakesTheModule) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g128" / "input";
  TempDir tmp;
  const std::string entry = "re:^model\\.layers\\.\\d+\\.self_attn\\.o_proj$";
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string(),
                                       "--convert-ignore", "lm_head", "--ignore", entry});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], json::array({"lm_head", entry}));
  const VerifyReport v = verify_against_source(tmp / "out", input, VerifyOptions{});
  EXPECT_TRUE(v.same()) << render_verify_text(v);
}

// A new target taking some of the modules a converter ignore entry keeps
// lifts that entry; the modules it kept and no scheme takes stay ignored,
// by exact name, so vLLM does not read them as AWQ.
TEST(ConverterMix, LiftedConverterEntryKeepsItsOtherModulesIgnoredByName) {
  const fs::path input = golden_dir() / "awq-gemm-zp-g128" / "input";
  const std::vector<std::vector<std::string>> runs{
      {"--scheme", "W8A16", "--targets", "model.layers.0.self_attn.o_proj"},
      {"--scheme", "W8A16", "--targets", "re:.*layers\\.0\\.self_attn\\.o_proj$"},
      {"--scheme-for", "model.layers.0.self_attn.o_proj=W8A16"}};
  for (const auto& extra : runs) {
    TempDir tmp;
    std::vector<std::string> args{"quantize", input.string(), (tmp / "out").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = run_ctquant(args);
    ASSERT_EQ(r.exit_code, 0) << extra.back() << r.err;
    const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
    EXPECT_EQ(qc["ignore"], json::array({"lm_head", "model.layers.1.self_attn.o_proj"}))
        << extra.back();
    EXPECT_FALSE(
        read_tensor(tmp / "out" / "model.safetensors", "model.layers.1.self_attn.o_proj.weight")
            .empty());
    const VerifyReport v = verify_against_source(tmp / "out", input, VerifyOptions{});
    EXPECT_TRUE(v.same()) << extra.back() << render_verify_text(v);
  }
}

// A fused layer whose shards a mix leaves split between a new scheme and
// 16 bits (q/k FP8_BLOCK, v kept) is refused at plan time, exit 2, nothing
// written: vLLM refuses different schemes in one qkv_proj.
TEST(ConverterMix, RefusesAFusedLayerSplitBetweenQuantizedAnd16Bit) {
  const fs::path input = golden_dir() / "modelopt-nvfp4-mlp-fp8-block-attn" / "input";
  TempDir tmp;
  const CommandResult r =
      run_ctquant({"quantize", input.string(), (tmp / "out").string(), "--scheme", "FP8_BLOCK",
                   "--targets", "re:.*self_attn\\.(q|k)_proj$"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"vLLM builds 'model.layers.0.self_attn.qkv_proj' as one layer, and its "
                         "shards differ",
                         "model.layers.0.self_attn.q_proj (quantized with group 'FP8_BLOCK')",
                         "model.layers.0.self_attn.v_proj (16-bit)", "compressed_tensors.py",
                         "nothing was written"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// A scheme whose `re:` targets match only converted modules quantizes
// nothing: said (L1), not a silent run.
TEST(ConverterMix, SchemeWhoseRegexTargetsMatchOnlyConvertedModulesSaysSo) {
  const fs::path input = golden_dir() / "modelopt-nvfp4-kv" / "input";
  TempDir tmp;
  const CommandResult r =
      run_ctquant({"quantize", input.string(), (tmp / "out").string(), "--scheme", "FP8_BLOCK",
                   "--targets", "re:.*self_attn\\.(q|k|v|o)_proj$"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"warning: L1: scheme group 'FP8_BLOCK' quantizes no module: its targets "
                         "match only modules the input's converter takes"});
  const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
  EXPECT_FALSE(qc["config_groups"].contains("FP8_BLOCK"));
}

// An exclude_modules entry that is not a string would be dropped (and its
// module converted or read wrong): refused, exit 2, naming the file and
// key, nothing written.
TEST(ConverterRefusals, ModelOptExcludeEntryThatIsNotAStringIsRefused) {
  const fs::path golden = golden_dir() / "modelopt-nvfp4-mlp-fp8-block-attn" / "input";
  for (const json& bad : {json(5), json{{"name", "x"}}}) {
    TempDir tmp;
    const fs::path input = tmp / "in";
    copy_dir(golden, input);
    json hf = read_json(input / "hf_quant_config.json");
    hf["quantization"]["exclude_modules"] = json::array({"lm_head", bad});
    write_file(input / "hf_quant_config.json", hf.dump(4));
    const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string()});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    expect_message(r.err, {"hf_quant_config.json: quantization.exclude_modules",
                           "an entry is not a module name or fnmatch pattern: " + bad.dump(),
                           "nothing was written"});
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
}

// A group size that does not divide in_features is named as such (not as
// a scales shape that seems to agree with itself): exit 2, nothing written.
TEST(ConverterRefusals, AwqGroupSizeNotDividingInFeaturesSaysSo) {
  TempDir tmp;
  const fs::path input = tmp / "in";
  copy_dir(golden_dir() / "awq-gemm-zp-g128" / "input", input);
  json config = read_json(input / "config.json");
  config["quantization_config"]["group_size"] = 100;  // divides neither 256 nor 384
  write_file(input / "config.json", config.dump(2));
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err,
                 {"in_features 256 (qweight [256, 32]) is not a multiple of config.json's "
                  "quantization_config.group_size 100",
                  "in_features 384 (qweight [384, 32]) is not a multiple", "nothing was written"},
                 {"expected F16 scales"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// A new group whose only target is a module the run's ignore list keeps
// (lm_head) quantizes nothing on a converted input either: said (L1), and
// --strict stops the run, as on a 16-bit input.
TEST(ConverterMix, GroupTargetingOnlyAnIgnoredModuleSaysSo) {
  const fs::path input = golden_dir() / "modelopt-nvfp4-kv" / "input";
  TempDir tmp;
  const CommandResult r = run_ctquant({"quantize", input.string(), (tmp / "out").string(),
                                       "--scheme", "W8A16", "--targets", "lm_head", "--strict"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"L1", "scheme group 'W8A16'"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// Overwrites `bytes` at element `index` of `tensor` in the checkpoint file.
void patch_element(const fs::path& file, const std::string& tensor, std::uint64_t index,
                   const std::vector<std::uint8_t>& bytes) {
  const SafetensorsHeader header = read_header(file, file.filename().string());
  const TensorEntry* e = header.find(tensor);
  ASSERT_NE(e, nullptr) << tensor;
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(header.data_start + e->begin + index * bytes.size()));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good());
}

// Converted values are written as stored (no requantization): a scale that
// is not finite in the input, or a global scale that becomes one (1 / 0),
// would reach vLLM as NaN weights. Refused, exit 1, naming the shard, the
// tensor, the element and the module; nothing written.
TEST(ConverterRefusals, ScaleThatIsNotFiniteIsRefused) {
  TempDir tmp;
  copy_dir(golden_dir() / "awq-gemm-zp-g128" / "input", tmp / "awq");
  patch_element(tmp / "awq" / "model.safetensors", "model.layers.0.mlp.down_proj.scales",
                1 * 256 + 7, {0x00, 0x7e});  // F16 NaN at [1, 7]
  const CommandResult awq =
      run_ctquant({"quantize", (tmp / "awq").string(), (tmp / "out").string()});
  EXPECT_EQ(awq.exit_code, 1) << awq.err;
  expect_message(awq.err, {"model.safetensors: tensor 'model.layers.0.mlp.down_proj.scales' (F16) "
                           "element [1, 7]: nan is not finite",
                           "module 'model.layers.0.mlp.down_proj'", "Nothing was written"});
  EXPECT_FALSE(fs::exists(tmp / "out"));

  copy_dir(golden_dir() / "modelopt-nvfp4-kv" / "input", tmp / "modelopt");
  patch_element(tmp / "modelopt" / "model.safetensors",
                "model.layers.0.mlp.gate_proj.weight_scale_2", 0, {0, 0, 0, 0});  // 0.0f
  const CommandResult modelopt =
      run_ctquant({"quantize", (tmp / "modelopt").string(), (tmp / "out").string()});
  EXPECT_EQ(modelopt.exit_code, 1) << modelopt.err;
  expect_message(modelopt.err,
                 {"converted tensor 'model.layers.0.mlp.gate_proj.weight_global_scale' (F32) "
                  "element 0: inf is not finite (made from "
                  "model.layers.0.mlp.gate_proj.weight_scale_2's 0 in model.safetensors)",
                  "Nothing was written"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  // A renamed scale is checked too: an FP8 block scale of NVFP4 that is NaN.
  copy_dir(golden_dir() / "modelopt-nvfp4-kv" / "input", tmp / "fp8-nan");
  patch_element(tmp / "fp8-nan" / "model.safetensors", "model.layers.0.mlp.gate_proj.weight_scale",
                2 * 16 + 5, {0x7f});
  const CommandResult fp8 =
      run_ctquant({"quantize", (tmp / "fp8-nan").string(), (tmp / "out").string()});
  EXPECT_EQ(fp8.exit_code, 1) << fp8.err;
  expect_message(fp8.err, {"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight_scale' "
                           "(F8_E4M3) element [2, 5]: nan is not finite"});
  EXPECT_EQ(fp8.err.find("the first of"), std::string::npos) << fp8.err;  // one bad element
  EXPECT_FALSE(fs::exists(tmp / "out"));
  // More than one: the first is named, with how many there are.
  patch_element(tmp / "fp8-nan" / "model.safetensors", "model.layers.0.mlp.gate_proj.weight_scale",
                3 * 16 + 1, {0xff});
  patch_element(tmp / "fp8-nan" / "model.safetensors", "model.layers.0.mlp.gate_proj.weight_scale",
                7 * 16 + 9, {0x7f});
  const CommandResult three =
      run_ctquant({"quantize", (tmp / "fp8-nan").string(), (tmp / "out").string()});
  EXPECT_EQ(three.exit_code, 1) << three.err;
  expect_message(three.err, {"element [2, 5]: nan is not finite (the first of 3 elements of "});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

}  // namespace
}  // namespace ctquant::test
