// Packing of b-bit integer codes into int32 words, and unpacking.
//
// Section 4 of the format spec: codes are stored offset by 2^(b-1) (so in
// [0, 2^b)) as a dense little-endian bit stream: element i occupies bits
// i*b .. i*b+b-1 counted from bit 0 of word 0, and may straddle two words.
// Example (b = 4): codes 0,1,2,3,4,5,6,7,-8,-7,-1,0,0,0,0,0 pack to the words
// 0xFEDCBA98, 0x88888710 (decimal -19088744, -2004318448; the spec writes the
// second word's hex as 0x88887F10, a typo its decimal value corrects:
// tests/test_pack.cpp). This is compressed-tensors' pack_to_int32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ctquant {

// Packs codes (signed, each in [-2^(b-1), 2^(b-1))) into out, which must hold
// ceil(codes.size()*b/32) words; every word of out is overwritten. A code
// outside the range keeps only its low b bits after the offset (callers
// clamp first, as section 3 does); num_bits is 1 to 8 (the schemes use 4
// and 8). Throws nothing.
void pack_codes(std::span<const std::int8_t> codes, int num_bits, std::span<std::uint32_t> out);

// The two paths of pack_codes, exposed for tests (the same words):
namespace pack_detail {
// For b = 2, 4 or 8: packs the first min(codes.size() / (32/b), out.size())
// words, each from 32/b codes, without a loop over bits (g++ vectorizes
// it), and returns how many; 0 for another b.
std::size_t pack_codes_whole_words(std::span<const std::int8_t> codes, int num_bits,
                                   std::span<std::uint32_t> out);
// Any b: code by code into the bit stream (every word of out zeroed first).
void pack_codes_bitwise(std::span<const std::int8_t> codes, int num_bits,
                        std::span<std::uint32_t> out);
}  // namespace pack_detail

// Inverse of pack_codes: fills codes (codes.size() elements, each in
// [-2^(b-1), 2^(b-1))) from words, which must hold ceil(codes.size()*b/32)
// words. Throws nothing.
void unpack_codes(std::span<const std::uint32_t> words, int num_bits, std::span<std::int8_t> codes);

// Packs a zero-point matrix z [n_rows, n_cols] (signed codes) along dim 0 into
// out [ceil(n_rows*b/32), n_cols] (section 4: weight_zero_point): column g's
// codes form one bit stream down the rows.
void pack_zero_points(std::span<const std::int8_t> z, std::uint64_t n_rows, std::uint64_t n_cols,
                      int num_bits, std::span<std::uint32_t> out);

}  // namespace ctquant
