// Private to verify: `verify --against-source` when INPUT is a checkpoint a
// converter takes (AutoAWQ GEMM, ModelOpt NVFP4; source/converter.hpp).
// Converted modules are checked by dequantizing both sides: INPUT as its
// tool dequantizes it (the converter's dequantize_source), OUTPUT with its
// config group's family (the decoder verify uses for every scheme), so that
// a lossless conversion, whose codes and scales are moved rather than
// recomputed, is never reported DIFFERENT because it is not RTN of a 16-bit
// weight. Tensors copied unchanged are compared byte for byte; modules a
// scheme quantized in the same run (config.json's groups other than
// config_group_0) are recomputed from INPUT and compared code by code, as
// for any quantize output (check_quantized_modules).
#pragma once

#include <filesystem>

#include "ctquant/plan/plan.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/verify/verify.hpp"
#include "verify/side.hpp"

namespace ctquant::detail {

// Fills report when INPUT is in a converted format and returns true;
// returns false (report untouched) for any other INPUT.
bool verify_converted_source(const Side& out, const Side& src, const std::filesystem::path& input,
                             const VerifyOptions& options, VerifyReport& report);

// The modules of `plan` a scheme quantizes (PlannedModule::Kind::kQuantize),
// recomputed from `checkpoint` and compared with OUTPUT's tensors as
// verify --against-source checks any quantized module; findings and
// ModuleChecks go to c. Defined in against_source.cpp.
void check_quantized_modules(const Side& out, const Checkpoint& checkpoint,
                             const QuantizePlan& plan, const VerifyOptions& options, Collector& c);

}  // namespace ctquant::detail
