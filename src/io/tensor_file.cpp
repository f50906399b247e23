#include "medfast/io/tensor_file.hpp"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/os/file.hpp"

namespace medfast::io {

namespace {

constexpr char kMagic[8] = {'M', 'F', 'T', 'E', 'N', 'S', 'O', 'R'};
constexpr std::size_t kFixedHeader = 16;

const std::map<std::string, at::ScalarType>& dtypes() {
  static const std::map<std::string, at::ScalarType> m{
      {"bool", at::kBool},       {"uint8", at::kByte},   {"int8", at::kChar},       {"int16", at::kShort},
      {"int32", at::kInt},       {"int64", at::kLong},   {"float16", at::kHalf},    {"bfloat16", at::kBFloat16},
      {"float32", at::kFloat},   {"float64", at::kDouble}};
  return m;
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& [name, type] : dtypes()) {
    if (type == t) return name;
  }
  throw ValueError(str("save_tensor: dtype ", t, " is not supported (", "bool, uint8, int8, int16, int32, int64, "
                       "float16, bfloat16, float32, float64)"));
}

/// Writes `path` through a temporary name: `fill` writes the content through a
/// FileHandle on the temporary file; commit() renames it into place.
template <typename Fill>
void write_atomically(const std::string& path, const IoOptions& io, bool durable, Fill&& fill) {
  // os::AtomicWriter's naming, so that cache prune and run starts recognise a killed writer's file.
  const std::string temp = os::temporary_path(path);
  try {
    {
      FileHandle f = FileHandle::open(temp, FileHandle::Mode::write, io);
      fill(f);
      if (durable) f.sync();
    }
    os::rename(temp, path);
    if (durable) os::sync_directory(os::parent_directory(path));
  } catch (...) {
    os::remove_file(temp);
    rethrow_with_context(str("writing ", path));
  }
}

}  // namespace

void save_bytes(const at::Tensor& tensor, const std::string& path, const IoOptions& io, bool durable) {
  MEDFAST_CHECK_T(ValueError, tensor.defined(), "save: the tensor is undefined");
  const at::Tensor t = tensor.contiguous();
  write_atomically(path, io, durable, [&](FileHandle& f) { write_from(f, t, 0); });
}

at::Tensor load_bytes(const std::string& path, at::Tensor out, const std::string& device, const IoOptions& io) {
  FileHandle f = FileHandle::open(path, FileHandle::Mode::read, io);
  if (!out.defined()) {
    const at::Device dev(device);
    const auto size = static_cast<std::size_t>(f.size());
    out = dev.is_cpu() ? empty_aligned(size)
                       : at::empty({static_cast<std::int64_t>(size)}, at::TensorOptions().dtype(at::kByte).device(dev));
  }
  MEDFAST_CHECK_T(ValueError, out.is_contiguous(), "load: ", path, ": the destination tensor must be contiguous");
  const std::size_t want = std::min<std::size_t>(tensor_bytes(out), static_cast<std::size_t>(f.size()));
  if (want == 0) return out;
  const at::Tensor target = out.view({-1}).view(at::kByte).narrow(0, 0, static_cast<std::int64_t>(want));
  read_into(f, target, 0);
  return out;
}

void save_tensor(const at::Tensor& tensor, const std::string& path, const IoOptions& io, bool durable) {
  MEDFAST_CHECK_T(ValueError, tensor.defined(), "save_tensor: the tensor is undefined");
  const at::Tensor t = tensor.contiguous();
  const std::size_t n = tensor_bytes(t);
  nlohmann::json meta{{"dtype", dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()}, {"bytes", n}};
  // A CPU payload's checksum costs a pass over memory; a GPU payload's would cost a copy to the host.
  meta["xxh3"] = t.is_cpu() ? nlohmann::json(XXH3_64bits(t.data_ptr(), n)) : nlohmann::json();
  const std::string json = meta.dump();
  const std::uint64_t data_offset =
      (kFixedHeader + json.size() + kTensorFileAlignment - 1) / kTensorFileAlignment * kTensorFileAlignment;
  std::string head(static_cast<std::size_t>(data_offset), '\0');
  std::memcpy(head.data(), kMagic, 8);
  const std::uint32_t version = kTensorFileVersion, length = static_cast<std::uint32_t>(json.size());
  std::memcpy(head.data() + 8, &version, 4);
  std::memcpy(head.data() + 12, &length, 4);
  std::memcpy(head.data() + kFixedHeader, json.data(), json.size());
  write_atomically(path, io, durable, [&](FileHandle& f) {
    f.write(head.data(), head.size(), 0);
    if (n > 0) write_from(f, t, data_offset);
  });
}

at::Tensor load_tensor(const std::string& path, const std::string& device, const IoOptions& io, bool verify) {
  FileHandle f = FileHandle::open(path, FileHandle::Mode::read, io);
  auto bad = [&](const std::string& what) { return FormatError(str(path, ": ", what)); };
  char fixed[kFixedHeader];
  if (f.size() < kFixedHeader || f.read(fixed, kFixedHeader, 0) != kFixedHeader) {
    throw bad(str("not a medfast tensor file (", f.size(), " bytes: too short for its header)"));
  }
  if (std::memcmp(fixed, kMagic, 8) != 0) throw bad("not a medfast tensor file (no MFTENSOR magic)");
  std::uint32_t version = 0, length = 0;
  std::memcpy(&version, fixed + 8, 4);
  std::memcpy(&length, fixed + 12, 4);
  if (version != kTensorFileVersion) {
    throw bad(str("tensor file format version ", version, " (this medfast reads ", kTensorFileVersion, ")"));
  }
  if (length > (1u << 20) || kFixedHeader + length > f.size()) throw bad(str("header length ", length, " is impossible"));
  std::string json(length, '\0');
  f.read_exact(json.data(), length, kFixedHeader);
  nlohmann::json meta;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype;
  std::uint64_t n = 0;
  try {
    meta = parse_json_document(json, str(path, ": header"));
    const auto it = dtypes().find(meta.at("dtype").get<std::string>());
    if (it == dtypes().end()) throw bad(str("unknown dtype ", meta.at("dtype").dump()));
    dtype = it->second;
    shape = meta.at("shape").get<std::vector<std::int64_t>>();
    n = meta.at("bytes").get<std::uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw bad(str("damaged header: ", e.what()));
  }
  std::uint64_t numel = 1;
  for (const auto d : shape) {
    if (d < 0) throw bad("negative size in the shape");
  }
  for (const auto d : shape) {
    if (d == 0) numel = 0;
  }
  for (const auto d : shape) {
    if (numel == 0) break;
    // Every element has at least one byte: a product above the byte count is a damaged
    // header (and checking before multiplying keeps it from wrapping around).
    if (numel > n / static_cast<std::uint64_t>(d)) throw bad(str("shape and byte count disagree (", n, " bytes)"));
    numel *= static_cast<std::uint64_t>(d);
  }
  if (numel * c10::elementSize(dtype) != n) throw bad(str("shape and byte count disagree (", n, " bytes)"));
  const std::uint64_t data_offset =
      (kFixedHeader + length + kTensorFileAlignment - 1) / kTensorFileAlignment * kTensorFileAlignment;
  if (data_offset + n > f.size()) {
    throw bad(str("cut short: the payload needs ", data_offset + n, " bytes, the file has ", f.size()));
  }
  const at::Device dev(device);
  at::Tensor raw = dev.is_cpu() ? empty_aligned(static_cast<std::size_t>(n))
                                : at::empty({static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(at::kByte).device(dev));
  const bool check = verify && meta.contains("xxh3") && meta["xxh3"].is_number();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  HostBytes observe;
  if (check) observe = [&](const void* d, std::size_t k) { XXH3_64bits_update(state.get(), d, k); };
  if (n > 0 && read_into(f, raw, data_offset, observe) != n) throw bad("cut short while reading the payload");
  if (check && XXH3_64bits_digest(state.get()) != meta["xxh3"].get<std::uint64_t>()) {
    throw bad("payload checksum mismatch (the file is damaged)");
  }
  return raw.view(dtype).view(shape);
}

}  // namespace medfast::io
