// verify on several threads: the report is the same for every thread count
// and chunk size, on every golden case, with differences spread over many
// chunks; and the ordered parallel loop it is built on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ctquant/format/safetensors.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/verify/verify.hpp"
#include "fake_checkpoint.hpp"
#include "golden_support.hpp"
#include "util/ordered_parallel.hpp"
#include "verify_test_support.hpp"

namespace ctquant {
namespace {

namespace fs = std::filesystem;
using test::golden;
using test::GoldenCopy;

// ---- the ordered parallel loop ----

TEST(OrderedParallel, ConsumesEveryResultInIndexOrder) {
  for (const unsigned threads : {1u, 2u, 3u, 8u}) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{200}}) {
      std::vector<std::size_t> consumed;
      detail::ordered_parallel<std::uint64_t>(
          n, threads,
          [](std::size_t i, unsigned) {
            // Uneven work, so that later tasks often finish first.
            std::uint64_t x = i;
            for (std::size_t k = 0; k < (i % 7) * 20000; ++k) x = x * 6364136223846793005u + 1;
            volatile std::uint64_t sink = x;
            static_cast<void>(sink);
            return static_cast<std::uint64_t>(i * i);
          },
          [&](std::size_t i, std::uint64_t r) {
            EXPECT_EQ(r, i * i);
            consumed.push_back(i);
          });
      ASSERT_EQ(consumed.size(), n) << threads << " threads";
      for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(consumed[i], i);
    }
  }
}

TEST(OrderedParallel, OneThreadRunsEverythingOnTheCallingThread) {
  const std::thread::id caller = std::this_thread::get_id();
  std::size_t produced = 0;
  detail::ordered_parallel<int>(
      50, 1,
      [&](std::size_t, unsigned worker) {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        EXPECT_EQ(worker, 0u);
        ++produced;
        return 0;
      },
      [&](std::size_t, int) { EXPECT_EQ(std::this_thread::get_id(), caller); });
  EXPECT_EQ(produced, 50u);
}

TEST(OrderedParallel, RethrowsTheLowestIndexFailure) {
  for (const unsigned threads : {1u, 2u, 4u}) {
    std::atomic<std::size_t> started{0};
    std::size_t consumed = 0;
    try {
      detail::ordered_parallel<int>(
          1000, threads,
          [&](std::size_t i, unsigned) {
            ++started;
            if (i == 40 || i == 41) throw std::runtime_error("task " + std::to_string(i));
            return 0;
          },
          [&](std::size_t i, int) {
            EXPECT_LT(i, 40u);
            ++consumed;
          });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "task 40") << threads << " threads";
    }
    EXPECT_LE(consumed, 40u);
    // No new task starts once a failure is seen: a window of results beyond it.
    EXPECT_LT(started.load(), 1000u) << threads << " threads";
  }
}

// While the calling thread waits for a result another thread produces, it
// calls idle() on itself; the other thread's task here finishes only once
// idle has run three times, whichever of the two tasks it took. With one thread nothing waits: idle never runs.
TEST(OrderedParallel, IdleRunsOnTheCallingThreadWhileItWaits) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> other_started{false};
  std::atomic<int> idle_calls{0};
  std::vector<std::size_t> consumed;
  detail::ordered_parallel<std::size_t>(
      2, 2,
      [&](std::size_t i, unsigned worker) {
        if (worker == 0) {
          // The other thread takes the other task.
          while (!other_started) std::this_thread::yield();
        } else {
          other_started = true;
          while (idle_calls < 3) std::this_thread::yield();
        }
        return i;
      },
      [&](std::size_t i, std::size_t r) {
        EXPECT_EQ(i, r);
        consumed.push_back(i);
      },
      [&] {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        ++idle_calls;
      },
      std::chrono::milliseconds(1));
  EXPECT_EQ(consumed, (std::vector<std::size_t>{0, 1}));
  EXPECT_GE(idle_calls.load(), 3);

  int idle_one_thread = 0;
  detail::ordered_parallel<int>(
      20, 1, [](std::size_t, unsigned) { return 0; }, [](std::size_t, int) {},
      [&] { ++idle_one_thread; }, std::chrono::milliseconds(1));
  EXPECT_EQ(idle_one_thread, 0);
}

// ---- verify ----

// Flips one byte in each of several tensors of every shard of dir, at
// offsets spread over the tensor, so that differences fall in many chunks.
void corrupt_spread(const fs::path& dir) {
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() != ".safetensors") continue;
    std::vector<std::pair<std::string, std::uint64_t>> patches;
    {
      const SafetensorsFile f(item.path(), item.path().filename().string());
      std::size_t k = 0;
      for (const TensorEntry& e : f.header().tensors) {
        if (e.byte_size() == 0 || k++ % 3 != 0) continue;
        for (const std::uint64_t at : {std::uint64_t{0}, e.byte_size() / 3, e.byte_size() - 1}) {
          patches.emplace_back(e.name, at);
        }
      }
    }
    for (const auto& [name, at] : patches) test::xor_tensor_byte(item.path(), name, at, 0x21);
  }
}

// The reports of run(options) for thread counts 1, 2 and 3 and chunk sizes
// from 4 KiB (many chunks per tensor) to the default are the same, JSON
// for JSON.
template <class Run>
void expect_same_for_every_thread_count(const std::string& what, Run run) {
  VerifyOptions one;
  one.threads = 1;
  const nlohmann::json expected = verify_json(run(one));
  for (const unsigned threads : {1u, 2u, 3u}) {
    for (const std::uint64_t chunk : {std::uint64_t{4096}, std::uint64_t{65536}}) {
      VerifyOptions options;
      options.threads = threads;
      options.chunk_bytes = chunk;
      EXPECT_EQ(verify_json(run(options)), expected)
          << what << ": " << threads << " threads, chunks of " << chunk << " bytes";
    }
  }
}

bool supported(const test::GoldenCase& c) {
  try {
    check_plan_options(test::plan_of(c));
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(VerifyThreads, AgainstSourceReportIsTheSameForEveryThreadCountAndChunkSize) {
  std::size_t cases = 0;
  for (const test::GoldenCase& c : test::golden_cases()) {
    if (!supported(c)) continue;
    GoldenCopy out(c.name);
    corrupt_spread(out.path);
    expect_same_for_every_thread_count(c.name, [&](const VerifyOptions& options) {
      return verify_against_source(out.path, golden(c.name) / "input", options);
    });
    ++cases;
  }
  EXPECT_GE(cases, 12u);
}

TEST(VerifyThreads, GoldenReportIsTheSameForEveryThreadCountAndChunkSize) {
  std::size_t cases = 0;
  for (const test::GoldenCase& c : test::golden_cases()) {
    GoldenCopy out(c.name);
    corrupt_spread(out.path);
    expect_same_for_every_thread_count(c.name, [&](const VerifyOptions& options) {
      return verify_checkpoints(out.path, golden(c.name) / "expected", options);
    });
    ++cases;
  }
  EXPECT_GE(cases, 12u);
}

// Packed codes are counted word by word: a whole word flipped is eight
// differing 4-bit codes, the first at the word's lowest nibble.
TEST(VerifyThreads, EveryFlippedCodeOfAPackedWordIsCounted) {
  GoldenCopy out("llama-bf16");
  // down_proj is [256, 384]: 48 words per row; word 7 of row 5 holds columns 56..63.
  const std::string tensor = "model.layers.0.mlp.down_proj.weight_packed";
  for (int b = 0; b < 4; ++b) {
    test::xor_tensor_byte(out.path / "model.safetensors", tensor, (5 * 48 + 7) * 4 + b, 0xFF);
  }
  const VerifyReport r = verify_checkpoints(out.path, golden("llama-bf16") / "expected", {});
  ASSERT_EQ(r.differences.size(), 1u) << test::describe(r);
  const VerifyItem& d = r.differences[0];
  EXPECT_EQ(d.kind, "codes");
  EXPECT_EQ(d.details["codes_differ"], 8);
  EXPECT_EQ(d.details["first_row"], 5);
  EXPECT_EQ(d.details["first_column"], 56);
  const int a = d.details["first_codes"][0];
  const int b = d.details["first_codes"][1];
  EXPECT_EQ((a + 8) ^ (b + 8), 15);  // every bit of the offset code
}

}  // namespace
}  // namespace ctquant
