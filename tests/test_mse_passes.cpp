// The MSE observer's passes in the executor: the ranges the cutoff pre-pass
// chose for a chunk are taken by the chunk's amax and quantize jobs when
// the module's search runs to its last candidate, and the chunk is searched
// again when patience stops the search earlier; the bytes are the same
// either way, and the library's (ExecuteStats::mse_rows counts the rows each
// pass searched or took).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/exec/executor.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

struct MseRun {
  ExecuteStats::MseRows searched;
  std::uint64_t rows = 0;  // rows of the modules quantized with an MSE observer
};

// Executes the plan of `options` on input into out (created), without lint
// (a module quantized alone splits its fused set).
MseRun execute(const fs::path& input, const PlanOptions& options, const fs::path& out,
               unsigned threads, std::uint64_t chunk_bytes, bool reuse,
               std::uint64_t band_bytes = ExecuteOptions{}.fp8_band_bytes) {
  const Checkpoint ckpt = open_checkpoint(input);
  const QuantizePlan plan = make_plan(ckpt, options);
  ExecuteOptions exec;
  exec.threads = threads;
  exec.chunk_bytes = chunk_bytes;
  exec.fp8_band_bytes = band_bytes;
  exec.fsync = false;
  exec.reuse_searched_ranges = reuse;
  fs::create_directories(out);
  MseRun run;
  run.searched = execute_plan(ckpt, plan, out, exec).mse_rows;
  for (const PlannedModule& m : plan.modules) {
    if (m.kind == PlannedModule::Kind::kQuantize &&
        is_mse_observer(plan.group_of(m).weights.observer)) {
      run.rows += m.source.rows;
    }
  }
  return run;
}

// The Linear modules of layer 0 of the golden llama inputs.
const std::vector<std::string>& layer0_modules() {
  static const std::vector<std::string> names{
      "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
      "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.o_proj",
      "model.layers.0.mlp.gate_proj",    "model.layers.0.mlp.up_proj",
      "model.layers.0.mlp.down_proj"};
  return names;
}

// A golden case's plan with only `module` of layer 0 quantized.
PlanOptions only_module(const test::GoldenCase& c, const std::string& module) {
  PlanOptions options = test::plan_of(c);
  for (const std::string& other : layer0_modules()) {
    if (other != module) options.ignore.push_back(other);
  }
  return options;
}

// "" when every tensor of `module` in the expected output is in `out` with
// the same bytes, else the first that is not.
std::string module_differs(const fs::path& out, const fs::path& expected,
                           const std::string& module) {
  const fs::path file = expected / "model.safetensors";
  const SafetensorsFile f(file, file.filename().string());
  std::size_t compared = 0;
  for (const TensorEntry& t : f.header().tensors) {
    if (!t.name.starts_with(module + ".")) continue;
    ++compared;
    if (test::read_tensor(out / "model.safetensors", t.name) != test::read_tensor(file, t.name)) {
      return t.name + " differs from the expected one";
    }
  }
  return compared > 0 ? "" : "no tensor of " + module + " is expected";
}

// llama-bf16-mse-kwargs (patience 2, 18 candidates): the search of down_proj
// runs to the last candidate, so every chunk the pre-pass searched (here,
// with 8 rows a chunk, all of them: the cutoff never settles before the last
// one) is searched once; q_proj's stops earlier, so each chunk is searched
// again up to the cutoff. Both are the library's bytes.
TEST(MsePasses, ChunksThePrePassSearchedAreSearchedOnceWhenTheSearchRunsToTheLastCandidate) {
  const test::GoldenCase c = test::find_case("llama-bf16-mse-kwargs");
  const std::string module = "model.layers.0.mlp.down_proj";
  for (const unsigned threads : {1u, 2u}) {
    SCOPED_TRACE(threads);
    TempDir tmp;
    const MseRun run = execute(test::input_of(c), only_module(c, module), tmp / "on", threads,
                               2048, true);
    EXPECT_EQ(run.rows, 128u);
    EXPECT_EQ(run.searched.cutoff, run.rows);
    EXPECT_EQ(run.searched.quantize, 0u);
    EXPECT_EQ(run.searched.reused_quantize, run.rows);
    EXPECT_EQ(module_differs(tmp / "on", test::expected_of(c), module), "");

    const MseRun again = execute(test::input_of(c), only_module(c, module), tmp / "off", threads,
                                 2048, false);
    EXPECT_EQ(again.searched.cutoff, run.rows);
    EXPECT_EQ(again.searched.quantize, run.rows);
    EXPECT_EQ(again.searched.reused_quantize, 0u);
    EXPECT_EQ(test::diff_bytes(tmp / "on", tmp / "off"), "");
  }
}

TEST(MsePasses, ChunksOfAModuleWhoseSearchStopsEarlyAreSearchedAgain) {
  for (const char* name : {"llama-bf16-mse-kwargs", "llama-bf16-mse-patience"}) {
    SCOPED_TRACE(name);
    const test::GoldenCase c = test::find_case(name);
    const std::string module = "model.layers.0.self_attn.q_proj";
    TempDir tmp;
    const MseRun run = execute(test::input_of(c), only_module(c, module), tmp / "out", 2, 2048,
                               true);
    EXPECT_EQ(run.rows, 128u);
    EXPECT_EQ(run.searched.cutoff, run.rows);
    EXPECT_EQ(run.searched.quantize, run.rows);
    EXPECT_EQ(run.searched.reused_quantize, 0u);
    EXPECT_EQ(module_differs(tmp / "out", test::expected_of(c), module), "");
  }
}

// With the default patience the cutoff settles after the first chunks:
// only those are handed on, the rest are searched by their quantize jobs.
TEST(MsePasses, ChunksSearchedBeforeTheCutoffSettledAreHandedOn) {
  const test::GoldenCase c = test::find_case("llama-bf16-mse");
  TempDir tmp;
  const MseRun run = execute(test::input_of(c), test::plan_of(c), tmp / "out", 1, 2048, true);
  EXPECT_GT(run.searched.cutoff, 0u);
  EXPECT_LT(run.searched.cutoff, run.rows / 4);
  EXPECT_EQ(run.searched.reused_quantize, run.searched.cutoff);
  EXPECT_EQ(run.searched.quantize + run.searched.reused_quantize, run.rows);
  EXPECT_EQ(test::diff_golden(tmp / "out", test::expected_of(c), c.by_library), "");
}

// Every golden case with an MSE observer, in chunks of 8 rows or fewer
// (the kept ranges outgrow their budget of one chunk's bytes, so later
// chunks are searched again), on two threads: the library's tensors with
// and without handing the ranges on, and every row of the quantize pass
// either searched or handed on once.
TEST(MsePasses, EveryMseGoldenCaseIsTheLibrarysWithAndWithoutHandingOn) {
  std::size_t cases = 0;
  for (const test::GoldenCase& c : test::golden_cases()) {
    if (c.name.find("mse") == std::string::npos) continue;
    SCOPED_TRACE(c.name);
    ++cases;
    TempDir tmp;
    const MseRun on = execute(test::input_of(c), test::plan_of(c), tmp / "on", 2, 2048, true);
    const MseRun off = execute(test::input_of(c), test::plan_of(c), tmp / "off", 2, 2048, false);
    EXPECT_GT(on.rows, 0u);
    EXPECT_EQ(on.searched.quantize + on.searched.reused_quantize, on.rows);
    EXPECT_LE(on.searched.reused_quantize, on.searched.cutoff);
    EXPECT_EQ(off.searched.quantize, off.rows);
    EXPECT_EQ(off.searched.reused_quantize + off.searched.reused_amax, 0u);
    EXPECT_EQ(test::diff_golden(tmp / "on", test::expected_of(c), c.by_library), "");
    EXPECT_EQ(test::diff_bytes(tmp / "on", tmp / "off"), "");
  }
  EXPECT_GE(cases, 12u);
}

// The kept ranges take at most one chunk's bytes: in chunks of 8 rows the
// budget runs out before every chunk of up_proj and down_proj (the two
// modules of llama-bf16-mse-kwargs whose search runs to the last
// candidate) is kept; with each module one chunk, all of them are.
TEST(MsePasses, KeptRangesTakeAtMostOneChunksBytes) {
  const test::GoldenCase c = test::find_case("llama-bf16-mse-kwargs");
  const std::uint64_t to_the_end = 256 + 128;  // rows of up_proj and down_proj
  TempDir tmp;
  const MseRun small = execute(test::input_of(c), test::plan_of(c), tmp / "small", 1, 2048, true);
  EXPECT_LE(small.searched.kept_bytes, 2048u);
  EXPECT_GT(small.searched.kept_bytes, 0u);
  EXPECT_GT(small.searched.reused_quantize, 0u);
  EXPECT_LT(small.searched.reused_quantize, to_the_end);
  const MseRun whole = execute(test::input_of(c), test::plan_of(c), tmp / "whole", 1, 1u << 20, true);
  EXPECT_EQ(whole.searched.reused_quantize, to_the_end);
  EXPECT_EQ(whole.searched.quantize, whole.rows - to_the_end);
  EXPECT_EQ(test::diff_bytes(tmp / "small", tmp / "whole"), "");
}

// NVFP4 with memoryless_mse (patience 5): the amax pre-pass, which takes
// the largest chosen range for the global scale, takes the ranges the
// cutoff pre-pass kept too. No library output of this pairing exists; the
// bytes are those of the run that searches every pass again.
TEST(MsePasses, AmaxPrePassTakesTheCutoffPrePassRanges) {
  const test::GoldenCase c = test::find_case("llama-bf16-nvfp4a16-mse");
  PlanOptions options = test::plan_of(c);
  options.groups.front().weights.observer = "memoryless_mse";
  options.groups.front().weights.observer_kwargs = nullptr;
  TempDir tmp;
  const MseRun on = execute(test::input_of(c), options, tmp / "on", 2, 4u << 20, true);
  const MseRun off = execute(test::input_of(c), options, tmp / "off", 2, 4u << 20, false);
  EXPECT_GT(on.searched.reused_amax, 0u);
  EXPECT_EQ(on.searched.amax + on.searched.reused_amax, on.rows);
  EXPECT_EQ(on.searched.quantize + on.searched.reused_quantize, on.rows);
  EXPECT_EQ(on.searched.reused_amax, on.searched.reused_quantize);
  EXPECT_EQ(off.searched.amax, off.rows);
  EXPECT_EQ(test::diff_bytes(tmp / "on", tmp / "off"), "");
}

// An FP8 chunk is quantized band by band: each band takes its part of the
// ranges the pre-pass chose for the whole chunk (read and dequantized at
// once).
TEST(MsePasses, Fp8BandsTakeTheirPartOfTheChunksRanges) {
  const test::GoldenCase c = test::find_case("fp8-block");
  PlanOptions options;
  options.groups = {preset_group("W4A16")};
  test::set_group_size(options, 64);
  options.groups.front().weights.observer = "memoryless_mse";
  options.ignore = c.ignore;
  TempDir tmp;
  // 32 rows a chunk, 4 a band.
  const MseRun on = execute(test::input_of(c), options, tmp / "on", 2, 32 * 640, true, 4 * 512);
  const MseRun off = execute(test::input_of(c), options, tmp / "off", 2, 32 * 640, false, 4 * 512);
  EXPECT_GT(on.searched.reused_quantize, 0u);
  EXPECT_EQ(on.searched.quantize + on.searched.reused_quantize, on.rows);
  EXPECT_EQ(off.searched.quantize, off.rows);
  EXPECT_EQ(test::diff_bytes(tmp / "on", tmp / "off"), "");
}

}  // namespace
}  // namespace ctquant
