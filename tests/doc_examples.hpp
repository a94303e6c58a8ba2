// The examples of README.md and docs/*.md that run against the built tool
// (tests/test_doc_examples.cpp runs them): how a Markdown fence is marked as
// a runnable example, how its shown output is compared with what the
// commands print, and how the shown output is rewritten from the tool's
// (UPDATE_DOC_EXAMPLES=1). The format is described in docs/ARCHITECTURE.md,
// "Examples in the documentation".
//
// A marker is an HTML comment on the line right before a fence:
//
//   <!-- doc-test -->                        (no options)
//   <!-- doc-test show: stdout -->           (one option)
//   <!-- doc-test
//   setup: cp -r tests/golden/llama-bf16/input INPUT
//   status: 3
//   -->
//
// Options, one "key: value" a line: setup (repeatable: a shell command run
// before the block, which must exit 0; its output is not shown), between
// (repeatable: run between two commands of the block, unchecked), run (the
// command whose output the block shows, for a block of output only), show
// (stdout, stderr, or both, the default: both streams in the order written,
// as a terminal shows them), status (the exit status of every command whose
// status the block does not show with `$ echo $?`; default 0), file (the
// block is the content of that file, written into the working directory of
// every later example of the same document; nothing runs).
//
// The block itself is a session (lines starting with "$ " are commands, a
// trailing backslash continues one on the next line, the lines up to the
// next command are its output), or output alone (with run:), or commands
// alone (every other line a command; lines starting with '#' and empty
// lines skipped; nothing compared but the exit status).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ctquant::test::doc {

// One command of an example and what the document shows for it.
struct Command {
  std::string text;  // as the shell runs it (continuation lines joined by "\n")
  int line = 0;      // 1-based line of the document where it starts
  // The output lines shown for it, as written; compared only when `compare`.
  // A line that is "..." (spaces around allowed) stands for any number of
  // lines, "..." inside a line for any text.
  std::vector<std::string> expected;
  bool compare = false;
  // 0-based index of expected[0] among the document's lines (where the shown
  // output starts, also when it is empty), for rewriting.
  std::size_t expected_at = 0;
  std::optional<int> status;  // the exit status it must have; none when not checked
};

// A file an example block defines (option file:).
struct File {
  std::string name;
  std::string content;
};

enum class Show { kBoth, kStdout, kStderr };

// One marked fence.
struct Example {
  int line = 0;  // 1-based line of the marker
  std::vector<std::string> setup;
  std::vector<std::string> between;
  Show show = Show::kBoth;
  std::vector<Command> commands;
  std::vector<File> files;  // files defined by earlier blocks of the document
};

struct Document {
  std::vector<Example> examples;
  // Malformed markers, as "LINE: problem" (an unknown option, a marker not
  // followed by a fence, a session whose output comes before any command, ...).
  std::vector<std::string> errors;
};

// Parses the marked fences of a Markdown text.
Document parse_document(const std::string& text);

// A printed line as it is compared and rewritten: trailing spaces dropped,
// and `workdir` (the example's working directory, absolute, when not empty)
// printed as /data.
std::string normalize_line(std::string line, const std::string& workdir = "");

// The printed output as lines to compare: normalize_line on each, progress
// lines ("ctquant: progress ...", which a terminal's bar redraws and
// erases) dropped, trailing empty lines dropped.
std::vector<std::string> output_lines(const std::string& printed, const std::string& workdir = "");

// Whether one shown line matches one printed line: "..." inside it matches
// any text, and a duration ("<digits>.<digits> s": run times vary) any
// other duration; trailing spaces do not count.
bool line_matches(const std::string& expected, const std::string& actual);

// Whether the shown lines match the printed ones ("..." lines match any
// number of lines).
bool lines_match(const std::vector<std::string>& expected, const std::vector<std::string>& actual);

// The shown lines rewritten to the printed ones with the least change: "..."
// lines are kept, each shown line that still matches is kept as written,
// a changed line (same indentation and first word) is replaced by the
// printed one, other shown lines are dropped and printed lines no "..."
// covers are added.
std::vector<std::string> rewrite_lines(const std::vector<std::string>& expected,
                                       const std::vector<std::string>& actual);

// A readable account of how the shown lines differ from the printed ones:
// both, with the first line that differs marked.
std::string describe_mismatch(const std::vector<std::string>& expected,
                              const std::vector<std::string>& actual);

// The output of each command of a session run with separators (see
// session_script), with its exit status.
struct Printed {
  std::string output;
  int status = 0;
};

// A shell script that runs the commands one after the other in one shell
// (so `cd`, variables and `echo $?` work as in a terminal), printing after
// each a separator line with its exit status, stdout and stderr merged or
// one of them dropped as `show` says. `between` runs between commands.
std::string session_script(const Example& example);

// Splits what session_script printed into each command's output and status.
// Fewer entries than commands when the shell stopped early.
std::vector<Printed> split_session_output(const std::string& printed);

}  // namespace ctquant::test::doc
