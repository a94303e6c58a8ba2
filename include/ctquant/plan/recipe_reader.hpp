// Reading an llm-compressor recipe file (recipe.hpp says what a recipe is,
// and resolves what is read here with the command line).
//
// parse_recipe() reads the YAML (yaml-cpp) into a RecipeSpec, each value with
// the line it came from, typed as PyYAML's safe_load types it, and refuses,
// naming the file, the line and the key, everything ctquant cannot honour:
// a stream of several documents, calibration-based and transform modifiers,
// activation quantization that is not dynamic, a kv_cache_scheme, observer
// overrides, and any key it does not know.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ctquant {

// A value read from a recipe and its 1-based line.
template <class T>
struct RecipeValue {
  T value{};
  int line = 0;
};

// What one recipe file asks for. At most one of scheme and config_groups
// (both is an error, as in llm-compressor).
struct RecipeSpec {
  std::string file;       // as given on the command line, for messages
  std::string stage;      // the stage name without `_stage` ("quant")
  std::string group;      // the modifier group without `_modifiers` ("quant")
  int modifier_line = 0;  // the QuantizationModifier key
  // A preset name, as written (compressed-tensors upper-cases it to look it up).
  std::optional<RecipeValue<std::string>> scheme;
  // A compressed-tensors QuantizationConfig `config_groups` object: NAME ->
  // {"targets": [...], "weights": {...}, "input_activations": ...,
  // "output_activations": ..., "format": ...}, or NAME -> [targets] with NAME
  // a preset. A `scheme` mapping of presets to targets is given here too, in
  // the second form. Scalars are typed as PyYAML's safe_load types them.
  std::optional<RecipeValue<nlohmann::json>> config_groups;
  std::optional<RecipeValue<std::vector<std::string>>> targets;
  std::optional<RecipeValue<std::vector<std::string>>> ignore;
  // `weight_observer: NAME` or `observer: {weights: NAME}`: the weights'
  // observer of every group (llm-compressor QuantizationMixin).
  std::optional<RecipeValue<std::string>> weight_observer;
  // The line of every value under config_groups, by dotted path
  // ("config_groups.group_0.weights.num_bits"), for messages.
  std::map<std::string, int> lines;

  // "FILE:LINE" of a dotted path (the nearest enclosing one that has a line).
  std::string where(const std::string& path) const;
};

// Reads a recipe file. Throws Error{kUsage} (exit 2) naming the file, the
// line and the key for: a file that cannot be read; invalid YAML (with the
// line and column of the parser); a document that is not a recipe (no
// `*_stage` mapping, a stage without `*_modifiers`); a key ctquant does not
// know at any level; a modifier other than QuantizationModifier (calibration
// and transform modifiers named as such); no or several QuantizationModifier;
// scheme and config_groups together; targets together with config_groups
// (llm-compressor would ignore them); a kv_cache_scheme; observer overrides;
// input or output activations that are not dynamic; a repeated key; a
// second YAML document (after '---'), which PyYAML's safe_load refuses.
RecipeSpec parse_recipe(const std::filesystem::path& path);
// The same, from text (path only names it in messages).
RecipeSpec parse_recipe_text(const std::string& text, const std::string& path);

}  // namespace ctquant
