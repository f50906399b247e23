#pragma once
/// \file
/// gzip for NIfTI (and the profiler's .json.gz traces): a fast whole-buffer path
/// (libdeflate) and a streaming path (zlib) for inputs too large to hold compressed in
/// memory. Beside the formats that use it, below the I/O engine (src/io) and the caches.
///
/// Multi-member files (pigz, bgzip, medfast's own writer) are read as one
/// stream, as gzip(1) and Python's gzip module do. medfast writes data in
/// independent members of kGzipMemberBytes so that members compress in
/// parallel; every gzip reader (zlib's gzread, Python, nibabel, ITK, FSL)
/// reads such files.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "medfast/os/file.hpp"

namespace medfast {

/// Input bytes per gzip member written by medfast.
inline constexpr std::size_t kGzipMemberBytes = 32u << 20;
/// deflate cannot expand data by more than this factor (RFC 1951 worst case
/// is ~1032:1), which bounds what a compressed file of a given size can hold.
inline constexpr std::uint64_t kMaxDeflateRatio = 1032;

/// True if the bytes start with the gzip magic (1f 8b).
bool is_gzip(const void* data, std::size_t size);

/// Inflates every member of the gzip data in memory into `out`, stopping once
/// `out_size` bytes are produced. Returns the bytes produced (less than
/// out_size only if the stream is shorter). Throws FormatError naming `name`
/// for corrupt or truncated data.
std::size_t gunzip_into(const void* in, std::size_t in_size, void* out, std::size_t out_size,
                        const std::string& name);

/// Streaming inflater over a file or a memory span, for reading a prefix (a
/// header) cheaply or a stream too large for gunzip_into.
class GzipReader {
 public:
  /// Reads compressed bytes from `file` starting at offset 0.
  explicit GzipReader(const os::File& file);
  /// Reads compressed bytes from memory (not owned; must outlive the reader).
  GzipReader(const void* data, std::size_t size, std::string name);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  /// Fills `out` with up to `size` decompressed bytes; returns fewer only at
  /// the end of the last member. Throws FormatError on corrupt or truncated data.
  std::size_t read(void* out, std::size_t size);
  /// Decompressed bytes returned so far.
  std::uint64_t position() const;
  /// A reader that stops before the end of a member has not seen its trailer:
  /// this decompresses (and drops) the rest of the current member so that its
  /// CRC-32 and ISIZE are checked. FormatError naming the file on a mismatch.
  void finish_member();

 private:
  std::size_t inflate_some(void* out, std::size_t size, bool stop_at_member_end);
  struct State;
  std::unique_ptr<State> state_;
};

/// Compresses `parts` (concatenated) to gzip at `level` (0..12), as members of
/// at most kGzipMemberBytes input bytes, using up to `threads` threads.
/// The result is appended to `writer`.
struct GzipPart {
  const void* data;
  std::size_t size;
};
void gzip_write(os::AtomicWriter& writer, const std::vector<GzipPart>& parts, int level, int threads);

/// Compresses one buffer into a single gzip member (used by tests and small files).
std::vector<std::uint8_t> gzip_compress(const void* data, std::size_t size, int level);

}  // namespace medfast
