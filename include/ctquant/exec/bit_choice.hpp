// `--target-bits B`: the weight error of every quantized module under each
// scheme of the bit ladder (plan/bit_allocation.hpp), measured before
// anything is written, then the allocation.
//
// Each module is read and quantized in memory once per option it can take
// (measure_errors, observer_choice.hpp: chunk by chunk with the option's
// observer and the family's kernel, measured by quant_error_rows, the same
// figures as the run report), so the run reads the weights about as many
// times as the ladder has options, then once more to write them.
#pragma once

#include "ctquant/exec/observer_choice.hpp"
#include "ctquant/plan/bit_allocation.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant {

// Fills ModuleBits::errors of `allocation` (from start_allocation for
// `plan`): one QuantError per option, measured for the options the module's
// unit can take, zero for the others. Progress in ProgressPhase::kChooseBits.
// Throws what measure_errors throws (Error{kBadInput} for a weight that is
// not finite, Error{kInterrupted}, Error{kIo}).
void measure_bit_options(const Checkpoint& checkpoint, const QuantizePlan& plan,
                         BitAllocation& allocation, const ObserverChoiceOptions& options);

}  // namespace ctquant
