#include "ctquant/job/progress.hpp"

#include <cmath>

#include <fmt/format.h>

#include "ctquant/util/text.hpp"

namespace ctquant {

std::optional<ProgressMode> progress_mode_by_name(const std::string& name) {
  if (name == "none") return ProgressMode::kNone;
  if (name == "plain") return ProgressMode::kPlain;
  if (name == "bar") return ProgressMode::kBar;
  return std::nullopt;
}

ProgressReporter::ProgressReporter(ProgressMode mode, Sink sink,
                                   std::function<double()> now)
    : mode_(mode), sink_(std::move(sink)), now_(std::move(now)) {}

namespace {

double fraction_done(const Progress& p) {
  return p.bytes_total == 0 ? 1.0
                            : static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total);
}

}  // namespace

std::string ProgressReporter::line(const Progress& p, double elapsed) {
  const double fraction = fraction_done(p);
  std::string text = fmt::format("{:5.1f}%  {} of {}  {}/{} tensors", 100.0 * fraction,
                                 human_bytes(p.bytes_done), human_bytes(p.bytes_total),
                                 p.tensors_done, p.tensors_total);
  if (p.bytes_done >= p.bytes_total) {
    text += fmt::format("  {:.1f} s", elapsed);
  } else if (elapsed > 0 && p.bytes_done > 0) {
    const double rate = static_cast<double>(p.bytes_done) / elapsed;
    const double left = static_cast<double>(p.bytes_total - std::min(p.bytes_done, p.bytes_total));
    text += fmt::format("  {}/s  ETA {}", human_bytes(static_cast<std::uint64_t>(rate)),
                        duration_text(left / rate));
  } else {
    text += "  ETA ?";
  }
  return text;
}

void ProgressReporter::update(const Progress& progress) {
  if (mode_ == ProgressMode::kNone) return;
  const double now = now_();
  if (!start_) start_ = now;
  const double elapsed = now - *start_;
  latest_ = progress;
  if (mode_ == ProgressMode::kBar) {
    sink_(kRedraw, "ctquant: " + line(progress, elapsed));
    drawn_ = true;
    return;
  }
  const int decile = static_cast<int>(std::floor(fraction_done(progress) * 10.0 + 1e-9));
  const bool first = last_plain_decile_ < 0;
  if (first || decile > last_plain_decile_ || now - last_plain_time_ >= kPlainIntervalSeconds) {
    sink_("", "ctquant: progress " + line(progress, elapsed) + "\n");
    last_plain_time_ = now;
    last_plain_decile_ = decile;
    last_printed_ = true;
  } else {
    last_printed_ = false;
  }
}

void ProgressReporter::finish() {
  if (mode_ == ProgressMode::kBar && drawn_) {
    sink_(kRedraw, "");
    drawn_ = false;
  } else if (mode_ == ProgressMode::kPlain && start_ && !last_printed_) {
    sink_("", "ctquant: progress " + line(latest_, now_() - *start_) + "\n");
    last_printed_ = true;
  }
}

}  // namespace ctquant
