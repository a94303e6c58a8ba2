// Private to verify: `verify --against-source` when INPUT is a checkpoint a
// converter takes (AutoAWQ GEMM, ModelOpt NVFP4; source/converter.hpp).
// Converted modules are checked by dequantizing both sides: INPUT as its
// tool dequantizes it (the converter's dequantize_source), OUTPUT with its
// config group's family (the decoder verify uses for every scheme), so that
// a lossless conversion, whose codes and scales are moved rather than
// recomputed, is never reported DIFFERENT because it is not RTN of a 16-bit
// weight. Tensors copied unchanged are compared byte for byte; tensors of
// modules a scheme quantized in the same run are noted as not checked.
#pragma once

#include <filesystem>

#include "ctquant/verify/verify.hpp"
#include "verify/side.hpp"

namespace ctquant::detail {

// Fills report when INPUT is in a converted format and returns true;
// returns false (report untouched) for any other INPUT.
bool verify_converted_source(const Side& out, const Side& src, const std::filesystem::path& input,
                             VerifyReport& report);

}  // namespace ctquant::detail
