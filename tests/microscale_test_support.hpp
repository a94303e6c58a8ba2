// Helpers shared by the microscale scheme tests (test_scheme_nvfp4.cpp,
// test_scheme_mx.cpp): hex test vectors, running a family's kernel over a
// whole weight, reading a golden checkpoint tensor by tensor across its
// shards, and the golden comparison itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/microscale_simd.hpp"

namespace ctquant {
extern const SchemeFamily kNvfp4Family;
extern const SchemeFamily kMxfp4Family;
extern const SchemeFamily kMxfp8Family;
}  // namespace ctquant

namespace ctquant::test {

// "b8d2 8000 ..." -> the little-endian bytes of those 16-bit patterns.
std::vector<std::byte> hex16(const std::string& words);
// "08 a9 44 ..." -> those bytes.
std::vector<std::byte> hex8(const std::string& bytes);
// Bytes as "08 a9 44 ..." for messages.
std::string to_hex(const std::vector<std::byte>& bytes);

// What a kernel wrote for a whole weight [rows, cols].
struct KernelOutput {
  std::optional<std::uint64_t> bad;                  // first non-finite element
  std::vector<std::vector<std::byte>> rows_outputs;  // each kRows output, in outputs() order
  std::vector<std::vector<std::byte>> whole;         // each kWhole output, in outputs() order
};

// One way to run a family's kernel: its reference, its fast path, or the
// vector kernel at one level of detail::simd_levels().
struct KernelPath {
  std::string name;
  std::function<std::optional<std::uint64_t>(const QuantArgs&, const KernelIo&)> run;
};
KernelPath reference_path(const SchemeFamily& family);
KernelPath fast_path(const SchemeFamily& family);
// The reference, the fast path, and the vector kernel of format at every
// level this CPU runs (the levels it does not run are left out).
std::vector<KernelPath> all_paths(const SchemeFamily& family, microscale::Format format);

// Runs path over weight [rows, cols] of dtype in row chunks of chunk_rows
// (all rows when 0), with tensor_amax for the families that need it.
KernelOutput run_family(const SchemeFamily& family, const QuantArgs& args, DType dtype,
                        std::uint64_t rows, std::uint64_t cols,
                        const std::vector<std::byte>& weight, float tensor_amax,
                        const KernelPath& path, std::uint64_t chunk_rows = 0);
// The same with the reference (fast false) or the fast path (fast true).
KernelOutput run_family(const SchemeFamily& family, const QuantArgs& args, DType dtype,
                        std::uint64_t rows, std::uint64_t cols,
                        const std::vector<std::byte>& weight, float tensor_amax, bool fast,
                        std::uint64_t chunk_rows = 0);

// "" when a and b are the same outputs (first non-finite index, and when
// there is none every output's bytes), otherwise the first difference: "output 1 byte 37: 7b,
// expected 7a".
std::string first_difference(const KernelOutput& actual, const KernelOutput& expected);

// max |w| of a weight of dtype, exactly.
float weight_amax(DType dtype, const std::vector<std::byte>& weight);

// One tensor of a checkpoint directory, read from whichever shard holds it.
struct Tensor {
  std::string name;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> data;
};

// Every tensor of every *.safetensors file of dir, by name (names are unique
// across the checkpoint), and the file that holds each.
struct CheckpointTensors {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> file_of;
};
CheckpointTensors read_checkpoint_tensors(const std::filesystem::path& dir);

// (tensor name, shard file) in index order: the input's
// model.safetensors.index.json weight_map, or the names of model.safetensors
// in header order for a single-file checkpoint.
std::vector<std::pair<std::string, std::string>> input_weight_map(const std::filesystem::path& dir);

// The 3-D MoE split of schemes.md section 8 applied to a checkpoint's
// tensors: `...gate_up_proj` [E, 2I, H] becomes `...{e}.gate_proj.weight`
// (rows [0, I) of expert e) and `...{e}.up_proj.weight`, `...down_proj`
// [E, H, I] becomes `...{e}.down_proj.weight`.
void split_moe_experts(std::map<std::string, Tensor>& tensors);

// The result of checking a golden case module by module.
struct GoldenCheck {
  std::vector<std::string> modules;      // every module quantized in expected/, sorted
  std::vector<std::string> differences;  // one line per output tensor that differs
};

// For every module M that expected holds an `M.weight_scale` for, runs
// family over the input's `M.weight` (amax_of[M] as tensor_amax, 0 when
// absent) and compares each output tensor `M.<suffix>` of family.outputs()
// with expected's: dtype, shape and bytes.
GoldenCheck check_golden_modules(const SchemeFamily& family, const QuantArgs& args,
                                 const std::map<std::string, Tensor>& input,
                                 const CheckpointTensors& expected,
                                 const std::map<std::string, float>& amax_of,
                                 const KernelPath& path, std::uint64_t chunk_rows = 0);

}  // namespace ctquant::test
