// Fused sets: the weights that model_free_ptq quantizes with one shared NVFP4
// global scale (docs/schemes.md section 7).
//
// model_free_ptq processes one job per input shard. For a config with a
// TENSOR_GROUP (NVFP4) group, each job loads its shard's tensors minus the
// *partners* of primaries anywhere in the checkpoint, plus the partners of
// its own primaries, wherever they are stored (microscale_job_names: q_proj
// fetches k_proj and v_proj, gate_proj fetches up_proj, wq_a fetches
// wkv_a_with_mqa, w1 fetches w3). After splitting 3-D MoE experts (section
// 8), the job's tensor names are grouped into fused sets (fused_sets: q/k/v
// of `attn` or `attention` modules, `wq_a` + `wkv_a_with_mqa`, `mlp.gate_proj`
// + `mlp.up_proj`, `w1` + `w3`). The members of a complete set that the job
// quantizes with a TENSOR_GROUP scheme share one global scale, computed from
// the largest |w| over those members (section 5.3 step 2); every other
// TENSOR_GROUP weight gets its own.
//
// Consequences of the two regex tables (llm-compressor
// `entrypoints/model_free/microscale.py`, DEFAULT_FUSED_MAPPINGS and
// _DEFAULT_FUSED_MAPPINGS_LIST, at the commit schemes.md names), which these
// functions reproduce rather than tidy:
// - split MoE experts (`mlp.experts.N.gate_proj` / `up_proj`) and shared
//   experts are not fused: the set regex needs the text `mlp.gate_proj`;
// - `feed_forward.gate_proj` fetches its `up_proj` but is never fused;
// - DeepSeek's `q_a_proj` + `kv_a_proj_with_mqa` are not fused;
// - `cross_attn.q_proj` is fused when co-located, never fetched.
//
// vLLM needs equal global scales across the partitions it fuses (qkv_proj,
// gate_up_proj, defined in model/fused_groups.hpp;
// vllm/model_executor/layers/quantization/compressed_tensors/schemes/
// compressed_tensors_w4a4_nvfp4.py takes the max for q/k/v, with a warning,
// when they differ): the fused sets give q/k/v and gate/up one global scale
// whenever all members are quantized. These tables are the reference
// library's, not vLLM's: they decide the bytes written.
#pragma once

#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ctquant {

// One of the four fused-set patterns of _DEFAULT_FUSED_MAPPINGS_LIST.
struct FusedMapping {
  std::vector<std::string> targets;  // `re:` entries, matched like Python re.match
};

// The four mappings, in the order model_free tries them: q/k/v, wq_a +
// wkv_a_with_mqa, gate/up, w1 + w3.
const std::vector<FusedMapping>& fused_mappings();

// What get_fused_names returns for one job's tensor names.
struct FusedSets {
  // Each complete set: one tensor name per target of its mapping, in the
  // mapping's target order ({q, k, v}, {gate, up}, ...). Sets of the first
  // mapping come first, each mapping's sets in natural-sort order.
  std::vector<std::vector<std::string>> sets;
  // Per mapping, the names of an incomplete set left at the end of the walk
  // (empty strings for unfilled targets); these are not fused.
  std::vector<std::vector<std::string>> incomplete;
};

// llm-compressor `get_fused_names` (entrypoints/model_free/microscale.py)
// over `match_names_set_eager` (entrypoints/model_free/helpers.py): for each
// mapping, the names are sorted by natural key (runs of ASCII digits
// compared as numbers, the sort stable) and walked; each name fills the slot
// of every target it matches, and a set is emitted and reset once every slot
// is filled. Names are full tensor names ("...self_attn.q_proj.weight") after
// the MoE split. Throws Error{kBadInput} with model_free's text "Matched a
// <target> twice before completing set (<first>, <second>)" when a slot is
// filled twice before its set completes (e.g. a job holding layer 10's k/v
// and then layer 11's k_proj without its q_proj); the message also says why.
FusedSets fused_sets(std::span<const std::string> tensor_names);

// The partners a tensor's job fetches (DEFAULT_FUSED_MAPPINGS): for
// "<p>.<a>.q_proj.weight" with <a> one of attn, attention, self_attn,
// self_attention: "<p>.<a>.k_proj.weight", "<p>.<a>.v_proj.weight"; for
// "<p>.<a>.wq_a.weight" (<a>: attn, attention, self_attn):
// "<p>.<a>.wkv_a_with_mqa.weight"; for "<p>.<m>.gate_proj.weight" (<m>: mlp,
// feed_forward): "<p>.<m>.up_proj.weight"; for "<p>.w1.weight":
// "<p>.w3.weight". <p> is the shortest non-empty prefix that lets the rest
// match. Empty for every other name.
std::vector<std::string> fused_partners(const std::string& tensor_name);

// The tensor names each input shard's job loads when the config has a
// TENSOR_GROUP group (llm-compressor `build_microscale_inverse_weight_maps`
// over compressed-tensors `build_inverse_weight_maps`): weight_map lists
// (tensor name, shard file) in index order. A tensor that is a partner of
// some primary in the weight map is loaded by the primary's job, not by its
// own shard's. Returns shard -> names, grouped by source shard in first-use
// order (model_free's order within a group comes from a Python set; only
// natural-sort ties could depend on it).
//
// model_free_ptq refuses two layouts this function accepts: a primary whose
// partner is not in the weight map ("Dependency weight <name> not found in
// weight map": an X.w1.weight without X.w3.weight, a q_proj without k_proj),
// whose job then holds the partners that exist; and a shard that holds only
// partners ("Could not find inverse_weight_map for shard <shard>"), which
// then has no job. The weights of both are still well defined: each fused
// set is what its job holds.
std::map<std::string, std::vector<std::string>> microscale_job_names(
    std::span<const std::pair<std::string, std::string>> weight_map);

}  // namespace ctquant
