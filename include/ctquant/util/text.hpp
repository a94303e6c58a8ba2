// Small text helpers shared by messages, reports and name matching.
// None of them throws except std::bad_alloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ctquant {

// "N word" with an "s" added unless N is 1: plural(1, "file") is "1 file",
// plural(3, "file") is "3 files".
std::string plural(std::size_t n, std::string_view word);

// The first max_items items separated by `separator`, followed by
// " ... and K more" when K items were left out.
std::string join(const std::vector<std::string>& items, std::size_t max_items,
                 std::string_view separator = ", ");

// Every occurrence of `from` in text replaced by `to`, left to right and not
// rescanning what was inserted (Python's str.replace); text unchanged when
// `from` is empty.
std::string replace_all(std::string text, std::string_view from, std::string_view to);

// text with the ASCII letters a-z upper-cased (std::toupper in the "C"
// locale); other bytes unchanged.
std::string upper(std::string_view text);

// The module a tensor belongs to: the name up to its last dot ("" when it
// has no dot).
std::string module_of(std::string_view tensor_name);

// The last dot-separated component of a name ("q_proj" of
// "model.layers.0.self_attn.q_proj"; the whole name when it has no dot).
std::string last_component(std::string_view name);

// A byte count for people, in binary units: "512 B", "963.3 KiB",
// "880.0 MiB", "2.08 GiB".
std::string human_bytes(std::uint64_t bytes);

// A whole number with its thousands grouped by commas: "1,234,567".
std::string grouped_digits(std::uint64_t n);

// A duration for people, rounded to the second: "4 s", "2 min 05 s",
// "1 h 03 min".
std::string duration_text(double seconds);

// A path as one word of a POSIX shell command: as it is when it holds only
// letters, digits and /._-+=:,@%, else in single quotes (a quote inside
// written '\'').
std::string shell_word(std::string_view path);

}  // namespace ctquant
