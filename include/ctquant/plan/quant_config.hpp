// Scheme groups and the ignore list from a compressed-tensors
// QuantizationConfig, the object model_free_ptq's `config=` takes
// (`--quantization-config FILE.json`), and from `--scheme-for PATTERN=PRESET`.
//
// A config group is a QuantizationScheme ({"targets": [...], "weights":
// {QuantizationArgs}, "input_activations": ..., "output_activations": ...,
// "format": ...}) or, under a preset's name, the list of its targets
// (compressed-tensors' QuantizationConfig.model_post_init expands it to the
// preset). Groups keep the order given: a module goes to the first group
// whose targets match it (schemes.md 9.3). Only what model_free_ptq can do
// data-free is accepted (schemes.md 10): weights are required; activations
// must be dynamic; no kv_cache_scheme, no transform or sparsity config.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "ctquant/plan/plan.hpp"

namespace ctquant {

// Parses a QuantizationConfig object. `where` names it in messages (a file
// name). Throws Error{kUsage} naming `where`, the group and the field for
// anything ctquant cannot honour.
PlanOptions plan_options_from_config(const nlohmann::json& config, const std::string& where);

// Reads and parses a QuantizationConfig JSON file (plan_options_from_config).
// Throws Error{kUsage} for a file that cannot be read or is not JSON.
PlanOptions read_quantization_config(const std::string& path);

// Applies `--group-size N` to an integer preset's group: N columns per
// scale, -1 channel-wise. A preset changed is a scheme object to
// compressed-tensors, so its group is renamed "config_group_0" (schemes.md
// 9.1) unless the result is the preset itself. Throws Error{kUsage} for a
// non-integer scheme or a group size that is neither positive nor -1.
void apply_group_size(SchemeGroup& group, long long group_size);

// The group of `--scheme-for PATTERN=PRESET`: PRESET with targets
// [PATTERN]. Throws Error{kUsage} for a malformed spec or an unknown preset.
SchemeGroup scheme_for_group(const std::string& spec);

// Whether `--scheme-for PATTERN=PRESET@OBSERVER` names its group's observer
// (an '@' after the last '='): the more specific choice, which --observer
// does not replace and --observer auto and --optimize refuse.
bool scheme_for_names_observer(const std::string& spec);

// Appends a group, merging it into an earlier group of the same name (one
// config_groups key per preset): its targets are appended.
void add_scheme_group(PlanOptions& options, SchemeGroup group);

// The input activations block as compressed-tensors serialises it
// (QuantizationArgs.model_dump: every field, defaults filled in, observer
// null for dynamic activations). Throws Error{kUsage} naming `where` for
// activations that are not dynamic ("Model Free PTQ cannot calibrate
// activations", schemes.md 10).
nlohmann::json activation_args_json(const nlohmann::json& args, const std::string& where);

}  // namespace ctquant
