#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ctquant
