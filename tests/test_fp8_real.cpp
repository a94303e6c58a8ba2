// The real FP8 files of tests/real/fp8_torchao (written by torchao's
// serializer; see tests/real/PROVENANCE.md): ctquant reads them exactly, and
// refuses to convert their layout, whose '<param>:<component>' tensor names
// are not module parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/source/fp8.hpp"
#include "ctquant/format/safetensors.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;

fs::path real_dir() { return CTQUANT_REAL_DIR; }

const char* const kFloat8Files[] = {"fp8_torchao/d0f7d539/fp8_weights.safetensors",
                                    "fp8_torchao/f892e970/fp8_weights.safetensors"};

std::vector<std::byte> read_entry(const SafetensorsFile& f, const std::string& name) {
  const TensorEntry* e = f.header().find(name);
  if (e == nullptr) throw std::runtime_error("missing " + name);
  std::vector<std::byte> bytes(e->byte_size());
  f.read(e->begin, bytes);
  return bytes;
}

// A Linear(32 -> 256) quantized per row by torchao's Float8Tensor: codes
// F8_E4M3 [256, 32], scale F32 [256, 1] = amax / 448. Every row's largest
// code must decode to exactly 448, and dequantizing with the per-row layout
// must give back a finite row whose largest magnitude is 448 * scale.
TEST(Fp8RealTorchao, DecodesFloat8PerRowWeight) {
  for (const char* rel : kFloat8Files) {
    SCOPED_TRACE(rel);
    const SafetensorsFile f(real_dir() / rel, rel);
    const TensorEntry* q = f.header().find("0.weight:qdata");
    const TensorEntry* s = f.header().find("0.weight:scale");
    const TensorEntry* b = f.header().find("0.bias:data");
    ASSERT_TRUE(q && s && b);
    EXPECT_EQ(q->dtype, DType::kF8_E4M3);
    EXPECT_EQ(q->shape, (std::vector<std::uint64_t>{256, 32}));
    EXPECT_EQ(s->dtype, DType::kF32);
    EXPECT_EQ(s->shape, (std::vector<std::uint64_t>{256, 1}));
    EXPECT_EQ(b->dtype, DType::kBF16);
    EXPECT_EQ(f.header().metadata.at("tensor_names"), "[\"0.weight\", \"0.bias\"]");

    const std::vector<std::byte> codes = read_entry(f, "0.weight:qdata");
    const std::vector<std::byte> scales = read_entry(f, "0.weight:scale");
    for (std::uint64_t r = 0; r < 256; ++r) {
      float row_max = 0;
      for (std::uint64_t c = 0; c < 32; ++c) {
        const float v = f8_e4m3_to_float(std::to_integer<std::uint8_t>(codes[r * 32 + c]));
        ASSERT_TRUE(std::isfinite(v)) << "row " << r << " column " << c;
        row_max = std::max(row_max, std::fabs(v));
      }
      EXPECT_EQ(row_max, 448.0f) << "row " << r;
    }

    const Fp8ScaleLayout per_row{DType::kF32, 1, 32, 256, 1};
    std::vector<std::byte> out(256 * 32 * 2);
    const Fp8Rows rows{DType::kF8_E4M3, 0, 256, 32, codes.data(), scales.data(), out.data()};
    ASSERT_FALSE(dequantize_fp8_rows(per_row, rows));
    for (std::uint64_t r = 0; r < 256; ++r) {
      float scale;
      std::memcpy(&scale, scales.data() + 4 * r, 4);
      float row_max = 0;
      for (std::uint64_t c = 0; c < 32; ++c) {
        std::uint16_t bits;
        std::memcpy(&bits, out.data() + 2 * (r * 32 + c), 2);
        row_max = std::max(row_max, std::fabs(bf16_to_float(bits)));
      }
      EXPECT_EQ(row_max, bf16_to_float(float_to_bf16(448.0f * scale))) << "row " << r;
    }
  }
}

// ctquant does not know torchao's tensor-subclass layout: it refuses the
// file (exit 1, every such tensor named, nothing written) rather than copy
// F8 codes into a "W4A16" checkpoint or drop the metadata that describes them.
TEST(Fp8RealTorchao, QuantizeRefusesTensorSubclassLayout) {
  struct Case {
    const char* file;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases{
      {kFloat8Files[0],
       {"fp8_weights.safetensors: tensors '0.weight:scale', '0.bias:data', '0.weight:qdata': a "
        "name with a ':' component is torchao's tensor-subclass layout",
        "ctquant does not convert this format", "3 tensor(s) cannot be converted"}},
      {kFloat8Files[1], {"'0.weight:qdata'", "3 tensor(s) cannot be converted"}},
      {"fp8_torchao/d0f7d539/fp8_weights_multi.safetensors",
       {"'layer1.weight:original_weight'", "'layer3.weight:original_weight'",
        "torchao's tensor-subclass layout", "3 tensor(s) cannot be converted"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    test::TempDir tmp;
    const fs::path input = real_dir() / c.file;
    const std::string before = test::read_file(input);
    const test::CommandResult r =
        test::run_ctquant({"quantize", input.string(), (tmp / "out").string()});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    for (const std::string& f : c.fragments) {
      EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in: " << r.err;
    }
    EXPECT_FALSE(fs::exists(tmp / "out"));
    EXPECT_EQ(test::read_file(input), before);
  }
}

}  // namespace
}  // namespace ctquant
