#include "medfast/cache/entry.hpp"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "medfast/io/tensor_io.hpp"
#include "medfast/os/file.hpp"

namespace medfast::cache {

namespace {

std::uint64_t align_up(std::uint64_t v) { return (v + kPayloadAlignment - 1) / kPayloadAlignment * kPayloadAlignment; }

std::string dtype_text(at::ScalarType t) {
  const std::string name = dtype_name(t);
  parse_dtype(name, "cache: stored tensor");  // rejects dtypes a cache cannot hold (complex...)
  return name;
}

// True if every value is a whole number in [lo, hi]; stops at the first that is not.
template <typename T>
bool all_whole_in(const at::Tensor& t, double lo, double hi) {
  const at::Tensor c = t.contiguous();
  const T* p = c.data_ptr<T>();
  const std::int64_t n = c.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(p[i]);
    if (!(v >= lo && v <= hi) || v != std::floor(v)) return false;
  }
  return true;
}

// The smallest lossless storage for a tensor.
at::Tensor narrow_for_storage(const at::Tensor& t) {
  if (t.numel() == 0) return t;
  switch (t.scalar_type()) {
    case at::kFloat:
      return all_whole_in<float>(t, 0, 255) ? t.to(at::kByte) : t;
    case at::kDouble:
      return all_whole_in<double>(t, 0, 255) ? t.to(at::kByte) : t;
    case at::kLong:
      return all_whole_in<std::int64_t>(t, INT32_MIN, INT32_MAX) ? t.to(at::kInt) : t;
    default:
      return t;
  }
}

nlohmann::json affine_json(const Affine& a) {
  nlohmann::json v = nlohmann::json::array();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) v.push_back(a(i, j));
  return v;
}

nlohmann::json volume_meta_json(const VolumeMeta& m) {
  return {{"source", m.source},         {"nifti_version", m.nifti_version}, {"disk_datatype", m.disk_datatype},
          {"qform_code", m.qform_code}, {"sform_code", m.sform_code},       {"xyzt_units", m.xyzt_units},
          {"descrip", m.descrip},       {"pixdim", m.pixdim}};
}

void volume_meta_from(const nlohmann::json& j, VolumeMeta& m) {
  m.source = j.value("source", "");
  m.nifti_version = j.value("nifti_version", 0);
  m.disk_datatype = j.value("disk_datatype", 0);
  m.qform_code = j.value("qform_code", 0);
  m.sform_code = j.value("sform_code", 0);
  m.xyzt_units = j.value("xyzt_units", 0);
  m.descrip = j.value("descrip", "");
  if (j.contains("pixdim")) m.pixdim = j["pixdim"].get<std::array<double, 8>>();
}

}  // namespace

std::uint64_t write_entry(const std::string& path, const std::string& key, const Sample& sample,
                          const nlohmann::json& extra) {
  struct Payload {
    std::string name;
    bool volume;
    at::Tensor stored;
    std::string dtype;
    std::vector<std::int64_t> shape;
  };
  std::vector<Payload> payloads;
  for (const auto& [name, v] : sample.volumes) {
    const at::Tensor t = v.data.is_cpu() ? v.data : v.data.cpu();
    payloads.push_back({name, true, narrow_for_storage(t).contiguous(), dtype_text(t.scalar_type()), t.sizes().vec()});
  }
  for (const auto& [name, a] : sample.arrays) {
    const at::Tensor t = a.is_cpu() ? a : a.cpu();
    payloads.push_back({name, false, narrow_for_storage(t).contiguous(), dtype_text(t.scalar_type()), t.sizes().vec()});
  }
  // Lay out: the JSON must know the offsets, and the offsets depend on the
  // JSON's length; reserve room and fix the layout with a second pass.
  nlohmann::json meta = extra.is_object() ? extra : nlohmann::json::object();
  meta["key"] = key;
  meta["format_version"] = kEntryFormatVersion;
  meta["sample_meta"] = sample.meta;
  nlohmann::json volumes = nlohmann::json::object();
  for (const auto& [name, v] : sample.volumes) {
    volumes[name] = {{"affine", affine_json(v.affine)}, {"meta", volume_meta_json(v.meta)}};
  }
  meta["volumes"] = volumes;
  std::string json;
  std::uint64_t data_start = 0;
  for (int pass = 0; pass < 3; ++pass) {
    nlohmann::json list = nlohmann::json::array();
    std::uint64_t offset = data_start;
    for (const auto& p : payloads) {
      const std::uint64_t length = static_cast<std::uint64_t>(p.stored.numel()) * p.stored.element_size();
      list.push_back({{"name", p.name},
                      {"kind", p.volume ? "volume" : "array"},
                      {"dtype", p.dtype},
                      {"stored_dtype", dtype_text(p.stored.scalar_type())},
                      {"shape", p.shape},
                      {"offset", offset},
                      {"length", length},
                      {"xxh3", entry_checksum(p.stored.data_ptr(), static_cast<std::size_t>(length))}});
      offset = align_up(offset + length);
    }
    meta["payloads"] = list;
    json = meta.dump();
    const std::uint64_t start = align_up(kEntryHeaderBytes + json.size());
    if (start == data_start) break;
    data_start = start;
  }
  std::uint64_t file_size = data_start;
  for (const auto& p : meta["payloads"]) file_size = p["offset"].get<std::uint64_t>() + p["length"].get<std::uint64_t>();

  const std::string header = entry_header(json, static_cast<std::uint32_t>(payloads.size()), file_size);
  os::make_directories(os::parent_directory(path));
  os::AtomicWriter w(path);
  w.append(header.data(), header.size());
  w.append(json.data(), json.size());
  const std::string zeros(kPayloadAlignment, '\0');
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    const auto offset = meta["payloads"][i]["offset"].get<std::uint64_t>();
    if (offset > w.written()) w.append(zeros.data(), static_cast<std::size_t>(offset - w.written()));
    const auto length = meta["payloads"][i]["length"].get<std::uint64_t>();
    w.append(payloads[i].stored.data_ptr(), static_cast<std::size_t>(length));
  }
  w.commit();
  return file_size;
}

Sample read_entry(const std::string& path, const std::string& expected_key, const io::IoOptions& io,
                  const std::string& device, bool verify_payloads) {
  io::FileHandle f = io::FileHandle::open(path, io::FileHandle::Mode::read, io);
  const EntryHead head = read_entry_head(f);
  const auto& meta = head.meta;
  if (!expected_key.empty() && meta.value("key", "") != expected_key) {
    throw CorruptEntry(str(path, ": cache entry holds key ", meta.value("key", "?"), ", expected ", expected_key));
  }
  Sample s;
  try {
    s.meta = meta.at("sample_meta");
    const at::Device dev(device);
    for (const auto& p : meta.at("payloads")) {
      const PayloadExtent e = checked_payload(path, p, head.file_size);
      const std::uint64_t offset = e.offset, length = e.length;
      const std::vector<std::int64_t>& shape = e.shape;
      const at::ScalarType stored = parse_dtype(p.at("stored_dtype"), "cache entry");
      const at::ScalarType logical = parse_dtype(p.at("dtype"), "cache entry");
      // Host payloads land in O_DIRECT-aligned memory; device payloads straight in GPU memory.
      // Index arrays (FgBgToIndices' runs) stay on the host even for a device read: the
      // random crops read them with the CPU, and a GPU copy would come back every sample.
      const at::Device pdev = p.at("kind") == "volume" ? dev : at::Device(at::kCPU);
      at::Tensor raw = pdev.is_cpu() ? io::empty_aligned(static_cast<std::size_t>(length))
                                     : at::empty({static_cast<std::int64_t>(length)},
                                                 at::TensorOptions().dtype(at::kByte).device(pdev));
      XXH3_state_t* state = XXH3_createState();
      if (!state) throw std::bad_alloc();
      std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> owned(state, &XXH3_freeState);
      XXH3_64bits_reset(state);
      const bool verify = verify_payloads || pdev.is_cpu();
      io::HostBytes observe;
      if (verify) observe = [state](const void* d, std::size_t n) { XXH3_64bits_update(state, d, n); };
      const std::size_t got = length == 0 ? 0 : io::read_into(f, raw, offset, observe);
      if (got != length) {
        throw CorruptEntry(str(path, ": payload ", e.name, " is cut short (", got, " of ",
                               length, " bytes)"));
      }
      if (verify && XXH3_64bits_digest(state) != p.at("xxh3").get<std::uint64_t>()) {
        throw CorruptEntry(str(path, ": payload ", e.name, " checksum mismatch"));
      }
      at::Tensor t = raw.view(stored).view(shape);
      if (stored != logical) t = t.to(logical);
      const std::string& name = e.name;
      if (p.at("kind") == "volume") {
        Volume v;
        v.data = t;
        const auto& vm = meta.at("volumes").at(name);
        const auto aff = vm.at("affine").get<std::vector<double>>();
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) v.affine(i, j) = aff.at(static_cast<std::size_t>(4 * i + j));
        volume_meta_from(vm.at("meta"), v.meta);
        s.volumes[name] = std::move(v);
      } else {
        s.arrays[name] = t;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptEntry(str(path, ": cache entry metadata is incomplete: ", e.what()));
  } catch (const ValueError& e) {
    throw CorruptEntry(str(path, ": ", e.what()));
  }
  return s;
}

}  // namespace medfast::cache
