#include "run_dir.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/units.hpp"
#include "medfast/profile/events.hpp"
#include "medfast/train/checkpoint.hpp"
#include "medfast/train/trainer.hpp"

namespace medfast::train {
namespace detail {

namespace {

/// Sections whose change makes a checkpoint's state meaningless for a resumed run.
const std::vector<std::string> kResumeFixed{"model", "loss", "optimizer", "schedule", "data"};

/// The names a run writes whatever its settings (events files and profiler traces have names
/// of their own: a new run never meets an old one's).
const std::vector<std::string> kRunFiles{"last.ckpt", "best.ckpt", "metrics.jsonl", "config.json", "machine.json"};
constexpr const char* kProfilerFolder = "profiler";
/// Files a run is started from, written before it (`train --dataset`'s plan.yaml): medfast's, but
/// not a run by themselves, and never set aside by --overwrite (they are the new run's).
bool setup_file(const std::string& name) { return name == kRunPlanName || name == kRunPlanListName; }
constexpr const char* kSetAsideKey = "set_aside";

/// The first section (or train.seed, train.amp) in which two run configs differ; "" if none.
std::string diff_section(const nlohmann::json& a, const nlohmann::json& b) {
  for (const auto& k : kResumeFixed) {
    const nlohmann::json x = a.value(k, nlohmann::json()), y = b.value(k, nlohmann::json());
    if (x != y) return k;
  }
  const nlohmann::json ta = a.value("train", nlohmann::json::object()), tb = b.value("train", nlohmann::json::object());
  for (const char* k : {"seed", "amp"}) {
    if (ta.value(k, nlohmann::json()) != tb.value(k, nlohmann::json())) return str("train.", k);
  }
  return "";
}

bool in_folder(const std::string& name, const char* folder) {
  const std::string prefix = std::string(folder) + "/";
  return name.compare(0, prefix.size(), prefix) == 0;
}

/// Removes `dir` and its empty subfolders, bottom up; a folder that still holds anything stays.
void remove_empty_folders(const std::string& dir) {
  if (!os::exists(dir)) return;
  for (const std::string& f : os::list_directory(dir)) {
    const std::string p = dir + "/" + f;
    if (os::stat(p).is_directory) remove_empty_folders(p);
  }
  if (os::list_directory(dir).empty()) os::remove_empty_directory(dir);
}

/// An unmarked folder's last.ckpt that reads as medfast's: the epoch it holds.
std::optional<int> earlier_medfast_run(const std::string& last) {
  if (!os::exists(last)) return std::nullopt;
  try {
    return read_checkpoint_meta(last).value("epoch", 0);
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

std::vector<std::string> files_of_run(const os::FolderMark& mark, const std::string& dir) {
  std::vector<std::string> present;
  for (const std::string& f : mark.files) {
    if (!setup_file(f) && os::exists(dir + "/" + f)) present.push_back(f);
  }
  return present;
}

RunFolder::RunFolder(std::string dir, bool rank0, Say say)
    : dir_(std::move(dir)), last_(dir_ + "/last.ckpt"), best_(dir_ + "/best.ckpt"), rank0_(rank0), say_(std::move(say)) {}

int RunFolder::open(bool resume, bool overwrite, const nlohmann::json& config, int epochs, double target_dice) {
  if (resume && overwrite) throw ValueError("train: --resume and --overwrite exclude each other");
  const std::string what = "train.run_dir";
  if (os::exists(dir_) && !os::stat(dir_).is_directory) {
    throw ValueError(str(what, " ", dir_, ": is a file, not a folder"));
  }
  // Read only, first: nothing in the folder changes until every check has passed.
  const std::optional<os::FolderMark> mark = os::read_folder_mark(dir_);
  if (mark && mark->kind != os::kRunFolder) {
    throw ValueError(str(what, " ", dir_, ": is a medfast ", mark->kind, " folder (", dir_, "/", os::kFolderMarkName,
                         "), not a run folder: choose another run_dir"));
  }
  bool adopt = false;  // an earlier medfast's run folder, resumed: marked below
  if (!mark) {
    const std::vector<std::string> entries = os::user_entries(dir_);
    if (!entries.empty()) {
      const std::optional<int> epoch = earlier_medfast_run(last_);
      if (!epoch) {
        throw ValueError(str(what, " ", dir_, ": the folder is not empty and is not a medfast run folder (no ",
                             os::kFolderMarkName, "; it holds ", os::describe_entries(dir_, entries),
                             "): medfast writes a run only into a folder of its own; choose an empty or new run_dir"));
      }
      if (!resume) {
        throw ValueError(str(what, " ", dir_, " holds a run of an earlier medfast (", last_, ", epoch ", *epoch,
                             ") without the mark this version keeps, so medfast cannot tell its files from yours: pass "
                             "--resume to continue it (it is marked then), or choose another run_dir"));
      }
      adopt = true;
    }
  }
  const os::FolderMark current = mark ? *mark : os::new_folder_mark(os::kRunFolder);
  if (!resume) {
    const std::vector<std::string> present = files_of_run(current, dir_);  // the run this folder holds
    if (!present.empty() && !overwrite) {
      const std::optional<int> epoch = earlier_medfast_run(last_);
      throw ValueError(str(what, " ", dir_, " already holds a run (",
                           epoch ? str(last_, ", epoch ", *epoch) : os::describe_entries(dir_, present),
                           "): pass --resume to continue it, --overwrite to start again, or choose another run_dir"));
    }
    std::vector<std::string> in_the_way;  // what this run would write over, and medfast did not write
    for (const std::string& f : kRunFiles) {
      if (os::exists(dir_ + "/" + f) && !current.lists(f)) in_the_way.push_back(f);
    }
    const bool own_profiler = std::any_of(current.files.begin(), current.files.end(),
                                          [](const std::string& f) { return in_folder(f, kProfilerFolder); });
    if (os::exists(dir_ + "/" + kProfilerFolder) && !own_profiler) in_the_way.push_back(kProfilerFolder);
    if (!in_the_way.empty()) {
      throw ValueError(str(what, " ", dir_, ": ", os::describe_entries(dir_, in_the_way), " ",
                           in_the_way.size() == 1 ? "is" : "are", " not medfast's (not listed in ", dir_, "/",
                           os::kFolderMarkName, "), and a run would write ", in_the_way.size() == 1 ? "it" : "them",
                           ": medfast replaces only files it wrote; move ", in_the_way.size() == 1 ? "it" : "them",
                           " away or choose another run_dir"));
    }
  }
  int first_epoch = 0;
  if (resume) {
    if (!os::exists(last_)) throw ValueError(str("--resume: ", last_, " does not exist (train.run_dir is ", dir_, ")"));
    const nlohmann::json meta = read_checkpoint_meta(last_);
    const std::string differs = diff_section(meta.at("config"), config);
    if (!differs.empty()) {
      throw ValueError(str("--resume: the config's ", differs, " differs from the one ", last_,
                           " was trained with; resume needs the same ", differs, " (or start a new run_dir)"));
    }
    first_epoch = meta.at("epoch").get<int>();
    if (first_epoch >= epochs) {
      throw ValueError(str("--resume: ", last_, " holds ", first_epoch, " epochs and train.epochs is ", epochs,
                           ": nothing is left to train, and nothing was changed; to train on, raise train.epochs "
                           "(--set train.epochs=", first_epoch + 10, ")"));
    }
    const double best = meta.value("best_dice", -1.0);
    if (target_dice > 0 && best >= target_dice) {
      throw ValueError(str("--resume: the run in ", dir_, " reached train.target_dice ", target_dice, " (best Dice ",
                           best, " at epoch ", meta.value("best_epoch", first_epoch), "), where it stops: nothing is "
                           "left to train, and nothing was changed; to train on, raise or clear the target "
                           "(--set train.target_dice=0)"));
    }
  }
  if (!rank0_) return first_epoch;  // under DDP only rank 0 writes the folder

  // Every check passed: the folder becomes (or stays) this run's.
  if (mark) {
    mark_ = *mark;
  } else if (!adopt) {
    mark_ = os::claim_folder(dir_, os::kRunFolder, what);
  }
  int holder = 0;  // one train per run_dir: two would write one folder's files in turn
  std::optional<os::FileLock> lock = os::try_lock_file(dir_ + "/" + kRunLockName, &holder);
  if (!lock) {
    throw ValueError(str("train.run_dir ", dir_, " is in use by another medfast train (pid ",
                         holder > 0 ? std::to_string(holder) : std::string("unknown"),
                         "): wait for it to finish, or choose another run_dir"));
  }
  lock_ = std::move(*lock);
  if (adopt) adopt_earlier_run();
  overwrite_ = !resume && overwrite;
  // Temporaries of a writer that was killed (.last.ckpt.medfast-tmp-<pid>-<n>, ...).
  const os::Removed stale = os::remove_stale_temporaries(dir_);
  if (!stale.paths.empty() && say_) {
    say_(str("removed ", stale.paths.size(), " temporary files of an interrupted run from ", dir_, " (",
             format_bytes(stale.bytes), ")"));
  }
  return first_epoch;
}

// An earlier medfast's run folder, resumed: its run's files (those it writes, and its events
// files, which end in ".medfast") are recorded as medfast's; anything else stays the user's.
void RunFolder::adopt_earlier_run() {
  mark_ = os::new_folder_mark(os::kRunFolder);
  for (const std::string& f : os::list_directory(dir_)) {
    const bool events = profile::is_event_file(f) && f.size() > 8 && f.compare(f.size() - 8, 8, ".medfast") == 0;
    if (events || std::find(kRunFiles.begin(), kRunFiles.end(), f) != kRunFiles.end()) mark_.files.push_back(f);
  }
  os::write_folder_mark(dir_, mark_);
  if (say_) say_(str("marked ", dir_, " as a medfast run folder (", os::kFolderMarkName, ": the files medfast wrote there)"));
}

std::string RunFolder::will_write(const std::string& name) {
  const std::string path = dir_ + "/" + name;
  if (!rank0_) return path;
  if (!mark_.lists(name)) {
    os::record_file(dir_, mark_, name);
    if (overwrite_) {
      // Written by this run: gone again if the run fails before its first checkpoint.
      mark_.extra["written_by_new_run"].push_back(name);
    }
  }
  return path;
}

// The old run's files are moved into run_dir/<kOverwrittenName> when the new run is about to
// write its own, dropped once it has written its first checkpoint, and put back if it fails
// before: a run that cannot train does not cost the run it was to replace. (A process killed
// in between leaves them there, listed in the mark; the next --overwrite removes them.)
void RunFolder::set_aside_old_run() {
  if (!overwrite_) return;
  const std::string aside = dir_ + "/" + kOverwrittenName;
  if (os::exists(aside)) remove_set_aside();  // a killed --overwrite's
  const std::vector<std::string> old = files_of_run(mark_, dir_);
  mark_.extra.erase("written_by_new_run");
  if (old.empty()) return;
  mark_.extra[kSetAsideKey] = old;  // recorded before anything moves
  os::write_folder_mark(dir_, mark_);
  for (const std::string& f : old) {
    const std::string to = aside + "/" + f;
    os::make_directories(os::parent_directory(to));
    os::rename(dir_ + "/" + f, to);
  }
  aside_ = old;
}

void RunFolder::remove_set_aside() {
  const std::string aside = dir_ + "/" + kOverwrittenName;
  std::vector<std::string> listed;
  if (mark_.extra.contains(kSetAsideKey)) listed = mark_.extra[kSetAsideKey].get<std::vector<std::string>>();
  for (const std::string& f : listed) os::remove_file(aside + "/" + f);
  remove_empty_folders(aside);
  mark_.extra.erase(kSetAsideKey);
  os::write_folder_mark(dir_, mark_);
  if (os::exists(aside)) {
    log::warn("train: ", aside, " holds files medfast did not put there (",
              os::describe_entries(aside, os::list_directory(aside)), "): left as they are");
  }
}

void RunFolder::first_checkpoint_written() {
  if (aside_.empty()) return;
  remove_set_aside();
  aside_.clear();
  mark_.extra.erase("written_by_new_run");
  os::write_folder_mark(dir_, mark_);
}

void RunFolder::put_back_old_run(const std::function<void()>& close_files) noexcept {
  if (aside_.empty()) return;
  const std::string aside = dir_ + "/" + kOverwrittenName;
  try {
    if (close_files) close_files();  // the new run's event file is closed, then removed with its other files
    if (mark_.extra.contains("written_by_new_run")) {
      for (const auto& j : mark_.extra["written_by_new_run"]) {
        const std::string f = j.get<std::string>();
        os::remove_file(dir_ + "/" + f);
        mark_.files.erase(std::remove(mark_.files.begin(), mark_.files.end(), f), mark_.files.end());
      }
    }
    for (const std::string& f : aside_) {
      os::remove_file(dir_ + "/" + f);  // the new run's file of that name: medfast's, as the old one was
      os::rename(aside + "/" + f, dir_ + "/" + f);
    }
    remove_empty_folders(aside);
    mark_.extra.erase(kSetAsideKey);
    mark_.extra.erase("written_by_new_run");
    os::write_folder_mark(dir_, mark_);
    if (say_) say_(str("the run this one was to overwrite is back in ", dir_));
  } catch (const std::exception& e) {
    log::warn("train: could not put back the overwritten run (", aside, "): ", e.what());
  }
  aside_.clear();
}

void write_metrics(const std::string& path, const std::vector<nlohmann::json>& epochs) {
  std::string text;
  for (const auto& e : epochs) text += e.dump() + "\n";
  os::write_text_file(path, text);
}

std::optional<int> earlier_medfast_run_of(const std::string& last) { return earlier_medfast_run(last); }

}  // namespace detail

std::string claim_run_folder_for_plan(const std::string& run_dir, bool resume, bool overwrite) {
  const std::string plan = run_dir + "/" + kRunPlanName;
  std::optional<os::FolderMark> mark = os::read_folder_mark(run_dir);
  if (!mark && resume && detail::earlier_medfast_run_of(run_dir + "/last.ckpt")) return plan;  // marked when the run opens it
  if (!mark || mark->kind != os::kRunFolder) mark = os::claim_folder(run_dir, os::kRunFolder, "train.run_dir");
  const std::vector<std::string> present = detail::files_of_run(*mark, run_dir);
  if (!resume && !overwrite && !present.empty()) {
    throw ValueError(str("train --dataset: ", run_dir, " already holds a run (", os::describe_entries(run_dir, present),
                         "): pass --resume to continue it with its plan, --overwrite to plan and start again, or "
                         "--set train.run_dir=... for another folder"));
  }
  os::record_file(run_dir, *mark, kRunPlanName);
  os::record_file(run_dir, *mark, detail::kRunPlanListName);
  return plan;
}

}  // namespace medfast::train
