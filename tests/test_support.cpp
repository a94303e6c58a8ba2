#include "test_support.hpp"

#include "ctquant/scheme/registry.hpp"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ctquant/exec/manifest.hpp"
#include "ctquant/exec/output_dir.hpp"
#include "ctquant/format/safetensors_writer.hpp"

namespace ctquant::test {

namespace fs = std::filesystem;

fs::path golden_dir() { return CTQUANT_GOLDEN_DIR; }
fs::path ctquant_binary() { return CTQUANT_BINARY; }
fs::path make_checkpoint_binary() { return CTQUANT_MAKE_CHECKPOINT; }
fs::path layouts_dir() { return CTQUANT_LAYOUTS_DIR; }

namespace {
// The command line that runs `program` (a binary of this build) with args:
// the binary itself, or, in a cross-compiled build run through an emulator
// (CMAKE_CROSSCOMPILING_EMULATOR, e.g. qemu-aarch64-static), the emulator
// with the binary as its argument. CTQUANT_BINARY_LAUNCHER holds the
// emulator's arguments separated by '|'.
std::vector<std::string> command_line(const fs::path& program,
                                      const std::vector<std::string>& args) {
  std::vector<std::string> command;
  const std::string launcher = CTQUANT_BINARY_LAUNCHER;
  for (std::size_t pos = 0; pos < launcher.size();) {
    const std::size_t end = std::min(launcher.find('|', pos), launcher.size());
    command.push_back(launcher.substr(pos, end - pos));
    pos = end + 1;
  }
  command.push_back(program.string());
  command.insert(command.end(), args.begin(), args.end());
  return command;
}
}  // namespace
fs::path real_dir() { return CTQUANT_REAL_DIR; }

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "ctquant-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests may make files read-only; make them writable again so they can go.
  for (auto it = fs::recursive_directory_iterator(path_, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
  }
  fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(path_, ec);
}

std::vector<std::byte> float_bytes(DType dtype, const std::vector<float>& values) {
  std::vector<std::byte> out;
  for (float v : values) {
    if (dtype == DType::kF32) {
      std::byte b[4];
      std::memcpy(b, &v, 4);
      out.insert(out.end(), b, b + 4);
    } else {
      const std::uint16_t bits = dtype == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
      out.push_back(static_cast<std::byte>(bits & 0xFF));
      out.push_back(static_cast<std::byte>(bits >> 8));
    }
  }
  return out;
}

std::vector<std::byte> u16_bytes(const std::vector<std::uint16_t>& bits) {
  std::vector<std::byte> out;
  for (std::uint16_t b : bits) {
    out.push_back(static_cast<std::byte>(b & 0xFF));
    out.push_back(static_cast<std::byte>(b >> 8));
  }
  return out;
}

FakeTensor random_weight(const std::string& name, DType dtype, std::uint64_t rows,
                         std::uint64_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> values(rows * cols);
  for (float& v : values) v = normal(rng);
  return FakeTensor{name, dtype, {rows, cols}, float_bytes(dtype, values)};
}

void write_safetensors(const fs::path& path, const std::vector<FakeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors)
    specs.push_back(TensorSpec{t.name, t.dtype, t.shape, t.data.size()});
  const ShardLayout layout = layout_shard(specs, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(layout.header.data(), static_cast<std::streamsize>(layout.header.size()));
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size()));
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void write_raw_safetensors(const fs::path& path, const std::string& header,
                           const std::vector<std::byte>& data) {
  std::string bytes(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size());
  write_file(path, bytes);
}

void write_file(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void flip_tensor_data(const fs::path& file) {
  std::string bytes = read_file(file);
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes.at(i));
  for (std::size_t at = 8 + header; at < bytes.size(); at += 2) bytes[at] ^= 0x01;
  write_file(file, bytes);
}

std::vector<std::byte> read_tensor(const fs::path& file, const std::string& name) {
  SafetensorsFile f(file, file.filename().string());
  const TensorEntry* e = f.header().find(name);
  if (e == nullptr) throw std::runtime_error("no tensor " + name + " in " + file.string());
  std::vector<std::byte> bytes(e->byte_size());
  f.read(e->begin, bytes);
  return bytes;
}

namespace {
std::string slurp_fd(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}
}  // namespace

CommandResult run_ctquant(const std::vector<std::string>& args) {
  TempDir capture;
  const fs::path out_path = capture / "stdout";
  const fs::path err_path = capture / "stderr";
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    std::vector<std::string> storage = command_line(ctquant_binary(), args);
    std::vector<char*> argv;
    for (auto& s : storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const int out_fd = ::open(out_path.c_str(), O_RDONLY);
  const int err_fd = ::open(err_path.c_str(), O_RDONLY);
  result.out = slurp_fd(out_fd);
  result.err = slurp_fd(err_fd);
  ::close(out_fd);
  ::close(err_fd);
  return result;
}

void copy_dir(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  for (auto& item : fs::recursive_directory_iterator(to)) {
    fs::permissions(item.path(), fs::perms::owner_write, fs::perm_options::add);
  }
}

QuantizeOptions test_options(const fs::path& input, const fs::path& output) {
  QuantizeOptions options = default_quantize_options();
  options.input = input;
  options.output = output;
  options.threads = 2;
  options.fsync = false;
  return options;
}

QuantArgs& args_of(PlanOptions& options) { return options.groups.front().weights; }

void set_group_size(PlanOptions& options, std::uint64_t group_size) {
  SchemeGroup& g = options.groups.front();
  g.weights.strategy = group_size == 0 ? QuantArgs::Strategy::kChannel : QuantArgs::Strategy::kGroup;
  g.weights.group_size = group_size;
  const Preset* preset = find_preset(g.name);
  if (preset == nullptr || !(preset->weights == g.weights)) g.name = "config_group_0";
}

SchemeGroup int_group(int bits, bool symmetric, std::uint64_t group_size) {
  SchemeGroup g = preset_group("W4A16");
  g.name = "config_group_0";
  g.weights.num_bits = bits;
  g.weights.symmetric = symmetric;
  g.weights.strategy = group_size == 0 ? QuantArgs::Strategy::kChannel : QuantArgs::Strategy::kGroup;
  g.weights.group_size = group_size;
  return g;
}

nlohmann::json single_group_config(const SchemeGroup& group,
                                   const std::vector<std::string>& ignore) {
  PlanOptions options;
  options.groups = {group};
  options.ignore = ignore;
  return plan_quantization_config(options, {1});
}

void write_checkpoint(const fs::path& dir, const std::vector<FakeTensor>& tensors,
                      const nlohmann::json& config) {
  fs::create_directories(dir);
  write_safetensors(dir / "model.safetensors", tensors);
  if (!config.is_null()) write_file(dir / "config.json", config.dump(2));
}

nlohmann::json read_json(const fs::path& path) { return nlohmann::json::parse(read_file(path)); }

void expect_message(const std::string& message, const std::vector<std::string>& present,
                    const std::vector<std::string>& absent) {
  for (const std::string& f : present) {
    EXPECT_NE(message.find(f), std::string::npos) << "missing '" << f << "' in:\n" << message;
  }
  for (const std::string& f : absent) {
    EXPECT_EQ(message.find(f), std::string::npos) << "unexpected '" << f << "' in:\n" << message;
  }
}

std::map<std::string, std::string> snapshot_files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& item : fs::recursive_directory_iterator(dir)) {
    if (item.is_regular_file()) {
      files.emplace(fs::relative(item.path(), dir).string(), read_file(item.path()));
    }
  }
  return files;
}

std::vector<std::string> temp_leftovers(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    if (name.find(kTempDirMarker) != std::string::npos) names.push_back(name);
  }
  return names;
}

namespace {

std::set<std::string> file_names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& item : fs::recursive_directory_iterator(dir)) {
    if (!item.is_directory()) names.insert(fs::relative(item.path(), dir).string());
  }
  return names;
}

std::string diff_file_sets(const fs::path& actual, const fs::path& expected) {
  std::set<std::string> a = file_names(actual);
  const std::set<std::string> e = file_names(expected);
  // ctquant's outputs carry a manifest; the golden fixtures (written by the
  // reference) do not. Then the manifest is checked against the files it
  // lists instead of against the fixture.
  if (a.contains(kManifestFileName) && !e.contains(kManifestFileName)) {
    const ManifestCheck check = check_manifest(actual, 1);
    if (!check.ok()) {
      return fmt::format("{}: {}", kManifestFileName, render_manifest_check_text(check));
    }
    a.erase(kManifestFileName);
  }
  for (const std::string& name : e) {
    if (!a.contains(name)) return fmt::format("{}: missing from {}", name, actual.string());
  }
  for (const std::string& name : a) {
    if (!e.contains(name))
      return fmt::format("{}: not expected (absent from {})", name, expected.string());
  }
  return {};
}

// The offset of the first byte where a and b differ (or the shorter length).
std::size_t first_difference(std::string_view a, std::string_view b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<std::size_t>(ia - a.begin());
}

}  // namespace

std::string diff_safetensors(const fs::path& actual, const fs::path& expected) {
  const SafetensorsFile a(actual, actual.filename().string());
  const SafetensorsFile e(expected, expected.filename().string());
  const std::string label = expected.filename().string();
  if (a.header().metadata != e.header().metadata) {
    return fmt::format("{}: __metadata__ differs", label);
  }
  std::vector<const TensorEntry*> expected_tensors;
  for (const TensorEntry& t : e.header().tensors) expected_tensors.push_back(&t);
  std::sort(expected_tensors.begin(), expected_tensors.end(),
            [](const TensorEntry* x, const TensorEntry* y) { return x->name < y->name; });
  for (const TensorEntry* et : expected_tensors) {
    const TensorEntry* at = a.header().find(et->name);
    if (at == nullptr) return fmt::format("{}: tensor '{}' is missing", label, et->name);
    if (at->dtype != et->dtype) {
      return fmt::format("{}: tensor '{}' has dtype {}, expected {}", label, et->name,
                         dtype_tag(at->dtype), dtype_tag(et->dtype));
    }
    if (at->shape != et->shape) {
      return fmt::format("{}: tensor '{}' has shape {}, expected {}", label, et->name,
                         shape_string(at->shape), shape_string(et->shape));
    }
    std::string ab(at->byte_size(), '\0');
    std::string eb(et->byte_size(), '\0');
    a.read(at->begin, std::as_writable_bytes(std::span(ab)));
    e.read(et->begin, std::as_writable_bytes(std::span(eb)));
    if (ab != eb) {
      const std::size_t at_byte = first_difference(ab, eb);
      return fmt::format(
          "{}: tensor '{}' differs first at byte {} of {} (0x{:02x}, expected 0x{:02x})", label,
          et->name, at_byte, eb.size(), static_cast<unsigned char>(ab[at_byte]),
          static_cast<unsigned char>(eb[at_byte]));
    }
  }
  for (const TensorEntry& t : a.header().tensors) {
    if (e.header().find(t.name) == nullptr) {
      return fmt::format("{}: tensor '{}' is not expected", label, t.name);
    }
  }
  return {};
}

std::string diff_checkpoints(const fs::path& actual, const fs::path& expected) {
  if (std::string d = diff_file_sets(actual, expected); !d.empty()) return d;
  for (const std::string& name : file_names(expected)) {
    const fs::path a = actual / name;
    const fs::path e = expected / name;
    if (name.ends_with(".safetensors")) {
      if (std::string d = diff_safetensors(a, e); !d.empty()) return d;
    } else if (name == "config.json" || name == "model.safetensors.index.json") {
      const nlohmann::json aj = read_json(a);
      const nlohmann::json ej = read_json(e);
      if (aj != ej) {
        return fmt::format(
            "{}: JSON differs from the expected one; patch from actual to "
            "expected: {}",
            name, nlohmann::json::diff(aj, ej).dump());
      }
    } else if (read_file(a) != read_file(e)) {
      return fmt::format("{}: differs first at byte {}", name,
                         first_difference(read_file(a), read_file(e)));
    }
  }
  return {};
}

namespace {

struct StoredTensor {
  std::string file;
  DType dtype{};
  std::vector<std::uint64_t> shape;
  std::string bytes;
};

// Every tensor of a checkpoint directory, by name.
std::map<std::string, StoredTensor> all_tensors(const fs::path& dir) {
  std::map<std::string, StoredTensor> out;
  for (const std::string& name : file_names(dir)) {
    if (!name.ends_with(".safetensors")) continue;
    const SafetensorsFile f(dir / name, name);
    for (const TensorEntry& t : f.header().tensors) {
      StoredTensor s{name, t.dtype, t.shape, std::string(t.byte_size(), '\0')};
      f.read(t.begin, std::as_writable_bytes(std::span(s.bytes)));
      out[t.name] = std::move(s);
    }
  }
  return out;
}

// An index against the tensors of its own directory.
std::string check_index_file(const fs::path& dir, const std::map<std::string, StoredTensor>& t) {
  const nlohmann::json index = read_json(dir / "model.safetensors.index.json");
  std::uint64_t total = 0;
  for (const auto& [name, s] : t) total += s.bytes.size();
  if (index["metadata"]["total_size"] != total) {
    return fmt::format("{}: index total_size {} but the shards hold {} bytes", dir.string(),
                       index["metadata"]["total_size"].dump(), total);
  }
  const nlohmann::json& wm = index["weight_map"];
  if (wm.size() != t.size()) {
    return fmt::format("{}: index lists {} tensors, the shards hold {}", dir.string(), wm.size(),
                       t.size());
  }
  for (const auto& [name, s] : t) {
    if (!wm.contains(name) || wm[name] != s.file) {
      return fmt::format("{}: index does not place '{}' in '{}'", dir.string(), name, s.file);
    }
  }
  return {};
}

}  // namespace

std::string diff_golden(const fs::path& actual, const fs::path& expected, bool group_keys) {
  const std::set<std::string> actual_files = file_names(actual);
  for (const std::string& name : file_names(expected)) {
    if (!actual_files.contains(name) && !name.ends_with(".safetensors")) {
      return fmt::format("{} is missing", name);
    }
  }
  const auto a = all_tensors(actual);
  const auto e = all_tensors(expected);
  for (const auto& [name, et] : e) {
    const auto it = a.find(name);
    if (it == a.end()) return fmt::format("tensor '{}' is missing", name);
    const StoredTensor& at = it->second;
    if (at.dtype != et.dtype) {
      return fmt::format("tensor '{}' has dtype {}, expected {}", name, dtype_tag(at.dtype),
                         dtype_tag(et.dtype));
    }
    if (at.shape != et.shape) {
      return fmt::format("tensor '{}' has shape {}, expected {}", name, shape_string(at.shape),
                         shape_string(et.shape));
    }
    if (at.bytes != et.bytes) {
      const std::size_t at_byte = first_difference(at.bytes, et.bytes);
      return fmt::format("tensor '{}' differs first at byte {} of {} (0x{:02x}, expected 0x{:02x})",
                         name, at_byte, et.bytes.size(), static_cast<unsigned char>(at.bytes[at_byte]),
                         static_cast<unsigned char>(et.bytes[at_byte]));
    }
  }
  for (const auto& [name, at] : a) {
    if (!e.contains(name)) return fmt::format("tensor '{}' is not expected", name);
  }
  for (const auto& [dir, tensors] : {std::pair{actual, &a}, std::pair{expected, &e}}) {
    if (fs::exists(dir / "model.safetensors.index.json")) {
      if (std::string d = check_index_file(dir, *tensors); !d.empty()) return d;
    }
  }
  nlohmann::json ac = read_json(actual / "config.json");
  nlohmann::json ec = read_json(expected / "config.json");
  if (!group_keys) {
    for (nlohmann::json* c : {&ac, &ec}) {
      nlohmann::json& groups = (*c)["quantization_config"]["config_groups"];
      nlohmann::json values = nlohmann::json::array();
      for (const auto& [k, v] : groups.items()) values.push_back(v);
      groups = values;
    }
  }
  if (ac != ec) {
    return fmt::format("config.json: JSON differs from the expected one; patch from actual to "
                       "expected: {}",
                       nlohmann::json::diff(ac, ec).dump());
  }
  for (const std::string& name : file_names(expected)) {
    if (name.ends_with(".safetensors") || name == "config.json" ||
        name == "model.safetensors.index.json") {
      continue;
    }
    if (read_file(actual / name) != read_file(expected / name)) {
      return fmt::format("{}: differs first at byte {}", name,
                         first_difference(read_file(actual / name), read_file(expected / name)));
    }
  }
  return {};
}

std::string diff_bytes(const fs::path& actual, const fs::path& expected) {
  if (std::string d = diff_file_sets(actual, expected); !d.empty()) return d;
  for (const std::string& name : file_names(expected)) {
    const std::string a = read_file(actual / name);
    const std::string e = read_file(expected / name);
    if (a != e) {
      return fmt::format("{}: differs first at byte {} (sizes {} and {})", name,
                         first_difference(a, e), a.size(), e.size());
    }
  }
  return {};
}

}  // namespace ctquant::test

// ---- child processes, temporary output directories, large inputs ----

namespace ctquant::test {

namespace {

#if defined(__x86_64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
constexpr std::uint32_t kAuditArch = 0;
#endif

// The seccomp program of RunOptions::forbid_threads: for this architecture's
// system calls, clone3 -> ENOSYS, clone with CLONE_THREAD in its flags (the
// first argument, low 32 bits) -> EPERM; everything else allowed.
std::vector<sock_filter> no_thread_filter() {
  constexpr std::uint32_t kAllow = SECCOMP_RET_ALLOW;
  return {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, kAllow),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, kAllow),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, kAllow),
  };
}

}  // namespace

bool filters_threads_supported() {
  return kAuditArch != 0 && std::string(CTQUANT_BINARY_LAUNCHER).empty();
}

CtquantProcess::CtquantProcess(const std::vector<std::string>& args, const RunOptions& options)
    : CtquantProcess(ctquant_binary(), args, options) {}

CtquantProcess::CtquantProcess(const fs::path& program, const std::vector<std::string>& args,
                               const RunOptions& options) {
  const fs::path out_path = capture_ / "stdout";
  const fs::path err_path = capture_ / "stderr";
  std::vector<std::string> storage = options.host_program ? std::vector<std::string>{}
                                                            : command_line(program, args);
  if (options.host_program) {
    storage.push_back(program.string());
    storage.insert(storage.end(), args.begin(), args.end());
  }
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  // The child's environment, built before fork (nothing allocates after it).
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(options.env.begin(), options.env.end(), [&](const std::string& x) {
      return x.substr(0, x.find('=')) == name;
    });
    if (!replaced) env_storage.push_back(entry);
  }
  env_storage.insert(env_storage.end(), options.env.begin(), options.env.end());
  std::vector<char*> envp;
  for (auto& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);
  if (options.forbid_threads && !filters_threads_supported()) {
    throw std::runtime_error("RunOptions::forbid_threads: not supported here");
  }
  std::vector<sock_filter> filter = no_thread_filter();
  const sock_fprog program_filter{static_cast<unsigned short>(filter.size()), filter.data()};
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    // Start from default dispositions even if the test runner ignores some
    // signals (e.g. run in the background by a script).
    for (const int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGXFSZ}) {
      ::signal(signal_number, SIG_DFL);
    }
    if (options.file_size_limit > 0) {
      const rlimit limit{options.file_size_limit, options.file_size_limit};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(126);
    }
    if (options.open_files_limit > 0) {
      const rlimit limit{options.open_files_limit, options.open_files_limit};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(126);
    }
    if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) ::_exit(125);
    if (options.forbid_threads &&
        (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
         ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program_filter) != 0)) {
      ::_exit(124);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
}

CtquantProcess::~CtquantProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

bool CtquantProcess::running() const {
  if (pid_ <= 0) return false;
  siginfo_t info{};
  // WNOWAIT: look without reaping, so that wait() still gets the status.
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return false;
  }
  return info.si_pid == 0;
}

void CtquantProcess::signal(int signal_number) const {
  if (pid_ > 0) ::kill(pid_, signal_number);
}

std::string CtquantProcess::stderr_so_far() const {
  std::ifstream in(capture_ / "stderr", std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool CtquantProcess::catches(int signal_number) const {
  if (pid_ <= 0) return false;
  std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("SigCgt:")) continue;
    const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    return ((mask >> (signal_number - 1)) & 1u) != 0;
  }
  return false;
}

CommandResult CtquantProcess::wait() {
  if (pid_ <= 0) throw std::runtime_error("CtquantProcess::wait: no child");
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  }
  pid_ = -1;
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_file(capture_ / "stdout");
  result.err = read_file(capture_ / "stderr");
  return result;
}

CommandResult run_ctquant(const std::vector<std::string>& args, const RunOptions& options) {
  CtquantProcess process(args, options);
  return process.wait();
}

CommandResult run_make_checkpoint(const std::vector<std::string>& args) {
  CtquantProcess process(make_checkpoint_binary(), args, RunOptions{});
  return process.wait();
}

namespace {
// What a shell script runs as "$CTQUANT": the binary, or, in a build run
// through an emulator (CTQUANT_BINARY_LAUNCHER), a script that starts the
// binary under it (the kernel cannot run it directly without binfmt_misc).
fs::path shell_ctquant() {
  if (std::string(CTQUANT_BINARY_LAUNCHER).empty()) return ctquant_binary();
  static const TempDir dir;
  static const fs::path wrapper = [] {
    const fs::path path = dir / "ctquant";
    std::string text = "#!/bin/sh\nexec";
    for (const std::string& word : command_line(ctquant_binary(), {})) text += " '" + word + "'";
    write_file(path, text + " \"$@\"\n");
    fs::permissions(path, fs::perms::owner_all);
    return path;
  }();
  return wrapper;
}
}  // namespace

CommandResult run_shell(const std::string& script, const RunOptions& options) {
  RunOptions with_binary = options;
  with_binary.env.push_back("CTQUANT=" + shell_ctquant().string());
  with_binary.host_program = true;
  CtquantProcess process("/bin/sh", {"-c", script}, with_binary);
  return process.wait();
}

void write_large_checkpoint(const fs::path& dir, std::uint64_t n_weights, std::uint64_t rows,
                            std::uint64_t cols) {
  fs::create_directories(dir);
  std::vector<TensorSpec> specs;
  for (std::uint64_t i = 0; i < n_weights; ++i) {
    specs.push_back(TensorSpec{"model.layers." + std::to_string(i) + ".mlp.down_proj.weight",
                               DType::kBF16,
                               {rows, cols},
                               rows * cols * 2});
  }
  const ShardLayout layout = layout_shard(specs, {{"format", "pt"}});
  std::ofstream out(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(layout.header.data(), static_cast<std::streamsize>(layout.header.size()));
  // BF16 values with the exponent of about 0.01 and pseudo-random mantissas.
  std::vector<std::uint16_t> block(1u << 16);
  std::uint32_t state = 12345;
  for (auto& v : block) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<std::uint16_t>(0x3C00u | ((state >> 16) & 0x80FFu));
  }
  std::uint64_t left = layout.file_size - layout.data_start;
  while (left > 0) {
    const std::uint64_t n = std::min<std::uint64_t>(left, block.size() * 2);
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n));
    left -= n;
  }
  if (!out) throw std::runtime_error("cannot write " + (dir / "model.safetensors").string());
  write_file(dir / "config.json", "{\"model_type\": \"llama\"}\n");
}

}  // namespace ctquant::test
