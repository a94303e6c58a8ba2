// `--transform rotate`: offline Hadamard rotations of the residual stream
// (R1) and of each attention head's values (R2), as QuaRot and SpinQuant
// with fixed Hadamards (llm-compressor's SpinQuantModifier R1 and R2,
// `pipeline="datafree"`) absorb them into the weights. The rewritten model
// computes the same function (docs/cli.md `--transform rotate`; the float64
// forward pass of tests/test_transform_rotate.cpp), so vLLM and
// transformers load it as an ordinary checkpoint.
//
// With Q1 = D H_hidden / sqrt(hidden) and R2 = D' H_head_dim / sqrt(head_dim)
// (transform/hadamard.hpp; seeds kR1Seed and kR2Seed), a residual stream x
// becomes x Q1:
//   - every RMSNorm's g is folded into its consumers' columns and set to 1
//     (an RMSNorm with g = 1 commutes with an orthogonal Q: its output's
//     rms is that of its input);
//   - the embedding's rows: E Q1;
//   - the producers of the residual stream, o_proj and down_proj: Q1^T W
//     (each column c becomes Q1^T c: rows are mixed);
//   - its consumers q/k/v, gate/up and the head: W diag(g) Q1 (each row);
//   - R2 per KV head on v_proj's rows (R2^T W_h) and per query head on
//     o_proj's columns (W R2): attention's output for a head is a weighted
//     sum of its KV head's values, so the head's output is rotated by R2
//     and o_proj undoes it;
//   - tied embeddings are untied: lm_head.weight is written (the rotated
//     embedding times the final norm's g) and tie_word_embeddings set false,
//     so vLLM builds the head as a ParallelLMHead and loads lm_head.weight
//     (vllm/model_executor/models/qwen3.py, Qwen3ForCausalLM.__init__ and
//     load_weights: lm_head is skipped only when tied); the default ignore
//     list keeps it in 16 bits.
// Qwen3's q_norm and k_norm act on q and k per head after their
// projections, which R1 leaves unchanged. Rows are mixed, so the rewrite is
// not a per-chunk rewrite (transform/transform.hpp): the run writes the
// rewritten source as a checkpoint of its own first (write_rotated_source)
// and quantizes that; each tensor is computed in double from its stored
// values and rounded once to its dtype.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/model/rewrite_rules.hpp"
#include "ctquant/transform/hadamard.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "transform/rotate.hpp"
#include "transform/staged_files.hpp"

namespace ctquant::detail {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::uint64_t kR1Seed = 0;
constexpr std::uint64_t kR2Seed = 1;
constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kHead = "lm_head.weight";
constexpr const char* kFinalNorm = "model.norm.weight";
// Doubles held per strip of a tensor being rewritten (32 MiB).
constexpr std::uint64_t kStripValues = std::uint64_t{1} << 22;

// How one output tensor is computed from `source` (an input tensor).
struct RotateOp {
  std::string source;
  std::string gamma;    // a norm whose g multiplies the columns first ("": none)
  bool ones = false;    // a norm: every element 1
  bool r1_in = false;   // each row x <- x Q1
  bool r2_in = false;   // each row, per head segment: x <- x R2
  bool r1_out = false;  // each column c <- Q1^T c (all rows)
  bool r2_out = false;  // each column, per KV-head block of rows: c <- R2^T c
  std::string what;     // for inspect --plan and --dry-run
};

struct RotateLayout {
  std::map<std::string, RotateOp> ops;  // by output tensor name
  std::uint64_t hidden = 0, head_dim = 0;
  bool untie = false;
  std::vector<std::string> problems;
};

bool config_tied(const Checkpoint& checkpoint) {
  if (!checkpoint.config) return false;
  const auto it = checkpoint.config->find("tie_word_embeddings");
  return it != checkpoint.config->end() && it->is_boolean() && it->get<bool>();
}

// The families whose blocks are pre-norm Llama blocks, dense or with a
// mixture of experts whose router and experts all read the post-attention
// norm (transformers' modeling_llama.py, modeling_mistral.py,
// modeling_qwen3.py, modeling_qwen3_moe.py, modeling_mixtral.py).
const std::set<std::string> kRotateArchitectures{"LlamaForCausalLM", "MistralForCausalLM",
                                                 "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                                                 "MixtralForCausalLM"};

enum class Role { kInputNorm, kPostNorm, kAttnIn, kV, kO, kMlpIn, kMlpOut, kKeep };

// A tensor of a block by its name after the block prefix, or nullopt.
std::optional<Role> block_role(const std::string& n) {
  static const std::regex kExpertIn(
      R"(^(mlp\.experts\.\d+\.(gate_proj|up_proj)\.weight|mlp\.experts\.gate_up_proj|mlp\.shared_expert\.(gate_proj|up_proj)\.weight|block_sparse_moe\.experts\.\d+\.w[13]\.weight)$)");
  static const std::regex kExpertOut(
      R"(^(mlp\.experts\.\d+\.down_proj\.weight|mlp\.experts\.down_proj|mlp\.shared_expert\.down_proj\.weight|block_sparse_moe\.experts\.\d+\.w2\.weight)$)");
  if (n == "input_layernorm.weight") return Role::kInputNorm;
  if (n == "post_attention_layernorm.weight") return Role::kPostNorm;
  if (n == "self_attn.q_proj.weight" || n == "self_attn.k_proj.weight") return Role::kAttnIn;
  if (n == "self_attn.v_proj.weight") return Role::kV;
  if (n == "self_attn.o_proj.weight") return Role::kO;
  // Qwen3's q_norm and k_norm act per head after q_proj and k_proj.
  if (n == "self_attn.q_norm.weight" || n == "self_attn.k_norm.weight") return Role::kKeep;
  // Older Llama checkpoints store RoPE's frequencies; they act on q and k
  // per head, like the norms (vLLM skips them when it loads).
  if (n == "self_attn.rotary_emb.inv_freq") return Role::kKeep;
  if (n == "mlp.gate_proj.weight" || n == "mlp.up_proj.weight") return Role::kMlpIn;
  if (n == "mlp.down_proj.weight") return Role::kMlpOut;
  // Routers: a Linear of the post-attention norm's output, like the experts.
  if (n == "mlp.gate.weight" || n == "mlp.shared_expert_gate.weight" ||
      n == "block_sparse_moe.gate.weight") {
    return Role::kMlpIn;
  }
  if (std::regex_match(n, kExpertIn)) return Role::kMlpIn;
  if (std::regex_match(n, kExpertOut)) return Role::kMlpOut;
  return std::nullopt;
}

RotateLayout rotate_layout(const Checkpoint& checkpoint) {
  RewriteFamily family = rewrite_family(checkpoint);
  RotateLayout layout;
  layout.head_dim = family.head_dim;
  auto& problems = layout.problems;
  if (!checkpoint.config || !checkpoint.config->is_object()) {
    layout.problems = std::move(family.problems);
    return layout;
  }
  if (!kRotateArchitectures.contains(family.arch)) {
    std::string why = rewrite_family_reason(family.model_type, family.arch);
    if (why.find("mixture of experts") != std::string::npos) {
      why =
          "no rule says its blocks are pre-norm Llama blocks with experts that all read the "
          "post-attention norm";
    }
    problems.push_back(fmt::format("config.json: architecture '{}' (model_type '{}'): {}",
                                   family.arch, family.model_type, why));
  }
  for (std::string& p : family.problems) problems.push_back(std::move(p));
  // A quantized input (FP8, AWQ, ModelOpt, compressed-tensors) is one
  // reason, not one per tensor it stores.
  if (!family.quantized.empty()) {
    problems.push_back(family.quantized +
                       ": the rotation rewrites BF16, F16 and F32 weights only; rotate the "
                       "16-bit model it was made from");
    return layout;
  }
  const TensorEntry* embed = checkpoint.find(kEmbed);
  const TensorEntry* norm = checkpoint.find(kFinalNorm);
  const TensorEntry* head = checkpoint.find(kHead);
  if (head == nullptr && !config_tied(checkpoint)) {
    problems.push_back(fmt::format(
        "{}: missing, and config.json's tie_word_embeddings is not true: the head is not in "
        "the checkpoint, so the model it would be rotated with is unknown",
        kHead));
  }
  if (embed == nullptr || embed->shape.size() != 2) {
    problems.push_back(fmt::format(
        "{}: missing or not 2-D: R1 rotates the embedding, which must be in the checkpoint",
        kEmbed));
  }
  if (norm == nullptr || norm->shape.size() != 1) {
    problems.push_back(
        fmt::format("{}: missing or not 1-D: the final norm's g is folded into "
                    "the head",
                    kFinalNorm));
  }
  layout.untie = config_tied(checkpoint) || head == nullptr;
  if (!layout.untie && head->shape.size() != 2) {
    problems.push_back(fmt::format("{}: not 2-D", kHead));
  }
  auto& ops = layout.ops;
  // Every tensor of every block, by block prefix.
  static const std::regex kBlock(R"(^(model\.layers\.(\d+)\.)(.*)$)");
  std::map<std::uint64_t, std::map<std::string, Role>> blocks;
  std::map<std::uint64_t, std::string> prefixes;
  for (const auto& [name, at] : checkpoint.tensors) {
    if (name == kEmbed || name == kFinalNorm || name == kHead) continue;
    std::smatch m;
    std::optional<Role> role;
    if (std::regex_match(name, m, kBlock)) role = block_role(m[3].str());
    if (!role) {
      problems.push_back(fmt::format(
          "{}: not part of a pre-norm Llama block, the embedding, the final norm or the head "
          "(a bias, a sandwich or post norm, an attention output gate, a draft's fc): what it "
          "reads or writes would need the rotation too",
          name));
      continue;
    }
    const std::uint64_t layer = std::stoull(m[2].str());
    prefixes[layer] = m[1].str();
    blocks[layer][m[3].str()] = *role;
  }
  if (blocks.empty()) problems.push_back("no decoder blocks (tensors named 'model.layers.N....')");
  for (const auto& [layer, names] : blocks) {
    const std::string& p = prefixes[layer];
    const std::string in_norm = p + "input_layernorm.weight";
    const std::string post_norm = p + "post_attention_layernorm.weight";
    bool has_in = false, has_out = false;
    for (const char* n :
         {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight"}) {
      if (!names.contains(n)) problems.push_back(fmt::format("{}{}: missing", p, n));
    }
    for (const auto& [n, role] : names) {
      const std::string name = p + n;
      switch (role) {
        case Role::kInputNorm:
          ops[name] = {name,  "",    true,  false,
                       false, false, false, "rotate: g folded into q/k/v_proj, set to 1"};
          break;
        case Role::kPostNorm:
          ops[name] = {name,
                       "",
                       true,
                       false,
                       false,
                       false,
                       false,
                       "rotate: g folded into the MLP's inputs (gate/up, router, experts), set "
                       "to 1"};
          break;
        case Role::kAttnIn:
          ops[name] = {name,  in_norm, false, true,
                       false, false,   false, "rotate: columns × g(input_layernorm), rows × Q1"};
          break;
        case Role::kV:
          ops[name] = {name,
                       in_norm,
                       false,
                       true,
                       false,
                       false,
                       true,
                       "rotate: columns × g(input_layernorm), rows × Q1, each KV head's rows "
                       "R2^T ×"};
          break;
        case Role::kO:
          ops[name] = {name, "",   false, false,
                       true, true, false, "rotate: Q1^T × (rows mixed), each head's columns × R2"};
          break;
        case Role::kMlpIn:
          has_in = true;
          ops[name] = {
              name,  post_norm, false, true,
              false, false,     false, "rotate: columns × g(post_attention_layernorm), rows × Q1"};
          break;
        case Role::kMlpOut:
          has_out = true;
          ops[name] = {name, "", false, false, false, true, false, "rotate: Q1^T × (rows mixed)"};
          break;
        case Role::kKeep:
          break;
      }
    }
    if (!has_in || !has_out) {
      problems.push_back(
          fmt::format("{}: no MLP (gate/up or router and experts reading post_attention_layernorm, "
                      "down_proj writing the residual stream)",
                      p));
    }
  }
  for (const auto* e : {embed, norm, head}) {
    if (e != nullptr && !is_quantizable_float(e->dtype)) {
      problems.push_back(fmt::format("{}: dtype {}: only BF16, F16 and F32 tensors are rotated",
                                     e->name, dtype_tag(e->dtype)));
    }
  }
  if (embed == nullptr || embed->shape.size() != 2) return layout;
  layout.hidden = embed->shape[1];
  const std::uint64_t h = layout.hidden, hd = layout.head_dim;
  if (!hadamard_known_order(h)) {
    problems.push_back(fmt::format(
        "hidden size {}: no Hadamard matrix of that order is built (k * 2^m with k = 1 or a "
        "Paley order: q + 1 for a prime q = 3 mod 4, 2 (q + 1) for a prime q = 1 mod 4)",
        h));
  }
  if (hd == 0 || !hadamard_known_order(hd)) {
    problems.push_back(
        fmt::format("head_dim {}: no Hadamard matrix of that order is built for R2 (k * 2^m)", hd));
  }
  if (norm != nullptr && norm->shape != std::vector<std::uint64_t>{h}) {
    problems.push_back(
        fmt::format("{}: shape [{}], expected [{}]", kFinalNorm, fmt::join(norm->shape, ", "), h));
  }
  if (!layout.untie && head->shape.size() == 2 && head->shape[1] != h) {
    problems.push_back(
        fmt::format("{}: {} columns, expected the hidden size {}", kHead, head->shape[1], h));
  }
  ops[kEmbed] = {kEmbed, "", false, true, false, false, false, "rotate: rows × Q1 (R1)"};
  ops[kFinalNorm] = {kFinalNorm, "",    true,  false,
                     false,      false, false, "rotate: g folded into lm_head, set to 1"};
  ops[kHead] = {layout.untie ? kEmbed : kHead,
                kFinalNorm,
                false,
                true,
                false,
                false,
                false,
                layout.untie ? "rotate: untied (the embedding), columns × g(model.norm), × Q1"
                             : "rotate: columns × g(model.norm), rows × Q1"};
  // Dtypes and shapes: every rotated side must have the rotation's size.
  for (const auto& [name, op] : ops) {
    const TensorEntry* e = checkpoint.find(op.source);
    if (e == nullptr) continue;
    if (!is_quantizable_float(e->dtype)) {
      if (name != kEmbed && name != kFinalNorm && name != kHead) {
        problems.push_back(fmt::format("{}: dtype {}: only BF16, F16 and F32 tensors are rotated",
                                       name, dtype_tag(e->dtype)));
      }
      continue;
    }
    const std::size_t dims = e->shape.size();
    const std::uint64_t cols = dims == 0 ? 1 : e->shape.back();
    const std::uint64_t out_rows = dims >= 2 ? e->shape[dims - 2] : 1;
    const std::string& source = op.source;
    const auto bad = [&](const char* side, std::uint64_t got, std::uint64_t want) {
      problems.push_back(
          fmt::format("{}: {} {}, expected {} for its rotation", source, side, got, want));
    };
    if (op.ones && dims != 1) bad("dimensions", dims, 1);
    if (!op.ones && dims != 2 &&
        !(dims == 3 && (op.r1_in || op.r1_out) && !op.r2_in && !op.r2_out)) {
      bad("dimensions", dims, 2);
      continue;
    }
    if (op.r1_in && cols != h) bad("columns", cols, h);
    if (op.r1_out && out_rows != h) bad("rows", out_rows, h);
    if (op.r2_in && hd != 0 && cols % hd != 0) bad("columns", cols, hd * (cols / hd + 1));
    if (op.r2_out && hd != 0 && out_rows % hd != 0) bad("rows", out_rows, hd * (out_rows / hd + 1));
  }
  return layout;
}

[[noreturn]] void refuse(const Checkpoint& checkpoint, const std::vector<std::string>& problems) {
  throw usage_error(
      fmt::format("--transform rotate: {} cannot be rotated without changing its function "
                  "(nothing was written):\n  {}\n  fix: run without --transform rotate",
                  checkpoint.root.string(), join(problems, 20, "\n  ")));
}

json rotate_details(const RotateLayout& layout) {
  const auto rotation = [](std::uint64_t n, std::uint64_t seed) {
    const auto k = hadamard_known_order(n);
    return json{{"size", n},
                {"hadamard", k && *k > 1 ? fmt::format("H_{} (Paley) x Sylvester H_{}", *k, n / *k)
                                         : fmt::format("Sylvester H_{}", n)},
                {"sign_seed", seed}};
  };
  return {{"rotation",
           "Q = D H_n / sqrt(n), d_i = sign from splitmix64(seed + i) (ctquant "
           "transform/hadamard.hpp); R1 on the residual stream (hidden size), R2 per attention "
           "head (head_dim) on v_proj's rows and o_proj's columns; every RMSNorm g folded into "
           "its consumers and set to 1"},
          {"r1", rotation(layout.hidden, kR1Seed)},
          {"r2", rotation(layout.head_dim, kR2Seed)},
          {"untied_head", layout.untie}};
}

// Rewrites rows [r0, r0 + rows) of `op`'s source (raw values of `dtype`,
// cols per row) from `in` into `out`, in double, rounded once.
struct RotateContext {
  const Rotation* r1 = nullptr;
  const Rotation* r2 = nullptr;
  std::vector<double> strip;
  std::vector<double> scratch;
};

void rotate_rows(const std::string& tensor, std::uint64_t first_row, const RotateOp& op,
                 const std::vector<double>* gamma, DType dtype, std::uint64_t rows,
                 std::uint64_t cols, const std::byte* in, std::byte* out, RotateContext& ctx) {
  const std::size_t size = dtype_bits(dtype) / 8;
  if (op.ones) {
    for (std::uint64_t k = 0; k < rows * cols; ++k) store_rounded(dtype, 1.0, out + k * size);
    return;
  }
  const std::uint64_t hd = ctx.r2 != nullptr ? ctx.r2->size() : 1;
  // Strip width: whole rows for R1 on the input side, whole heads for R2.
  std::uint64_t width = cols;
  if (!op.r1_in && rows * cols > kStripValues) {
    const std::uint64_t unit = op.r2_in ? hd : 1;
    width = std::max<std::uint64_t>(unit, kStripValues / rows / unit * unit);
    width = std::min(width, cols);
  }
  for (std::uint64_t c0 = 0; c0 < cols; c0 += width) {
    const std::uint64_t w = std::min(width, cols - c0);
    ctx.strip.resize(rows * w);
    double* s = ctx.strip.data();
    for (std::uint64_t i = 0; i < rows; ++i) {
      for (std::uint64_t j = 0; j < w; ++j) {
        double v = static_cast<double>(load_as_float(dtype, in + (i * cols + c0 + j) * size));
        if (gamma != nullptr) v *= (*gamma)[c0 + j];
        s[i * w + j] = v;
      }
      if (op.r1_in) ctx.r1->apply(s + i * w, ctx.scratch);
      if (op.r2_in) {
        for (std::uint64_t j = 0; j < w; j += hd) ctx.r2->apply(s + i * w + j, ctx.scratch);
      }
    }
    if (op.r1_out || op.r2_out) {
      // Each column c <- Q^T c over its block of rows ((Q^T c)^T = c^T Q).
      const Rotation& r = op.r1_out ? *ctx.r1 : *ctx.r2;
      for (std::uint64_t b0 = 0; b0 < rows; b0 += r.size()) {
        r.apply_to_columns(s + b0 * w, w, ctx.scratch);
      }
    }
    for (std::uint64_t i = 0; i < rows; ++i) {
      for (std::uint64_t j = 0; j < w; ++j) {
        std::byte* p = out + (i * cols + c0 + j) * size;
        store_rounded(dtype, s[i * w + j], p);
        if (!std::isfinite(load_as_float(dtype, p))) {
          // A sum of many values of a column or row can leave F16's range
          // (65504), where the input's values did not.
          throw bad_input(fmt::format(
              "--transform rotate: tensor '{}' element [{}, {}]: the rotated value {} is not "
              "finite in {} (the rotation sums the values of a row or column, and may leave "
              "the dtype's range). Nothing was written. Rotate a BF16 or F32 copy of INPUT",
              tensor, first_row + i, c0 + j, s[i * w + j], dtype_tag(dtype)));
        }
      }
    }
  }
}

}  // namespace

RewritePlan plan_rotate(const Checkpoint& checkpoint) {
  const RotateLayout layout = rotate_layout(checkpoint);
  if (!layout.problems.empty()) refuse(checkpoint, layout.problems);
  RewritePlan plan;
  plan.head_dim = layout.head_dim;
  plan.staged_source = true;
  plan.details = rotate_details(layout);
  for (const auto& [name, op] : layout.ops) {
    TensorRewrite& r = plan.tensors.emplace_back();
    r.tensor = name;
    const TensorEntry* e = checkpoint.find(op.source);
    r.cols = e->shape.empty() ? 1 : e->shape.back();
    r.rows = e->numel() / std::max<std::uint64_t>(1, r.cols);
    r.what.push_back(op.what);
  }
  return plan;
}

void write_rotated_source(const Checkpoint& checkpoint, const fs::path& dir, bool with_data,
                          const RewritePlan& plan) {
  const RotateLayout layout = rotate_layout(checkpoint);
  if (!layout.problems.empty()) refuse(checkpoint, layout.problems);
  const Rotation r1(layout.hidden, kR1Seed);
  const Rotation r2(layout.head_dim, kR2Seed);
  fs::create_directories(dir);
  const TensorLocation embed_at = checkpoint.tensors.at(kEmbed);
  std::map<std::string, std::vector<double>> gammas;
  const auto gamma_of = [&](const std::string& name) -> const std::vector<double>* {
    if (name.empty()) return nullptr;
    auto it = gammas.find(name);
    if (it == gammas.end()) {
      std::vector<double> g;
      if (with_data) read_rows_as_double(checkpoint, name, 0, 1, g);
      it = gammas.emplace(name, std::move(g)).first;
    }
    return &it->second;
  };
  std::uint64_t total_bytes = 0;
  RotateContext ctx;
  ctx.r1 = &r1;
  ctx.r2 = &r2;
  std::vector<std::byte> in, out;
  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) {
    const SafetensorsFile& shard = checkpoint.shards[s];
    const SafetensorsHeader& header = shard.header();
    std::vector<TensorSpec> specs;
    for (const TensorEntry& e : header.tensors) {
      if (layout.untie && e.name == kHead) continue;  // written from the embedding
      specs.push_back({e.name, e.dtype, e.shape, e.byte_size()});
    }
    if (layout.untie && s == embed_at.shard) {
      const TensorEntry& embed = checkpoint.entry(embed_at);
      specs.push_back({kHead, embed.dtype, embed.shape, embed.byte_size()});
    }
    for (const TensorSpec& spec : specs) total_bytes += spec.byte_size;
    const ShardLayout laid = layout_shard(specs, header.metadata);
    std::optional<OutputFile> staged;
    if (!open_staged_shard(dir / shard.path().filename(), laid, with_data, staged)) continue;
    OutputFile& file = *staged;
    for (std::size_t t = 0; t < specs.size(); ++t) {
      poll_cancel();
      const TensorSpec& spec = specs[t];
      const std::uint64_t at = laid.data_start + laid.offsets[t];
      const auto op_it = layout.ops.find(spec.name);
      const std::string& source = op_it != layout.ops.end() ? op_it->second.source : spec.name;
      const TensorLocation loc = checkpoint.tensors.at(source);
      const SafetensorsFile& in_shard = checkpoint.shards[loc.shard];
      const TensorEntry& e = checkpoint.entry(loc);
      if (op_it == layout.ops.end()) {
        // Unchanged (q_norm, k_norm, ...): copied.
        const FdLease fd = in_shard.descriptor();
        file.copy_from(fd->get(), in_shard.header().data_start + e.begin, at, e.byte_size());
        continue;
      }
      const RotateOp& op = op_it->second;
      // A 3-D stacked expert tensor is its experts' rows one after another.
      const std::uint64_t cols = e.shape.empty() ? 1 : e.shape.back();
      const std::uint64_t rows = e.numel() / std::max<std::uint64_t>(1, cols);
      const std::size_t size = dtype_bits(e.dtype) / 8;
      // Rows read at once: all of them when columns are rotated over all
      // rows, a KV head's when over heads, else about 8 MiB.
      std::uint64_t step = std::max<std::uint64_t>(1, (std::uint64_t{8} << 20) / (cols * size));
      if (op.r1_out) step = layout.hidden;  // one expert's (or the tensor's) rows
      if (op.r2_out) step = std::max<std::uint64_t>(1, step / layout.head_dim) * layout.head_dim;
      step = std::min(step, rows);
      const std::vector<double>* gamma = gamma_of(op.gamma);
      for (std::uint64_t r0 = 0; r0 < rows; r0 += step) {
        poll_cancel();
        const std::uint64_t n = std::min(step, rows - r0);
        in.resize(n * cols * size);
        out.resize(in.size());
        in_shard.read(e.begin + r0 * cols * size, in);
        rotate_rows(spec.name, r0, op, gamma, e.dtype, n, cols, in.data(), out.data(), ctx);
        file.write_at(at + r0 * cols * size, out);
      }
    }
    file.sync_and_close();
  }
  // config.json: untied, with the record of the rewrite.
  json config = *checkpoint.config;
  if (layout.untie) config["tie_word_embeddings"] = false;
  config["ctquant_transform"] = plan.record();
  json index = checkpoint.index;
  if (checkpoint.has_index && layout.untie) {
    index["weight_map"][kHead] = checkpoint.shards[embed_at.shard].path().filename().string();
    if (index.contains("metadata") && index["metadata"].is_object() &&
        index["metadata"].contains("total_size")) {
      index["metadata"]["total_size"] = total_bytes;
    }
  }
  write_staged_files(checkpoint, dir, config, checkpoint.has_index ? &index : nullptr);
}

}  // namespace ctquant::detail
