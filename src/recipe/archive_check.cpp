#include "archive_check.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "muon/error.h"

namespace muon::detail {

uint32_t crc32(const char* data, uint64_t size) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (uint64_t i = 0; i < size; ++i) {
    c = table[(c ^ static_cast<uint8_t>(data[i])) & 0xff] ^ (c >> 8);
  }
  return c ^ 0xffffffffu;
}

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
  const char* at(uint64_t offset) const { return data_ + offset; }
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
    const uint64_t crc = b.le(at + 16, 4);
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
    // LibTorch's reader skips the CRC check; corruption of weights or state must not pass.
    check(crc32(b.at(data), compressed) == crc, "zip entry ", e,
          " fails its CRC-32 check: the file was changed after it was written");
    at += 46 + name + extra + comment;
    check(at <= directory + directory_size, "the zip central directory overruns itself");
  }
}

namespace {

// What an item on the simulated unpickler stack is. Values of one kind are interchangeable here:
// LibTorch's unpickler converts them with checks of its own (a string where an int belongs is an
// exception, not memory corruption); what it does not check is the stack's shape.
enum class Kind { mark, value, dict, list, tuple, storage_ref, tensor, global };

struct Item {
  Kind kind;
  std::string global;               // Kind::global: "module\nname"
  std::vector<Kind> elements;       // Kind::tuple
  std::vector<size_t> tuple_sizes;  // Kind::tuple: arity of each element that is a tuple
};

// The globals LibTorch's pickler writes for the values a checkpoint holds.
bool known_global(const std::string& name) {
  static const std::set<std::string> names = {
      "torch._utils\n_rebuild_tensor_v2", "collections\nOrderedDict",
      "torch.jit._pickle\nrestore_type_tag", "torch.jit._pickle\nbuild_intlist",
      "torch.jit._pickle\nbuild_doublelist", "torch.jit._pickle\nbuild_boollist",
      "torch.jit._pickle\nbuild_tensorlist"};
  if (names.count(name) != 0) return true;
  static const std::set<std::string> storages = {
      "FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "LongStorage",
      "IntStorage",   "ShortStorage",  "CharStorage", "ByteStorage",     "BoolStorage"};
  return name.rfind("torch\n", 0) == 0 && storages.count(name.substr(6)) != 0;
}

class StackCheck {
 public:
  explicit StackCheck(const std::string& pickle) : pickle_(pickle) {}

  void run() {
    while (i_ < pickle_.size()) {
      const auto op = static_cast<uint8_t>(pickle_[i_++]);
      if (op == '.') {  // STOP: one finished value
        check(i_ == pickle_.size(), "the pickle continues after its end");
        check(stack_.size() == 1 && stack_[0].kind != Kind::mark,
              "the pickle ends with ", stack_.size(), " items on its stack instead of one");
        return;
      }
      step(op);
    }
    throw Error("the pickle ends without its STOP opcode");
  }

 private:
  void step(uint8_t op) {
    switch (op) {
      case 0x80: argument(1, "protocol"); return;
      case 0x95: argument(8, "frame"); return;
      case 'J': argument(4, "int"); return push(Kind::value);
      case 'K': argument(1, "int"); return push(Kind::value);
      case 'M': argument(2, "int"); return push(Kind::value);
      case 'G': argument(8, "float"); return push(Kind::value);
      case 0x8a: skip(1, "long"); return push(Kind::value);
      case 'X': skip(4, "string"); return push(Kind::value);
      case 0x8c: skip(1, "string"); return push(Kind::value);
      case 'N': case 0x88: case 0x89: return push(Kind::value);
      case '}': return push(Kind::dict);
      case ']': return push(Kind::list);
      case ')': return push(Item{Kind::tuple, "", {}, {}});
      case '(': return push(Kind::mark);
      case 'c': return global();
      case 'q': return put(argument(1, "memo index"));
      case 'r': return put(argument(4, "memo index"));
      case 'h': return get(argument(1, "memo index"));
      case 'j': return get(argument(4, "memo index"));
      case 't': return tuple(items_after_mark());
      case 0x85: return tuple(take(1));
      case 0x86: return tuple(take(2));
      case 0x87: return tuple(take(3));
      case 'u': return fill(Kind::dict, items_after_mark(), 2, "SETITEMS");
      case 's': return fill(Kind::dict, take(2), 2, "SETITEM");
      case 'e': return fill(Kind::list, items_after_mark(), 1, "APPENDS");
      case 'a': return fill(Kind::list, take(1), 1, "APPEND");
      case 'Q': return persistent_id();
      case 'R': return reduce();
      default:
        throw Error(concat("the pickle holds opcode 0x", std::hex, static_cast<int>(op),
                           ", which a checkpoint never contains"));
    }
  }

  uint64_t argument(int width, const char* what) {
    check(static_cast<uint64_t>(width) <= pickle_.size() - i_, "the pickle's ", what,
          " runs past its end");
    const uint64_t v = read_le(pickle_.data(), i_, width);
    i_ += static_cast<size_t>(width);
    return v;
  }
  void skip(int width, const char* what) {
    const uint64_t n = argument(width, what);
    check(n <= pickle_.size() - i_, "the pickle's ", what, " runs past its end");
    i_ += static_cast<size_t>(n);
  }
  std::string line() {
    const auto newline = pickle_.find('\n', i_);
    check(newline != std::string::npos, "the pickle's global has no end of line");
    auto text = pickle_.substr(i_, newline - i_);
    i_ = newline + 1;
    return text;
  }

  void push(Kind kind) { stack_.push_back(Item{kind, "", {}, {}}); }
  void push(Item item) { stack_.push_back(std::move(item)); }
  Item pop(const char* what) {
    check(!stack_.empty() && stack_.back().kind != Kind::mark, "the pickle's ", what,
          " finds no value on its stack");
    auto item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  // The top `n` values, in order (none of them a mark).
  std::vector<Item> take(size_t n) {
    check(stack_.size() >= n, "the pickle's stack holds fewer than ", n, " values");
    std::vector<Item> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    for (const auto& item : out) check(item.kind != Kind::mark, "a mark stands among values");
    stack_.resize(stack_.size() - n);
    return out;
  }
  // The values above the topmost mark (the mark removed).
  std::vector<Item> items_after_mark() {
    size_t m = stack_.size();
    while (m > 0 && stack_[m - 1].kind != Kind::mark) --m;
    check(m > 0, "the pickle closes a mark it never opened");
    std::vector<Item> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m - 1);
    return out;
  }

  void global() {
    auto name = line();
    name += "\n" + line();
    check(known_global(name), "the pickle names '", name.substr(0, name.find('\n')), ".",
          name.substr(name.find('\n') + 1), "', which a checkpoint never contains");
    push(Item{Kind::global, name, {}, {}});
  }
  void put(uint64_t index) {
    check(!stack_.empty() && stack_.back().kind != Kind::mark, "the pickle memoizes nothing");
    check(index <= memo_.size(), "the pickle refers to memo entry ", index, " with ",
          memo_.size(), " memoized");
    if (index == memo_.size()) {
      memo_.push_back(stack_.back());
    } else {
      memo_[index] = stack_.back();
    }
  }
  void get(uint64_t index) {
    check(index < memo_.size(), "the pickle refers to memo entry ", index, " with ",
          memo_.size(), " memoized");
    push(memo_[index]);
  }
  void tuple(const std::vector<Item>& items) {
    Item t{Kind::tuple, "", {}, {}};
    for (const auto& item : items) {
      t.elements.push_back(item.kind);
      t.tuple_sizes.push_back(item.elements.size());
    }
    push(std::move(t));
  }
  void fill(Kind container, const std::vector<Item>& items, size_t per_entry, const char* what) {
    check(items.size() % per_entry == 0, "the pickle's ", what, " has an unpaired key");
    check(!stack_.empty() && stack_.back().kind == container, "the pickle's ", what,
          " has no ", container == Kind::dict ? "dict" : "list", " to fill");
  }
  void persistent_id() {  // ('storage', storage type, key, location, numel)
    const auto t = pop("persistent id");
    check(t.kind == Kind::tuple && t.elements.size() == 5 && t.elements[1] == Kind::global,
          "the pickle's persistent id is not a storage reference");
    push(Kind::storage_ref);
  }
  void reduce() {
    const auto args = pop("REDUCE");
    const auto callable = pop("REDUCE");
    check(args.kind == Kind::tuple && callable.kind == Kind::global,
          "the pickle calls something that is not a known function");
    const auto& f = callable.global;
    const auto& e = args.elements;
    if (f == "torch._utils\n_rebuild_tensor_v2") {
      // (storage, offset, size, stride, requires_grad, backward hooks), sizes and strides alike
      check(e.size() == 6 && e[0] == Kind::storage_ref && e[1] == Kind::value &&
                e[2] == Kind::tuple && e[3] == Kind::tuple &&
                args.tuple_sizes[2] == args.tuple_sizes[3] && e[4] == Kind::value &&
                e[5] == Kind::dict,
            "the pickle rebuilds a tensor from arguments of the wrong shape");
      return push(Kind::tensor);
    }
    if (f == "collections\nOrderedDict") {
      check(e.empty(), "the pickle builds an OrderedDict from arguments");
      return push(Kind::dict);
    }
    if (f == "torch.jit._pickle\nrestore_type_tag") {
      check(e.size() == 2 && e[1] == Kind::value, "the pickle tags a type wrongly");
      return push(e[0]);
    }
    if (f.rfind("torch.jit._pickle\nbuild_", 0) == 0) {
      check(e.size() == 1 && e[0] == Kind::list, "the pickle builds a list from a non-list");
      return push(Kind::list);
    }
    throw Error("the pickle calls a storage type");
  }

  const std::string& pickle_;
  size_t i_ = 0;
  std::vector<Item> stack_;
  std::vector<Item> memo_;
};

}  // namespace

void check_pickle_structure(const std::string& pickle) {
  StackCheck(pickle).run();
}

}  // namespace muon::detail
