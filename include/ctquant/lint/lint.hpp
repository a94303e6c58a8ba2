// Lint: checks of a quantization plan against what vLLM can load, run before
// anything is written.
//
// run_lint() looks at the checkpoint's headers and config.json and at the
// plan (each tensor's fate, the modules each ignore and targets entry
// matched) and returns findings. Each finding has an id (L1..L17), a
// severity, the tensors concerned, what was found and the fix. The reasons
// behind the rules are section 7 of the format spec:
//
//   L1 warning  an ignore or targets entry matched no module (near misses
//               listed); info when it matched only modules that are never
//               quantized anyway (embeddings, norms, non-2-D tensors) and for
//               the default ignore list's lm_head; default targets not checked
//   L2 error    a literal ignore entry that vLLM, after mapping it to its
//               own names (roles.hpp), does not match for a module kept in
//               16 bits; info when another entry covers the module
//   L3 error    a fused layer split between quantized and not (q/k/v_proj of
//               one attention, gate/up_proj of one MLP, the experts of one
//               MoE layer)
//   L4 error    a DFlash draft whose qkv_proj (or q/k/v_proj) is quantized
//   L5 error    a quantized tensor whose per-shard shape the vLLM kernel of
//      warning  its family cannot run at the chosen tensor-parallel degree
//               (SchemeFamily::vllm_shape_rule: an error where current vLLM
//               refuses the shard, e.g. in_features % group size for
//               Marlin; a warning where only older releases do, e.g.
//               out_features % 64); the fix covers its whole fused q/k/v or
//               gate/up group
//   L6 error    tie_word_embeddings is true and lm_head.weight is quantized;
//      warning  tied, no lm_head tensor, and no ignore entry names lm_head
//               (transformers fails to tie the head it builds:
//               absent_head_entry() in roles.hpp)
//   L7 error    a 3-D .weight that is not a stacked gate_up_proj / down_proj
//               tensor (those are split) and that no ignore entry covers;
//               stacked experts that are not split while the family's vLLM
//               loader reads experts per expert, or kept while vLLM's MoE
//               probes say their layer is quantized
//   L8 info     an unanchored `re:` entry that matches some modules only by a
//               prefix of their names (`re:.*gate` also takes `gate_proj`)
//   L9 error    no tensor would be quantized at all
//   L10 error   a scheme group whose arguments no vLLM kernel runs
//               (SchemeFamily::vllm_args_rule: a bit width, or a group size
//               Marlin does not take)
//   L11 error   a module vLLM's target matching would give to another scheme
//               group than the one ctquant quantized it with
//   L12 error   a module vLLM loads unquantized (output head, embedding,
//               router, shared-expert gate, plain nn.Linear) would be packed
//   L13 error   the written ignore list and targets, evaluated as vLLM does
//               on vLLM's names (vllm_match.hpp), disagree with what OUTPUT
//               holds, or vLLM raises on them; warning for a quantizable
//               layer neither matches
//   L14 warning NVFP4 partners vLLM fuses into one layer (an expert's
//               gate/up or w1/w3, a shared expert's gate/up, MLA's q_a_proj /
//               kv_a_proj_with_mqa) with their own global scales, as
//               model_free_ptq writes them: vLLM serves the layer with one
//               (compressed_tensors_moe.py takes the gate's; vLLM issue
//               54150; compressed_tensors_w4a4_nvfp4.py for dense layers)
//   L15 warning less than kMinQuantizedShare of the linear layers' weight
//               parameters quantized, or a whole MoE layer's experts kept in
//               16 bits: the share of each reason and the option changing it
//   L16 warning a draft or MTP module vLLM loads packed that another engine
//               reads as a plain weight would be packed (EAGLE-3 / DFlash
//               fc, MTP fc, DFlash2 selector), naming each engine's file
//   L17 warning tie_word_embeddings is false, the embedding is there and no
//               output head is (vLLM checks loaded weights only for
//               unquantized models)
//
// L2, L7 (stacked experts), L12, L13, L15, L16 and L17 read the module roles
// (src/lint/roles_lint.hpp); docs/loadability.md lists them with sources.
// L1 also tells an entry that matched nothing apart from one vLLM or
// transformers need (an empty weight vLLM would build quantized, the head
// transformers builds for a tied model).
//
// Whether findings stop `quantize` is decided by blocking_findings(): errors
// unless allow_unloadable, warnings under strict; infos never.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/plan/plan.hpp"

namespace ctquant {

enum class Severity { kInfo, kWarning, kError };

// "info", "warning", "error".
const char* severity_name(Severity severity);

struct Finding {
  std::string id;  // "L1" .. "L17"
  Severity severity = Severity::kWarning;
  std::vector<std::string> tensors;  // input tensors concerned (may be empty for L1)
  std::string message;               // what was found, naming entries, tensors and shapes
  std::string fix;                   // what to change, usually an --ignore entry to add
  // The fix as a change of the command line, when `fix` is one (it names
  // the same entries): --ignore entries to add, and an entry of the ignore
  // list (or, with fix_removes_target, of the targets) to take out; a fix
  // that rewrites an entry does both. Applied, it passes lint: no error
  // remains of this finding, and none of another (tests/test_lint.cpp).
  std::vector<std::string> fix_ignore;
  std::string fix_removes;
  bool fix_removes_target = false;
  std::vector<std::string> fix_targets;  // --targets entries that replace fix_removes
  std::vector<std::string> fix_options;  // options without a value to add ("--quantize-vision")
};

struct LintOptions {
  unsigned tp = 1;  // tensor-parallel degree the checkpoint will be served with (L5)
};

// L15 warns when less than this share of the linear layers' weight
// parameters (QuantizePlan::linear_params) would be quantized. Default runs
// of dense and MoE models quantize nearly all of them (routers are tiny),
// DFlash drafts, whose qkv_proj stays in 16 bits, 81% (Laguna's layout) to
// 88% (Qwen3-8B's); a model whose vision tower, experts or ignore entries
// keep a fifth or more in 16 bits is told why.
inline constexpr double kMinQuantizedShare = 0.80;

// Tensor-parallel degrees L5 tries when it lists the ones that work.
inline constexpr unsigned kLintTpDegrees[] = {1, 2, 4, 8};

// Runs every rule on a plan made from checkpoint. Pure: reads headers and
// config.json only, writes nothing. Findings come rule by rule (L1 first),
// each listing its tensors in input order. Throws Error{kUsage} only if
// options.tp is 0.
std::vector<Finding> run_lint(const Checkpoint& checkpoint, const QuantizePlan& plan,
                              const LintOptions& options);

// Whether the finding's fix has a machine form (any fix_* field set).
bool has_fix(const Finding& f);

// The options the finding's fix gives, applied as the command line would
// apply it to `given` (the options as given, without the default entries
// make_plan adds): fix_removes taken out of the ignore list (with
// fix_removes_target, out of every group's targets), each fix_ignore entry
// appended to the ignore list unless there, fix_targets appended to the
// first group's targets, fix_options set. Throws std::logic_error for a
// fix option it does not know (only "--quantize-vision" exists).
PlanOptions apply_fix(PlanOptions given, const Finding& f);

// The findings that stop quantize: severity error unless allow_unloadable,
// severity warning when strict. Pointers into findings.
std::vector<const Finding*> blocking_findings(const std::vector<Finding>& findings, bool strict,
                                              bool allow_unloadable);

// One finding as text: "L5 warning: <message>\n  tensors: a, b\n  fix: <fix>"
// (tensor lists longer than max_tensors are cut with "... and N more"; without
// the severity word when with_severity is false, for log lines that carry it).
std::string format_finding(const Finding& finding, std::size_t max_tensors = 8,
                           bool with_severity = true);

// All findings as text, one block per finding, or "lint: no findings\n".
std::string render_findings_text(const std::vector<Finding>& findings);

// Their count by severity, as the first line of render_findings_text says
// it without "lint: ": "no findings" or "1 error, 2 warnings, 0 info".
std::string findings_summary(const std::vector<Finding>& findings);

// [{"id", "severity", "tensors", "message", "fix"}, ...]
nlohmann::json findings_json(const std::vector<Finding>& findings);

// Whether vLLM prefixes this checkpoint's module names at load time: a DFlash
// draft (architectures containing "DFlash", or a dflash_config), or a
// checkpoint with `layers.` tensors and no `model.` prefix on any tensor
// (section 7 of the format spec).
bool names_prefixed_at_load(const Checkpoint& checkpoint);

// Whether config.json describes a DFlash draft.
bool is_dflash_draft(const Checkpoint& checkpoint);

}  // namespace ctquant
