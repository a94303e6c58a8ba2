// Helpers shared by the verify tests (test_verify.cpp, test_verify_fp8.cpp).
#pragma once

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "ctquant/verify/verify.hpp"
#include "test_support.hpp"

namespace ctquant::test {

// Relative Frobenius error a correct RTN round trip stays under on the golden
// inputs (normal weights with heavy-tailed outliers, and the dequantized FP8
// weights), by bit width.
inline constexpr double kMaxRelFrobenius4Bit = 0.30;
inline constexpr double kMaxRelFrobenius8Bit = 0.03;

inline std::filesystem::path golden(const std::string& name) { return golden_dir() / name; }

inline bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// The items of a report of one kind ("code_mismatch", "missing_tensor", ...).
inline std::vector<VerifyItem> of_kind(const std::vector<VerifyItem>& items,
                                       const std::string& kind) {
  std::vector<VerifyItem> out;
  std::copy_if(items.begin(), items.end(), std::back_inserter(out),
               [&](const VerifyItem& i) { return i.kind == kind; });
  return out;
}

inline std::string describe(const VerifyReport& r) { return render_verify_text(r); }

// fp8-block's expected/ keeps v_proj in 16 bits beside packed q_proj and
// k_proj (its cases.json ignore list): vLLM refuses each layer's qkv_proj,
// which verify reports as one loadability difference per layer
// (VerifyAgainstFp8Source.GoldenCasesPass pins them). The other differences.
inline bool is_fp8_block_qkv_refusal(const VerifyItem& d) {
  return d.kind == "loadability" &&
         d.message.starts_with("vLLM refuses to build 'model.layers.") &&
         d.message.find(".self_attn.qkv_proj': Found a different quantization schemes") !=
             std::string::npos;
}
inline std::vector<VerifyItem> without_fp8_block_qkv(const VerifyReport& r) {
  std::vector<VerifyItem> out;
  std::copy_if(r.differences.begin(), r.differences.end(), std::back_inserter(out),
               [](const VerifyItem& d) { return !is_fp8_block_qkv_refusal(d); });
  return out;
}

// A writable copy of a golden case's directory `part` (expected or input),
// at path.
struct GoldenCopy {
  TempDir dir;
  std::filesystem::path path;
  explicit GoldenCopy(const std::string& name, const std::string& part = "expected")
      : path(dir / part) {
    copy_dir(golden(name) / part, path);
  }
};

}  // namespace ctquant::test
