// A validator for the subset of JSON Schema (draft 2020-12) that
// docs/report.schema.json and docs/manifest.schema.json use: type (one or a
// list), properties, required, additionalProperties (false or a schema),
// items, minItems, enum, const, minimum, pattern (ECMAScript, unanchored as
// in JSON Schema), $ref to "#/$defs/NAME", anyOf, oneOf. A keyword outside
// the subset is reported as an error, so that a schema cannot silently
// check less than it says.
#pragma once

#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ctquant::test {

class JsonSchemaValidator {
 public:
  explicit JsonSchemaValidator(nlohmann::json schema) : root_(std::move(schema)) {}

  // Every violation, as "PATH: what" (PATH a JSON pointer into the
  // instance); empty when the instance is valid.
  std::vector<std::string> validate(const nlohmann::json& instance) const {
    std::vector<std::string> errors;
    check(root_, instance, "", errors);
    return errors;
  }

 private:
  static bool has_type(const nlohmann::json& value, const std::string& type) {
    if (type == "object") return value.is_object();
    if (type == "array") return value.is_array();
    if (type == "string") return value.is_string();
    if (type == "boolean") return value.is_boolean();
    if (type == "null") return value.is_null();
    if (type == "number") return value.is_number();
    if (type == "integer") {
      return value.is_number_integer() ||
             (value.is_number_float() && value.get<double>() == static_cast<double>(
                                                                     value.get<long long>()));
    }
    return false;
  }

  const nlohmann::json& resolve(const std::string& ref, std::vector<std::string>& errors) const {
    static const nlohmann::json kEmpty = nlohmann::json::object();
    const std::string prefix = "#/$defs/";
    if (ref.rfind(prefix, 0) != 0 || !root_.contains("$defs") ||
        !root_["$defs"].contains(ref.substr(prefix.size()))) {
      errors.push_back("schema: unresolvable $ref " + ref);
      return kEmpty;
    }
    return root_["$defs"][ref.substr(prefix.size())];
  }

  void check(const nlohmann::json& schema, const nlohmann::json& value, const std::string& path,
             std::vector<std::string>& errors) const {
    static const std::set<std::string> kKnown = {
        "$schema", "$id",      "$defs",  "title",    "description", "type",
        "properties", "required", "additionalProperties", "items", "minItems", "enum",
        "const",   "minimum",  "pattern", "$ref",    "anyOf",       "oneOf",  "examples"};
    const std::string at = path.empty() ? "/" : path;
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) errors.push_back(at + ": not allowed");
      return;
    }
    for (const auto& [keyword, unused] : schema.items()) {
      if (!kKnown.contains(keyword)) errors.push_back("schema: unsupported keyword " + keyword);
    }
    if (schema.contains("$ref")) {
      check(resolve(schema["$ref"].get<std::string>(), errors), value, path, errors);
    }
    if (schema.contains("type")) {
      const nlohmann::json& type = schema["type"];
      bool ok = false;
      if (type.is_string()) {
        ok = has_type(value, type.get<std::string>());
      } else {
        for (const auto& t : type) ok = ok || has_type(value, t.get<std::string>());
      }
      if (!ok) {
        errors.push_back(at + ": expected type " + type.dump() + ", got " + value.dump());
        return;
      }
    }
    if (schema.contains("enum")) {
      bool found = false;
      for (const auto& option : schema["enum"]) found = found || option == value;
      if (!found) errors.push_back(at + ": " + value.dump() + " not in " + schema["enum"].dump());
    }
    if (schema.contains("const") && schema["const"] != value) {
      errors.push_back(at + ": expected " + schema["const"].dump() + ", got " + value.dump());
    }
    if (schema.contains("minimum") && value.is_number() &&
        value.get<double>() < schema["minimum"].get<double>()) {
      errors.push_back(at + ": " + value.dump() + " is below " + schema["minimum"].dump());
    }
    if (schema.contains("pattern") && value.is_string() &&
        !std::regex_search(value.get<std::string>(),
                           std::regex(schema["pattern"].get<std::string>()))) {
      errors.push_back(at + ": " + value.dump() + " does not match " + schema["pattern"].dump());
    }
    if (value.is_object()) {
      if (schema.contains("required")) {
        for (const auto& name : schema["required"]) {
          if (!value.contains(name.get<std::string>())) {
            errors.push_back(at + ": missing required property " + name.dump());
          }
        }
      }
      const nlohmann::json properties = schema.value("properties", nlohmann::json::object());
      for (const auto& [name, child] : value.items()) {
        if (properties.contains(name)) {
          check(properties[name], child, path + "/" + name, errors);
        } else if (schema.contains("additionalProperties")) {
          check(schema["additionalProperties"], child, path + "/" + name, errors);
        }
      }
    }
    if (value.is_array()) {
      if (schema.contains("minItems") && value.size() < schema["minItems"].get<std::size_t>()) {
        errors.push_back(at + ": fewer than " + schema["minItems"].dump() + " items");
      }
      if (schema.contains("items")) {
        for (std::size_t i = 0; i < value.size(); ++i) {
          check(schema["items"], value[i], path + "/" + std::to_string(i), errors);
        }
      }
    }
    for (const char* combinator : {"anyOf", "oneOf"}) {
      if (!schema.contains(combinator)) continue;
      std::size_t matches = 0;
      for (const auto& option : schema[combinator]) {
        std::vector<std::string> sub;
        check(option, value, path, sub);
        if (sub.empty()) ++matches;
      }
      const bool one = std::string(combinator) == "oneOf";
      if (matches == 0 || (one && matches != 1)) {
        errors.push_back(at + ": " + std::to_string(matches) + " of the " + combinator +
                         " options match " + value.dump().substr(0, 200));
      }
    }
  }

  nlohmann::json root_;
};

}  // namespace ctquant::test
