// Where a run may write: one check of every path ctquant writes, renames or
// removes, made before INPUT is read (docs/security.md, "Output safety").
//
// A run writes OUTPUT (through a temporary sibling `.<OUTPUT
// name>.ctquant-tmp-*`, renamed into place), a staging directory (--part,
// --resume and finalize; its work directories live inside it), and the
// side files --report and --write-recipe (each through a temporary sibling,
// renamed into place). check_run_paths() holds them against one table of
// rules (kPathRules in src/exec/path_policy.cpp):
//
//   - none is INPUT, lies inside it or contains it (for a single-file INPUT:
//     the file and the config.json beside it; for a Hugging Face cache
//     snapshot: its blob store too);
//   - none is another, lies inside another or contains another;
//   - neither OUTPUT nor the stage is the current working directory or
//     contains it (replacing or removing it would leave the shell in a
//     deleted directory);
//
// and checks the state of each:
//
//   - OUTPUT: its parent exists; it does not exist, or --force is given and
//     it is a directory --force may replace (check_output_replaceable);
//   - the stage: absent (its parent exists), empty, or a staging directory
//     ctquant made (it holds kStageMarkerName); anything else may hold the
//     user's own files, which a part would rename over;
//   - --report, --write-recipe: not a directory and not a special file
//     (a device or FIFO would be replaced by the rename), in a directory that
//     exists and that ctquant may write in.
//
// The temporary siblings follow from these rules: OUTPUT's lies in OUTPUT's
// parent, which is INPUT or inside it only when OUTPUT is inside INPUT.
// Each path is compared twice, as the directory entry the rename replaces
// (its parent with symbolic links resolved, then its own name) and as what
// it resolves to, against both forms of the other path; any overlap is
// refused. A violation is Error{kUsage} (exit 2) naming both paths.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace ctquant {

// The file that marks a staging directory as one ctquant made: written by
// the first part (or --resume run) that uses an absent or empty directory.
inline constexpr const char* kStageMarkerName = ".ctquant-stage";

// The paths of one run. Unset optional paths (and an empty input) are not
// part of the run and take part in no rule.
struct RunPaths {
  // What the run reads: INPUT resolved (a checkpoint directory or a
  // .safetensors file). Empty for the first check of finalize, which learns
  // INPUT from the parts' records.
  std::filesystem::path input;
  // OUTPUT as the user gave it (messages quote it).
  std::filesystem::path output;
  // The run creates OUTPUT (false for a --part run, which writes only the
  // stage: OUTPUT's parent need not exist yet).
  bool creates_output = true;
  bool force = false;  // an existing OUTPUT may be replaced (if it qualifies)
  // The staging directory of --part, --resume or finalize.
  std::optional<std::filesystem::path> stage;
  bool stage_named = true;  // given as --stage (false: the default beside OUTPUT)
  std::optional<std::filesystem::path> report;  // --report FILE
  std::optional<std::filesystem::path> recipe;  // --write-recipe FILE
};

// Applies every rule above. Reads no file: it only looks at paths (stat,
// the listing of an existing OUTPUT under --force and of an existing stage).
// Throws Error{kUsage} naming the path and the one it collides with, or
// the state that is wrong.
void check_run_paths(const RunPaths& paths);

// Why `stage` may not be used as a staging directory (completing "it ...":
// "holds 'config.json', which ctquant did not write"), or "" when it may:
// absent, an empty directory, or one holding kStageMarkerName.
std::string stage_refusal(const std::filesystem::path& stage);

}  // namespace ctquant
