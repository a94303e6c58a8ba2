// Helpers shared by the FP8 tests: independent references for FP8 codes
// and dequantized weights, FP8 test tensors and configs, and a check for
// Error{kBadInput} with message fragments.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant::test {

using nlohmann::json;

// ---- independent references ----

// E4M3 ("fn") from its fields with ldexp: bias 7, subnormals m * 2^-9,
// S.1111.111 NaN, no infinities.
inline float e4m3_reference(unsigned code) {
  const bool negative = (code & 0x80u) != 0;
  const int exponent = static_cast<int>((code >> 3) & 0xFu);
  const int mantissa = static_cast<int>(code & 0x7u);
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), -9)
                              : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return negative ? -magnitude : magnitude;
}

// E5M2 from its fields: bias 15, subnormals m * 2^-16, exponent 31 is
// infinity (m == 0) or NaN.
inline float e5m2_reference(unsigned code) {
  const bool negative = (code & 0x80u) != 0;
  const int exponent = static_cast<int>((code >> 2) & 0x1Fu);
  const int mantissa = static_cast<int>(code & 0x3u);
  float magnitude;
  if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -16);
  } else {
    magnitude = std::ldexp(static_cast<float>(4 + mantissa), exponent - 17);
  }
  return negative ? -magnitude : magnitude;
}

inline float reference_decode(DType dtype, std::uint8_t code) {
  return dtype == DType::kF8_E5M2 ? e5m2_reference(code) : e4m3_reference(code);
}

inline std::uint32_t float_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// ---- hand-made checkpoints ----

inline std::vector<std::byte> code_bytes(const std::vector<std::uint8_t>& codes) {
  std::vector<std::byte> out;
  for (std::uint8_t c : codes) out.push_back(static_cast<std::byte>(c));
  return out;
}

// Seeded finite codes of dtype (never NaN or infinity).
inline std::vector<std::uint8_t> random_codes(DType dtype, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> codes(n);
  for (auto& c : codes) {
    do {
      c = static_cast<std::uint8_t>(rng() & 0xFFu);
    } while (!std::isfinite(reference_decode(dtype, c)));
  }
  return codes;
}

inline json block_config(std::uint64_t bh, std::uint64_t bw) {
  return json{{"model_type", "llama"},
              {"quantization_config",
               {{"quant_method", "fp8"},
                {"activation_scheme", "dynamic"},
                {"fmt", "e4m3"},
                {"weight_block_size", {bh, bw}}}}};
}

inline json ct_config(const std::string& strategy, json ignore = json::array({"lm_head"})) {
  return json{
      {"model_type", "llama"},
      {"quantization_config",
       {{"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"quantization_status", "compressed"},
        {"ignore", std::move(ignore)},
        {"kv_cache_scheme",
         {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"symmetric", true}}},
        {"config_groups",
         {{"group_0",
           {{"format", "float-quantized"},
            {"targets", {"Linear"}},
            {"input_activations",
             {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}}},
            {"weights",
             {{"num_bits", 8},
              {"type", "float"},
              {"strategy", strategy},
              {"symmetric", true},
              {"dynamic", false}}}}}}}}}};
}

// Runs fn and checks that it throws Error{kBadInput} whose message holds
// every fragment.
inline void expect_bad_input(const std::function<void()>& fn,
                             const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected Error{kBadInput}";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    for (const auto& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "'" << f << "' not in: " << e.what();
    }
  }
}

inline std::uint16_t bf16_at(const std::vector<std::byte>& bytes, std::size_t i) {
  std::uint16_t b;
  std::memcpy(&b, bytes.data() + 2 * i, 2);
  return b;
}

// The reference dequantization of a whole weight (section 6), with the
// block indexing written out independently of the library.
inline std::vector<std::uint16_t> reference_dequantize(DType code_dtype,
                                                       const std::vector<std::uint8_t>& codes,
                                                       std::uint64_t rows, std::uint64_t cols,
                                                       const std::vector<float>& grid,
                                                       std::uint64_t grid_cols, std::uint64_t bh,
                                                       std::uint64_t bw) {
  std::vector<std::uint16_t> out(rows * cols);
  for (std::uint64_t i = 0; i < rows; ++i) {
    for (std::uint64_t j = 0; j < cols; ++j) {
      const float s = grid[(i / bh) * grid_cols + (j / bw)];
      out[i * cols + j] = float_to_bf16(reference_decode(code_dtype, codes[i * cols + j]) * s);
    }
  }
  return out;
}

inline std::vector<float> distinct_scales(std::size_t n, float base) {
  std::vector<float> s(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = base * static_cast<float>(i + 1) * 1.0625f;
  return s;
}

}  // namespace ctquant::test
