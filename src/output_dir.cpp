#include "ctquant/output_dir.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <random>
#include <system_error>

#include <fmt/format.h>

#include "ctquant/error.hpp"

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

// True when `inner` is `outer` or lies below it.
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
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
      throw io_error(fmt::format("{}: cannot create the temporary output directory: {}",
                                 candidate.string(), ec.message()));
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

void StagedOutput::commit() {
  std::error_code ec;
  fs::path aside;
  if (fs::exists(fs::symlink_status(output_, ec))) {
    if (!force_) {
      throw usage_error(fmt::format("OUTPUT {} appeared while ctquant ran; not replacing it",
                                    output_.string()));
    }
    aside = temp_.string() + "-old";
    fs::rename(output_, aside, ec);
    if (ec) {
      throw io_error(fmt::format("{}: cannot move the existing OUTPUT aside: {}", output_.string(),
                                 ec.message()));
    }
  }
  fs::rename(temp_, output_, ec);
  if (ec) {
    if (!aside.empty()) fs::rename(aside, output_);
    throw io_error(fmt::format("{}: cannot rename the finished output into place: {}",
                               output_.string(), ec.message()));
  }
  committed_ = true;
  fsync_dir(output_.parent_path());
  if (!aside.empty()) fs::remove_all(aside, ec);
}

}  // namespace ctquant
