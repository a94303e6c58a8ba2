#include "ctquant/exec/output_dir.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "ctquant/exec/path_policy.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/fs.hpp"
#include "ctquant/util/text.hpp"
#include "util/input_file.hpp"

namespace ctquant {

namespace fs = std::filesystem;

namespace {

fs::path absolute_normal(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) abs = fs::absolute(p).lexically_normal();
  // Drop a trailing separator so that "out/" and "out" compare equal.
  if (!abs.has_filename() && abs.has_parent_path() && abs != abs.root_path()) {
    abs = abs.parent_path();
  }
  return abs;
}

// Why --force may not replace the existing entry at path (completing "it ...",
// e.g. "holds the subdirectory 'projects'"), or "" when it may: path is a
// directory (not a symbolic link) that is empty, or whose entries are all
// regular files, at least one of them a *.safetensors file. The directory is
// opened once (O_NOFOLLOW) and its entries examined through that descriptor
// without following links; entries are taken in name order, so the first
// offending one named is the same on every run.
std::string replace_refusal(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOTDIR || error == ELOOP) return "is not a directory";
    return fmt::format("cannot be listed ({})", std::strerror(error));
  }
  const std::unique_ptr<DIR, int (*)(DIR*)> listing(::fdopendir(fd), &::closedir);
  if (!listing) {
    const int error = errno;
    ::close(fd);
    return fmt::format("cannot be listed ({})", std::strerror(error));
  }
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(listing.get());
    if (entry == nullptr) break;
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  if (errno != 0) return fmt::format("cannot be listed ({})", std::strerror(errno));
  std::sort(names.begin(), names.end());
  bool any_entry = false;
  bool has_safetensors = false;
  for (const std::string& name : names) {
    struct stat st {};
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed since it was listed
      return fmt::format("holds '{}', which cannot be examined ({})", name, std::strerror(errno));
    }
    any_entry = true;
    if (S_ISDIR(st.st_mode)) return fmt::format("holds the subdirectory '{}'", name);
    if (S_ISLNK(st.st_mode)) return fmt::format("holds the symbolic link '{}'", name);
    if (!S_ISREG(st.st_mode)) return fmt::format("holds '{}', which is not a regular file", name);
    if (is_safetensors_name(name)) has_safetensors = true;
  }
  if (any_entry && !has_safetensors) return "holds no .safetensors file";
  return "";
}

// The usage error for an OUTPUT that --force may not replace; why completes
// "it ..." (see replace_refusal).
Error not_replaceable(const std::string& output, const std::string& why) {
  return usage_error(
      fmt::format("OUTPUT {} does not look like a checkpoint directory: it {}; --force replaces "
                  "only an empty directory or one that holds nothing but regular files, at least "
                  "one of them a .safetensors file; remove it yourself, or choose another OUTPUT",
                  output, why));
}

}  // namespace

void check_output_replaceable(const fs::path& output, bool force) {
  std::error_code ec;
  const auto status = fs::symlink_status(output, ec);
  if (!fs::exists(status)) return;
  // Only a directory can be replaced: --force is offered for nothing else.
  if (!fs::is_directory(status)) {
    const char* what = fs::is_regular_file(status) ? "a file"
                       : fs::is_symlink(status)    ? "a symbolic link"
                                                   : "a special file";
    throw usage_error(fmt::format(
        "OUTPUT {} exists and is {}, not a directory: OUTPUT is a checkpoint directory, and "
        "--force replaces only such a directory; choose another OUTPUT, or remove {} yourself",
        output.string(), what, what));
  }
  if (!force) {
    throw usage_error(
        fmt::format("OUTPUT {} already exists (use --force to replace it)", output.string()));
  }
  // The directory commit() would swap out.
  const std::string why = replace_refusal(absolute_normal(output));
  if (!why.empty()) throw not_replaceable(output.string(), why);
}

void check_output_parent(const fs::path& output) {
  const fs::path parent = absolute_normal(output).parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    throw usage_error(
        fmt::format("the directory {} that should hold OUTPUT does not exist", parent.string()));
  }
}

namespace {

// Removes the OUTPUT --force replaced, now under a temporary name; "" or
// the warning that it could not be (e.g. its files are not writable).
std::string removal_warning(const fs::path& old) {
  std::error_code ec;
  remove_directory(old, DirectoryRemoval::kTree, ec);
  if (!ec && !fs::exists(fs::symlink_status(old, ec))) return "";
  return fmt::format(
      "OUTPUT holds the new checkpoint, but the one --force replaced could not be removed "
      "({}): it is left as {}; remove it: rm -rf {}",
      ec ? ec.message() : std::string("some of its entries remain"), old.string(),
      shell_word(old.string()));
}

}  // namespace

std::vector<std::string> unwritable_run_directories(const fs::path& output, bool creates_output,
                                                    const fs::path* stage) {
  std::vector<std::pair<fs::path, const char*>> dirs;
  std::error_code ec;
  if (creates_output) dirs.emplace_back(absolute_normal(output).parent_path(), "its files");
  if (stage != nullptr) {
    const fs::path s = absolute_normal(*stage);
    if (fs::is_directory(s, ec)) {
      dirs.emplace_back(s, "its staged files");
    } else {
      dirs.emplace_back(s.parent_path(), "its staging directory");
    }
  }
  std::vector<std::string> out;
  for (const auto& [dir, what] : dirs) {
    if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK | X_OK) == 0) continue;
    out.push_back(fmt::format("cannot write in {} ({}), where the run would create {}",
                              dir.string(), std::strerror(errno), what));
  }
  return out;
}

StagedOutput::StagedOutput(const fs::path& output, const fs::path& input, bool force)
    : output_(absolute_normal(output)), force_(force) {
  RunPaths paths;
  paths.input = input;
  paths.output = output;
  paths.force = force;
  check_run_paths(paths);
  const fs::path parent = output_.parent_path();
  std::error_code ec;
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const fs::path candidate = parent / fmt::format(".{}{}{}-{:08x}", output_.filename().string(),
                                                    kTempDirMarker, ::getpid(), rd());
    if (fs::create_directory(candidate, ec)) {
      temp_ = candidate;
      return;
    }
    if (ec) {
      const std::string what = fmt::format("{}: cannot create the temporary directory of OUTPUT {}",
                                           candidate.string(), output.string());
      if (ec.value() == ENOSPC || ec.value() == EDQUOT) throw_write_error(what, ec.value());
      throw io_error(fmt::format("{}: {}", what, ec.message()));
    }
  }
  throw io_error(fmt::format("{}: cannot find a free temporary directory name", parent.string()));
}

StagedOutput::~StagedOutput() {
  if (!committed_ && !temp_.empty()) {
    std::error_code ec;
    remove_directory(temp_, DirectoryRemoval::kTree, ec);
  }
}

namespace {

// rename(2) with flags; false with errno EINVAL/ENOSYS when the filesystem or
// kernel does not support them.
bool rename_with_flags(const fs::path& from, const fs::path& to, unsigned flags) {
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) == 0;
}

bool flags_unsupported(int error) { return error == EINVAL || error == ENOSYS || error == ENOTSUP; }

}  // namespace

std::string StagedOutput::commit() {
  std::error_code ec;
  const bool output_exists = fs::exists(fs::symlink_status(output_, ec));
  if (output_exists && !force_) {
    throw usage_error(
        fmt::format("OUTPUT {} appeared while ctquant ran; not replacing it", output_.string()));
  }
  if (!output_exists) {
    // RENAME_NOREPLACE: a plain rename would silently replace an empty
    // directory created at OUTPUT in the meantime.
    if (rename_with_flags(temp_, output_, RENAME_NOREPLACE)) {
      committed_ = true;
      fsync_directory_best_effort(output_.parent_path());
      return "";
    }
    const int error = errno;
    if (error == EEXIST) {
      throw usage_error(
          fmt::format("OUTPUT {} appeared while ctquant ran; not replacing it", output_.string()));
    }
    if (!flags_unsupported(error)) {
      throw io_error(fmt::format("{}: cannot rename the finished output into place: {}",
                                 output_.string(), std::strerror(error)));
    }
  } else {
    // --force: swap the new directory and the old OUTPUT in one step, so that
    // OUTPUT always names a complete checkpoint; the old one is then removed
    // under the temporary name, once it has been checked there (where nothing
    // else renames it) to be still a directory --force may replace. One that
    // appeared or changed since check_output_replaceable is swapped back.
    if (rename_with_flags(temp_, output_, RENAME_EXCHANGE)) {
      const std::string why = replace_refusal(temp_);
      if (!why.empty()) {
        if (rename_with_flags(temp_, output_, RENAME_EXCHANGE)) {
          throw not_replaceable(output_.string(), why);  // the destructor removes the new one
        }
        const int error = errno;
        const fs::path kept = temp_;
        temp_.clear();  // now names the old OUTPUT: never removed
        throw io_error(fmt::format(
            "{}: the existing OUTPUT changed while ctquant ran (it {}) and could not be put back "
            "({}); it is kept as {}, and OUTPUT holds the new checkpoint",
            output_.string(), why, std::strerror(error), kept.string()));
      }
      committed_ = true;
      fsync_directory_best_effort(output_.parent_path());
      return removal_warning(temp_);
    }
    const int error = errno;
    if (!flags_unsupported(error)) {
      throw io_error(fmt::format("{}: cannot swap the finished output into place: {}",
                                 output_.string(), std::strerror(error)));
    }
  }

  // Fallback for filesystems without renameat2 flags: move the old OUTPUT
  // aside (under a recognisable temporary name), rename, remove the old one.
  fs::path aside;
  if (fs::exists(fs::symlink_status(output_, ec))) {
    aside = temp_.string() + "-old";
    fs::rename(output_, aside, ec);
    if (ec) {
      throw io_error(fmt::format("{}: cannot move the existing OUTPUT aside: {}", output_.string(),
                                 ec.message()));
    }
    const std::string why = replace_refusal(aside);
    if (!why.empty()) {
      fs::rename(aside, output_, ec);
      if (ec) {
        throw io_error(fmt::format(
            "{}: the existing OUTPUT changed while ctquant ran (it {}) and could not be put back "
            "({}); it is kept as {}",
            output_.string(), why, ec.message(), aside.string()));
      }
      throw not_replaceable(output_.string(), why);
    }
  }
  fs::rename(temp_, output_, ec);
  if (ec) {
    std::error_code restore_ec;
    if (!aside.empty()) fs::rename(aside, output_, restore_ec);
    throw io_error(fmt::format("{}: cannot rename the finished output into place: {}",
                               output_.string(), ec.message()));
  }
  committed_ = true;
  fsync_directory_best_effort(output_.parent_path());
  return aside.empty() ? std::string() : removal_warning(aside);
}

bool remove_directory(const fs::path& dir, DirectoryRemoval how, std::error_code& ec) {
  ec.clear();
  const auto status = fs::symlink_status(dir, ec);
  if (ec) return false;
  if (!fs::is_directory(status)) {
    ec = std::make_error_code(std::errc::not_a_directory);
    return false;
  }
  if (how == DirectoryRemoval::kIfEmpty) return fs::remove(dir, ec);
  fs::remove_all(dir, ec);
  return !ec;
}

std::uint64_t tree_bytes(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::symlink_status(path, ec);
  if (fs::is_regular_file(status)) {
    const auto size = fs::file_size(path, ec);
    return ec ? 0 : size;
  }
  if (!fs::is_directory(status)) return 0;
  std::uint64_t total = 0;
  for (auto it = fs::recursive_directory_iterator(path, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code item_ec;
    if (it->is_regular_file(item_ec) && !it->is_symlink(item_ec)) {
      const auto size = it->file_size(item_ec);
      if (!item_ec) total += size;
    }
  }
  return total;
}

namespace {

// The pid in a temporary name's tail "<pid>-<random>...", or 0.
int pid_of_temp_tail(std::string_view tail) {
  int pid = 0;
  std::size_t i = 0;
  for (; i < tail.size() && i < 10 && tail[i] >= '0' && tail[i] <= '9'; ++i) {
    pid = pid * 10 + (tail[i] - '0');
  }
  if (i == 0 || i >= tail.size() || tail[i] != '-') return 0;
  return pid;
}

// False only when no process pid exists (kill says ESRCH).
bool process_may_run(int pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// A temporary sibling of path: ".<name>.ctquant-tmp-<pid>-<random>".
fs::path temp_sibling(const fs::path& path) {
  static std::random_device rd;
  const fs::path abs = absolute_normal(path);
  return abs.parent_path() /
         fmt::format(".{}{}{}-{:08x}", abs.filename().string(), kTempDirMarker, ::getpid(), rd());
}

}  // namespace

std::vector<Leftover> find_leftovers(const fs::path& target) {
  const fs::path abs = absolute_normal(target);
  const std::string prefix = fmt::format(".{}{}", abs.filename().string(), kTempDirMarker);
  std::vector<Leftover> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(abs.parent_path(), ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const int pid = pid_of_temp_tail(std::string_view(name).substr(prefix.size()));
    if (pid <= 0 || pid == ::getpid() || process_may_run(pid)) continue;
    std::error_code item_ec;
    found.push_back(Leftover{it->path(), pid, tree_bytes(it->path()),
                             it->is_directory(item_ec) && !it->is_symlink(item_ec)});
  }
  std::sort(found.begin(), found.end(),
            [](const Leftover& a, const Leftover& b) { return a.path < b.path; });
  return found;
}

StagedFile::StagedFile(const fs::path& path, std::string_view text, bool fsync, std::string label)
    : path_(absolute_normal(path)),
      temp_(temp_sibling(path)),
      fsync_(fsync),
      label_(std::move(label)) {
  const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    temp_.clear();
    throw_write_error(fmt::format("{}: cannot create a file beside it", label_), error);
  }
  int error = 0;
  std::size_t done = 0;
  while (done < text.size() && error == 0) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = errno;
    if (n > 0) done += static_cast<std::size_t>(n);
  }
  if (error == 0 && fsync_ && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0 && errno != EINTR) error = errno;
  if (error != 0) {
    std::error_code ec;
    fs::remove(temp_, ec);
    temp_.clear();
    throw_write_error(label_, error);
  }
}

StagedFile::~StagedFile() {
  if (!committed_ && !temp_.empty()) {
    std::error_code ec;
    fs::remove(temp_, ec);
  }
}

void StagedFile::commit() {
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    throw io_error(fmt::format("{}: cannot rename into place: {}", label_, std::strerror(errno)));
  }
  committed_ = true;
  if (fsync_) fsync_directory_best_effort(path_.parent_path());
}

}  // namespace ctquant
