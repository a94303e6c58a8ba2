// What a module's dotted path says, for role analysis (src/model/roles.cpp)
// and its ignore entries (src/model/ignore_entries.cpp): its components, its
// layer template, the MoE layer of an expert tensor, the tower or projector
// it is part of. Private to the model module.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ctquant/model/roles.hpp"

namespace ctquant::detail {

// "a.b.c" -> {"a", "b", "c"}.
std::vector<std::string> split_dots(std::string_view name);

// parts[from, to) joined with dots.
std::string join_dots(const std::vector<std::string>& parts, std::size_t from = 0,
                      std::size_t to = std::string::npos);

// Whether s is a non-empty run of decimal digits.
bool is_digits(std::string_view s);

// A name with its numeric components replaced by "#" ("layers.#.mlp"): the
// template modules of every layer share.
std::string numbered_template(std::string_view name);

// Components by path: the first path component naming a tower or
// projector; its prefix (through that component) is the tower's root.
struct ComponentAt {
  Component component = Component::kLanguage;
  std::string root;  // "model.vision_tower" ("" for the language model)
};

ComponentAt component_of(const std::string& module, const ModelDims& dims, const FamilyRow* family);

// The checkpoint module name a 3-D expert tensor belongs to: its path through
// the last `experts` component.
std::string moe_layer_of(const std::string& name);

}  // namespace ctquant::detail
