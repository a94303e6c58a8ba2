// The `balance` transform (transform/transform.hpp): column balancing
// absorbed into the producers, NNCF 2.17's data-free AWQ scale, as
// tools/accuracy/transforms.py (`balance_` with `scale_nncf`, alpha 1)
// computes it.
//
// Per block, in the prototype's order (each scale read from the weights as
// the steps before it left them):
//   down    t_d = s(down_proj)             down ÷ t_d (columns), up_proj's rows × t_d
//   v -> o  t_vo = s(o_proj stacked by GQA group: column (kv, d) over the rows of
//           every query head kv * rep + r)  o_proj's column (h, d) ÷ t_vo(h / rep, d),
//                                           v_proj's rows × t_vo
//   q/k/v   t_a = s(q; k; v × t_vo)        q, k, v ÷ t_a (columns), input_layernorm g × t_a
//   gate/up t_m = s(gate; up × t_d)        gate, up ÷ t_m, post_attention_layernorm g × t_m
// with s(W)_j = max(mean_i |W_ij|, 1e-12) over the rows of every consumer,
// divided by its (lower, torch.median's) median. The final norm, which
// feeds lm_head (and a tied embedding), is never rescaled.
//
// A mixture of experts (Qwen3-MoE, Mixtral) has one down scale per expert,
// and its gate/up scale reads every expert:
//   down    t_e = s(down_e)                down_e ÷ t_e, up_e's rows × t_e
//   gate/up t_m = s(gate_e; up_e × t_e over every expert)
//                                          every gate_e, up_e and the router ÷ t_m,
//                                          post_attention_layernorm g × t_m
// The router reads the same normalized input, so its columns are divided
// too (its logits, and so the routing, are unchanged); it is kept in 16
// bits and does not enter t_m.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "ctquant/model/rewrite_rules.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "transform/balance.hpp"

namespace ctquant::detail {
namespace {

// The scale vectors of a block, by their offset in RewritePlan::scales: five,
// then a mixture's one per expert (kDown is then left empty).
enum Scale : std::size_t { kQkv, kGateUp, kDown, kVoRows, kVoCols, kScalesPerBlock };

std::size_t scales_of(const BalanceBlock& block) { return kScalesPerBlock + block.experts.size(); }

std::uint64_t cols_of(const TensorEntry& e) { return e.shape.empty() ? 1 : e.shape.back(); }
std::uint64_t rows_of(const TensorEntry& e) { return e.shape.size() == 2 ? e.shape[0] : 1; }

// Adds |w| (times row_mul[i] when given) of every row of `tensor` to
// sums[map(j)], rows read a chunk at a time.
template <typename Map>
void add_abs_columns(const Checkpoint& checkpoint, const std::string& tensor,
                     const std::vector<double>* row_mul, std::vector<double>& sums, Map map) {
  const TensorEntry& e = *checkpoint.find(tensor);
  const std::uint64_t rows = rows_of(e), cols = cols_of(e);
  const std::uint64_t chunk = std::max<std::uint64_t>(1, (std::uint64_t{1} << 18) / cols);
  std::vector<double> values;
  for (std::uint64_t r = 0; r < rows; r += chunk) {
    const std::uint64_t end = std::min(rows, r + chunk);
    read_rows_as_double(checkpoint, tensor, r, end, values);
    for (std::uint64_t i = r; i < end; ++i) {
      const double m = row_mul != nullptr ? (*row_mul)[i] : 1.0;
      const double* row = values.data() + (i - r) * cols;
      for (std::uint64_t j = 0; j < cols; ++j) {
        const double v = row[j];
        if (!std::isfinite(v)) {
          throw bad_input(
              fmt::format("--transform balance: tensor '{}': element [{}, {}] is "
                          "not finite ({})",
                          tensor, i, j, v));
        }
        sums[map(j)] += std::fabs(row_mul != nullptr ? v * m : v);
      }
    }
  }
}

// sums / count, at least 1e-12, over its lower median (torch.median).
void finish_scale(std::vector<double>& t, double count) {
  for (double& v : t) v = std::max(v / count, 1e-12);
  std::vector<double> sorted = t;
  const std::size_t mid = (sorted.size() - 1) / 2;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid), sorted.end());
  const double median = sorted[mid];
  for (double& v : t) v /= median;
}

}  // namespace

RewritePlan plan_balance(const Checkpoint& checkpoint) {
  const BalanceLayout layout = balance_layout(checkpoint);
  std::vector<std::string> problems = layout.problems;
  RewritePlan plan;
  plan.head_dim = layout.head_dim;
  plan.details = {{"scale",
                   "t_j = mean_i |W_ij| over every consumer's rows, over its median "
                   "(NNCF 2.17 data-free AWQ)"}};
  const std::uint64_t nh = layout.heads, nkv = layout.kv_heads, hd = layout.head_dim;
  for (const BalanceBlock& block : layout.blocks) {
    const std::string& p = block.prefix;
    const auto shape = [&](const std::string& name) -> std::vector<std::uint64_t> {
      const TensorEntry* e = checkpoint.find(p + name);
      return e != nullptr ? e->shape : std::vector<std::uint64_t>{};
    };
    const bool moe = !block.experts.empty();
    const auto hidden_v = shape("input_layernorm.weight");
    const auto up_v = shape(moe ? block.experts.front().up : "mlp.up_proj.weight");
    if (hidden_v.size() != 1 || up_v.size() != 2) continue;  // named in layout.problems
    const std::uint64_t h = hidden_v[0], inter = up_v[0];
    std::vector<std::pair<std::string, std::vector<std::uint64_t>>> expected{
        {"post_attention_layernorm.weight", {h}},
        {"self_attn.q_proj.weight", {nh * hd, h}},
        {"self_attn.k_proj.weight", {nkv * hd, h}},
        {"self_attn.v_proj.weight", {nkv * hd, h}},
        {"self_attn.o_proj.weight", {h, nh * hd}}};
    if (moe) {
      expected.push_back({block.router, {block.experts.size(), h}});
      for (const BalanceExpert& x : block.experts) {
        expected.push_back({x.gate, {inter, h}});
        expected.push_back({x.up, {inter, h}});
        expected.push_back({x.down, {h, inter}});
      }
    } else {
      expected.push_back({"mlp.gate_proj.weight", {inter, h}});
      expected.push_back({"mlp.down_proj.weight", {h, inter}});
    }
    for (const auto& [name, want] : expected) {
      if (!shape(name).empty() && shape(name) != want) {  // a missing one is named already
        if (moe && name == block.router && shape(name).size() == 2 && shape(name)[1] == h &&
            shape(name)[0] > block.experts.size()) {
          // One router row per expert: the experts after the last one stored are missing.
          problems.push_back(fmt::format(
              "{}{}: {} rows (experts), but the checkpoint holds experts 0 to {} only: expert "
              "{}{} missing",
              p, name, shape(name)[0], block.experts.size() - 1, block.experts.size(),
              shape(name)[0] - block.experts.size() > 1
                  ? fmt::format(" to {} are", shape(name)[0] - 1)
                  : std::string(" is")));
          continue;
        }
        problems.push_back(
            fmt::format("{}{}: shape [{}], expected [{}] from config.json's "
                        "heads and the norms",
                        p, name, fmt::join(shape(name), ", "), fmt::join(want, ", ")));
      }
    }
    const std::size_t base = plan.scales.size();
    for (const char* what :
         {"t(q/k/v)", "t(gate/up)", "t(down)", "t(o) per v_proj row", "t(o) per o_proj column"}) {
      plan.scale_names.push_back(p + what);
      plan.scales.emplace_back();
    }
    for (std::size_t e = 0; e < block.experts.size(); ++e) {
      plan.scale_names.push_back(fmt::format("{}t(down) of expert {}", p, e));
      plan.scales.emplace_back();
    }
    const auto add = [&](const std::string& name, std::uint64_t rows, std::uint64_t cols) {
      TensorRewrite& r = plan.tensors.emplace_back();
      r.tensor = p + name;
      r.rows = rows;
      r.cols = cols;
      return &r;
    };
    const auto div = [&](TensorRewrite* r, Scale s, const char* what) {
      r->col_div = base + s;
      r->what.push_back(fmt::format("balance: columns ÷ t ({})", what));
    };
    TensorRewrite* r = add("input_layernorm.weight", 1, h);
    r->col_mul = base + kQkv;
    r->what.emplace_back("balance: g × t (for q_proj, k_proj, v_proj)");
    r = add("post_attention_layernorm.weight", 1, h);
    r->col_mul = base + kGateUp;
    r->what.emplace_back(moe ? "balance: g × t (for the router and every expert's gate/up)"
                             : "balance: g × t (for gate_proj, up_proj)");
    div(add("self_attn.q_proj.weight", nh * hd, h), kQkv, "input_layernorm");
    div(add("self_attn.k_proj.weight", nkv * hd, h), kQkv, "input_layernorm");
    r = add("self_attn.v_proj.weight", nkv * hd, h);
    r->row_mul = base + kVoRows;
    r->what.emplace_back("balance: rows × t (for o_proj, one t per KV-head row)");
    div(r, kQkv, "input_layernorm");
    div(add("self_attn.o_proj.weight", h, nh * hd), kVoCols,
        "v_proj's rows; query head i reads KV head i // (heads / kv_heads)");
    if (moe) {
      r = add(block.router, block.experts.size(), h);
      r->col_div = base + kGateUp;
      r->what.emplace_back(
          "balance: columns ÷ t (post_attention_layernorm; the router's logits are unchanged)");
      for (std::size_t e = 0; e < block.experts.size(); ++e) {
        const BalanceExpert& x = block.experts[e];
        const auto expert_scale = static_cast<Scale>(kScalesPerBlock + e);
        div(add(x.gate, inter, h), kGateUp, "post_attention_layernorm, every expert");
        r = add(x.up, inter, h);
        r->row_mul = base + expert_scale;
        r->what.emplace_back("balance: rows × t (for this expert's down_proj)");
        div(r, kGateUp, "post_attention_layernorm, every expert");
        div(add(x.down, h, inter), expert_scale, "this expert's up_proj rows");
      }
      continue;
    }
    div(add("mlp.gate_proj.weight", inter, h), kGateUp, "post_attention_layernorm");
    r = add("mlp.up_proj.weight", inter, h);
    r->row_mul = base + kDown;
    r->what.emplace_back("balance: rows × t (for down_proj)");
    div(r, kGateUp, "post_attention_layernorm");
    div(add("mlp.down_proj.weight", h, inter), kDown, "up_proj's rows");
  }
  if (!problems.empty()) {
    throw usage_error(
        fmt::format("--transform balance: {} cannot be rewritten without changing its function "
                    "(nothing was written):\n  {}\n  fix: run without --transform balance",
                    checkpoint.root.string(), join(problems, 20, "\n  ")));
  }
  return plan;
}

void derive_balance(const Checkpoint& checkpoint, RewritePlan& plan) {
  // The blocks in plan order (plan_balance walks the same layout): each
  // block's scales follow each other.
  std::size_t base = 0;
  for (const BalanceBlock& block : balance_layout(checkpoint).blocks) {
    const std::string& p = block.prefix;
    const TensorRewrite* q = plan.find(p + "self_attn.q_proj.weight");
    const TensorRewrite* k = plan.find(p + "self_attn.k_proj.weight");
    const TensorRewrite* v = plan.find(p + "self_attn.v_proj.weight");
    const TensorRewrite* o = plan.find(p + "self_attn.o_proj.weight");
    const auto same = [](std::uint64_t j) { return j; };

    // o_proj's columns (h, d) by KV head: h / rep.
    const std::uint64_t kv_rows = v->rows;  // kv_heads * head_dim
    const std::uint64_t q_cols = o->cols;   // heads * head_dim
    const std::uint64_t head_dim = plan.head_dim;
    const std::uint64_t rep = q_cols / kv_rows;  // heads / kv_heads
    std::vector<double>& t_vo = plan.scales[base + kVoRows];
    t_vo.assign(kv_rows, 0.0);
    add_abs_columns(checkpoint, o->tensor, nullptr, t_vo, [&](std::uint64_t j) {
      return (j / head_dim) / rep * head_dim + j % head_dim;
    });
    finish_scale(t_vo, static_cast<double>(o->rows * rep));
    std::vector<double>& t_vo_cols = plan.scales[base + kVoCols];
    t_vo_cols.resize(q_cols);
    for (std::uint64_t j = 0; j < q_cols; ++j) {
      t_vo_cols[j] = t_vo[(j / head_dim) / rep * head_dim + j % head_dim];
    }

    std::vector<double>& t_qkv = plan.scales[base + kQkv];
    t_qkv.assign(q->cols, 0.0);
    add_abs_columns(checkpoint, q->tensor, nullptr, t_qkv, same);
    add_abs_columns(checkpoint, k->tensor, nullptr, t_qkv, same);
    add_abs_columns(checkpoint, v->tensor, &t_vo, t_qkv, same);
    finish_scale(t_qkv, static_cast<double>(q->rows + k->rows + v->rows));

    // Each (gate, up, down) of the MLP: the dense one, or every expert.
    struct Mlp {
      const TensorRewrite *gate, *up, *down;
      std::size_t t_down;
    };
    std::vector<Mlp> mlps;
    if (block.experts.empty()) {
      mlps.push_back({plan.find(p + "mlp.gate_proj.weight"), plan.find(p + "mlp.up_proj.weight"),
                      plan.find(p + "mlp.down_proj.weight"), base + kDown});
    }
    for (std::size_t e = 0; e < block.experts.size(); ++e) {
      const BalanceExpert& x = block.experts[e];
      mlps.push_back({plan.find(p + x.gate), plan.find(p + x.up), plan.find(p + x.down),
                      base + kScalesPerBlock + e});
    }
    std::vector<double>& t_gu = plan.scales[base + kGateUp];
    t_gu.assign(mlps.front().gate->cols, 0.0);
    std::uint64_t gu_rows = 0;
    for (const Mlp& m : mlps) {
      std::vector<double>& t_down = plan.scales[m.t_down];
      t_down.assign(m.down->cols, 0.0);
      add_abs_columns(checkpoint, m.down->tensor, nullptr, t_down, same);
      finish_scale(t_down, static_cast<double>(m.down->rows));
      add_abs_columns(checkpoint, m.gate->tensor, nullptr, t_gu, same);
      add_abs_columns(checkpoint, m.up->tensor, &t_down, t_gu, same);
      gu_rows += m.gate->rows + m.up->rows;
    }
    finish_scale(t_gu, static_cast<double>(gu_rows));
    base += scales_of(block);
  }
}

}  // namespace ctquant::detail
