// The ctquant binary: exit codes (docs/cli.md: 0 ok, 1 failure, 2 usage),
// the key lines of stderr, and that stdout stays empty for quantize.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A small checkpoint: two quantizable weights, lm_head and a norm.
void write_small_checkpoint(const fs::path& dir) {
  write_checkpoint(
      dir, {random_weight("lm_head.weight", DType::kBF16, 8, 128, 1),
            random_weight("model.layers.0.mlp.down_proj.weight", DType::kBF16, 8, 256, 2),
            random_weight("model.layers.0.self_attn.q_proj.weight", DType::kBF16, 16, 128, 3),
            FakeTensor{"model.norm.weight",
                       DType::kBF16,
                       {128},
                       float_bytes(DType::kBF16, std::vector<float>(128, 1.0f))}});
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Cli, QuantizePrintsSummaryOnStderr) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  // ctquant: done: 2 tensors quantized (W4A16), 2 copied; 100.0% of linear weight parameters
  // quantized; 6.9 KiB in, 3.1 KiB out, ratio 2.21x; 0.01 s
  const std::regex summary(
      "ctquant: done: 2 tensors quantized \\(W4A16\\), 2 copied; 100\\.0% of linear weight "
      "parameters quantized; [0-9.]+ (B|KiB|MiB|GiB) in, [0-9.]+ (B|KiB|MiB|GiB) out, ratio "
      "[0-9]+\\.[0-9]{2}x; [0-9]+\\.[0-9]{2} s\n");
  EXPECT_TRUE(std::regex_search(r.err, summary)) << r.err;
  EXPECT_TRUE(fs::exists(tmp / "out" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / "out" / "config.json"));
}

// The summary says what share of the linear weights' parameters was
// quantized; an ignore entry keeping half of them makes it smaller (and L15
// says why on stderr).
TEST(Cli, SummarySaysShareOfLinearWeightsQuantized) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const CommandResult r = run_ctquant(
      {"quantize", (tmp / "in").string(), (tmp / "out").string(), "--ignore", "re:.*down_proj$"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "1 tensors quantized (W4A16), 3 copied; 50.0% of linear weight "
                       "parameters quantized;"))
      << r.err;
  EXPECT_TRUE(contains(r.err,
                       "L15: 50.0% of the linear layers' weight parameters would be "
                       "quantized (2048 of 4096"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "fix: remove the ignore entry 're:.*down_proj$'")) << r.err;
}

TEST(Cli, QuietPrintsNothingOnSuccess) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  for (const char* flag : {"-q", "--quiet"}) {
    const fs::path out = tmp / (std::string("out") + flag);
    const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), out.string(), flag});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "");
    EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  }
}

TEST(Cli, QuietAndVerboseTogetherAreAUsageError) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const CommandResult r =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "-q", "-v"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--quiet excludes --verbose")) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(Cli, VerboseShowsDebugDetail) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const CommandResult r =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "-v"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "ctquant: debug: writing into ")) << r.err;
  EXPECT_TRUE(contains(r.err, ".ctquant-tmp-")) << r.err;
}

// --no-sync skips only the flush: the output bytes are those of a flushed run.
TEST(Cli, NoSyncWritesTheSameBytes) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const CommandResult synced =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "synced").string()});
  const CommandResult unsynced =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "unsynced").string(), "--no-sync"});
  ASSERT_EQ(synced.exit_code, 0) << synced.err;
  ASSERT_EQ(unsynced.exit_code, 0) << unsynced.err;
  for (const char* name : {"model.safetensors", "config.json"}) {
    EXPECT_EQ(read_file(tmp / "unsynced" / name), read_file(tmp / "synced" / name)) << name;
  }
  EXPECT_TRUE(temp_leftovers(tmp.path()).empty());
}

TEST(Cli, HelpAndVersionExitZero) {
  const CommandResult help = run_ctquant({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.out, "quantize")) << help.out;
  const CommandResult quantize_help = run_ctquant({"quantize", "--help"});
  EXPECT_EQ(quantize_help.exit_code, 0);
  for (const char* option : {"--scheme", "--group-size", "--ignore", "--targets", "--threads",
                             "--force", "--dry-run", "--quiet", "--verbose"}) {
    EXPECT_TRUE(contains(quantize_help.out, option)) << option;
  }
  const CommandResult version = run_ctquant({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_TRUE(contains(version.out, "ctquant 0.1.0")) << version.out;
}

// The command table of src/cli/main.cpp drives --help, the unknown-command
// error and the man page: every command it lists (finalize too) has a line
// in --help, a --help of its own and a section in the script help2man makes
// ctquant(1) from; `--list-subcommands` itself stays out of --help.
TEST(Cli, EverySubcommandHasAHelpEntryAndAManPageSection) {
  const CommandResult list = run_ctquant({"--list-subcommands"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "quantize\nfinalize\ninspect\nverify\n");
  const std::vector<std::string> names = {"quantize", "finalize", "inspect", "verify"};
  const CommandResult help = run_ctquant({"--help"});
  ASSERT_EQ(help.exit_code, 0);
  EXPECT_FALSE(contains(help.out, "--list-subcommands")) << help.out;
  const std::string man_help = CTQUANT_MAN_HELP;
  const CommandResult man = man_help.empty() ? CommandResult{} : run_shell("'" + man_help + "'");
  if (!man_help.empty()) {
    ASSERT_EQ(man.exit_code, 0) << man.err;
    EXPECT_TRUE(man.out.starts_with(help.out.substr(0, help.out.find('\n') + 1))) << man.out;
    EXPECT_FALSE(contains(man.out, "Exit status: ")) << man.out;
  }
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::regex listed("\n  " + name + " +[A-Z][^\n]+\n");
    EXPECT_TRUE(std::regex_search(help.out, listed)) << help.out;
    const CommandResult own = run_ctquant({name, "--help"});
    EXPECT_EQ(own.exit_code, 0);
    EXPECT_TRUE(contains(own.out, "ctquant " + name + " [OPTIONS]")) << own.out;
    if (!man_help.empty()) {
      // The section: its title, then the command's help without its first
      // two lines (description, usage) and the exit-status footer.
      const std::size_t body = own.out.find('\n', own.out.find('\n') + 1) + 1;
      const std::string section =
          "\nctquant " + name + ":\n" + own.out.substr(body, own.out.find("Exit status: ") - body);
      EXPECT_TRUE(contains(man.out, section)) << man.out;
    }
  }
  const CommandResult unknown = run_ctquant({"frobnicate"});
  EXPECT_TRUE(contains(unknown.err, "(commands: quantize, finalize, inspect, verify)"))
      << unknown.err;
}

TEST(Cli, UsageErrorsExitTwo) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const std::string in = (tmp / "in").string();
  const std::string out = (tmp / "out").string();
  struct Case {
    std::vector<std::string> args;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{"quantize", in, out, "--bogus"}, "--bogus"},
      {{}, ""},
      {{"frobnicate"},
       "ctquant: error: unknown command 'frobnicate' (commands: quantize, "
       "finalize, inspect, verify)"},
      {{"quantize", in, out, "--threads", "0"}, "ctquant: error: --threads"},
      {{"quantize", in}, "OUTPUT"},
      {{"quantize", in, out, "--threads", "0"}, "--threads"},
      {{"quantize", in, out, "--threads", "many"}, "--threads"},
      {{"quantize", in, out, "--scheme", "W3A16"}, "unknown scheme 'W3A16' (known presets: "},
      {{"quantize", in, out, "--scheme", "FP8"},
       "scheme 'FP8' is not written: FP8 quantizes input activations statically"},
      {{"quantize", in, out, "--scheme", "w4a8"}, "scheme 'w4a8' is not written: it stores"},
      {{"quantize", in, out, "--scheme", "NVFP4"},
       "scheme 'NVFP4' is not written: its FP4 input activations carry a per-tensor global scale"},
      {{"quantize", in, out, "--group-size", "0"}, "--group-size 0: expected a positive number"},
      {{"quantize", in, out, "--group-size", "-2"},
       "--group-size: -2 is out of range: expected a whole number from -1"},
      {{"quantize", in, out, "--group-size", "100000000000000000000"}, "--group-size"},
      {{"quantize", in, out, "--ignore", "lm_head\xff"}, "not valid UTF-8"},
      {{"quantize", in, in}, "is the INPUT"},
      {{"quantize", in, in + "/sub"}, "lies inside INPUT"},
      {{"quantize", in, tmp.path().string(), "--force"}, "contains INPUT"},
  };
  for (const Case& c : cases) {
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    SCOPED_TRACE(joined);
    const CommandResult r = run_ctquant(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, c.fragment)) << r.err;
    EXPECT_FALSE(fs::exists(tmp / "out"));
    EXPECT_FALSE(fs::exists(tmp / "in" / "sub"));
  }
}

// Pattern errors are usage errors found before any file is read, so they
// win over the bad input (in_features 100) of this checkpoint.
TEST(Cli, InvalidIgnorePatternExitsTwoNamingEveryEntry) {
  TempDir tmp;
  write_checkpoint(tmp / "in",
                   {random_weight("model.layers.0.mlp.up_proj.weight", DType::kBF16, 8, 100, 1)});
  const CommandResult r =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "--ignore",
                   "re:.*q_proj$", "--ignore", "re:(unclosed", "--ignore", "re:[z-a]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("ctquant: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err, "--ignore 're:(unclosed': invalid regular expression")) << r.err;
  EXPECT_TRUE(contains(r.err, "--ignore 're:[z-a]': invalid regular expression")) << r.err;
  EXPECT_FALSE(contains(r.err, "re:.*q_proj$")) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(Cli, BadInputExitsOneNamingTheTensor) {
  TempDir tmp;
  write_checkpoint(tmp / "in",
                   {random_weight("model.layers.0.mlp.up_proj.weight", DType::kBF16, 8, 100, 1)});
  const auto before = snapshot_files(tmp / "in");
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  // No blank line before the error when stderr is not a terminal.
  EXPECT_EQ(r.err.rfind("ctquant: info: ", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "\nctquant: error: model.safetensors: tensor "
                       "'model.layers.0.mlp.up_proj.weight' [8, 100] has in_features 100"))
      << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
  EXPECT_EQ(snapshot_files(tmp / "in"), before);

  // The same input goes through once the tensor is ignored (then nothing is
  // left to quantize: lint L9, allowed here) or the group size fits.
  const CommandResult ignored =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "-q", "--ignore",
                   "re:.*up_proj$", "--allow-unloadable"});
  EXPECT_EQ(ignored.exit_code, 0) << ignored.err;
  // Group size 20 divides it, but no vLLM kernel runs it (lint L10): written
  // only when asked for.
  const CommandResult g20 = run_ctquant(
      {"quantize", (tmp / "in").string(), (tmp / "out20").string(), "-q", "--group-size", "20"});
  EXPECT_EQ(g20.exit_code, 1) << g20.err;
  EXPECT_TRUE(contains(g20.err, "L10 error")) << g20.err;
  EXPECT_FALSE(fs::exists(tmp / "out20"));
  const CommandResult g20_allowed =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out20").string(), "-q",
                   "--group-size", "20", "--allow-unloadable"});
  EXPECT_EQ(g20_allowed.exit_code, 0) << g20_allowed.err;
  EXPECT_EQ(read_json(tmp / "out20" / "config.json")["quantization_config"]["config_groups"]
                                                    ["config_group_0"]["weights"]["group_size"],
            20);
}

TEST(Cli, NonFiniteWeightExitsOne) {
  TempDir tmp;
  FakeTensor w = random_weight("model.layers.0.mlp.up_proj.weight", DType::kF32, 4, 128, 1);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(w.data.data() + (2 * 128 + 9) * 4, &inf, 4);
  write_checkpoint(tmp / "in", {w});
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err,
                       "ctquant: error: model.safetensors: tensor "
                       "'model.layers.0.mlp.up_proj.weight': element [2, 9] is inf"))
      << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

TEST(Cli, MissingInputExitsOne) {
  TempDir tmp;
  const CommandResult r =
      run_ctquant({"quantize", (tmp / "nothing").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "ctquant: error: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "nothing: no such file or directory")) << r.err;
}

TEST(Cli, ExistingOutputExitsTwoAndForceReplacesIt) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  write_small_checkpoint(tmp / "out");
  write_file(tmp / "out" / "old.txt", "old");
  const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "already exists (use --force to replace it)")) << r.err;
  EXPECT_TRUE(fs::exists(tmp / "out" / "old.txt"));

  const CommandResult forced =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "--force", "-q"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_FALSE(fs::exists(tmp / "out" / "old.txt"));
  EXPECT_TRUE(fs::exists(tmp / "out" / "model.safetensors"));
}

TEST(Cli, DryRunWritesNothing) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const CommandResult r =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "--dry-run"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "ctquant: dry run: 2 tensors quantized (W4A16), 2 copied; 100.0% "
                       "of linear weight parameters quantized"))
      << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
  EXPECT_EQ(temp_leftovers(tmp.path()), std::vector<std::string>{});
}

// Given --ignore entries replace the default ["lm_head"] and are written to
// config.json unchanged and in order; --targets likewise.
// --ignore adds to the default ignore list (lm_head here) and --targets
// reach config.json; --no-default-ignore starts from nothing, and then the
// output head would be packed: lint L12 stops the run unless
// --allow-unloadable.
TEST(Cli, IgnoreAndTargetsReachConfig) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const CommandResult r = run_ctquant(
      {"quantize", (tmp / "in").string(), (tmp / "out").string(), "-q", "--ignore", "re:.*q_proj$",
       "--ignore", "model.layers.0.mlp.down_proj", "--targets", "Linear", "--allow-unloadable"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], json({"lm_head", "re:.*q_proj$", "model.layers.0.mlp.down_proj"}));
  // Every module is ignored: the group quantizes nothing and is not written.
  EXPECT_EQ(qc["config_groups"], json::object());
  const CommandResult targeted =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "targeted").string(), "-q",
                   "--targets", "model.layers.0.mlp.down_proj"});
  ASSERT_EQ(targeted.exit_code, 0) << targeted.err;
  EXPECT_EQ(read_json(tmp / "targeted" /
                      "config.json")["quantization_config"]["config_groups"]["W4A16"]["targets"],
            json({"model.layers.0.mlp.down_proj"}));
  const SafetensorsHeader h = read_header(tmp / "out" / "model.safetensors", "model.safetensors");
  EXPECT_NE(h.find("lm_head.weight"), nullptr);
  EXPECT_NE(h.find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_NE(h.find("model.layers.0.mlp.down_proj.weight"), nullptr);

  const CommandResult none =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "none").string(),
                   "--no-default-ignore", "--ignore", "re:.*q_proj$"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_TRUE(contains(none.err, "L12 error: 1 output head lm_head would be packed")) << none.err;
  EXPECT_TRUE(contains(none.err, "fix: keep it in 16 bits: --ignore 'lm_head'")) << none.err;
  EXPECT_FALSE(fs::exists(tmp / "none"));
  const CommandResult allowed =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "none").string(), "-q",
                   "--no-default-ignore", "--ignore", "re:.*q_proj$", "--allow-unloadable"});
  ASSERT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_EQ(read_json(tmp / "none" / "config.json")["quantization_config"]["ignore"],
            json({"re:.*q_proj$"}));
  EXPECT_NE(read_header(tmp / "none" / "model.safetensors", "model.safetensors")
                .find("lm_head.weight_packed"),
            nullptr);
  // Not quiet: the finding it lets through is logged as a warning that says
  // so, never as an error line in a run that succeeds.
  const CommandResult logged =
      run_ctquant({"quantize", (tmp / "in").string(), (tmp / "logged").string(),
                   "--no-default-ignore", "--ignore", "re:.*q_proj$", "--allow-unloadable"});
  ASSERT_EQ(logged.exit_code, 0) << logged.err;
  EXPECT_TRUE(contains(logged.err, "warning: L12: 1 output head lm_head would be packed"))
      << logged.err;
  EXPECT_TRUE(contains(logged.err,
                       "(an error that --allow-unloadable lets through: vLLM may "
                       "refuse this output)"))
      << logged.err;
  EXPECT_FALSE(contains(logged.err, "error:")) << logged.err;
}

TEST(Cli, SchemesAndChannelWise) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const struct {
    const char* scheme;
    const char* group_size;
    int num_bits;
    bool symmetric;
    json group;
    const char* key;  // the config_groups key: the preset, or a changed preset's
  } cases[] = {{"W8A16", nullptr, 8, true, 128, "W8A16"},
               {"W4A16_ASYM", nullptr, 4, false, 128, "W4A16_ASYM"},
               {"W4A16", "-1", 4, true, nullptr, "config_group_0"},
               {"W4A16", "64", 4, true, 64, "config_group_0"},
               {"W4A16", "128", 4, true, 128, "W4A16"}};
  int i = 0;
  for (const auto& c : cases) {
    const fs::path out = tmp / ("out" + std::to_string(i++));
    std::vector<std::string> args{"quantize", (tmp / "in").string(), out.string(), "-q", "--scheme",
                                  c.scheme};
    if (c.group_size != nullptr) {
      args.push_back("--group-size");
      args.push_back(c.group_size);
    }
    const CommandResult r = run_ctquant(args);
    ASSERT_EQ(r.exit_code, 0) << c.scheme << r.err;
    const json w =
        read_json(out / "config.json")["quantization_config"]["config_groups"][c.key]["weights"];
    EXPECT_EQ(w["num_bits"], c.num_bits) << c.scheme;
    EXPECT_EQ(w["symmetric"], c.symmetric) << c.scheme;
    EXPECT_EQ(w["group_size"], c.group) << c.scheme;
  }
}

// --scheme-for adds groups tried before --scheme; the config keys them by
// preset; bad specs and flags that do not apply are usage errors.
TEST(Cli, SchemeForAndQuantizationConfig) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const std::string in = (tmp / "in").string();
  const CommandResult r = run_ctquant(
      {"quantize", in, (tmp / "out").string(), "-q", "--scheme-for", "re:.*self_attn\\..*=W8A16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json qc = read_json(tmp / "out" / "config.json")["quantization_config"];
  EXPECT_EQ(qc["config_groups"]["W8A16"]["targets"], json({"re:.*self_attn\\..*"}));
  EXPECT_EQ(qc["config_groups"]["W4A16"]["targets"], json({"Linear"}));
  EXPECT_EQ(qc["format"], "pack-quantized");
  const SafetensorsHeader h = read_header(tmp / "out" / "model.safetensors", "model.safetensors");
  // W8A16 packs 4 codes per int32, W4A16 8.
  const TensorEntry* q = h.find("model.layers.0.self_attn.q_proj.weight_packed");
  const TensorEntry* down = h.find("model.layers.0.mlp.down_proj.weight_packed");
  ASSERT_TRUE(q != nullptr && down != nullptr);
  EXPECT_EQ(q->shape[1] * 4, read_header(tmp / "in" / "model.safetensors", "in")
                                 .find("model.layers.0.self_attn.q_proj.weight")
                                 ->shape[1]);

  write_file(tmp / "qc.json",
             R"({"config_groups": {"W8A16": ["re:.*mlp.*"]}, "ignore": ["lm_head"]})");
  for (const auto& [args, fragment] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--scheme-for", "W8A16"}, "expected PATTERN=PRESET"},
           {{"--scheme-for", "re:.*=W5A16"}, "unknown scheme 'W5A16'"},
           {{"--quantization-config", (tmp / "qc.json").string(), "--scheme", "W8A16"},
            "--scheme does not apply with --quantization-config"},
           {{"--quantization-config", (tmp / "qc.json").string(), "--group-size", "64"},
            "--group-size does not apply"},
           {{"--scheme", "W4A16", "--group-size", "32", "--scheme-for", "a=W8A16"}, ""}}) {
    std::vector<std::string> full{"quantize", in, (tmp / "bad").string(), "--dry-run", "-q"};
    full.insert(full.end(), args.begin(), args.end());
    const CommandResult bad = run_ctquant(full);
    if (fragment.empty()) {
      EXPECT_NE(bad.exit_code, 2) << bad.err;
      continue;
    }
    EXPECT_EQ(bad.exit_code, 2) << fragment << bad.err;
    EXPECT_TRUE(contains(bad.err, fragment)) << bad.err;
    EXPECT_FALSE(fs::exists(tmp / "bad"));
  }
  const CommandResult cfg =
      run_ctquant({"quantize", in, (tmp / "cfg").string(), "-q", "--quantization-config",
                   (tmp / "qc.json").string(), "--ignore", "model.embed_tokens"});
  ASSERT_EQ(cfg.exit_code, 0) << cfg.err;
  const json qc2 = read_json(tmp / "cfg" / "config.json")["quantization_config"];
  EXPECT_EQ(qc2["ignore"], json({"lm_head", "model.embed_tokens"}));
  EXPECT_EQ(qc2["config_groups"]["W8A16"]["targets"], json({"re:.*mlp.*"}));
}

// --quantization-config is read by the JSON reader: its nesting, size and
// repeated keys are bounded like config.json's, a usage error (exit 2).
TEST(Cli, QuantizationConfigIsReadWithTheJsonReadersBounds) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  const fs::path deep = tmp / "deep.json";
  write_file(deep,
             "{\"config_groups\": " + std::string(100'000, '[') + std::string(100'000, ']') + "}");
  const fs::path twice = tmp / "twice.json";
  write_file(
      twice,
      R"({"config_groups": {"g": {"targets": ["Linear"]}}, "ignore": [], "ignore": ["lm_head"]})");
  for (const auto& [file, rule] : {std::pair{deep, "JSON nests deeper than 128 levels"},
                                   std::pair{twice, "key 'ignore' appears twice"}}) {
    SCOPED_TRACE(file.string());
    const CommandResult r = run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(),
                                         "--quantization-config", file.string()});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, file.string() + ": " + rule)) << r.err;
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
}

// ---- stdout: every write checked ----

// A report that cannot be written to stdout (a full disk; /dev/full here)
// ends with exit 1 and a message, not with exit 0 and an empty file.
TEST(Cli, StdoutWriteErrorsExitOne) {
  TempDir tmp;
  write_small_checkpoint(tmp / "in");
  ASSERT_EQ(run_ctquant({"quantize", (tmp / "in").string(), (tmp / "ref").string()}).exit_code, 0);
  const auto quoted = [](const fs::path& p) {
    std::string word(1, '\'');
    word += p.string();
    word += '\'';
    return word;
  };
  const std::string in = quoted(tmp / "in");
  const std::string ref = quoted(tmp / "ref");
  const std::string out = quoted(tmp / "out");
  const std::vector<std::string> commands = {
      "inspect " + in,
      "inspect " + in + " --json",
      "inspect " + in + " --plan",
      "verify " + ref + " " + ref,
      "verify " + ref + " " + ref + " --json",
      "verify " + ref + " --manifest",
      "quantize " + in + " " + out + " --dry-run",
      "quantize " + in + " " + out + " --dry-run --json",
      "--help",
      "--version",
      "--list-subcommands",
  };
  for (const std::string& command : commands) {
    SCOPED_TRACE(command);
    const CommandResult r = run_shell("\"$CTQUANT\" " + command + " > /dev/full");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(contains(r.err,
                         "ctquant: error: cannot write to standard output: No space left "
                         "on device"))
        << r.err;
    EXPECT_FALSE(fs::exists(tmp / "out"));
  }
  // A run that commits OUTPUT and then cannot print its report says that
  // OUTPUT is complete.
  const CommandResult r =
      run_shell("\"$CTQUANT\" quantize " + in + " " + out + " --json > /dev/full");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot write to standard output")) << r.err;
  EXPECT_TRUE(contains(r.err, "OUTPUT " + (tmp / "out").string() + " was written and is complete"))
      << r.err;
  EXPECT_TRUE(fs::exists(tmp / "out" / "model.safetensors"));
}

// ---- the progress bar, as a person sees it on a terminal ----

// What a terminal shows after the bytes: \r returns to the start of the line,
// ESC [ K erases to its end, \n starts a new line, other bytes are printed;
// with a width, a byte printed past the last column starts a new row (the
// terminal wraps), and \r returns to the start of that row only.
std::vector<std::string> screen_of(const std::string& bytes, std::size_t width = 0) {
  std::vector<std::string> lines(1);
  std::size_t column = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (width > 0 && column == width && c != '\r' && c != '\n' && c != '\033') {
      lines.emplace_back();
      column = 0;
    }
    std::string& line = lines.back();
    if (c == '\r') {
      column = 0;
    } else if (c == '\n') {
      lines.emplace_back();
      column = 0;
    } else if (c == '\033' && bytes.compare(i, 3, "\033[K") == 0) {
      line.resize(std::min(line.size(), column));
      i += 2;
    } else {
      if (column < line.size()) {
        line[column] = c;
      } else {
        line.push_back(c);
      }
      ++column;
    }
  }
  if (lines.back().empty()) lines.pop_back();
  return lines;
}

// Under a pseudo-terminal (script(1), util-linux) quantize draws its bar by
// default: one line redrawn in place with a carriage return and ESC [ K,
// erased at the end; its control codes reach the terminal as they are, and
// the screen shows no escaped `\x0d` or `\x1b` text.
TEST(Cli, ProgressBarRedrawsOneLineOnATerminal) {
  if (run_shell("command -v script >/dev/null").exit_code != 0) {
    GTEST_SKIP() << "script(1) is not installed (util-linux bsdutils)";
  }
  TempDir tmp;
  write_large_checkpoint(tmp / "in", 8, 1024, 2048);  // 32 MiB: several updates
  const std::string command = "\"$CTQUANT\" quantize '" + (tmp / "in").string() + "' '" +
                              (tmp / "out").string() + "' --threads 1";
  const CommandResult r = run_shell("script -qfec \"" + command + "\" /dev/null < /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string& captured = r.out;  // what the terminal received
  EXPECT_TRUE(contains(captured, "\r\033[Kctquant: ")) << captured;
  EXPECT_FALSE(contains(captured, "\\x0d")) << captured;
  EXPECT_FALSE(contains(captured, "\\x1b")) << captured;
  // Every draw of the bar, up to its erasure, stays on one line.
  const std::size_t first_draw = captured.find("\r\033[Kctquant: ");
  const std::size_t erased = captured.rfind("\r\033[K");
  ASSERT_LT(first_draw, erased) << captured;
  EXPECT_EQ(captured.find('\n', first_draw), captured.find('\n', erased))
      << "the bar added lines instead of redrawing one: " << captured;
  // The screen: the log lines, the summary and the modules with the largest
  // weight error after it, the bar erased.
  const std::vector<std::string> screen = screen_of(captured);
  const auto summary = std::find_if(screen.begin(), screen.end(), [](const std::string& line) {
    return line.starts_with("ctquant: done: 8 tensors quantized");
  });
  ASSERT_NE(summary, screen.end()) << captured;
  EXPECT_TRUE(contains(screen.back(), "max |W-Q|")) << screen.back();
  for (const std::string& line : screen) {
    EXPECT_FALSE(contains(line, "\\x")) << line;
    EXPECT_FALSE(contains(line, " tensors  "))
        << "a progress line was left on the screen: " << line;
    EXPECT_EQ(line.find('\033'), std::string::npos) << line;
  }
}

// On a 50-column terminal (the pseudo-terminal's size, TIOCGWINSZ) the bar
// fits in 49 columns: a longer line wraps, and each redraw's carriage return
// goes back to its last row only, leaving the first ones on the screen.
TEST(Cli, ProgressBarFitsAFiftyColumnTerminal) {
  if (run_shell("command -v script >/dev/null").exit_code != 0) {
    GTEST_SKIP() << "script(1) is not installed (util-linux bsdutils)";
  }
  TempDir tmp;
  write_large_checkpoint(tmp / "in", 8, 1024, 2048);
  const std::string command = "stty cols 50 rows 24; \"$CTQUANT\" quantize '" +
                              (tmp / "in").string() + "' '" + (tmp / "out").string() +
                              "' --threads 1";
  const CommandResult r = run_shell("script -qfec \"" + command + "\" /dev/null < /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string& captured = r.out;
  ASSERT_TRUE(contains(captured, "\r\033[Kctquant: ")) << captured;
  for (const std::string& line : screen_of(captured, 50)) {
    EXPECT_FALSE(contains(line, "B of ") || contains(line, "ETA ") ||
                 contains(line, "ctquant: writing"))
        << "a row of the bar was left on the screen: " << line;
  }
}

}  // namespace
}  // namespace ctquant::test
