// Randomized Hadamard rotations (transform/hadamard.hpp).
#include "ctquant/transform/hadamard.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace ctquant {
namespace {

bool is_power_of_two(std::uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

bool is_prime(std::uint64_t q) {
  if (q < 2) return false;
  for (std::uint64_t d = 2; d * d <= q; ++d) {
    if (q % d == 0) return false;
  }
  return true;
}

// Orders above this are not built (an H_k costs k^2 values and k additions
// per element; hidden sizes have small odd factors).
constexpr std::uint64_t kMaxKnownOrder = 256;

// Paley I: q + 1 for a prime q = 3 mod 4; Paley II: 2 (q + 1) for a prime
// q = 1 mod 4. Returns the prime q and which construction, or q = 0.
struct PaleyOrder {
  std::uint64_t q = 0;
  bool second = false;
};

PaleyOrder paley_order(std::uint64_t k) {
  if (k >= 4 && is_prime(k - 1) && (k - 1) % 4 == 3) return {k - 1, false};
  if (k >= 4 && k % 2 == 0 && is_prime(k / 2 - 1) && (k / 2 - 1) % 4 == 1) return {k / 2 - 1, true};
  return {};
}

bool constructible(std::uint64_t k) {
  return is_power_of_two(k) || (k <= kMaxKnownOrder && paley_order(k).q != 0);
}

// chi(a): the quadratic character of a mod q (0 for a = 0).
std::vector<int> quadratic_character(std::uint64_t q) {
  std::vector<int> chi(q, -1);
  chi[0] = 0;
  for (std::uint64_t x = 1; x < q; ++x) chi[(x * x) % q] = 1;
  return chi;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// In place: x <- H_(2^m) x over n = 2^m values (Sylvester's matrix is
// symmetric, so this is also x H).
void walsh_hadamard(double* x, std::uint64_t n) {
  for (std::uint64_t h = 1; h < n; h *= 2) {
    for (std::uint64_t i = 0; i < n; i += 2 * h) {
      for (std::uint64_t j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

}  // namespace

std::optional<std::uint64_t> hadamard_known_order(std::uint64_t n) {
  if (n == 0) return std::nullopt;
  std::uint64_t odd = n;
  while (odd % 2 == 0) odd /= 2;
  // k = odd * 2^j, smallest first; n / k must stay a power of two.
  for (std::uint64_t k = odd; k <= n; k *= 2) {
    if (constructible(k)) return k;
  }
  return std::nullopt;
}

std::vector<int> hadamard_matrix(std::uint64_t k) {
  if (is_power_of_two(k)) {
    std::vector<int> h(k * k);
    for (std::uint64_t i = 0; i < k; ++i) {
      for (std::uint64_t j = 0; j < k; ++j) {
        // Sylvester: (-1)^popcount(i & j).
        h[i * k + j] = (__builtin_popcountll(i & j) % 2 == 0) ? 1 : -1;
      }
    }
    return h;
  }
  const PaleyOrder p = k <= kMaxKnownOrder ? paley_order(k) : PaleyOrder{};
  if (p.q == 0) {
    throw std::invalid_argument(fmt::format("no Hadamard matrix of order {} is built", k));
  }
  const std::uint64_t q = p.q, c = q + 1;
  const std::vector<int> chi = quadratic_character(q);
  // The (q + 1) x (q + 1) core: 0 on the diagonal, chi(j - i) inside, a
  // border of 1 (Paley II: symmetric) or 1 / -1 (Paley I: skew).
  std::vector<int> core(c * c, 0);
  for (std::uint64_t j = 1; j < c; ++j) {
    core[j] = 1;
    core[j * c] = p.second ? 1 : -1;
  }
  for (std::uint64_t i = 1; i < c; ++i) {
    for (std::uint64_t j = 1; j < c; ++j) core[i * c + j] = chi[(j + q - i) % q];
  }
  std::vector<int> h(k * k);
  if (!p.second) {
    // H = I + S.
    for (std::uint64_t i = 0; i < c; ++i) {
      for (std::uint64_t j = 0; j < c; ++j) h[i * k + j] = core[i * c + j] + (i == j ? 1 : 0);
    }
    return h;
  }
  // H = C (x) [[1, 1], [1, -1]] + I (x) [[1, -1], [-1, -1]].
  for (std::uint64_t i = 0; i < c; ++i) {
    for (std::uint64_t j = 0; j < c; ++j) {
      for (std::uint64_t a = 0; a < 2; ++a) {
        for (std::uint64_t b = 0; b < 2; ++b) {
          const int s = (a == 1 && b == 1) ? -1 : 1;
          int v = core[i * c + j] * s;
          if (i == j) v = (a == 0 && b == 0) ? 1 : -1;
          h[(2 * i + a) * k + (2 * j + b)] = v;
        }
      }
    }
  }
  return h;
}

Rotation::Rotation(std::uint64_t n, std::uint64_t seed) : n_(n), seed_(seed) {
  const auto k = hadamard_known_order(n);
  if (!k) {
    throw std::invalid_argument(
        fmt::format("no Hadamard matrix of order {} is built (k * 2^m with a Paley k)", n));
  }
  k_ = *k;
  signs_.resize(n);
  for (std::uint64_t i = 0; i < n; ++i) signs_[i] = (splitmix64(seed + i) >> 63) != 0 ? -1.0 : 1.0;
  if (k_ > 1) {
    const std::vector<int> h = hadamard_matrix(k_);
    hk_.assign(h.begin(), h.end());
  }
}

void Rotation::apply(double* x, std::vector<double>& scratch) const {
  for (std::uint64_t i = 0; i < n_; ++i) x[i] *= signs_[i];
  apply_hadamard(x, scratch, false);
  const double norm = 1.0 / std::sqrt(static_cast<double>(n_));
  for (std::uint64_t i = 0; i < n_; ++i) x[i] *= norm;
}

void Rotation::apply_hadamard(double* x, std::vector<double>& scratch, bool transposed) const {
  const std::uint64_t block = n_ / k_;
  for (std::uint64_t a = 0; a < k_; ++a) walsh_hadamard(x + a * block, block);
  if (k_ == 1) return;
  // (x H_n)[a', b] = sum_a z[a, b] H_k[a, a'] (transposed: H_k[a', a]).
  scratch.resize(k_);
  for (std::uint64_t b = 0; b < block; ++b) {
    for (std::uint64_t a2 = 0; a2 < k_; ++a2) {
      double s = 0;
      for (std::uint64_t a = 0; a < k_; ++a) {
        s += x[a * block + b] * hk_[transposed ? a2 * k_ + a : a * k_ + a2];
      }
      scratch[a2] = s;
    }
    for (std::uint64_t a2 = 0; a2 < k_; ++a2) x[a2 * block + b] = scratch[a2];
  }
}

void Rotation::apply_to_columns(double* m, std::uint64_t width,
                                std::vector<double>& scratch) const {
  // (Q^T m)[j] = sum_i d_i H[i, j] m[i] / sqrt(n), row by row.
  const std::uint64_t block = n_ / k_;
  for (std::uint64_t i = 0; i < n_; ++i) {
    double* row = m + i * width;
    for (std::uint64_t c = 0; c < width; ++c) row[c] *= signs_[i];
  }
  for (std::uint64_t a = 0; a < k_; ++a) {
    double* base = m + a * block * width;
    for (std::uint64_t h = 1; h < block; h *= 2) {
      for (std::uint64_t i = 0; i < block; i += 2 * h) {
        for (std::uint64_t j = i; j < i + h; ++j) {
          double* x = base + j * width;
          double* y = base + (j + h) * width;
          for (std::uint64_t c = 0; c < width; ++c) {
            const double p = x[c], q = y[c];
            x[c] = p + q;
            y[c] = p - q;
          }
        }
      }
    }
  }
  if (k_ > 1) {
    scratch.resize(k_ * width);
    for (std::uint64_t b = 0; b < block; ++b) {
      std::fill(scratch.begin(), scratch.end(), 0.0);
      for (std::uint64_t a = 0; a < k_; ++a) {
        const double* z = m + (a * block + b) * width;
        for (std::uint64_t a2 = 0; a2 < k_; ++a2) {
          const double hk = hk_[a * k_ + a2];
          double* out = scratch.data() + a2 * width;
          for (std::uint64_t c = 0; c < width; ++c) out[c] += hk * z[c];
        }
      }
      for (std::uint64_t a2 = 0; a2 < k_; ++a2) {
        std::copy_n(scratch.data() + a2 * width, width, m + (a2 * block + b) * width);
      }
    }
  }
  const double norm = 1.0 / std::sqrt(static_cast<double>(n_));
  for (std::uint64_t k = 0; k < n_ * width; ++k) m[k] *= norm;
}

void Rotation::apply_transposed(double* x, std::vector<double>& scratch) const {
  // x Q^T = x H_n^T D / sqrt(n).
  apply_hadamard(x, scratch, true);
  const double norm = 1.0 / std::sqrt(static_cast<double>(n_));
  for (std::uint64_t i = 0; i < n_; ++i) x[i] *= signs_[i] * norm;
}

}  // namespace ctquant
