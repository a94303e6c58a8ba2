#include "ctquant/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ctquant/checked.hpp"
#include "ctquant/error.hpp"

namespace ctquant {
namespace {

using nlohmann::json;

// Byte offset of the first byte that is not part of a well-formed UTF-8
// sequence, or npos.
std::size_t first_invalid_utf8(std::string_view s) {
  std::size_t i = 0;
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < s.size()) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
                          (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string where(const std::string& file, const std::string& tensor) {
  return fmt::format("{}: tensor '{}'", file, tensor);
}

TensorEntry parse_entry(const std::string& file, const std::string& name, const json& value) {
  TensorEntry entry;
  entry.name = name;
  if (!value.is_object()) {
    throw bad_input(fmt::format("{}: entry is {}, expected an object with dtype, shape and "
                                "data_offsets",
                                where(file, name), value.type_name()));
  }
  const auto dtype_it = value.find("dtype");
  const auto shape_it = value.find("shape");
  const auto offsets_it = value.find("data_offsets");
  for (const auto& [key, it] : {std::pair{"dtype", dtype_it}, std::pair{"shape", shape_it},
                                std::pair{"data_offsets", offsets_it}}) {
    if (it == value.end()) {
      throw bad_input(fmt::format("{}: entry has no '{}' (every tensor needs dtype, shape and "
                                  "data_offsets)",
                                  where(file, name), key));
    }
  }
  if (!dtype_it->is_string()) {
    throw bad_input(fmt::format("{}: dtype is {}, expected a string tag such as \"BF16\"",
                                where(file, name), dtype_it->dump()));
  }
  const auto dtype = dtype_from_tag(dtype_it->get_ref<const std::string&>());
  if (!dtype) {
    throw bad_input(fmt::format("{}: unknown dtype \"{}\"", where(file, name),
                                dtype_it->get_ref<const std::string&>()));
  }
  entry.dtype = *dtype;

  if (!shape_it->is_array()) {
    throw bad_input(fmt::format("{}: shape is {}, expected an array of non-negative integers",
                                where(file, name), shape_it->dump()));
  }
  std::uint64_t numel = 1;
  bool numel_overflow = false;
  for (const json& dim : *shape_it) {
    if (!dim.is_number_unsigned()) {
      throw bad_input(fmt::format("{}: shape {} has dimension {}, expected a non-negative integer",
                                  where(file, name), shape_it->dump(), dim.dump()));
    }
    const std::uint64_t d = dim.get<std::uint64_t>();
    entry.shape.push_back(d);
    if (!checked_mul(numel, d, numel)) numel_overflow = true;
  }
  // A zero dimension makes the element count 0 whatever the others are, as
  // in the reference reader; overflow only matters when no dimension is 0.
  const bool has_zero = std::find(entry.shape.begin(), entry.shape.end(), 0u) != entry.shape.end();
  if (numel_overflow && !has_zero) {
    throw bad_input(fmt::format("{}: shape {} has more than 2^64 elements", where(file, name),
                                shape_it->dump()));
  }
  if (has_zero) numel = 0;
  std::uint64_t bits = 0;
  if (!checked_mul(numel, static_cast<std::uint64_t>(dtype_bits(entry.dtype)), bits)) {
    throw bad_input(fmt::format("{}: shape {} of {} overflows 64 bits of size",
                                where(file, name), shape_it->dump(), dtype_tag(entry.dtype)));
  }
  if (bits % 8 != 0) {
    throw bad_input(fmt::format("{}: {} {} holds {} bits, not a whole number of bytes",
                                where(file, name), dtype_tag(entry.dtype), shape_it->dump(), bits));
  }

  if (!offsets_it->is_array() || offsets_it->size() != 2 || !(*offsets_it)[0].is_number_unsigned() ||
      !(*offsets_it)[1].is_number_unsigned()) {
    throw bad_input(fmt::format("{}: data_offsets {} must be two non-negative integers [begin, end]",
                                where(file, name), offsets_it->dump()));
  }
  entry.begin = (*offsets_it)[0].get<std::uint64_t>();
  entry.end = (*offsets_it)[1].get<std::uint64_t>();
  if (entry.end < entry.begin) {
    throw bad_input(fmt::format("{}: data_offsets [{}, {}] end before they begin",
                                where(file, name), entry.begin, entry.end));
  }
  if (entry.end - entry.begin != bits / 8) {
    throw bad_input(fmt::format("{}: data_offsets [{}, {}] hold {} bytes, expected {} for {} {}",
                                where(file, name), entry.begin, entry.end, entry.end - entry.begin,
                                bits / 8, dtype_tag(entry.dtype), shape_string(entry.shape)));
  }
  return entry;
}

}  // namespace

std::uint64_t TensorEntry::numel() const {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) n *= d;  // validated by parse_header
  return n;
}

const TensorEntry* SafetensorsHeader::find(std::string_view name) const {
  const auto it = by_name.find(std::string(name));
  return it == by_name.end() ? nullptr : &tensors[it->second];
}

std::string shape_string(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

SafetensorsHeader parse_header(std::string_view header_json, std::uint64_t file_size,
                               const std::string& file_label) {
  SafetensorsHeader header;
  header.header_size = header_json.size();
  if (header.header_size > kMaxHeaderBytes) {
    throw bad_input(fmt::format("{}: header is {} bytes, more than the limit of {}", file_label,
                                header.header_size, kMaxHeaderBytes));
  }
  header.data_start = 8 + header.header_size;
  if (header.data_start > file_size) {
    throw bad_input(fmt::format("{}: header length {} runs past the end of the {}-byte file",
                                file_label, header.header_size, file_size));
  }
  header.data_size = file_size - header.data_start;
  if (const auto bad = first_invalid_utf8(header_json); bad != std::string_view::npos) {
    throw bad_input(fmt::format("{}: header is not valid UTF-8 (byte {} of the header)",
                                file_label, bad));
  }

  // Detect duplicate top-level keys while parsing: JSON parsers keep the last
  // value of a repeated key, which would silently drop a tensor.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event,
                                               json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(header_json.begin(), header_json.end(), on_event);
  } catch (const json::parse_error& e) {
    throw bad_input(fmt::format("{}: header is not valid JSON ({})", file_label, e.what()));
  }
  if (!root.is_object()) {
    throw bad_input(fmt::format("{}: header is a JSON {}, expected an object", file_label,
                                root.type_name()));
  }
  if (!duplicate.empty()) {
    throw bad_input(fmt::format("{}: tensor '{}' appears twice in the header", file_label,
                                duplicate));
  }

  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      // null is "no metadata": the reference reader's field is an
      // Option<HashMap<String, String>>, and MLX writes null.
      if (it->is_null()) continue;
      if (!it->is_object()) {
        throw bad_input(fmt::format("{}: __metadata__ is a JSON {}, expected an object of strings",
                                    file_label, it->type_name()));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          throw bad_input(fmt::format("{}: __metadata__ value of '{}' is {}, expected a string",
                                      file_label, m.key(), m->dump()));
        }
        header.metadata.emplace(m.key(), m->get<std::string>());
      }
      header.has_metadata = true;
      continue;
    }
    header.tensors.push_back(parse_entry(file_label, it.key(), *it));
  }

  // Tiling: sorted by begin, every tensor starts where the previous ended,
  // the first at 0 and the last at the end of the file.
  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const TensorEntry& a, const TensorEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  std::uint64_t cursor = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& t : header.tensors) {
    if (t.begin < cursor) {
      throw bad_input(fmt::format("{}: data_offsets [{}, {}] overlap tensor '{}' (which ends at {})",
                                  where(file_label, t.name), t.begin, t.end, previous->name,
                                  cursor));
    }
    if (t.begin > cursor) {
      throw bad_input(fmt::format("{}: data_offsets [{}, {}] leave a gap of {} bytes after {}",
                                  where(file_label, t.name), t.begin, t.end, t.begin - cursor,
                                  previous ? fmt::format("tensor '{}'", previous->name)
                                           : std::string("the start of the data buffer")));
    }
    cursor = t.end;
    previous = &t;
  }
  if (cursor != header.data_size) {
    if (cursor > header.data_size) {
      throw bad_input(fmt::format("{}: data_offsets [{}, {}] run past the end of the data buffer "
                                  "({} bytes)",
                                  where(file_label, previous->name), previous->begin,
                                  previous->end, header.data_size));
    }
    throw bad_input(fmt::format("{}: tensor data ends at byte {} of the data buffer but the file "
                                "holds {} more bytes (the buffer must end at the end of the file)",
                                file_label, cursor, header.data_size - cursor));
  }
  for (std::size_t i = 0; i < header.tensors.size(); ++i) {
    header.by_name.emplace(header.tensors[i].name, i);
  }
  return header;
}

namespace {

void read_exact(int fd, std::uint64_t offset, std::span<std::byte> out, const std::string& label) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error(fmt::format("{}: read of {} bytes at offset {} failed: {}", label,
                                 out.size(), offset, std::strerror(errno)));
    }
    if (n == 0) {
      throw io_error(fmt::format("{}: file ended at offset {} while reading {} bytes at {} (was it "
                                 "truncated while ctquant ran?)",
                                 label, offset + done, out.size(), offset));
    }
    done += static_cast<std::size_t>(n);
  }
}

int open_regular_file(const std::filesystem::path& path, const std::string& label,
                      std::uint64_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw io_error(fmt::format("{}: cannot open: {}", label, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw bad_input(fmt::format("{}: not a regular file", label));
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

SafetensorsHeader read_header_fd(int fd, std::uint64_t file_size, const std::string& label) {
  if (file_size < 8) {
    throw bad_input(fmt::format("{}: file is {} bytes, too short to hold the 8-byte header length",
                                label, file_size));
  }
  std::array<std::byte, 8> prefix{};
  read_exact(fd, 0, prefix, label);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(prefix[i]);
  if (n > kMaxHeaderBytes) {
    throw bad_input(fmt::format("{}: header length is {} bytes, more than the limit of {}", label,
                                n, kMaxHeaderBytes));
  }
  if (n > file_size - 8) {
    throw bad_input(fmt::format("{}: header length {} runs past the end of the {}-byte file", label,
                                n, file_size));
  }
  std::string text(n, '\0');
  read_exact(fd, 8, std::as_writable_bytes(std::span(text)), label);
  return parse_header(text, file_size, label);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path, std::string label)
    : path_(path), label_(std::move(label)) {
  fd_ = open_regular_file(path_, label_, file_size_);
  try {
    header_ = read_header_fd(fd_, file_size_, label_);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      label_(std::move(other.label_)),
      fd_(std::exchange(other.fd_, -1)),
      file_size_(other.file_size_),
      header_(std::move(other.header_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    label_ = std::move(other.label_);
    fd_ = std::exchange(other.fd_, -1);
    file_size_ = other.file_size_;
    header_ = std::move(other.header_);
  }
  return *this;
}

void SafetensorsFile::read(std::uint64_t offset, std::span<std::byte> out) const {
  read_exact(fd_, header_.data_start + offset, out, label_);
}

SafetensorsHeader read_header(const std::filesystem::path& path, const std::string& label) {
  std::uint64_t size = 0;
  const int fd = open_regular_file(path, label, size);
  try {
    auto header = read_header_fd(fd, size, label);
    ::close(fd);
    return header;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

}  // namespace ctquant
