#include "medfast/os/folder_mark.hpp"

#include <algorithm>
#include <ctime>
#include <unistd.h>

#include "medfast/core/error.hpp"
#include "medfast/os/process.hpp"
#include "medfast/version.hpp"

namespace medfast::os {

namespace {

bool is_lock_name(const std::string& name) {
  static const std::string prefix = ".medfast", suffix = ".lock";
  return name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

bool FolderMark::lists(const std::string& name) const {
  return std::find(files.begin(), files.end(), name) != files.end();
}

nlohmann::json FolderMark::to_json() const {
  nlohmann::json j{{"medfast", kind}, {"version", version}, {"created", created}};
  if (kind != kCacheFolder) j["files"] = files;
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

std::optional<FolderMark> read_folder_mark(const std::string& dir) {
  const std::string path = dir + "/" + kFolderMarkName;
  if (!exists(path)) return std::nullopt;
  const std::string text = read_text_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(str(path, ": not medfast's folder mark (not JSON: ", e.what(), "); medfast leaves ", dir,
                          " alone: remove the file if the folder is yours, or choose another folder"));
  }
  const auto bad = [&](const std::string& what) {
    return FormatError(str(path, ": not medfast's folder mark (", what, "); medfast leaves ", dir,
                           " alone: remove the file if the folder is yours, or choose another folder"));
  };
  if (!j.is_object() || !j.contains("medfast") || !j["medfast"].is_string()) throw bad("no 'medfast' kind");
  FolderMark m;
  m.kind = j["medfast"].get<std::string>();
  if (m.kind != kRunFolder && m.kind != kCacheFolder && m.kind != kInferFolder) {
    throw bad(str("kind '", m.kind, "', expected run, cache or infer"));
  }
  m.version = j.value("version", "");
  m.created = j.value("created", "");
  if (j.contains("files")) {
    if (!j["files"].is_array()) throw bad("'files' is not a list of names");
    for (const auto& f : j["files"]) {
      if (!f.is_string() || f.get<std::string>().find('/') != std::string::npos || f.get<std::string>().empty() ||
          f.get<std::string>() == "." || f.get<std::string>() == "..") {
        throw bad(str("'files' holds ", f.dump(), ", not a file name"));
      }
      m.files.push_back(f.get<std::string>());
    }
  }
  for (const auto& [k, v] : j.items()) {
    if (k != "medfast" && k != "version" && k != "created" && k != "files") m.extra[k] = v;
  }
  return m;
}

void write_folder_mark(const std::string& dir, const FolderMark& mark) {
  write_text_file(dir + "/" + kFolderMarkName, mark.to_json().dump(2) + "\n");
}

FolderMark new_folder_mark(const std::string& kind) {
  FolderMark m;
  m.kind = kind;
  m.version = kVersion;
  m.created = utc_now();
  return m;
}

bool is_bookkeeping(const std::string& name) {
  return name == kFolderMarkName || temporary_writer_pid(name).has_value() || is_lock_name(name);
}

std::vector<std::string> user_entries(const std::string& dir) {
  std::vector<std::string> out;
  if (!exists(dir)) return out;
  for (const auto& name : list_directory(dir)) {
    if (!is_bookkeeping(name)) out.push_back(name);
  }
  return out;
}

std::string describe_entries(const std::string& dir, const std::vector<std::string>& names, std::size_t shown) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) {
    if (i > 0) s += i + 1 == names.size() ? " and " : ", ";
    s += names[i];
    try {
      if (!dir.empty() && stat(dir + "/" + names[i]).is_directory) s += "/";
    } catch (const OsError&) {  // a dangling link: named as it is
    }
  }
  if (names.size() > shown) s += str(" and ", names.size() - shown, " more");
  return s;
}

FolderMark claim_folder(const std::string& dir, const std::string& kind, const std::string& what,
                        const std::function<bool(const std::vector<std::string>&)>& adopt) {
  if (exists(dir) && !stat(dir).is_directory) {
    throw ValueError(str(what, " ", dir, ": is a file, not a folder"));
  }
  if (std::optional<FolderMark> m = read_folder_mark(dir)) {
    if (m->kind != kind) {
      throw ValueError(str(what, " ", dir, ": is a medfast ", m->kind, " folder (", dir, "/", kFolderMarkName,
                           "), not a ", kind, " folder: choose another folder"));
    }
    return *m;
  }
  const std::vector<std::string> entries = user_entries(dir);
  if (!entries.empty() && !(adopt && adopt(entries))) {
    throw ValueError(str(what, " ", dir, ": the folder is not empty and medfast did not make it (no ", kFolderMarkName,
                         "; it holds ", describe_entries(dir, entries), "): medfast writes its ", kind,
                         " files only into a folder of its own; choose an empty or new folder"));
  }
  make_directories(dir);
  FolderMark m = new_folder_mark(kind);
  write_folder_mark(dir, m);
  return m;
}

void record_file(const std::string& dir, FolderMark& mark, const std::string& name) {
  if (mark.lists(name)) return;
  mark.files.push_back(name);
  write_folder_mark(dir, mark);
}

Removed stale_temporaries(const std::string& dir) {
  Removed r;
  if (!exists(dir) || !read_folder_mark(dir)) return r;
  for (const auto& name : list_directory(dir)) {
    const auto pid = temporary_writer_pid(name);
    if (!pid || *pid <= 0) continue;
    if (*pid == ::getpid() || process_alive(*pid)) continue;  // a writer at work
    const std::string path = dir + "/" + name;
    const FileInfo info = stat(path);
    if (!info.is_regular) continue;  // a temporary is a plain file
    r.bytes += info.size;
    r.paths.push_back(path);
  }
  return r;
}

Removed remove_stale_temporaries(const std::string& dir) {
  Removed r = stale_temporaries(dir);
  for (const auto& path : r.paths) remove_file(path);
  return r;
}

}  // namespace medfast::os
