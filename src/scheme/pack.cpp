#include "ctquant/scheme/pack.hpp"

#include <algorithm>

namespace ctquant {

namespace {

// Eight codes as the bytes of a 64-bit value, code j in bits 8j .. 8j+7
// (g++ makes this one load on a little-endian machine).
inline std::uint64_t eight_codes(const std::int8_t* p) {
  std::uint64_t x = 0;
  for (int j = 0; j < 8; ++j) x |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(p[j])) << (8 * j);
  return x;
}

// Eight codes offset by 2^(b-1) and cut to their low b bits (b = 2 or 4),
// packed into the low 8b bits: code j at bits bj .. bj+b-1. Each byte is
// first cut to its low b bits, so adding the offset carries into no other
// byte; then each step joins neighbouring fields, halving their number.
template <int kBits>
inline std::uint64_t pack_eight(std::uint64_t x) {
  constexpr std::uint64_t kOnes = 0x0101010101010101u;
  constexpr std::uint64_t kLow = kOnes * ((1u << kBits) - 1u);
  x = ((x & kLow) + kOnes * (1u << (kBits - 1))) & kLow;
  constexpr std::uint64_t kField2 = 0x0001000100010001u * ((1u << (2 * kBits)) - 1u);
  x = (x | (x >> (8 - kBits))) & kField2;
  constexpr std::uint64_t kField4 = 0x0000000100000001u * ((1u << (4 * kBits)) - 1u);
  x = (x | (x >> (16 - 2 * kBits))) & kField4;
  return (x | (x >> (32 - 4 * kBits))) & ((std::uint64_t{1} << (8 * kBits)) - 1u);
}

}  // namespace

namespace pack_detail {

std::size_t pack_codes_whole_words(std::span<const std::int8_t> codes, int num_bits,
                                   std::span<std::uint32_t> out) {
  const std::size_t per_word = num_bits == 2 || num_bits == 4 || num_bits == 8
                                   ? 32 / static_cast<std::size_t>(num_bits)
                                   : 0;
  if (per_word == 0) return 0;
  const std::size_t words = std::min(codes.size() / per_word, out.size());
  const std::int8_t* p = codes.data();
  std::uint32_t* w = out.data();
  switch (num_bits) {
    case 8:
      // code + 128, cut to 8 bits, is the code's byte with its top bit flipped.
      for (std::size_t i = 0; i < words; ++i) {
        const auto byte = [&](int j) {
          return static_cast<std::uint32_t>(static_cast<std::uint8_t>(p[4 * i + j]) ^ 0x80u);
        };
        w[i] = byte(0) | byte(1) << 8 | byte(2) << 16 | byte(3) << 24;
      }
      break;
    case 4:
      for (std::size_t i = 0; i < words; ++i) {
        w[i] = static_cast<std::uint32_t>(pack_eight<4>(eight_codes(p + 8 * i)));
      }
      break;
    case 2:
      for (std::size_t i = 0; i < words; ++i) {
        w[i] = static_cast<std::uint32_t>(pack_eight<2>(eight_codes(p + 16 * i)) |
                                          pack_eight<2>(eight_codes(p + 16 * i + 8)) << 16);
      }
      break;
    default:
      break;
  }
  return words;
}

void pack_codes_bitwise(std::span<const std::int8_t> codes, int num_bits,
                        std::span<std::uint32_t> out) {
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

}  // namespace pack_detail

void pack_codes(std::span<const std::int8_t> codes, int num_bits, std::span<std::uint32_t> out) {
  const std::size_t words = pack_detail::pack_codes_whole_words(codes, num_bits, out);
  if (words == out.size()) return;
  // The rest (a last word the codes do not fill, or every word of another
  // width): bit by bit, from the first code not packed.
  const std::size_t done = words * 32 / static_cast<std::size_t>(num_bits);
  pack_detail::pack_codes_bitwise(codes.subspan(done), num_bits, out.subspan(words));
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
