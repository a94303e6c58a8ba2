#include "exec/part_record.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "ctquant/exec/output_dir.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant::detail {

namespace fs = std::filesystem;
using nlohmann::json;

std::string part_stem(const PartSpec& part) {
  return fmt::format("part-{:05d}-of-{:05d}", part.index, part.count);
}
std::string record_name(const PartSpec& part) { return part_stem(part) + ".json"; }
std::string log_name(const PartSpec& part) { return part_stem(part) + ".log"; }
std::string lock_name(const PartSpec& part) { return fmt::format(".{}.lock", part_stem(part)); }
std::string work_name(const PartSpec& part) { return fmt::format(".{}.work", part_stem(part)); }

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

void write_file_atomically(const fs::path& path, const std::string& text, bool fsync) {
  StagedFile file(path, text, fsync, path.string());
  file.commit();
}

json read_stage_json(const fs::path& path) {
  return read_json_file(path, path.filename().string());
}

bool PartLock::try_lock(const fs::path& path) {
  fd_ = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (fd_.get() < 0) {
    throw io_error(
        fmt::format("{}: cannot open the lock file: {}", path.string(), std::strerror(errno)));
  }
  if (::flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) return true;
  if (errno == EWOULDBLOCK) return false;
  throw io_error(fmt::format("{}: cannot lock: {}", path.string(), std::strerror(errno)));
}

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

namespace {

Record parse_record(const json& j, const std::string& file_name) {
  const auto fail = [&](const std::string& what) {
    return bad_input(fmt::format("{}: not a part record ctquant can read: {}", file_name, what));
  };
  if (!j.is_object() || j.value("ctquant_part_record", 0) != kRecordFormat) {
    const json format = j.is_object() ? j.value("ctquant_part_record", json()) : json();
    throw fail(format.is_number_integer()
                   ? fmt::format("its format is {}, this ctquant reads format {} (written by "
                                 "another version of ctquant: run the part again; --resume "
                                 "cannot keep its files)",
                                 format.dump(), kRecordFormat)
                   : fmt::format("no \"ctquant_part_record\": {}", kRecordFormat));
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

}  // namespace

Record record_from_json(const json& j, const std::string& file_name) {
  try {
    return parse_record(j, file_name);
  } catch (const json::exception& e) {
    throw bad_input(fmt::format("{}: not a part record ctquant can read: {}", file_name, e.what()));
  }
}

std::string fingerprint_of(const json& plan) { return plan.at("fingerprint").get<std::string>(); }

std::string log_header(const PartSpec& part, const std::string& fingerprint) {
  return log_line(json{{"ctquant_part_log", kRecordFormat},
                       {"part", part.index},
                       {"parts", part.count},
                       {"plan_fingerprint", fingerprint}});
}

std::string log_line(const json& j) { return j.dump() + "\n"; }

std::optional<Log> read_log(const fs::path& path) {
  std::string text;
  try {
    text = read_input_file(path, path.filename().string(), kMaxJsonFileBytes);
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
      j = parse_json_file_text(line, path.filename().string(), /*reject_duplicate_keys=*/true);
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

std::string bullet_list(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += "\n  - " + line;
  return text;
}

}  // namespace ctquant::detail
