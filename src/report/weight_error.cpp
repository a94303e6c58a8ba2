#include "ctquant/report/weight_error.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "ctquant/scheme/registry.hpp"

namespace ctquant {

using json = nlohmann::json;

namespace {

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

QuantError overall(const std::vector<ModuleError>& errors) {
  QuantError all;
  for (const ModuleError& e : errors) all.add(e.error);
  return all;
}

std::string figure(double v) { return fmt::format("{:.4e}", v); }

}  // namespace

json weight_error_json(const QuantizePlan& plan, const std::vector<ModuleError>& errors) {
  json modules = json::array();
  for (const ModuleError& e : errors) {
    const PlannedModule& m = plan.modules[e.module];
    modules.push_back(json{{"module", m.name},
                           {"scheme", plan.group_of(m).name},
                           {"shape", {m.source.rows, m.source.cols}},
                           {"rel_frobenius", finite_or_null(e.error.rel_frobenius())},
                           {"max_abs_error", finite_or_null(e.error.max_abs_error())}});
  }
  const QuantError all = overall(errors);
  return json{
      {"rel_frobenius", errors.empty() ? json(nullptr) : finite_or_null(all.rel_frobenius())},
      {"max_abs_error", errors.empty() ? json(nullptr) : finite_or_null(all.max_abs_error())},
      {"modules", modules}};
}

std::string render_worst_errors(const QuantizePlan& plan, const std::vector<ModuleError>& errors,
                                std::size_t count) {
  if (errors.empty()) return {};
  std::vector<const ModuleError*> order;
  for (const ModuleError& e : errors) order.push_back(&e);
  // Largest relative error first (NaN before everything), then plan order.
  std::stable_sort(order.begin(), order.end(), [](const ModuleError* a, const ModuleError* b) {
    const double ra = a->error.rel_frobenius();
    const double rb = b->error.rel_frobenius();
    if (std::isnan(ra) || std::isnan(rb)) return std::isnan(ra) && !std::isnan(rb);
    return ra > rb;
  });
  order.resize(std::min(count, order.size()));
  const QuantError all = overall(errors);
  std::string text = fmt::format(
      "weight error ||W-Q||/||W|| {} over {} quantized module(s) (max |W-Q| {}); largest:\n",
      figure(all.rel_frobenius()), errors.size(), figure(all.max_abs_error()));
  for (const ModuleError* e : order) {
    text += fmt::format("  {}  max |W-Q| {}  {}\n", figure(e->error.rel_frobenius()),
                        figure(e->error.max_abs_error()), plan.modules[e->module].name);
  }
  return text;
}

std::string render_weight_error_table(const QuantizePlan& plan,
                                      const std::vector<ModuleError>& errors) {
  std::size_t width = std::string_view("MODULE").size();
  std::size_t scheme_width = std::string_view("SCHEME").size();
  for (const ModuleError& e : errors) {
    const PlannedModule& m = plan.modules[e.module];
    width = std::max(width, m.name.size());
    scheme_width = std::max(scheme_width, plan.group_of(m).name.size());
  }
  std::string text = fmt::format("  {:<{}}  {:<{}}  {:>14}  {:>13}  {:>13}\n", "MODULE", width,
                                 "SCHEME", scheme_width, "SHAPE", "||W-Q||/||W||", "max |W-Q|");
  for (const ModuleError& e : errors) {
    const PlannedModule& m = plan.modules[e.module];
    text += fmt::format("  {:<{}}  {:<{}}  {:>14}  {:>13}  {:>13}\n", m.name, width,
                        plan.group_of(m).name, scheme_width,
                        fmt::format("[{}, {}]", m.source.rows, m.source.cols),
                        figure(e.error.rel_frobenius()), figure(e.error.max_abs_error()));
  }
  return text;
}

namespace {

// b / a - 1, or NaN when a is 0 or either is not finite.
double change(double a, double b) {
  return a > 0 && std::isfinite(a) && std::isfinite(b) ? b / a - 1.0 : std::nan("");
}

std::string percent(double v) { return fmt::format("{:+.1f}%", 100.0 * v); }

}  // namespace

json observer_choice_json(const QuantizePlan& plan, const ObserverChoices& choices) {
  json modules = json::array();
  for (const ModuleObserverChoice& c : choices.modules) {
    const PlannedModule& m = plan.modules[c.module];
    const bool measured = !c.mse_observer.empty();
    const auto mse_figure = [&](double v) { return measured ? finite_or_null(v) : json(nullptr); };
    const auto refit_figure = [&](double v) {
      return c.refit_measured ? finite_or_null(v) : json(nullptr);
    };
    modules.push_back(json{
        {"module", m.name},
        {"scheme", plan.group_of(m).name},
        {"observer", plan.group_of(m).weights.observer},
        {"mse_observer", measured ? json(c.mse_observer) : json(nullptr)},
        {"not_measured", measured ? json(nullptr) : json(c.not_measured)},
        {"refit_not_measured", c.refit_measured ? json(nullptr) : json(c.refit_not_measured)},
        {"rel_frobenius_minmax", finite_or_null(c.minmax.rel_frobenius())},
        {"rel_frobenius_mse", mse_figure(c.mse.rel_frobenius())},
        {"rel_frobenius_refit", refit_figure(c.refit.rel_frobenius())},
        {"max_abs_error_minmax", finite_or_null(c.minmax.max_abs_error())},
        {"max_abs_error_mse", mse_figure(c.mse.max_abs_error())},
        {"max_abs_error_refit", refit_figure(c.refit.max_abs_error())},
        {"change", mse_figure(change(c.minmax.rel_frobenius(), c.mse.rel_frobenius()))},
        {"change_refit", refit_figure(change(c.minmax.rel_frobenius(), c.refit.rel_frobenius()))}});
  }
  const QuantError minmax = choices.total_minmax();
  const QuantError chosen = choices.total_chosen();
  const bool any = !choices.modules.empty();
  return json{
      {"modules", choices.modules.size()},
      {"modules_using_mse", choices.modules_using_mse()},
      {"modules_using_refit", choices.modules_using_refit()},
      {"rel_frobenius_minmax", any ? finite_or_null(minmax.rel_frobenius()) : json(nullptr)},
      {"rel_frobenius_chosen", any ? finite_or_null(chosen.rel_frobenius()) : json(nullptr)},
      {"change", any ? finite_or_null(change(minmax.rel_frobenius(), chosen.rel_frobenius()))
                     : json(nullptr)},
      {"per_module", modules}};
}

std::string render_observer_choice(const QuantizePlan& plan, const ObserverChoices& choices,
                                   std::size_t count) {
  if (choices.modules.empty()) return {};
  const QuantError minmax = choices.total_minmax();
  const QuantError chosen = choices.total_chosen();
  std::string text = fmt::format(
      "--observer auto: {} of {} quantized module(s) use their MSE observer's scales, {} "
      "refit's; weight error ||W-Q||/||W|| {} with min-max, {} as chosen ({})\n",
      choices.modules_using_mse(), choices.modules.size(), choices.modules_using_refit(),
      figure(minmax.rel_frobenius()), figure(chosen.rel_frobenius()),
      percent(change(minmax.rel_frobenius(), chosen.rel_frobenius())));
  std::vector<const ModuleObserverChoice*> changed;
  for (const ModuleObserverChoice& c : choices.modules) {
    if (c.use_mse() || c.use_refit()) changed.push_back(&c);
  }
  // The largest reductions first, then plan order.
  const auto reduction = [](const ModuleObserverChoice* c) {
    return change(c->minmax.rel_frobenius(), c->chosen_error().rel_frobenius());
  };
  std::stable_sort(changed.begin(), changed.end(),
                   [&](const auto* a, const auto* b) { return reduction(a) < reduction(b); });
  if (changed.size() > count) changed.resize(count);
  if (!changed.empty()) text += "  largest reductions (min-max -> the observer kept):\n";
  for (const ModuleObserverChoice* c : changed) {
    text += fmt::format(
        "  {}  {} -> {}  {}  {}\n", percent(reduction(c)), figure(c->minmax.rel_frobenius()),
        figure(c->chosen_error().rel_frobenius()), c->chosen, plan.modules[c->module].name);
  }
  return text;
}

namespace {

double bits(std::uint64_t bytes, std::uint64_t params) {
  return params == 0 ? 0.0 : 8.0 * static_cast<double>(bytes) / static_cast<double>(params);
}

// Sum of rel^2 * params over sum of params, each module at option(m).
template <class Option>
double weighted_error(const BitAllocation& a, Option option) {
  double sum = 0;
  for (const ModuleBits& m : a.modules) {
    const QuantError& e = m.errors.at(option(m));
    if (e.w2 > 0) sum += e.err2 / e.w2 * static_cast<double>(m.params);
  }
  const std::uint64_t n = a.params();
  return n == 0 ? 0.0 : sum / static_cast<double>(n);
}

}  // namespace

json bit_allocation_json(const QuantizePlan& plan, const BitAllocation& a) {
  const bool measured = !a.modules.empty() && a.modules.front().errors.size() == a.options.size();
  json options = json::array();
  std::vector<std::size_t> counts(a.options.size(), 0);
  for (const ModuleBits& m : a.modules) ++counts[m.option];
  for (std::size_t k = 0; k < a.options.size(); ++k) {
    options.push_back(json{{"scheme", a.options[k].name},
                           {"weights", quant_args_json(a.options[k].weights)},
                           {"modules", counts[k]}});
  }
  json modules = json::array();
  for (const ModuleBits& m : a.modules) {
    json rel = nullptr;
    if (measured) {
      rel = json::object();
      for (std::size_t k = 0; k < a.options.size(); ++k) {
        rel[a.options[k].name] =
            m.bytes[k] == 0 ? json(nullptr) : finite_or_null(m.errors[k].rel_frobenius());
      }
    }
    modules.push_back(json{{"module", plan.modules[m.module].name},
                           {"scheme", a.options[m.option].name},
                           {"params", m.params},
                           {"bytes", m.bytes[m.option]},
                           {"bits_per_weight", bits(m.bytes[m.option], m.params)},
                           {"rel_frobenius", rel}});
  }
  const auto given = [](const ModuleBits&) { return std::size_t{0}; };
  const auto chosen = [](const ModuleBits& m) { return m.option; };
  return json{
      {"rule", a.rule},
      {"target_bits", a.target_bits ? json(*a.target_bits) : json(nullptr)},
      {"n_layers", a.target_bits ? json(nullptr) : json(a.n_layers)},
      {"layers", a.target_bits ? json(nullptr) : json(a.layers)},
      {"bits_per_weight", a.bits_per_weight()},
      {"bits_per_weight_given", bits(a.bytes_of(0), a.params())},
      {"params", a.params()},
      {"bytes", a.bytes()},
      {"modules_upgraded", a.modules_upgraded()},
      {"weighted_error_given", measured ? finite_or_null(weighted_error(a, given)) : json(nullptr)},
      {"weighted_error_chosen",
       measured ? finite_or_null(weighted_error(a, chosen)) : json(nullptr)},
      {"options", options},
      {"per_module", modules}};
}

std::string render_bit_allocation(const QuantizePlan& plan, const BitAllocation& a,
                                  std::size_t count) {
  std::vector<std::size_t> counts(a.options.size(), 0);
  for (const ModuleBits& m : a.modules) ++counts[m.option];
  std::vector<std::string> raised;
  for (std::size_t k = 1; k < a.options.size(); ++k) {
    if (counts[k] > 0) raised.push_back(fmt::format("{} to {}", counts[k], a.options[k].name));
  }
  std::string rule = a.rule;
  if (!a.target_bits) {
    rule += fmt::format(" (llama.cpp's use_more_bits, {} layers: {})", a.n_layers,
                        fmt::join(a.layers, ", "));
  }
  std::string text = fmt::format(
      "{}: {:.4f} bits per weight over {} quantized module(s) ({:.4f} with {} alone); {} "
      "raised{}{}",
      rule, a.bits_per_weight(), a.modules.size(), bits(a.bytes_of(0), a.params()),
      a.options.front().name, a.modules_upgraded(), raised.empty() ? "" : ": ",
      fmt::join(raised, ", "));
  const bool measured = !a.modules.empty() && a.modules.front().errors.size() == a.options.size();
  if (measured) {
    text += fmt::format(
        "; weight error sum(rel^2 * params) / params {} -> {}",
        figure(weighted_error(a, [](const ModuleBits&) { return std::size_t{0}; })),
        figure(weighted_error(a, [](const ModuleBits& m) { return m.option; })));
  }
  text += "\n";
  std::size_t width = 0;
  for (const SchemeGroup& g : a.options) width = std::max(width, g.name.size());
  std::size_t shown = 0;
  for (const ModuleBits& m : a.modules) {
    if (m.option == 0) continue;
    if (shown++ == count) break;
    text += fmt::format("  {:<{}}  {}\n", a.options[m.option].name, width,
                        plan.modules[m.module].name);
  }
  if (a.modules_upgraded() > count) {
    text += fmt::format("  ... and {} more (the report's bit_allocation lists every module)\n",
                        a.modules_upgraded() - count);
  }
  return text;
}

}  // namespace ctquant
