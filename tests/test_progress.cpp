// Progress: the reporter with a fake clock (plain lines every 10% or 5 s,
// the bar, a line per phase with its own totals and ETA, lines cut to the
// terminal's width), the phases a run reports with their totals (MSE
// cutoff and max |w| pre-passes, --observer auto's measuring, the writing),
// and the binary on a 50-column terminal.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ctquant/job/progress.hpp"
#include "ctquant/job/quantize.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "golden_support.hpp"
#include "test_support.hpp"

namespace ctquant {
namespace {

using test::expect_message;
namespace fs = std::filesystem;

struct FakeClock {
  double now = 0;
};

Progress writing(std::uint64_t bytes_done, std::uint64_t bytes_total, std::uint64_t done,
                 std::uint64_t total) {
  return Progress{bytes_done, bytes_total, done, total, ProgressPhase::kWrite};
}

TEST(Progress, PlainPrintsEveryTenPercentOrFiveSecondsAndTheEnd) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressReporter p(
      ProgressMode::kPlain,
      [&](std::string_view control, std::string_view s) {
        EXPECT_EQ(control, "");
        lines.emplace_back(s);
      },
      [&] { return clock.now; });
  const std::uint64_t total = 1000;
  // Updates every 0.25 s, 1 byte each, for 10 s (4%: no new tenth).
  for (int i = 0; i <= 40; ++i) {
    clock.now = 0.25 * i;
    p.update(writing(static_cast<std::uint64_t>(i), total, 0, 10));
  }
  // The first update, then one line every 5 s: at 0, 5 and 10 s.
  ASSERT_EQ(lines.size(), 3u);
  expect_message(lines[0], {"ctquant: progress writing", "0.0%", "ETA ?"});
  expect_message(lines[1], {"2.0%", "20 B of 1000 B", "ETA 4 min 0"});
  expect_message(lines[2], {"4.0%"});
  for (const auto& l : lines) EXPECT_EQ(l.back(), '\n');
  // A jump over two deciles prints at once; within a decile it waits.
  clock.now = 10.5;
  p.update(writing(350, total, 3, 10));
  clock.now = 10.7;
  p.update(writing(380, total, 3, 10));
  ASSERT_EQ(lines.size(), 4u);
  expect_message(lines[3], {"35.0%", "3/10 tensors"});
  // The end is always printed.
  clock.now = 11.0;
  p.update(writing(390, total, 3, 10));
  clock.now = 12.0;
  p.update(writing(1000, total, 10, 10));
  p.finish();
  ASSERT_EQ(lines.size(), 5u);
  expect_message(lines.back(), {"100.0%", "10/10 tensors", "12.0 s"});
}

TEST(Progress, BarRedrawsOneLineWithBytesAndEta) {
  FakeClock clock;
  std::string out;
  ProgressReporter p(
      ProgressMode::kBar,
      [&](std::string_view control, std::string_view s) {
        EXPECT_EQ(control, ProgressReporter::kRedraw);
        out += std::string(control) + std::string(s);
      },
      [&] { return clock.now; });
  p.update(writing(0, 4u << 20, 0, 4));
  clock.now = 2;
  p.update(writing(1u << 20, 4u << 20, 1, 4));
  expect_message(out, {"\r\033[Kctquant: writing   25.0%  1.0 MiB of 4.0 MiB  1/4 tensors  "
                       "512.0 KiB/s  ETA 6 s"});
  EXPECT_EQ(out.find('\n'), std::string::npos);
  p.finish();
  EXPECT_TRUE(out.ends_with("\r\033[K"));
}

TEST(Progress, NonePrintsNothingAndModesHaveNames) {
  std::string out;
  ProgressReporter p(
      ProgressMode::kNone,
      [&](std::string_view control, std::string_view s) {
        out += std::string(control) + std::string(s);
      },
      [] { return 0.0; });
  p.update(writing(1, 2, 0, 1));
  p.finish();
  EXPECT_EQ(out, "");
  EXPECT_EQ(progress_mode_by_name("plain"), ProgressMode::kPlain);
  EXPECT_EQ(progress_mode_by_name("bar"), ProgressMode::kBar);
  EXPECT_EQ(progress_mode_by_name("none"), ProgressMode::kNone);
  EXPECT_EQ(progress_mode_by_name("fancy"), std::nullopt);
}

TEST(Progress, PlainIsTheDefaultOffATerminalAndNeverOnStdout) {
  // run_ctquant captures stderr to a file: not a terminal.
  test::TempDir dir;
  const auto r =
      test::run_ctquant({"quantize", (test::golden_dir() / "llama-bf16" / "input").string(),
                         (dir / "out").string(), "--no-sync"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  expect_message(r.err, {"ctquant: progress writing  100.0%"}, {"\r", "\033"});
}

// A pre-pass of 1 GiB in 10 s, then the writing of 2 GiB: each line names
// its phase, and the writing's percentage, total, rate and ETA are its own,
// measured from its first update (not 3 GiB, not the pre-pass's rate).
TEST(Progress, EachPhaseHasItsOwnTotalsRateAndEta) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressReporter p(
      ProgressMode::kPlain, [&](std::string_view, std::string_view s) { lines.emplace_back(s); },
      [&] { return clock.now; });
  const std::uint64_t gib = 1ull << 30;
  p.update(Progress{0, gib, 0, 7, ProgressPhase::kMseCutoff});
  clock.now = 10;
  p.update(Progress{gib, gib, 7, 7, ProgressPhase::kMseCutoff});
  clock.now = 10.5;
  p.update(writing(0, 2 * gib, 0, 69));
  clock.now = 11.5;
  p.update(writing(gib, 2 * gib, 30, 69));
  ASSERT_EQ(lines.size(), 4u);
  expect_message(lines[0], {"MSE cutoff pre-pass", "0.0%", "0 B of 1.00 GiB", "0/7 modules"});
  expect_message(lines[1], {"MSE cutoff pre-pass  100.0%", "7/7 modules", "10.0 s"});
  expect_message(lines[2], {"writing", "0.0%", "0 B of 2.00 GiB", "0/69 tensors", "ETA ?"});
  // 1 GiB in the writing's 1 s: 1 GiB/s, 1 s left.
  expect_message(lines[3], {"writing", "50.0%", "1.00 GiB of 2.00 GiB", "30/69 tensors",
                            "1.00 GiB/s", "ETA 1 s"});
  for (const std::string& l : lines) EXPECT_EQ(l.find("3.00 GiB"), std::string::npos) << l;
}

TEST(Progress, EveryPhaseHasAName) {
  EXPECT_STREQ(ProgressReporter::phase_name(ProgressPhase::kWrite), "writing");
  EXPECT_STREQ(ProgressReporter::phase_name(ProgressPhase::kMseCutoff), "MSE cutoff pre-pass");
  EXPECT_STREQ(ProgressReporter::phase_name(ProgressPhase::kAmax), "max |w| pre-pass");
  EXPECT_STREQ(ProgressReporter::phase_name(ProgressPhase::kChooseObserver), "choosing observers");
}

// On a 50-column terminal every draw fits in 49 columns (a wrapped line
// leaves its first rows on the screen at every redraw): the rate goes
// first, then the bytes, then the counts; the phase, percentage and ETA
// stay.
TEST(Progress, BarFitsAFiftyColumnTerminal) {
  FakeClock clock;
  std::vector<std::string> draws;
  ProgressReporter p(
      ProgressMode::kBar, [&](std::string_view, std::string_view s) { draws.emplace_back(s); },
      [&] { return clock.now; }, 50);
  const std::uint64_t gib = 1ull << 30;
  p.update(Progress{0, gib, 0, 7, ProgressPhase::kChooseObserver});
  clock.now = 3;
  p.update(Progress{gib / 3, gib, 2, 7, ProgressPhase::kChooseObserver});
  clock.now = 4;
  p.update(writing(0, 2 * gib, 0, 12345));
  clock.now = 9;
  p.update(writing(gib, 2 * gib, 6000, 12345));
  ASSERT_EQ(draws.size(), 4u);
  for (const std::string& d : draws) EXPECT_LE(d.size(), 49u) << d;
  expect_message(draws[1], {"ctquant: choosing observers", "33.3%", "ETA 6 s"});
  expect_message(draws[3], {"ctquant: writing", "50.0%", "ETA 5 s"}, {"/s "});
  // The whole line where it fits.
  EXPECT_EQ(ProgressReporter::line(writing(gib, 2 * gib, 6000, 12345), 5),
            "writing   50.0%  1.00 GiB of 2.00 GiB  6000/12345 tensors  204.8 MiB/s  ETA 5 s");
  EXPECT_EQ(ProgressReporter::line(writing(gib, 2 * gib, 6000, 12345), 5, 45),
            "writing   50.0%  6000/12345 tensors  ETA 5 s");
  EXPECT_EQ(ProgressReporter::line(writing(gib, 2 * gib, 6000, 12345), 5, 40),
            "writing   50.0%  ETA 5 s");
  EXPECT_EQ(ProgressReporter::line(writing(gib, 2 * gib, 6000, 12345), 5, 20),
            "writing   50.0%  ETA");
}

// The updates of a library run, by phase.
std::map<ProgressPhase, std::vector<Progress>> updates_of(QuantizeOptions options) {
  std::map<ProgressPhase, std::vector<Progress>> by_phase;
  std::vector<ProgressPhase> order;
  options.on_progress = [&](const Progress& p) {
    if (order.empty() || order.back() != p.phase) order.push_back(p.phase);
    by_phase[p.phase].push_back(p);
  };
  quantize(options);
  // Each phase is one stretch of updates: none comes back.
  std::set<ProgressPhase> seen(order.begin(), order.end());
  EXPECT_EQ(seen.size(), order.size());
  return by_phase;
}

std::uint64_t tensor_bytes(const fs::path& input) {
  return open_checkpoint(input).total_tensor_bytes();
}

// NVFP4 with the MSE observer: the cutoff pre-pass, the max |w| pre-pass
// and the writing, each from 0 to its own total. The writing reads every
// input tensor once: its total is the model's size (it was the sum of all
// three passes), and its tensor count moves from the start.
TEST(Progress, PrePassesAndTheWritingEachReportTheirOwnTotals) {
  const fs::path input = test::golden_dir() / "llama-bf16" / "input";
  test::TempDir tmp;
  QuantizeOptions options = test::test_options(input, tmp / "out");
  // NVFP4 (a max |w| pre-pass) with memoryless_mse, whose patience can stop
  // the search early (a cutoff pre-pass).
  SchemeGroup group = preset_group("NVFP4A16");
  group.targets = {"Linear"};
  group.weights.observer = "memoryless_mse";
  options.plan.groups = {group};
  options.threads = 1;
  options.chunk_bytes = 4096;
  const auto phases = updates_of(options);
  ASSERT_TRUE(phases.contains(ProgressPhase::kMseCutoff));
  ASSERT_TRUE(phases.contains(ProgressPhase::kAmax));
  ASSERT_TRUE(phases.contains(ProgressPhase::kWrite));
  for (const auto& [phase, updates] : phases) {
    SCOPED_TRACE(ProgressReporter::phase_name(phase));
    const Progress& last = updates.back();
    EXPECT_EQ(last.bytes_done, last.bytes_total);
    EXPECT_GT(last.tensors_total, 0u);
    EXPECT_EQ(last.tensors_done, last.tensors_total);
    for (const Progress& p : updates) {
      EXPECT_EQ(p.bytes_total, last.bytes_total);
      EXPECT_LE(p.bytes_done, p.bytes_total);
    }
  }
  const std::uint64_t model = tensor_bytes(input);
  EXPECT_EQ(phases.at(ProgressPhase::kWrite).back().bytes_total, model);
  EXPECT_LT(phases.at(ProgressPhase::kMseCutoff).back().bytes_total, model);
  EXPECT_LT(phases.at(ProgressPhase::kAmax).back().bytes_total, model);
}

// --observer auto measures every module: its updates count them (they said
// 0/0 tensors).
TEST(Progress, ObserverAutoCountsTheModulesItMeasures) {
  const test::GoldenCase c = test::find_case("llama-bf16-mse");
  test::TempDir tmp;
  QuantizeOptions options = test::test_options(test::input_of(c), tmp / "out");
  options.auto_observer = true;
  const auto phases = updates_of(options);
  ASSERT_TRUE(phases.contains(ProgressPhase::kChooseObserver));
  const Progress& last = phases.at(ProgressPhase::kChooseObserver).back();
  EXPECT_GT(last.tensors_total, 0u);
  EXPECT_EQ(last.tensors_done, last.tensors_total);
  EXPECT_EQ(last.bytes_done, last.bytes_total);
  EXPECT_EQ(phases.at(ProgressPhase::kWrite).back().bytes_total, tensor_bytes(test::input_of(c)));
}

// The binary with --progress bar off a terminal and COLUMNS=50 (a 50-column
// pane): every draw of the bar fits in 49 columns.
TEST(Progress, BinaryFitsTheBarToColumns) {
  test::TempDir tmp;
  test::write_large_checkpoint(tmp / "in", 8, 512, 2048);
  test::RunOptions run;
  run.env = {"COLUMNS=50"};
  const test::CommandResult r =
      test::run_ctquant({"quantize", (tmp / "in").string(), (tmp / "out").string(), "--threads",
                         "1", "--progress", "bar"},
                        run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::size_t draws = 0;
  for (std::size_t at = r.err.find(ProgressReporter::kRedraw); at != std::string::npos;
       at = r.err.find(ProgressReporter::kRedraw, at + 1)) {
    // A draw is followed by the next one (or the erase at the end); what
    // follows the erase is the summary line.
    const std::size_t start = at + ProgressReporter::kRedraw.size();
    const std::size_t end = r.err.find_first_of("\r\n", start);
    if (end == std::string::npos || r.err[end] != '\r') continue;
    const std::string draw = r.err.substr(start, end - start);
    ++draws;
    EXPECT_LE(draw.size(), 49u) << draw;
    expect_message(draw, {"ctquant: writing", "%"});
  }
  EXPECT_GT(draws, 0u) << r.err;
}

}  // namespace
}  // namespace ctquant
