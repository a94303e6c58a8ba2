#include "ctquant/job/progress.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "ctquant/util/text.hpp"

namespace ctquant {

std::optional<ProgressMode> progress_mode_by_name(const std::string& name) {
  if (name == "none") return ProgressMode::kNone;
  if (name == "plain") return ProgressMode::kPlain;
  if (name == "bar") return ProgressMode::kBar;
  return std::nullopt;
}

ProgressReporter::ProgressReporter(ProgressMode mode, Sink sink, std::function<double()> now,
                                   std::size_t columns)
    : mode_(mode), sink_(std::move(sink)), now_(std::move(now)), columns_(columns) {}

namespace {

constexpr std::string_view kPrefix = "ctquant: ";

double fraction_done(const Progress& p) {
  return p.bytes_total == 0
             ? 1.0
             : static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total);
}

}  // namespace

const char* ProgressReporter::phase_name(ProgressPhase phase) {
  switch (phase) {
    case ProgressPhase::kWrite:
      return "writing";
    case ProgressPhase::kMseCutoff:
      return "MSE cutoff pre-pass";
    case ProgressPhase::kAmax:
      return "max |w| pre-pass";
    case ProgressPhase::kChooseObserver:
      return "choosing observers";
    case ProgressPhase::kChooseBits:
      return "choosing bits";
  }
  return "?";
}

std::string ProgressReporter::line(const Progress& p, double elapsed, std::size_t max_chars) {
  // The parts, in the order they are shown; each is left out, lowest
  // priority first, while the line is too long.
  struct Part {
    std::string text;
    int priority;  // 0 is always kept
  };
  std::vector<Part> parts;
  parts.push_back({phase_name(p.phase), 0});
  parts.push_back({fmt::format("{:5.1f}%", 100.0 * fraction_done(p)), 0});
  parts.push_back(
      {fmt::format("{} of {}", human_bytes(p.bytes_done), human_bytes(p.bytes_total)), 2});
  parts.push_back({fmt::format("{}/{} {}", p.tensors_done, p.tensors_total,
                               p.phase == ProgressPhase::kWrite ? "tensors" : "modules"),
                   3});
  if (p.bytes_done >= p.bytes_total) {
    parts.push_back({fmt::format("{:.1f} s", elapsed), 0});
  } else if (elapsed > 0 && p.bytes_done > 0) {
    const double rate = static_cast<double>(p.bytes_done) / elapsed;
    const double left = static_cast<double>(p.bytes_total - p.bytes_done);
    parts.push_back({fmt::format("{}/s", human_bytes(static_cast<std::uint64_t>(rate))), 1});
    parts.push_back({"ETA " + duration_text(left / rate), 0});
  } else {
    parts.push_back({"ETA ?", 0});
  }
  const auto joined = [&] {
    std::string text;
    for (const Part& part : parts) {
      if (part.priority < 0) continue;
      text += (text.empty() ? "" : "  ") + part.text;
    }
    return text;
  };
  std::string text = joined();
  for (int drop = 1; max_chars > 0 && text.size() > max_chars && drop <= 3; ++drop) {
    for (Part& part : parts) {
      if (part.priority == drop) part.priority = -1;
    }
    text = joined();
  }
  if (max_chars > 0 && text.size() > max_chars) text.resize(max_chars);  // ASCII only
  return text;
}

std::size_t ProgressReporter::bar_chars() const {
  if (columns_ == 0) return 0;
  return columns_ > kPrefix.size() + 1 ? columns_ - kPrefix.size() - 1 : 1;
}

void ProgressReporter::update(const Progress& progress) {
  if (mode_ == ProgressMode::kNone) return;
  const double now = now_();
  if (start_ && progress.phase != latest_.phase) {
    // A new phase: its own totals and rate, from now.
    if (mode_ == ProgressMode::kPlain && !last_printed_) {
      sink_("", std::string(kPrefix) + "progress " + line(latest_, now - *start_) + "\n");
    }
    start_.reset();
    last_plain_decile_ = -1;
  }
  if (!start_) start_ = now;
  const double elapsed = now - *start_;
  latest_ = progress;
  if (mode_ == ProgressMode::kBar) {
    sink_(kRedraw, std::string(kPrefix) + line(progress, elapsed, bar_chars()));
    drawn_ = true;
    return;
  }
  const int decile = static_cast<int>(std::floor(fraction_done(progress) * 10.0 + 1e-9));
  const bool first = last_plain_decile_ < 0;
  if (first || decile > last_plain_decile_ || now - last_plain_time_ >= kPlainIntervalSeconds) {
    sink_("", std::string(kPrefix) + "progress " + line(progress, elapsed) + "\n");
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
    sink_("", std::string(kPrefix) + "progress " + line(latest_, now_() - *start_) + "\n");
    last_printed_ = true;
  }
}

}  // namespace ctquant
