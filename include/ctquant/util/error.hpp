// The one exception type of the ctquant library.
//
// Library code reports every failure by throwing ctquant::Error with a kind;
// only the command-line front end maps kinds to exit codes (docs/cli.md):
// kUsage -> 2, kDifferent -> 3, everything else -> 1. Messages name the file,
// the tensor and the rule that failed, and say what was found and what was
// expected, e.g.
//   model-00002-of-00004.safetensors: tensor 'layers.3.mlp.down_proj.weight':
//   data_offsets [0, 99] hold 99 bytes, expected 100 for BF16 [5, 10]
#pragma once

#include <stdexcept>
#include <string>

namespace ctquant {

enum class ErrorKind {
  kUsage,        // bad options or arguments (exit 2)
  kBadInput,     // an input file breaks a rule of the format spec (exit 1)
  kIo,           // the operating system refused a read or write (exit 1)
  kNoSpace,      // the output filesystem is full or a size limit was hit (exit 1)
  kLint,         // a lint error (or, under --strict, a warning) stopped the run (exit 1)
  kInterrupted,  // SIGINT, SIGTERM or SIGHUP arrived before the command finished (exit 1)
  kDifferent,    // verify found differences (exit 3)
  kUnsupported,  // the input is in a format ctquant recognises but does not convert (exit 2):
                 // an AutoAWQ version other than GEMM, a ModelOpt algorithm other than NVFP4
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Shorthands; each returns the exception so call sites read `throw bad_input(...)`.
inline Error usage_error(const std::string& message) { return {ErrorKind::kUsage, message}; }
inline Error bad_input(const std::string& message) { return {ErrorKind::kBadInput, message}; }
inline Error unsupported_input(const std::string& message) {
  return {ErrorKind::kUnsupported, message};
}
inline Error io_error(const std::string& message) { return {ErrorKind::kIo, message}; }

// Throws the error for a failed write: Error{kNoSpace} for ENOSPC, EDQUOT and
// EFBIG (the file size limit), Error{kIo} otherwise. what names the file.
[[noreturn]] void throw_write_error(const std::string& what, int errno_value);

// Process exit status for an error kind, as documented in docs/cli.md.
int exit_status(ErrorKind kind) noexcept;

}  // namespace ctquant
