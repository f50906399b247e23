#include "medfast/image/nifti_raw.hpp"

#include <algorithm>
#include <cstring>

#include "medfast/core/error.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/image/gzip.hpp"
#include "medfast/io/file_handle.hpp"
#include "medfast/os/file.hpp"

namespace medfast {

NiftiReadOptions NiftiReadOptions::from(const Settings& s) {
  return NiftiReadOptions()
      .set_max_volume_bytes(s.get_bytes("max_volume_bytes"))
      .set_gzip_buffer_limit(s.get_bytes("gzip_buffer_limit"))
      .set_threads(s.threads())
      .set_io(io::IoOptions::from(s));
}

namespace nifti {

namespace {

constexpr std::size_t kParallelChunk = 32u << 20;

std::string describe(const Header& h) {
  std::string dims;
  for (auto d : h.shape()) dims += (dims.empty() ? "" : "x") + std::to_string(d);
  return dims + " " + datatype_name(h.datatype);
}

// A gzip stream of `compressed` bytes cannot inflate to more than this.
std::uint64_t gzip_capacity(std::uint64_t compressed) { return compressed * kMaxDeflateRatio + (1u << 20); }

void check_gzip_capacity(const Header& h, const std::string& name, std::uint64_t compressed) {
  if (static_cast<std::uint64_t>(h.vox_offset) > gzip_capacity(compressed)) {
    throw FormatError(str(name, ": field vox_offset is ", h.vox_offset, ", past the end of anything a gzip file of ",
                          compressed, " bytes can hold (at most ", gzip_capacity(compressed),
                          " bytes): corrupt header"));
  }
  const std::uint64_t needed = static_cast<std::uint64_t>(h.vox_offset) + h.data_bytes();
  if (needed > gzip_capacity(compressed)) {
    throw FormatError(str(name, ": field dim: the header announces ", describe(h), " (", h.data_bytes(),
                          " bytes), but a gzip file of ", compressed, " bytes can hold at most ",
                          gzip_capacity(compressed), ": truncated file or corrupt header"));
  }
}

void check_plain_size(const Header& h, const std::string& name, std::uint64_t file_bytes) {
  if (static_cast<std::uint64_t>(h.vox_offset) > file_bytes) {
    throw FormatError(str(name, ": field vox_offset is ", h.vox_offset, ", past the end of the file (", file_bytes,
                          " bytes)"));
  }
  const std::uint64_t available = file_bytes - static_cast<std::uint64_t>(h.vox_offset);
  if (h.data_bytes() > available) {
    throw FormatError(str(name, ": file is truncated: the header announces ", describe(h), " = ", h.data_bytes(),
                          " bytes of voxel data at vox_offset ", h.vox_offset, ", but only ", available,
                          " bytes follow (file size ", file_bytes, ")"));
  }
}

void finish(RawImage& img) {
  if (img.header.big_endian) {
    byteswap_inplace(img.data(), img.header.voxel_count(), datatype_size(img.header.datatype));
  }
}

// Puts the voxel bytes at an offset aligned for their element type.
void align_data(RawImage& img) {
  const std::size_t elem = datatype_size(img.header.datatype);
  if (img.offset % elem != 0) {
    std::memmove(img.storage.data(), img.data(), img.header.data_bytes());
    img.offset = 0;
  }
}

// Validates a gzip file's header and allocates room for header + voxels, so
// that the inflated stream lands with the voxels at vox_offset.
RawImage start_gzip_image(const std::uint8_t* prefix, std::size_t got, const std::string& name,
                          std::uint64_t compressed_bytes, const NiftiReadOptions& options) {
  RawImage img;
  img.header = parse_header(prefix, got, name);
  img.gzipped = true;
  img.file_bytes = compressed_bytes;
  check_data_size(img.header, name, options.max_volume_bytes);
  check_gzip_capacity(img.header, name, compressed_bytes);
  img.storage = os::Buffer::allocate(static_cast<std::size_t>(img.header.vox_offset) + img.header.data_bytes());
  img.offset = static_cast<std::size_t>(img.header.vox_offset);
  return img;
}

void finish_gzip_image(RawImage& img, std::size_t produced, const std::string& name) {
  const std::size_t total = img.offset + img.header.data_bytes();
  if (produced < total) {
    throw FormatError(str(name, ": file is truncated: the header announces ", describe(img.header), " = ",
                          img.header.data_bytes(), " bytes of voxel data at vox_offset ", img.header.vox_offset,
                          ", but the gzip stream ends after ", produced, " decompressed bytes"));
  }
  align_data(img);
  finish(img);
}

RawImage decode_gzip_memory(const void* bytes, std::size_t size, const std::string& name,
                            const NiftiReadOptions& options) {
  std::uint8_t prefix[kNifti2HeaderSize];
  std::size_t got;
  {
    GzipReader head(bytes, size, name);
    got = head.read(prefix, sizeof prefix);
  }
  RawImage img = start_gzip_image(prefix, got, name, size, options);
  const std::size_t total = img.offset + img.header.data_bytes();
  finish_gzip_image(img, gunzip_into(bytes, size, img.storage.data(), total, name), name);
  return img;
}

RawImage read_gzip_stream(const os::File& file, const NiftiReadOptions& options) {
  GzipReader stream(file);
  std::uint8_t prefix[kNifti2HeaderSize];
  const std::size_t got = stream.read(prefix, sizeof prefix);
  RawImage img = start_gzip_image(prefix, got, file.path(), file.size(), options);
  const std::size_t total = img.offset + img.header.data_bytes();
  const std::size_t head = std::min(got, total);
  std::memcpy(img.storage.data(), prefix, head);
  const std::size_t rest = stream.read(static_cast<char*>(img.storage.data()) + head, total - head);
  stream.finish_member();  // the CRC-32 and ISIZE of the member the data ends in
  finish_gzip_image(img, head + rest, file.path());
  return img;
}

}  // namespace

namespace {
template <typename Word>
void swap_words(std::uint8_t* p, std::size_t count, Word (*swap)(Word)) {
  for (std::size_t i = 0; i < count; ++i) {
    Word v;
    std::memcpy(&v, p + sizeof(Word) * i, sizeof(Word));
    v = swap(v);
    std::memcpy(p + sizeof(Word) * i, &v, sizeof(Word));
  }
}
std::uint16_t bswap16(std::uint16_t v) { return __builtin_bswap16(v); }
std::uint32_t bswap32(std::uint32_t v) { return __builtin_bswap32(v); }
std::uint64_t bswap64(std::uint64_t v) { return __builtin_bswap64(v); }
}  // namespace

void byteswap_inplace(void* data, std::size_t count, std::size_t element_size) {
  auto* p = static_cast<std::uint8_t*>(data);
  switch (element_size) {
    case 1: return;
    case 2: return swap_words(p, count, bswap16);
    case 4: return swap_words(p, count, bswap32);
    case 8: return swap_words(p, count, bswap64);
    default: throw ValueError(str("byteswap: element size ", element_size, " is not 1, 2, 4 or 8"));
  }
}

Header read_header(const std::string& path, const NiftiReadOptions& options, bool* gzipped,
                   std::uint64_t* file_bytes) {
  const os::File file = os::File::open(path, os::File::Mode::read);
  const std::uint64_t size = file.size();
  std::uint8_t prefix[kNifti2HeaderSize];
  std::size_t got = file.read_at(prefix, sizeof prefix, 0);
  const bool gz = is_gzip(prefix, got);
  Header h;
  if (gz) {
    GzipReader stream(file);
    got = stream.read(prefix, sizeof prefix);
    h = parse_header(prefix, got, path);
    check_data_size(h, path, options.max_volume_bytes);
    check_gzip_capacity(h, path, size);
  } else {
    h = parse_header(prefix, got, path);
    check_data_size(h, path, options.max_volume_bytes);
    check_plain_size(h, path, size);
  }
  if (gzipped) *gzipped = gz;
  if (file_bytes) *file_bytes = size;
  return h;
}

RawImage read_raw(const std::string& path, const NiftiReadOptions& options) {
  const os::File file = os::File::open(path, os::File::Mode::read);
  const std::uint64_t size = file.size();
  std::uint8_t prefix[kNifti2HeaderSize];
  const std::size_t got = file.read_at(prefix, sizeof prefix, 0);
  if (is_gzip(prefix, got)) {
    if (size > options.gzip_buffer_limit) return read_gzip_stream(file, options);
    os::Buffer compressed = os::Buffer::allocate(size);
    file.read_exact(compressed.data(), size, 0);
    return decode_gzip_memory(compressed.data(), size, path, options);
  }
  RawImage img;
  img.header = parse_header(prefix, got, path);
  img.file_bytes = size;
  check_data_size(img.header, path, options.max_volume_bytes);
  check_plain_size(img.header, path, size);
  const std::size_t bytes = img.header.data_bytes();
  img.storage = os::Buffer::allocate(bytes);
  auto* dst = static_cast<char*>(img.storage.data());
  if (bytes >= kEngineReadBytes) {
    io::IoOptions engine = options.io;
    if (engine.threads == 0) engine.threads = options.threads;
    io::FileHandle::open(path, io::FileHandle::Mode::read, engine)
        .read_exact(dst, bytes, static_cast<std::uint64_t>(img.header.vox_offset));
  } else {
    // Several threads reading disjoint ranges also fault in the fresh pages in
    // parallel, which is most of the cost of a warm read.
    const std::size_t chunks = (bytes + kParallelChunk - 1) / kParallelChunk;
    parallel_for(chunks, options.threads, [&](std::size_t i) {
      const std::size_t off = i * kParallelChunk;
      const std::size_t n = std::min(kParallelChunk, bytes - off);
      file.read_exact(dst + off, n, static_cast<std::uint64_t>(img.header.vox_offset) + off);
    });
  }
  finish(img);
  return img;
}

RawImage decode_memory(const void* bytes, std::size_t size, const std::string& name,
                       const NiftiReadOptions& options) {
  if (is_gzip(bytes, size)) return decode_gzip_memory(bytes, size, name, options);
  RawImage img;
  img.header = parse_header(bytes, size, name);
  img.file_bytes = size;
  check_data_size(img.header, name, options.max_volume_bytes);
  check_plain_size(img.header, name, size);
  img.storage = os::Buffer::allocate(img.header.data_bytes());
  std::memcpy(img.storage.data(), static_cast<const char*>(bytes) + img.header.vox_offset, img.header.data_bytes());
  finish(img);
  return img;
}

}  // namespace nifti
}  // namespace medfast
