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

  // sink receives the text to write (the CLI writes it to stderr, escaped);
  // now returns seconds on a monotonic clock (tests pass their own).
  ProgressReporter(ProgressMode mode, std::function<void(const std::string&)> sink,
                   std::function<double()> now);

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
  std::function<void(const std::string&)> sink_;
  std::function<double()> now_;
  std::optional<double> start_;
  double last_plain_time_ = 0;
  int last_plain_decile_ = -1;
  bool last_printed_ = false;  // the latest update was printed (plain)
  bool drawn_ = false;         // a bar is on the screen
  Progress latest_;
};

}  // namespace ctquant
