#include "medfast/nn/pretrained.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <variant>
#include <vector>

#include "medfast/core/endian.hpp"
#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"

namespace medfast::nn {

namespace {

// ---------------------------------------------------------------------------------------------
// A restricted unpickler for torch.save's data.pkl: it understands the opcodes pickle writes
// for dicts, tuples, lists, strings, numbers and persistent storages, and builds only tensors
// (torch._utils._rebuild_tensor_v2 / _rebuild_parameter) and OrderedDicts. Any other global
// is refused: no code named by the file runs (unlike Python's pickle).

struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Global {
  std::string module, name;
  std::string full() const { return module + "." + name; }
};
struct Value {
  using Items = std::vector<ValuePtr>;
  using Pairs = std::vector<std::pair<ValuePtr, ValuePtr>>;
  enum class Kind { none, boolean, integer, real, string, tuple, list, dict, global, storage, tensor, mark };
  Kind kind = Kind::none;
  bool b = false;
  std::int64_t i = 0;
  double d = 0;
  std::string s;
  Items items;  // tuple, list
  Pairs pairs;  // dict, in insertion order
  Global g;
  at::Tensor t;  // storage (flat) or tensor
};

ValuePtr make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

at::ScalarType storage_dtype(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types{
      {"FloatStorage", at::kFloat},   {"DoubleStorage", at::kDouble}, {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort},   {"CharStorage", at::kChar},     {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool}};
  auto it = types.find(name);
  if (it == types.end()) throw FormatError(str("storage type torch.", name, " is not supported"));
  return it->second;
}

class Unpickler {
 public:
  Unpickler(const std::vector<char>& pickle, caffe2::serialize::PyTorchStreamReader& zip) : p_(pickle), zip_(zip) {}

  ValuePtr run() {
    for (;;) {
      const auto op = static_cast<unsigned char>(byte());
      if (op == '.') break;  // STOP
      step(op);
    }
    if (stack_.size() != 1) throw bad("the pickle ends with ", stack_.size(), " values on its stack, expected 1");
    return stack_.back();
  }

 private:
  template <typename... A>
  FormatError bad(A&&... a) const {
    return FormatError(str("data.pkl at byte ", pos_, ": ", std::forward<A>(a)...));
  }
  char byte() {
    if (pos_ >= p_.size()) throw bad("the pickle is truncated");
    return p_[pos_++];
  }
  const char* take(std::size_t n) {
    if (n > p_.size() - pos_) throw bad("the pickle is truncated (", n, " bytes wanted)");
    const char* at = p_.data() + pos_;
    pos_ += n;
    return at;
  }
  std::uint64_t le(std::size_t n) {
    const auto* b = reinterpret_cast<const unsigned char*>(take(n));
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < n; ++k) v |= static_cast<std::uint64_t>(b[k]) << (8 * k);
    return v;
  }
  std::string line() {
    std::string s;
    for (char c = byte(); c != '\n'; c = byte()) s += c;
    return s;
  }
  ValuePtr pop() {
    if (stack_.empty() || stack_.back()->kind == Value::Kind::mark) throw bad("the pickle pops an empty stack");
    ValuePtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value::Items pop_to_mark() {
    std::size_t m = stack_.size();
    while (m > 0 && stack_[m - 1]->kind != Value::Kind::mark) --m;
    if (m == 0) throw bad("no MARK on the stack");
    Value::Items items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m - 1);
    return items;
  }
  ValuePtr top(Value::Kind k, const char* what) {
    if (stack_.empty() || stack_.back()->kind != k) throw bad(what, " on a value of the wrong kind");
    return stack_.back();
  }
  void push_string(std::size_t n) {
    auto v = make(Value::Kind::string);
    v->s.assign(take(n), n);
    stack_.push_back(v);
  }
  void push_int(std::int64_t i) {
    auto v = make(Value::Kind::integer);
    v->i = i;
    stack_.push_back(v);
  }
  ValuePtr tuple(Value::Items items) {
    auto v = make(Value::Kind::tuple);
    v->items = std::move(items);
    return v;
  }
  void memo_put(std::size_t k) {
    if (stack_.empty()) throw bad("memo of an empty stack");
    memo_[k] = stack_.back();
  }
  void memo_get(std::size_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) throw bad("memo ", k, " was never stored");
    stack_.push_back(it->second);
  }

  void step(unsigned char op);
  ValuePtr persistent(const ValuePtr& pid);
  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args);
  ValuePtr rebuild_tensor(const Value::Items& a);

  const std::vector<char>& p_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  std::size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::map<std::size_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

void Unpickler::step(unsigned char op) {
  switch (op) {
    case 0x80: (void)byte(); return;                       // PROTO
    case 0x95: (void)take(8); return;                      // FRAME
    case '(': stack_.push_back(make(Value::Kind::mark)); return;
    case '}': stack_.push_back(make(Value::Kind::dict)); return;
    case ']': stack_.push_back(make(Value::Kind::list)); return;
    case ')': stack_.push_back(tuple({})); return;
    case 'N': stack_.push_back(make(Value::Kind::none)); return;
    case 0x88:
    case 0x89: {
      auto v = make(Value::Kind::boolean);
      v->b = op == 0x88;
      stack_.push_back(v);
      return;
    }
    case 'K': push_int(static_cast<std::int64_t>(le(1))); return;
    case 'M': push_int(static_cast<std::int64_t>(le(2))); return;
    case 'J': push_int(static_cast<std::int32_t>(le(4))); return;
    case 0x8a: {  // LONG1: little-endian two's complement of n bytes
      const std::size_t n = static_cast<unsigned char>(byte());
      if (n > 8) throw bad("an integer of ", n, " bytes");
      std::uint64_t v = n ? le(n) : 0;
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~std::uint64_t{0} << (8 * n);
      push_int(static_cast<std::int64_t>(v));
      return;
    }
    case 'G': {  // BINFLOAT, big-endian
      const auto* b = reinterpret_cast<const unsigned char*>(take(8));
      std::uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) bits = bits << 8 | b[k];
      auto v = make(Value::Kind::real);
      std::memcpy(&v->d, &bits, 8);
      stack_.push_back(v);
      return;
    }
    case 'X': push_string(le(4)); return;      // BINUNICODE
    case 0x8c: push_string(le(1)); return;     // SHORT_BINUNICODE
    case 0x8d: push_string(le(8)); return;     // BINUNICODE8
    case 'U': push_string(le(1)); return;      // SHORT_BINSTRING
    case 'T': push_string(le(4)); return;      // BINSTRING
    case 'C': push_string(le(1)); return;      // SHORT_BINBYTES
    case 'B': push_string(le(4)); return;      // BINBYTES
    case 'q': memo_put(le(1)); return;         // BINPUT
    case 'r': memo_put(le(4)); return;         // LONG_BINPUT
    case 0x94: memo_put(memo_.size()); return; // MEMOIZE
    case 'h': memo_get(le(1)); return;         // BINGET
    case 'j': memo_get(le(4)); return;         // LONG_BINGET
    case '0': (void)pop(); return;             // POP
    case 't': stack_.push_back(tuple(pop_to_mark())); return;
    case 0x85: { auto a = pop(); stack_.push_back(tuple({a})); return; }
    case 0x86: { auto b = pop(), a = pop(); stack_.push_back(tuple({a, b})); return; }
    case 0x87: { auto c = pop(), b = pop(), a = pop(); stack_.push_back(tuple({a, b, c})); return; }
    case 'a': { auto v = pop(); top(Value::Kind::list, "APPEND")->items.push_back(v); return; }
    case 'e': { auto items = pop_to_mark(); auto l = top(Value::Kind::list, "APPENDS"); l->items.insert(l->items.end(), items.begin(), items.end()); return; }
    case 's': { auto v = pop(), k = pop(); top(Value::Kind::dict, "SETITEM")->pairs.emplace_back(k, v); return; }
    case 'u': {
      auto items = pop_to_mark();
      if (items.size() % 2) throw bad("SETITEMS with an odd number of values");
      auto d = top(Value::Kind::dict, "SETITEMS");
      for (std::size_t k = 0; k < items.size(); k += 2) d->pairs.emplace_back(items[k], items[k + 1]);
      return;
    }
    case 'c': {  // GLOBAL module\nname\n
      auto v = make(Value::Kind::global);
      v->g.module = line();
      v->g.name = line();
      stack_.push_back(v);
      return;
    }
    case 0x93: {  // STACK_GLOBAL
      auto name = pop(), module = pop();
      if (name->kind != Value::Kind::string || module->kind != Value::Kind::string) throw bad("STACK_GLOBAL of non-strings");
      auto v = make(Value::Kind::global);
      v->g = {module->s, name->s};
      stack_.push_back(v);
      return;
    }
    case 'Q': { auto pid = pop(); stack_.push_back(persistent(pid)); return; }  // BINPERSID
    case 'R': { auto args = pop(), callable = pop(); stack_.push_back(reduce(callable, args)); return; }
    case 'b': (void)pop(); return;  // BUILD: an OrderedDict's __dict__ (state_dict._metadata): not needed
    default:
      throw bad("pickle opcode 0x", std::hex, static_cast<int>(op), " is not one torch.save writes for a state_dict");
  }
}

ValuePtr Unpickler::persistent(const ValuePtr& pid) {
  // ('storage', torch.FloatStorage, key, location, numel)
  if (pid->kind != Value::Kind::tuple || pid->items.size() < 5 || pid->items[0]->s != "storage" ||
      pid->items[1]->kind != Value::Kind::global || pid->items[2]->kind != Value::Kind::string ||
      pid->items[4]->kind != Value::Kind::integer) {
    throw bad("a persistent id that is not a tensor storage");
  }
  const std::string key = pid->items[2]->s;
  if (auto it = storages_.find(key); it != storages_.end()) return it->second;
  const at::ScalarType dtype = storage_dtype(pid->items[1]->g.name);
  const std::int64_t numel = pid->items[4]->i;
  const std::string record = "data/" + key;
  if (!zip_.hasRecord(record)) throw bad("storage ", key, " is not in the archive");
  auto [data, size] = zip_.getRecord(record);
  const std::size_t want = static_cast<std::size_t>(numel) * c10::elementSize(dtype);
  if (numel < 0 || size != want) throw bad("storage ", key, " holds ", size, " bytes, ", numel, " elements need ", want);
  auto v = make(Value::Kind::storage);
  v->t = torch::empty({numel}, at::TensorOptions().dtype(dtype));
  if (size) std::memcpy(v->t.data_ptr(), data.get(), size);
  storages_[key] = v;
  return v;
}

ValuePtr Unpickler::rebuild_tensor(const Value::Items& a) {
  // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (a.size() < 4 || a[0]->kind != Value::Kind::storage || a[1]->kind != Value::Kind::integer ||
      a[2]->kind != Value::Kind::tuple || a[3]->kind != Value::Kind::tuple) {
    throw bad("_rebuild_tensor_v2 with unexpected arguments");
  }
  std::vector<std::int64_t> size, stride;
  for (const auto& x : a[2]->items) size.push_back(x->kind == Value::Kind::integer ? x->i : -1);
  for (const auto& x : a[3]->items) stride.push_back(x->kind == Value::Kind::integer ? x->i : -1);
  const std::int64_t offset = a[1]->i, numel = a[0]->t.numel();
  if (size.size() != stride.size() || offset < 0) throw bad("a tensor with mismatched size and stride");
  std::int64_t last = offset;  // the furthest element the view reaches
  bool empty = false;
  for (std::size_t k = 0; k < size.size(); ++k) {
    if (size[k] < 0 || stride[k] < 0) throw bad("a tensor with a negative size or stride");
    if (size[k] == 0) empty = true;
    else last += (size[k] - 1) * stride[k];
  }
  if (!empty && last >= numel) throw bad("a tensor reaching element ", last, " of a storage of ", numel);
  auto v = make(Value::Kind::tensor);
  v->t = empty ? torch::empty(size, a[0]->t.options()) : a[0]->t.as_strided(size, stride, offset);
  return v;
}

ValuePtr Unpickler::reduce(const ValuePtr& callable, const ValuePtr& args) {
  if (callable->kind != Value::Kind::global || args->kind != Value::Kind::tuple) throw bad("REDUCE of a non-global");
  const std::string f = callable->g.full();
  if (f == "collections.OrderedDict" || f == "builtins.dict") return make(Value::Kind::dict);
  if (f == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(args->items);
  if (f == "torch._utils._rebuild_parameter" || f == "torch._utils._rebuild_parameter_with_state") {
    if (args->items.empty() || args->items[0]->kind != Value::Kind::tensor) throw bad("_rebuild_parameter of a non-tensor");
    return args->items[0];
  }
  throw bad("the file calls ", f, ": only tensors in a dict are read (nothing in the file is run); save "
            "model.state_dict(), not the model");
}

namespace {

/// Every stored record of a zip archive checked against the CRC-32 its central directory
/// gives: libtorch's reader (miniz, built without its CRC checks) hands damaged bytes on as
/// weights, so a truncated or corrupted download would train from them. torch.save stores
/// its records uncompressed; a compressed record is left to the reader. FormatError naming
/// the archive and the record.
void check_zip_crcs(const std::string& path, const std::function<FormatError(const std::string&)>& fail) {
  const os::File f = os::File::open(path, os::File::Mode::read);
  const std::uint64_t size = f.size();
  // The end of central directory record: within the last 64 KiB + 22 bytes (its comment).
  const std::uint64_t tail_size = std::min<std::uint64_t>(size, 65536 + 22);
  std::vector<unsigned char> tail(tail_size);
  f.read_exact(tail.data(), tail_size, size - tail_size);
  std::int64_t eocd = -1;
  for (std::int64_t i = static_cast<std::int64_t>(tail_size) - 22; i >= 0; --i) {
    if (le32(&tail[static_cast<std::size_t>(i)]) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw fail("the zip archive has no end of central directory (a truncated download?)");
  const unsigned char* e = &tail[static_cast<std::size_t>(eocd)];
  std::uint64_t records = le16(e + 10), dir_size = le32(e + 12), dir_offset = le32(e + 16);
  if (records == 0xFFFF || dir_offset == 0xFFFFFFFF) {  // ZIP64: the locator just before, then the zip64 record
    if (eocd < 20 || le32(e - 20) != 0x07064b50) throw fail("a ZIP64 archive without its locator");
    const std::uint64_t z64 = le64(e - 20 + 8);
    unsigned char r[56];
    if (z64 + sizeof r > size) throw fail("a ZIP64 archive whose end record lies past the end of the file");
    f.read_exact(r, sizeof r, z64);
    if (le32(r) != 0x06064b50) throw fail("a ZIP64 archive whose end record is damaged");
    records = le64(r + 32);
    dir_size = le64(r + 40);
    dir_offset = le64(r + 48);
  }
  if (dir_offset + dir_size > size) throw fail("its central directory lies past the end of the file (truncated?)");
  std::vector<unsigned char> dir(static_cast<std::size_t>(dir_size));
  f.read_exact(dir.data(), dir.size(), dir_offset);
  std::vector<unsigned char> buffer(std::size_t{4} << 20);
  std::size_t at = 0;
  for (std::uint64_t r = 0; r < records; ++r) {
    if (at + 46 > dir.size() || le32(&dir[at]) != 0x02014b50) throw fail("its central directory is damaged");
    const unsigned char* h = &dir[at];
    const std::uint16_t method = le16(h + 10), name_length = le16(h + 28), extra_length = le16(h + 30),
                        comment_length = le16(h + 32);
    const std::uint32_t crc = le32(h + 16);
    std::uint64_t compressed = le32(h + 20), uncompressed = le32(h + 24), local = le32(h + 42);
    if (at + 46 + name_length + extra_length > dir.size()) throw fail("its central directory is damaged");
    const std::string name(reinterpret_cast<const char*>(h + 46), name_length);
    // ZIP64 sizes and offset, in the order the 32-bit fields that overflow stand.
    for (std::size_t x = 0; x + 4 <= extra_length;) {
      const unsigned char* field = h + 46 + name_length + x;
      const std::uint16_t id = le16(field), length = le16(field + 2);
      if (id == 0x0001) {
        std::size_t v = 4;
        auto next = [&](std::uint64_t& into) {
          if (v + 8 <= 4u + length) into = le64(field + v), v += 8;
        };
        if (uncompressed == 0xFFFFFFFF) next(uncompressed);
        if (compressed == 0xFFFFFFFF) next(compressed);
        if (local == 0xFFFFFFFF) next(local);
      }
      x += 4 + length;
    }
    at += 46 + name_length + extra_length + comment_length;
    if (method != 0) continue;  // compressed: the reader inflates and checks it
    unsigned char l[30];
    if (local + sizeof l > size) throw fail(str("record '", name, "' lies past the end of the file (truncated?)"));
    f.read_exact(l, sizeof l, local);
    if (le32(l) != 0x04034b50) throw fail(str("record '", name, "': its local header is damaged"));
    const std::uint64_t data = local + 30 + le16(l + 26) + le16(l + 28);
    if (data + uncompressed > size) throw fail(str("record '", name, "' lies past the end of the file (truncated?)"));
    uLong sum = crc32(0L, Z_NULL, 0);
    for (std::uint64_t done = 0; done < uncompressed;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), uncompressed - done));
      f.read_exact(buffer.data(), n, data + done);
      sum = crc32(sum, buffer.data(), static_cast<uInt>(n));
      done += n;
    }
    if (static_cast<std::uint32_t>(sum) != crc) {
      char want[16], got[16];
      std::snprintf(want, sizeof want, "%08x", crc);
      std::snprintf(got, sizeof got, "%08x", static_cast<std::uint32_t>(sum));
      throw fail(str("record '", name, "' is damaged: the archive gives CRC-32 ", want, ", its ", uncompressed,
                     " bytes give ", got, " (a partial or corrupted download?)"));
    }
  }
}

}  // namespace

std::map<std::string, at::Tensor> read_state_dict(const std::string& path) {
  auto fail = [&](const std::string& what) { return FormatError(str("pretrained weights ", path, ": ", what)); };
  {
    char magic[4] = {};
    const os::File f = os::File::open(path, os::File::Mode::read);
    if (f.read_at(magic, 4, 0) < 4 || magic[0] != 'P' || magic[1] != 'K') {
      throw fail("not a torch.save file (expected the zip format PyTorch >= 1.6 writes: torch.save(model.state_dict(), FILE))");
    }
  }
  check_zip_crcs(path, fail);  // before any byte of it is used
  ValuePtr root;
  try {
    caffe2::serialize::PyTorchStreamReader zip(path);
    if (!zip.hasRecord("data.pkl")) throw fail("the zip archive has no data.pkl: not written by torch.save");
    auto [data, size] = zip.getRecord("data.pkl");
    const std::vector<char> pickle(static_cast<const char*>(data.get()), static_cast<const char*>(data.get()) + size);
    root = Unpickler(pickle, zip).run();
  } catch (const c10::Error& e) {
    throw fail(str("unreadable torch.save archive: ", e.what_without_backtrace()));
  } catch (const FormatError& e) {
    if (std::string(e.what()).rfind("pretrained weights", 0) == 0) throw;
    throw fail(e.what());
  }
  if (root->kind != Value::Kind::dict) {
    throw fail("holds no dict: expected a state_dict (names to tensors), as torch.save(model.state_dict(), FILE) writes");
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [k, v] : root->pairs) {
    if (k->kind != Value::Kind::string) throw fail("a key of the dict is not a string: not a state_dict");
    const std::string key = k->s.rfind("module.", 0) == 0 ? k->s.substr(7) : k->s;
    if (v->kind != Value::Kind::tensor) throw fail(str("entry '", key, "' is not a tensor"));
    if (!out.emplace(key, v->t).second) throw fail(str("key '", key, "' appears twice (with and without module.)"));
  }
  return out;
}

}  // namespace

PretrainedReport load_state_dict_file(const std::string& path, torch::nn::Module& module) {
  auto fail = [&](const std::string& what) { return FormatError(str("pretrained weights ", path, ": ", what)); };
  const std::map<std::string, at::Tensor> file = read_state_dict(path);
  // Check everything before changing anything.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, source)
  std::map<std::string, bool> used;
  auto match = [&](const std::string& name, const at::Tensor& target) {
    auto it = file.find(name);
    if (it == file.end()) {
      throw fail(str("has no tensor '", name, "' (", file.size(), " tensors in the file; was it saved from the same "
                     "network with the same arguments?)"));
    }
    if (it->second.sizes() != target.sizes()) {
      throw fail(str("tensor '", name, "' has shape ", it->second.sizes(), ", the configured network expects ",
                     target.sizes(), " (check the model's arguments: channels, feature_size, in/out_channels)"));
    }
    used[name] = true;
    copies.emplace_back(target, it->second);
  };
  for (const auto& p : module.named_parameters(true)) match(p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) match(b.key(), b.value());
  for (const auto& [name, t] : file) {
    if (!used.count(name)) {
      throw fail(str("has a tensor '", name, "' (shape ", t.sizes(), ") that the configured network does not have"));
    }
  }
  torch::NoGradGuard no_grad;
  PretrainedReport r;
  for (auto& [dst, src] : copies) {
    dst.copy_(src);
    ++r.tensors;
    r.elements += static_cast<std::size_t>(src.numel());
  }
  return r;
}

}  // namespace medfast::nn
