#pragma once
/// \file
/// One cache entry = one file holding one Sample.
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
///
/// Payloads are stored losslessly and small: a float volume whose values are
/// all whole numbers in 0..255 (a label) is stored as uint8 and restored to
/// its dtype on read; int64 index runs that fit are stored as int32.
///
/// Writes go to a temporary name, are fsynced and renamed (os::AtomicWriter),
/// so readers see a whole entry or none, whatever crashes and however many
/// processes write the same key. Readers verify magic, version, sizes and
/// every checksum; any mismatch is a CorruptEntry, which stores treat as a miss.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/cache/sample.hpp"
#include "medfast/core/error.hpp"
#include "medfast/io/file_handle.hpp"

namespace medfast::cache {

inline constexpr std::uint32_t kEntryFormatVersion = 1;
inline constexpr std::uint64_t kPayloadAlignment = 4096;
inline constexpr const char* kEntrySuffix = ".mfc";

/// A cache entry failed verification (truncated, bit flip, wrong version...).
class CorruptEntry : public FormatError {
 public:
  using FormatError::FormatError;
};

/// Writes `sample` under `key` to `path` atomically. `extra` goes into the JSON
/// (the chain hash and sources, for `cache info`). Returns the bytes written.
std::uint64_t write_entry(const std::string& path, const std::string& key, const Sample& sample,
                          const nlohmann::json& extra = {});

/// Reads an entry; `expected_key` (if not empty) must match. Payloads go
/// straight into tensors on `device` (CPU or CUDA) through the tensor file engine
/// (read_into: cuFile or the pinned bounce for CUDA). Payload checksums are
/// verified as the bytes pass through host memory; with verify_payloads false
/// (an entry this process has already verified: entries are immutable once
/// renamed into place) a CUDA read may take cuFile, which never touches the host.
/// Throws CorruptEntry or OsError.
Sample read_entry(const std::string& path, const std::string& expected_key = "",
                  const io::IoOptions& io = {}, const std::string& device = "cpu", bool verify_payloads = true);

/// The entry's JSON metadata after verifying the header (payloads unread).
nlohmann::json read_entry_meta(const std::string& path);

}  // namespace medfast::cache
