// ctquant_bench_lint: the time of planning and of linting one checkpoint
// with the scheme groups of a QuantizationConfig file, in this process:
// wall time and the CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID),
// which other jobs on a shared machine do not inflate. tools/bench-lint.sh
// writes the checkpoint and the groups (exact-name targets, as --observer
// auto writes them) and runs it beside `quantize --dry-run`.
//
//   ctquant_bench_lint INPUT CONFIG.json [--runs N]
//
// Prints one line per run: "plan W s wall, C s CPU; lint W s wall, C s CPU;
// N findings".
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time make_plan and run_lint on a checkpoint with a QuantizationConfig's groups"};
  std::string input;
  std::string config;
  int runs = 3;
  app.add_option("INPUT", input, "Checkpoint directory")->required();
  app.add_option("CONFIG", config, "QuantizationConfig JSON file")->required();
  app.add_option("--runs", runs, "Runs")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const ctquant::Checkpoint checkpoint = ctquant::open_checkpoint(input);
    const ctquant::PlanOptions options = ctquant::read_quantization_config(config);
    for (int r = 0; r < runs; ++r) {
      double wall = wall_seconds();
      double cpu = thread_cpu_seconds();
      const ctquant::QuantizePlan plan = ctquant::make_plan(checkpoint, options);
      const double plan_wall = wall_seconds() - wall;
      const double plan_cpu = thread_cpu_seconds() - cpu;
      wall = wall_seconds();
      cpu = thread_cpu_seconds();
      const auto findings = ctquant::run_lint(checkpoint, plan, ctquant::LintOptions{});
      fmt::print(
          "plan {:.3f} s wall, {:.3f} s CPU; lint {:.3f} s wall, {:.3f} s CPU; {} findings\n",
          plan_wall, plan_cpu, wall_seconds() - wall, thread_cpu_seconds() - cpu, findings.size());
    }
  } catch (const ctquant::Error& e) {
    std::fprintf(stderr, "ctquant_bench_lint: %s\n", e.what());
    return 1;
  }
  return 0;
}
