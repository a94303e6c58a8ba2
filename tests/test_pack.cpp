#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ctquant/scheme/pack.hpp"

namespace ctquant {
namespace {

// Section 4 of the format spec: the example row and its two words. The spec
// gives them as int32 -19088744 and -2004318448; in hex those are 0xFEDCBA98
// and 0x88888710 (the spec's "0x88887F10" is a typo: it would decode to the
// codes -8,-7,7,-1,... and does not equal -2004318448).
TEST(Pack, SpecExampleWords) {
  const std::vector<std::int8_t> codes{0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -1, 0, 0, 0, 0, 0};
  std::vector<std::uint32_t> words(2);
  pack_codes(codes, 4, words);
  EXPECT_EQ(words[0], 0xFEDCBA98u);
  EXPECT_EQ(static_cast<std::int32_t>(words[0]), -19088744);
  EXPECT_EQ(words[1], 0x88888710u);
  EXPECT_EQ(static_cast<std::int32_t>(words[1]), -2004318448);

  std::vector<std::int8_t> back(16);
  unpack_codes(words, 4, back);
  EXPECT_EQ(back, codes);
}

// Codes for a run of `length`: every int8 value in turn from `start` (so
// both the codes of the width, [-2^(b-1), 2^(b-1)), and those it cuts to
// their low b bits), stepping by an odd `stride` so each value meets every
// position of a word.
std::vector<std::int8_t> code_run(std::size_t length, int start, int stride) {
  std::vector<std::int8_t> codes(length);
  for (std::size_t i = 0; i < length; ++i) {
    codes[i] = static_cast<std::int8_t>(static_cast<std::uint8_t>(
        (start + static_cast<int>(i) * stride) & 0xFF));
  }
  return codes;
}

std::size_t words_for(std::size_t codes, int bits) {
  return (codes * static_cast<std::size_t>(bits) + 31) / 32;
}

// pack_codes packs whole words of 2-, 4- and 8-bit codes without a loop
// over bits, and the rest (a last partial word, or other widths) bit by
// bit: the words are those of the bit loop for every code value, at lengths
// that fill whole words and lengths that do not, from a word pre-filled
// with garbage (every word is overwritten).
TEST(Pack, WholeWordPathEqualsTheBitLoopOnEveryCode) {
  const std::vector<std::size_t> lengths{0,  1,  2,  3,  4,   5,   7,   8,   9,   15,  16,
                                         17, 31, 32, 33, 63,  64,  65,  100, 127, 128, 129,
                                         255, 256, 257, 384, 1000, 4096, 4099};
  for (const int bits : {1, 2, 3, 4, 5, 6, 7, 8}) {
    for (const std::size_t length : lengths) {
      for (const auto& [start, stride] : {std::pair{0, 1}, std::pair{-128, 1}, std::pair{5, 7},
                                          std::pair{-3, 37}, std::pair{100, 255}}) {
        SCOPED_TRACE(testing::Message() << bits << " bits, " << length << " codes from " << start
                                        << " by " << stride);
        const std::vector<std::int8_t> codes = code_run(length, start, stride);
        std::vector<std::uint32_t> expected(words_for(length, bits), 0xDEADBEEFu);
        pack_detail::pack_codes_bitwise(codes, bits, expected);
        std::vector<std::uint32_t> words(expected.size(), 0xA5A5A5A5u);
        pack_codes(codes, bits, words);
        ASSERT_EQ(words, expected);

        std::vector<std::uint32_t> whole(expected.size(), 0u);
        const std::size_t n = pack_detail::pack_codes_whole_words(codes, bits, whole);
        const bool fast = bits == 2 || bits == 4 || bits == 8;
        ASSERT_EQ(n, fast ? length * static_cast<std::size_t>(bits) / 32 : 0u);
        for (std::size_t w = 0; w < n; ++w) ASSERT_EQ(whole[w], expected[w]) << "word " << w;
        std::vector<std::int8_t> back(length);
        unpack_codes(words, bits, back);
        for (std::size_t i = 0; i < length; ++i) {
          const int offset = 1 << (bits - 1);
          const int low = ((codes[i] + offset) & ((1 << bits) - 1)) - offset;
          ASSERT_EQ(back[i], low) << "code " << i;
        }
      }
    }
  }
}

// Random rows of in-range codes at the widths of the schemes, 4 and 8, as
// the kernels pack them (one row of n_cols codes into its words).
TEST(Pack, WholeWordPathEqualsTheBitLoopOnRandomRows) {
  std::mt19937 rng(7);
  for (const int bits : {2, 4, 8}) {
    std::uniform_int_distribution<int> code(-(1 << (bits - 1)), (1 << (bits - 1)) - 1);
    for (const std::size_t cols : {128u, 3072u, 12288u, 200u, 1001u}) {
      std::vector<std::int8_t> codes(cols);
      for (auto& c : codes) c = static_cast<std::int8_t>(code(rng));
      std::vector<std::uint32_t> expected(words_for(cols, bits));
      pack_detail::pack_codes_bitwise(codes, bits, expected);
      std::vector<std::uint32_t> words(expected.size());
      pack_codes(codes, bits, words);
      EXPECT_EQ(words, expected) << bits << " bits, " << cols << " columns";
    }
  }
}

}  // namespace
}  // namespace ctquant
