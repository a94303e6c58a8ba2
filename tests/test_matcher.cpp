// Ignore and targets entries (matcher.hpp), section 2 of the format spec:
// `re:PATTERN` matches like Python's re.match (anchored at the start, not at
// the end), anything else only the identical module name. The expected
// results are what Python's `re.match(PATTERN, name) is not None` gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ctquant/format/matcher.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant {
namespace {

bool ignores(const std::string& entry, const std::string& module) {
  const ModuleMatcher m({entry}, ModuleMatcher::Role::kIgnore);
  return m.entry_matches(0, module);
}

// The Error a matcher with these entries throws (fails the test if none).
Error compile_error(const std::vector<std::string>& entries) {
  try {
    ModuleMatcher m(entries, ModuleMatcher::Role::kIgnore);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error for the entries";
  return Error(ErrorKind::kIo, "");
}

TEST(ModuleMatcher, LiteralMatchesOnlyTheIdenticalName) {
  EXPECT_TRUE(ignores("lm_head", "lm_head"));
  EXPECT_FALSE(ignores("lm_head", "model.lm_head"));
  EXPECT_FALSE(ignores("lm_head", "lm_head_x"));
  EXPECT_FALSE(ignores("lm_head", "LM_HEAD"));
  // Regex characters in a literal are literal.
  EXPECT_TRUE(ignores("layers.0.mlp", "layers.0.mlp"));
  EXPECT_FALSE(ignores("layers.0.mlp", "layersX0Xmlp"));
  EXPECT_FALSE(ignores(".*", "model.layers.0.mlp"));
  EXPECT_TRUE(ignores(".*", ".*"));
  EXPECT_FALSE(ModuleMatcher({"lm_head"}, ModuleMatcher::Role::kIgnore).is_regex(0));
  EXPECT_TRUE(ModuleMatcher({"re:lm_head"}, ModuleMatcher::Role::kIgnore).is_regex(0));
}

TEST(ModuleMatcher, RegexIsAnchoredAtTheStartOnly) {
  // re.match: start-anchored ...
  EXPECT_FALSE(ignores("re:qkv_proj", "layers.0.self_attn.qkv_proj"));
  EXPECT_TRUE(ignores("re:layers", "layers.0.self_attn.qkv_proj"));
  // ... but not end-anchored: a prefix match is a match.
  EXPECT_TRUE(ignores("re:.*qkv_proj", "a.qkv_proj_x"));
  EXPECT_TRUE(ignores("re:.*qkv_proj", "layers.3.self_attn.qkv_proj"));
  // `$` anchors the end.
  EXPECT_FALSE(ignores("re:.*qkv_proj$", "a.qkv_proj_x"));
  EXPECT_TRUE(ignores("re:.*qkv_proj$", "layers.3.self_attn.qkv_proj"));
  EXPECT_FALSE(ignores("re:lm_head$", "lm_head_x"));
  EXPECT_TRUE(ignores("re:lm_head", "lm_head_x"));
}

TEST(ModuleMatcher, Alternation) {
  const std::string entry = "re:.*(q|k)_proj$";
  EXPECT_TRUE(ignores(entry, "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(ignores(entry, "model.layers.0.self_attn.k_proj"));
  EXPECT_FALSE(ignores(entry, "model.layers.0.self_attn.v_proj"));
  EXPECT_FALSE(ignores(entry, "model.layers.0.self_attn.q_proj_a"));
  // Alternation binds loosest: "re:a|b" is (a)|(b), each start-anchored.
  EXPECT_TRUE(ignores("re:lm_head|model\\.embed", "model.embed_tokens"));
  EXPECT_FALSE(ignores("re:lm_head|model\\.embed", "x.model.embed_tokens"));
}

TEST(ModuleMatcher, PythonNamedGroupsAndBackreference) {
  const std::string entry = "re:(?P<part>[a-z]+)\\.(?P=part)$";
  EXPECT_TRUE(ignores(entry, "mlp.mlp"));
  EXPECT_FALSE(ignores(entry, "mlp.attn"));
  EXPECT_TRUE(ignores("re:(?P<layer>layers\\.\\d+)\\.mlp", "layers.7.mlp.up_proj"));
}

TEST(ModuleMatcher, InlineCaseInsensitiveFlag) {
  EXPECT_TRUE(ignores("re:(?i).*QKV_PROJ$", "layers.0.self_attn.qkv_proj"));
  EXPECT_FALSE(ignores("re:.*QKV_PROJ$", "layers.0.self_attn.qkv_proj"));
}

TEST(ModuleMatcher, Lookbehind) {
  const std::string entry = "re:.*(?<=mlp\\.)gate_proj$";
  EXPECT_TRUE(ignores(entry, "model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(ignores(entry, "model.layers.0.attn.gate_proj"));
  // A lookbehind at the very start sees nothing before it, as in Python.
  EXPECT_FALSE(ignores("re:(?<=mlp\\.)gate_proj", "mlp.gate_proj"));
  // Negative lookbehind.
  EXPECT_TRUE(ignores("re:.*(?<!mlp\\.)gate_proj$", "model.layers.0.attn.gate_proj"));
  EXPECT_FALSE(ignores("re:.*(?<!mlp\\.)gate_proj$", "model.layers.0.mlp.gate_proj"));
}

TEST(ModuleMatcher, DigitClass) {
  EXPECT_TRUE(ignores("re:model\\.layers\\.\\d+\\.mlp", "model.layers.12.mlp.down_proj"));
  EXPECT_FALSE(ignores("re:model\\.layers\\.\\d+\\.mlp", "model.layers.x.mlp.down_proj"));
  EXPECT_TRUE(ignores("re:model\\.layers\\.(0|1)\\.", "model.layers.1.mlp"));
  EXPECT_FALSE(ignores("re:model\\.layers\\.(0|1)\\.", "model.layers.10.mlp"));
}

// Python's `\Z` is the end of the string; `$` also matches before a final
// newline (in Python as in PCRE2).
TEST(ModuleMatcher, BackslashZIsEndOfString) {
  EXPECT_TRUE(ignores("re:.*proj\\Z", "layers.0.proj"));
  EXPECT_FALSE(ignores("re:.*proj\\Z", "layers.0.proj_x"));
  EXPECT_FALSE(ignores("re:.*proj\\Z", "layers.0.proj\n"));
  EXPECT_TRUE(ignores("re:.*proj$", "layers.0.proj\n"));
  // An escaped backslash followed by Z is a literal backslash and a Z.
  EXPECT_TRUE(ignores("re:a\\\\Z", "a\\Z"));
  EXPECT_FALSE(ignores("re:a\\\\Z", "a"));
}

TEST(ModuleMatcher, FirstMatchReturnsTheEarliestEntry) {
  const ModuleMatcher m({"lm_head", "re:.*proj$", "re:.*q_proj$"}, ModuleMatcher::Role::kIgnore);
  EXPECT_EQ(m.first_match("lm_head"), 0u);
  EXPECT_EQ(m.first_match("layers.0.q_proj"), 1u);
  EXPECT_EQ(m.first_match("layers.0.fc"), std::nullopt);
  EXPECT_TRUE(m.entry_matches(2, "layers.0.q_proj"));
}

TEST(ModuleMatcher, TargetLinearMatchesEveryModule) {
  const ModuleMatcher targets({"Linear"}, ModuleMatcher::Role::kTargets);
  for (const char* module : {"model.layers.0.mlp.down_proj", "lm_head", "fc", "Linear", "x"}) {
    EXPECT_EQ(targets.first_match(module), 0u) << module;
  }
  // As an ignore entry, "Linear" is an ordinary literal.
  EXPECT_FALSE(ignores("Linear", "model.layers.0.mlp.down_proj"));
  EXPECT_TRUE(ignores("Linear", "Linear"));
  // Other target entries are literal or re: as usual.
  const ModuleMatcher only_mlp({"re:.*mlp\\."}, ModuleMatcher::Role::kTargets);
  EXPECT_TRUE(only_mlp.first_match("layers.0.mlp.up_proj").has_value());
  EXPECT_FALSE(only_mlp.first_match("layers.0.self_attn.q_proj").has_value());
}

TEST(ModuleMatcher, InvalidPatternIsUsageErrorNamingTheEntry) {
  const Error e = compile_error({"lm_head", "re:(unclosed"});
  EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  const std::string message = e.what();
  EXPECT_NE(message.find("--ignore 're:(unclosed'"), std::string::npos) << message;
  EXPECT_NE(message.find("invalid regular expression"), std::string::npos) << message;
  EXPECT_EQ(message.find("lm_head"), std::string::npos) << message;
}

// Entries are written into config.json, which is UTF-8 JSON: a byte that is
// not UTF-8 is a usage error naming the entry (escaped) and the byte, for
// literal and `re:` entries alike.
TEST(ModuleMatcher, EntryThatIsNotUtf8IsUsageError) {
  const Error e = compile_error({"lm_head\xff", "re:.*q_proj$", "re:.*\xc3("});
  EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  const std::string message = e.what();
  EXPECT_NE(message.find("--ignore 'lm_head\\xff': not valid UTF-8 (byte 7)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--ignore 're:.*\\xc3(': not valid UTF-8 (byte 5)"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("q_proj"), std::string::npos) << message;
}

TEST(ModuleMatcher, EveryInvalidEntryIsReportedAtOnce) {
  const Error e = compile_error({"re:[a-", "re:.*ok$", "re:(?P<1bad>x)", "", "re:"});
  EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  const std::string message = e.what();
  EXPECT_NE(message.find("'re:[a-'"), std::string::npos) << message;
  EXPECT_NE(message.find("'re:(?P<1bad>x)'"), std::string::npos) << message;
  EXPECT_NE(message.find("entry is empty"), std::string::npos) << message;
  EXPECT_NE(message.find("'re:': empty pattern"), std::string::npos) << message;
  EXPECT_EQ(message.find("re:.*ok$"), std::string::npos) << message;
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 3) << message;
}

TEST(ModuleMatcher, TargetErrorsSayTargets) {
  try {
    ModuleMatcher m({"re:(x"}, ModuleMatcher::Role::kTargets);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("--targets 're:(x'"), std::string::npos) << e.what();
  }
}

TEST(ModuleMatcher, RegexPatternOfAnEntry) {
  EXPECT_EQ(regex_pattern("re:.*x$"), ".*x$");
  EXPECT_EQ(regex_pattern("re:"), "");
  EXPECT_EQ(regex_pattern("lm_head"), std::nullopt);
  EXPECT_EQ(regex_pattern("RE:x"), std::nullopt);
}

}  // namespace
}  // namespace ctquant
