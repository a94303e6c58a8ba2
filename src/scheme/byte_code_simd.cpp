// The vector kernel of the one-code-byte-per-weight rows (byte_code_simd.hpp):
// FP8 E4M3 and int8 codes, scales per row (channel), per 2-D block or per
// tensor, BF16 / F16 / F32 weights, written once with Google Highway and
// compiled for every level of simd_levels() (simd_dispatch.hpp).
//
// It follows the rows' scalar references (fp8.cpp, int8.cpp) step for step
// with the same IEEE operations, one vector of float lanes at a time, so
// the bytes are the same:
// - the largest magnitude of a row, block or tensor is taken on the raw
//   bits with the sign bit cleared (for non-negative IEEE values the
//   integer order is the numeric order), which also finds NaN and
//   infinities: their magnitude bits are the largest;
// - the scale is computed by the references' own scalar functions
//   (fp8_weight_scale, int8_weight_scale);
// - w / s is one correctly rounded division per lane, then rounded to W:
//   BF16 with the integer round-to-nearest-even of float_to_bf16, F16 with
//   the hardware conversion (round to nearest even, subnormals kept), F32
//   as is;
// - clamp with Min/Max (the quotient is finite, so they agree with
//   std::clamp, and -0.0 stays -0.0);
// - E4M3: the rounding of float_to_f8_e4m3 (format/minifloat.hpp) on every
//   lane (normals: rebias and round the 20 dropped bits to even; below
//   2^-6: add 2^14 in float, so the adder rounds to nearest even at the
//   2^-9 step of the subnormal codes; sign bit or'ed back);
//   int8: round half to even to an integer (NearestInt, the default
//   rounding mode, as std::nearbyint), two's complement low byte;
// - the columns left over after the last whole vector go through the
//   scalar code functions (fp8_weight_code, int8_weight_code).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scheme/byte_code_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/simd_dispatch.hpp"
#include "simd/simd_steps-inl.h"

#ifndef CTQUANT_SCHEME_BYTE_CODE_SIMD_ONCE
#define CTQUANT_SCHEME_BYTE_CODE_SIMD_ONCE

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/fp8.hpp"
#include "ctquant/scheme/int8.hpp"
#include "scheme/byte_code_simd.hpp"
#include "scheme/row_support.hpp"

namespace ctquant::detail {
namespace {

// Magnitude bits at and above which a value is NaN or infinite.
template <DType T>
constexpr std::uint32_t kNonFiniteBits = T == DType::kF32    ? 0x7F800000u
                                         : T == DType::kBF16 ? 0x7F80u
                                                             : 0x7C00u;

template <DType T>
constexpr std::size_t kElementBytes = T == DType::kF32 ? 4 : 2;

float magnitude_to_float(DType t, std::uint32_t bits) {
  switch (t) {
    case DType::kBF16:
      return bf16_to_float(static_cast<std::uint16_t>(bits));
    case DType::kF16:
      return f16_to_float(static_cast<std::uint16_t>(bits));
    default:
      return std::bit_cast<float>(bits);
  }
}

float code_scale(ByteCode code, DType t, float amax) {
  return code == ByteCode::kE4M3 ? fp8_weight_scale(t, amax) : int8_weight_scale(t, amax);
}

std::uint8_t scalar_code(ByteCode code, DType t, float w, float s) {
  return code == ByteCode::kE4M3 ? fp8_weight_code(t, w, s)
                                 : std::bit_cast<std::uint8_t>(int8_weight_code(t, w, s));
}

}  // namespace
}  // namespace ctquant::detail

#endif  // CTQUANT_SCHEME_BYTE_CODE_SIMD_ONCE

HWY_BEFORE_NAMESPACE();
namespace ctquant::detail::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using simd_steps::HWY_NAMESPACE::load_as_float;
using simd_steps::HWY_NAMESPACE::magnitude_max;
using simd_steps::HWY_NAMESPACE::round_to_t;

// float_to_f8_e4m3 on every lane of y, |y| <= 448 (clamped), as uint32 lanes.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> e4m3_codes(DF df, hn::Vec<DF> y) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto u = hn::BitCast(du, y);
  const auto sign = hn::ShiftRight<24>(hn::And(u, hn::Set(du, 0x80000000u)));
  const auto a = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
  // Normal: rebias the exponent (127 -> 7), round the 20 dropped bits to even.
  const auto odd = hn::And(hn::ShiftRight<20>(a), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<20>(hn::Add(a, hn::Add(hn::Set(du, 0xC407FFFFu), odd)));
  // Below 2^-6: the float adder rounds a + 2^14 to the subnormal step 2^-9
  // (rare in a row scaled to 448: skipped when no lane needs it).
  const auto is_subnormal =
      hn::RebindMask(du, hn::Lt(hn::BitCast(di, a), hn::Set(di, 0x3C800000)));
  if (hn::AllFalse(du, is_subnormal)) return hn::Or(normal, sign);
  const auto shifted = hn::Add(hn::BitCast(df, a), hn::Set(df, 0x1p14f));
  const auto subnormal = hn::Sub(hn::BitCast(du, shifted), hn::Set(du, 0x46800000u));
  return hn::Or(hn::IfThenElse(is_subnormal, subnormal, normal), sign);
}

// The codes of Lanes(df) elements at p under scale s, one byte each at out.
template <DType T, ByteCode C, class DF>
HWY_INLINE void quantize_vector(DF df, const std::byte* p, hn::Vec<DF> s, std::uint8_t* out) {
  const hn::RebindToUnsigned<DF> du;
  const auto y = round_to_t<T>(df, hn::Div(load_as_float<T>(df, p), s));
  const auto codes = [&] {
    if constexpr (C == ByteCode::kE4M3) {
      return e4m3_codes(df, hn::Min(hn::Max(y, hn::Set(df, -448.0f)), hn::Set(df, 448.0f)));
    } else {
      return hn::BitCast(du, hn::NearestInt(hn::Min(hn::Max(y, hn::Set(df, -128.0f)),
                                                    hn::Set(df, 127.0f))));
    }
  }();
  const hn::Rebind<std::uint8_t, decltype(du)> d8;
  hn::StoreU(hn::TruncateTo(d8, codes), d8, out);
}

// The codes of the n elements at p under scale s, at out.
template <DType T, ByteCode C>
HWY_INLINE void quantize_span(const std::byte* p, std::uint64_t n, float s, std::uint8_t* out) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto vs = hn::Set(df, s);
  std::uint64_t c = 0;
  for (; c + lanes <= n; c += lanes) quantize_vector<T, C>(df, p + c * kEsize, vs, out + c);
  const hn::CappedTag<float, 8> df8;  // what is left, eight at a time
  const std::size_t lanes8 = hn::Lanes(df8);
  const auto vs8 = hn::Set(df8, s);
  for (; c + lanes8 <= n; c += lanes8) quantize_vector<T, C>(df8, p + c * kEsize, vs8, out + c);
  for (; c < n; ++c) out[c] = scalar_code(C, T, ctquant::load_as_float(T, p + c * kEsize), s);
}

template <DType T, ByteCode C>
std::optional<std::uint64_t> quantize_chunk(const QuantArgs& args, const KernelIo& io) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  using S = QuantArgs::Strategy;
  const std::uint64_t n_cols = io.n_cols;
  const auto row = [&](std::uint64_t r) { return io.weight + r * n_cols * kEsize; };
  auto* codes = reinterpret_cast<std::uint8_t*>(io.out[0]);
  switch (args.strategy) {
    case S::kChannel:
      for (std::uint64_t r = 0; r < io.n_rows; ++r) {
        const std::uint32_t bits = magnitude_max<T>(row(r), n_cols);
        if (bits >= kNonFiniteBits<T>) return detail::first_non_finite(io);
        const float s = code_scale(C, T, magnitude_to_float(T, bits));
        detail::store_as_dtype(T, s, io.out[1] + r * kEsize);
        quantize_span<T, C>(row(r), n_cols, s, codes + r * n_cols);
      }
      break;
    case S::kBlock: {
      const std::uint64_t bh = args.block[0];
      const std::uint64_t bw = args.block[1];
      const std::uint64_t grid_cols = (n_cols + bw - 1) / bw;
      for (std::uint64_t r0 = 0, i = 0; r0 < io.n_rows; r0 += bh, ++i) {
        const std::uint64_t r1 = std::min(r0 + bh, io.n_rows);
        for (std::uint64_t j = 0; j < grid_cols; ++j) {
          const std::uint64_t c0 = j * bw;
          const std::uint64_t width = std::min(bw, n_cols - c0);
          std::uint32_t bits = 0;
          for (std::uint64_t r = r0; r < r1; ++r) {
            bits = std::max(bits, magnitude_max<T>(row(r) + c0 * kEsize, width));
          }
          if (bits >= kNonFiniteBits<T>) return detail::first_non_finite(io);
          const float s = code_scale(C, T, magnitude_to_float(T, bits));
          detail::store_as_dtype(T, s, io.out[1] + (i * grid_cols + j) * kEsize);
          for (std::uint64_t r = r0; r < r1; ++r) {
            quantize_span<T, C>(row(r) + c0 * kEsize, width, s, codes + r * n_cols + c0);
          }
        }
      }
      break;
    }
    default: {  // kTensor: one scale from the module's amax
      const float s = code_scale(C, T, io.tensor_amax);
      for (std::uint64_t r = 0; r < io.n_rows; ++r) {
        if (magnitude_max<T>(row(r), n_cols) >= kNonFiniteBits<T>) {
          return detail::first_non_finite(io);
        }
        quantize_span<T, C>(row(r), n_cols, s, codes + r * n_cols);
      }
    }
  }
  return std::nullopt;
}

template <ByteCode C>
std::optional<std::uint64_t> quantize_dtype(const QuantArgs& args, const KernelIo& io) {
  switch (io.dtype) {
    case DType::kBF16:
      return quantize_chunk<DType::kBF16, C>(args, io);
    case DType::kF16:
      return quantize_chunk<DType::kF16, C>(args, io);
    default:
      return quantize_chunk<DType::kF32, C>(args, io);
  }
}

}  // namespace

// The per-level entry point (see simd_dispatch.hpp).
std::optional<std::uint64_t> quantize_byte_codes(ByteCode code, const QuantArgs& args,
                                                 const KernelIo& io) {
  return code == ByteCode::kE4M3 ? quantize_dtype<ByteCode::kE4M3>(args, io)
                                 : quantize_dtype<ByteCode::kInt8>(args, io);
}

#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant::detail {
namespace {

constexpr SimdEntry<ByteCodeKernel> kQuantizeByteCodes[] = CTQUANT_SIMD_TABLE(quantize_byte_codes);

}  // namespace

ByteCodeKernel* byte_code_kernel(const SimdLevel& level) {
  return simd_entry(kQuantizeByteCodes, level);
}

}  // namespace ctquant::detail
#endif  // HWY_ONCE
