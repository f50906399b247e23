// A cache entry's file format without tensors (see entry_file.hpp).
#include "medfast/cache/entry_file.hpp"

#include "medfast/os/file.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "medfast/core/document.hpp"

namespace medfast::cache {

namespace {

constexpr char kMagic[8] = {'M', 'F', 'C', 'A', 'C', 'H', 'E', '\0'};
constexpr std::uint32_t kMaxJsonBytes = 64u << 20;

struct Header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t json_length;
  std::uint32_t payloads;
  std::uint32_t reserved;
  std::uint64_t json_hash;
  std::uint64_t file_size;
  char pad[24];
};
static_assert(sizeof(Header) == kEntryHeaderBytes, "cache entry header is 64 bytes");

EntryHead parse_head(const std::string& path, const std::string& bytes_prefix, std::uint64_t file_size) {
  if (bytes_prefix.size() < kEntryHeaderBytes) {
    throw CorruptEntry(
        str(path, ": cache entry is truncated (", file_size, " bytes, the header needs ", kEntryHeaderBytes, ")"));
  }
  Header h;
  std::memcpy(&h, bytes_prefix.data(), kEntryHeaderBytes);
  if (std::memcmp(h.magic, kMagic, 8) != 0) throw CorruptEntry(str(path, ": not a medfast cache entry (bad magic)"));
  if (h.version != kEntryFormatVersion) {
    throw CorruptEntry(str(path, ": cache entry format version ", h.version, ", expected ", kEntryFormatVersion));
  }
  if (h.file_size != file_size) {
    throw CorruptEntry(str(path, ": cache entry is ", file_size, " bytes, its header says ", h.file_size,
                           " (truncated or appended to)"));
  }
  if (h.json_length > kMaxJsonBytes || kEntryHeaderBytes + h.json_length > bytes_prefix.size()) {
    throw CorruptEntry(str(path, ": cache entry metadata length ", h.json_length, " is out of range"));
  }
  const char* json = bytes_prefix.data() + kEntryHeaderBytes;
  if (XXH3_64bits(json, h.json_length) != h.json_hash) {
    throw CorruptEntry(str(path, ": cache entry metadata checksum mismatch"));
  }
  EntryHead head;
  head.file_size = h.file_size;
  try {
    head.meta = parse_json_document(std::string(json, h.json_length), "metadata");
  } catch (const std::exception& e) {
    throw CorruptEntry(str(path, ": cache entry metadata is not JSON: ", e.what()));
  }
  return head;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

EntryHead read_entry_head(io::FileHandle& f) {
  const std::uint64_t size = f.size();
  std::string prefix(static_cast<std::size_t>(std::min<std::uint64_t>(size, 1u << 16)), '\0');
  prefix.resize(f.read(prefix.data(), prefix.size(), 0));
  if (prefix.size() >= kEntryHeaderBytes) {
    Header h;
    std::memcpy(&h, prefix.data(), kEntryHeaderBytes);
    const std::uint64_t need = kEntryHeaderBytes + std::min(h.json_length, kMaxJsonBytes);
    if (need > prefix.size() && need <= size) {
      prefix.resize(static_cast<std::size_t>(need));
      f.read_exact(prefix.data(), prefix.size(), 0);
    }
  }
  return parse_head(f.path(), prefix, size);
}

bool has_entry_magic(const std::string& path) {
  try {
    const os::FileInfo info = os::stat(path);
    if (!info.is_regular || info.size < sizeof kMagic) return false;
    char magic[sizeof kMagic];
    os::File f = os::File::open(path, os::File::Mode::read);
    if (f.read_at(magic, sizeof magic, 0) != sizeof magic) return false;
    return std::memcmp(magic, kMagic, sizeof kMagic) == 0;
  } catch (const Error&) {
    return false;
  }
}

nlohmann::json read_entry_meta(const std::string& path) {
  io::FileHandle f = io::FileHandle::open(path, io::FileHandle::Mode::read, io::IoOptions().set_backend("posix"));
  return read_entry_head(f).meta;
}

std::string entry_header(const std::string& json, std::uint32_t payloads, std::uint64_t file_size) {
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kEntryFormatVersion;
  h.json_length = static_cast<std::uint32_t>(json.size());
  h.payloads = payloads;
  h.json_hash = XXH3_64bits(json.data(), json.size());
  h.file_size = file_size;
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

std::uint64_t entry_checksum(const void* data, std::size_t n) { return XXH3_64bits(data, n); }

std::size_t stored_element_size(const std::string& dtype) {
  if (dtype == "uint8" || dtype == "int8" || dtype == "bool") return 1;
  if (dtype == "int16" || dtype == "float16" || dtype == "bfloat16") return 2;
  if (dtype == "int32" || dtype == "float32") return 4;
  if (dtype == "int64" || dtype == "float64") return 8;
  return 0;
}

PayloadExtent checked_payload(const std::string& path, const nlohmann::json& p, std::uint64_t file_size) {
  PayloadExtent e;
  e.name = p.at("name").get<std::string>();
  e.offset = p.at("offset").get<std::uint64_t>();
  e.length = p.at("length").get<std::uint64_t>();
  if (e.offset % kPayloadAlignment != 0 || e.offset > file_size || e.length > file_size - e.offset) {
    throw CorruptEntry(str(path, ": payload ", e.name, " lies outside the file"));
  }
  const std::size_t element = stored_element_size(p.at("stored_dtype"));
  if (element == 0 || stored_element_size(p.at("dtype")) == 0) {
    throw CorruptEntry(str(path, ": payload ", e.name, " has dtype ", p.at("dtype").dump(), " stored as ",
                           p.at("stored_dtype").dump(), ", not a dtype a cache holds"));
  }
  e.shape = p.at("shape").get<std::vector<std::int64_t>>();
  std::uint64_t numel = 1;
  for (const std::int64_t v : e.shape) {
    if (v < 0) throw CorruptEntry(str(path, ": payload ", e.name, " has a negative size"));
    if (v > 0 && numel > file_size / static_cast<std::uint64_t>(v)) numel = file_size + 1;  // too big
    else numel *= static_cast<std::uint64_t>(v);
  }
  if (numel > file_size || numel * element != e.length) {
    throw CorruptEntry(str(path, ": payload ", e.name, " size does not match its shape"));
  }
  return e;
}

void verify_entry(const std::string& path, const std::string& expected_key, const io::IoOptions& io) {
  io::FileHandle f = io::FileHandle::open(path, io::FileHandle::Mode::read, io);
  const EntryHead head = read_entry_head(f);
  const auto& meta = head.meta;
  if (!expected_key.empty() && meta.value("key", "") != expected_key) {
    throw CorruptEntry(str(path, ": cache entry holds key ", meta.value("key", "?"), ", expected ", expected_key));
  }
  // Aligned, so that an O_DIRECT backend reads straight into it; payloads start aligned.
  constexpr std::size_t kChunk = std::size_t(4) << 20;
  std::unique_ptr<void, FreeDeleter> buffer(std::aligned_alloc(kPayloadAlignment, kChunk));
  if (!buffer) throw std::bad_alloc();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state) throw std::bad_alloc();
  try {
    (void)meta.at("sample_meta");
    for (const auto& p : meta.at("payloads")) {
      const PayloadExtent e = checked_payload(path, p, head.file_size);
      const std::string& name = e.name;
      const std::uint64_t offset = e.offset, length = e.length;
      const std::string kind = p.at("kind");
      if (kind == "volume") {
        const auto& volume = meta.at("volumes").at(name);
        (void)volume.at("meta");
        const auto affine = volume.at("affine").get<std::vector<double>>();
        if (affine.size() != 16) throw CorruptEntry(str(path, ": volume ", name, " has no 4x4 affine"));
      } else if (kind != "array") {
        throw CorruptEntry(str(path, ": payload ", name, " is of kind '", kind, "', expected volume or array"));
      }
      XXH3_64bits_reset(state.get());
      for (std::uint64_t done = 0; done < length;) {
        const std::size_t got = f.read(buffer.get(), kChunk, offset + done);
        const std::size_t use = static_cast<std::size_t>(std::min<std::uint64_t>(got, length - done));
        if (use == 0) {
          throw CorruptEntry(str(path, ": payload ", name, " is cut short (", done, " of ", length, " bytes)"));
        }
        XXH3_64bits_update(state.get(), buffer.get(), use);
        done += use;
      }
      if (XXH3_64bits_digest(state.get()) != p.at("xxh3").get<std::uint64_t>()) {
        throw CorruptEntry(str(path, ": payload ", name, " checksum mismatch"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptEntry(str(path, ": cache entry metadata is incomplete: ", e.what()));
  }
}

}  // namespace medfast::cache
