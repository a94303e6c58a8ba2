// The layer order of the library's areas (docs/ARCHITECTURE.md, "Layers"):
// a file of an area includes headers of its own area and of the areas
// below it, never one above. Checked on every #include of src/ and
// include/ctquant/, public ("ctquant/<area>/...") and private
// ("<area>/...", a header of src/).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace ctquant {
namespace {

namespace fs = std::filesystem;

fs::path source_dir() { return CTQUANT_SOURCE_DIR; }

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The areas of the "## Layers" section's fenced block, one a line (its
// first word), top first; returned lowest first.
std::vector<std::string> documented_layers(const std::string& markdown) {
  std::istringstream in(markdown);
  std::string line;
  bool section = false;
  bool fenced = false;
  std::vector<std::string> layers;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      if (section && !layers.empty()) break;
      section = line == "## Layers";
      continue;
    }
    if (!section) continue;
    if (line.rfind("```", 0) == 0) {
      if (fenced) break;
      fenced = true;
      continue;
    }
    if (!fenced) continue;
    std::istringstream words(line);
    std::string area;
    if (words >> area) layers.push_back(area);
  }
  std::reverse(layers.begin(), layers.end());
  return layers;
}

// One include that reaches up.
struct Violation {
  std::string file;  // relative to the repository
  int line = 0;
  std::string include;  // as written
  std::string area;     // of the file
  std::string target;   // the area it includes
};

// The includes of `text` (the file `file` of area `area`) that name an area
// above `area` in `layers` (lowest first). Includes of anything else
// (system headers, tests' helpers) are not looked at.
std::vector<Violation> upward_includes(const std::string& file, const std::string& area,
                                       const std::string& text,
                                       const std::vector<std::string>& layers) {
  static const std::regex include(R"(^\s*#\s*include\s+"(?:ctquant/)?([A-Za-z0-9_]+)/[^"]*")");
  const auto rank = [&](const std::string& a) {
    return std::find(layers.begin(), layers.end(), a) - layers.begin();
  };
  std::vector<Violation> out;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::smatch m;
    if (!std::regex_search(line, m, include)) continue;
    const std::string target = m[1];
    if (rank(target) == static_cast<std::ptrdiff_t>(layers.size())) continue;  // not an area
    if (rank(target) > rank(area)) {
      const auto open = line.find('"');
      out.push_back({file, number, line.substr(open, line.rfind('"') - open + 1), area, target});
    }
  }
  return out;
}

// Every source file of the library with its area: src/<area>/... and
// include/ctquant/<area>/....
std::vector<std::pair<fs::path, std::string>> library_files() {
  std::vector<std::pair<fs::path, std::string>> out;
  for (const fs::path& top : {fs::path("src"), fs::path("include") / "ctquant"}) {
    for (const auto& e : fs::recursive_directory_iterator(source_dir() / top)) {
      if (!e.is_regular_file()) continue;
      const fs::path rel = fs::relative(e.path(), source_dir() / top);
      out.emplace_back(top / rel, rel.begin()->string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string>& layers() {
  static const std::vector<std::string> l =
      documented_layers(read_text(source_dir() / "docs" / "ARCHITECTURE.md"));
  return l;
}

TEST(Layers, ArchitectureDocListsTheOrder) {
  ASSERT_FALSE(layers().empty()) << "docs/ARCHITECTURE.md has no \"## Layers\" block";
  EXPECT_EQ(layers().front(), "util");
  EXPECT_EQ(layers().back(), "cli");
  const std::set<std::string> unique(layers().begin(), layers().end());
  EXPECT_EQ(unique.size(), layers().size()) << "an area is listed twice";
}

TEST(Layers, EveryAreaHasALayer) {
  std::set<std::string> missing;
  for (const auto& [file, area] : library_files()) {
    if (std::find(layers().begin(), layers().end(), area) == layers().end()) {
      missing.insert(fmt::format("{} (area {})", file.string(), area));
    }
  }
  EXPECT_TRUE(missing.empty()) << "areas missing from docs/ARCHITECTURE.md \"## Layers\":\n"
                               << fmt::format("{}", fmt::join(missing, "\n"));
}

TEST(Layers, NoIncludeReachesUp) {
  std::vector<std::string> found;
  for (const auto& [file, area] : library_files()) {
    for (const Violation& v :
         upward_includes(file.string(), area, read_text(source_dir() / file), layers())) {
      found.push_back(fmt::format("{}:{}: includes {}: {} is above {}", v.file, v.line, v.include,
                                  v.target, v.area));
    }
  }
  EXPECT_TRUE(found.empty()) << "includes of a higher layer (docs/ARCHITECTURE.md, Layers):\n"
                             << fmt::format("{}", fmt::join(found, "\n"));
}

// The checker itself, on text of its own: an include of a higher area is
// named with its file, line and include; the file's own area, lower areas,
// system headers and folders that are no area are not.
TEST(Layers, CheckerNamesFileLineAndInclude) {
  const std::vector<std::string> order = {"util", "format", "plan", "exec", "job"};
  const std::string text =
      "#include \"ctquant/exec/parts.hpp\"\n"
      "#include <vector>\n"
      "#include \"ctquant/util/error.hpp\"\n"
      "#include \"exec/write_queue.hpp\"\n"
      "#include \"ctquant/job/quantize.hpp\"\n"
      "#  include \"job/private.hpp\"\n"
      "#include \"golden_support.hpp\"\n"
      "#include \"ctquant/other/x.hpp\"\n";
  const std::vector<Violation> v = upward_includes("src/exec/x.cpp", "exec", text, order);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].file, "src/exec/x.cpp");
  EXPECT_EQ(v[0].line, 5);
  EXPECT_EQ(v[0].include, "\"ctquant/job/quantize.hpp\"");
  EXPECT_EQ(v[0].target, "job");
  EXPECT_EQ(v[1].line, 6);
  EXPECT_EQ(v[1].include, "\"job/private.hpp\"");
  EXPECT_TRUE(upward_includes("src/job/x.cpp", "job", text, order).empty());
  EXPECT_EQ(upward_includes("src/util/x.cpp", "util", text, order).size(), 4u);
}

TEST(Layers, DocumentedLayersAreReadTopFirst) {
  const std::string markdown =
      "# Doc\n\n## Layers\n\nText.\n\n```\ncli      the executable\njob\n\nutil     "
      "errors\n```\n\n## Next\n```\nnot\n```\n";
  EXPECT_EQ(documented_layers(markdown), (std::vector<std::string>{"util", "job", "cli"}));
}

}  // namespace
}  // namespace ctquant
