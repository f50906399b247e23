#pragma once
/// \file
/// Maintenance of a disk cache folder (what `medfast cache verify|info|prune`
/// report): its entries, the temporaries of interrupted writers (the
/// AtomicWriter protocol, os/file.hpp), checksums, chains and stale entries.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "medfast/io/file_handle.hpp"

namespace medfast::cache {

struct FolderListing {
  std::vector<std::string> entries;  ///< paths of *.mfc files, sorted
  std::vector<std::string> temps;    ///< AtomicWriter temporaries (live or dead writers)
};
/// OsError naming the folder if it cannot be listed.
FolderListing list_folder(const std::string& dir);

struct VerifyReport {
  std::size_t entries = 0, valid = 0, temporary_files = 0;
  std::vector<std::pair<std::string, std::string>> corrupt;  ///< path, what is wrong
};
/// Reads every entry and checks every checksum.
VerifyReport verify_folder(const std::string& dir, const io::IoOptions& io);

struct FolderInfo {
  std::size_t entries = 0, unreadable = 0, temporary_files = 0;
  std::uint64_t bytes = 0;
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> chains;  ///< chain hash -> entries, bytes
};
/// Entries, bytes and chains from the entries' headers (payloads unread).
FolderInfo folder_info(const std::string& dir);

/// A file prune removes, and why.
struct PruneFile {
  enum class Why { dead_writer, corrupt, stale };
  std::string path;
  std::uint64_t bytes = 0;
  Why why = Why::stale;
  std::string dataset;  ///< the dataset list the entry was computed from ("" where unknown)
  std::string detail;   ///< corrupt: what is wrong
};
/// "temporary of a dead writer", "corrupt", "stale".
const char* prune_reason(PruneFile::Why why);

struct PrunePlan {
  std::vector<PruneFile> files;  ///< what prune removes, in the folder's order
  std::size_t entries = 0;       ///< entries in the folder
  std::size_t kept = 0;          ///< readable entries whose key is kept (with `keep`), or all readable ones
  std::map<std::string, std::size_t> datasets;  ///< the entries' datasets, and how many each
};
/// What prune_folder removes, nothing removed: temporaries of dead writers, entries whose
/// header is damaged and, when `keep` is not empty, entries whose key is not in it.
PrunePlan plan_prune(const std::string& dir, const std::set<std::string>& keep = {});

struct PruneReport {
  std::size_t temporary_removed = 0, corrupt_removed = 0, stale_removed = 0;
  std::uint64_t bytes_freed = 0;
  std::vector<PruneFile> removed;
};
/// Removes what plan_prune lists.
PruneReport prune_folder(const std::string& dir, const std::set<std::string>& keep = {});

}  // namespace medfast::cache
