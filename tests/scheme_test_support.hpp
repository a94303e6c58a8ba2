// Helpers for the tests of scheme rows: running a row's kernel over a whole
// weight in row chunks, as the executor does, and comparing a row's outputs
// with the tensors of a golden fixture.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/safetensors.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "test_support.hpp"

namespace ctquant::test {

inline std::size_t element_size(DType dtype) {
  return static_cast<std::size_t>(dtype_bits(dtype) / 8);
}

// max |w| over n elements of dtype, as the planner's pre-pass gives it to
// families with needs_tensor_amax (non-finite elements skipped).
inline float max_magnitude(DType dtype, std::span<const std::byte> weight) {
  float amax = 0.0f;
  const std::size_t esize = element_size(dtype);
  for (std::size_t i = 0; i < weight.size() / esize; ++i) {
    const float w = load_as_float(dtype, weight.data() + i * esize);
    if (std::isfinite(w)) amax = std::max(amax, std::fabs(w));
  }
  return amax;
}

// What a row writes for one weight: every output tensor of outputs(), in
// that order, and the index of the first non-finite weight if any.
struct FamilyOutput {
  std::optional<std::uint64_t> bad;
  std::vector<OutputTensorSpec> specs;
  std::vector<std::vector<std::byte>> tensors;
};

// Runs `kernel` of `family` over a weight [rows, cols] of dtype in chunks of
// chunk_rows rows (0: one chunk; otherwise rounded up to the family's row
// alignment), kRows tensors filled chunk by chunk at bytes_before(r0),
// kWhole tensors from whole_tensor. Output buffers start as `fill`, so a
// byte a kernel leaves unwritten shows up.
using AnyKernel = std::function<std::optional<std::uint64_t>(const QuantArgs&, const KernelIo&)>;

inline FamilyOutput run_family(const SchemeFamily& family, const AnyKernel& kernel,
                               const QuantArgs& args,
                               DType dtype, std::uint64_t rows, std::uint64_t cols,
                               std::span<const std::byte> weight, std::uint64_t chunk_rows = 0,
                               std::byte fill = std::byte{0xCD}) {
  FamilyOutput out;
  out.specs = family.outputs(args, dtype, rows, cols);
  const float amax = family.needs_tensor_amax(args) ? max_magnitude(dtype, weight) : 0.0f;
  std::size_t whole_index = 0;
  for (const OutputTensorSpec& spec : out.specs) {
    if (spec.fill == OutputTensorSpec::Fill::kWhole) {
      out.tensors.push_back(family.whole_tensor(args, dtype, rows, cols, amax, whole_index++));
    } else {
      out.tensors.emplace_back(spec.byte_size(), fill);
    }
  }
  const std::uint64_t align = family.row_alignment(args);
  std::uint64_t step = chunk_rows == 0 ? rows : chunk_rows;
  step = std::max<std::uint64_t>(align, (step + align - 1) / align * align);
  const std::size_t esize = element_size(dtype);
  for (std::uint64_t r0 = 0; r0 < rows; r0 += step) {
    const std::uint64_t r1 = std::min(rows, r0 + step);
    std::vector<std::byte> scratch(family.scratch_bytes(args, r1 - r0, cols));
    KernelIo io;
    io.dtype = dtype;
    io.n_rows = r1 - r0;
    io.n_cols = cols;
    io.row_begin = r0;
    io.weight = weight.data() + r0 * cols * esize;
    io.tensor_amax = amax;
    io.scratch = scratch;
    std::size_t k = 0;
    for (std::size_t i = 0; i < out.specs.size(); ++i) {
      if (out.specs[i].fill == OutputTensorSpec::Fill::kRows) {
        io.out[k++] = out.tensors[i].data() + out.specs[i].bytes_before(r0);
      }
    }
    const auto bad = kernel(args, io);
    if (bad && !out.bad) out.bad = r0 * cols + *bad;
  }
  return out;
}

// Python's re.match: the pattern must match at the start of the name (not
// necessarily the whole name). Patterns of the fixtures' configs only.
inline bool python_re_match(const std::string& pattern, const std::string& text) {
  return std::regex_search(text, std::regex(pattern), std::regex_constants::match_continuous);
}

// A golden case's name as a test name ("llama-bf16-w8a8" -> "llama_bf16_w8a8").
inline std::string golden_case_test_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string name = param.param;
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

// The bytes, dtype and shape of one tensor of a safetensors file.
struct StoredTensor {
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> bytes;
};

inline std::optional<StoredTensor> read_stored(const SafetensorsFile& file,
                                               const std::string& name) {
  const TensorEntry* entry = file.header().find(name);
  if (entry == nullptr) return std::nullopt;
  StoredTensor t{entry->dtype, entry->shape, std::vector<std::byte>(entry->byte_size())};
  file.read(entry->begin, t.bytes);
  return t;
}

// The first byte at which two buffers differ, for messages.
inline std::string first_difference(std::span<const std::byte> actual,
                                    std::span<const std::byte> expected) {
  if (actual.size() != expected.size()) {
    return fmt::format("{} bytes, expected {}", actual.size(), expected.size());
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] != expected[i]) {
      return fmt::format("byte {}: 0x{:02x}, expected 0x{:02x}", i,
                         std::to_integer<unsigned>(actual[i]),
                         std::to_integer<unsigned>(expected[i]));
    }
  }
  return {};
}

// One quantized module of a golden case and the row that writes it.
struct GoldenModule {
  std::string module;
  QuantArgs args;
  const SchemeFamily* family = nullptr;
};

// The modules of golden case `name` that one of `families` writes: every
// 2-D `.weight` of the case's input that its ignore list leaves, assigned
// to the first config group whose targets match it (or to the preset), the
// group's args inferred to the first of `families` (in format priority
// order) whose `writes` accepts them and whose `supports` takes them.
// Presets are looked up among the families' presets.
inline std::vector<GoldenModule> golden_modules(const std::string& name,
                                                std::span<const SchemeFamily* const> families) {
  nlohmann::json the_case;
  for (const nlohmann::json& c : read_json(golden_dir() / "cases.json")) {
    if (c.at("case") == name) the_case = c;
  }
  if (the_case.is_null()) throw std::runtime_error("no golden case " + name);
  struct Group {
    std::vector<std::string> targets;
    QuantArgs args;
    const SchemeFamily* family = nullptr;
  };
  std::vector<Group> groups;
  if (the_case.at("scheme") == "config") {
    for (const auto& [key, g] : the_case.at("config").at("config_groups").items()) {
      Group group{g.at("targets").get<std::vector<std::string>>(),
                  quant_args_from_json(g.at("weights"), name + ": " + key), nullptr};
      const bool has_ia = g.contains("input_activations") && !g.at("input_activations").is_null();
      for (const SchemeFamily* f : families) {
        if (f->writes(group.args, has_ia)) {
          if (f->supports(group.args).empty()) group.family = f;
          break;
        }
      }
      groups.push_back(group);
    }
  } else {
    for (const SchemeFamily* f : families) {
      for (const Preset& p : f->presets) {
        if (p.name == the_case.at("scheme")) groups.push_back({{"Linear"}, p.weights, f});
      }
    }
  }
  const auto matches = [](const std::string& entry, const std::string& module) {
    if (entry.rfind("re:", 0) == 0) return python_re_match(entry.substr(3), module);
    return entry == "Linear" || entry == module;
  };
  const std::vector<std::string> ignore = the_case.at("ignore").get<std::vector<std::string>>();
  const SafetensorsFile input(golden_dir() / name / "input" / "model.safetensors", name);
  std::vector<GoldenModule> out;
  for (const TensorEntry& t : input.header().tensors) {
    const std::string suffix = ".weight";
    if (t.shape.size() != 2 || t.name.size() <= suffix.size() ||
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string module = t.name.substr(0, t.name.size() - suffix.size());
    if (std::any_of(ignore.begin(), ignore.end(),
                    [&](const std::string& e) { return matches(e, module); })) {
      continue;
    }
    for (const Group& g : groups) {
      if (std::any_of(g.targets.begin(), g.targets.end(),
                      [&](const std::string& e) { return matches(e, module); })) {
        if (g.family != nullptr) out.push_back({module, g.args, g.family});
        break;
      }
    }
  }
  return out;
}

// Runs each module's row over its input weight and compares every output
// tensor with the case's expected/model.safetensors: the set of tensors
// named `module.*`, and each one's dtype, shape and bytes. The reference
// and the fast kernel run over the whole weight and in chunks of one row
// alignment and of three. Returns the number of modules compared.
inline std::size_t expect_golden_case(const std::string& name,
                                      std::span<const SchemeFamily* const> families) {
  const std::vector<GoldenModule> modules = golden_modules(name, families);
  const SafetensorsFile input(golden_dir() / name / "input" / "model.safetensors", name);
  const SafetensorsFile expected(golden_dir() / name / "expected" / "model.safetensors", name);
  for (const GoldenModule& m : modules) {
    SCOPED_TRACE(name + ": " + m.module + " (" + std::string(m.family->format) + ")");
    const std::optional<StoredTensor> w = read_stored(input, m.module + ".weight");
    const std::uint64_t rows = w->shape[0];
    const std::uint64_t cols = w->shape[1];
    EXPECT_EQ(m.family->refuse(m.args, rows, cols), "");
    // Every tensor of the module in the expected file, by suffix.
    std::vector<std::string> expected_suffixes;
    for (const TensorEntry& t : expected.header().tensors) {
      if (t.name.rfind(m.module + ".", 0) == 0) {
        expected_suffixes.push_back(t.name.substr(m.module.size() + 1));
      }
    }
    std::sort(expected_suffixes.begin(), expected_suffixes.end());
    struct Variant {
      const char* label;
      KernelFn kernel;
      std::uint64_t chunk_rows;
    };
    const std::uint64_t align = m.family->row_alignment(m.args);
    const Variant variants[] = {{"reference", m.family->quantize_ref, 0},
                                {"fast", m.family->quantize, 0},
                                {"reference, chunks of one alignment", m.family->quantize_ref, align},
                                {"fast, chunks of three alignments", m.family->quantize, 3 * align}};
    for (const Variant& v : variants) {
      SCOPED_TRACE(v.label);
      const FamilyOutput out =
          run_family(*m.family, v.kernel, m.args, w->dtype, rows, cols, w->bytes, v.chunk_rows);
      EXPECT_FALSE(out.bad.has_value());
      std::vector<std::string> suffixes;
      for (std::size_t i = 0; i < out.specs.size(); ++i) {
        const OutputTensorSpec& spec = out.specs[i];
        suffixes.push_back(spec.suffix);
        const std::optional<StoredTensor> e = read_stored(expected, m.module + "." + spec.suffix);
        if (!e) {
          ADD_FAILURE() << spec.suffix << " is not in the expected file";
          continue;
        }
        EXPECT_EQ(dtype_tag(spec.dtype), dtype_tag(e->dtype)) << spec.suffix;
        EXPECT_EQ(spec.shape, e->shape) << spec.suffix;
        EXPECT_EQ(first_difference(out.tensors[i], e->bytes), "") << spec.suffix;
      }
      std::sort(suffixes.begin(), suffixes.end());
      EXPECT_EQ(suffixes, expected_suffixes);
    }
  }
  return modules.size();
}

}  // namespace ctquant::test
