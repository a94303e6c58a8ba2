#include "kernel_simd.hpp"

namespace ctquant::detail {

bool simd_available() { return false; }

bool simd_supports(const QuantScheme&, const KernelBlock&) { return false; }

std::optional<std::uint64_t> quantize_block_simd(const QuantScheme& scheme,
                                                 const KernelBlock& block) {
  return quantize_block_ref(scheme, block);
}

}  // namespace ctquant::detail
