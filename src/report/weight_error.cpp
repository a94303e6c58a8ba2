#include "ctquant/report/weight_error.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

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
    modules.push_back(json{
        {"module", m.name},
        {"scheme", plan.group_of(m).name},
        {"observer", plan.group_of(m).weights.observer},
        {"mse_observer", measured ? json(c.mse_observer) : json(nullptr)},
        {"not_measured", measured ? json(nullptr) : json(c.not_measured)},
        {"rel_frobenius_minmax", finite_or_null(c.minmax.rel_frobenius())},
        {"rel_frobenius_mse", mse_figure(c.mse.rel_frobenius())},
        {"max_abs_error_minmax", finite_or_null(c.minmax.max_abs_error())},
        {"max_abs_error_mse", mse_figure(c.mse.max_abs_error())},
        {"change", mse_figure(change(c.minmax.rel_frobenius(), c.mse.rel_frobenius()))}});
  }
  const QuantError minmax = choices.total_minmax();
  const QuantError chosen = choices.total_chosen();
  const bool any = !choices.modules.empty();
  return json{
      {"modules", choices.modules.size()},
      {"modules_using_mse", choices.modules_using_mse()},
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
      "--observer auto: {} of {} quantized module(s) use their MSE observer's scales; weight "
      "error ||W-Q||/||W|| {} with min-max, {} as chosen ({})\n",
      choices.modules_using_mse(), choices.modules.size(), figure(minmax.rel_frobenius()),
      figure(chosen.rel_frobenius()),
      percent(change(minmax.rel_frobenius(), chosen.rel_frobenius())));
  std::vector<const ModuleObserverChoice*> changed;
  for (const ModuleObserverChoice& c : choices.modules) {
    if (c.use_mse) changed.push_back(&c);
  }
  // The largest reductions first, then plan order.
  std::stable_sort(changed.begin(), changed.end(), [](const auto* a, const auto* b) {
    return change(a->minmax.rel_frobenius(), a->mse.rel_frobenius()) <
           change(b->minmax.rel_frobenius(), b->mse.rel_frobenius());
  });
  if (changed.size() > count) changed.resize(count);
  if (!changed.empty()) text += "  largest reductions (min-max -> MSE):\n";
  for (const ModuleObserverChoice* c : changed) {
    text += fmt::format("  {}  {} -> {}  {}  {}\n",
                        percent(change(c->minmax.rel_frobenius(), c->mse.rel_frobenius())),
                        figure(c->minmax.rel_frobenius()), figure(c->mse.rel_frobenius()),
                        c->mse_observer, plan.modules[c->module].name);
  }
  return text;
}

}  // namespace ctquant
