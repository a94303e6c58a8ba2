#include "ctquant/scheme/pack.hpp"

#include <algorithm>

namespace ctquant {

void pack_codes(std::span<const std::int8_t> codes, int num_bits, std::span<std::uint32_t> out) {
  std::fill(out.begin(), out.end(), 0u);
  const std::uint32_t offset = 1u << (num_bits - 1);
  const std::uint32_t mask = (1u << num_bits) - 1u;
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const std::uint64_t value = (static_cast<std::uint32_t>(codes[i] + static_cast<int>(offset))) & mask;
    const std::uint64_t bit = i * static_cast<std::uint64_t>(num_bits);
    const std::uint64_t word = bit / 32;
    const unsigned shift = static_cast<unsigned>(bit % 32);
    out[word] |= static_cast<std::uint32_t>(value << shift);
    if (shift + static_cast<unsigned>(num_bits) > 32) {
      out[word + 1] |= static_cast<std::uint32_t>(value >> (32 - shift));
    }
  }
}

void unpack_codes(std::span<const std::uint32_t> words, int num_bits, std::span<std::int8_t> codes) {
  const int offset = 1 << (num_bits - 1);
  const std::uint64_t mask = (1u << num_bits) - 1u;
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const std::uint64_t bit = i * static_cast<std::uint64_t>(num_bits);
    const std::uint64_t word = bit / 32;
    const unsigned shift = static_cast<unsigned>(bit % 32);
    std::uint64_t value = words[word] >> shift;
    if (shift + static_cast<unsigned>(num_bits) > 32) {
      value |= static_cast<std::uint64_t>(words[word + 1]) << (32 - shift);
    }
    codes[i] = static_cast<std::int8_t>(static_cast<int>(value & mask) - offset);
  }
}

void pack_zero_points(std::span<const std::int8_t> z, std::uint64_t n_rows, std::uint64_t n_cols,
                      int num_bits, std::span<std::uint32_t> out) {
  std::fill(out.begin(), out.end(), 0u);
  const std::uint32_t offset = 1u << (num_bits - 1);
  const std::uint32_t mask = (1u << num_bits) - 1u;
  for (std::uint64_t r = 0; r < n_rows; ++r) {
    const std::uint64_t bit = r * static_cast<std::uint64_t>(num_bits);
    const std::uint64_t word_row = bit / 32;
    const unsigned shift = static_cast<unsigned>(bit % 32);
    for (std::uint64_t g = 0; g < n_cols; ++g) {
      const std::uint64_t value =
          static_cast<std::uint32_t>(z[r * n_cols + g] + static_cast<int>(offset)) & mask;
      out[word_row * n_cols + g] |= static_cast<std::uint32_t>(value << shift);
      if (shift + static_cast<unsigned>(num_bits) > 32) {
        out[(word_row + 1) * n_cols + g] |= static_cast<std::uint32_t>(value >> (32 - shift));
      }
    }
  }
}

}  // namespace ctquant
