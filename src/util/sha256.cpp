#include "ctquant/util/sha256.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <openssl/evp.h>

#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace {

constexpr std::size_t kReadBlockBytes = 1u << 20;

[[noreturn]] void throw_crypto_failure(const char* what) {
  throw Error(ErrorKind::kIo, fmt::format("sha256: OpenSSL {} failed", what));
}

}  // namespace

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr) throw_crypto_failure("EVP_MD_CTX_new");
  if (EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) {
    throw_crypto_failure("EVP_DigestInit_ex");
  }
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  if (EVP_DigestUpdate(impl_->ctx, bytes.data(), bytes.size()) != 1) {
    throw_crypto_failure("EVP_DigestUpdate");
  }
}

void Sha256::update(std::string_view bytes) { update(std::as_bytes(std::span(bytes))); }

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, digest, &length) != 1) {
    throw_crypto_failure("EVP_DigestFinal_ex");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 hash;
  hash.update(bytes);
  return hash.hex_digest();
}

FileDigest sha256_file(const std::filesystem::path& path, const std::string& label,
                       const std::atomic<bool>* cancel) {
  std::uint64_t size = 0;
  const detail::UniqueFd fd = detail::open_input_file(path, label, size);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<std::byte> buffer(kReadBlockBytes);
  Sha256 hash;
  FileDigest digest;
  for (;;) {
    if (cancel != nullptr && cancel->load()) {
      throw Error(ErrorKind::kInterrupted, "interrupted by a signal before OUTPUT was complete");
    }
    const ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error(fmt::format("{}: cannot read: {}", label, std::strerror(errno)));
    }
    if (n == 0) break;
    hash.update(std::span(buffer.data(), static_cast<std::size_t>(n)));
    digest.size += static_cast<std::uint64_t>(n);
  }
  digest.sha256 = hash.hex_digest();
  return digest;
}

}  // namespace ctquant
