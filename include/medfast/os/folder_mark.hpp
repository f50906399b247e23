#pragma once
/// \file
/// What medfast owns in a folder, and the rule that follows from it: medfast removes or replaces
/// only what it wrote (git clean's refusal without -f; nnU-Net and MONAI never delete outside
/// their own output folders).
///
/// - A folder medfast makes for a training run, a disk cache or infer's outputs carries a mark,
///   `.medfast.json`: the kind of folder, the medfast version that made it, when, and (runs and
///   infer outputs) the names of the files medfast wrote there, each recorded before it is first
///   written. A cache's entries need no list: each begins with the entry magic.
/// - Temporaries (os::temporary_path: ".<name>.medfast-tmp-<pid>-<n>") are removed only in a
///   marked folder, and only those whose writer is no longer running.
/// - A folder with a mark of another kind, or without a mark and holding anything, is refused
///   for writing, naming what it holds; medfast writes nothing into it (not even a lock).
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "medfast/os/file.hpp"

namespace medfast::os {

inline constexpr const char* kFolderMarkName = ".medfast.json";

/// The kinds of folder medfast writes.
inline constexpr const char* kRunFolder = "run";
inline constexpr const char* kCacheFolder = "cache";
inline constexpr const char* kInferFolder = "infer";

struct FolderMark {
  std::string kind;                 ///< kRunFolder, kCacheFolder, kInferFolder
  std::string version;              ///< the medfast version that made the folder
  std::string created;              ///< UTC, ISO 8601
  std::vector<std::string> files;   ///< names (not paths) medfast wrote in the folder
  nlohmann::json extra = nlohmann::json::object();  ///< what a kind keeps besides (a run's set-aside files)

  bool lists(const std::string& name) const;
  nlohmann::json to_json() const;
};

/// The mark of `dir`; nullopt where it has none (or `dir` does not exist). A mark that is not
/// medfast's JSON is a FormatError naming it (nothing is then written or removed there).
std::optional<FolderMark> read_folder_mark(const std::string& dir);
/// Writes `mark` into `dir` (atomically).
void write_folder_mark(const std::string& dir, const FolderMark& mark);
/// A new mark of `kind`, this medfast's version, now.
FolderMark new_folder_mark(const std::string& kind);

/// medfast's bookkeeping in a folder: the mark, temporaries (any writer) and medfast's lock files
/// (".medfast*.lock").
bool is_bookkeeping(const std::string& name);
/// The entries of `dir` other than bookkeeping, sorted ([] where `dir` does not exist).
std::vector<std::string> user_entries(const std::string& dir);
/// "a.txt, b/ and 3 more" (folders with a slash), for messages.
std::string describe_entries(const std::string& dir, const std::vector<std::string>& names, std::size_t shown = 5);

/// Makes `dir` a folder of `kind` for writing, or refuses it. A missing or empty folder is made
/// and marked; a folder marked `kind` is taken as it is. A folder marked with another kind, or
/// without a mark and holding entries, is refused with a ValueError that names `what` (the
/// setting or flag that chose it), the folder and what it holds, unless `adopt` (given the
/// entries) says they are all medfast's (an earlier medfast's cache folder): that folder is
/// marked then. Returns the mark.
FolderMark claim_folder(const std::string& dir, const std::string& kind, const std::string& what,
                        const std::function<bool(const std::vector<std::string>&)>& adopt = {});

/// Records `name` in `mark` and writes the mark into `dir`, unless it lists the name already:
/// called before the file is first written, so a crash mid-write leaves it recorded.
void record_file(const std::string& dir, FolderMark& mark, const std::string& name);

/// The temporaries in `dir` whose writer is no longer running, in a marked folder only (an
/// unmarked folder has none that medfast would remove): what remove_stale_temporaries removes.
Removed stale_temporaries(const std::string& dir);
Removed remove_stale_temporaries(const std::string& dir);

}  // namespace medfast::os
