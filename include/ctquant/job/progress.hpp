// Progress of a quantize run on stderr, for people and for logs.
//
// A run goes through phases (Progress::phase: --observer auto's measuring,
// the MSE cutoff and max |w| pre-passes, the writing), each with its own
// totals: every line names its phase, and its percentage, counts, rate and
// ETA are those of that phase, measured from its first update. A line is
// "writing   42.0%  880.0 MiB of 2.08 GiB  12/69 tensors  310.5 MiB/s  ETA
// 4 s" (modules, in the other phases).
// kBar (a terminal): one line redrawn in place (carriage return, erase line)
// at every update, with the phase, the percentage, bytes done of total,
// tensors (modules, in a pre-pass), the throughput and the estimated time
// left, fitted to the terminal's width (a longer line would wrap, and the
// carriage return would leave its first rows on the screen): the
// throughput is left out first, then the bytes, then the counts; the end
// is cut last. kPlain (a log
// file, CI): a whole line at most every kPlainIntervalSeconds or every 10%
// of the bytes, whichever comes first, so that a long run shows it is alive
// without flooding the log; plus the last line of each phase. kNone:
// nothing. Text goes to a sink (stderr in the CLI), never to stdout.
#pragma once

#include <cstddef>
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

  // now returns seconds on a monotonic clock (tests pass their own);
  // columns is the terminal's width (0: unknown, lines are not cut).
  ProgressReporter(ProgressMode mode, Sink sink, std::function<double()> now,
                   std::size_t columns = 0);

  // Called with every progress update (QuantizeOptions::on_progress).
  void update(const Progress& progress);
  // Ends the display: erases the bar, or prints the last plain line if the
  // final update was not printed.
  void finish();

  // "writing  42.0%  880.0 MiB of 2.08 GiB  12/69 tensors  310.5 MiB/s  ETA 4 s":
  // the text of one update `elapsed` seconds into its phase (ETA "?" until
  // a rate is known; the elapsed time instead once every byte is done),
  // at most max_chars long (0: no limit), parts left out as the class
  // comment says, the end cut as a last resort.
  static std::string line(const Progress& progress, double elapsed, std::size_t max_chars = 0);

  // "writing", "MSE cutoff pre-pass", "max |w| pre-pass", "choosing
  // observers" (--observer auto), "choosing bits" (--target-bits).
  static const char* phase_name(ProgressPhase phase);

 private:
  // The text after "ctquant: " of a bar, at most the width less one column
  // (a line that fills the last column wraps on some terminals).
  std::size_t bar_chars() const;

  ProgressMode mode_;
  Sink sink_;
  std::function<double()> now_;
  std::size_t columns_ = 0;
  std::optional<double> start_;  // of the phase of latest_
  double last_plain_time_ = 0;
  int last_plain_decile_ = -1;
  bool last_printed_ = false;  // the latest update was printed (plain)
  bool drawn_ = false;         // a bar is on the screen
  Progress latest_;
};

}  // namespace ctquant
