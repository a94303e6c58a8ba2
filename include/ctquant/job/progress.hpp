// Progress of a quantize run on stderr, for people and for logs.
//
// kBar (a terminal): one line redrawn in place (carriage return, erase line)
// at every update, with the percentage, bytes done of total, tensors, the
// throughput and the estimated time left. kPlain (a log file, CI): a whole
// line at most every kPlainIntervalSeconds or every 10% of the bytes,
// whichever comes first, so that a long run shows it is alive without
// flooding the log; plus the final 100% line. kNone: nothing. Text goes to
// a sink (stderr in the CLI), never to stdout.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "ctquant/exec/executor.hpp"

namespace ctquant {

enum class ProgressMode { kNone, kPlain, kBar };

// "none", "plain", "bar" -> the mode, or nullopt.
std::optional<ProgressMode> progress_mode_by_name(const std::string& name);

class ProgressReporter {
 public:
  // Seconds between two plain lines at most (a line is also printed at every
  // further 10% of the bytes).
  static constexpr double kPlainIntervalSeconds = 5.0;

  // The reporter's own terminal control before a bar is drawn and when it
  // is erased: carriage return, erase to the end of the line.
  static constexpr std::string_view kRedraw = "\r\033[K";

  // What receives the output: `control` is the reporter's own terminal
  // control (kRedraw, or empty), written as it is; `text` is the line to
  // show, which the CLI escapes (escape_for_terminal) like every line that
  // may hold a name. The CLI writes both to stderr.
  using Sink = std::function<void(std::string_view control, std::string_view text)>;

  // now returns seconds on a monotonic clock (tests pass their own).
  ProgressReporter(ProgressMode mode, Sink sink, std::function<double()> now);

  // Called with every progress update (QuantizeOptions::on_progress).
  void update(const Progress& progress);
  // Ends the display: erases the bar, or prints the last plain line if the
  // final update was not printed.
  void finish();

  // "42.0%  880.0 MiB of 2.08 GiB  12/69 tensors  310.5 MiB/s  ETA 4 s": the
  // text of one update after `elapsed` seconds (ETA "?" until a rate is
  // known; the elapsed time instead once every byte is done).
  static std::string line(const Progress& progress, double elapsed);

 private:
  ProgressMode mode_;
  Sink sink_;
  std::function<double()> now_;
  std::optional<double> start_;
  double last_plain_time_ = 0;
  int last_plain_decile_ = -1;
  bool last_printed_ = false;  // the latest update was printed (plain)
  bool drawn_ = false;         // a bar is on the screen
  Progress latest_;
};

}  // namespace ctquant
