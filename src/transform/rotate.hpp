// Private to src/transform/: the `rotate` row's functions (rotate.cpp),
// listed by the registry in transform.cpp.
#pragma once

#include <filesystem>

#include "ctquant/transform/transform.hpp"

namespace ctquant::detail {

RewritePlan plan_rotate(const Checkpoint& checkpoint);
void write_rotated_source(const Checkpoint& checkpoint, const std::filesystem::path& dir,
                          bool with_data, const RewritePlan& plan);

}  // namespace ctquant::detail
