#pragma once
/// \file
/// Reading a NIfTI file's header and raw voxel bytes, without libtorch.
///
/// The voxel bytes land, in native byte order and the on-disk datatype, in a
/// huge-page-advised buffer that the tensor layer adopts without a copy.
/// Paths: a plain .nii's voxels of at least kEngineReadBytes are read by the
/// tensor file engine (io/file_handle.hpp, the io_* settings: by default
/// O_DIRECT io_uring requests in flight, what the page cache holds first),
/// smaller ones with one pread per thread-chunk, straight into the buffer
/// either way; a .nii.gz up to gzip_buffer_limit is read whole and inflated
/// by libdeflate straight into the buffer; a larger one is streamed with zlib.
/// Gzip is detected by its magic bytes, not by the file name.

#include <cstddef>
#include <cstdint>
#include <string>

#include "medfast/core/io_options.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/image/nifti_header.hpp"
#include "medfast/os/memory.hpp"

namespace medfast {

/// Options for reading NIfTI files.
struct NiftiReadOptions {
  std::uint64_t max_volume_bytes = kDefaultMaxVolumeBytes;
  std::uint64_t gzip_buffer_limit = kDefaultGzipBufferLimit;
  int threads = 1;  ///< threads for the uncompressed read path
  /// The engine's options for large uncompressed voxel blocks (threads 0: `threads`).
  io::IoOptions io;

  NiftiReadOptions& set_max_volume_bytes(std::uint64_t v) { max_volume_bytes = v; return *this; }
  NiftiReadOptions& set_gzip_buffer_limit(std::uint64_t v) { gzip_buffer_limit = v; return *this; }
  NiftiReadOptions& set_threads(int v) { threads = v < 1 ? 1 : v; return *this; }
  NiftiReadOptions& set_io(const io::IoOptions& v) { io = v; return *this; }
  /// From the resolved settings max_volume_bytes, gzip_buffer_limit, threads, io_*.
  static NiftiReadOptions from(const Settings& settings);
};

namespace nifti {

/// Uncompressed voxel blocks from this size on are read by the engine: a cold file 1.8x
/// faster at 8 MiB and up to 1.7x at 200 MiB than parallel preads, a file in the page cache
/// about as fast; smaller ones slower (its open costs more): docs/benchmarks.md.
inline constexpr std::size_t kEngineReadBytes = 8u << 20;

/// A header and its voxel bytes: data() points into `storage` at `offset`.
struct RawImage {
  Header header;
  os::Buffer storage;
  std::size_t offset = 0;
  bool gzipped = false;
  std::uint64_t file_bytes = 0;  ///< size of the file (compressed size for gzip)
  void* data() const { return static_cast<char*>(storage.data()) + offset; }
};

/// Reads and validates only the header (cheap, also for .nii.gz). For a
/// plain file, also checks that the file holds the data the header announces.
Header read_header(const std::string& path, const NiftiReadOptions& options = {}, bool* gzipped = nullptr,
                   std::uint64_t* file_bytes = nullptr);

/// Reads header and voxel bytes. Throws FormatError/OsError naming the path.
RawImage read_raw(const std::string& path, const NiftiReadOptions& options = {});

/// Decodes a whole file already in memory (gzip or not). `name` appears in errors.
RawImage decode_memory(const void* bytes, std::size_t size, const std::string& name,
                       const NiftiReadOptions& options = {});

/// Reverses the byte order of `count` elements of `element_size` bytes.
void byteswap_inplace(void* data, std::size_t count, std::size_t element_size);

}  // namespace nifti
}  // namespace medfast
