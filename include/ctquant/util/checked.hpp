// Checked unsigned arithmetic for numbers read from files.
//
// Every size, offset and element count that comes from a header goes through
// these before it is used to allocate, seek or index (docs/security.md).
#pragma once

#include <cstdint>

namespace ctquant {

// out = a * b; returns false (and leaves out unspecified) on 64-bit overflow.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

// out = a + b; returns false on 64-bit overflow.
inline bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

}  // namespace ctquant
