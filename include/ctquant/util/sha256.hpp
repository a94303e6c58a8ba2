// SHA-256 digests of files and byte strings, as `sha256sum` prints them
// (64 lowercase hex digits). The hashing is OpenSSL's libcrypto (EVP), which
// uses the CPU's SHA extensions when it has them; ctquant has no hash code of
// its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace ctquant {

// An incremental SHA-256. update() any number of times, then hex_digest()
// once. Not copyable; movable.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(std::span<const std::byte> bytes);
  void update(std::string_view bytes);
  // The digest of everything passed to update(), as 64 lowercase hex digits.
  // Ends the computation: call it once.
  std::string hex_digest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The digest of a byte string.
std::string sha256_hex(std::string_view bytes);

// The digest and size of a regular file, read sequentially in 1 MiB blocks
// (page cache hints: sequential read-ahead). label names the file in
// messages. Throws Error{kIo} when the file cannot be opened or read,
// Error{kBadInput} when it is not a regular file, Error{kInterrupted} when
// *cancel becomes true (checked between blocks; cancel may be null).
struct FileDigest {
  std::uint64_t size = 0;  // bytes hashed
  std::string sha256;      // 64 lowercase hex digits
};
FileDigest sha256_file(const std::filesystem::path& path, const std::string& label,
                       const std::atomic<bool>* cancel = nullptr);

}  // namespace ctquant
