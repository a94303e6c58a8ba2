#include "util/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "ctquant/util/error.hpp"

namespace ctquant::detail {

using nlohmann::json;

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd open_input_file(const std::filesystem::path& path, const std::string& label,
                         std::uint64_t& size) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer. It has no effect
  // on reads of a regular file.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.get() < 0) {
    throw io_error(fmt::format("{}: cannot open: {}", label, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw io_error(fmt::format("{}: cannot stat: {}", label, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw bad_input(
        fmt::format("{}: not a regular file (ctquant reads only regular files)", label));
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

FileIdentity file_identity(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw io_error(fmt::format("cannot stat an open file: {}", std::strerror(errno)));
  }
  return FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                      static_cast<std::uint64_t>(st.st_size)};
}

UniqueFd reopen_input_file(const std::filesystem::path& path, const std::string& label,
                           const FileIdentity& identity) {
  std::uint64_t size = 0;
  UniqueFd fd = open_input_file(path, label, size);
  const FileIdentity now = file_identity(fd.get());
  if (now.device != identity.device || now.inode != identity.inode) {
    throw io_error(
        fmt::format("{}: was replaced while ctquant ran (reopened, it is another file than the "
                    "one first read); the input must not change during a run",
                    label));
  }
  if (now.size != identity.size) {
    throw io_error(
        fmt::format("{}: changed size while ctquant ran ({} bytes when first read, {} now); the "
                    "input must not change during a run",
                    label, identity.size, now.size));
  }
  return fd;
}

std::string read_input_file(const std::filesystem::path& path, const std::string& label,
                            std::uint64_t max_bytes) {
  std::uint64_t size = 0;
  const UniqueFd fd = open_input_file(path, label, size);
  if (size > max_bytes) {
    throw bad_input(
        fmt::format("{}: file is {} bytes, more than the limit of {}", label, size, max_bytes));
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n =
        ::pread(fd.get(), text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw io_error(fmt::format("{}: read failed: {}", label, std::strerror(errno)));
    if (n == 0) {
      throw io_error(
          fmt::format("{}: file ended at byte {} of {} while reading (was it truncated "
                      "while ctquant ran?)",
                      label, done, size));
    }
    done += static_cast<std::size_t>(n);
  }
  return text;
}

bool path_is_within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty() && std::next(o) == outer.end()) break;  // trailing separator of outer
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

namespace {

// SAX pass that checks nesting depth and repeated keys without building a
// tree (nlohmann/json's callback parser is quadratic in the number of nested
// objects, so it is not used on untrusted input).
class StructureCheck {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  StructureCheck(const std::string& label, bool reject_duplicates)
      : label_(label), reject_duplicates_(reject_duplicates) {}

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& key) {
    if (reject_duplicates_ && !keys_.back().insert(key).second) {
      const std::string object = depth_ == 1 ? std::string("the top-level object")
                                             : fmt::format("'{}'", opened_by_.back());
      throw bad_input(
          fmt::format("{}: key '{}' appears twice in {} (JSON readers keep only the "
                      "last one)",
                      label_, key, object));
    }
    current_key_ = key;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    throw bad_input(fmt::format("{}: not valid JSON ({})", label_, e.what()));
  }

 private:
  bool open(bool object) {
    if (++depth_ > kMaxJsonDepth) {
      throw bad_input(fmt::format("{}: JSON nests deeper than {} levels", label_, kMaxJsonDepth));
    }
    if (reject_duplicates_) {
      keys_.emplace_back();
      opened_by_.push_back(object ? current_key_ : std::string());
    }
    return true;
  }
  bool close() {
    --depth_;
    if (reject_duplicates_) {
      keys_.pop_back();
      opened_by_.pop_back();
    }
    return true;
  }

  const std::string& label_;
  bool reject_duplicates_;
  int depth_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;  // keys of each open container
  std::vector<std::string> opened_by_;                 // key whose value each container is
  std::string current_key_;
};

}  // namespace

namespace {

template <class Json>
Json parse_checked(std::string_view text, const std::string& label, bool reject_duplicate_keys) {
  StructureCheck check(label, reject_duplicate_keys);
  json::sax_parse(text.begin(), text.end(), &check);
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw bad_input(fmt::format("{}: not valid JSON ({})", label, e.what()));
  }
}

}  // namespace

json parse_json_file_text(std::string_view text, const std::string& label,
                          bool reject_duplicate_keys) {
  return parse_checked<json>(text, label, reject_duplicate_keys);
}

nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& label,
                                               bool reject_duplicate_keys) {
  return parse_checked<nlohmann::ordered_json>(text, label, reject_duplicate_keys);
}

json read_json_file(const std::filesystem::path& path, const std::string& label,
                    std::uint64_t max_bytes, bool reject_duplicate_keys) {
  return parse_json_file_text(read_input_file(path, label, max_bytes), label,
                              reject_duplicate_keys);
}

bool all_cached(int fd, std::uint64_t offset, std::uint64_t length) {
  constexpr long kCachestat = 451;
  struct Range {
    std::uint64_t offset, length;
  };
  struct Stat {
    std::uint64_t cache, dirty, writeback, evicted, recently_evicted;
  };
  static std::atomic<bool> unsupported{false};
  if (length == 0 || unsupported.load(std::memory_order_relaxed)) return false;
  Range range{offset, length};
  Stat stat{};
  if (::syscall(kCachestat, fd, &range, &stat, 0) != 0) {
    if (errno == ENOSYS) unsupported.store(true, std::memory_order_relaxed);
    return false;
  }
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t pages = (offset + length - 1) / page - offset / page + 1;
  return stat.cache >= pages;
}

}  // namespace ctquant::detail
