// docs/ARCHITECTURE.md names only files and functions that exist: every
// inline code span outside fenced blocks that is a path of the repository
// (src/..., include/..., tests/..., tools/..., an area-relative header such
// as `exec/parts.hpp`, or a bare `name.cpp`) names an existing file; every
// span that looks like a function or type (`name()`, a name with `_` or
// `::` or CamelCase in prose, any identifier in a table outside its "rule"
// column, which quotes the reference library) is an identifier of the code
// under include/ or src/ (comments left out; the CMake targets of
// CMakeLists.txt count; the Tests section may also name test helpers); and
// "`f` in `file`" means f is in that file. (The lint rules are checked
// against docs/cli.md, their prose home, by tests/test_lint.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;

fs::path source_dir() { return CTQUANT_SOURCE_DIR; }

// ---- Markdown ----

// One inline code span of the document.
struct Span {
  std::string text;
  int line = 0;
  std::string section;  // the last "## " heading above it
  std::string column;   // its table column's header, "" outside tables
  std::string before;   // the text between the previous span of its line (or cell) and it
};

// Cells of a table row "| a | b |", split at pipes not escaped as "\|".
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::string cell;
  for (std::size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '|' && row[i - 1] != '\\') {
      out.push_back(cell);
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(' ');
  const auto e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

void add_spans(const std::string& text, int line, const std::string& section,
               const std::string& column, std::vector<Span>& out) {
  std::size_t pos = 0;
  std::size_t last_end = 0;
  while ((pos = text.find('`', pos)) != std::string::npos) {
    const std::size_t end = text.find('`', pos + 1);
    if (end == std::string::npos) break;
    out.push_back({text.substr(pos + 1, end - pos - 1), line, section, column,
                   text.substr(last_end, pos - last_end)});
    last_end = end + 1;
    pos = end + 1;
  }
}

// Every inline code span outside ``` fences, with its section and column.
std::vector<Span> code_spans(const std::string& markdown) {
  std::vector<Span> out;
  std::istringstream in(markdown);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  bool fenced = false;
  std::string section;
  std::vector<std::string> header;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const int number = static_cast<int>(i) + 1;
    if (l.rfind("```", 0) == 0) {
      fenced = !fenced;
      continue;
    }
    if (fenced) continue;
    if (l.rfind("## ", 0) == 0) section = l.substr(3);
    if (l.rfind("|", 0) != 0) {
      header.clear();
      add_spans(l, number, section, "", out);
      continue;
    }
    if (l.rfind("|---", 0) == 0) continue;
    const std::vector<std::string> row = cells(l);
    if (i + 1 < lines.size() && lines[i + 1].rfind("|---", 0) == 0) {
      header.clear();
      for (const std::string& c : row) header.push_back(trim(c));
    }
    for (std::size_t c = 0; c < row.size(); ++c) {
      add_spans(row[c], number, section, c < header.size() ? header[c] : "", out);
    }
  }
  return out;
}

// "src/exec/write_queue.{hpp,cpp}" -> both paths.
std::vector<std::string> expand_braces(const std::string& path) {
  const auto open = path.find('{');
  const auto close = path.find('}');
  if (open == std::string::npos || close == std::string::npos || close < open) return {path};
  std::vector<std::string> out;
  std::istringstream alternatives(path.substr(open + 1, close - open - 1));
  std::string a;
  while (std::getline(alternatives, a, ',')) {
    out.push_back(path.substr(0, open) + a + path.substr(close + 1));
  }
  return out;
}

// ---- The source tree ----

bool is_source_file(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".hpp" || ext == ".cpp" || ext == ".h";
}

// C++ text without its comments (string literals kept: suffixes such as
// "weight_packed" and names such as "lm_head" live in them).
std::string strip_comments(const std::string& code) {
  std::string out;
  out.reserve(code.size());
  for (std::size_t i = 0; i < code.size(); ++i) {
    if (code.compare(i, 2, "//") == 0) {
      while (i < code.size() && code[i] != '\n') ++i;
      out += '\n';
    } else if (code.compare(i, 2, "/*") == 0) {
      const std::size_t end = code.find("*/", i + 2);
      i = end == std::string::npos ? code.size() : end + 1;
      out += ' ';
    } else if (code.compare(i, 2, "R\"") == 0) {
      const std::size_t paren = code.find('(', i);
      const std::string close = ")" + code.substr(i + 2, paren - i - 2) + "\"";
      const std::size_t end = code.find(close, paren);
      const std::size_t stop = end == std::string::npos ? code.size() : end + close.size();
      out.append(code, i, stop - i);
      i = stop - 1;
    } else if (code[i] == '"' || code[i] == '\'') {
      const char quote = code[i];
      out += code[i++];
      while (i < code.size() && code[i] != quote) {
        if (code[i] == '\\' && i + 1 < code.size()) out += code[i++];
        out += code[i++];
      }
      if (i < code.size()) out += code[i];
    } else {
      out += code[i];
    }
  }
  return out;
}

std::set<std::string> identifiers_of(const std::string& text) {
  static const std::regex word(R"([A-Za-z_][A-Za-z0-9_]*)");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator();
       ++it) {
    out.insert(it->str());
  }
  return out;
}

struct SourceTree {
  std::vector<fs::path> files;                // relative to the root
  std::set<std::string> areas;                // the folders of src/
  std::set<std::string> product_identifiers;  // include/, src/, CMakeLists.txt
  std::set<std::string> test_identifiers;     // tests/, tools/
  std::map<std::string, std::set<std::string>> identifiers_by_file;
};

const SourceTree& tree() {
  static const SourceTree t = [] {
    SourceTree out;
    const fs::path root = source_dir();
    for (const char* top : {"include", "src", "tests", "tools"}) {
      for (const auto& e : fs::recursive_directory_iterator(root / top)) {
        if (!e.is_regular_file()) continue;
        const fs::path rel = fs::relative(e.path(), root);
        out.files.push_back(rel);
        if (!is_source_file(rel)) continue;
        std::set<std::string> ids = identifiers_of(strip_comments(read_file(e.path())));
        const bool product = std::string(top) == "include" || std::string(top) == "src";
        (product ? out.product_identifiers : out.test_identifiers).insert(ids.begin(), ids.end());
        out.identifiers_by_file[rel.generic_string()] = std::move(ids);
      }
    }
    const std::set<std::string> cmake = identifiers_of(read_file(root / "CMakeLists.txt"));
    out.product_identifiers.insert(cmake.begin(), cmake.end());
    for (const auto& e : fs::directory_iterator(root / "src")) {
      if (e.is_directory()) out.areas.insert(e.path().filename().string());
    }
    return out;
  }();
  return t;
}

// The files of the repository a span names, or nullopt when the span is
// not a path of it (a URL, a file of the output, a placeholder): an empty
// list then means a path that names nothing.
std::optional<std::vector<std::string>> files_named(const std::string& span) {
  static const std::regex path_like(R"(^[A-Za-z0-9_./{},+-]+$)");
  if (!std::regex_match(span, path_like) || span.front() == '.' || span.front() == '-') {
    return std::nullopt;
  }
  const SourceTree& t = tree();
  const fs::path root = source_dir();
  std::vector<std::string> found;
  const auto slash = span.find('/');
  const std::string first = span.substr(0, slash);
  static const std::set<std::string> kTops = {"src",  "include", "tests", "tools",
                                              "docs", "cmake",   ".ci"};
  for (const std::string& p : expand_braces(span)) {
    if (slash != std::string::npos && kTops.count(first) != 0) {
      if (fs::exists(root / p)) found.push_back(p);
    } else if (slash != std::string::npos && t.areas.count(first) != 0) {
      // An area-relative header or file, or a module (no extension).
      for (const std::string& candidate : {"include/ctquant/" + p, "src/" + p,
                                           "include/ctquant/" + p + ".hpp", "src/" + p + ".cpp"}) {
        if (fs::exists(root / candidate)) found.push_back(candidate);
      }
    } else if (slash == std::string::npos &&
               (p.size() > 4 && (p.ends_with(".hpp") || p.ends_with(".cpp")))) {
      for (const fs::path& f : t.files) {
        if (f.filename() == p) found.push_back(f.generic_string());
      }
    } else {
      return std::nullopt;
    }
  }
  return found;
}

bool is_identifier(const std::string& span) {
  static const std::regex id(R"(^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$)");
  return std::regex_match(span, id);
}

std::vector<std::string> components(std::string span) {
  if (span.ends_with("()")) span.resize(span.size() - 2);
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t next = span.find("::", pos);
    out.push_back(span.substr(pos, next - pos));
    if (next == std::string::npos) break;
    pos = next + 2;
  }
  return out;
}

// Whether the document presents the span as a name of the code.
bool names_code(const Span& s) {
  if (!is_identifier(s.text)) return false;
  if (!s.column.empty()) return s.column != "rule";  // the spec's words, not ours
  const bool camel =
      std::any_of(s.text.begin() + 1, s.text.end(),
                  [](char c) { return std::isupper(static_cast<unsigned char>(c)) != 0; }) &&
      std::any_of(s.text.begin(), s.text.end(),
                  [](char c) { return std::islower(static_cast<unsigned char>(c)) != 0; });
  return s.text.ends_with("()") || s.text.find('_') != std::string::npos ||
         s.text.find("::") != std::string::npos || camel;
}

std::vector<Span> architecture_spans() {
  return code_spans(read_file(source_dir() / "docs" / "ARCHITECTURE.md"));
}

// ---- The tests ----

TEST(ArchitectureDocParser, FindsSpansOutsideFencesWithTheirSectionAndColumn) {
  const std::vector<Span> spans = code_spans(
      "## Data\n"
      "Calls `make_plan()` then `run_lint`.\n"
      "```\n"
      "`fenced_name`\n"
      "```\n"
      "| header | role |\n"
      "|---|---|\n"
      "| `util/error.hpp` | `Error` with max \\|w\\| and `exit_status()` |\n");
  ASSERT_EQ(spans.size(), 5u);
  EXPECT_EQ(spans[0].text, "make_plan()");
  EXPECT_EQ(spans[0].section, "Data");
  EXPECT_EQ(spans[0].column, "");
  EXPECT_EQ(spans[1].text, "run_lint");
  EXPECT_EQ(spans[1].before, " then ");
  EXPECT_EQ(spans[2].text, "util/error.hpp");
  EXPECT_EQ(spans[2].column, "header");
  EXPECT_EQ(spans[2].line, 8);
  EXPECT_EQ(spans[4].text, "exit_status()");
  EXPECT_EQ(spans[4].column, "role");
  EXPECT_EQ(expand_braces("src/exec/write_queue.{hpp,cpp}"),
            (std::vector<std::string>{"src/exec/write_queue.hpp", "src/exec/write_queue.cpp"}));
  EXPECT_EQ(strip_comments("int a; // b_c\nconst char* s = \"//d_e\"; /* f */"),
            "int a; \nconst char* s = \"//d_e\";  ");
}

TEST(ArchitectureDoc, EveryPathItNamesExists) {
  std::vector<std::string> missing;
  std::size_t checked = 0;
  for (const Span& s : architecture_spans()) {
    const auto files = files_named(s.text);
    if (!files) continue;
    ++checked;
    const std::size_t expected = expand_braces(s.text).size();
    if (files->size() < expected) missing.push_back(fmt::format("line {}: `{}`", s.line, s.text));
  }
  EXPECT_GT(checked, 50u);
  EXPECT_TRUE(missing.empty()) << "docs/ARCHITECTURE.md names files that do not exist:\n"
                               << fmt::format("{}", fmt::join(missing, "\n"));
}

TEST(ArchitectureDoc, EveryFunctionItNamesExists) {
  const SourceTree& t = tree();
  std::vector<std::string> missing;
  std::size_t checked = 0;
  for (const Span& s : architecture_spans()) {
    if (!names_code(s)) continue;
    ++checked;
    for (const std::string& c : components(s.text)) {
      const bool found = t.product_identifiers.count(c) != 0 ||
                         (s.section == "Tests" && t.test_identifiers.count(c) != 0);
      if (!found) {
        missing.push_back(fmt::format("line {}: `{}` ({})", s.line, s.text, s.section));
        break;
      }
    }
  }
  EXPECT_GT(checked, 150u);
  EXPECT_TRUE(missing.empty()) << "docs/ARCHITECTURE.md names what the code does not define:\n"
                               << fmt::format("{}", fmt::join(missing, "\n"));
}

// "`a`, `b` and `c` in `file.cpp`": each of a, b, c is in that file.
TEST(ArchitectureDoc, EveryFunctionNamedInAFileIsInThatFile) {
  const SourceTree& t = tree();
  const std::vector<Span> spans = architecture_spans();
  std::vector<std::string> wrong;
  std::size_t checked = 0;
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].before != " in ") continue;
    const auto files = files_named(spans[i].text);
    if (!files || files->empty()) continue;
    for (std::size_t j = i; j-- > 0;) {
      const Span& name = spans[j];
      if (name.line != spans[i].line || !is_identifier(name.text)) break;
      ++checked;
      const std::string id = components(name.text).back();
      const bool found = std::any_of(files->begin(), files->end(), [&](const std::string& f) {
        const auto it = t.identifiers_by_file.find(f);
        return it != t.identifiers_by_file.end() && it->second.count(id) != 0;
      });
      if (!found) {
        wrong.push_back(
            fmt::format("line {}: `{}` is not in `{}`", name.line, name.text, spans[i].text));
      }
      const std::string& sep = spans[j].before;
      if (sep != ", " && sep != " and " && sep != " / " && sep != ", and ") break;
    }
  }
  EXPECT_GT(checked, 10u);
  EXPECT_TRUE(wrong.empty()) << fmt::format("{}", fmt::join(wrong, "\n"));
}

}  // namespace
}  // namespace ctquant::test
