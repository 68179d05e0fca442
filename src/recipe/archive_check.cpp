#include "archive_check.h"

#include <cstdint>
#include <cstring>

#include "muon/error.h"

namespace muon::detail {
namespace {

// Little-endian unsigned integer of `width` bytes at `at` (the caller checked the range).
uint64_t read_le(const char* data, size_t at, int width) {
  uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<uint8_t>(data[at + static_cast<size_t>(i)]);
  }
  return v;
}

constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfCentralDirectory = 0x06064b50;
constexpr uint32_t kCentralEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint64_t kZip64Marker = 0xffffffff;

class Bytes {
 public:
  explicit Bytes(const std::vector<char>& bytes) : data_(bytes.data()), size_(bytes.size()) {}
  bool has(uint64_t at, uint64_t n) const { return at <= size_ && n <= size_ - at; }
  uint64_t le(uint64_t at, int width) const {
    check(has(at, static_cast<uint64_t>(width)), "the zip structure points outside the file");
    return read_le(data_, static_cast<size_t>(at), width);
  }
  uint64_t size() const { return size_; }

 private:
  const char* data_;
  uint64_t size_;
};

// Zip64 extra field: the 8-byte values of those of (uncompressed, compressed, offset) that the
// entry marked 0xffffffff, in that order.
void read_zip64_extra(const Bytes& b, uint64_t extra, uint64_t extra_length,
                      std::vector<uint64_t*> marked) {
  uint64_t at = extra;
  while (at + 4 <= extra + extra_length) {
    const uint64_t id = b.le(at, 2), length = b.le(at + 2, 2);
    if (id == 1) {
      check(length >= 8 * marked.size(), "a zip64 field is too short");
      for (size_t i = 0; i < marked.size(); ++i) *marked[i] = b.le(at + 4 + 8 * i, 8);
      return;
    }
    at += 4 + length;
  }
  check(marked.empty(), "a zip64 entry lacks its sizes");
}

}  // namespace

void check_zip_structure(const std::vector<char>& bytes) {
  const Bytes b(bytes);
  check(b.size() >= 22, "the file is too short for a zip archive");
  // The end record: the last signature within the final 64 KiB + 22 bytes.
  uint64_t end = b.size() - 22;
  const uint64_t lowest = b.size() > 65557 ? b.size() - 65557 : 0;
  while (b.le(end, 4) != kEndOfCentralDirectory) {
    check(end > lowest, "no zip end-of-central-directory record");
    --end;
  }
  uint64_t entries = b.le(end + 10, 2), directory_size = b.le(end + 12, 4),
           directory = b.le(end + 16, 4);
  if (end >= 20 && b.le(end - 20, 4) == kZip64Locator) {
    const uint64_t record = b.le(end - 20 + 8, 8);
    check(b.le(record, 4) == kZip64EndOfCentralDirectory, "a broken zip64 end record");
    entries = b.le(record + 32, 8);
    directory_size = b.le(record + 40, 8);
    directory = b.le(record + 48, 8);
  }
  check(b.has(directory, directory_size) && directory + directory_size <= end,
        "the zip central directory lies outside the file");
  check(entries <= directory_size / 46, "the zip archive claims more entries than it holds");
  uint64_t at = directory;
  for (uint64_t e = 0; e < entries; ++e) {
    check(b.le(at, 4) == kCentralEntry, "zip central directory entry ", e, " is damaged");
    const uint64_t method = b.le(at + 10, 2);
    uint64_t compressed = b.le(at + 20, 4), uncompressed = b.le(at + 24, 4);
    const uint64_t name = b.le(at + 28, 2), extra = b.le(at + 30, 2), comment = b.le(at + 32, 2);
    uint64_t local = b.le(at + 42, 4);
    std::vector<uint64_t*> marked;
    for (auto* v : {&uncompressed, &compressed, &local}) {
      if (*v == kZip64Marker) marked.push_back(v);
    }
    read_zip64_extra(b, at + 46 + name, extra, marked);
    check(method == 0 && compressed == uncompressed, "zip entry ", e,
          " is compressed or has inconsistent sizes; torch archives store entries as they are");
    check(b.le(local, 4) == kLocalHeader, "zip entry ", e, " points to no local header");
    const uint64_t data = local + 30 + b.le(local + 26, 2) + b.le(local + 28, 2);
    check(b.has(data, compressed) && data + compressed <= directory, "zip entry ", e,
          " claims ", compressed, " bytes beyond the end of its data");
    at += 46 + name + extra + comment;
    check(at <= directory + directory_size, "the zip central directory overruns itself");
  }
}

void check_pickle_structure(const std::string& pickle) {
  const size_t size = pickle.size();
  size_t i = 0;
  uint64_t memoized = 0;
  const auto need = [&](uint64_t n, const char* what) {
    check(n <= size - i, "the pickle's ", what, " runs past its end");
  };
  const auto argument = [&](int width, const char* what) {
    need(static_cast<uint64_t>(width), what);
    const uint64_t v = read_le(pickle.data(), i, width);
    i += static_cast<size_t>(width);
    return v;
  };
  const auto line = [&](const char* what) {
    const auto newline = pickle.find('\n', i);
    check(newline != std::string::npos, "the pickle's ", what, " has no end of line");
    i = newline + 1;
  };
  const auto skip = [&](int width, const char* what) {
    const uint64_t n = argument(width, what);
    need(n, what);
    i += static_cast<size_t>(n);
  };
  const auto memo_index = [&](uint64_t index, bool put) {
    check(put ? index <= memoized : index < memoized, "the pickle refers to memo entry ", index,
          " with ", memoized, " memoized");
    if (put && index == memoized) ++memoized;
  };
  while (i < size) {
    const auto op = static_cast<uint8_t>(pickle[i++]);
    switch (op) {
      case '.':  // STOP
        check(i == size, "the pickle continues after its end");
        return;
      case 0x80: argument(1, "protocol"); break;
      case 0x95: argument(8, "frame"); break;
      case 'J': argument(4, "int"); break;
      case 'K': argument(1, "int"); break;
      case 'M': argument(2, "int"); break;
      case 'G': argument(8, "float"); break;
      case 0x8a: skip(1, "long"); break;
      case 0x8b: skip(4, "long"); break;
      case 'X': skip(4, "string"); break;
      case 0x8c: skip(1, "string"); break;
      case 0x8d: skip(8, "string"); break;
      case 'B': skip(4, "bytes"); break;
      case 'C': skip(1, "bytes"); break;
      case 0x8e: skip(8, "bytes"); break;
      case 'T': skip(4, "string"); break;
      case 'U': skip(1, "string"); break;
      case 'c': line("global"); line("global"); break;
      case 'I': case 'L': case 'F': case 'S': case 'V': case 'P': line("argument"); break;
      case 'q': memo_index(argument(1, "memo index"), true); break;
      case 'r': memo_index(argument(4, "memo index"), true); break;
      case 0x94: ++memoized; break;  // MEMOIZE
      case 'h': memo_index(argument(1, "memo index"), false); break;
      case 'j': memo_index(argument(4, "memo index"), false); break;
      case '(': case '0': case '1': case '2': case 'N': case 'Q': case 'R': case 'a': case 'b':
      case 'd': case '}': case 'e': case 'l': case ']': case 'o': case 's': case 't': case ')':
      case 'u': case 0x81: case 0x85: case 0x86: case 0x87: case 0x88: case 0x89: case 0x8f:
      case 0x90: case 0x91: case 0x92: case 0x93:
        break;
      default:
        throw Error(concat("the pickle holds an unknown opcode 0x", std::hex,
                           static_cast<int>(op)));
    }
  }
  throw Error("the pickle ends without its STOP opcode");
}

}  // namespace muon::detail
