// escape_for_terminal on exact inputs, and the binary's text on stdout and
// stderr for a checkpoint whose tensor name holds terminal control bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/util/escape.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;

TEST(EscapeForTerminal, ExactInputsAndOutputs) {
  const struct {
    std::string in;
    std::string out;
  } cases[] = {
      {"", ""},
      {"model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight"},
      // Control bytes, DEL and NUL become \xHH with lowercase hex digits.
      {"\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"},
      {"bell\x07", "bell\\x07"},
      {std::string("a\0b", 3), "a\\x00b"},
      {"\r\x0b\x0c\x1f", "\\x0d\\x0b\\x0c\\x1f"},
      {"del\x7f", "del\\x7f"},
      // Newlines and tabs stay, so multi-line reports keep their layout.
      {"line 1\n\tline 2\n", "line 1\n\tline 2\n"},
      // Well-formed UTF-8 stays as it is: 2, 3 and 4-byte sequences.
      {"caf\xc3\xa9", "caf\xc3\xa9"},
      {"\xe6\x97\xa5\xe6\x9c\xac", "\xe6\x97\xa5\xe6\x9c\xac"},
      {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
      // Bytes outside well-formed UTF-8 are escaped one by one.
      {"\xff", "\\xff"},
      {"a\xff!", "a\\xff!"},
      {"\x80", "\\x80"},                             // a lone continuation byte
      {"\xc3", "\\xc3"},                             // truncated at the end
      {"\xc3(", "\\xc3("},                           // truncated by ASCII
      {"\xc0\xaf", "\\xc0\\xaf"},                    // overlong '/'
      {"\xed\xa0\x80", "\\xed\\xa0\\x80"},           // a UTF-16 surrogate
      {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},  // past U+10FFFF
      {"\xe9t\xc3\xa9", "\\xe9t\xc3\xa9"},           // Latin-1 'é', then UTF-8 'é'
      // A backslash is an ordinary character.
      {"\\x1b", "\\x1b"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(escape_for_terminal(c.in), c.out) << "input: " << testing::PrintToString(c.in);
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every run of the binary that prints the name: no raw ESC or BEL on stdout
// or stderr, and the escaped name where the text names the tensor.
void expect_escaped(const CommandResult& r, bool name_on_stdout, bool name_on_stderr) {
  for (const std::string* stream : {&r.out, &r.err}) {
    EXPECT_FALSE(contains(*stream, "\x1b")) << testing::PrintToString(*stream);
    EXPECT_FALSE(contains(*stream, "\x07")) << testing::PrintToString(*stream);
  }
  const std::string escaped = "\\x1b[31mred\\x07";
  if (name_on_stdout) {
    EXPECT_TRUE(contains(r.out, escaped)) << r.out;
  }
  if (name_on_stderr) {
    EXPECT_TRUE(contains(r.err, escaped)) << r.err;
  }
}

// inspect (tensor table), inspect --plan and quantize --dry-run (plan and
// lint findings), verify (an extra tensor), quantize (lint warnings logged
// with their fix) and a lint error stopping quantize --strict.
TEST(CliEscape, ControlCharactersInNamesAreEscapedOnEveryTextPath) {
  TempDir tmp;
  // [8, 128]: quantized, but 8 output rows are too few for Marlin (lint L5,
  // a warning that names the tensor and, in its fix, the module).
  const std::string hostile = "model.layers.0.\x1b[31mred\x07.weight";
  const std::string accented = "model.layers.0.caf\xc3\xa9.weight";
  const FakeTensor down =
      random_weight("model.layers.0.mlp.down_proj.weight", DType::kBF16, 64, 256, 2);
  write_checkpoint(tmp / "in", {random_weight(hostile, DType::kBF16, 8, 128, 1),
                                random_weight(accented, DType::kBF16, 64, 128, 3), down});
  write_checkpoint(tmp / "without", {random_weight(accented, DType::kBF16, 64, 128, 3), down});
  const std::string in = (tmp / "in").string();

  {
    SCOPED_TRACE("inspect");
    const CommandResult r = run_ctquant({"inspect", in});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    expect_escaped(r, true, false);
    EXPECT_TRUE(contains(r.out, "model.layers.0.caf\xc3\xa9.weight")) << r.out;
  }
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"inspect", in, "--plan"},
        std::vector<std::string>{"quantize", in, (tmp / "dry").string(), "--dry-run"}}) {
    SCOPED_TRACE(args[0] + " " + args[2]);
    const CommandResult r = run_ctquant(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    expect_escaped(r, true, false);
  }
  {
    SCOPED_TRACE("verify");
    const CommandResult r = run_ctquant({"verify", in, (tmp / "without").string()});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    expect_escaped(r, true, false);
  }
  {
    SCOPED_TRACE("quantize");
    const CommandResult r = run_ctquant({"quantize", in, (tmp / "out").string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    expect_escaped(r, false, true);
    EXPECT_TRUE(contains(r.err, "ctquant: warning: L5: ")) << r.err;
    EXPECT_TRUE(contains(r.err, "\n  fix: keep it in 16 bits: --ignore '")) << r.err;
  }
  {
    SCOPED_TRACE("quantize --strict");
    const CommandResult r = run_ctquant({"quantize", in, (tmp / "strict").string(), "--strict"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    expect_escaped(r, false, true);
    EXPECT_TRUE(contains(r.err, "ctquant: error: lint stopped quantize")) << r.err;
    EXPECT_FALSE(fs::exists(tmp / "strict"));
  }
  {
    // JSON reports write control characters as \u escapes of their own.
    SCOPED_TRACE("inspect --json");
    const CommandResult r = run_ctquant({"inspect", in, "--plan", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(contains(r.out, "\x1b"));
    EXPECT_FALSE(contains(r.out, "\x07"));
    EXPECT_TRUE(contains(r.out, "\\u001b[31mred\\u0007")) << r.out;
    EXPECT_TRUE(contains(r.out, "model.layers.0.caf\xc3\xa9.weight")) << r.out;
  }
}

}  // namespace
}  // namespace ctquant::test
