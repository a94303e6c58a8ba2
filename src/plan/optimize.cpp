#include "ctquant/plan/optimize.hpp"

#include <fmt/format.h>

#include "ctquant/scheme/observer.hpp"

namespace ctquant {

namespace {

// A row: the weight-only schemes it covers, the observer, the measurement.
// Every figure is a mean KLD from docs/accuracy.md "Results" (llama-h128 /
// qwen3-h128, group 128, `sudo python3 tools/accuracy/run.py table`).
struct OptimizeRow {
  std::string_view family;  // SchemeFamily::id
  int num_bits;             // 0: any
  int symmetric;            // 1 symmetric, 0 asymmetric, -1 either
  std::string_view observer;
  std::string_view evidence;
};

constexpr OptimizeRow kOptimizeRows[] = {
    {"int-packed", 4, 1, "memoryless_mse",
     "measured at W4A16 g128: KLD 0.0248 / 0.0266 against min-max's 0.0294 / 0.0319 on "
     "llama-h128 / qwen3-h128; refit 0.0250 (tied) / 0.0273 (higher); docs/accuracy.md"},
    {"int-packed", 4, 0, kRefitObserver,
     "measured at W4A16_ASYM g128: KLD 0.0214 / 0.0230 against min-max's 0.0236 / 0.0265; "
     "memoryless_mse 0.0218 (higher) / 0.0222 (lower): where the models disagree, refit; "
     "docs/accuracy.md"},
    {"int-packed", 8, -1, kRefitObserver,
     "measured at W8A16 g128: KLD 0.000118 / 0.000123 against min-max's 0.000131 / 0.000133, "
     "the lowest on both models; docs/accuracy.md"},
    {"int-packed", 3, -1, kRefitObserver,
     "measured at W3 and W3_ASYM g128: 11-29% below min-max's KLD on both models; "
     "memoryless_mse lower on llama-h128, higher on qwen3-h128: where the models disagree, "
     "refit; docs/accuracy.md"},
    {"int-packed", 2, -1, kRefitObserver,
     "measured at W2_ASYM g128: KLD 0.450 / 0.460 against min-max's 0.689 / 0.813, the lowest "
     "on both models; docs/accuracy.md"},
    {"nvfp4", 0, -1, "nvfp4_expanded_mse",
     "measured at NVFP4A16: KLD 0.0160 / 0.0167 against min-max's 0.0216 / 0.0234, refit "
     "0.0172 / 0.0177; docs/accuracy.md"},
    {"mxfp4", 0, -1, "memoryless_minmax",
     "measured at MXFP4A16: no observer changes the KLD measurably (paired intervals include "
     "zero on both models), min-max kept; docs/accuracy.md"},
};

const OptimizeRow* find_row(const SchemeGroup& g) {
  const SchemeFamily* family = g.family();
  if (family == nullptr || !g.input_activations.is_null()) return nullptr;
  if (g.weights.strategy != QuantArgs::Strategy::kGroup &&
      g.weights.strategy != QuantArgs::Strategy::kTensorGroup) {
    return nullptr;
  }
  for (const OptimizeRow& row : kOptimizeRows) {
    if (row.family != family->id) continue;
    if (row.num_bits != 0 && row.num_bits != g.weights.num_bits) continue;
    if (row.symmetric != -1 && (row.symmetric == 1) != g.weights.symmetric) continue;
    return &row;
  }
  return nullptr;
}

}  // namespace

std::vector<OptimizeChoice> apply_optimize(PlanOptions& options) {
  std::vector<OptimizeChoice> out;
  for (SchemeGroup& g : options.groups) {
    OptimizeChoice c{g.name, g.weights.observer, ""};
    const OptimizeRow* row = find_row(g);
    if (row == nullptr) {
      c.evidence =
          "no measurement of this scheme in docs/accuracy.md (weight-only group schemes are "
          "measured), min-max kept";
    } else {
      QuantArgs chosen = g.weights;
      chosen.observer = std::string(row->observer);
      chosen.observer_kwargs = nlohmann::json::object();
      const SchemeFamily* family = g.family();
      const std::string why = family->supports(chosen);
      if (!why.empty()) {
        c.evidence = fmt::format("{} does not apply here ({}), min-max kept", row->observer, why);
      } else {
        g.weights = chosen;
        c.observer = chosen.observer;
        c.evidence = std::string(row->evidence);
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::string> render_optimize(const std::vector<OptimizeChoice>& choices) {
  std::vector<std::string> lines;
  for (const OptimizeChoice& c : choices) {
    lines.push_back(fmt::format("--optimize: group '{}' weights with {} ({})", c.group, c.observer,
                                c.evidence));
  }
  return lines;
}

}  // namespace ctquant
