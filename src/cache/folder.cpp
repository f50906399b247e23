#include "medfast/cache/folder.hpp"

// Torch-free (medfast_base): `medfast cache info|verify|prune` run without libtorch.
#include <algorithm>

#include "medfast/cache/entry_file.hpp"
#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"

namespace medfast::cache {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The key an entry's file name says it holds: "<key>.mfc".
std::string key_of_name(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return name.substr(0, name.size() - std::string(kEntrySuffix).size());
}

/// "<key>.mfc.tmp-<pid>-<n>": an earlier medfast's temporary of an entry.
bool earlier_entry_temporary(const std::string& name) {
  const auto pos = name.rfind(".mfc.tmp-");
  if (pos == std::string::npos) return false;
  const std::string rest = name.substr(pos + 9);
  const auto dash = rest.find('-');
  return dash != std::string::npos && dash > 0 && dash + 1 < rest.size() &&
         std::all_of(rest.begin(), rest.end(), [](char c) { return c == '-' || (c >= '0' && c <= '9'); });
}

/// The folder's cache mark: true if it has one; a mark of another kind is a ValueError.
bool cache_marked(const std::string& dir) {
  const std::optional<os::FolderMark> mark = os::read_folder_mark(dir);
  if (mark && mark->kind != os::kCacheFolder) {
    throw ValueError(str(dir, " is a medfast ", mark->kind, " folder (", dir, "/", os::kFolderMarkName,
                         "), not a cache folder"));
  }
  return mark.has_value();
}

}  // namespace

FolderListing list_folder(const std::string& dir) {
  FolderListing l;
  l.marked = cache_marked(dir);
  for (const auto& name : os::list_directory(dir)) {
    const std::string path = dir + "/" + name;
    if (os::temporary_writer_pid(name)) {
      l.temps.push_back(path);
    } else if (ends_with(name, kEntrySuffix)) {
      (has_entry_magic(path) ? l.entries : l.foreign).push_back(path);
    }
  }
  return l;
}

bool earlier_cache_folder(const std::string& dir, const std::vector<std::string>& names) {
  return !names.empty() && std::all_of(names.begin(), names.end(), [&](const std::string& n) {
    return (ends_with(n, kEntrySuffix) && has_entry_magic(dir + "/" + n)) || earlier_entry_temporary(n);
  });
}

VerifyReport verify_folder(const std::string& dir, const io::IoOptions& io) {
  const FolderListing l = list_folder(dir);
  VerifyReport r;
  r.entries = l.entries.size();
  r.temporary_files = l.temps.size();
  r.foreign = l.foreign;
  r.marked = l.marked;
  for (const auto& path : l.foreign) {
    const std::string kind = os::irregular_kind(path);
    if (!kind.empty()) r.irregular.emplace_back(path, kind);
  }
  for (const auto& path : l.entries) {
    try {
      verify_entry(path, key_of_name(path), io);  // every payload's size and checksum, and the key its name says
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
  info.foreign = l.foreign.size();
  info.marked = l.marked;
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
  if (!os::exists(dir)) throw ValueError(str("cache prune: ", dir, ": no such folder"));
  const FolderListing l = list_folder(dir);
  if (!l.marked) {
    const std::vector<std::string> entries = os::user_entries(dir);
    throw ValueError(str("cache prune: ", dir, " is not a medfast cache folder (no ", os::kFolderMarkName,
                         entries.empty() ? std::string(")") : str("; it holds ", os::describe_entries(dir, entries), ")"),
                         ": prune removes files only from a folder medfast made as a cache, and nothing was removed. "
                         "A cache of an earlier medfast gets the mark when `medfast cache build` or a train uses it"));
  }
  PrunePlan plan;
  plan.foreign = l.foreign;
  const os::Removed temps = os::stale_temporaries(dir);
  for (const auto& path : temps.paths) plan.files.push_back({path, os::stat(path).size, PruneFile::Why::dead_writer, "", ""});
  for (const auto& path : l.entries) {
    ++plan.entries;
    PruneFile f{path, os::stat(path).size, PruneFile::Why::stale, "", ""};
    try {
      const auto meta = read_entry_meta(path);
      f.dataset = meta.value("dataset", "");
      const std::string key = meta.value("key", "");
      if (key != key_of_name(path)) {
        throw CorruptEntry(str(path, ": cache entry holds key ", key, ", not the key its name says (renamed, or "
                               "swapped with another entry)"));
      }
      ++plan.datasets[f.dataset];
      if (keep.empty() || keep.count(key)) {
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
