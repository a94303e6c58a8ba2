// Private to verify_against_source (src/verify/against_source.cpp): what
// every check of OUTPUT against its INPUT shares (the two sides, the
// plan of INPUT, the options, the collector, the tensors the plan expects
// and those already checked), and the checks of every tensor that is not a
// quantized module's output (src/verify/tensor_checks.cpp): copied tensors
// the source's bytes, 16-bit weights the rows WeightRows loads, nothing
// missing, misplaced or extra. The checks of the quantized modules are
// those of AgainstSource, which derives from TensorChecks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ctquant/plan/plan.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "ctquant/verify/verify.hpp"
#include "verify/side.hpp"

namespace ctquant::detail {

class TensorChecks {
 public:
  TensorChecks(const Side& out, const Checkpoint& checkpoint, const QuantizePlan& plan,
               const VerifyOptions& options, Collector& c)
      : out_(out),
        ckpt_(checkpoint),
        plan_(plan),
        options_(options),
        c_(c),
        threads_(verify_threads(options)) {}

 protected:
  // Where the plan puts a tensor of OUTPUT.
  struct Expected {
    const ShardPlan* shard = nullptr;
    const PlannedTensor* tensor = nullptr;
  };

  // Rows per chunk of source: about VerifyOptions::chunk_bytes of rows, a
  // multiple of align.
  std::uint64_t step_rows(const WeightRows& source, std::uint64_t align) const;
  // --transform: rows [r0, r1) of module m's source, loaded as `dtype`,
  // rewritten in place as quantize rewrote them (transform/transform.hpp).
  void rewrite_rows(const PlannedModule& m, DType dtype, std::uint64_t r0, std::uint64_t r1,
                    std::byte* rows) const;
  // Loads rows [r0, r1) of source into rows and scales; the message of a
  // value that cannot have been `what`, or nullopt. Thread-safe.
  std::optional<std::string> source_problem(const WeightRows& source, std::uint64_t r0,
                                            std::uint64_t r1, std::vector<std::byte>& rows,
                                            std::vector<std::byte>& scales,
                                            const std::string& what) const;
  // Every tensor in expected_ but those in handled_: present where planned,
  // of its dtype and shape, with its bytes; nothing else in OUTPUT. Records
  // the differences in c_.
  void check_tensors();

  const Side& out_;
  const Checkpoint& ckpt_;
  const QuantizePlan& plan_;
  const VerifyOptions& options_;
  Collector& c_;
  std::map<std::string, Expected> expected_;
  std::set<std::string> handled_;  // tensors already reported or checked as a module's
  const unsigned threads_;

 private:
  bool compare_rows(const Ref& o, const PlannedModule& m, Collector& c) const;
  std::string dropped_reason(const TensorDecision& d) const;
  void check_tensor(const std::string& name, const Expected& e, Collector& c) const;
};

}  // namespace ctquant::detail
