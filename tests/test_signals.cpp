// Signals while a command writes nothing yet: opening a checkpoint of
// 200,000 tensors, planning and linting it (quantize), inspect and verify.
// The binary exits 1 with the message the write phase gives, at once, and
// leaves nothing behind; the library's pure phases poll the cancel flag
// inside their loops (util/cancel.hpp). Signals during the write phase are
// tests/test_output_safety.cpp's.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/report/inspect.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "fake_checkpoint.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;

// A Llama-like layout of `layers` layers, 9 tensors each, plus the
// embedding, head and final norm: 9 * layers + 3 tensors, sparse on disk.
void write_many_tensors(const fs::path& dir, std::size_t layers) {
  constexpr std::uint64_t kHidden = 128;
  std::vector<FakeSpec> specs;
  specs.reserve(layers * 9 + 3);
  for (std::size_t i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      specs.push_back({p + m + ".weight", {kHidden, kHidden}});
    }
    specs.push_back({p + "input_layernorm.weight", {kHidden}});
    specs.push_back({p + "post_attention_layernorm.weight", {kHidden}});
  }
  specs.push_back({"model.embed_tokens.weight", {256, kHidden}});
  specs.push_back({"lm_head.weight", {256, kHidden}});
  specs.push_back({"model.norm.weight", {kHidden}});
  write_sparse_checkpoint(dir, specs,
                          {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", kHidden},
                           {"intermediate_size", kHidden},
                           {"num_attention_heads", 4},
                           {"num_key_value_heads", 4},
                           {"num_hidden_layers", layers},
                           {"vocab_size", 256},
                           {"tie_word_embeddings", false}});
}

Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error thrown";
  return Error(ErrorKind::kIo, "");
}

// ---- the library: the cancel flag polled inside the pure phases ----

class CancelPoll : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    write_many_tensors(dir_->path() / "in", 50);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path input() { return dir_->path() / "in"; }
  static TempDir* dir_;
};

TempDir* CancelPoll::dir_ = nullptr;

TEST_F(CancelPoll, OpenCheckpointStopsAtTheFlag) {
  const std::atomic<bool> cancel{true};
  const CancelScope scope(&cancel, "stopped here");
  const Error e = error_of([] { open_checkpoint(input()); });
  EXPECT_EQ(e.kind(), ErrorKind::kInterrupted);
  EXPECT_STREQ(e.what(), "stopped here");
}

TEST_F(CancelPoll, MakePlanStopsAtTheFlagInsideItsLoops) {
  const Checkpoint checkpoint = open_checkpoint(input());
  EXPECT_NO_THROW(make_plan(checkpoint, PlanOptions{}));  // no scope: nothing watched
  const std::atomic<bool> cancel{true};
  const CancelScope scope(&cancel);
  const Error e = error_of([&] { make_plan(checkpoint, PlanOptions{}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInterrupted);
  EXPECT_STREQ(e.what(), "interrupted by a signal");
}

TEST_F(CancelPoll, RunLintStopsAtTheFlag) {
  const Checkpoint checkpoint = open_checkpoint(input());
  const QuantizePlan plan = make_plan(checkpoint, PlanOptions{});
  const std::atomic<bool> cancel{true};
  const CancelScope scope(&cancel);
  EXPECT_EQ(error_of([&] { run_lint(checkpoint, plan, LintOptions{}); }).kind(),
            ErrorKind::kInterrupted);
  EXPECT_EQ(error_of([&] { render_plan_text(checkpoint, plan); }).kind(), ErrorKind::kInterrupted);
}

TEST_F(CancelPoll, ScopesNestAndTheOuterOneIsWatchedAgain) {
  const std::atomic<bool> set{true};
  const std::atomic<bool> clear{false};
  const CancelScope outer(&set, "outer");
  {
    const CancelScope inner(&clear);
    EXPECT_NO_THROW(poll_cancel());
    const CancelScope none(nullptr);
    EXPECT_NO_THROW(poll_cancel());
  }
  EXPECT_STREQ(error_of([] { poll_cancel(); }).what(), "outer");
}

// ---- the binary ----

// A checkpoint of 200,001 tensors: opening it takes a while, planning and
// linting it seconds. Made once for the suite.
class SignalBeforeWriting : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    write_many_tensors(dir_->path() / "big", 22'222);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path big() { return dir_->path() / "big"; }
  static TempDir* dir_;

  TempDir tmp_;
  const fs::path output_ = tmp_ / "out";
};

TempDir* SignalBeforeWriting::dir_ = nullptr;

// Waits until `ready` holds or the child exits; false on exit.
template <class Ready>
bool wait_until(const CtquantProcess& child, Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    if (!child.running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// quantize, signalled once the checkpoint is open (its info line is
// logged): planning and lint run for seconds after it. --strict with an
// ignore entry that matches nothing (L1) makes lint stop a run that the
// signal did not stop, with a message of its own.
CommandResult quantize_signalled_while_planning(const fs::path& input, const fs::path& output,
                                                int signal_number,
                                                std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"quantize", input.string(), output.string(),
                                   "--strict", "--ignore",     "no.such.module"};
  args.insert(args.end(), more.begin(), more.end());
  CtquantProcess child(args);
  const bool opened = wait_until(
      child, [&] { return child.stderr_so_far().find("200001 tensors") != std::string::npos; });
  EXPECT_TRUE(opened) << child.stderr_so_far();
  child.signal(signal_number);
  return child.wait();
}

TEST_F(SignalBeforeWriting, SigtermWhilePlanningExitsOneAndLeavesNothing) {
  const CommandResult r = quantize_signalled_while_planning(big(), output_, SIGTERM);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err,
                 {"ctquant: error: interrupted by a signal before OUTPUT was complete (SIGTERM); "
                  "nothing was written"},
                 {"lint stopped quantize", "ctquant: done"});
  EXPECT_FALSE(fs::exists(output_));
  EXPECT_EQ(temp_leftovers(tmp_.path()), std::vector<std::string>{});
  EXPECT_EQ(fs::directory_iterator(tmp_.path()), fs::directory_iterator());
}

TEST_F(SignalBeforeWriting, SigintDuringADryRunExitsOneAndLeavesNothing) {
  const CommandResult r = quantize_signalled_while_planning(
      big(), output_, SIGINT, {"--dry-run", "--report", (tmp_ / "report.json").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"interrupted by a signal before OUTPUT was complete (SIGINT)"},
                 {"lint stopped quantize", "dry run:"});
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(fs::directory_iterator(tmp_.path()), fs::directory_iterator());
}

TEST_F(SignalBeforeWriting, InspectExitsOneOnSigterm) {
  CtquantProcess child({"inspect", big().string(), "--plan"});
  ASSERT_TRUE(wait_until(child, [&] { return child.catches(SIGTERM); }));
  child.signal(SIGTERM);
  const CommandResult r = child.wait();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"ctquant: error: interrupted by a signal (SIGTERM)"});
}

TEST_F(SignalBeforeWriting, VerifyExitsOneOnSighup) {
  CtquantProcess child({"verify", big().string(), big().string()});
  ASSERT_TRUE(wait_until(child, [&] { return child.catches(SIGHUP); }));
  child.signal(SIGHUP);
  const CommandResult r = child.wait();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err, {"ctquant: error: interrupted by a signal (SIGHUP)"});
}

}  // namespace
}  // namespace ctquant::test
