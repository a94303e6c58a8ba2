#include "ctquant/output_dir.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <random>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/error.hpp"
#include "ctquant/safetensors_writer.hpp"
#include "input_file.hpp"

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

}  // namespace

void check_output_path(const fs::path& output, const fs::path& input, bool force) {
  const fs::path out = absolute_normal(output);
  const fs::path in = absolute_normal(input);
  // A single-file input is guarded by its directory: OUTPUT may not be the file itself.
  if (out == in) {
    throw usage_error(fmt::format("OUTPUT {} is the INPUT; choose a new directory",
                                  output.string()));
  }
  if (is_within(out, in)) {
    throw usage_error(fmt::format("OUTPUT {} lies inside INPUT {}; choose a directory outside it",
                                  output.string(), input.string()));
  }
  if (is_within(in, out)) {
    throw usage_error(fmt::format("OUTPUT {} contains INPUT {}; choose a directory that does not",
                                  output.string(), input.string()));
  }
  std::error_code ec;
  const auto status = fs::symlink_status(output, ec);
  if (fs::exists(status) && !force) {
    throw usage_error(fmt::format("OUTPUT {} already exists (use --force to replace it)",
                                  output.string()));
  }
  if (fs::exists(status) && force && !fs::is_directory(status)) {
    throw usage_error(fmt::format("OUTPUT {} exists and is not a directory; ctquant replaces only "
                                  "directories with --force",
                                  output.string()));
  }
}

StagedOutput::StagedOutput(const fs::path& output, const fs::path& input, bool force)
    : output_(absolute_normal(output)), force_(force) {
  check_output_path(output, input, force);
  const fs::path parent = output_.parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    throw usage_error(fmt::format("the directory {} that should hold OUTPUT does not exist",
                                  parent.string()));
  }
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const fs::path candidate =
        parent / fmt::format(".{}{}{}-{:08x}", output_.filename().string(), kTempDirMarker,
                             ::getpid(), rd());
    if (fs::create_directory(candidate, ec)) {
      temp_ = candidate;
      return;
    }
    if (ec) {
      const std::string what =
          fmt::format("{}: cannot create the temporary output directory", candidate.string());
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
    // under the temporary name.
    if (rename_with_flags(temp_, output_, RENAME_EXCHANGE)) {
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
