#pragma once
/// \file
/// A cache entry's file format without tensors (torch-free, in medfast_base): the
/// header and metadata, and whole-entry verification. entry.hpp writes and reads
/// entries as Samples on top of this; `medfast cache info|verify|prune` need only this.
///
/// Layout (little endian):
///   [0, 64)     header: magic "MFCACHE\0", format version (u32), JSON length
///               (u32), payload count (u32), reserved (u32), xxh3-64 of the
///               JSON (u64), file size (u64), zero padding
///   [64, ...)   JSON metadata: key, chain hash, sources, sample meta, and per
///               payload its name, logical and stored dtype, shape, offset,
///               length and xxh3-64; per volume its affine and header meta
///   payloads    each starting on a 4 KiB boundary, so O_DIRECT, io_uring and
///               cuFile read them straight into aligned (pinned/device) memory
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/io/file_handle.hpp"

namespace medfast::cache {

inline constexpr std::uint32_t kEntryFormatVersion = 1;
inline constexpr std::uint64_t kPayloadAlignment = 4096;
inline constexpr const char* kEntrySuffix = ".mfc";
inline constexpr std::size_t kEntryHeaderBytes = 64;

/// A cache entry failed verification (truncated, bit flip, wrong version...).
class CorruptEntry : public FormatError {
 public:
  using FormatError::FormatError;
};

/// An entry's verified header: its size and JSON metadata.
struct EntryHead {
  std::uint64_t file_size = 0;
  nlohmann::json meta;
};

/// Reads and verifies the header and metadata (magic, version, file size, JSON
/// checksum and syntax). Throws CorruptEntry.
EntryHead read_entry_head(io::FileHandle& f);

/// Whether `path` is a regular file that begins with the entry magic ("MFCACHE\0"): a file
/// medfast wrote as a cache entry, whatever state the rest of it is in. Never blocks (a FIFO
/// or device is not an entry) and never throws for a file it cannot read (false).
bool has_entry_magic(const std::string& path);

/// The entry's JSON metadata after verifying the header (payloads unread).
nlohmann::json read_entry_meta(const std::string& path);

/// The 64-byte header for an entry whose metadata is `json`.
std::string entry_header(const std::string& json, std::uint32_t payloads, std::uint64_t file_size);

/// xxh3-64, the entry checksum.
std::uint64_t entry_checksum(const void* data, std::size_t n);

/// Bytes per element of a stored dtype name (uint8 ... float64, bool); 0 if unknown.
std::size_t stored_element_size(const std::string& dtype);

/// A payload's place in its entry file, from its metadata.
struct PayloadExtent {
  std::string name;
  std::uint64_t offset = 0, length = 0;
  std::vector<std::int64_t> shape;
};
/// Checks one payload's metadata `p` against an entry of `file_size` bytes: offset
/// aligned and the bytes inside the file, dtype and stored_dtype ones a cache holds, no
/// negative size, and the shape's size (computed without overflow) times the stored
/// element size equal to the length. Throws CorruptEntry naming `path` and the payload
/// (or nlohmann::json::exception for a missing field). read_entry and verify_entry both
/// use it.
PayloadExtent checked_payload(const std::string& path, const nlohmann::json& p, std::uint64_t file_size);

/// Checks everything read_entry would, without building tensors: the header, the key
/// (if not empty), each payload's dtype, shape, bounds and checksum (streamed through a
/// bounded buffer), and each volume's affine. Throws CorruptEntry or OsError.
void verify_entry(const std::string& path, const std::string& expected_key = "", const io::IoOptions& io = {});

}  // namespace medfast::cache
