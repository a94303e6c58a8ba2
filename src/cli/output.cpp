#include "cli/output.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "ctquant/util/error.hpp"
#include "ctquant/util/escape.hpp"

namespace ctquant::cli {

namespace {

// Writes each formatted log line to stderr with escape_for_terminal applied:
// log lines name tensors, modules and files taken from input files (lint
// findings, their fixes, warnings), which must not drive the terminal.
class EscapingStderrSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    const std::string text =
        ctquant::escape_for_terminal(std::string_view(formatted.data(), formatted.size()));
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

}  // namespace

std::shared_ptr<spdlog::logger> make_logger(int verbosity) {
  auto logger = std::make_shared<spdlog::logger>("ctquant", std::make_shared<EscapingStderrSink>());
  logger->set_pattern("ctquant: %l: %v");
  logger->set_level(verbosity < 0   ? spdlog::level::err
                    : verbosity > 0 ? spdlog::level::debug
                                    : spdlog::level::info);
  return logger;
}

// The one place ctquant writes to stdout (reports, plans, JSON). The write
// is checked: a full disk, /dev/full or a closed pipe is Error{kIo} (exit
// 1), never a silent empty file.
void write_stdout(const std::string& text) {
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), stdout) == text.size();
  if (!written || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const int error = errno;
    std::clearerr(stdout);
    throw ctquant::io_error(fmt::format("cannot write to standard output: {}",
                                        error != 0 ? std::strerror(error) : "write failed"));
  }
}

// Prints a text report (inventory, plan, lint findings, verify report) on
// stdout, escaped: the names in it come from input files and must not drive
// the terminal.
void print_text_report(const std::string& text) {
  write_stdout(ctquant::escape_for_terminal(text));
}

// Prints a JSON report on stdout as it is: dump() writes every control
// character as a \uXXXX escape and throws on text that is not UTF-8.
void print_json_report(const nlohmann::json& report) { write_stdout(report.dump(2) + "\n"); }

// Prints an error on stderr, first erasing the progress line a terminal may
// show; the message is escaped, since it names files and tensors.
void print_error(const std::string& message) {
  std::string text = ::isatty(STDERR_FILENO) == 1 ? "\r\033[K" : "";
  text += "ctquant: error: ";
  text += ctquant::escape_for_terminal(message);
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stderr);
}

// The exit status of --help and --version (written by CLI11 on std::cout):
// 1 when stdout could not take the text.
int checked_stdout(int status) {
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    print_error(fmt::format("cannot write to standard output: {}", std::strerror(errno)));
    return 1;
  }
  return status;
}

void print_stderr(const std::string& text) {
  const std::string escaped = ctquant::escape_for_terminal(text);
  std::fwrite(escaped.data(), 1, escaped.size(), stderr);
}

std::size_t stderr_columns() {
  winsize size{};
  if (::isatty(STDERR_FILENO) == 1 && ::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 &&
      size.ws_col > 0) {
    return size.ws_col;
  }
  const char* columns = std::getenv("COLUMNS");
  if (columns == nullptr || *columns == '\0' || std::strlen(columns) > 6 ||
      !std::all_of(columns, columns + std::strlen(columns),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return 0;
  }
  return static_cast<std::size_t>(std::atoi(columns));
}

}  // namespace ctquant::cli
