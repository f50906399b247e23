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

const char* prune_reason(PruneFile::Why why) {
  switch (why) {
    case PruneFile::Why::dead_writer: return "temporary of a dead writer";
    case PruneFile::Why::corrupt: return "corrupt";
    case PruneFile::Why::stale: break;
  }
  return "stale";
}

PrunePlan plan_prune(const std::string& dir, const std::set<std::string>& keep) {
  PrunePlan plan;
  const os::Removed temps = os::stale_temporaries(dir);
  for (const auto& path : temps.paths) plan.files.push_back({path, os::stat(path).size, PruneFile::Why::dead_writer, "", ""});
  for (const auto& path : list_folder(dir).entries) {
    ++plan.entries;
    PruneFile f{path, os::stat(path).size, PruneFile::Why::stale, "", ""};
    try {
      const auto meta = read_entry_meta(path);
      f.dataset = meta.value("dataset", "");
      ++plan.datasets[f.dataset];
      if (keep.empty() || keep.count(meta.value("key", ""))) {
        ++plan.kept;
        continue;
      }
    } catch (const Error& e) {
      f.why = PruneFile::Why::corrupt;
      f.detail = e.what();
    }
    plan.files.push_back(std::move(f));
  }
  return plan;
}

PruneReport prune_folder(const std::string& dir, const std::set<std::string>& keep) {
  PruneReport r;
  for (PruneFile& f : plan_prune(dir, keep).files) {
    os::remove_file(f.path);
    r.bytes_freed += f.bytes;
    switch (f.why) {
      case PruneFile::Why::dead_writer: ++r.temporary_removed; break;
      case PruneFile::Why::corrupt: ++r.corrupt_removed; break;
      case PruneFile::Why::stale: ++r.stale_removed; break;
    }
    r.removed.push_back(std::move(f));
  }
  return r;
}

}  // namespace medfast::cache
