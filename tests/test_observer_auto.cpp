// --observer auto (exec/observer_choice.hpp) on golden inputs whose
// min-max and MSE outputs the library itself wrote, and ctquant's refit
// outputs of them: every module's three figures against those of these
// outputs (the shared error function, verify/errors.hpp), the observer
// each module keeps, the bytes written (the tensors of that observer's
// output), the split config groups, their reload through verify
// --against-source, and the report.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ctquant/exec/observer_choice.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/verify/errors.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using json = nlohmann::json;
using test::expect_message;
using test::TempDir;

namespace fs = std::filesystem;

// Each module's figures in a checkpoint made from a golden case's input.
std::map<std::string, QuantError> errors_of(const fs::path& output, const std::string& input_case) {
  const CheckpointErrors e = checkpoint_errors(output, test::golden_dir() / input_case / "input");
  EXPECT_TRUE(e.skipped.empty()) << output;
  std::map<std::string, QuantError> out;
  for (const ModuleError& m : e.modules) out[e.plan.modules[m.module].name] = m.error;
  return out;
}

fs::path expected(const std::string& golden_case) {
  return test::golden_dir() / golden_case / "expected";
}

// The layer vLLM builds a Llama module into (its packed_modules_mapping:
// q/k/v into qkv_proj, gate/up into gate_up_proj): such modules keep one
// observer.
std::string vllm_layer(const std::string& module) {
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    if (module.ends_with(p)) return module.substr(0, module.size() - 6) + "qkv_proj";
  }
  for (const char* p : {"gate_proj", "up_proj"}) {
    if (module.ends_with(p)) return module.substr(0, module.size() - std::string(p).size()) + "gate_up_proj";
  }
  return module;
}

const std::vector<std::string> kKwargs = {"--observer-kwarg", "norm=1.5", "--observer-kwarg",
                                          "maxshrink=0.5"};
// refit kwargs that leave it min-max's scales (no candidates, no refit):
// auto then chooses between min-max and the MSE observer (a tie keeps
// min-max).
const std::vector<std::string> kRefitAsMinMax = {"--observer-kwarg", "steps=0", "--observer-kwarg",
                                                 "refits=0"};

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The tensors of module `name` in a single-file checkpoint.
std::map<std::string, std::vector<std::byte>> module_tensors(const fs::path& file,
                                                             const std::string& name) {
  std::map<std::string, std::vector<std::byte>> out;
  const std::string bytes = test::read_file(file);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  for (const auto& [tensor, entry] : header.items()) {
    if (tensor.rfind(name + ".", 0) == 0) out[tensor] = test::read_tensor(file, tensor);
  }
  return out;
}

struct AutoRun {
  test::CommandResult result;
  json report;
  json groups;
};

std::vector<std::string> quantize_args(const TempDir& tmp, const std::string& input_case,
                                       const std::string& out,
                                       const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"quantize",
                                   (test::golden_dir() / input_case / "input").string(),
                                   (tmp / out).string(),
                                   "--no-default-ignore",
                                   "--ignore",
                                   "lm_head",
                                   "--ignore",
                                   "model.embed_tokens"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

AutoRun run_auto(const TempDir& tmp, const std::string& input_case,
                 const std::vector<std::string>& extra) {
  std::vector<std::string> more = {"--observer", "auto", "--report",
                                   (tmp / "report.json").string()};
  more.insert(more.end(), extra.begin(), extra.end());
  AutoRun run;
  run.result = test::run_ctquant(quantize_args(tmp, input_case, "out", more));
  if (run.result.exit_code != 0) return run;
  run.report = test::read_json(tmp / "report.json");
  run.groups =
      test::read_json(tmp / "out" / "config.json").at("quantization_config").at("config_groups");
  return run;
}

// The run's choice for every module against outputs of the same input made
// with each observer alone: the figures are theirs, bit for bit; the
// modules of a vLLM layer keep the observer whose ||W - Q|| over the layer
// is lowest, another than min-max only when strictly lower (min-max, then
// the MSE observer, then refit on a tie); the tensors written are that
// output's. Returns the observers kept.
std::set<std::string> expect_choice_follows_errors(
    const AutoRun& run, const fs::path& out, const fs::path& minmax_out, const fs::path& mse_out,
    const fs::path& refit_out, const std::string& input_case, const std::string& mse_observer) {
  const auto minmax = errors_of(minmax_out, input_case);
  const auto mse = errors_of(mse_out, input_case);
  const auto refit = errors_of(refit_out, input_case);
  std::map<std::string, std::array<QuantError, 3>> layers;
  for (const auto& [name, e] : minmax) {
    std::array<QuantError, 3>& l = layers[vllm_layer(name)];
    l[0].add(e);
    l[1].add(mse.at(name));
    l[2].add(refit.at(name));
  }
  std::set<std::string> kept;
  const json& per_module = run.report.at("observer_choice").at("per_module");
  EXPECT_EQ(per_module.size(), minmax.size());
  for (const json& m : per_module) {
    const std::string name = m.at("module");
    SCOPED_TRACE(name);
    EXPECT_TRUE(minmax.contains(name) && mse.contains(name) && refit.contains(name));
    if (!minmax.contains(name) || !mse.contains(name) || !refit.contains(name)) continue;
    EXPECT_EQ(m.at("rel_frobenius_minmax").get<double>(), minmax.at(name).rel_frobenius());
    EXPECT_EQ(m.at("rel_frobenius_mse").get<double>(), mse.at(name).rel_frobenius());
    EXPECT_EQ(m.at("rel_frobenius_refit").get<double>(), refit.at(name).rel_frobenius());
    EXPECT_EQ(m.at("max_abs_error_minmax").get<double>(), minmax.at(name).max_abs_error());
    EXPECT_EQ(m.at("max_abs_error_mse").get<double>(), mse.at(name).max_abs_error());
    EXPECT_EQ(m.at("max_abs_error_refit").get<double>(), refit.at(name).max_abs_error());
    EXPECT_EQ(m.at("mse_observer"), mse_observer);
    EXPECT_TRUE(m.at("refit_not_measured").is_null());
    EXPECT_EQ(m.at("change").get<double>(),
              mse.at(name).rel_frobenius() / minmax.at(name).rel_frobenius() - 1.0);
    EXPECT_EQ(m.at("change_refit").get<double>(),
              refit.at(name).rel_frobenius() / minmax.at(name).rel_frobenius() - 1.0);
    const std::array<QuantError, 3>& l = layers.at(vllm_layer(name));
    std::string want = "memoryless_minmax";
    double best = l[0].err2;
    if (l[1].err2 < best) {
      want = mse_observer;
      best = l[1].err2;
    }
    if (l[2].err2 < best) want = "refit";
    const std::string observer = m.at("observer");
    EXPECT_EQ(observer, want);
    kept.insert(observer);
    const fs::path& source = observer == mse_observer ? mse_out
                             : observer == "refit"    ? refit_out
                                                      : minmax_out;
    EXPECT_EQ(module_tensors(out / "model.safetensors", name),
              module_tensors(source / "model.safetensors", name))
        << "tensors of " << source;
  }
  return kept;
}

TEST(ObserverAuto, KeepsMseWhereItsErrorIsLowerAndMinMaxWhereItIsLower) {
  // With these kwargs the MSE scales of this input are better for some
  // layers and worse for others.
  TempDir tmp;
  const AutoRun run = run_auto(tmp, "llama-bf16", concat(kKwargs, kRefitAsMinMax));
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  std::vector<std::string> mse_args = {"--observer", "memoryless_mse"};
  mse_args.insert(mse_args.end(), kKwargs.begin(), kKwargs.end());
  const test::CommandResult mse_run =
      test::run_ctquant(quantize_args(tmp, "llama-bf16", "mse", mse_args));
  ASSERT_EQ(mse_run.exit_code, 0) << mse_run.err;
  // These refit kwargs give min-max's bytes.
  const test::CommandResult refit_run = test::run_ctquant(
      quantize_args(tmp, "llama-bf16", "refit", concat({"--observer", "refit"}, kRefitAsMinMax)));
  ASSERT_EQ(refit_run.exit_code, 0) << refit_run.err;
  for (const auto& [name, e] : errors_of(tmp / "refit", "llama-bf16")) {
    EXPECT_EQ(module_tensors(tmp / "refit" / "model.safetensors", name),
              module_tensors(expected("llama-bf16") / "model.safetensors", name))
        << name;
  }
  const std::set<std::string> kept =
      expect_choice_follows_errors(run, tmp / "out", expected("llama-bf16"), tmp / "mse",
                                   tmp / "refit", "llama-bf16", "memoryless_mse");
  EXPECT_EQ(kept, (std::set<std::string>{"memoryless_minmax", "memoryless_mse"}));
  // In layer 0, v_proj alone is better with the MSE scales but q/k/v
  // together are not: the layer keeps min-max.
  const auto minmax = errors_of(expected("llama-bf16"), "llama-bf16");
  const auto mse = errors_of(tmp / "mse", "llama-bf16");
  const std::string v = "model.layers.0.self_attn.v_proj";
  EXPECT_LT(mse.at(v).err2, minmax.at(v).err2);
  for (const json& m : run.report.at("observer_choice").at("per_module")) {
    if (m.at("module") == v) {
      EXPECT_EQ(m.at("observer"), "memoryless_minmax");
    }
  }
}

TEST(ObserverAuto, WithDefaultKwargsKeepsTheLowestOfTheLibrarysOutputsAndRefits) {
  // The library's own outputs of min-max and memoryless_mse, and refit's:
  // on this input refit's scales are the best for every layer.
  TempDir tmp;
  const AutoRun run = run_auto(tmp, "llama-bf16", {});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const test::CommandResult refit_run =
      test::run_ctquant(quantize_args(tmp, "llama-bf16", "refit", {"--observer", "refit"}));
  ASSERT_EQ(refit_run.exit_code, 0) << refit_run.err;
  const std::set<std::string> kept = expect_choice_follows_errors(
      run, tmp / "out", expected("llama-bf16"), expected("llama-bf16-mse"), tmp / "refit",
      "llama-bf16", "memoryless_mse");
  EXPECT_EQ(kept, std::set<std::string>{"refit"});
  // Every module chose refit: the group keeps its name and targets.
  ASSERT_EQ(run.groups.size(), 1u);
  EXPECT_EQ(run.groups.at("W4A16").at("targets"), json::array({"Linear"}));
  EXPECT_EQ(run.groups.at("W4A16").at("weights").at("observer"), "refit");
  EXPECT_EQ(run.report.at("observer_choice").at("modules_using_refit"),
            run.report.at("observer_choice").at("modules"));
}

TEST(ObserverAuto, Nvfp4MeasuresTheExpandedSearchAgainstTheLibrarysOutputs) {
  TempDir tmp;
  const AutoRun run = run_auto(tmp, "llama-bf16-nvfp4a16", {"--scheme", "NVFP4A16"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const test::CommandResult refit_run = test::run_ctquant(quantize_args(
      tmp, "llama-bf16-nvfp4a16", "refit", {"--scheme", "NVFP4A16", "--observer", "refit"}));
  ASSERT_EQ(refit_run.exit_code, 0) << refit_run.err;
  // The global scale of q/k/v and gate/up comes from the set's observer.
  const std::set<std::string> kept = expect_choice_follows_errors(
      run, tmp / "out", expected("llama-bf16-nvfp4a16"), expected("llama-bf16-nvfp4a16-mse"),
      tmp / "refit", "llama-bf16-nvfp4a16", "nvfp4_expanded_mse");
  EXPECT_FALSE(kept.empty());
}

TEST(ObserverAuto, ConfigGroupsNameTheirModulesAndReloadThroughVerify) {
  TempDir tmp;
  const AutoRun run = run_auto(tmp, "llama-bf16", concat(kKwargs, kRefitAsMinMax));
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  // One group per observer, each naming exactly its modules.
  ASSERT_EQ(run.groups.size(), 2u) << run.groups.dump();
  const json& minmax = run.groups.at("W4A16");
  const json& mse = run.groups.at("W4A16_memoryless_mse");
  EXPECT_EQ(minmax.at("weights").at("observer"), "memoryless_minmax");
  EXPECT_EQ(minmax.at("weights").at("observer_kwargs"), json::object());
  EXPECT_EQ(mse.at("weights").at("observer"), "memoryless_mse");
  EXPECT_EQ(mse.at("weights").at("observer_kwargs"),
            json({{"norm", 1.5}, {"maxshrink", 0.5}}));
  json other = mse.at("weights");
  other["observer"] = "memoryless_minmax";
  other["observer_kwargs"] = json::object();
  EXPECT_EQ(other, minmax.at("weights")) << "the groups differ in the observer only";
  std::set<std::string> want_minmax;
  std::set<std::string> want_mse;
  for (const json& m : run.report.at("observer_choice").at("per_module")) {
    (m.at("observer") == "memoryless_mse" ? want_mse : want_minmax).insert(m.at("module"));
    EXPECT_EQ(m.at("scheme"),
              m.at("observer") == "memoryless_mse" ? "W4A16_memoryless_mse" : "W4A16");
  }
  EXPECT_EQ(minmax.at("targets").get<std::set<std::string>>(), want_minmax);
  EXPECT_EQ(mse.at("targets").get<std::set<std::string>>(), want_mse);
  // The written config plans INPUT to the same bytes.
  const test::CommandResult v = test::run_ctquant(
      {"verify", (tmp / "out").string(), (test::golden_dir() / "llama-bf16" / "input").string(),
       "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  // And the run's figures are what inspect --errors measures on OUTPUT.
  const CheckpointErrors e =
      checkpoint_errors(tmp / "out", test::golden_dir() / "llama-bf16" / "input");
  const json& modules = run.report.at("weight_error").at("modules");
  ASSERT_EQ(modules.size(), e.modules.size());
  for (std::size_t i = 0; i < e.modules.size(); ++i) {
    EXPECT_EQ(modules[i].at("rel_frobenius").get<double>(), e.modules[i].error.rel_frobenius());
  }
}

TEST(ObserverAuto, ModulesOfThreeObserversSplitIntoThreeGroupsThatVerify) {
  // Each layer's choice set by hand: layer 0's attention min-max, its MLP
  // the MSE observer, layer 1 refit. The kwargs go to the observer that
  // takes each.
  TempDir tmp;
  const fs::path input = test::golden_dir() / "llama-bf16" / "input";
  QuantizeOptions options = test::test_options(input, tmp / "out");
  options.plan.ignore = {"lm_head", "model.embed_tokens"};
  options.plan.default_ignore = false;
  const Checkpoint ckpt = open_checkpoint(input);
  const QuantizePlan plan = make_plan(ckpt, options.plan);
  ObserverChoices choices;
  for (std::size_t mi = 0; mi < plan.modules.size(); ++mi) {
    if (plan.modules[mi].kind != PlannedModule::Kind::kQuantize) continue;
    ModuleObserverChoice& c = choices.modules.emplace_back();
    c.module = mi;
    c.mse_observer = "memoryless_mse";
    c.refit_measured = true;
    const std::string& name = plan.modules[mi].name;
    c.chosen = name.find("layers.1.") != std::string::npos ? "refit"
               : name.find(".mlp.") != std::string::npos   ? "memoryless_mse"
                                                           : "memoryless_minmax";
  }
  const json kwargs = {{"norm", 2.0}, {"steps", 4}};
  options.plan = split_groups_by_observer(options.plan, plan, choices, kwargs);
  ASSERT_EQ(options.plan.groups.size(), 3u);
  std::map<std::string, const SchemeGroup*> groups;
  for (const SchemeGroup& g : options.plan.groups) groups[g.name] = &g;
  ASSERT_TRUE(groups.contains("W4A16") && groups.contains("W4A16_memoryless_mse") &&
              groups.contains("W4A16_refit"));
  EXPECT_EQ(groups.at("W4A16")->weights.observer, "memoryless_minmax");
  EXPECT_EQ(groups.at("W4A16")->weights.observer_kwargs, json::object());
  EXPECT_EQ(groups.at("W4A16_memoryless_mse")->weights.observer_kwargs, json({{"norm", 2.0}}));
  EXPECT_EQ(groups.at("W4A16_refit")->weights.observer, "refit");
  EXPECT_EQ(groups.at("W4A16_refit")->weights.observer_kwargs, json({{"steps", 4}}));
  EXPECT_EQ(groups.at("W4A16")->targets.size(), 4u);
  EXPECT_EQ(groups.at("W4A16_memoryless_mse")->targets.size(), 3u);
  EXPECT_EQ(groups.at("W4A16_refit")->targets.size(), 7u);
  quantize(options);
  const json written =
      test::read_json(tmp / "out" / "config.json").at("quantization_config").at("config_groups");
  EXPECT_EQ(written.size(), 3u);
  EXPECT_EQ(written.at("W4A16_refit").at("weights").at("observer"), "refit");
  const test::CommandResult v =
      test::run_ctquant({"verify", (tmp / "out").string(), input.string(), "--against-source"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(ObserverAuto, WrittenRecipeReproducesTheChoiceWithoutMeasuring) {
  TempDir tmp;
  std::vector<std::string> extra = {"--write-recipe", (tmp / "recipe.yaml").string()};
  extra.insert(extra.end(), kKwargs.begin(), kKwargs.end());
  extra.insert(extra.end(), kRefitAsMinMax.begin(), kRefitAsMinMax.end());
  const AutoRun run = run_auto(tmp, "llama-bf16", extra);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const std::string recipe = test::read_file(tmp / "recipe.yaml");
  expect_message(recipe, {"W4A16_memoryless_mse", "\"observer\":\"memoryless_mse\"",
                          "model.layers.1.self_attn.o_proj"});
  const test::CommandResult again = test::run_ctquant(
      {"quantize", (test::golden_dir() / "llama-bf16" / "input").string(),
       (tmp / "again").string(), "--recipe", (tmp / "recipe.yaml").string(),
       "--no-default-ignore"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(test::read_file(tmp / "again" / "model.safetensors"),
            test::read_file(tmp / "out" / "model.safetensors"));
  EXPECT_EQ(test::read_json(tmp / "again" / "config.json"),
            test::read_json(tmp / "out" / "config.json"));
}

TEST(ObserverAuto, ReportAndSummarySayWhichModulesChangedAndByHowMuch) {
  TempDir tmp;
  const AutoRun run = run_auto(tmp, "llama-bf16", concat(kKwargs, kRefitAsMinMax));
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const json& c = run.report.at("observer_choice");
  std::size_t using_mse = 0;
  QuantError all_minmax;
  QuantError chosen;
  for (const json& m : c.at("per_module")) {
    const bool uses = m.at("observer") == "memoryless_mse";
    using_mse += uses ? 1 : 0;
  }
  const CheckpointErrors minmax =
      checkpoint_errors(expected("llama-bf16"), test::golden_dir() / "llama-bf16" / "input");
  const CheckpointErrors out =
      checkpoint_errors(tmp / "out", test::golden_dir() / "llama-bf16" / "input");
  for (const ModuleError& e : minmax.modules) all_minmax.add(e.error);
  for (const ModuleError& e : out.modules) chosen.add(e.error);
  EXPECT_EQ(c.at("modules").get<std::size_t>(), c.at("per_module").size());
  EXPECT_EQ(c.at("modules_using_mse").get<std::size_t>(), using_mse);
  EXPECT_EQ(c.at("modules_using_refit").get<std::size_t>(), 0u);
  EXPECT_EQ(c.at("rel_frobenius_minmax").get<double>(), all_minmax.rel_frobenius());
  EXPECT_EQ(c.at("rel_frobenius_chosen").get<double>(), chosen.rel_frobenius());
  EXPECT_EQ(c.at("change").get<double>(), chosen.rel_frobenius() / all_minmax.rel_frobenius() - 1);
  EXPECT_LT(chosen.rel_frobenius(), all_minmax.rel_frobenius());
  expect_message(run.result.err,
                 {fmt::format("--observer auto: {} of {} quantized module(s) use their MSE "
                              "observer's scales, 0 refit's",
                              using_mse, c.at("per_module").size()),
                  "largest reductions", "model.layers.1.self_attn.o_proj"});
  EXPECT_GT(run.report.at("seconds").at("choose_observer").get<double>(), 0.0);
}

TEST(ObserverAuto, DryRunPlansMinMaxAndSaysSo) {
  TempDir tmp;
  const test::CommandResult r = test::run_ctquant(
      {"quantize", (test::golden_dir() / "llama-bf16" / "input").string(),
       (tmp / "out").string(), "--observer", "auto", "--dry-run", "-v"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_message(r.err, {"--observer auto", "dry run does not read the weights"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(ObserverAuto, AutoForOneGroupIsAUsageError) {
  TempDir tmp;
  const test::CommandResult r = test::run_ctquant(
      {"quantize", (test::golden_dir() / "llama-bf16" / "input").string(),
       (tmp / "out").string(), "--scheme-for", "re:.*mlp.*=W4A16@auto"});
  EXPECT_EQ(r.exit_code, 2);
  expect_message(r.err, {"\"auto\"", "--observer auto"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(ObserverAuto, PerTensorScalesAreNotMeasuredAndKeepMinMax) {
  TempDir tmp;
  // The llama-bf16-fp8-tensor case's config: FP8 weights, one scale per tensor.
  test::write_file(tmp / "fp8-tensor.json", R"({"config_groups": {"config_group_0": {
      "targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true,
                  "dynamic": false},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                            "symmetric": true, "dynamic": true}}}})");
  const AutoRun run = run_auto(tmp, "llama-bf16",
                               {"--quantization-config", (tmp / "fp8-tensor.json").string()});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const json& c = run.report.at("observer_choice");
  EXPECT_EQ(c.at("modules_using_mse"), 0);
  for (const json& m : c.at("per_module")) {
    EXPECT_TRUE(m.at("mse_observer").is_null());
    EXPECT_EQ(m.at("observer"), "memoryless_minmax");
    expect_message(m.at("not_measured").get<std::string>(), {"one scale per tensor"});
    expect_message(m.at("refit_not_measured").get<std::string>(), {"one scale per tensor"});
  }
  ASSERT_EQ(run.groups.size(), 1u);
  EXPECT_EQ(run.groups.begin()->at("weights").at("observer"), "memoryless_minmax");
}

// expand=10 makes every candidate range 8.1x the min-max range: a
// warning, which --strict makes stop the run as it does lint warnings.
TEST(ObserverKwargs, StrictMakesTheExpandWarningStopTheRunAndWriteNothing) {
  TempDir tmp;
  const std::string in = (test::golden_dir() / "llama-bf16" / "input").string();
  const std::vector<std::string> args = {
      "quantize",         in,         (tmp / "out").string(), "--observer", "memoryless_mse",
      "--observer-kwarg", "expand=10"};
  std::vector<std::string> strict = args;
  strict.push_back("--strict");
  const test::CommandResult r = test::run_ctquant(strict);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"every candidate range of memoryless_mse at least 8.1x the weights' "
                         "min-max range",
                         "--strict makes warnings stop the run, and nothing was written",
                         "run without --strict"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
  const test::CommandResult warned = test::run_ctquant(args);
  EXPECT_EQ(warned.exit_code, 0) << warned.err;
  expect_message(warned.err, {"warning: --observer-kwarg: observer_kwargs make every candidate"});
}

}  // namespace
}  // namespace ctquant
