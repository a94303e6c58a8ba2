#include "ctquant/exec/output_dir.hpp"

#include <dirent.h>
#include <fcntl.h>
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

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/format/safetensors_writer.hpp"
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

bool is_within(const fs::path& inner, const fs::path& outer) {
  return detail::path_is_within(inner, outer);
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
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

void check_output_path(const fs::path& output, const fs::path& input, bool force) {
  const fs::path out = absolute_normal(output);
  const fs::path in = absolute_normal(input);
  // A single-file input is guarded by its directory: OUTPUT may not be the file itself.
  if (out == in) {
    throw usage_error(
        fmt::format("OUTPUT {} is the INPUT; choose a new directory", output.string()));
  }
  if (is_within(out, in)) {
    throw usage_error(fmt::format("OUTPUT {} lies inside INPUT {}; choose a directory outside it",
                                  output.string(), input.string()));
  }
  if (is_within(in, out)) {
    throw usage_error(fmt::format("OUTPUT {} contains INPUT {}; choose a directory that does not",
                                  output.string(), input.string()));
  }
  // Replacing the current working directory, or a directory above it, would
  // leave the shell that ran ctquant in a deleted directory.
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) {
    const fs::path here = absolute_normal(cwd);
    if (here == out) {
      throw usage_error(
          fmt::format("OUTPUT {} is the current working directory; ctquant never replaces it: "
                      "choose another OUTPUT",
                      output.string()));
    }
    if (is_within(here, out)) {
      throw usage_error(
          fmt::format("OUTPUT {} contains the current working directory {}; ctquant never replaces "
                      "it: choose another OUTPUT, or run ctquant from a directory outside it",
                      output.string(), here.string()));
    }
  }
  const auto status = fs::symlink_status(output, ec);
  if (fs::exists(status) && !force) {
    throw usage_error(
        fmt::format("OUTPUT {} already exists (use --force to replace it)", output.string()));
  }
  if (fs::exists(status) && force && !fs::is_directory(status)) {
    throw usage_error(
        fmt::format("OUTPUT {} exists and is not a directory; ctquant replaces only "
                    "directories with --force",
                    output.string()));
  }
  if (fs::exists(status) && force) {
    // The directory commit() would swap out: out, with symbolic links resolved.
    const std::string why = replace_refusal(out);
    if (!why.empty()) throw not_replaceable(output.string(), why);
  }
}

void check_output_parent(const fs::path& output) {
  const fs::path parent = absolute_normal(output).parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    throw usage_error(
        fmt::format("the directory {} that should hold OUTPUT does not exist", parent.string()));
  }
}

StagedOutput::StagedOutput(const fs::path& output, const fs::path& input, bool force)
    : output_(absolute_normal(output)), force_(force) {
  check_output_path(output, input, force);
  check_output_parent(output);
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
      const std::string what =
          fmt::format("{}: cannot create the temporary directory of OUTPUT {}",
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
    fs::remove_all(temp_, ec);
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

void StagedOutput::commit() {
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
      fsync_dir(output_.parent_path());
      return;
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
    // appeared or changed since check_output_path is swapped back.
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
      fsync_dir(output_.parent_path());
      fs::remove_all(temp_, ec);
      return;
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
  fsync_dir(output_.parent_path());
  if (!aside.empty()) fs::remove_all(aside, ec);
}

}  // namespace ctquant
