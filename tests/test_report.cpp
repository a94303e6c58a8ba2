// The run report (quantize --report / --json) against its JSON Schema
// (docs/report.schema.json), its output file list against sha256sum, and
// the envelope that inspect --json and verify --json share with it.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/util/version.hpp"
#include "json_schema.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using nlohmann::json;
using test::expect_message;
namespace fs = std::filesystem;

json report_schema() { return test::read_json(fs::path(CTQUANT_DOCS_DIR) / "report.schema.json"); }

// The schema of one of its $defs, with the $defs it refers to.
json def_schema(const std::string& name) {
  const json root = report_schema();
  return json{{"$ref", "#/$defs/" + name}, {"$defs", root["$defs"]}};
}

void expect_valid(const json& schema, const json& instance) {
  const auto errors = test::JsonSchemaValidator(schema).validate(instance);
  for (const std::string& e : errors) ADD_FAILURE() << e;
}

// name -> sha256 as `sha256sum` prints it, for every regular file of dir.
std::map<std::string, std::string> sha256sum(const fs::path& dir) {
  std::map<std::string, std::string> digests;
  const std::string command = "cd '" + dir.string() + "' && sha256sum *";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  char line[4096];
  while (pipe != nullptr && std::fgets(line, sizeof line, pipe) != nullptr) {
    std::string text(line);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    digests[text.substr(66)] = text.substr(0, 64);  // "<64 hex>  <name>"
  }
  if (pipe != nullptr) ::pclose(pipe);
  return digests;
}

std::map<std::string, std::string> listed(const json& files) {
  std::map<std::string, std::string> digests;
  for (const json& f : files) digests[f["name"].get<std::string>()] = f["sha256"].get<std::string>();
  return digests;
}

TEST(Report, ValidatesAgainstTheSchemaAndListsWhatSha256sumSays) {
  test::TempDir dir;
  const fs::path input = test::golden_dir() / "dflash-bf16-sharded" / "input";
  const auto r = test::run_ctquant({"quantize", input.string(), (dir / "out").string(),
                                    "--ignore", "re:.*qkv_proj$", "--ignore", "re:.*g_proj$",
                                    "--report", (dir / "report.json").string(), "--json",
                                    "--threads", "2", "--progress", "none"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = test::read_json(dir / "report.json");
  expect_valid(report_schema(), report);
  // --json prints the same document on stdout; the summary stays on stderr.
  EXPECT_EQ(json::parse(r.out), report);
  expect_message(r.err, {"ctquant: done:"});

  EXPECT_EQ(listed(report["output"]["files"]), sha256sum(dir / "out"));
  EXPECT_EQ(listed(report["input"]["files"]), sha256sum(input));
  EXPECT_EQ(report["ctquant_version"], ctquant_version());
  EXPECT_EQ(report["command"], "quantize");
  EXPECT_EQ(report["argv"][1], "quantize");
  EXPECT_EQ(report["threads"], 2);
  EXPECT_EQ(report["recipe"]["scheme"], "W4A16");
  EXPECT_EQ(report["recipe"]["origins"]["ignore"]["source"], "command_line");
  EXPECT_EQ(report["recipe"]["origins"]["scheme"]["source"], "default");
  std::uint64_t out_bytes = 0;
  for (const json& f : report["output"]["files"]) out_bytes += f["size"].get<std::uint64_t>();
  EXPECT_EQ(report["bytes_out"], out_bytes);
  EXPECT_GT(report["peak_rss_bytes"].get<std::uint64_t>(), 0u);
  // Per tensor: fate, rule, scheme, output shard.
  bool saw_quantized = false;
  for (const json& t : report["plan"]["tensors"]) {
    if (t["fate"] == "quantize") {
      saw_quantized = true;
      EXPECT_EQ(t["scheme"], "W4A16");
      EXPECT_EQ(t["output_shard"], t["shard"]);
    } else {
      EXPECT_TRUE(t["scheme"].is_null());
    }
  }
  EXPECT_TRUE(saw_quantized);
  // The lint findings of this run (L1 for the default targets' info, etc.)
  // are the ones quantize logged.
  for (const json& f : report["lint"]) expect_message(r.err, {f["id"].get<std::string>() + ":"});
  // The recipe in the report is what --write-recipe writes.
  expect_message(report["recipe"]["yaml"].get<std::string>(),
                 {"QuantizationModifier:", "scheme: \"W4A16\"", "re:.*qkv_proj$"});
}

TEST(Report, DryRunReportValidatesAndListsNoOutputFiles) {
  test::TempDir dir;
  const auto r = test::run_ctquant(
      {"quantize", (test::golden_dir() / "llama-bf16" / "input").string(), (dir / "out").string(),
       "--dry-run", "--json", "--recipe", (fs::path(CTQUANT_RECIPES_DIR) / "written/w8a16_channel_groups.yaml").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(r.out);  // only the JSON on stdout, no plan text
  expect_valid(report_schema(), report);
  EXPECT_EQ(report["dry_run"], true);
  EXPECT_TRUE(report["output"]["files"].empty());
  EXPECT_TRUE(report["recipe"].contains("config_groups"));
  EXPECT_EQ(report["recipe"]["origins"]["config_groups"]["source"], "recipe");
  EXPECT_EQ(report["recipe"]["origins"]["config_groups"]["line"], 4);
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(Report, ManifestValidatesAgainstItsSchema) {
  test::TempDir dir;
  quantize(test::test_options(test::golden_dir() / "llama-f32" / "input", dir / "out"));
  expect_valid(def_schema("manifest"), test::read_json(dir / "out" / kManifestFileName));
}

TEST(Report, InspectAndVerifyJsonShareTheEnvelope) {
  const fs::path golden = test::golden_dir() / "llama-bf16";
  const auto inspect =
      test::run_ctquant({"inspect", (golden / "input").string(), "--json", "--plan"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  const json i = json::parse(inspect.out);
  expect_valid(def_schema("envelope"), i);
  EXPECT_EQ(i["command"], "inspect");
  EXPECT_EQ(i["recipe"]["scheme"], "W4A16");
  expect_valid(def_schema("plan"), i["plan"]);

  test::TempDir dir;
  QuantizeOptions options = test::test_options(golden / "input", dir / "out");
  options.plan.ignore = {"lm_head", "model.embed_tokens"};  // as the golden case
  quantize(options);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"verify", (dir / "out").string(), (golden / "expected").string(),
                                 "--json"},
        std::vector<std::string>{"verify", (dir / "out").string(), "--manifest", "--json"}}) {
    const auto v = test::run_ctquant(args);
    ASSERT_EQ(v.exit_code, 0) << v.out << v.err;
    const json j = json::parse(v.out);
    expect_valid(def_schema("envelope"), j);
    EXPECT_EQ(j["command"], "verify");
    EXPECT_EQ(j["same"], true);
  }
}

// The validator is not vacuous: each broken report is rejected.
TEST(Report, SchemaRejectsBrokenReports) {
  test::TempDir dir;
  const auto r = test::run_ctquant({"quantize",
                                    (test::golden_dir() / "llama-bf16" / "input").string(),
                                    (dir / "out").string(), "--json", "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json good = json::parse(r.out);
  struct Break {
    const char* name;
    void (*apply)(json&);
    const char* error;
  };
  const Break cases[] = {
      {"missing_field", [](json& j) { j.erase("peak_rss_bytes"); }, "peak_rss_bytes"},
      {"unknown_field", [](json& j) { j["peakRss"] = 1; }, "/peakRss"},
      {"bad_digest", [](json& j) { j["output"]["files"][0]["sha256"] = "xyz"; }, "sha256"},
      {"negative_size", [](json& j) { j["input"]["files"][0]["size"] = -1; }, "size"},
      {"bad_fate", [](json& j) { j["plan"]["tensors"][0]["fate"] = "keep"; }, "fate"},
      {"bad_origin", [](json& j) { j["recipe"]["origins"]["ignore"]["source"] = "env"; },
       "source"},
      {"wrong_command", [](json& j) { j["command"] = "inspect"; }, "/command"},
  };
  expect_valid(report_schema(), good);
  for (const Break& c : cases) {
    SCOPED_TRACE(c.name);
    json broken = good;
    c.apply(broken);
    const auto errors = test::JsonSchemaValidator(report_schema()).validate(broken);
    ASSERT_FALSE(errors.empty());
    std::string all;
    for (const auto& e : errors) all += e + "\n";
    expect_message(all, {c.error});
  }
}

}  // namespace
}  // namespace ctquant
