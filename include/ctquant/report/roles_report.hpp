// The module roles and the ignore list of a plan, as text and JSON, for the
// plan `--dry-run` and `inspect --plan` print (inspect.hpp).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "ctquant/plan/plan.hpp"

namespace ctquant {

// "roles: <family> (<vLLM file>@<commit>)" or the fallback note; the
// stacked experts with E, I, H, orientation and interleaving; the modules
// kept in 16 bits by role; the files and tensors the index does not list
// (not written).
std::string render_roles_text(const Checkpoint& checkpoint, const QuantizePlan& plan);

// The ignore section: every entry written to config.json, with the modules
// it matched and, for a default entry, why it is there.
std::string render_ignore_text(const QuantizePlan& plan);

// {"family", "vllm_source", "fallback", "modules": [{module, tensor, role,
// component, vllm_build, action, reason, vllm_name, vllm_layer, hf_name}],
// "stacked_experts": [...], "not_written": {"files", "tensors"}}
nlohmann::json roles_json(const Checkpoint& checkpoint, const QuantizePlan& plan);

// [{"entry", "default", "reason", "keeps", "modules"}] for options.ignore:
// keeps, the modules a default entry was made for; modules, the ones it
// matched among those section 2 could quantize.
nlohmann::json ignore_json(const QuantizePlan& plan);

}  // namespace ctquant
