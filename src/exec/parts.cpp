#include "ctquant/exec/parts.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/exec/output_dir.hpp"
#include "ctquant/exec/path_policy.hpp"
#include "ctquant/format/config.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "ctquant/util/sha256.hpp"
#include "ctquant/util/version.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Version of the record and log formats; part of every fingerprint.
constexpr int kRecordFormat = 1;
// Problems listed by finalize before "... and N more".
constexpr std::size_t kMaxProblemsListed = 40;

// ---- names in the stage ----

std::string part_stem(const PartSpec& part) {
  return fmt::format("part-{:05d}-of-{:05d}", part.index, part.count);
}
std::string record_name(const PartSpec& part) { return part_stem(part) + ".json"; }
std::string log_name(const PartSpec& part) { return part_stem(part) + ".log"; }
std::string lock_name(const PartSpec& part) { return fmt::format(".{}.lock", part_stem(part)); }
std::string work_name(const PartSpec& part) { return fmt::format(".{}.work", part_stem(part)); }

// The part a record or log file name stands for ("part-00002-of-00003.json"
// with suffix ".json"), or nullopt.
std::optional<PartSpec> part_of_file_name(const std::string& name, std::string_view suffix) {
  if (!name.starts_with("part-") || !name.ends_with(suffix)) return std::nullopt;
  const std::string middle = name.substr(5, name.size() - 5 - suffix.size());
  const std::size_t of = middle.find("-of-");
  if (of == std::string::npos) return std::nullopt;
  try {
    const PartSpec part = parse_part(middle.substr(0, of) + "/" + middle.substr(of + 4));
    if (part_stem(part) + std::string(suffix) != name) return std::nullopt;  // e.g. not zero-padded
    return part;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// ---- small file operations ----

// Writes text to path in one step (StagedFile): a reader sees the old
// content or the new, whole.
void write_file_atomically(const fs::path& path, const std::string& text, bool fsync) {
  StagedFile file(path, text, fsync, path.string());
  file.commit();
}

json read_json(const fs::path& path) {
  return detail::read_json_file(path, path.filename().string());
}

// An exclusive lock on a part (flock on its lock file in the stage), held
// while the part runs and while finalize assembles it.
class PartLock {
 public:
  // Takes the lock; false when another process holds it.
  bool try_lock(const fs::path& path) {
    fd_ = detail::UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (fd_.get() < 0) {
      throw io_error(fmt::format("{}: cannot open the lock file: {}", path.string(),
                                 std::strerror(errno)));
    }
    if (::flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) return true;
    if (errno == EWOULDBLOCK) return false;
    throw io_error(fmt::format("{}: cannot lock: {}", path.string(), std::strerror(errno)));
  }

 private:
  detail::UniqueFd fd_;
};

// ---- one file's entry in a record or a log ----

struct FileEntry {
  std::string name;
  std::uint64_t size = 0;
  std::string sha256;
  std::vector<std::string> tensors;
};

json entry_json(const FileEntry& e) {
  return json{{"name", e.name}, {"size", e.size}, {"sha256", e.sha256}, {"tensors", e.tensors}};
}

std::optional<FileEntry> entry_from_json(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("size") ||
      !j["size"].is_number_unsigned() || !j.contains("sha256") || !j["sha256"].is_string() ||
      !j.contains("tensors") || !j["tensors"].is_array()) {
    return std::nullopt;
  }
  FileEntry e{j["name"], j["size"], j["sha256"], {}};
  for (const json& t : j["tensors"]) {
    if (!t.is_string()) return std::nullopt;
    e.tensors.push_back(t);
  }
  return e;
}

// ---- records ----

struct Record {
  std::string file_name;  // in the stage
  PartSpec part;
  std::string input_path;
  json plan;  // plan_fingerprint()
  std::vector<std::string> assigned;
  std::vector<FileEntry> files;
  bool complete = false;
  std::size_t files_kept = 0;
  std::size_t files_written = 0;
};

json record_json(const Record& r) {
  json files = json::array();
  for (const FileEntry& e : r.files) files.push_back(entry_json(e));
  return json{{"ctquant_part_record", kRecordFormat},
              {"part", r.part.index},
              {"parts", r.part.count},
              {"input_path", r.input_path},
              {"plan", r.plan},
              {"assigned", r.assigned},
              {"files", files},
              {"complete", r.complete},
              {"files_kept", r.files_kept},
              {"files_written", r.files_written}};
}

Record parse_record(const json& j, const std::string& file_name);

// Parses a record; the error (Error{kBadInput}) says what is wrong with it.
Record record_from_json(const json& j, const std::string& file_name) {
  try {
    return parse_record(j, file_name);
  } catch (const json::exception& e) {
    throw bad_input(
        fmt::format("{}: not a part record ctquant can read: {}", file_name, e.what()));
  }
}

Record parse_record(const json& j, const std::string& file_name) {
  const auto fail = [&](const std::string& what) {
    return bad_input(fmt::format("{}: not a part record ctquant can read: {}", file_name, what));
  };
  if (!j.is_object() || j.value("ctquant_part_record", 0) != kRecordFormat) {
    throw fail(fmt::format("no \"ctquant_part_record\": {}", kRecordFormat));
  }
  Record r;
  r.file_name = file_name;
  if (!j.contains("part") || !j["part"].is_number_unsigned() || !j.contains("parts") ||
      !j["parts"].is_number_unsigned()) {
    throw fail("no part number");
  }
  r.part = PartSpec{j["part"].get<unsigned>(), j["parts"].get<unsigned>()};
  if (!j.contains("plan") || !j["plan"].is_object() || !j["plan"].contains("fingerprint") ||
      !j["plan"]["fingerprint"].is_string()) {
    throw fail("no plan fingerprint");
  }
  r.plan = j["plan"];
  const json& output = r.plan.value("output", json());
  if (!output.is_object() || !output.value("files", json()).is_array() ||
      !output.value("bytes", json()).is_number_unsigned() ||
      !output.value("tensors", json()).is_number_unsigned() ||
      !output.value("tensors_sha256", json()).is_string()) {
    throw fail("no output files, bytes and tensors in the plan");
  }
  for (const json& f : output["files"]) {
    if (!f.is_object() || !f.value("name", json()).is_string() ||
        !f.value("size", json()).is_number_unsigned()) {
      throw fail("a planned file without name and size");
    }
  }
  r.input_path = j.value("input_path", "");
  if (!j.contains("assigned") || !j["assigned"].is_array() || !j.contains("files") ||
      !j["files"].is_array() || !j.contains("complete") || !j["complete"].is_boolean()) {
    throw fail("no file lists");
  }
  for (const json& a : j["assigned"]) {
    if (!a.is_string()) throw fail("an assigned file that is not a name");
    r.assigned.push_back(a);
  }
  for (const json& f : j["files"]) {
    const auto e = entry_from_json(f);
    if (!e) throw fail("a file entry without name, size, sha256 and tensors");
    r.files.push_back(*e);
  }
  r.complete = j["complete"];
  r.files_kept = j.value("files_kept", 0u);
  r.files_written = j.value("files_written", 0u);
  return r;
}

std::string fingerprint_of(const json& plan) { return plan.at("fingerprint").get<std::string>(); }

// The entries of a log: its header names the plan, then one file per line.
// A torn last line (the process died while appending it) is ignored.
struct Log {
  std::string plan_fingerprint;
  std::vector<FileEntry> files;
};

std::optional<Log> read_log(const fs::path& path) {
  std::string text;
  try {
    text = detail::read_input_file(path, path.filename().string(), detail::kMaxJsonFileBytes);
  } catch (const Error&) {
    return std::nullopt;
  }
  Log log;
  std::size_t line_no = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string::npos) break;  // torn last line
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    json j;
    try {
      j = detail::parse_json_file_text(line, path.filename().string(),
                                       /*reject_duplicate_keys=*/true);
    } catch (const Error&) {
      return line_no == 0 ? std::nullopt : std::optional<Log>(log);
    }
    if (line_no++ == 0) {
      if (!j.is_object() || !j.contains("plan_fingerprint") || !j["plan_fingerprint"].is_string()) {
        return std::nullopt;
      }
      log.plan_fingerprint = j["plan_fingerprint"];
      continue;
    }
    if (const auto e = entry_from_json(j)) log.files.push_back(*e);
  }
  if (line_no == 0) return std::nullopt;
  return log;
}

std::string log_line(const json& j) { return j.dump() + "\n"; }

// ---- fingerprints ----

std::string header_digest(const SafetensorsHeader& h) {
  Sha256 hash;
  hash.update(fmt::format("{}\n", h.header_size));
  for (const auto& [key, value] : h.metadata) {
    hash.update(key);
    hash.update(std::string_view("\0", 1));
    hash.update(value);
    hash.update(std::string_view("\n", 1));
  }
  for (const TensorEntry& t : h.tensors) {
    hash.update(fmt::format("{}\t{}\t{}\t{}\t{}\n", t.name, dtype_tag(t.dtype),
                            shape_string(t.shape), t.begin, t.end));
  }
  return hash.hex_digest();
}

std::string json_digest(const std::optional<json>& value) {
  return value ? sha256_hex(value->dump()) : std::string();
}

std::uint64_t other_file_size(const Checkpoint& ckpt, const std::string& name) {
  std::error_code ec;
  const auto size = fs::file_size(ckpt.root / name, ec);
  return ec ? 0 : size;
}

// A JSON value as a message shows it: short.
std::string short_value(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// Paths where two JSON values differ ("ignore", "config_groups.group_0..."),
// at most `limit`.
void json_changes(const json& before, const json& now, const std::string& path,
                  std::vector<std::string>& out, std::size_t limit) {
  if (out.size() >= limit || before == now) return;
  if (before.is_object() && now.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : before.items()) keys.insert(k);
    for (const auto& [k, v] : now.items()) keys.insert(k);
    for (const std::string& k : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!before.contains(k)) {
        out.push_back(fmt::format("{}: added ({})", sub, short_value(now[k])));
      } else if (!now.contains(k)) {
        out.push_back(fmt::format("{}: removed (was {})", sub, short_value(before[k])));
      } else {
        json_changes(before[k], now[k], sub, out, limit);
      }
      if (out.size() >= limit) return;
    }
    return;
  }
  out.push_back(fmt::format("{}: {} then, {} now", path.empty() ? "(value)" : path,
                            short_value(before), short_value(now)));
}

}  // namespace

// ---------------------------------------------------------------------------

PartSpec parse_part(std::string_view text) {
  const auto fail = [&] {
    return usage_error(fmt::format(
        "--part {}: expected I/N, the part I (from 1) of N parts, e.g. --part 2/3 (N at most {})",
        text, kMaxParts));
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) throw fail();
  const auto number = [&](std::string_view digits) -> unsigned {
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      throw fail();
    }
    return static_cast<unsigned>(std::stoul(std::string(digits)));
  };
  const PartSpec part{number(text.substr(0, slash)), number(text.substr(slash + 1))};
  if (part.count < 1 || part.count > kMaxParts || part.index < 1 || part.index > part.count) {
    throw fail();
  }
  return part;
}

std::string part_name(const PartSpec& part) { return fmt::format("{}/{}", part.index, part.count); }

fs::path default_stage_dir(const fs::path& output) {
  fs::path abs = fs::absolute(output).lexically_normal();
  if (!abs.has_filename() && abs.has_parent_path()) abs = abs.parent_path();
  return abs.parent_path() / fmt::format(".{}.ctquant-parts", abs.filename().string());
}

std::vector<unsigned> assign_parts(const std::vector<PlannedFile>& files, unsigned count) {
  std::vector<std::size_t> order(files.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return files[a].work > files[b].work;
  });
  std::vector<std::uint64_t> load(std::max(1u, count), 0);
  std::vector<unsigned> owner(files.size(), 0);
  for (const std::size_t f : order) {
    const auto least = static_cast<unsigned>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[f] = least;
    load[least] += files[f].work;
  }
  return owner;
}

json plan_fingerprint(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  json input;
  json shards = json::array();
  for (const SafetensorsFile& shard : checkpoint.shards) {
    shards.push_back(json{{"name", shard.label()},
                          {"size", shard.file_size()},
                          {"header_sha256", header_digest(shard.header())}});
  }
  input["shards"] = shards;
  input["config_sha256"] = json_digest(checkpoint.config);
  input["index_sha256"] =
      checkpoint.has_index ? json_digest(std::optional<json>(checkpoint.index)) : std::string();
  json others = json::array();
  for (const std::string& name : checkpoint.other_files) {
    others.push_back(json{{"name", name}, {"size", other_file_size(checkpoint, name)}});
  }
  input["other_files"] = others;

  json output;
  json files = json::array();
  Sha256 layout;
  std::vector<std::string> tensors;
  std::uint64_t bytes = 0;
  for (const PlannedFile& f : plan_output_files(checkpoint, plan)) {
    files.push_back(json{{"name", f.name}, {"size", f.size}});
    bytes += f.size;
    tensors.insert(tensors.end(), f.tensors.begin(), f.tensors.end());
  }
  for (const ShardPlan& shard : plan.shards) layout.update(shard.header);
  layout.update(dump_json(plan.index));
  layout.update(dump_json(plan.config));
  std::sort(tensors.begin(), tensors.end());
  Sha256 names;
  for (const std::string& t : tensors) {
    names.update(t);
    names.update(std::string_view("\n", 1));
  }
  output["files"] = files;
  output["bytes"] = bytes;
  output["layout_sha256"] = layout.hex_digest();
  output["tensors"] = tensors.size();
  output["tensors_sha256"] = names.hex_digest();

  json fingerprint;
  fingerprint["ctquant_version"] = ctquant_version();
  fingerprint["record_format"] = kRecordFormat;
  fingerprint["input"] = input;
  fingerprint["options"] = plan.config.contains("quantization_config")
                               ? plan.config["quantization_config"]
                               : json(nullptr);
  fingerprint["output"] = output;
  fingerprint["fingerprint"] = sha256_hex(fingerprint.dump());
  return fingerprint;
}

std::vector<std::string> fingerprint_changes(const json& before, const json& now) {
  std::vector<std::string> changes;
  if (before.value("fingerprint", "") == now.value("fingerprint", "")) return changes;
  constexpr std::size_t kLimit = 12;
  if (before.value("ctquant_version", "") != now.value("ctquant_version", "") ||
      before.value("record_format", 0) != now.value("record_format", 0)) {
    changes.push_back(fmt::format("ctquant version: {} then, {} now",
                                  before.value("ctquant_version", "?"),
                                  now.value("ctquant_version", "?")));
  }
  const json bi = before.value("input", json::object());
  const json ni = now.value("input", json::object());
  const auto by_name = [](const json& list) {
    std::map<std::string, json> out;
    if (list.is_array()) {
      for (const json& item : list) {
        if (item.is_object() && item.contains("name")) out[item.value("name", "")] = item;
      }
    }
    return out;
  };
  const auto compare_files = [&](const char* key, const char* what) {
    const auto b = by_name(bi.value(key, json::array()));
    const auto n = by_name(ni.value(key, json::array()));
    for (const auto& [name, item] : b) {
      if (changes.size() >= kLimit) return;
      const auto it = n.find(name);
      if (it == n.end()) {
        changes.push_back(fmt::format("input {} {}: gone", what, name));
      } else if (item.value("size", 0ull) != it->second.value("size", 0ull)) {
        changes.push_back(fmt::format("input {} {}: {} bytes then, {} now", what, name,
                                      item.value("size", 0ull), it->second.value("size", 0ull)));
      } else if (item.value("header_sha256", "") != it->second.value("header_sha256", "")) {
        changes.push_back(fmt::format("input {} {}: its header differs", what, name));
      }
    }
    for (const auto& [name, item] : n) {
      if (changes.size() >= kLimit) return;
      if (b.count(name) == 0) changes.push_back(fmt::format("input {} {}: new", what, name));
    }
  };
  compare_files("shards", "shard");
  compare_files("other_files", "file");
  if (bi.value("config_sha256", "") != ni.value("config_sha256", "")) {
    changes.push_back(fmt::format("input {}: differs", kConfigFileName));
  }
  if (bi.value("index_sha256", "") != ni.value("index_sha256", "")) {
    changes.push_back(fmt::format("input {}: differs", kIndexFileName));
  }
  std::vector<std::string> options;
  json_changes(before.value("options", json()), now.value("options", json()), "", options, kLimit);
  for (const std::string& o : options) changes.push_back("options: quantization_config." + o);
  if (changes.empty()) changes.push_back("the output layout differs");
  return changes;
}

// ---------------------------------------------------------------------------
// A part.

namespace {

bool only_options_changed(const std::vector<std::string>& changes) {
  return std::all_of(changes.begin(), changes.end(), [](const std::string& c) {
    return c.starts_with("options: ") || c.starts_with("ctquant version");
  });
}

std::string bullet_list(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += "\n  - " + line;
  return text;
}

// Files finished by earlier runs of this plan, from every record and log in
// the stage whose plan fingerprint is `fingerprint`.
std::map<std::string, FileEntry> logged_files(const fs::path& stage, const std::string& fingerprint) {
  std::map<std::string, FileEntry> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(stage, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (part_of_file_name(name, ".json")) {
      try {
        const Record r = record_from_json(read_json(it->path()), name);
        if (fingerprint_of(r.plan) != fingerprint) continue;
        for (const FileEntry& e : r.files) found.emplace(e.name, e);
      } catch (const std::exception&) {
        // Not a record this run can use; finalize reports it.
      }
    } else if (part_of_file_name(name, ".log")) {
      const auto log = read_log(it->path());
      if (!log || log->plan_fingerprint != fingerprint) continue;
      for (const FileEntry& e : log->files) found.emplace(e.name, e);
    }
  }
  return found;
}

// One run of a part, stage by stage: the stage adopted and the part locked,
// its files assigned, those an earlier run finished kept (--resume), the
// record and log started, the other files written one by one, the record
// completed.
class PartRun {
 public:
  PartRun(const Checkpoint& checkpoint, const QuantizePlan& plan, const PartOptions& options,
          const ExecuteOptions& execute)
      : checkpoint_(checkpoint),
        plan_(plan),
        options_(options),
        execute_(execute),
        log_(options.logger),
        part_(options.part),
        who_(fmt::format("part {}", part_name(part_))),
        stage_(options.stage) {}

  // quantize() checked the stage with the path policy before INPUT was read;
  // checked again here, where it is created or adopted. Takes the part's lock.
  void adopt_stage() {
    const fs::path& stage = stage_;
    std::error_code ec;
    if (const std::string why = stage_refusal(stage); !why.empty()) {
      throw usage_error(fmt::format("staging directory {}: it {}; choose another", stage.string(),
                                    why));
    }
    if (!fs::is_directory(stage, ec)) {
      if (!fs::is_directory(fs::absolute(stage).parent_path(), ec)) {
        throw usage_error(fmt::format("the directory {} that should hold the staging directory {} "
                                      "does not exist",
                                      fs::absolute(stage).parent_path().string(), stage.string()));
      }
      fs::create_directory(stage, ec);
      if (ec && !fs::is_directory(stage)) {
        throw io_error(fmt::format("{}: cannot create the staging directory: {}", stage.string(),
                                   ec.message()));
      }
    }
    // An absent or empty directory becomes a stage ctquant made: the marker is
    // its first entry, created in place (parts started together find either an
    // empty directory or the marker, never a temporary file instead of it).
    const fs::path marker = stage / kStageMarkerName;
    detail::UniqueFd marker_fd(::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                                      0644));
    if (marker_fd.get() < 0) {
      throw_write_error(fmt::format("{}: cannot create", marker.string()), errno);
    }
    marker_fd = detail::UniqueFd();
    if (!lock_.try_lock(stage / lock_name(part_))) {
      throw usage_error(fmt::format("{} is already running in another process ({} is locked)",
                                    who_, (stage / lock_name(part_)).string()));
    }
  }

  // The files of the plan this part writes (assign_parts), and the record
  // that names them.
  void assign_files() {
    files_ = plan_output_files(checkpoint_, plan_);
    const std::vector<unsigned> owner = assign_parts(files_, part_.count);
    fingerprint_ = plan_fingerprint(checkpoint_, plan_);
    fp_ = fingerprint_of(fingerprint_);
    record_.file_name = record_name(part_);
    record_.part = part_;
    record_.input_path = fs::absolute(checkpoint_.root).lexically_normal().string();
    record_.plan = fingerprint_;
    for (std::size_t i = 0; i < files_.size(); ++i) {
      if (owner[i] != part_.index - 1) continue;
      assigned_.push_back(&files_[i]);
      record_.assigned.push_back(files_[i].name);
      summary_.bytes_assigned += files_[i].size;
    }
    summary_.files_assigned = assigned_.size();
    summary_.record = stage_ / record_.file_name;
  }

  // What an earlier run left: with --resume, the files it finished that are
  // still intact; a changed plan is refused.
  void keep_finished_files() {
    if (!options_.resume) return;
    std::error_code ec;
    const fs::path previous = stage_ / record_.file_name;
    if (fs::exists(previous, ec)) {
      const Record before = record_from_json(read_json(previous), record_.file_name);
      const std::vector<std::string> changes = fingerprint_changes(before.plan, fingerprint_);
      if (!changes.empty()) {
        const std::string message = fmt::format(
            "cannot resume {}: the plan changed since {} was written:{}\nrerun without --resume "
            "to write the part again, or with the earlier input and options",
            who_, previous.string(), bullet_list(changes));
        throw only_options_changed(changes) ? usage_error(message) : bad_input(message);
      }
    }
    const std::map<std::string, FileEntry> logged = logged_files(stage_, fp_);
    for (const PlannedFile* f : assigned_) {
      const auto it = logged.find(f->name);
      if (it == logged.end() || it->second.size != f->size || it->second.tensors != f->tensors) {
        continue;
      }
      const fs::path staged = stage_ / f->name;
      if (!fs::is_regular_file(fs::symlink_status(staged, ec)) ||
          fs::file_size(staged, ec) != f->size) {
        continue;
      }
      if (sha256_file(staged, staged.string()).sha256 == it->second.sha256) {
        kept_.emplace(f->name, it->second);
      }
    }
  }

  // A fresh work directory; the record and the log started with what is
  // kept, the log left open for appending.
  void start_record_and_log() {
    std::error_code ec;
    remove_directory(work_, DirectoryRemoval::kTree, ec);
    fs::create_directory(work_, ec);
    if (ec) {
      throw io_error(fmt::format("{}: cannot create the work directory: {}", work_.string(),
                                 ec.message()));
    }
    for (const PlannedFile* f : assigned_) {
      if (const auto it = kept_.find(f->name); it != kept_.end()) {
        record_.files.push_back(it->second);
      }
    }
    record_.files_kept = record_.files.size();
    write_file_atomically(stage_ / record_.file_name, record_json(record_).dump(1) + "\n",
                          execute_.fsync);
    std::string log_text =
        log_line(json{{"ctquant_part_log", kRecordFormat}, {"part", part_.index},
                      {"parts", part_.count}, {"plan_fingerprint", fp_}});
    for (const FileEntry& e : record_.files) log_text += log_line(entry_json(e));
    write_file_atomically(log_path_, log_text, execute_.fsync);
    log_fd_ = detail::UniqueFd(::open(log_path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
    if (log_fd_.get() < 0) {
      throw io_error(fmt::format("{}: cannot open: {}", log_path_.string(), std::strerror(errno)));
    }
    summary_.files_kept = kept_.size();
    if (log_) {
      if (options_.resume) {
        log_->info("{}: {} of {} file(s) kept from an earlier run (sha256 checked), {} to write",
                   who_, kept_.size(), assigned_.size(), assigned_.size() - kept_.size());
      } else {
        log_->info("{}: {} file(s) to write, {} bytes, into {}", who_, assigned_.size(),
                   summary_.bytes_assigned, stage_.string());
      }
    }
  }

  // Writes the files not kept one after another, each into the work
  // directory, then hashed, renamed into the stage and logged; the progress
  // over the whole part.
  void write_files() {
    // The input bytes still to read, as plan_output_files estimates them.
    std::uint64_t input_total = 0;
    for (const PlannedFile* f : assigned_) {
      if (kept_.count(f->name) == 0) input_total += f->work - f->size;
    }
    Progress before;  // what the files written so far consumed
    for (const PlannedFile* f : assigned_) {
      if (kept_.count(f->name) > 0) continue;
      if (execute_.cancel != nullptr && execute_.cancel->load()) {
        throw Error(ErrorKind::kInterrupted,
                    "interrupted by a signal before the part was complete");
      }
      ExecuteOptions one = execute_;
      one.files = std::set<std::string>{f->name};
      Progress last;
      if (execute_.on_progress) {
        one.on_progress = [&](const Progress& p) {
          if (p.phase != ProgressPhase::kWrite) return execute_.on_progress(p);  // own totals
          last = p;
          Progress all;
          all.bytes_done = before.bytes_done + p.bytes_done;
          all.bytes_total = std::max(input_total, all.bytes_done);
          all.tensors_done = before.tensors_done + p.tensors_done;
          all.tensors_total = before.tensors_total + p.tensors_total;
          execute_.on_progress(all);
        };
      }
      const ExecuteStats stats = execute_plan(checkpoint_, plan_, work_, one);
      before.bytes_done += last.bytes_done;
      before.tensors_done += last.tensors_done;
      before.tensors_total += last.tensors_total;
      add_stats(stats);
      stage_file(*f);
    }
    if (log_) {
      for (const std::string& w : summary_.execute.warnings) log_->warn("{}: {}", who_, w);
    }
    std::sort(summary_.execute.module_errors.begin(), summary_.execute.module_errors.end(),
              [](const ModuleError& a, const ModuleError& b) { return a.module < b.module; });
  }

  // Complete: the record in plan order, the log and work directory gone.
  PartSummary complete() {
    std::error_code ec;
    std::map<std::string, FileEntry> by_name;
    for (const FileEntry& e : record_.files) by_name.emplace(e.name, e);
    record_.files.clear();
    for (const PlannedFile* f : assigned_) record_.files.push_back(by_name.at(f->name));
    record_.complete = true;
    record_.files_written = summary_.files_written;
    write_file_atomically(stage_ / record_.file_name, record_json(record_).dump(1) + "\n",
                          execute_.fsync);
    log_fd_ = detail::UniqueFd();
    fs::remove(log_path_, ec);
    remove_directory(work_, DirectoryRemoval::kTree, ec);
    if (execute_.fsync) fsync_directory_best_effort(stage_);
    if (log_) {
      log_->info("{}: complete: {} file(s) written, {} kept; record {}", who_,
                 summary_.files_written, summary_.files_kept, summary_.record.string());
    }
    return summary_;
  }

 private:
  // Adds what execute_plan() measured of one file to the part's summary
  // (each warning once).
  void add_stats(const ExecuteStats& stats) {
    summary_.execute.seconds_stream += stats.seconds_stream;
    summary_.execute.seconds_flush += stats.seconds_flush;
    summary_.execute.bytes_read += stats.bytes_read;
    summary_.execute.bytes_written += stats.bytes_written;
    ExecuteStats::MseRows& mse = summary_.execute.mse_rows;
    mse.cutoff += stats.mse_rows.cutoff;
    mse.amax += stats.mse_rows.amax;
    mse.quantize += stats.mse_rows.quantize;
    mse.reused_amax += stats.mse_rows.reused_amax;
    mse.reused_quantize += stats.mse_rows.reused_quantize;
    mse.kept_bytes = std::max(mse.kept_bytes, stats.mse_rows.kept_bytes);
    summary_.execute.module_errors.insert(summary_.execute.module_errors.end(),
                                          stats.module_errors.begin(), stats.module_errors.end());
    for (const std::string& w : stats.warnings) {
      if (std::find(summary_.execute.warnings.begin(), summary_.execute.warnings.end(), w) ==
          summary_.execute.warnings.end()) {
        summary_.execute.warnings.push_back(w);
      }
    }
  }

  // Moves a file written into the work directory into the stage, with its
  // digest in the log and the record.
  void stage_file(const PlannedFile& f) {
    std::error_code ec;
    const FileDigest digest = sha256_file(work_ / f.name, (work_ / f.name).string());
    fs::rename(work_ / f.name, stage_ / f.name, ec);
    if (ec) {
      throw io_error(fmt::format("{}: cannot move into the staging directory: {}",
                                 (work_ / f.name).string(), ec.message()));
    }
    if (execute_.fsync) fsync_directory_best_effort(stage_);
    const FileEntry entry{f.name, digest.size, digest.sha256, f.tensors};
    const std::string line = log_line(entry_json(entry));
    if (::write(log_fd_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      throw_write_error(log_path_.string(), errno);
    }
    if (execute_.fsync && ::fsync(log_fd_.get()) != 0) {
      throw_write_error(log_path_.string(), errno);
    }
    record_.files.push_back(entry);
    ++summary_.files_written;
    if (log_) {
      log_->debug("{}: {} written ({} bytes, sha256 {})", who_, f.name, digest.size,
                  digest.sha256);
    }
  }

  const Checkpoint& checkpoint_;
  const QuantizePlan& plan_;
  const PartOptions& options_;
  const ExecuteOptions& execute_;
  const std::shared_ptr<spdlog::logger>& log_;
  const PartSpec part_;
  const std::string who_;  // "part I/N", for messages
  const fs::path& stage_;
  const fs::path work_ = stage_ / work_name(part_);
  const fs::path log_path_ = stage_ / log_name(part_);
  PartLock lock_;
  std::vector<PlannedFile> files_;  // every file of the plan
  json fingerprint_;
  std::string fp_;  // fingerprint_of(fingerprint_)
  Record record_;
  PartSummary summary_;
  std::vector<const PlannedFile*> assigned_;  // this part's, in plan order
  std::map<std::string, FileEntry> kept_;     // --resume: finished by an earlier run, intact
  detail::UniqueFd log_fd_;                   // the log, open for appending
};

}  // namespace

PartSummary run_part(const Checkpoint& checkpoint, const QuantizePlan& plan,
                     const PartOptions& options, const ExecuteOptions& execute) {
  PartRun run(checkpoint, plan, options, execute);
  run.adopt_stage();
  run.assign_files();
  run.keep_finished_files();
  run.start_record_and_log();
  run.write_files();
  return run.complete();
}

bool stage_in_use(const fs::path& stage) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(stage, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(".part-") || !name.ends_with(".lock")) continue;
    const detail::UniqueFd fd(::open(it->path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0) continue;
    // A shared lock is refused while a part (or finalize) holds its
    // exclusive one; taken, it is released when fd closes.
    if (::flock(fd.get(), LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// Finalize.

namespace {

// Links (or, across filesystems, copies) a staged file into the output
// directory.
void place_file(const fs::path& from, const fs::path& to, bool fsync) {
  if (::link(from.c_str(), to.c_str()) == 0) return;
  const int error = errno;
  if (error != EXDEV && error != EPERM && error != EMLINK && error != ENOTSUP) {
    throw_write_error(fmt::format("{}: cannot link into {}", from.string(), to.string()), error);
  }
  std::uint64_t size = 0;
  const detail::UniqueFd in = detail::open_input_file(from, from.string(), size);
  OutputFile out(to);
  out.reserve(size);
  out.copy_from(in.get(), 0, 0, size);
  if (fsync) out.sync_and_close();
}

void check_cancel(const std::atomic<bool>* cancel) {
  if (cancel != nullptr && cancel->load()) {
    throw Error(ErrorKind::kInterrupted, "interrupted by a signal before OUTPUT was complete");
  }
}

// One finalize, stage by stage: the records in the stage read, the run
// most of them belong to chosen, its parts checked complete and locked, the
// files they staged checked against the plan, every problem reported at
// once; then OUTPUT assembled and committed, and the stage cleaned.
class Finalization {
 public:
  explicit Finalization(const FinalizeOptions& options)
      : options_(options),
        log_(options.logger),
        stage_(options.stage.value_or(default_stage_dir(options.output))) {
    summary_.stage = stage_;
  }

  // The stage must exist; OUTPUT and the stage against each other and the
  // working directory, the stage a stage ctquant made; against INPUT once
  // the records name it.
  void check_paths() {
    std::error_code ec;
    if (!fs::is_directory(stage_, ec)) {
      throw bad_input(fmt::format(
          "no staging directory {}: nothing to finalize (run `ctquant quantize INPUT {} --part "
          "I/N` for each part first{})",
          stage_.string(), options_.output.string(),
          options_.stage ? "" : ", or give the parts' --stage DIR"));
    }
    paths_.output = options_.output;
    paths_.force = options_.force;
    paths_.stage = stage_;
    paths_.stage_named = options_.stage.has_value();
    check_run_paths(paths_);
  }

  // Every record in the stage (and which parts left a log); none at all is
  // an error at once.
  void read_records() {
    std::error_code ec;
    std::vector<std::string> names;
    for (auto it = fs::directory_iterator(stage_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    if (ec) throw io_error(fmt::format("{}: cannot list: {}", stage_.string(), ec.message()));
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      if (const auto part = part_of_file_name(name, ".log")) {
        if (!options_.parts || part->count == *options_.parts) logs_.insert(name);
        continue;
      }
      const auto part = part_of_file_name(name, ".json");
      if (!part || (options_.parts && part->count != *options_.parts)) continue;
      try {
        Record r = record_from_json(read_json(stage_ / name), name);
        if (r.part != *part) {
          problems_.push_back(fmt::format("{}: holds the record of part {} (a copied or renamed "
                                          "record: a duplicated part)",
                                          name, part_name(r.part)));
          continue;
        }
        records_.push_back(std::move(r));
      } catch (const Error& e) {
        problems_.push_back(e.what());
      }
    }
    if (records_.empty()) {
      problems_.push_back(fmt::format("{}: no part record: run `ctquant quantize INPUT {} --part "
                                      "I/N` for each part first",
                                      stage_.string(), options_.output.string()));
      throw bad_input(fmt::format("cannot finalize {}; OUTPUT was not created and the staging "
                                  "directory is left as it is:{}",
                                  options_.output.string(), bullet_list(problems_)));
    }
  }

  // The run: the plan and part count most records agree on; the records of
  // other runs are problems.
  void choose_run() {
    std::map<std::pair<unsigned, std::string>, std::size_t> votes;
    for (const Record& r : records_) ++votes[{r.part.count, fingerprint_of(r.plan)}];
    const auto [count, fingerprint] =
        std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) {
          return a.second < b.second;
        })->first;
    count_ = count;
    fingerprint_ = fingerprint;
    for (const Record& r : records_) {
      if (r.part.count == count_ && fingerprint_of(r.plan) == fingerprint_) {
        by_part_[r.part.index] = &r;
        if (reference_ == nullptr) reference_ = &r;
      }
    }
    for (const Record& r : records_) {
      if (r.part.count == count_ && fingerprint_of(r.plan) == fingerprint_) continue;
      std::vector<std::string> why;
      if (r.part.count != count_) {
        why.push_back(fmt::format("split in {} parts, not {}", r.part.count, count_));
      }
      if (fingerprint_of(r.plan) != fingerprint_) {
        for (const std::string& c : fingerprint_changes(r.plan, reference_->plan)) why.push_back(c);
      }
      std::string list;
      for (const std::string& w : why) list += (list.empty() ? "" : "; ") + w;
      problems_.push_back(fmt::format("{}: part {} of another run ({}); remove it, or the staging "
                                      "directory, if that run is abandoned",
                                      r.file_name, part_name(r.part), list));
    }
  }

  // Every part of the run, complete, and none running (each part's lock is
  // held from here on).
  void lock_complete_parts() {
    for (unsigned i = 1; i <= count_; ++i) {
      const PartSpec part{i, count_};
      const auto it = by_part_.find(i);
      if (it == by_part_.end()) {
        all_complete_ = false;
        const bool foreign = std::any_of(records_.begin(), records_.end(),
                                         [&](const Record& r) { return r.part == part; });
        problems_.push_back(
            foreign ? fmt::format("part {}: its record is of another run (above): run this part "
                                  "again (ctquant quantize INPUT {} --part {})",
                                  part_name(part), options_.output.string(), part_name(part))
                    : fmt::format("part {}: no record in {}: it has not run (ctquant quantize "
                                  "INPUT {} --part {})",
                                  part_name(part), stage_.string(), options_.output.string(),
                                  part_name(part)));
        continue;
      }
      locks_.emplace_back();
      if (!locks_.back().try_lock(stage_ / lock_name(part))) {
        all_complete_ = false;
        problems_.push_back(fmt::format("part {}: running now ({} is locked)", part_name(part),
                                        (stage_ / lock_name(part)).string()));
        continue;
      }
      const Record& r = *it->second;
      if (!r.complete) {
        all_complete_ = false;
        std::size_t done = r.files.size();
        if (logs_.count(log_name(part)) > 0) {
          if (const auto l = read_log(stage_ / log_name(part))) done = l->files.size();
        }
        problems_.push_back(fmt::format("part {}: not complete: {} of {} file(s) written; it "
                                        "stopped (rerun it with --resume to finish it)",
                                        part_name(part), done, r.assigned.size()));
      }
    }
  }

  // Every planned file written once, by a complete part, staged with its
  // size; with every part complete, the plan's tensors and bytes all there.
  void check_staged_files() {
    std::error_code ec;
    const json& output = reference_->plan.at("output");
    std::map<std::string, std::uint64_t> planned;
    for (const json& f : output.at("files")) {
      planned[f.at("name").get<std::string>()] = f.at("size").get<std::uint64_t>();
      plan_order_.push_back(f.at("name").get<std::string>());
    }
    std::map<std::string, std::string> tensor_file;
    for (const auto& [index, r] : by_part_) {
      if (!r->complete) continue;
      for (const FileEntry& e : r->files) {
        const auto p = planned.find(e.name);
        if (p == planned.end()) {
          problems_.push_back(fmt::format("{} (part {}): not a file of the plan", e.name,
                                          part_name(r->part)));
          continue;
        }
        if (const auto [at, inserted] = written_by_.emplace(e.name, r); !inserted) {
          problems_.push_back(fmt::format("{}: recorded by part {} and by part {}", e.name,
                                          part_name(at->second->part), part_name(r->part)));
          continue;
        }
        if (e.size != p->second) {
          problems_.push_back(fmt::format("{} (part {}): {} bytes recorded, the plan has {}",
                                          e.name, part_name(r->part), e.size, p->second));
        }
        const fs::path staged = stage_ / e.name;
        if (!fs::is_regular_file(fs::symlink_status(staged, ec))) {
          problems_.push_back(fmt::format("{} (part {}): missing from {}", e.name,
                                          part_name(r->part), stage_.string()));
        } else if (const auto size = fs::file_size(staged, ec); size != e.size) {
          problems_.push_back(fmt::format("{} (part {}): {} bytes in {}, {} recorded", e.name,
                                          part_name(r->part), size, stage_.string(), e.size));
        }
        total_ += e.size;
        for (const std::string& t : e.tensors) {
          if (const auto [at, inserted] = tensor_file.emplace(t, e.name); !inserted) {
            problems_.push_back(
                fmt::format("tensor '{}': in {} and in {}", t, at->second, e.name));
          }
        }
      }
    }
    if (!all_complete_) return;
    for (const std::string& name : plan_order_) {
      if (written_by_.count(name) == 0) {
        problems_.push_back(fmt::format("{}: written by no part", name));
      }
    }
    std::vector<std::string> tensors;
    for (const auto& [t, file] : tensor_file) tensors.push_back(t);  // sorted
    Sha256 hash;
    for (const std::string& t : tensors) {
      hash.update(t);
      hash.update(std::string_view("\n", 1));
    }
    if (tensors.size() != output.at("tensors").get<std::size_t>() ||
        hash.hex_digest() != output.at("tensors_sha256").get<std::string>()) {
      problems_.push_back(fmt::format("the parts hold {} tensors, not the {} tensors of the plan",
                                      tensors.size(), output.at("tensors").get<std::size_t>()));
    }
    if (total_ != output.at("bytes").get<std::uint64_t>()) {
      problems_.push_back(fmt::format("the parts' files hold {} bytes, the plan {}", total_,
                                      output.at("bytes").get<std::uint64_t>()));
    }
    summary_.tensors = tensors.size();
  }

  // Throws Error{kBadInput} listing the problems found (the first
  // kMaxProblemsListed of them).
  void throw_problems() const {
    if (problems_.empty()) return;
    std::vector<std::string> listed(problems_.begin(),
                                    problems_.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                            problems_.size(), kMaxProblemsListed)));
    if (problems_.size() > kMaxProblemsListed) {
      listed.push_back(fmt::format("... and {} more", problems_.size() - kMaxProblemsListed));
    }
    throw bad_input(fmt::format("cannot finalize {} from {}; OUTPUT was not created and the "
                                "staging directory is left as it is:{}",
                                options_.output.string(), stage_.string(), bullet_list(listed)));
  }

  // Assemble: every file into the temporary output directory, the manifest,
  // then the rename.
  void assemble() {
    check_cancel(options_.cancel);
    paths_.input = reference_->input_path;
    check_run_paths(paths_);
    StagedOutput staged(options_.output, reference_->input_path, options_.force);
    for (const std::string& name : plan_order_) {
      check_cancel(options_.cancel);
      place_file(stage_ / name, staged.dir() / name, options_.fsync);
    }
    // The manifest from the digests each part computed of the file it staged
    // (`ctquant verify OUTPUT --manifest` hashes the files again).
    for (const auto& [name, r] : written_by_) {
      for (const FileEntry& e : r->files) {
        if (e.name == name) summary_.manifest.push_back(ManifestEntry{e.name, e.size, e.sha256});
      }
    }
    std::sort(summary_.manifest.begin(), summary_.manifest.end(),
              [](const ManifestEntry& a, const ManifestEntry& b) { return a.name < b.name; });
    const ManifestEntry manifest = write_manifest(staged.dir(), summary_.manifest, options_.fsync);
    summary_.manifest.push_back(manifest);
    std::sort(summary_.manifest.begin(), summary_.manifest.end(),
              [](const ManifestEntry& a, const ManifestEntry& b) { return a.name < b.name; });
    if (options_.fsync) fsync_directory_best_effort(staged.dir());
    summary_.parts = count_;
    summary_.files = plan_order_.size();
    summary_.bytes = total_ + manifest.size;
    if (options_.before_commit) options_.before_commit(summary_);
    check_cancel(options_.cancel);
    staged.commit();
  }

  // The stage: the files placed, the records, logs, locks and work
  // directories of this run; the directory itself when nothing else is left.
  void clean_stage() {
    std::error_code ec;
    for (const std::string& name : plan_order_) fs::remove(stage_ / name, ec);
    for (unsigned i = 1; i <= count_; ++i) {
      const PartSpec part{i, count_};
      fs::remove(stage_ / record_name(part), ec);
      fs::remove(stage_ / log_name(part), ec);
      fs::remove(stage_ / lock_name(part), ec);
      remove_directory(stage_ / work_name(part), DirectoryRemoval::kTree, ec);
    }
    // The marker goes last, and only when nothing else is left: a stage that
    // still holds another run's files stays a stage ctquant made.
    std::size_t others = 0;
    for (auto it = fs::directory_iterator(stage_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      if (it->path().filename() != kStageMarkerName) ++others;
    }
    if (!ec && others == 0) fs::remove(stage_ / kStageMarkerName, ec);
    if ((ec || others > 0 || !remove_directory(stage_, DirectoryRemoval::kIfEmpty, ec)) && log_) {
      log_->warn("{}: not removed: it holds files of another run ({})", stage_.string(),
                 ec ? ec.message() : "not empty");
    }
  }

  FinalizeSummary done() const {
    if (log_) {
      log_->info("finalize: {} from {} part(s): {} file(s), {} bytes", options_.output.string(),
                 count_, summary_.files, summary_.bytes);
    }
    return summary_;
  }

 private:
  const FinalizeOptions& options_;
  const std::shared_ptr<spdlog::logger>& log_;
  const fs::path stage_;
  FinalizeSummary summary_;
  RunPaths paths_;
  std::vector<std::string> problems_;  // every problem found, reported at once
  std::vector<Record> records_;
  std::set<std::string> logs_;  // file names of the part logs in the stage
  unsigned count_ = 0;          // the run's part count and plan fingerprint
  std::string fingerprint_;
  const Record* reference_ = nullptr;             // the run's first record
  std::map<unsigned, const Record*> by_part_;     // the run's records by part index
  std::vector<PartLock> locks_;                   // held until the end
  bool all_complete_ = true;
  std::vector<std::string> plan_order_;                // the plan's files
  std::map<std::string, const Record*> written_by_;   // file -> the part that wrote it
  std::uint64_t total_ = 0;                            // bytes of the staged files
};

}  // namespace

FinalizeSummary finalize_parts(const FinalizeOptions& options) {
  Finalization run(options);
  run.check_paths();
  run.read_records();
  run.choose_run();
  run.lock_complete_parts();
  run.check_staged_files();
  run.throw_problems();
  run.assemble();
  run.clean_stage();
  return run.done();
}

}  // namespace ctquant
