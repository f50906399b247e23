// torch.save's zip format, written: a state_dict (an OrderedDict of names to tensors) that
// torch.load(FILE, weights_only=True) reads on PyTorch 1.13 and 2.x. The pickle uses only
// what weights_only allows (collections.OrderedDict, torch._utils._rebuild_tensor_v2,
// torch.<T>Storage persistent ids); each tensor's data is its own zip record "data/<n>",
// written by libtorch's PyTorchStreamWriter (64-byte aligned, uncompressed) into an
// os::AtomicWriter.
#include "medfast/nn/pretrained.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <cstring>
#include <exception>
#include <map>

#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"

namespace medfast::nn {

namespace {

/// Protocol 2 pickle opcodes (Lib/pickle.py).
class Pickle {
 public:
  Pickle() { bytes_ += "\x80\x02"; }  // PROTO 2
  void global(const char* module, const char* name) { bytes_ += str("c", module, "\n", name, "\n"); }
  void mark() { bytes_ += '('; }
  void tuple() { bytes_ += 't'; }
  void empty_tuple() { bytes_ += ')'; }
  void reduce() { bytes_ += 'R'; }
  void setitems() { bytes_ += 'u'; }
  void persid() { bytes_ += 'Q'; }  // BINPERSID
  void boolean(bool b) { bytes_ += b ? '\x88' : '\x89'; }
  void stop() { bytes_ += '.'; }
  void text(const std::string& s) {  // BINUNICODE: u32 length, UTF-8
    bytes_ += 'X';
    little(static_cast<std::uint64_t>(s.size()), 4);
    bytes_ += s;
  }
  void integer(std::int64_t v) {
    if (v >= 0 && v < 256) {
      bytes_ += 'K';  // BININT1
      bytes_ += static_cast<char>(v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      bytes_ += 'J';  // BININT: signed 32-bit
      little(static_cast<std::uint64_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(v))), 4);
    } else {
      bytes_ += '\x8a';  // LONG1: 8 bytes of two's complement
      bytes_ += '\x08';
      little(static_cast<std::uint64_t>(v), 8);
    }
  }
  /// An empty OrderedDict: collections.OrderedDict()
  void ordered_dict() {
    global("collections", "OrderedDict");
    empty_tuple();
    reduce();
  }
  const std::string& bytes() const { return bytes_; }

 private:
  void little(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string bytes_;
};

const char* storage_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "FloatStorage";
    case at::kDouble: return "DoubleStorage";
    case at::kHalf: return "HalfStorage";
    case at::kBFloat16: return "BFloat16Storage";
    case at::kLong: return "LongStorage";
    case at::kInt: return "IntStorage";
    case at::kShort: return "ShortStorage";
    case at::kChar: return "CharStorage";
    case at::kByte: return "ByteStorage";
    case at::kBool: return "BoolStorage";
    default: throw ValueError(str("a tensor of dtype ", t, " has no torch.save storage type medfast writes"));
  }
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> state_dict_of(const torch::nn::Module& module) {
  // PyTorch's order: each module's own parameters, then its own buffers, then its children.
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& m : module.named_modules("", /*include_self=*/true)) {
    const std::string prefix = m.key().empty() ? "" : m.key() + ".";
    for (const auto& p : m.value()->named_parameters(false)) out.emplace_back(prefix + p.key(), p.value());
    for (const auto& b : m.value()->named_buffers(false)) out.emplace_back(prefix + b.key(), b.value());
  }
  return out;
}

std::size_t save_state_dict_file(const std::string& path, const torch::nn::Module& module) {
  const auto tensors = state_dict_of(module);
  Pickle pk;
  pk.ordered_dict();
  pk.mark();
  std::vector<at::Tensor> storages;
  std::map<const void*, std::size_t> written;  // a tensor's implementation -> its storage's key
  for (const auto& [name, t] : tensors) {
    // Each tensor its own contiguous CPU storage; a tensor the module holds under two names
    // (DynUNet's skip_layers, as MONAI's) is one storage, as torch.save writes it.
    const auto same = written.find(t.unsafeGetTensorImpl());
    const bool shared = same != written.end();
    const at::Tensor data = shared ? storages[same->second] : t.detach().to(at::kCPU).contiguous().clone();
    const std::string key = std::to_string(shared ? same->second : storages.size());
    if (!shared) written.emplace(t.unsafeGetTensorImpl(), storages.size());
    pk.text(name);
    pk.global("torch._utils", "_rebuild_tensor_v2");
    pk.mark();
    {
      pk.mark();  // the persistent id: ('storage', torch.<T>Storage, key, 'cpu', numel)
      pk.text("storage");
      pk.global("torch", storage_name(data.scalar_type()));
      pk.text(key);
      pk.text("cpu");
      pk.integer(data.numel());
      pk.tuple();
      pk.persid();
      pk.integer(0);  // storage offset
      pk.mark();
      for (const auto s : data.sizes()) pk.integer(s);
      pk.tuple();
      pk.mark();
      for (const auto s : data.strides()) pk.integer(s);
      pk.tuple();
      pk.boolean(false);  // requires_grad: a state_dict holds detached tensors
      pk.ordered_dict();  // backward hooks
    }
    pk.tuple();
    pk.reduce();
    if (!shared) storages.push_back(data);
  }
  pk.setitems();
  pk.stop();

  os::AtomicWriter out(path);
  std::size_t bytes = 0;
  // The zip writer's callback must not throw (its destructor writes through it too): a
  // failed write (a full disk) is kept and rethrown once the writer is done with.
  std::exception_ptr failed;
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* data, std::size_t size) -> std::size_t {
      if (failed) return size;
      try {
        out.append(data, size);
        bytes += size;
      } catch (...) {
        failed = std::current_exception();
      }
      return size;
    });
    zip.writeRecord("data.pkl", pk.bytes().data(), pk.bytes().size());
    static const char kLittle[] = "little";  // torch >= 2.1 reads it; older ones ignore it
    zip.writeRecord("byteorder", kLittle, sizeof kLittle - 1);
    for (std::size_t i = 0; i < storages.size(); ++i) {
      const at::Tensor& s = storages[i];
      zip.writeRecord(str("data/", i), s.data_ptr(), static_cast<std::size_t>(s.numel()) * s.element_size());
    }
    zip.writeEndOfFile();
  }
  if (failed) std::rethrow_exception(failed);  // the temporary file goes with `out`
  out.commit();
  return bytes;
}

}  // namespace medfast::nn
