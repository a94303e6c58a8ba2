#include "ctquant/exec/bit_choice.hpp"

#include <utility>
#include <vector>

namespace ctquant {

void measure_bit_options(const Checkpoint& checkpoint, const QuantizePlan& plan,
                         BitAllocation& allocation, const ObserverChoiceOptions& options) {
  std::vector<ErrorMeasure> measures;
  std::vector<std::pair<std::size_t, std::size_t>> where;  // (module slot, option)
  for (std::size_t i = 0; i < allocation.modules.size(); ++i) {
    ModuleBits& m = allocation.modules[i];
    m.errors.assign(allocation.options.size(), QuantError{});
    for (std::size_t k = 0; k < allocation.options.size(); ++k) {
      if (m.bytes[k] == 0) continue;
      const SchemeGroup& g = allocation.options[k];
      measures.push_back(ErrorMeasure{{m.module}, g.weights, g.family()});
      where.emplace_back(i, k);
    }
  }
  const std::vector<std::vector<QuantError>> errors =
      measure_errors(checkpoint, plan, measures, options, ProgressPhase::kChooseBits);
  for (std::size_t j = 0; j < measures.size(); ++j) {
    allocation.modules[where[j].first].errors[where[j].second] = errors[j].front();
  }
}

}  // namespace ctquant
