#include "ctquant/exec/path_policy.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "ctquant/exec/output_dir.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/source/hf_cache.hpp"
#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;

namespace {

// The parties of a rule.
enum class Role { kInput, kCwd, kOutput, kStage, kReport, kRecipe };

// How two paths may overlap.
enum Relation : unsigned { kEqual = 1, kInside = 2, kContains = 4 };
constexpr unsigned kAnyOverlap = kEqual | kInside | kContains;

// One rule: `written` may not stand in `relations` to `other`; `why`
// completes the message.
struct PathRule {
  Role written;
  Role other;
  unsigned relations;
  const char* why;
};

// The table. Every path ctquant writes, renames or removes is a `written`
// role; INPUT and the current working directory are only ever `other`.
constexpr PathRule kPathRules[] = {
    {Role::kOutput, Role::kInput, kAnyOverlap,
     "ctquant never writes, renames or removes anything in INPUT: choose a new directory outside "
     "it"},
    {Role::kStage, Role::kInput, kAnyOverlap,
     "parts rename their files into the staging directory and finalize removes them: choose a "
     "directory outside INPUT"},
    {Role::kReport, Role::kInput, kAnyOverlap,
     "ctquant never writes anything in INPUT: choose a file outside it"},
    {Role::kRecipe, Role::kInput, kAnyOverlap,
     "ctquant never writes anything in INPUT: choose a file outside it"},
    {Role::kOutput, Role::kCwd, kEqual | kContains,
     "ctquant never replaces it: choose another OUTPUT, or run ctquant from a directory outside "
     "it"},
    {Role::kStage, Role::kCwd, kEqual | kContains,
     "finalize removes the staging directory: choose another, or run ctquant from a directory "
     "outside it"},
    {Role::kStage, Role::kOutput, kAnyOverlap,
     "OUTPUT is renamed into place whole and the staging directory removed after it: give them "
     "separate directories"},
    {Role::kReport, Role::kOutput, kAnyOverlap,
     "OUTPUT holds only the checkpoint and its manifest: choose a file outside it"},
    {Role::kRecipe, Role::kOutput, kAnyOverlap,
     "OUTPUT holds only the checkpoint and its manifest: choose a file outside it"},
    {Role::kReport, Role::kStage, kAnyOverlap,
     "the staging directory holds only the parts' files: choose a file outside it"},
    {Role::kRecipe, Role::kStage, kAnyOverlap,
     "the staging directory holds only the parts' files: choose a file outside it"},
    {Role::kRecipe, Role::kReport, kAnyOverlap, "give the two files separate paths"},
};

// A path of the run with the two forms it is compared in.
struct Party {
  std::string label;     // "OUTPUT", "--stage", "the INPUT", ...
  std::string article;   // "the " before the label after "is", or ""
  std::string shown;     // the path as the user gave it (or as resolved, for INPUT)
  fs::path entry;        // the directory entry: parent resolved, own name kept
  fs::path resolved;     // what it resolves to
};

// p made absolute and lexically normal, a trailing separator dropped.
fs::path absolute_lexical(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec).lexically_normal();
  if (ec) abs = p.lexically_normal();
  if (!abs.has_filename() && abs.has_parent_path() && abs != abs.root_path()) {
    abs = abs.parent_path();
  }
  return abs;
}

fs::path resolved_form(const fs::path& p) {
  std::error_code ec;
  const fs::path abs = absolute_lexical(p);
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec) return abs;
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

fs::path entry_form(const fs::path& p) {
  const fs::path abs = absolute_lexical(p);
  if (abs == abs.root_path() || !abs.has_parent_path()) return abs;
  return resolved_form(abs.parent_path()) / abs.filename();
}

Party party(std::string label, std::string article, const fs::path& p, std::string shown) {
  return Party{std::move(label), std::move(article), std::move(shown), entry_form(p),
               resolved_form(p)};
}

// The relation of a to b (one of Relation), or 0 when they do not overlap.
unsigned relation(const fs::path& a, const fs::path& b) {
  if (a == b) return kEqual;
  if (detail::path_is_within(a, b)) return kInside;
  if (detail::path_is_within(b, a)) return kContains;
  return 0;
}

unsigned relation(const Party& a, const Party& b) {
  for (const fs::path& x : {a.entry, a.resolved}) {
    for (const fs::path& y : {b.entry, b.resolved}) {
      if (const unsigned r = relation(x, y); r != 0) return r;
    }
  }
  return 0;
}

Error overlap_error(const Party& w, unsigned r, const Party& o, const char* why) {
  const char* verb = r == kEqual ? "is" : r == kInside ? "lies inside" : "contains";
  return usage_error(fmt::format("{} {} {} {}{} {}; {}", w.label, w.shown, verb,
                                 r == kEqual ? o.article : "", o.label, o.shown, why));
}

// The entry of dir that comes first in name order, or "".
std::string first_entry(const fs::path& dir, std::error_code& ec) {
  std::string first;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (first.empty() || name < first) first = name;
  }
  return first;
}

// A --report or --write-recipe FILE: written through a temporary sibling
// renamed over it, so it must be (or become) a regular file in a directory
// ctquant may write in.
// A directory named as one is said so first, before the rules (a `--report
// .` would otherwise be refused as the directory that contains OUTPUT).
void refuse_directory_side_file(const std::string& option, const fs::path& file) {
  std::error_code ec;
  if (!fs::is_directory(fs::status(file, ec))) return;
  throw usage_error(fmt::format(
      "{} {}: is a directory; give the path of a file to write, e.g. {} {}", option, file.string(),
      option, (file / (option == "--report" ? "report.json" : "recipe.yaml")).string()));
}

void check_side_file(const std::string& option, const fs::path& file) {
  std::error_code ec;
  const auto status = fs::status(file, ec);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    throw usage_error(fmt::format(
        "{} {}: exists and is not a regular file; ctquant writes {} through a temporary file "
        "renamed into place, which would replace it (use --json to print the report on stdout)",
        option, file.string(), option == "--report" ? "the report" : "the recipe"));
  }
  const fs::path parent = absolute_lexical(file).parent_path();
  if (!fs::is_directory(parent, ec)) {
    throw usage_error(fmt::format("{} {}: the directory {} that should hold it does not exist",
                                  option, file.string(), parent.string()));
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    throw usage_error(fmt::format("{} {}: cannot write in {} ({})", option, file.string(),
                                  parent.string(), std::strerror(errno)));
  }
}

}  // namespace

std::string stage_refusal(const fs::path& stage) {
  std::error_code ec;
  const auto status = fs::status(stage, ec);
  if (!fs::exists(status)) return "";
  if (!fs::is_directory(status)) return "is not a directory";
  // Listed before the marker is looked for: parts started together make
  // the marker before any other entry (run_part), so whatever the listing
  // found is either the user's (and no marker appears) or came after a
  // marker that the check below then finds. Looked for first, a marker made
  // between the two steps would be listed as a foreign entry.
  const std::string first = first_entry(stage, ec);
  if (ec) return fmt::format("cannot be listed ({})", ec.message());
  if (first.empty()) return "";
  if (fs::is_regular_file(fs::symlink_status(stage / kStageMarkerName, ec))) return "";
  return fmt::format(
      "holds '{}' but no {} marker: it is not a staging directory ctquant made, and parts "
      "would rename their files over what it holds",
      first, kStageMarkerName);
}

void check_run_paths(const RunPaths& paths) {
  // The parties present in this run.
  std::vector<std::pair<Role, Party>> parties;
  if (!paths.input.empty()) {
    const std::string in = paths.input.string();
    parties.emplace_back(Role::kInput, party("INPUT", "the ", paths.input, in));
    std::error_code ec;
    if (fs::is_regular_file(paths.input, ec)) {
      // A single-file INPUT is read with the config.json beside it.
      const fs::path config = absolute_lexical(paths.input).parent_path() / kConfigFileName;
      parties.emplace_back(Role::kInput,
                           party("INPUT's config.json", "", config, config.string()));
    } else if (const auto blobs = hf_snapshot_blob_store(resolved_form(paths.input))) {
      parties.emplace_back(Role::kInput, party("the blob store of INPUT", "", *blobs,
                                               blobs->string()));
    }
  }
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) {
    const std::string shown = resolved_form(cwd).string();
    parties.emplace_back(Role::kCwd, party("the current working directory", "", cwd, shown));
  }
  parties.emplace_back(Role::kOutput, party("OUTPUT", "", paths.output, paths.output.string()));
  if (paths.stage) {
    parties.emplace_back(Role::kStage, party(paths.stage_named ? "--stage" : "the staging directory",
                                             "", *paths.stage, paths.stage->string()));
  }
  if (paths.report) {
    parties.emplace_back(Role::kReport, party("--report", "", *paths.report,
                                              paths.report->string()));
  }
  if (paths.recipe) {
    parties.emplace_back(Role::kRecipe, party("--write-recipe", "", *paths.recipe,
                                              paths.recipe->string()));
  }

  if (paths.report) refuse_directory_side_file("--report", *paths.report);
  if (paths.recipe) refuse_directory_side_file("--write-recipe", *paths.recipe);
  for (const PathRule& rule : kPathRules) {
    for (const auto& [wrole, w] : parties) {
      if (wrole != rule.written) continue;
      for (const auto& [orole, o] : parties) {
        if (orole != rule.other) continue;
        const unsigned r = relation(w, o);
        if ((r & rule.relations) != 0) throw overlap_error(w, r, o, rule.why);
      }
    }
  }

  // The state of each path.
  if (paths.creates_output) check_output_parent(paths.output);
  check_output_replaceable(paths.output, paths.force);
  if (paths.stage) {
    const std::string label = paths.stage_named ? "--stage" : "the staging directory";
    if (!fs::exists(*paths.stage, ec)) {
      const fs::path parent = absolute_lexical(*paths.stage).parent_path();
      if (!fs::is_directory(parent, ec)) {
        throw usage_error(fmt::format("{} {}: the directory {} that should hold it does not exist",
                                      label, paths.stage->string(), parent.string()));
      }
    }
    if (const std::string why = stage_refusal(*paths.stage); !why.empty()) {
      throw usage_error(fmt::format(
          "{} {}: it {}; a staging directory must be absent, empty, or one ctquant made: choose "
          "another",
          label, paths.stage->string(), why));
    }
  }
  if (paths.report) check_side_file("--report", *paths.report);
  if (paths.recipe) check_side_file("--write-recipe", *paths.recipe);
}

}  // namespace ctquant
