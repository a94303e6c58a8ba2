// Randomized Hadamard rotations for `--transform rotate` (QuaRot, SpinQuant
// R1/R2 with fixed Hadamards): Q = D H_n / sqrt(n), orthogonal, where
//   - H_n = H_k (x) H_(2^m), n = k * 2^m: Sylvester's H_(2^m) (H_1 = [1],
//     H_2j = [[H_j, H_j], [H_j, -H_j]]) and, when n is not a power of two,
//     a Hadamard matrix of order k built by Paley's constructions
//     (Paley I for k = q + 1, q a prime = 3 mod 4; Paley II for
//     k = 2 (q + 1), q a prime = 1 mod 4), the smallest such k that
//     divides n with a power-of-two quotient. compressed-tensors'
//     `random-hadamard` and QuaRot likewise take a known H_k times a power
//     of two; their stored H_k are other matrices (no format depends on
//     which: the rotation is absorbed into the weights).
//   - D = diag(d), d_i = +1 or -1 from bit 63 of splitmix64(seed + i)
//     (Steele et al. 2014), so a seed gives the same rotation everywhere.
// Applying Q to a row vector costs n log2(n / k) + n k additions: the
// fast Walsh-Hadamard transform on each block of 2^m, then H_k across the
// blocks. Everything is in double.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace ctquant {

// The order k of the known Hadamard matrix that, times a power of two,
// makes n (1 when n is a power of two), or nullopt when no constructible
// k divides n with a power-of-two quotient (e.g. n = 7 * 2^m needs
// H_28 = Paley II of 13 and is found; n = 92 * 2^m is not).
std::optional<std::uint64_t> hadamard_known_order(std::uint64_t n);

// The Hadamard matrix of order k (a power of two, or a Paley order),
// row-major, entries +1 / -1, with H H^T = k I. Throws std::invalid_argument
// for another k.
std::vector<int> hadamard_matrix(std::uint64_t k);

class Rotation {
 public:
  // Q of order n with the signs of `seed`. Throws std::invalid_argument
  // when hadamard_known_order(n) is nullopt (callers refuse such sizes
  // first, naming the tensor).
  Rotation(std::uint64_t n, std::uint64_t seed);

  std::uint64_t size() const { return n_; }
  std::uint64_t known_order() const { return k_; }
  std::uint64_t seed() const { return seed_; }

  // x <- x Q for the row vector x of size() values; scratch is resized to
  // known_order() values (one per calling thread).
  void apply(double* x, std::vector<double>& scratch) const;
  // m <- Q^T m for the size() x width matrix m (row-major): every column c
  // becomes Q^T c, i.e. each column gets what apply() does to a row, done
  // with whole rows at a time (cache-friendly for the rows a producer's
  // output side mixes). scratch is resized to known_order() * width.
  void apply_to_columns(double* m, std::uint64_t width, std::vector<double>& scratch) const;
  // x <- x Q^T (the inverse): for tests and the inverse check.
  void apply_transposed(double* x, std::vector<double>& scratch) const;

  // The sign d_i (+1 / -1).
  double sign(std::uint64_t i) const { return signs_[i]; }

 private:
  // x <- x H_n (transposed: x H_n^T), unnormalized, signs not applied.
  void apply_hadamard(double* x, std::vector<double>& scratch, bool transposed) const;

  std::uint64_t n_ = 0, k_ = 1, seed_ = 0;
  std::vector<double> signs_;
  std::vector<double> hk_;  // H_k, row-major (k_ > 1)
};

}  // namespace ctquant
