// Private to src/transform/: the `balance` row's functions (balance.cpp),
// listed by the registry in transform.cpp.
#pragma once

#include "ctquant/transform/transform.hpp"

namespace ctquant::detail {

RewritePlan plan_balance(const Checkpoint& checkpoint);
void derive_balance(const Checkpoint& checkpoint, RewritePlan& plan);

}  // namespace ctquant::detail
