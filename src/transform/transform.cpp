// The transform registry and the rewrite every row's plan is applied with
// (transform/transform.hpp).
#include "ctquant/transform/transform.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <unistd.h>

#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "transform/balance.hpp"
#include "transform/rotate.hpp"
#include "transform/staged_files.hpp"

namespace ctquant {
namespace {

constexpr TransformRow kTransforms[] = {
    {"balance",
     "column balancing absorbed into the producers (NNCF's data-free AWQ scale): Llama-like "
     "blocks only",
     detail::plan_balance, detail::derive_balance},
    {"rotate",
     "offline Hadamard rotations absorbed into the weights (R1 on the residual stream, R2 per "
     "head; norms folded, a tied head untied): Llama-like blocks only",
     detail::plan_rotate, nullptr, detail::write_rotated_source},
};

// A float that rounds to the same BF16 or F16 as `value` would directly:
// `value` rounded to float toward zero, its last bit set when inexact
// (round to odd), so that the second rounding sees the sticky bit.
float round_to_odd_float(double value) {
  float f = static_cast<float>(value);
  if (static_cast<double>(f) == value || !std::isfinite(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(value)) {
    // One float toward zero (f is finite and not zero here).
    f = std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) - 1u);
  }
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);
}

}  // namespace

const TensorRewrite* RewritePlan::find(std::string_view tensor) const {
  const auto it = std::lower_bound(
      tensors.begin(), tensors.end(), tensor,
      [](const TensorRewrite& r, std::string_view name) { return r.tensor < name; });
  return it != tensors.end() && it->tensor == tensor ? &*it : nullptr;
}

nlohmann::json RewritePlan::record() const {
  nlohmann::json out = {{"transform", transform}};
  for (const auto& [key, value] : details.items()) out[key] = value;
  out["rewritten_tensors"] = tensors.size();
  out["note"] =
      "offline: the weights hold the rewritten model; nothing to apply at inference "
      "(quantization_config.transform_config stays empty)";
  return out;
}

bool transform_stages_source(std::string_view name) {
  return find_transform(name).write_source != nullptr;
}

namespace detail {

void write_json_file(const std::filesystem::path& path, const nlohmann::json& value) {
  OutputFile file(path);
  const std::string text = value.dump(2) + "\n";
  file.write_at(0, std::as_bytes(std::span<const char>(text.data(), text.size())));
  file.sync_and_close();
}

void write_staged_files(const Checkpoint& checkpoint, const std::filesystem::path& dir,
                        const nlohmann::json& config, const nlohmann::json* index) {
  write_json_file(dir / kConfigFileName, config);
  if (index != nullptr) write_json_file(dir / kIndexFileName, *index);
  for (const std::string& name : checkpoint.other_files) {
    const std::filesystem::path from = std::filesystem::canonical(checkpoint.root / name);
    std::error_code ec;
    std::filesystem::create_hard_link(from, dir / name, ec);
    if (ec) std::filesystem::copy_file(from, dir / name);
  }
}

bool open_staged_shard(const std::filesystem::path& path, const ShardLayout& laid, bool with_data,
                       std::optional<OutputFile>& file) {
  file.emplace(path);
  file->write_at(0, std::as_bytes(std::span<const char>(laid.header.data(), laid.header.size())));
  if (with_data) return true;
  if (laid.file_size > laid.data_start) {
    const std::byte zero{};
    file->write_at(laid.file_size - 1, std::span<const std::byte>(&zero, 1));
  }
  file->sync_and_close();
  return false;
}

namespace {

// The rewritten source of a per-element row (balance): every shard with
// its tensors in the same places, the rewritten ones read in chunks of
// about 8 MiB and rewritten by apply_rewrite (plan derived).
void write_elementwise_source(const Checkpoint& checkpoint, const std::filesystem::path& dir,
                              bool with_data, const RewritePlan& plan) {
  std::filesystem::create_directories(dir);
  std::vector<std::byte> buffer;
  for (const SafetensorsFile& shard : checkpoint.shards) {
    const SafetensorsHeader& header = shard.header();
    std::vector<TensorSpec> specs;
    for (const TensorEntry& e : header.tensors) {
      specs.push_back({e.name, e.dtype, e.shape, e.byte_size()});
    }
    const ShardLayout laid = layout_shard(specs, header.metadata);
    std::optional<OutputFile> staged;
    if (!open_staged_shard(dir / shard.path().filename(), laid, with_data, staged)) continue;
    OutputFile& file = *staged;
    for (std::size_t t = 0; t < header.tensors.size(); ++t) {
      poll_cancel();
      const TensorEntry& e = header.tensors[t];
      const std::uint64_t at = laid.data_start + laid.offsets[t];
      const TensorRewrite* r = plan.find(e.name);
      if (r == nullptr) {
        const FdLease fd = shard.descriptor();
        file.copy_from(fd->get(), header.data_start + e.begin, at, e.byte_size());
        continue;
      }
      const std::uint64_t size = dtype_bits(e.dtype) / 8;
      const std::uint64_t row_bytes = r->cols * size;
      const std::uint64_t step = std::max<std::uint64_t>(1, (std::uint64_t{8} << 20) / row_bytes);
      for (std::uint64_t r0 = 0; r0 < r->rows; r0 += step) {
        poll_cancel();
        const std::uint64_t n = std::min(step, r->rows - r0);
        buffer.resize(n * row_bytes);
        shard.read(e.begin + r0 * row_bytes, buffer);
        apply_rewrite(plan, *r, e.dtype, r0 * r->cols, n * r->cols, buffer.data());
        file.write_at(at + r0 * row_bytes, buffer);
      }
    }
    file.sync_and_close();
  }
  nlohmann::json config = *checkpoint.config;
  config["ctquant_transform"] = plan.record();
  write_staged_files(checkpoint, dir, config, checkpoint.has_index ? &checkpoint.index : nullptr);
}

}  // namespace
}  // namespace detail

std::filesystem::path temporary_path(std::string_view tag, std::string_view purpose) {
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec || !std::filesystem::is_directory(tmp, ec) || ::access(tmp.c_str(), W_OK | X_OK) != 0) {
    const char* env = std::getenv("TMPDIR");
    throw usage_error(fmt::format(
        "no usable temporary directory ({}{}): ctquant writes {} there; set TMPDIR to a "
        "writable directory",
        env != nullptr ? fmt::format("TMPDIR={}: ", env) : "/tmp: ",
        ec ? ec.message() : std::string(std::strerror(errno)), purpose));
  }
  return tmp / fmt::format("ctquant-{}-{}-{}", tag, ::getpid(),
                           std::chrono::steady_clock::now().time_since_epoch().count());
}

std::filesystem::path staged_source_dir(const std::filesystem::path& output,
                                        std::string_view name) {
  std::filesystem::path out = std::filesystem::absolute(output).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // OUTPUT given as "dir/"
  return out.parent_path() / fmt::format(".{}.ctquant-{}", out.filename().string(), name);
}

std::string staged_source_refusal(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) {
    return fmt::format(
        "{} exists: the rewritten source of a run that stopped (ctquant does not remove it); "
        "if no ctquant run is using it, remove it: rm -rf {}",
        dir.string(), shell_word(dir.string()));
  }
  if (::access(dir.parent_path().c_str(), W_OK | X_OK) != 0) {
    return fmt::format("cannot write the rewritten source in {} ({})", dir.parent_path().string(),
                       std::strerror(errno));
  }
  return "";
}

StagedSource::StagedSource(const Checkpoint& checkpoint, const RewritePlan& plan,
                           std::filesystem::path dir, bool with_data)
    : dir_(std::move(dir)) {
  if (std::filesystem::exists(dir_)) {
    throw usage_error(
        fmt::format("--transform {}: {}", plan.transform, staged_source_refusal(dir_)));
  }
  try {
    const TransformRow& row = find_transform(plan.transform);
    if (row.write_source != nullptr) {
      row.write_source(checkpoint, dir_, with_data, plan);
    } else {
      detail::write_elementwise_source(checkpoint, dir_, with_data, plan);
    }
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw;
  }
}

StagedSource::~StagedSource() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string rewrite_refusal_reason(std::string message) {
  if (const auto fix = message.find("\n  fix:"); fix != std::string::npos) message.resize(fix);
  return replace_all(std::move(message), " (nothing was written)", "");
}

std::unique_ptr<StagedSource> stage_source_for_output(
    const std::optional<nlohmann::json>& output_config, const std::filesystem::path& input,
    const std::function<void()>& before_writing, std::string* refused) {
  if (!output_config || !output_config->is_object()) return nullptr;
  const auto t = output_config->find("ctquant_transform");
  if (t == output_config->end() || !t->is_object() || !t->contains("transform") ||
      !(*t)["transform"].is_string()) {
    return nullptr;
  }
  const std::string name = (*t)["transform"].get<std::string>();
  const auto row = std::find_if(kTransforms, std::end(kTransforms),
                                [&](const TransformRow& r) { return r.name == name; });
  if (row == std::end(kTransforms) || row->write_source == nullptr) return nullptr;
  // Read-only: links out of the directory (a cache snapshot) are followed.
  const Checkpoint checkpoint = open_checkpoint(input, OpenOptions{.follow_links_outside = true});
  std::shared_ptr<const RewritePlan> plan;
  try {
    plan = plan_transform(checkpoint, name);
  } catch (const Error& e) {
    // The refusal speaks to a quantize run ("fix: run without ..."): here
    // OUTPUT says it was made with the rewrite, so INPUT is not its source.
    const std::string why = rewrite_refusal_reason(e.what());
    if (refused != nullptr) {
      *refused = why;
      return nullptr;
    }
    throw Error(e.kind(),
                fmt::format("OUTPUT's config.json records --transform {}, but INPUT cannot be "
                            "rewritten so again: {}\n  fix: give as INPUT the checkpoint "
                            "OUTPUT was quantized from",
                            name, why));
  }
  const std::filesystem::path dir = temporary_path(
      "source-" + name, fmt::format("INPUT rewritten by --transform {} to compare with", name));
  if (before_writing) before_writing();
  return std::make_unique<StagedSource>(checkpoint, *plan, dir, true);
}

std::span<const TransformRow> transform_rows() { return kTransforms; }

const TransformRow& find_transform(std::string_view name) {
  std::vector<std::string> names;
  for (const TransformRow& row : kTransforms) {
    if (row.name == name) return row;
    names.emplace_back(row.name);
  }
  throw usage_error(
      fmt::format("--transform {}: unknown transform (known: {})", name, join(names, 100)));
}

std::shared_ptr<const RewritePlan> plan_transform(const Checkpoint& checkpoint,
                                                  std::string_view name) {
  const TransformRow& row = find_transform(name);
  auto plan = std::make_shared<RewritePlan>(row.plan(checkpoint));
  plan->transform = std::string(row.name);
  std::sort(plan->tensors.begin(), plan->tensors.end(),
            [](const TensorRewrite& a, const TensorRewrite& b) { return a.tensor < b.tensor; });
  return plan;
}

std::shared_ptr<const RewritePlan> derive_transform(const Checkpoint& checkpoint,
                                                    const RewritePlan& planned) {
  auto plan = std::make_shared<RewritePlan>(planned);
  if (plan->staged_source) return plan;  // written as a rewritten source: nothing to derive
  const TransformRow& row = find_transform(plan->transform);
  if (row.derive == nullptr) {
    throw std::logic_error(fmt::format(
        "derive_transform: --transform {} writes a rewritten source; nothing to derive", row.name));
  }
  row.derive(checkpoint, *plan);
  plan->derived = true;
  return plan;
}

void store_rounded(DType dtype, double value, std::byte* element) {
  switch (dtype) {
    case DType::kBF16: {
      const std::uint16_t bits = float_to_bf16(round_to_odd_float(value));
      std::memcpy(element, &bits, sizeof bits);
      return;
    }
    case DType::kF16: {
      const std::uint16_t bits = float_to_f16(round_to_odd_float(value));
      std::memcpy(element, &bits, sizeof bits);
      return;
    }
    case DType::kF32: {
      const float f = static_cast<float>(value);
      std::memcpy(element, &f, sizeof f);
      return;
    }
    default:
      throw std::logic_error(fmt::format("store_rounded: dtype {}", dtype_tag(dtype)));
  }
}

void apply_rewrite(const RewritePlan& plan, const TensorRewrite& rewrite, DType dtype,
                   std::uint64_t first, std::uint64_t n, std::byte* data) {
  if (plan.staged_source) return;  // the source read is the rewritten one
  if (!plan.derived)
    throw std::logic_error("apply_rewrite: the transform's scales are not derived");
  const std::size_t size = dtype_bits(dtype) / 8;
  const double* row_mul = rewrite.row_mul ? plan.scales[*rewrite.row_mul].data() : nullptr;
  const double* col_div = rewrite.col_div ? plan.scales[*rewrite.col_div].data() : nullptr;
  const double* col_mul = rewrite.col_mul ? plan.scales[*rewrite.col_mul].data() : nullptr;
  for (std::uint64_t k = 0; k < n; ++k) {
    const std::uint64_t e = first + k;
    const std::uint64_t i = e / rewrite.cols;
    const std::uint64_t j = e % rewrite.cols;
    std::byte* p = data + k * size;
    double v = load_as_float(dtype, p);
    if (row_mul != nullptr) v *= row_mul[i];
    if (col_div != nullptr) v /= col_div[j];
    if (col_mul != nullptr) v *= col_mul[j];
    store_rounded(dtype, v, p);
  }
}

void read_rows_as_double(const Checkpoint& checkpoint, const std::string& tensor,
                         std::uint64_t row_begin, std::uint64_t row_end, std::vector<double>& out) {
  const auto it = checkpoint.tensors.find(tensor);
  if (it == checkpoint.tensors.end()) {
    throw std::logic_error(fmt::format("read_rows_as_double: no tensor '{}'", tensor));
  }
  const TensorEntry& e = checkpoint.entry(it->second);
  const std::uint64_t cols = e.shape.empty() ? 1 : e.shape.back();
  const std::size_t size = dtype_bits(e.dtype) / 8;
  std::vector<std::byte> bytes((row_end - row_begin) * cols * size);
  checkpoint.shards[it->second.shard].read(e.begin + row_begin * cols * size, bytes);
  out.resize((row_end - row_begin) * cols);
  for (std::size_t k = 0; k < out.size(); ++k) {
    out[k] = static_cast<double>(load_as_float(e.dtype, bytes.data() + k * size));
  }
}

}  // namespace ctquant
