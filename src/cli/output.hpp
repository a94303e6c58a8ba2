// What the CLI prints (private to src/cli): stdout, checked; stderr, escaped
// (escape_for_terminal: names read from input files must not drive the
// terminal); the logger of log lines; the terminal's width.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <spdlog/logger.h>
#include <nlohmann/json.hpp>

namespace ctquant::cli {

// A logger writing "ctquant: LEVEL: message" lines to stderr, escaped:
// errors only for verbosity < 0, debug for > 0, info otherwise.
std::shared_ptr<spdlog::logger> make_logger(int verbosity);

// The one place ctquant writes to stdout (reports, plans, JSON). The write
// is checked: a full disk, /dev/full or a closed pipe is Error{kIo} (exit
// 1), never a silent empty file.
void write_stdout(const std::string& text);

// Prints a text report (inventory, plan, lint findings, verify report) on
// stdout, escaped: the names in it come from input files and must not drive
// the terminal.
void print_text_report(const std::string& text);

// Prints a JSON report on stdout as it is: dump() writes every control
// character as a \uXXXX escape and throws on text that is not UTF-8.
void print_json_report(const nlohmann::json& report);

// Prints text on stderr, escaped.
void print_stderr(const std::string& text);

// Prints an error on stderr, first erasing the progress line a terminal may
// show; the message is escaped, since it names files and tensors.
void print_error(const std::string& message);

// The exit status of --help and --version (written by CLI11 on std::cout):
// 1 when stdout could not take the text.
int checked_stdout(int status);

// The columns of the terminal stderr is (ioctl TIOCGWINSZ), else $COLUMNS
// when it is a whole number, else 0 (unknown: lines are not cut).
std::size_t stderr_columns();

}  // namespace ctquant::cli
