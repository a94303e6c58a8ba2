#include "ctquant/format/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>
#include <nlohmann/json.hpp>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ctquant/util/cancel.hpp"
#include "ctquant/util/checked.hpp"
#include "ctquant/util/error.hpp"
#include "util/input_file.hpp"
#include "util/utf8.hpp"

namespace ctquant {
namespace {

// What a file that ends before its header's tensors says (section 1 of the
// format spec): most often a download or copy cut short.
constexpr std::string_view kTruncatedHint =
    "; the file is shorter than its header says (truncated? a file holds its header and then "
    "every tensor's bytes: section 1 of the format spec, docs/format.md)";

using nlohmann::json;

std::string where(const std::string& file, const std::string& tensor) {
  return fmt::format("{}: tensor '{}'", file, tensor);
}

// A JSON string as it appears in a message: quoted, escaped to ASCII and cut
// to a readable length.
std::string json_quote(const std::string& s) {
  constexpr std::size_t kMaxShown = 64;
  const bool cut = s.size() > kMaxShown;
  std::string text = json(cut ? s.substr(0, kMaxShown) : s)
                         .dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  if (cut) text += "...";
  return text;
}

// One scalar JSON value as the SAX parser reports it.
struct Scalar {
  enum class Kind { kNull, kBool, kUnsigned, kNegative, kFloat, kString };
  Kind kind = Kind::kNull;
  std::uint64_t value = 0;            // kUnsigned
  std::int64_t negative = 0;          // kNegative
  bool boolean = false;               // kBool
  const std::string* text = nullptr;  // kString: the string; kFloat: the number as written

  // "a JSON string (\"pt\")": the kind and the value, for a value of the
  // wrong kind.
  std::string kind_and_value() const {
    const char* type = kind == Kind::kNull     ? "null"
                       : kind == Kind::kBool   ? "boolean"
                       : kind == Kind::kString ? "string"
                                               : "number";
    if (kind == Kind::kNull) return "a JSON null";
    return fmt::format("a JSON {} ({})", type, describe());
  }

  // How the value reads in a message.
  std::string describe() const {
    switch (kind) {
      case Kind::kNull:
        return "null";
      case Kind::kBool:
        return boolean ? "true" : "false";
      case Kind::kUnsigned:
        return std::to_string(value);
      case Kind::kNegative:
        return std::to_string(negative);
      case Kind::kFloat:
        return text->size() > 64 ? text->substr(0, 64) + "..." : *text;
      case Kind::kString:
        return json_quote(*text);
    }
    return "?";
  }
};

// The fields of one header entry as read, before validation.
struct RawEntry {
  std::string name;
  bool has_dtype = false;
  bool has_shape = false;
  bool has_offsets = false;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint64_t> offsets;
};

// Section 1 of the format spec for one entry: every field present and of the
// right kind, a known dtype, a byte size that fits 64 bits and is a whole
// number of bytes, and data_offsets [begin, end] holding exactly that size.
TensorEntry validate_entry(const std::string& file, RawEntry& raw) {
  const std::string at = where(file, raw.name);
  for (const auto& [key, present] :
       {std::pair{"dtype", raw.has_dtype}, std::pair{"shape", raw.has_shape},
        std::pair{"data_offsets", raw.has_offsets}}) {
    if (!present) {
      throw bad_input(
          fmt::format("{}: entry has no '{}' (every tensor needs dtype, shape and "
                      "data_offsets)",
                      at, key));
    }
  }
  TensorEntry entry;
  entry.name = std::move(raw.name);
  const auto dtype = dtype_from_tag(raw.dtype);
  if (!dtype) throw bad_input(fmt::format("{}: unknown dtype {}", at, json_quote(raw.dtype)));
  entry.dtype = *dtype;
  entry.shape = std::move(raw.shape);

  std::uint64_t numel = 1;
  bool numel_overflow = false;
  for (const std::uint64_t d : entry.shape) {
    if (!checked_mul(numel, d, numel)) numel_overflow = true;
  }
  // A zero dimension makes the element count 0 whatever the others are;
  // overflow only matters when no dimension is 0.
  const bool has_zero = std::find(entry.shape.begin(), entry.shape.end(), 0u) != entry.shape.end();
  if (numel_overflow && !has_zero) {
    throw bad_input(
        fmt::format("{}: shape {} has more than 2^64 elements", at, shape_string(entry.shape)));
  }
  if (has_zero) numel = 0;
  std::uint64_t bits = 0;
  if (!checked_mul(numel, static_cast<std::uint64_t>(dtype_bits(entry.dtype)), bits)) {
    throw bad_input(fmt::format("{}: {} {} holds more than 2^64 bits", at, dtype_tag(entry.dtype),
                                shape_string(entry.shape)));
  }
  if (bits % 8 != 0) {
    throw bad_input(fmt::format("{}: {} {} holds {} bits, not a whole number of bytes", at,
                                dtype_tag(entry.dtype), shape_string(entry.shape), bits));
  }
  if (raw.offsets.size() != 2) {
    throw bad_input(
        fmt::format("{}: data_offsets has {} value(s), expected two non-negative "
                    "integers [begin, end]",
                    at, raw.offsets.size()));
  }
  entry.begin = raw.offsets[0];
  entry.end = raw.offsets[1];
  if (entry.end < entry.begin) {
    throw bad_input(fmt::format("{}: data_offsets [{}, {}] are out of order: end is before begin",
                                at, entry.begin, entry.end));
  }
  if (entry.end - entry.begin != bits / 8) {
    throw bad_input(fmt::format("{}: data_offsets [{}, {}] hold {} bytes, expected {} for {} {}",
                                at, entry.begin, entry.end, entry.end - entry.begin, bits / 8,
                                dtype_tag(entry.dtype), shape_string(entry.shape)));
  }
  return entry;
}

// Reads a header from nlohmann/json's SAX events without building a DOM:
// time is linear in the header, memory proportional to the entries kept, and
// every value is checked where it appears. Values of keys a safetensors entry
// does not define are skipped, as the reference reader skips them. Throws
// Error{kBadInput} at the first breach.
class HeaderReader {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  HeaderReader(const std::string& file, SafetensorsHeader& header) : file_(file), header_(header) {}

  // The root's JSON type when it is not an object, empty otherwise.
  const std::string& root_not_object() const { return root_not_object_; }

  bool null() { return scalar(Scalar{}); }
  bool boolean(bool value) {
    Scalar s;
    s.kind = Scalar::Kind::kBool;
    s.boolean = value;
    return scalar(s);
  }
  bool number_integer(number_integer_t value) {
    // The lexer reports non-negative integers as unsigned; only "-0" reaches
    // here as a signed zero. The reference reader (serde_json) reads "-0" as
    // the float -0.0, which no shape dimension or offset accepts.
    if (value == 0) {
      Scalar s;
      s.kind = Scalar::Kind::kFloat;
      s.text = &kNegativeZero;
      return scalar(s);
    }
    if (value > 0) return number_unsigned(static_cast<number_unsigned_t>(value));
    Scalar s;
    s.kind = Scalar::Kind::kNegative;
    s.negative = value;
    return scalar(s);
  }
  bool number_unsigned(number_unsigned_t value) {
    Scalar s;
    s.kind = Scalar::Kind::kUnsigned;
    s.value = value;
    return scalar(s);
  }
  bool number_float(number_float_t, const string_t& text) {
    Scalar s;
    s.kind = Scalar::Kind::kFloat;
    s.text = &text;
    return scalar(s);
  }
  bool string(string_t& value) {
    Scalar s;
    s.kind = Scalar::Kind::kString;
    s.text = &value;
    return scalar(s);
  }
  bool binary(binary_t&) { return scalar(Scalar{}); }  // not produced by the JSON lexer

  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& key) {
    switch (top()) {
      case Frame::kRoot:
        if (key == kMetadataKey) {
          if (seen_metadata_) {
            throw bad_input(fmt::format("{}: __metadata__ appears twice in the header", file_));
          }
          seen_metadata_ = true;
          in_metadata_ = true;
        } else {
          in_metadata_ = false;
          poll_cancel();  // a header of 200,000 entries takes a while (util/cancel.hpp)
          // A name given twice is found once every entry is read
          // (refuse_repeated_names).
          entry_ = RawEntry{};
          entry_.name = key;
        }
        break;
      case Frame::kMetadata:
        if (header_.metadata.contains(key)) {
          throw bad_input(
              fmt::format("{}: __metadata__ has the key {} twice", file_, json_quote(key)));
        }
        metadata_key_ = key;
        break;
      case Frame::kEntry: {
        field_ = key == "dtype"          ? Field::kDtype
                 : key == "shape"        ? Field::kShape
                 : key == "data_offsets" ? Field::kOffsets
                                         : Field::kOther;
        bool* seen = field_ == Field::kDtype     ? &entry_.has_dtype
                     : field_ == Field::kShape   ? &entry_.has_shape
                     : field_ == Field::kOffsets ? &entry_.has_offsets
                                                 : nullptr;
        if (seen != nullptr) {
          if (*seen) {
            throw bad_input(fmt::format("{}: key '{}' appears twice in the entry",
                                        where(file_, entry_.name), key));
          }
          *seen = true;
        }
        break;
      }
      default:
        break;
    }
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    throw bad_input(fmt::format("{}: header is not valid JSON ({})", file_, e.what()));
  }

 private:
  static constexpr const char* kMetadataKey = "__metadata__";
  static inline const std::string kNegativeZero = "-0";
  enum class Frame { kNone, kRoot, kMetadata, kEntry, kShape, kOffsets, kSkip };
  enum class Field { kDtype, kShape, kOffsets, kOther };

  Frame top() const { return stack_.empty() ? Frame::kNone : stack_.back(); }

  std::string entry_where() const { return where(file_, entry_.name); }

  // A value that is not what the position requires.
  [[noreturn]] void wrong_value(const std::string& found) const {
    switch (top()) {
      case Frame::kRoot:
        if (in_metadata_) {
          throw bad_input(
              fmt::format("{}: __metadata__ is {}, expected an object of strings (or "
                          "null)",
                          file_, found));
        }
        throw bad_input(
            fmt::format("{}: entry is {}, expected an object with dtype, shape and "
                        "data_offsets",
                        entry_where(), found));
      case Frame::kMetadata:
        throw bad_input(fmt::format("{}: __metadata__ value of {} is {}, expected a string", file_,
                                    json_quote(metadata_key_), found));
      case Frame::kEntry:
        if (field_ == Field::kDtype) {
          throw bad_input(fmt::format("{}: dtype is {}, expected a string tag such as \"BF16\"",
                                      entry_where(), found));
        }
        throw bad_input(fmt::format("{}: {} is {}, expected an array of non-negative integers",
                                    entry_where(),
                                    field_ == Field::kShape ? "shape" : "data_offsets", found));
      default:
        throw bad_input(fmt::format("{}: unexpected {}", entry_where(), found));
    }
  }

  // An element of shape or data_offsets that is not a non-negative integer.
  [[noreturn]] void bad_element(const std::string& found, const char* rule) const {
    const bool shape = top() == Frame::kShape;
    const std::string what = shape ? fmt::format("shape dimension {}", entry_.shape.size())
                                   : fmt::format("data_offsets value {}", entry_.offsets.size());
    throw bad_input(fmt::format("{}: {} is {}: {}", entry_where(), what, found, rule));
  }
  [[noreturn]] void bad_element(const Scalar& value) const {
    switch (value.kind) {
      case Scalar::Kind::kNegative:
        bad_element(value.describe(), top() == Frame::kShape ? "a dimension cannot be negative"
                                                             : "an offset cannot be negative");
      case Scalar::Kind::kFloat:
        if (*value.text == kNegativeZero) {
          bad_element(value.describe(),
                      "negative zero is a float to the reference reader, not an unsigned integer "
                      "(section 1 of the format spec, docs/format.md)");
        }
        bad_element(value.describe(), value.text->find_first_of(".eE") == std::string::npos
                                          ? "it does not fit in 64 bits"
                                          : "it must be an integer, not a fractional number");
      default:
        bad_element(value.describe(), "it must be a non-negative integer, not a non-numeric value");
    }
  }

  bool scalar(const Scalar& value) {
    switch (top()) {
      case Frame::kNone:
        root_not_object_ = value.kind == Scalar::Kind::kString ? "string"
                           : value.kind == Scalar::Kind::kNull ? "null"
                           : value.kind == Scalar::Kind::kBool ? "boolean"
                                                               : "number";
        break;
      case Frame::kRoot:
        // `"__metadata__": null` means no metadata to the reference reader
        // (MLX writes it).
        if (!in_metadata_ || value.kind != Scalar::Kind::kNull) wrong_value(value.kind_and_value());
        break;
      case Frame::kMetadata:
        if (value.kind != Scalar::Kind::kString) wrong_value(value.kind_and_value());
        header_.metadata.emplace(metadata_key_, *value.text);
        break;
      case Frame::kEntry:
        if (field_ == Field::kDtype) {
          if (value.kind != Scalar::Kind::kString) wrong_value(value.kind_and_value());
          entry_.dtype = *value.text;
        } else if (field_ != Field::kOther) {
          wrong_value(value.kind_and_value());
        }
        break;
      case Frame::kShape:
        if (value.kind != Scalar::Kind::kUnsigned) bad_element(value);
        entry_.shape.push_back(value.value);
        break;
      case Frame::kOffsets:
        if (value.kind != Scalar::Kind::kUnsigned) bad_element(value);
        if (entry_.offsets.size() == 2) {
          throw bad_input(
              fmt::format("{}: data_offsets has more than two values, expected "
                          "[begin, end]",
                          entry_where()));
        }
        entry_.offsets.push_back(value.value);
        break;
      case Frame::kSkip:
        break;
    }
    return true;
  }

  bool open(bool object) {
    const char* found = object ? "a JSON object" : "a JSON array";
    Frame next = Frame::kSkip;
    switch (top()) {
      case Frame::kNone:
        if (object) {
          next = Frame::kRoot;
        } else {
          root_not_object_ = "array";
        }
        break;
      case Frame::kRoot:
        if (!object) wrong_value(found);
        next = in_metadata_ ? Frame::kMetadata : Frame::kEntry;
        if (in_metadata_) header_.has_metadata = true;
        break;
      case Frame::kMetadata:
        wrong_value(found);
      case Frame::kEntry:
        if (field_ == Field::kDtype || object) {
          if (field_ != Field::kOther) wrong_value(found);
        } else if (field_ == Field::kShape) {
          next = Frame::kShape;
        } else if (field_ == Field::kOffsets) {
          next = Frame::kOffsets;
        }
        break;
      case Frame::kShape:
      case Frame::kOffsets:
        bad_element(found, "it must be a non-negative integer, not a nested value");
      case Frame::kSkip:
        break;
    }
    stack_.push_back(next);
    return true;
  }

  bool close() {
    const Frame closed = top();
    stack_.pop_back();
    if (closed == Frame::kEntry) {
      header_.tensors.push_back(validate_entry(file_, entry_));
    }
    return true;
  }

  const std::string& file_;
  SafetensorsHeader& header_;
  std::vector<Frame> stack_;
  std::string root_not_object_;
  bool in_metadata_ = false;    // the current root key is __metadata__
  bool seen_metadata_ = false;  // __metadata__ was a key of the root
  std::string metadata_key_;
  RawEntry entry_;
  Field field_ = Field::kOther;
};

}  // namespace

std::uint64_t TensorEntry::numel() const {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    if (d == 0) return 0;
    n *= d;  // cannot overflow: parse_header refused shapes of 2^64 elements or more
  }
  return n;
}

const TensorEntry* SafetensorsHeader::find(std::string_view name) const {
  const auto it = std::lower_bound(
      by_name.begin(), by_name.end(), name,
      [this](std::uint32_t i, std::string_view n) { return tensors[i].name < n; });
  return it == by_name.end() || tensors[*it].name != name ? nullptr : &tensors[*it];
}

namespace {

// The indexes of header.tensors sorted by name (SafetensorsHeader::by_name).
// JSON parsers keep the last value of a repeated key, which would silently
// drop a tensor: a name given twice is refused here.
void index_names(SafetensorsHeader& header, const std::string& file_label) {
  if (header.tensors.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw bad_input(fmt::format("{}: more than 2^32 tensors in one header", file_label));
  }
  header.by_name.resize(header.tensors.size());
  for (std::size_t i = 0; i < header.tensors.size(); ++i) {
    header.by_name[i] = static_cast<std::uint32_t>(i);
  }
  std::sort(header.by_name.begin(), header.by_name.end(), [&](std::uint32_t a, std::uint32_t b) {
    return header.tensors[a].name < header.tensors[b].name;
  });
  for (std::size_t i = 1; i < header.by_name.size(); ++i) {
    const std::string& name = header.tensors[header.by_name[i]].name;
    if (name == header.tensors[header.by_name[i - 1]].name) {
      throw bad_input(fmt::format("{}: tensor '{}' appears twice in the header", file_label, name));
    }
  }
}

}  // namespace

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
    throw bad_input(fmt::format("{}: header length {} runs past the end of the {}-byte file{}",
                                file_label, header.header_size, file_size, kTruncatedHint));
  }
  header.data_size = file_size - header.data_start;
  if (const auto bad = detail::first_invalid_utf8(header_json); bad != std::string_view::npos) {
    throw bad_input(
        fmt::format("{}: header is not valid UTF-8 (byte {} of the header)", file_label, bad));
  }

  // nlohmann's lexer skips a UTF-8 byte order mark before the JSON; the
  // reference reader (serde_json::from_str) does not, and refuses the header.
  if (header_json.starts_with("\xEF\xBB\xBF")) {
    throw bad_input(fmt::format(
        "{}: header starts with a UTF-8 byte order mark (EF BB BF); the header must start with "
        "the JSON object, as the reference reader requires (section 1 of the format spec, "
        "docs/format.md)",
        file_label));
  }

  // nlohmann's lexer takes a NUL byte for the end of the input, so a header
  // padded with NULs (or hiding bytes after one) would parse; the reference
  // reader (serde_json::from_str in safetensors' read_metadata) accepts only
  // JSON whitespace around the object. A NUL is never valid JSON text.
  if (const auto nul = header_json.find('\0'); nul != std::string_view::npos) {
    throw bad_input(fmt::format(
        "{}: header holds a NUL byte at byte {} of the header; only JSON whitespace (space, "
        "tab, newline, carriage return) may pad it (section 1)",
        file_label, nul));
  }
  HeaderReader reader(file_label, header);
  json::sax_parse(header_json.begin(), header_json.end(), &reader);
  if (!reader.root_not_object().empty()) {
    throw bad_input(fmt::format("{}: header is a JSON {}, expected an object", file_label,
                                reader.root_not_object()));
  }
  index_names(header, file_label);
  poll_cancel();

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
      throw bad_input(
          fmt::format("{}: data_offsets [{}, {}] overlap tensor '{}' (which ends at {}); the tensors' "
                      "byte ranges must tile the data buffer without overlap (section 1 of the "
                      "format spec, docs/format.md)",
                      where(file_label, t.name), t.begin, t.end, previous->name, cursor));
    }
    if (t.begin > cursor) {
      throw bad_input(fmt::format("{}: data_offsets [{}, {}] leave a gap of {} bytes after {}; the tensors' "
                                  "byte ranges must tile the data buffer without gaps (section "
                                  "1 of the format spec, docs/format.md)",
                                  where(file_label, t.name), t.begin, t.end, t.begin - cursor,
                                  previous ? fmt::format("tensor '{}'", previous->name)
                                           : std::string("the start of the data buffer")));
    }
    cursor = t.end;
    previous = &t;
  }
  if (cursor != header.data_size) {
    if (cursor > header.data_size) {
      throw bad_input(fmt::format(
          "{}: data_offsets [{}, {}] run past the end of the data buffer "
          "({} bytes){}",
          where(file_label, previous->name), previous->begin, previous->end, header.data_size,
          kTruncatedHint));
    }
    throw bad_input(
        fmt::format("{}: tensor data ends at byte {} of the data buffer but the file "
                    "holds {} more bytes (the buffer must end at the end of the file)",
                    file_label, cursor, header.data_size - cursor));
  }
  index_names(header, file_label);  // the tensors are in data order now
  return header;
}

namespace {

void read_exact(int fd, std::uint64_t offset, std::span<std::byte> out, const std::string& label) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error(fmt::format("{}: read of {} bytes at offset {} failed: {}", label, out.size(),
                                 offset, std::strerror(errno)));
    }
    if (n == 0) {
      throw io_error(
          fmt::format("{}: file ended at offset {} while reading {} bytes at {} (was it "
                      "truncated while ctquant ran?)",
                      label, offset + done, out.size(), offset));
    }
    done += static_cast<std::size_t>(n);
  }
}

// The first line of a Git LFS pointer file (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md):
// what a clone without `git lfs pull` holds in place of each shard.
constexpr std::string_view kLfsPointerStart = "version https://git-lfs.github.com/spec/v1";
constexpr std::uint64_t kMaxLfsPointerBytes = 1024;  // the spec's limit for a pointer file

// Throws when the file is a Git LFS pointer: such a file starts "version ",
// which read as a header length would be a meaningless 8 GB-sized number.
void refuse_lfs_pointer(int fd, std::uint64_t file_size, const std::string& label) {
  if (file_size < kLfsPointerStart.size() || file_size > kMaxLfsPointerBytes) return;
  std::string text(static_cast<std::size_t>(file_size), '\0');
  read_exact(fd, 0, std::as_writable_bytes(std::span(text)), label);
  if (!text.starts_with(kLfsPointerStart)) return;
  std::string object;
  const std::size_t size_at = text.find("\nsize ");
  if (size_at != std::string::npos) {
    const std::size_t begin = size_at + 6;
    const std::size_t end = text.find_first_not_of("0123456789", begin);
    object = fmt::format(" for {} bytes of data", text.substr(begin, end - begin));
  }
  throw bad_input(
      fmt::format("{}: is a Git LFS pointer file ({} bytes of text{}), not safetensors data: the "
                  "checkpoint was cloned without its LFS objects; run `git lfs pull` in it, or "
                  "download it with huggingface-cli / hf download",
                  label, file_size, object));
}

SafetensorsHeader read_header_fd(int fd, std::uint64_t file_size, const std::string& label) {
  refuse_lfs_pointer(fd, file_size, label);
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
    throw bad_input(fmt::format("{}: header length {} runs past the end of the {}-byte file{}",
                                label, n, file_size, kTruncatedHint));
  }
  std::string text(n, '\0');
  read_exact(fd, 8, std::as_writable_bytes(std::span(text)), label);
  return parse_header(text, file_size, label);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path, std::string label,
                                 std::shared_ptr<FdPool> pool)
    : path_(path), label_(std::move(label)), pool_(std::move(pool)) {
  detail::UniqueFd fd = detail::open_input_file(path_, label_, file_size_);
  header_ = read_header_fd(fd.get(), file_size_, label_);
  const detail::FileIdentity identity = detail::file_identity(fd.get());
  if (!pool_) pool_ = std::make_shared<FdPool>(1);
  slot_ = pool_->add(fd.release(), [path = path_, label = label_, identity] {
    return detail::reopen_input_file(path, label, identity).release();
  });
}

void SafetensorsFile::release() noexcept {
  if (pool_) pool_->remove(slot_);
  pool_.reset();
}

SafetensorsFile::~SafetensorsFile() { release(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      label_(std::move(other.label_)),
      pool_(std::move(other.pool_)),
      slot_(other.slot_),
      file_size_(other.file_size_),
      header_(std::move(other.header_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    label_ = std::move(other.label_);
    pool_ = std::move(other.pool_);
    slot_ = other.slot_;
    file_size_ = other.file_size_;
    header_ = std::move(other.header_);
  }
  return *this;
}

FdLease SafetensorsFile::descriptor() const { return pool_->acquire(slot_); }

void SafetensorsFile::read(std::uint64_t offset, std::span<std::byte> out) const {
  std::uint64_t end = 0;
  if (!checked_add(offset, out.size(), end) || end > header_.data_size) {
    throw io_error(
        fmt::format("{}: read of {} bytes at data offset {} would pass the end of the "
                    "{}-byte data buffer",
                    label_, out.size(), offset, header_.data_size));
  }
  const FdLease fd = descriptor();
  read_exact(fd->get(), header_.data_start + offset, out, label_);
}

SafetensorsHeader read_header(const std::filesystem::path& path, const std::string& label) {
  std::uint64_t size = 0;
  const detail::UniqueFd fd = detail::open_input_file(path, label, size);
  return read_header_fd(fd.get(), size, label);
}

}  // namespace ctquant
