// The layout checks of stacked 3-D expert tensors (schemes.md 8), private
// to the planner (src/plan/fates.cpp): which key a stacked tensor has, and
// whether config.json proves its slices are [out_features, in_features]
// Linear weights so that it can be split.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctquant/source/checkpoint.hpp"

namespace ctquant::detail {

// The key of a stacked expert tensor name ("gate_up_proj" or "down_proj"),
// as model_free's split_fused_moe_experts finds it (a substring test).
// Sets `both` when the name holds both keys.
std::optional<std::string_view> stacked_key(const std::string& name, bool& both);

// A stacked tensor's layout, proven from config.json: each expert slice
// must be an [out_features, in_features] Linear weight (the transformers-v5
// layout gate_up_proj [E, 2I, H], down_proj [E, H, I]). Returns why it
// cannot be split, or "" when it can.
std::string stacked_layout_problem(const Checkpoint& checkpoint, std::string_view key,
                                   const std::vector<std::uint64_t>& shape);

}  // namespace ctquant::detail
