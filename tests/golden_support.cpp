#include "golden_support.hpp"

#include <algorithm>
#include <stdexcept>

#include "ctquant/plan/quant_config.hpp"
#include "test_support.hpp"

namespace ctquant::test {

namespace fs = std::filesystem;
using nlohmann::json;

bool unloadable_in_vllm(const std::string& name) {
  return name == "fp8-block" || name == "odd-bf16-fp8-block" || name == "odd-bf16-fp8-block-mse";
}

json load_cases() { return read_json(golden_dir() / "cases.json"); }

namespace {

GoldenCase from_json(const json& c) {
  GoldenCase g;
  g.name = c.at("case");
  g.scheme = c.at("scheme");
  g.config = c.value("config", json());
  if (c.contains("group_size")) g.group_size = c.at("group_size").get<long long>();
  g.ignore = c.at("ignore").get<std::vector<std::string>>();
  g.by_library = c.contains("expected_by");
  const json config = read_json(golden_dir() / g.name / "input" / "config.json");
  g.fp8_input = config.contains("quantization_config");
  return g;
}

}  // namespace

GoldenCase find_case(const std::string& name) {
  for (const json& c : load_cases()) {
    if (c.at("case") == name) return from_json(c);
  }
  throw std::runtime_error("no golden case " + name + " in cases.json");
}

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> out;
  for (const json& c : load_cases()) out.push_back(from_json(c));
  return out;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const json& c : load_cases()) names.push_back(c.at("case"));
  return names;
}

std::string case_test_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

PlanOptions plan_of(const GoldenCase& c) {
  PlanOptions options;
  if (c.scheme == "config") {
    options = plan_options_from_config(c.config, c.name + " config");
    options.ignore.insert(options.ignore.end(), c.ignore.begin(), c.ignore.end());
    return options;
  }
  options.groups = {preset_group(c.scheme)};
  if (c.group_size && *c.group_size != 128) {
    set_group_size(options, *c.group_size == -1 ? 0 : static_cast<std::uint64_t>(*c.group_size));
  }
  options.ignore = c.ignore;
  return options;
}

fs::path input_of(const GoldenCase& c) { return golden_dir() / c.name / "input"; }
fs::path expected_of(const GoldenCase& c) { return golden_dir() / c.name / "expected"; }

}  // namespace ctquant::test
