#include "medfast/train/checkpoint.hpp"

#include <torch/torch.h>
#include <xxhash.h>

#include <cstring>
#include <sstream>

#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/file.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/train/optim.hpp"

namespace medfast::train {

namespace {

constexpr char kMagic[8] = {'M', 'F', 'C', 'K', 'P', 'T', '0', '1'};
constexpr std::size_t kHeader = 32;

void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

/// A checkpoint file read and verified; the archive stays inside `bytes` (no copy).
struct Parts {
  nlohmann::json meta;
  std::string bytes;
  std::size_t archive_offset = 0, archive_size = 0;
};

Parts read_parts(const std::string& path) {
  Parts p;
  p.bytes = os::read_text_file(path);
  const std::string& bytes = p.bytes;
  auto fail = [&](const std::string& what) { return FormatError(str("checkpoint ", path, ": ", what)); };
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    throw fail("not a medfast checkpoint (magic MFCKPT01 missing)");
  }
  const std::uint64_t j = get_u64(bytes.data() + 8), a = get_u64(bytes.data() + 16);
  if (j > bytes.size() || a > bytes.size() || kHeader + j + a != bytes.size()) {
    throw fail(str("truncated or damaged: the header describes ", kHeader + j + a, " bytes, the file has ", bytes.size()));
  }
  const std::uint64_t want = get_u64(bytes.data() + 24);
  const std::uint64_t got = XXH3_64bits(bytes.data() + kHeader, j + a);
  if (want != got) throw fail("damaged: checksum mismatch");
  try {
    p.meta = parse_json_document(std::string(bytes.data() + kHeader, j), "JSON document");
  } catch (const FormatError& e) {
    throw fail(str("damaged: ", e.message()));
  }
  p.archive_offset = kHeader + j;
  p.archive_size = a;
  return p;
}

}  // namespace

namespace {
/// A tensor as files hold it: on the CPU, contiguous with the exact NCDHW strides (one
/// channel included: nn::to_memory_format).
at::Tensor as_stored(const at::Tensor& t) {
  const at::Tensor cpu = t.cpu();
  return cpu.dim() == 5 ? nn::to_memory_format(cpu, at::MemoryFormat::Contiguous) : cpu.contiguous();
}
}  // namespace

void save_checkpoint(const std::string& path, const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                     const nlohmann::json& meta) {
  torch::serialize::OutputArchive archive;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    archive.write("model." + p.key(), as_stored(p.value().detach()));
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    archive.write("model." + b.key(), as_stored(b.value()), true);
  }
  if (optimizer) {
    // The state contiguous for the write (a swap of tensors, no change of values), back after.
    std::vector<std::pair<at::Tensor*, at::Tensor>> kept;
    for_each_state_tensor(*optimizer, [&](const at::Tensor&, at::Tensor& t) {
      const at::Tensor stored = as_stored(t);
      if (stored.is_same(t)) return;
      kept.emplace_back(&t, t);
      t = stored;
    });
    torch::serialize::OutputArchive opt;
    try {
      optimizer->save(opt);
    } catch (...) {
      for (auto& [where, t] : kept) *where = t;
      throw;
    }
    for (auto& [where, t] : kept) *where = t;
    archive.write("optimizer", opt);
  }
  std::ostringstream os;
  archive.save_to(os);
  const std::string a = os.str();
  const std::string j = meta.dump();
  XXH3_state_t* state = XXH3_createState();
  if (!state) throw Error("save_checkpoint: out of memory for the checksum state");
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, j.data(), j.size());
  XXH3_64bits_update(state, a.data(), a.size());
  const std::uint64_t checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  char header[kHeader];
  std::memcpy(header, kMagic, 8);
  put_u64(header + 8, j.size());
  put_u64(header + 16, a.size());
  put_u64(header + 24, checksum);
  try {
    os::make_directories(os::parent_directory(path));
    os::AtomicWriter w(path);
    w.append(header, kHeader);
    w.append(j.data(), j.size());
    w.append(a.data(), a.size());
    w.commit();
  } catch (Error& e) {
    e.add_context(str("writing checkpoint ", path));
    throw;
  }
}

nlohmann::json read_checkpoint_meta(const std::string& path) { return read_parts(path).meta; }

namespace {

/// Checkpoints written before medfast's UNet took MONAI's layer names (`model.0.conv.unit0...`
/// instead of `model.0.0.conv.0.0...`) hold the same tensors in the same order under the old
/// names. When none of the network's names is in the archive but its tensors, in order, have
/// exactly the network's shapes, they are loaded by position (with a warning); false
/// otherwise, and the by-name load reports the first missing name.
bool load_by_position(torch::serialize::InputArchive& archive,
                      const std::vector<std::pair<std::string, torch::Tensor>>& targets, const std::string& path) {
  c10::IValue v;
  for (const auto& [name, t] : targets) {
    if (archive.try_read("model." + name, v)) return false;
  }
  std::vector<torch::Tensor> stored;
  for (const auto& key : archive.keys()) {
    if (key.rfind("model.", 0) != 0) continue;
    if (!archive.try_read(key, v) || !v.isTensor()) return false;
    stored.push_back(v.toTensor());
  }
  if (stored.size() != targets.size() || stored.empty()) return false;
  for (std::size_t i = 0; i < stored.size(); ++i) {
    if (stored[i].sizes() != targets[i].second.sizes() || stored[i].dtype() != targets[i].second.dtype()) return false;
  }
  for (std::size_t i = 0; i < stored.size(); ++i) targets[i].second.copy_(stored[i]);
  log::warn("checkpoint ", path, ": written with earlier layer names; its ", stored.size(),
            " tensors were loaded by position (their shapes match the network's one for one)");
  return true;
}

}  // namespace

nlohmann::json load_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  Parts parts = read_parts(path);
  auto fail = [&](const std::string& what) { return FormatError(str("checkpoint ", path, ": ", what)); };
  torch::serialize::InputArchive archive;
  try {
    // Tensors go where the network is (optimizer state included): a checkpoint written on
    // cuda:0 resumes on cuda:N or on a CPU-only machine.
    const auto params = module.parameters();
    const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
    archive.load_from(parts.bytes.data() + parts.archive_offset, parts.archive_size, device);
  } catch (const c10::Error& e) {
    throw fail(str("unreadable tensor archive: ", e.what_without_backtrace()));
  }
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, torch::Tensor target) {
    c10::IValue v;
    if (!archive.try_read("model." + name, v) || !v.isTensor()) {
      throw fail(str("has no tensor '", name, "' (was it written for another network?)"));
    }
    const torch::Tensor t = v.toTensor();
    if (t.sizes() != target.sizes()) {
      throw fail(str("tensor '", name, "' has shape ", t.sizes(), ", the network expects ", target.sizes()));
    }
    target.copy_(t);
  };
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  for (auto& p : module.named_parameters(true)) targets.emplace_back(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) targets.emplace_back(b.key(), b.value());
  if (!load_by_position(archive, targets, path)) {
    for (auto& [name, t] : targets) load(name, t);
  }
  if (optimizer) {
    torch::serialize::InputArchive opt;
    if (!archive.try_read("optimizer", opt)) throw fail("has no optimizer state");
    try {
      load_optimizer_state(*optimizer, opt);
    } catch (const c10::Error& e) {
      throw fail(str("the optimizer state does not fit this optimizer: ", e.what_without_backtrace()));
    } catch (const ValueError& e) {
      throw fail(str("the optimizer state does not fit this optimizer: ", e.what()));
    }
  }
  return parts.meta;
}

namespace {
/// Every tensor of an archive, recursively, keyed by its path ("a/b" for b in sub-archive a).
void collect_tensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                     std::map<std::string, at::Tensor>& out) {
  for (const std::string& key : archive.keys()) {
    c10::IValue v;
    if (archive.try_read(key, v) && v.isTensor()) {
      out[prefix + key] = v.toTensor();
      continue;
    }
    torch::serialize::InputArchive sub;
    if (archive.try_read(key, sub)) collect_tensors(sub, prefix + key + "/", out);
  }
}
}  // namespace

std::map<std::string, at::Tensor> read_checkpoint_tensors(const std::string& path) {
  Parts parts = read_parts(path);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(parts.bytes.data() + parts.archive_offset, parts.archive_size, at::kCPU);
  } catch (const c10::Error& e) {
    throw FormatError(str("checkpoint ", path, ": unreadable tensor archive: ", e.what_without_backtrace()));
  }
  std::map<std::string, at::Tensor> all, out;
  collect_tensors(archive, "", all);
  for (auto& [key, t] : all) out[key.rfind("model.", 0) == 0 ? key.substr(6) : key] = t;
  return out;
}

}  // namespace medfast::train
