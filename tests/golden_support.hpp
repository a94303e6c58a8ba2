// The golden cases of tests/golden/cases.json, shared by the golden and
// verify tests: each case's scheme (a preset, or a QuantizationConfig) and
// ignore list, and the plan options model_free_ptq took for it.
#pragma once

#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/plan/plan.hpp"

namespace ctquant::test {

// Cases whose output vLLM would refuse, which lint stops; the fixtures still
// define the bytes, so their runs pass allow_unloadable:
// - fp8-block ignores v_proj and down_proj but quantizes q/k_proj and
//   gate/up_proj: a split fused q/k/v group (L3,
//   GoldenCases.Fp8BlockIgnoreListIsStoppedByLint);
// - odd-bf16-fp8-block has q_proj 320, k/v_proj 80 and gate/up_proj 200
//   rows: vLLM's validate_fp8_block_shape (fp8_utils.py) refuses the merged
//   q/k/v and gate/up layers, whose partitions before the last must be
//   multiples of the 128-row block (L5,
//   GoldenCases.OddFp8BlockShapesAreStoppedByLint).
bool unloadable_in_vllm(const std::string& name);

// One entry of cases.json: a preset (with, in the older cases, its group
// size), or "config" with a QuantizationConfig.
struct GoldenCase {
  std::string name;
  std::string scheme;  // a preset name, or "config"
  nlohmann::json config;  // the QuantizationConfig of a "config" case
  std::optional<long long> group_size;  // older cases: -1 channel-wise
  std::vector<std::string> ignore;
  // Written by model_free_ptq itself ("expected_by"): config_groups keyed as
  // the library keys them. The older cases name their one group "group_0".
  bool by_library = false;
  bool fp8_input = false;  // the input is an FP8 checkpoint (section 6)
};
// Test failures name the case, not its bytes.
inline void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }

nlohmann::json load_cases();
GoldenCase find_case(const std::string& name);
std::vector<GoldenCase> golden_cases();
std::vector<std::string> case_names();
// A case name as a GoogleTest parameter name ('-' becomes '_').
std::string case_test_name(std::string name);

// The plan options of a case as model_free_ptq took them: a preset (the older
// cases with their group size), or the config with the ignore list appended.
PlanOptions plan_of(const GoldenCase& c);

std::filesystem::path input_of(const GoldenCase& c);
std::filesystem::path expected_of(const GoldenCase& c);

}  // namespace ctquant::test
