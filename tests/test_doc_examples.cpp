// The examples of README.md and docs/*.md marked `<!-- doc-test ... -->`
// (format: tests/doc_examples.hpp, docs/ARCHITECTURE.md "Examples in the
// documentation") run against the built ctquant, each in a fresh working
// directory that holds the repository's fixtures as tests/golden and
// tests/recipes; what they print is compared with what the document shows.
// UPDATE_DOC_EXAMPLES=1 rewrites the shown output of every example that
// differs from what the tool printed (for review with git diff).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "doc_examples.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;
using doc::Command;
using doc::Example;
using doc::Printed;

fs::path repo_root() { return fs::path(CTQUANT_DOCS_DIR).parent_path(); }

// README.md and docs/*.md, relative to the repository root, that hold a
// marker (an example, or a marker too malformed to make one).
std::vector<std::string> marked_documents() {
  std::vector<std::string> names{"README.md"};
  std::vector<std::string> docs;
  for (const auto& entry : fs::directory_iterator(CTQUANT_DOCS_DIR)) {
    if (entry.path().extension() == ".md")
      docs.push_back("docs/" + entry.path().filename().string());
  }
  std::sort(docs.begin(), docs.end());
  names.insert(names.end(), docs.begin(), docs.end());
  std::vector<std::string> marked;
  for (const std::string& name : names) {
    const doc::Document parsed = doc::parse_document(read_file(repo_root() / name));
    if (!parsed.examples.empty() || !parsed.errors.empty()) marked.push_back(name);
  }
  return marked;
}

bool update_mode() {
  const char* value = std::getenv("UPDATE_DOC_EXAMPLES");
  return value != nullptr && std::string(value) == "1";
}

std::string indent(const std::string& text) {
  std::string out;
  for (const std::string& line : doc::output_lines(text)) out += "    " + line + "\n";
  return out;
}

// A shown output to replace: lines [at, at + count) of the document.
struct Rewrite {
  std::size_t at = 0;
  std::size_t count = 0;
  std::vector<std::string> lines;
};

// Runs one example; adds a failure per difference, and the rewrites of the
// shown outputs that differ.
void run_example(const std::string& document, const Example& example,
                 std::vector<Rewrite>& rewrites) {
  const TempDir work;
  fs::create_directories(work / "tests");
  fs::create_directory_symlink(golden_dir(), work / "tests" / "golden");
  fs::create_directory_symlink(CTQUANT_RECIPES_DIR, work / "tests" / "recipes");
  for (const doc::File& file : example.files) write_file(work / file.name, file.content);
  const TempDir bin;  // `ctquant` on PATH, outside the working directory
  const std::string prelude = fmt::format(
      "ln -s \"$CTQUANT\" '{0}/ctquant' && PATH='{0}':\"$PATH\" && export PATH || exit 99\n",
      bin.path().string());
  RunOptions options;
  options.cwd = work.path();
  const CommandResult result = run_shell(prelude + doc::session_script(example), options);
  const std::vector<Printed> printed = doc::split_session_output(result.out);
  const std::string where = fmt::format("{}:{}", document, example.line);
  const std::string workdir = fs::canonical(work.path()).string();

  for (std::size_t s = 0; s < example.setup.size(); ++s) {
    if (s >= printed.size()) {
      ADD_FAILURE() << where << ": the shell stopped before setup '" << example.setup[s] << "':\n"
                    << result.out << result.err;
      return;
    }
    if (printed[s].status != 0) {
      ADD_FAILURE() << where << ": setup '" << example.setup[s] << "' exited " << printed[s].status
                    << ":\n"
                    << indent(printed[s].output);
      return;
    }
  }
  for (std::size_t c = 0; c < example.commands.size(); ++c) {
    const Command& command = example.commands[c];
    const std::size_t index = example.setup.size() + c;
    const std::string at = fmt::format("{}:{}: `{}`", document, command.line, command.text);
    if (index >= printed.size()) {
      ADD_FAILURE() << at << ": the shell stopped before it:\n" << result.out << result.err;
      return;
    }
    const Printed& p = printed[index];
    if (command.status && p.status != *command.status) {
      ADD_FAILURE() << at << ": exit status " << p.status << ", the document expects "
                    << *command.status << "; it printed:\n"
                    << indent(p.output);
    }
    if (!command.compare) continue;
    const std::vector<std::string> actual = doc::output_lines(p.output, workdir);
    if (doc::lines_match(command.expected, actual)) continue;
    if (update_mode()) {
      rewrites.push_back({command.expected_at, command.expected.size(),
                          doc::rewrite_lines(command.expected, actual)});
      std::cout << at << ": shown output rewritten from what the tool printed\n";
    } else {
      ADD_FAILURE() << at << ": the output differs from the document (UPDATE_DOC_EXAMPLES=1 "
                    << "rewrites the document from the tool's output):\n"
                    << doc::describe_mismatch(command.expected, actual);
    }
  }
}

// Replaces shown outputs, the last first so that earlier indices hold.
void apply_rewrites(const fs::path& path, std::vector<Rewrite> rewrites) {
  std::vector<std::string> lines;
  {
    const std::string text = read_file(path);
    std::size_t pos = 0;
    for (std::size_t nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      lines.push_back(text.substr(pos, nl - pos));
    }
    if (pos < text.size()) lines.push_back(text.substr(pos));
  }
  std::sort(rewrites.begin(), rewrites.end(),
            [](const Rewrite& a, const Rewrite& b) { return a.at > b.at; });
  for (const Rewrite& r : rewrites) {
    const auto first = lines.begin() + static_cast<std::ptrdiff_t>(r.at);
    lines.erase(first, first + static_cast<std::ptrdiff_t>(r.count));
    lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(r.at), r.lines.begin(), r.lines.end());
  }
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  write_file(path, text);
}

class DocExamples : public ::testing::TestWithParam<std::string> {};

TEST_P(DocExamples, PrintWhatTheDocumentShows) {
  const std::string& document = GetParam();
  const fs::path path = repo_root() / document;
  const doc::Document parsed = doc::parse_document(read_file(path));
  for (const std::string& error : parsed.errors) ADD_FAILURE() << document << ":" << error;
  std::vector<Rewrite> rewrites;
  for (const Example& example : parsed.examples) run_example(document, example, rewrites);
  if (!rewrites.empty()) apply_rewrites(path, rewrites);
}

std::string test_name(const std::string& document) {
  std::string name;
  for (char c : document) name += std::isalnum(static_cast<unsigned char>(c)) != 0 ? c : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Documents, DocExamples, ::testing::ValuesIn(marked_documents()),
                         [](const auto& param) { return test_name(param.param); });

// ---- tables ----

// The first line (1-based) of each run of table rows (lines outside fences
// that start and end with '|') whose second line is not the delimiter row ("|---|...");
// such rows render as the text of a paragraph, not as a table (a paragraph
// placed between two rows of one table leaves the rows after it so).
std::vector<int> rows_outside_a_table(const std::string& text) {
  static const std::regex delimiter(R"(^\|( *:?-+:? *\|)+ *$)");
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  // A row starts and ends with '|' (a wrapped "|w|) ..." in prose does not).
  const auto is_row = [&](std::size_t i) {
    const std::string& l = lines[i];
    const auto end = l.find_last_not_of(' ');
    return l.rfind("|", 0) == 0 && end != std::string::npos && end > 0 && l[end] == '|';
  };
  std::vector<int> out;
  bool in_fence = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("```", 0) == 0) in_fence = !in_fence;
    if (in_fence || !is_row(i)) continue;
    if (i + 1 >= lines.size() || !std::regex_match(lines[i + 1], delimiter)) {
      out.push_back(static_cast<int>(i + 1));
    }
    while (i + 1 < lines.size() && is_row(i + 1)) ++i;
  }
  return out;
}

TEST(DocMarkdown, EveryTableRowIsInATable) {
  const std::string split =
      "| option | meaning |\n|---|---|\n| `--a` | a |\n\nA paragraph.\n| `--b` | b |\n";
  EXPECT_EQ(rows_outside_a_table(split), std::vector<int>{6});
  EXPECT_EQ(rows_outside_a_table("text\n\n| `--b` | b |\n| `--c` | c |\n"), std::vector<int>{3});
  EXPECT_TRUE(rows_outside_a_table("| a | b |\n| :-- | --: |\n| 1 | 2 |\n").empty());
  EXPECT_TRUE(rows_outside_a_table("the max\n|w|, wrapped.\n").empty());
  std::vector<std::string> documents{"README.md"};
  for (const auto& entry : fs::directory_iterator(CTQUANT_DOCS_DIR)) {
    if (entry.path().extension() == ".md") {
      documents.push_back("docs/" + entry.path().filename().string());
    }
  }
  for (const std::string& document : documents) {
    for (int line : rows_outside_a_table(read_file(repo_root() / document))) {
      ADD_FAILURE() << document << ":" << line
                    << ": table rows without a header and delimiter row above them (a paragraph "
                       "between two rows of a table?)";
    }
  }
}

// ---- the format on small texts ----

TEST(DocExampleFormat, SessionCommandsTheirOutputAndStatus) {
  const doc::Document parsed = doc::parse_document(
      "text\n"
      "<!-- doc-test\n"
      "setup: touch a\n"
      "status: 3\n"
      "-->\n"
      "```\n"
      "$ ctquant verify out \\\n"
      "    golden\n"
      "line 1\n"
      "line 2\n"
      "$ echo $?\n"
      "3\n"
      "$ ctquant quantize in out -q\n"
      "```\n");
  ASSERT_TRUE(parsed.errors.empty()) << parsed.errors.front();
  ASSERT_EQ(parsed.examples.size(), 1u);
  const Example& e = parsed.examples[0];
  EXPECT_EQ(e.line, 2);
  EXPECT_EQ(e.setup, std::vector<std::string>{"touch a"});
  ASSERT_EQ(e.commands.size(), 3u);
  EXPECT_EQ(e.commands[0].text, "ctquant verify out \\\n    golden");
  EXPECT_EQ(e.commands[0].line, 7);
  EXPECT_EQ(e.commands[0].expected, (std::vector<std::string>{"line 1", "line 2"}));
  EXPECT_EQ(e.commands[0].expected_at, 8u);
  EXPECT_FALSE(e.commands[0].status.has_value());  // shown by `echo $?`
  EXPECT_EQ(e.commands[1].expected, std::vector<std::string>{"3"});
  EXPECT_EQ(e.commands[1].status, 0);
  EXPECT_TRUE(e.commands[2].expected.empty());  // prints nothing
  EXPECT_TRUE(e.commands[2].compare);
  EXPECT_EQ(e.commands[2].status, 3);
}

TEST(DocExampleFormat, OutputBlockFileBlockAndCommandBlock) {
  const doc::Document parsed = doc::parse_document(
      "<!-- doc-test file: r.yaml -->\n"
      "```yaml\n"
      "a: 1\n"
      "```\n"
      "<!-- doc-test run: ctquant inspect in\n"
      "show: stderr -->\n"
      "```\n"
      "ctquant: done\n"
      "```\n"
      "<!-- doc-test -->\n"
      "```sh\n"
      "# a comment\n"
      "ctquant quantize IN OUT   # quantize\n"
      "\n"
      "ctquant verify OUT \\\n"
      "  --manifest\n"
      "```\n");
  ASSERT_TRUE(parsed.errors.empty()) << parsed.errors.front();
  ASSERT_EQ(parsed.examples.size(), 2u);
  const Example& run = parsed.examples[0];
  EXPECT_EQ(run.show, doc::Show::kStderr);
  ASSERT_EQ(run.files.size(), 1u);
  EXPECT_EQ(run.files[0].name, "r.yaml");
  EXPECT_EQ(run.files[0].content, "a: 1\n");
  ASSERT_EQ(run.commands.size(), 1u);
  EXPECT_EQ(run.commands[0].text, "ctquant inspect in");
  EXPECT_EQ(run.commands[0].expected, std::vector<std::string>{"ctquant: done"});
  EXPECT_EQ(run.commands[0].expected_at, 7u);
  const Example& commands = parsed.examples[1];
  ASSERT_EQ(commands.commands.size(), 2u);
  EXPECT_EQ(commands.commands[0].text, "ctquant quantize IN OUT   # quantize");
  EXPECT_EQ(commands.commands[1].text, "ctquant verify OUT \\\n  --manifest");
  EXPECT_FALSE(commands.commands[1].compare);
  EXPECT_EQ(commands.commands[1].status, 0);
}

TEST(DocExampleFormat, MalformedMarkersAreNamed) {
  const doc::Document parsed = doc::parse_document(
      "<!-- doc-test colour: red -->\n"
      "```\n$ true\n```\n"
      "<!-- doc-test status: x -->\n"
      "```\n$ true\n```\n"
      "<!-- doc-tests -->\n"
      "<!-- doc-test -->\n"
      "\n"
      "```\n$ true\n```\n"
      "<!-- doc-test run: true -->\n"
      "```\n$ true\n```\n"
      "<!-- doc-test -->\n"
      "```\nshown output\n$ true\n```\n");
  const std::vector<std::string> expected{
      "1: unknown marker option 'colour' (setup, between, run, show, status, file)",
      "5: status: 'x' is not an exit status",
      "9: marker '<!-- doc-tests -->' is not '<!-- doc-test'",
      "10: the marker is not followed by a fenced block on the next line",
      "15: run: given for a block that shows commands ('$ ' lines)",
      "19: the session's first line is not a command ('$ ...')"};
  EXPECT_EQ(parsed.errors, expected);
}

TEST(DocExampleFormat, WildcardsDurationsProgressAndWorkdir) {
  EXPECT_TRUE(doc::lines_match({"a", "...", "z"}, {"a", "b", "c", "z"}));
  EXPECT_TRUE(doc::lines_match({"a", "...", "z"}, {"a", "z"}));
  EXPECT_TRUE(doc::lines_match({"  ..."}, {}));
  EXPECT_FALSE(doc::lines_match({"a", "...", "z"}, {"a", "b"}));
  EXPECT_FALSE(doc::lines_match({"a"}, {"a", "b"}));
  EXPECT_TRUE(doc::line_matches("tensors: fc.weight, ...", "tensors: fc.weight, layers.0.x"));
  EXPECT_TRUE(
      doc::line_matches("kernels (...) cannot run", "kernels (Marlin, Machete) cannot run"));
  EXPECT_FALSE(doc::line_matches("kernels (...) cannot run", "kernels (Marlin) can run"));
  EXPECT_TRUE(doc::line_matches("ratio 2.67x; 0.02 s", "ratio 2.67x; 13.40 s"));
  EXPECT_FALSE(doc::line_matches("ratio 2.67x; 0.02 s", "ratio 2.68x; 0.02 s"));
  EXPECT_FALSE(doc::line_matches("2 shards", "3 shards"));
  EXPECT_EQ(doc::output_lines("ctquant: info: x\nctquant: progress 100.0%  1 MiB\n"
                              "from /tmp/w/.out.ctquant-parts  \n\n\n",
                              "/tmp/w"),
            (std::vector<std::string>{"ctquant: info: x", "from /data/.out.ctquant-parts"}));
}

TEST(DocExampleFormat, RewriteKeepsWildcardsAndUnchangedLines) {
  // A line that changed is replaced, one that vanished is dropped, a new
  // one is added; "..." and lines that still match (durations aside) stay.
  const std::vector<std::string> expected{"plan: W4A16",      "  copy  a", "...",
                                          "output: 2 shards", "gone",      "done; 0.02 s"};
  const std::vector<std::string> actual{"plan: W4A16 (pack-quantized)",
                                        "  copy  a",
                                        "  copy  b",
                                        "  copy  c",
                                        "output: 2 shards",
                                        "new",
                                        "done; 0.07 s"};
  EXPECT_EQ(doc::rewrite_lines(expected, actual),
            (std::vector<std::string>{"plan: W4A16 (pack-quantized)", "  copy  a", "...",
                                      "output: 2 shards", "new", "done; 0.02 s"}));
  EXPECT_TRUE(doc::lines_match(doc::rewrite_lines(expected, actual), actual));
  EXPECT_EQ(doc::rewrite_lines({"a", "b"}, {"a", "b"}), (std::vector<std::string>{"a", "b"}));
}

TEST(DocExampleFormat, SessionScriptKeepsShellStateAndStatuses) {
  Example example;
  example.setup = {"x=5"};
  example.between = {"false"};
  for (const char* text : {"cd /; echo \"$x\"", "pwd; false", "echo $?", "printf 'no newline'"}) {
    Command command;
    command.text = text;
    example.commands.push_back(command);
  }
  const CommandResult result = run_shell(doc::session_script(example));
  const std::vector<Printed> printed = doc::split_session_output(result.out);
  ASSERT_EQ(printed.size(), 5u) << result.out;
  EXPECT_EQ(printed[0].output, "");
  EXPECT_EQ(printed[1].output, "5\n");
  EXPECT_EQ(printed[2].output, "/\n");
  EXPECT_EQ(printed[2].status, 1);
  EXPECT_EQ(printed[3].output, "1\n");  // `$?` survives the separator and `between`
  EXPECT_EQ(printed[4].output, "no newline");
}

}  // namespace
}  // namespace ctquant::test
