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
  std::vector<std::string> entries;  ///< paths of *.mfc files that begin with the entry magic, sorted
  std::vector<std::string> foreign;  ///< paths of other *.mfc files: not medfast's, never removed
  std::vector<std::string> temps;    ///< temporaries (os::temporary_path names; live or dead writers)
  bool marked = false;               ///< the folder carries a cache mark (os/folder_mark.hpp)
};
/// OsError naming the folder if it cannot be listed; FormatError for a damaged mark.
FolderListing list_folder(const std::string& dir);

struct VerifyReport {
  std::size_t entries = 0, valid = 0, temporary_files = 0;
  std::vector<std::pair<std::string, std::string>> corrupt;  ///< path, what is wrong
  std::vector<std::string> foreign;                          ///< *.mfc files that are not cache entries
  /// Of those, the ones that are no regular file at all (a FIFO, a socket, a device): path, kind.
  /// Never opened (they could block); left alone, and an error of verify's.
  std::vector<std::pair<std::string, std::string>> irregular;
  bool marked = false;
};
/// Reads every entry and checks every checksum, and that each holds the key its name says
/// (an entry renamed or swapped with another is corrupt).
VerifyReport verify_folder(const std::string& dir, const io::IoOptions& io);

struct FolderInfo {
  std::size_t entries = 0, unreadable = 0, temporary_files = 0, foreign = 0;
  std::uint64_t bytes = 0;
  bool marked = false;
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> chains;  ///< chain hash -> entries, bytes
};
/// Entries, bytes and chains from the entries' headers (payloads unread).
FolderInfo folder_info(const std::string& dir);

/// Whether the entries of an unmarked folder are all medfast's (cache entries, and
/// temporaries an earlier medfast named "<key>.mfc.tmp-<pid>-<n>"): an earlier medfast's
/// cache, which a cache store marks and then uses.
bool earlier_cache_folder(const std::string& dir, const std::vector<std::string>& names);

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
  std::vector<std::string> foreign;             ///< *.mfc files that are not medfast's: left alone
};
/// What prune_folder removes, nothing removed: temporaries of dead writers, entries that are
/// damaged or hold another key than their name says and, when `keep` is not empty, entries
/// whose key is not in it. Only in a folder with a cache mark, and only files medfast wrote
/// (entries begin with the entry magic): a folder without the mark is a ValueError naming it.
PrunePlan plan_prune(const std::string& dir, const std::set<std::string>& keep = {});

struct PruneReport {
  std::size_t temporary_removed = 0, corrupt_removed = 0, stale_removed = 0;
  std::uint64_t bytes_freed = 0;
  std::vector<PruneFile> removed;
};
/// Removes what plan_prune lists.
PruneReport prune_folder(const std::string& dir, const std::set<std::string>& keep = {});

}  // namespace medfast::cache
