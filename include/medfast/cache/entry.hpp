#pragma once
/// \file
/// One cache entry = one file holding one Sample.
///
/// The file layout and the torch-free reading and verification: entry_file.hpp.
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

#include "medfast/cache/entry_file.hpp"
#include "medfast/image/sample.hpp"
#include "medfast/core/error.hpp"
#include "medfast/io/file_handle.hpp"

namespace medfast::cache {

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

}  // namespace medfast::cache
