#include "doc_examples.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <regex>
#include <sstream>

#include <fmt/format.h>

namespace ctquant::test::doc {

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::string rtrim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.pop_back();
  return s;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// A fence opening or closing line: optional indentation, then ``` or ~~~.
bool is_fence(const std::string& line) {
  const std::string t = trim(line);
  return starts_with(t, "```") || starts_with(t, "~~~");
}

bool is_wildcard(const std::string& line) { return trim(line) == "..."; }

const char* const kMarker = "<!-- doc-test";
const char* const kSeparator = "@@doc-test-status ";

// Options of one marker.
struct Options {
  std::vector<std::string> setup;
  std::vector<std::string> between;
  std::optional<std::string> run;
  std::optional<std::string> file;
  Show show = Show::kBoth;
  int status = 0;
};

// Parses the text between "<!-- doc-test" and "-->"; problems go to errors.
Options parse_options(const std::string& body, int line, std::vector<std::string>& errors) {
  Options options;
  for (const std::string& raw : split_lines(body)) {
    const std::string entry = trim(raw);
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    if (colon == std::string::npos) {
      errors.push_back(fmt::format("{}: marker option '{}' is not 'key: value'", line, entry));
      continue;
    }
    const std::string key = trim(entry.substr(0, colon));
    const std::string value = trim(entry.substr(colon + 1));
    if (key == "setup") {
      options.setup.push_back(value);
    } else if (key == "between") {
      options.between.push_back(value);
    } else if (key == "run") {
      options.run = value;
    } else if (key == "file") {
      options.file = value;
    } else if (key == "show") {
      if (value == "both") {
        options.show = Show::kBoth;
      } else if (value == "stdout") {
        options.show = Show::kStdout;
      } else if (value == "stderr") {
        options.show = Show::kStderr;
      } else {
        errors.push_back(
            fmt::format("{}: show: '{}' is none of stdout, stderr, both", line, value));
      }
    } else if (key == "status") {
      const bool digits = !value.empty() && value.size() <= 3 &&
                          std::all_of(value.begin(), value.end(),
                                      [](unsigned char c) { return std::isdigit(c) != 0; });
      if (digits) {
        options.status = std::stoi(value);
      } else {
        errors.push_back(fmt::format("{}: status: '{}' is not an exit status", line, value));
      }
    } else {
      errors.push_back(fmt::format(
          "{}: unknown marker option '{}' (setup, between, run, show, status, file)", line, key));
    }
  }
  return options;
}

// The commands of a session block (lines "$ ..."), each with the lines
// shown after it. `first` is the 0-based document index of body[0].
std::vector<Command> parse_session(const std::vector<std::string>& body, std::size_t first,
                                   int status) {
  std::vector<Command> commands;
  for (std::size_t i = 0; i < body.size();) {
    if (!starts_with(body[i], "$ ")) {
      commands.back().expected.push_back(body[i]);
      ++i;
      continue;
    }
    Command command;
    command.line = static_cast<int>(first + i + 1);
    command.text = body[i].substr(2);
    while (!command.text.empty() && command.text.back() == '\\' && i + 1 < body.size()) {
      ++i;
      command.text += "\n" + body[i];
    }
    ++i;
    command.compare = true;
    command.expected_at = first + i;
    commands.push_back(command);
  }
  for (std::size_t c = 0; c < commands.size(); ++c) {
    const bool shown_by_next = c + 1 < commands.size() && trim(commands[c + 1].text) == "echo $?";
    if (!shown_by_next) commands[c].status = trim(commands[c].text) == "echo $?" ? 0 : status;
  }
  return commands;
}

// The commands of a block of commands alone.
std::vector<Command> parse_commands(const std::vector<std::string>& body, std::size_t first,
                                    int status) {
  std::vector<Command> commands;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const std::string t = trim(body[i]);
    if (t.empty() || t[0] == '#') continue;
    Command command;
    command.line = static_cast<int>(first + i + 1);
    command.text = body[i];
    while (!command.text.empty() && rtrim(command.text).back() == '\\' && i + 1 < body.size()) {
      ++i;
      command.text += "\n" + body[i];
    }
    command.status = status;
    command.expected_at = first + i + 1;
    commands.push_back(command);
  }
  return commands;
}

// A duration as run times print it: "0.06 s", "12.5 s".
const std::regex& duration() {
  static const std::regex re(R"(\b\d+\.\d+ s\b)");
  return re;
}

std::string normalize_duration(const std::string& line) {
  return std::regex_replace(line, duration(), "#.## s");
}

// One step of aligning shown lines with printed ones.
enum class Op { kKeep, kReplace, kDrop, kAdd, kWildcardEnd, kWildcardTake };

struct Step {
  Op op;
  std::size_t expected = 0;  // index into expected (kKeep, kReplace, kDrop, kWildcard*)
  std::size_t actual = 0;    // index into actual (kKeep, kReplace, kAdd, kWildcardTake)
};

// Same indentation and the same first word: the line the shown one became.
bool similar(const std::string& expected, const std::string& actual) {
  const auto indent = [](const std::string& s) { return s.find_first_not_of(' '); };
  if (indent(expected) != indent(actual) || indent(expected) == std::string::npos) return false;
  const auto word = [](const std::string& s) {
    std::istringstream in(s);
    std::string w;
    in >> w;
    return w;
  };
  return word(expected) == word(actual);
}

// The cheapest alignment of the shown lines with the printed ones: a kept
// line costs 0, a printed line taken by a "..." line 1 (so that "..."
// takes no line a shown one matches), a replaced (similar) line 10, a
// dropped or added one 20.
std::vector<Step> align(const std::vector<std::string>& expected,
                        const std::vector<std::string>& actual) {
  const std::size_t n = expected.size();
  const std::size_t m = actual.size();
  constexpr int kInf = std::numeric_limits<int>::max() / 4;
  constexpr int kTake = 1;
  constexpr int kReplaceCost = 10;
  constexpr int kDropOrAdd = 20;
  // cost[i][j]: cheapest alignment of expected[i..] with actual[j..].
  std::vector<std::vector<int>> cost(n + 1, std::vector<int>(m + 1, kInf));
  for (std::size_t i = n + 1; i-- > 0;) {
    for (std::size_t j = m + 1; j-- > 0;) {
      int best = kInf;
      if (i == n) {
        best = static_cast<int>(m - j) * kDropOrAdd;
      } else if (is_wildcard(expected[i])) {
        best = cost[i + 1][j];
        if (j < m) best = std::min(best, kTake + cost[i][j + 1]);
      } else {
        best = kDropOrAdd + cost[i + 1][j];
        if (j < m) {
          best = std::min(best, kDropOrAdd + cost[i][j + 1]);
          if (line_matches(expected[i], actual[j])) {
            best = std::min(best, cost[i + 1][j + 1]);
          } else if (similar(expected[i], actual[j])) {
            best = std::min(best, kReplaceCost + cost[i + 1][j + 1]);
          }
        }
      }
      cost[i][j] = best;
    }
  }
  std::vector<Step> steps;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < n || j < m) {
    if (i == n) {
      steps.push_back({Op::kAdd, i, j++});
    } else if (is_wildcard(expected[i])) {
      if (j < m && cost[i][j] == kTake + cost[i][j + 1]) {
        steps.push_back({Op::kWildcardTake, i, j++});
      } else {
        steps.push_back({Op::kWildcardEnd, i++, j});
      }
    } else if (j < m && line_matches(expected[i], actual[j]) && cost[i][j] == cost[i + 1][j + 1]) {
      steps.push_back({Op::kKeep, i++, j++});
    } else if (j < m && !line_matches(expected[i], actual[j]) && similar(expected[i], actual[j]) &&
               cost[i][j] == kReplaceCost + cost[i + 1][j + 1]) {
      steps.push_back({Op::kReplace, i++, j++});
    } else if (cost[i][j] == kDropOrAdd + cost[i + 1][j]) {
      steps.push_back({Op::kDrop, i++, j});
    } else {
      steps.push_back({Op::kAdd, i, j++});
    }
  }
  return steps;
}

}  // namespace

Document parse_document(const std::string& text) {
  Document doc;
  const std::vector<std::string> lines = split_lines(text);
  std::vector<File> files;
  bool in_fence = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (is_fence(lines[i])) {
      in_fence = !in_fence;
      continue;
    }
    if (in_fence || !starts_with(trim(lines[i]), kMarker)) continue;
    const int marker_line = static_cast<int>(i + 1);
    // The marker's text, up to "-->" (on this line or a later one).
    std::string body = trim(lines[i]).substr(std::string(kMarker).size());
    while (body.find("-->") == std::string::npos && i + 1 < lines.size()) body += "\n" + lines[++i];
    const auto end = body.find("-->");
    if (end == std::string::npos) {
      doc.errors.push_back(fmt::format("{}: marker without '-->'", marker_line));
      break;
    }
    if (!body.empty() && body[0] != ' ' && body[0] != '\n' && body.compare(0, 3, "-->") != 0) {
      doc.errors.push_back(fmt::format("{}: marker '{}' is not '<!-- doc-test'", marker_line,
                                       trim(lines[marker_line - 1])));
      continue;
    }
    const Options options = parse_options(body.substr(0, end), marker_line, doc.errors);
    if (i + 1 >= lines.size() || !is_fence(lines[i + 1]) || trim(lines[i + 1]).size() < 3) {
      doc.errors.push_back(fmt::format(
          "{}: the marker is not followed by a fenced block on the next line", marker_line));
      continue;
    }
    // The fenced block.
    const std::size_t first = i + 2;
    std::size_t close = first;
    while (close < lines.size() && !is_fence(lines[close])) ++close;
    if (close == lines.size()) {
      doc.errors.push_back(fmt::format("{}: the fenced block is not closed", marker_line));
      break;
    }
    const std::vector<std::string> body_lines(lines.begin() + static_cast<std::ptrdiff_t>(first),
                                              lines.begin() + static_cast<std::ptrdiff_t>(close));
    i = close;  // the closing fence
    if (options.file) {
      std::string content;
      for (const std::string& l : body_lines) content += l + "\n";
      files.push_back({*options.file, content});
      continue;
    }
    Example example;
    example.line = marker_line;
    example.setup = options.setup;
    example.between = options.between;
    example.show = options.show;
    example.files = files;
    const bool session = std::any_of(body_lines.begin(), body_lines.end(),
                                     [](const std::string& l) { return starts_with(l, "$ "); });
    if (options.run) {
      if (session) {
        doc.errors.push_back(fmt::format(
            "{}: run: given for a block that shows commands ('$ ' lines)", marker_line));
        continue;
      }
      Command command;
      command.text = *options.run;
      command.line = marker_line;
      command.expected = body_lines;
      command.compare = true;
      command.expected_at = first;
      command.status = options.status;
      example.commands.push_back(command);
    } else if (session) {
      if (!starts_with(body_lines.front(), "$ ")) {
        doc.errors.push_back(
            fmt::format("{}: the session's first line is not a command ('$ ...')", marker_line));
        continue;
      }
      example.commands = parse_session(body_lines, first, options.status);
    } else {
      example.commands = parse_commands(body_lines, first, options.status);
      if (example.commands.empty()) {
        doc.errors.push_back(fmt::format("{}: the block holds no command", marker_line));
        continue;
      }
    }
    doc.examples.push_back(example);
  }
  return doc;
}

std::string normalize_line(std::string line, const std::string& workdir) {
  line = rtrim(std::move(line));
  if (workdir.empty()) return line;
  std::string out;
  std::size_t pos = 0;
  for (std::size_t hit; (hit = line.find(workdir, pos)) != std::string::npos;
       pos = hit + workdir.size()) {
    out += line.substr(pos, hit - pos) + "/data";
  }
  return out + line.substr(pos);
}

std::vector<std::string> output_lines(const std::string& printed, const std::string& workdir) {
  std::vector<std::string> lines;
  for (const std::string& line : split_lines(printed)) {
    if (starts_with(line, "ctquant: progress ")) continue;
    lines.push_back(normalize_line(line, workdir));
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

bool line_matches(const std::string& expected, const std::string& actual) {
  const std::string e = normalize_duration(rtrim(expected));
  const std::string a = normalize_duration(rtrim(actual));
  // Pieces of e between "..." must appear in a in order; the first at the
  // start, the last at the end.
  std::vector<std::string> pieces;
  std::size_t pos = 0;
  for (std::size_t hit; (hit = e.find("...", pos)) != std::string::npos; pos = hit + 3) {
    pieces.push_back(e.substr(pos, hit - pos));
  }
  pieces.push_back(e.substr(pos));
  if (pieces.size() == 1) return e == a;
  if (!starts_with(a, pieces.front())) return false;
  std::size_t at = pieces.front().size();
  for (std::size_t k = 1; k + 1 < pieces.size(); ++k) {
    const auto hit = a.find(pieces[k], at);
    if (hit == std::string::npos) return false;
    at = hit + pieces[k].size();
  }
  const std::string& last = pieces.back();
  return a.size() >= at + last.size() && a.compare(a.size() - last.size(), last.size(), last) == 0;
}

bool lines_match(const std::vector<std::string>& expected, const std::vector<std::string>& actual) {
  const std::size_t n = expected.size();
  const std::size_t m = actual.size();
  // ok[i][j]: expected[i..] matches actual[j..].
  std::vector<std::vector<char>> ok(n + 1, std::vector<char>(m + 1, 0));
  ok[n][m] = 1;
  for (std::size_t i = n; i-- > 0;) {
    for (std::size_t j = m + 1; j-- > 0;) {
      if (is_wildcard(expected[i])) {
        ok[i][j] = ok[i + 1][j] || (j < m && ok[i][j + 1]);
      } else {
        ok[i][j] = j < m && ok[i + 1][j + 1] && line_matches(expected[i], actual[j]);
      }
    }
  }
  return ok[0][0] != 0;
}

std::vector<std::string> rewrite_lines(const std::vector<std::string>& expected,
                                       const std::vector<std::string>& actual) {
  std::vector<std::string> out;
  for (const Step& step : align(expected, actual)) {
    switch (step.op) {
      case Op::kKeep:
      case Op::kWildcardEnd:
        out.push_back(expected[step.expected]);
        break;
      case Op::kReplace:
      case Op::kAdd:
        out.push_back(actual[step.actual]);
        break;
      case Op::kDrop:
      case Op::kWildcardTake:
        break;
    }
  }
  return out;
}

std::string describe_mismatch(const std::vector<std::string>& expected,
                              const std::vector<std::string>& actual) {
  std::string out = "  (' ' shown and printed, '-' shown only, '+' printed only, '~' under ...)\n";
  for (const Step& step : align(expected, actual)) {
    switch (step.op) {
      case Op::kKeep:
        out += "   " + actual[step.actual] + "\n";
        break;
      case Op::kReplace:
        out += "  -" + expected[step.expected] + "\n  +" + actual[step.actual] + "\n";
        break;
      case Op::kDrop:
        out += "  -" + expected[step.expected] + "\n";
        break;
      case Op::kAdd:
        out += "  +" + actual[step.actual] + "\n";
        break;
      case Op::kWildcardTake:
        out += "  ~" + actual[step.actual] + "\n";
        break;
      case Op::kWildcardEnd:
        break;
    }
  }
  return out;
}

std::string session_script(const Example& example) {
  // Each command in braces (not a subshell: `cd` and variables persist),
  // then its status and a separator; `$?` is restored before the next.
  const auto redirect = [&](Show show) {
    switch (show) {
      case Show::kStdout:
        return " 2>/dev/null";
      case Show::kStderr:
        return " 2>&1 >/dev/null";
      case Show::kBoth:
        break;
    }
    return " 2>&1";
  };
  std::string script = "doc_test_status=0\n";
  const auto add = [&](const std::string& command, Show show, bool first_of_block) {
    if (first_of_block) script += "(exit $doc_test_status)\n";
    script += "{ " + command + "\n}" + redirect(show) + "\n";
    script += "doc_test_status=$?\n";
    script += fmt::format("printf '\\n{}%d@@\\n' \"$doc_test_status\"\n", kSeparator);
  };
  for (const std::string& setup : example.setup) add(setup, Show::kBoth, false);
  for (std::size_t c = 0; c < example.commands.size(); ++c) {
    if (c > 0) {
      for (const std::string& between : example.between) {
        script += "{ " + between + "\n} >/dev/null 2>&1\n";
      }
    }
    add(example.commands[c].text, example.show, true);
  }
  return script;
}

std::vector<Printed> split_session_output(const std::string& printed) {
  std::vector<Printed> out;
  std::size_t pos = 0;
  const std::string separator = std::string("\n") + kSeparator;
  for (std::size_t hit; (hit = printed.find(separator, pos)) != std::string::npos;) {
    Printed p;
    p.output = printed.substr(pos, hit - pos);
    const std::size_t number = hit + separator.size();
    const std::size_t end = printed.find("@@\n", number);
    if (end == std::string::npos) break;
    p.status = std::stoi(printed.substr(number, end - number));
    out.push_back(p);
    pos = end + 3;
  }
  return out;
}

}  // namespace ctquant::test::doc
