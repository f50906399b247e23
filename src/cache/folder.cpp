#include "medfast/cache/folder.hpp"

// Torch-free (medfast_base): `medfast cache info|verify|prune` run without libtorch.
#include "medfast/cache/entry_file.hpp"
#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"

namespace medfast::cache {

FolderListing list_folder(const std::string& dir) {
  FolderListing l;
  const std::string suffix = kEntrySuffix;
  for (const auto& name : os::list_directory(dir)) {
    if (os::temporary_writer_pid(name)) {
      l.temps.push_back(dir + "/" + name);
    } else if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      l.entries.push_back(dir + "/" + name);
    }
  }
  return l;
}

VerifyReport verify_folder(const std::string& dir, const io::IoOptions& io) {
  const FolderListing l = list_folder(dir);
  VerifyReport r;
  r.entries = l.entries.size();
  r.temporary_files = l.temps.size();
  for (const auto& path : l.entries) {
    try {
      verify_entry(path, "", io);  // every payload's size and checksum
      ++r.valid;
    } catch (const Error& e) {
      r.corrupt.emplace_back(path, e.what());
    }
  }
  return r;
}

FolderInfo folder_info(const std::string& dir) {
  const FolderListing l = list_folder(dir);
  FolderInfo info;
  info.entries = l.entries.size();
  info.temporary_files = l.temps.size();
  for (const auto& path : l.entries) {
    const std::uint64_t size = os::stat(path).size;
    info.bytes += size;
    try {
      auto& c = info.chains[read_entry_meta(path).value("chain", "?")];
      ++c.first;
      c.second += size;
    } catch (const Error&) {
      ++info.unreadable;
    }
  }
  return info;
}

PruneReport prune_folder(const std::string& dir, const std::set<std::string>& keep) {
  PruneReport r;
  const os::Removed temps = os::remove_stale_temporaries(dir);
  r.temporary_removed = temps.paths.size();
  r.bytes_freed += temps.bytes;
  for (const auto& path : list_folder(dir).entries) {
    bool remove = false;
    try {
      const auto meta = read_entry_meta(path);
      if (!keep.empty() && !keep.count(meta.value("key", ""))) {
        remove = true;
        ++r.stale_removed;
      }
    } catch (const Error&) {
      remove = true;
      ++r.corrupt_removed;
    }
    if (remove) {
      r.bytes_freed += os::stat(path).size;
      os::remove_file(path);
    }
  }
  return r;
}

}  // namespace medfast::cache
