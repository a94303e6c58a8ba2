// The fate of every input tensor of a plan: sections 2 and 6 of the format
// spec, the expert split of schemes.md 8 and the scheme groups of
// schemes.md 9.3. Private to the plan module: make_plan (plan.cpp) calls
// decide_fates as its second stage.
#pragma once

#include "ctquant/plan/plan.hpp"

namespace ctquant::detail {

// Fills plan.decisions and plan.modules, shard by shard in file order, and
// what each ignore and targets entry matched (plan.ignore_matches,
// target_matches, group_modules); records the input's quantization
// (plan.input_quantization). plan.options must hold the effective ignore
// list (start_plan). Throws Error{kBadInput} listing every problem of the
// input and every weight its group's scheme refuses (make_plan's contract).
void decide_fates(const Checkpoint& checkpoint, QuantizePlan& plan);

}  // namespace ctquant::detail
