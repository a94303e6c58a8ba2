// Escaping of text bound for a terminal.
//
// Names that ctquant prints (tensors, modules, files, config values) come from
// input files, which are not trusted: a tensor name holding ESC [ 3 1 m, BEL
// or a carriage return would drive the terminal that shows the report or the
// log. The command-line front end passes every text report it writes to
// stdout, every log line and every error message it writes to stderr through
// escape_for_terminal, once, just before writing them. JSON reports are not
// passed through it: nlohmann::json already writes every control character
// as a \uXXXX escape and refuses text that is not UTF-8.
#pragma once

#include <string>
#include <string_view>

namespace ctquant {

// text with every byte that could drive a terminal written as \xHH (two
// lowercase hex digits):
//   - the control bytes 0x00-0x1F except '\n' and '\t', and DEL (0x7F);
//   - every byte that is not part of a well-formed UTF-8 sequence (RFC 3629),
//     each on its own, e.g. "\xff" or a truncated sequence.
// Everything else is kept as it is: printable ASCII, '\n' (multi-line reports
// keep their lines), '\t', and well-formed multi-byte UTF-8 ("é" stays "é";
// so do the C1 controls U+0080-U+009F, which are well-formed UTF-8 too).
// A backslash is kept too, so "\x1b" in the result may also come from those
// four characters in the input.
std::string escape_for_terminal(std::string_view text);

}  // namespace ctquant
