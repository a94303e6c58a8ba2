// inspect: the inventory of a checkpoint, the plan as text and JSON, the
// expected output size, and the inspect / quantize --dry-run CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/job/quantize.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "fake_checkpoint.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::FakeSpec;

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

fs::path dflash_input() { return test::golden_dir() / "dflash-bf16-sharded" / "input"; }
const std::vector<std::string> kDFlashIgnore = {"re:.*qkv_proj$", "re:.*g_proj$"};

TEST(InspectInventory, ShardedDraftTotals) {
  const Inventory inv = make_inventory(open_checkpoint(dflash_input()));
  EXPECT_TRUE(inv.has_index);
  ASSERT_EQ(inv.shards.size(), 2u);
  EXPECT_EQ(inv.shards[0].file, "model-00001-of-00002.safetensors");
  EXPECT_EQ(inv.shards[0].tensors, 13u);
  EXPECT_EQ(inv.shards[1].tensors, 13u);
  ASSERT_EQ(inv.tensors.size(), 26u);
  EXPECT_EQ(inv.tensors[0].name, "aux_hidden_norms.0.weight");
  EXPECT_EQ(inv.tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(inv.tensors[0].shape, std::vector<std::uint64_t>{256});
  EXPECT_EQ(inv.tensors[0].bytes, 512u);
  EXPECT_EQ(inv.tensors[0].shard, "model-00001-of-00002.safetensors");
  EXPECT_EQ(inv.tensors.back().name, "norm.weight");
  ASSERT_EQ(inv.by_dtype.size(), 1u);
  EXPECT_EQ(inv.by_dtype[0].dtype, DType::kBF16);
  EXPECT_EQ(inv.by_dtype[0].tensors, 26u);
  EXPECT_EQ(inv.by_dtype[0].bytes, 2630656u);
  EXPECT_EQ(inv.by_dtype[0].elements, 1315328u);
  EXPECT_EQ(inv.elements, 1315328u);
  EXPECT_EQ(inv.architectures, std::vector<std::string>{"DFlashLagunaForCausalLM"});
  EXPECT_EQ(inv.model_type, "laguna");
  EXPECT_FALSE(inv.quantization_config.has_value());
  EXPECT_EQ(inv.other_files,
            (std::vector<std::string>{"generation_config.json", "tokenizer_config.json"}));
  const std::string text = render_inventory_text(inv);
  EXPECT_TRUE(contains(text, "architecture: DFlashLagunaForCausalLM (model_type laguna)"));
  EXPECT_TRUE(contains(text, "quantization_config: none"));
  EXPECT_TRUE(contains(text, "total: 26 tensors, 1,315,328 parameters"));
}

TEST(InspectInventory, QuantizedCheckpointShowsItsConfigAndDtypes) {
  const Inventory inv =
      make_inventory(open_checkpoint(test::golden_dir() / "llama-bf16-asym" / "expected"));
  ASSERT_TRUE(inv.quantization_config.has_value());
  EXPECT_EQ((*inv.quantization_config)["format"], "pack-quantized");
  ASSERT_EQ(inv.by_dtype.size(), 3u);
  EXPECT_EQ(inv.by_dtype[0].dtype, DType::kBF16);
  EXPECT_EQ(inv.by_dtype[1].dtype, DType::kI32);
  EXPECT_EQ(inv.by_dtype[1].tensors, 14u);  // weight_packed and weight_zero_point of 7 modules
  EXPECT_EQ(inv.by_dtype[2].dtype, DType::kI64);
  EXPECT_EQ(inv.by_dtype[2].tensors, 7u);
  EXPECT_EQ(inv.by_dtype[2].bytes, 7u * 16u);
  const json j = inventory_json(inv);
  EXPECT_EQ(j["by_dtype"]["I64"]["tensors"], 7);
  EXPECT_EQ(j["quantization_config"]["quant_method"], "compressed-tensors");
}

InspectReport inspect_layout(const test::TempDir& dir, const std::vector<FakeSpec>& specs,
                             std::vector<std::string> ignore) {
  test::write_sparse_checkpoint(dir.path(), specs, json{{"architectures", {"X"}}});
  InspectOptions options;
  options.plan = true;
  options.plan_options.ignore = std::move(ignore);
  return inspect_checkpoint(dir.path(), options);
}

TEST(InspectPlan, MixtralLayerIgnoreEntryCounts) {
  test::TempDir dir;
  const InspectReport r =
      inspect_layout(dir,
                     {{"model.layers.0.block_sparse_moe.gate.weight", {8, 4096}},
                      {"model.layers.0.block_sparse_moe.experts.0.w1.weight", {14336, 4096}},
                      {"model.layers.0.block_sparse_moe.experts.0.w2.weight", {4096, 14336}},
                      {"model.layers.0.block_sparse_moe.experts.0.w3.weight", {14336, 4096}}},
                     {"lm_head", "re:.*gate"});
  const std::string text = render_plan_text(r.checkpoint, *r.plan);
  EXPECT_TRUE(contains(text, "\n  lm_head: 0 modules\n"));
  EXPECT_TRUE(
      contains(text, "\n  re:.*gate: 1 module\n    model.layers.0.block_sparse_moe.gate\n"));
  EXPECT_TRUE(contains(text, "tensors (4): 3 quantize, 1 copy\n"));
}

TEST(InspectPlan, LlamaLayerShowsGateProjTakenByGateRegex) {
  test::TempDir dir;
  const InspectReport r = inspect_layout(dir,
                                         {{"model.layers.0.mlp.gate_proj.weight", {5632, 2048}},
                                          {"model.layers.0.mlp.up_proj.weight", {5632, 2048}},
                                          {"model.layers.0.mlp.down_proj.weight", {2048, 5632}}},
                                         {"lm_head", "re:.*gate"});
  const std::string text = render_plan_text(r.checkpoint, *r.plan);
  EXPECT_TRUE(contains(text, "\n  re:.*gate: 1 module\n    model.layers.0.mlp.gate_proj\n"));
  EXPECT_TRUE(contains(text, "  copy      model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(contains(text, "ignored by 're:.*gate'\n"));
  // inspect's text carries the lint findings after the plan.
  const std::string all = render_inspect_text(r);
  // L1 for lm_head, L3 for the split gate/up, L8 for the prefix match, L15
  // for a third of the layer kept in 16 bits.
  EXPECT_TRUE(contains(all, "lint: 1 error, 2 warnings, 1 info\n")) << all;
  EXPECT_TRUE(contains(all, "L3 error: fused layer gate_up_proj"));
  EXPECT_TRUE(contains(all, "L15 warning: 66.7% of the linear layers' weight parameters")) << all;
}

TEST(InspectPlan, JsonListsFatesRulesAndMatches) {
  InspectOptions options;
  options.plan = true;
  options.plan_options.ignore = kDFlashIgnore;
  const InspectReport r = inspect_checkpoint(dflash_input(), options);
  const json j = inspect_json(r);
  const json& plan = j["plan"];
  EXPECT_EQ(plan["counts"]["quantize"], 9);
  EXPECT_EQ(plan["counts"]["copy"], 17);
  EXPECT_EQ(plan["tensors"].size(), 26u);
  bool found = false;
  for (const json& t : plan["tensors"]) {
    if (t["name"] != "layers.1.self_attn.qkv_proj.weight") continue;
    found = true;
    EXPECT_EQ(t["fate"], "copy");
    EXPECT_EQ(t["rule"], "ignored by 're:.*qkv_proj$'");
    EXPECT_EQ(t["ignore_entry"], "re:.*qkv_proj$");
    EXPECT_EQ(t["shard"], "model-00002-of-00002.safetensors");
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(plan["ignore"][1]["entry"], "re:.*g_proj$");
  EXPECT_EQ(plan["ignore"][1]["modules"],
            json({"layers.0.self_attn.g_proj", "layers.1.self_attn.g_proj"}));
  EXPECT_EQ(plan["groups"][0]["targets"][0]["modules"].size(), 13u);
  EXPECT_EQ(plan["outputs"].size(), 2u);
  // fc is packed: L16 says what each engine does with it.
  ASSERT_TRUE(j["lint"].is_array());
  ASSERT_EQ(j["lint"].size(), 1u) << j["lint"].dump();
  EXPECT_EQ(j["lint"][0]["id"], "L16");
  EXPECT_EQ(j["lint"][0]["tensors"], json({"fc.weight"}));
}

TEST(InspectPlan, ExpectedOutputSizeIsWhatQuantizeWrites) {
  test::TempDir dir;
  QuantizeOptions o = default_quantize_options();
  o.input = dflash_input();
  o.output = dir / "out";
  o.plan.ignore = kDFlashIgnore;
  o.threads = 2;
  o.fsync = false;
  std::uint64_t expected = 0;
  o.on_plan = [&](const Checkpoint& c, const QuantizePlan& p, const std::vector<Finding>&) {
    expected = expected_output_bytes(c, p);
  };
  const QuantizeSummary s = quantize(o);
  std::uint64_t written = 0;
  for (const auto& item : fs::directory_iterator(dir / "out")) written += item.file_size();
  EXPECT_EQ(expected, written);
  EXPECT_EQ(s.bytes_out, written);
  o.dry_run = true;
  o.output = dir / "dry";
  EXPECT_EQ(quantize(o).bytes_out, written);
  EXPECT_FALSE(fs::exists(dir / "dry"));
}

TEST(InspectCli, DryRunPrintsThePlanAndWritesNothing) {
  test::TempDir dir;
  const auto r =
      test::run_ctquant({"quantize", dflash_input().string(), (dir / "out").string(), "--dry-run",
                         "--ignore", kDFlashIgnore[0], "--ignore", kDFlashIgnore[1]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(
      r.out.starts_with("plan: W4A16 (4-bit int, symmetric, group size 128; pack-quantized)"));
  // The entries are the draft's defaults: each says why.
  EXPECT_TRUE(contains(r.out,
                       "\n  re:.*qkv_proj$: 2 modules (default)\n    why: DFlash qkv_proj: "
                       "vLLM builds the context-KV buffer by reading qkv_proj.weight "
                       "directly"))
      << r.out;
  EXPECT_TRUE(contains(r.out,
                       "[vllm/model_executor/models/qwen3_dflash.py@036a00d1]\n"
                       "    layers.0.self_attn.qkv_proj\n"))
      << r.out;
  EXPECT_TRUE(contains(r.out,
                       "roles: DFlash draft (vllm/model_executor/models/qwen3_dflash.py@"
                       "036a00d1)\n"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "  quantize  fc.weight"));
  EXPECT_TRUE(contains(r.out, "expected output size: "));
  EXPECT_FALSE(contains(r.out, "ctquant:"));  // logs stay on stderr
  EXPECT_TRUE(contains(r.err, "dry run: 9 tensors quantized"));
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// NVFP4: fused partners share one global scale, and the plan says which
// (docs/schemes.md section 7); split experts each keep their own. The
// global scales of llama-bf16-nvfp4a16's expected output are the proof:
// q/k/v hold one value, gate/up another.
TEST(InspectPlan, Nvfp4ShowsWhichModulesShareAGlobalScale) {
  const test::GoldenCase llama = test::find_case("llama-bf16-nvfp4a16");
  const Checkpoint checkpoint = open_checkpoint(test::input_of(llama));
  const QuantizePlan plan = make_plan(checkpoint, test::plan_of(llama));
  const std::string text = render_plan_text(checkpoint, plan);
  EXPECT_TRUE(contains(text,
                       "scales from max |w| taken before quantizing (NVFP4 global scales, "
                       "per-tensor FP8 scales): 2 sets of fused partners that share one "
                       "(docs/schemes.md section 7), 2 modules with their own\n"
                       "  model.layers.0.self_attn.{q_proj, k_proj, v_proj}\n"
                       "  model.layers.0.mlp.{gate_proj, up_proj}\n"))
      << text;
  const json sets = plan_json(checkpoint, plan).at("amax_sets");
  EXPECT_TRUE(std::find(sets.begin(), sets.end(),
                        json({"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                              "model.layers.0.self_attn.v_proj"})) != sets.end())
      << sets.dump();
  EXPECT_TRUE(std::find(sets.begin(), sets.end(), json({"model.layers.0.mlp.down_proj"})) !=
              sets.end())
      << sets.dump();
  EXPECT_EQ(sets.size(), 4u) << sets.dump();

  // Split experts: none shares, q/k/v still do.
  const test::GoldenCase moe = test::find_case("qwen3moe-fused-bf16-nvfp4a16");
  const Checkpoint moe_checkpoint = open_checkpoint(test::input_of(moe));
  const QuantizePlan moe_plan = make_plan(moe_checkpoint, test::plan_of(moe));
  // The JSON is held in a local: a range-for over a member of a temporary would dangle.
  const json moe_sets = plan_json(moe_checkpoint, moe_plan).at("amax_sets");
  std::size_t moe_shared = 0;
  for (const json& set : moe_sets) {
    if (set.size() > 1) {
      ++moe_shared;
      for (const json& name : set) {
        EXPECT_FALSE(contains(name.get<std::string>(), ".experts.")) << set.dump();
      }
    }
  }
  EXPECT_GT(moe_shared, 0u) << moe_sets.dump();
  EXPECT_TRUE(contains(render_plan_text(moe_checkpoint, moe_plan),
                       ".self_attn.{q_proj, k_proj, "
                       "v_proj}\n"));

  // A scheme without a pre-pass says nothing of it.
  const test::GoldenCase w4 = test::find_case("llama-bf16");
  const Checkpoint w4_checkpoint = open_checkpoint(test::input_of(w4));
  const QuantizePlan w4_plan = make_plan(w4_checkpoint, test::plan_of(w4));
  EXPECT_FALSE(contains(render_plan_text(w4_checkpoint, w4_plan), "max |w|"));
  EXPECT_EQ(plan_json(w4_checkpoint, w4_plan).at("amax_sets"), json::array());
}

// The dry run's plan ends with the lint count, as inspect's does; the
// findings themselves are on stderr.
TEST(InspectCli, DryRunEndsWithTheLintCount) {
  test::TempDir dir;
  // The draft's defaults: fc is packed, which L16 reports (what each engine
  // does with it).
  const auto defaults =
      test::run_ctquant({"quantize", dflash_input().string(), (dir / "out").string(), "--dry-run"});
  ASSERT_EQ(defaults.exit_code, 0) << defaults.err;
  EXPECT_TRUE(defaults.out.ends_with("lint: 0 errors, 1 warning, 0 info (each on stderr)\n"))
      << defaults.out;
  EXPECT_TRUE(contains(defaults.err, "L16")) << defaults.err;
  const auto warned =
      test::run_ctquant({"quantize", dflash_input().string(), (dir / "out").string(), "--dry-run",
                         "--ignore", "no_such_module"});
  ASSERT_EQ(warned.exit_code, 0) << warned.err;
  EXPECT_TRUE(contains(warned.out, "\nlint: 0 errors, 2 warnings, ")) << warned.out;
  EXPECT_TRUE(contains(warned.out, "info (each on stderr)\n")) << warned.out;
  EXPECT_TRUE(contains(warned.err, "L1")) << warned.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(InspectCli, DryRunStoppedByLintStillPrintsThePlan) {
  test::TempDir dir;
  const auto r = test::run_ctquant({"quantize", dflash_input().string(), (dir / "out").string(),
                                    "--dry-run", "--no-default-ignore"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.starts_with("plan: "));
  EXPECT_TRUE(contains(r.out, "  quantize  layers.0.self_attn.qkv_proj.weight"));
  EXPECT_TRUE(contains(r.err, "L4 error"));
  // The roles and the options say that the defaults were not applied.
  EXPECT_TRUE(contains(r.out,
                       "  draft module kept (draft model, kept in 16 bits by default; not "
                       "with --no-default-ignore): 4\n"))
      << r.out;
  EXPECT_TRUE(contains(r.out,
                       "  ignore        none given, and no module role's default "
                       "(--no-default-ignore)\n"))
      << r.out;
}

// A plan the input does not allow (in_features 256 of the draft's tensors is
// not a multiple of group size 96): the inventory is still printed, then the
// reason, and the exit status is 1.
TEST(InspectCli, PlanThatCannotBeMadeStillPrintsTheInventory) {
  const std::string input = dflash_input().string();
  const auto text = test::run_ctquant({"inspect", input, "--group-size", "96"});
  EXPECT_EQ(text.exit_code, 1) << text.err;
  EXPECT_TRUE(contains(text.out, "tensors (26):")) << text.out;
  EXPECT_TRUE(contains(text.out, "plan: cannot be made: ")) << text.out;
  EXPECT_TRUE(contains(text.out, "not a multiple of the group size 96")) << text.out;
  EXPECT_TRUE(contains(text.err, "ctquant: error: ")) << text.err;

  const auto as_json = test::run_ctquant({"inspect", input, "--group-size", "96", "--json"});
  EXPECT_EQ(as_json.exit_code, 1);
  const json j = json::parse(as_json.out);
  EXPECT_EQ(j["inventory"]["tensors"].size(), 26u);
  EXPECT_TRUE(j["plan"].is_null());
  EXPECT_TRUE(contains(j["plan_error"].get<std::string>(), "group size 96"));
}

TEST(InspectCli, InventoryPlanAndJson) {
  const std::string input = dflash_input().string();
  const auto plain = test::run_ctquant({"inspect", input});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_TRUE(contains(plain.out, "tensors (26):"));
  EXPECT_FALSE(contains(plain.out, "plan: "));

  const auto as_json = test::run_ctquant({"inspect", input, "--json"});
  EXPECT_EQ(as_json.exit_code, 0);
  const json j = json::parse(as_json.out);
  EXPECT_EQ(j["inventory"]["tensors"].size(), 26u);
  EXPECT_TRUE(j["plan"].is_null());

  // Any quantize option (or --plan) adds the plan and lint; lint never fails inspect.
  const auto planned = test::run_ctquant(
      {"inspect", input, "--no-default-ignore", "--ignore", "re:.*qkv_proj$", "--json"});
  EXPECT_EQ(planned.exit_code, 0);
  const json p = json::parse(planned.out);
  ASSERT_EQ(p["lint"].size(), 2u);
  EXPECT_EQ(p["lint"][0]["id"], "L5");
  EXPECT_EQ(p["lint"][0]["tensors"],
            json({"layers.0.self_attn.g_proj.weight", "layers.1.self_attn.g_proj.weight"}));
  EXPECT_EQ(p["lint"][1]["id"], "L16");  // fc packed: what each engine does with it
  EXPECT_EQ(p["plan"]["roles"]["family"], "DFlash draft");
  EXPECT_EQ(p["plan"]["ignore"][0]["default"], false);

  const auto defaults = test::run_ctquant({"inspect", input, "--plan"});
  EXPECT_EQ(defaults.exit_code, 0);
  EXPECT_TRUE(contains(defaults.out, "\nplan: W4A16"));
  EXPECT_TRUE(contains(defaults.out, "ignore ['re:.*qkv_proj$', 're:.*g_proj$']"));
  EXPECT_TRUE(contains(defaults.out, "lint: 0 errors, 1 warning, 0 info\nL16 warning: DFlash fc"))
      << defaults.out;
  const auto without = test::run_ctquant({"inspect", input, "--no-default-ignore"});
  EXPECT_EQ(without.exit_code, 0);
  EXPECT_TRUE(contains(without.out, "L4 error: DFlash draft"));

  EXPECT_EQ(test::run_ctquant({"inspect", input + "-missing"}).exit_code, 1);
}

}  // namespace
}  // namespace ctquant
