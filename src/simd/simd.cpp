#include "simd/simd.hpp"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "simd/simd_dispatch.hpp"

namespace ctquant::detail {

const std::vector<SimdLevel>& simd_levels() {
  static const std::vector<SimdLevel> levels = [] {
    // The targets this CPU (and its OS) runs, from CPUID / the auxiliary vector.
    [[maybe_unused]] const std::int64_t supported = hwy::SupportedTargets();
    std::vector<SimdLevel> out;
#define CTQUANT_SIMD_LEVEL_(T, NAME, ARG) \
  if ((HWY_TARGETS & HWY_##T) != 0) out.push_back({HWY_##T, NAME, (supported & HWY_##T) != 0});
    CTQUANT_SIMD_FOREACH_LEVEL(CTQUANT_SIMD_LEVEL_, _)
#undef CTQUANT_SIMD_LEVEL_
    return out;
  }();
  return levels;
}

namespace {
thread_local const SimdLevel* scoped_level = nullptr;  // ScopedSimdLevel
}  // namespace

const SimdLevel& simd_best_level() {
  static const SimdLevel best = [] {
    for (const SimdLevel& level : simd_levels()) {
      if (level.supported) return level;
    }
    return SimdLevel{};
  }();
  return scoped_level != nullptr ? *scoped_level : best;
}

ScopedSimdLevel::ScopedSimdLevel(const SimdLevel& level) : previous_(scoped_level) {
  scoped_level = &level;
}

ScopedSimdLevel::~ScopedSimdLevel() { scoped_level = previous_; }

}  // namespace ctquant::detail
