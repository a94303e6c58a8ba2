#include "ctquant/util/text.hpp"

#include <cctype>

#include <fmt/format.h>

namespace ctquant {

std::string plural(std::size_t n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

std::string join(const std::vector<std::string>& items, std::size_t max_items,
                 std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < max_items; ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  if (items.size() > max_items) out += fmt::format(" ... and {} more", items.size() - max_items);
  return out;
}

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  if (from.empty()) return text;
  std::size_t at = 0;
  while ((at = text.find(from, at)) != std::string::npos) {
    text.replace(at, from.size(), to);
    at += to.size();
  }
  return text;
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string module_of(std::string_view tensor_name) {
  const auto dot = tensor_name.rfind('.');
  return dot == std::string_view::npos ? std::string() : std::string(tensor_name.substr(0, dot));
}

std::string last_component(std::string_view name) {
  const auto dot = name.rfind('.');
  return std::string(dot == std::string_view::npos ? name : name.substr(dot + 1));
}

}  // namespace ctquant
