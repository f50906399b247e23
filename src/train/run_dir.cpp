#include "run_dir.hpp"

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

namespace medfast::train::detail {

namespace {

/// Sections whose change makes a checkpoint's state meaningless for a resumed run.
const std::vector<std::string> kResumeFixed{"model", "loss", "optimizer", "schedule", "data"};

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

}  // namespace

RunFolder::RunFolder(std::string dir, bool rank0, Say say)
    : dir_(std::move(dir)), last_(dir_ + "/last.ckpt"), best_(dir_ + "/best.ckpt"), rank0_(rank0), say_(std::move(say)) {}

int RunFolder::open(bool resume, bool overwrite, const nlohmann::json& config) {
  if (rank0_) {  // one train per run_dir: two would write one folder's files in turn
    os::make_directories(dir_);
    int holder = 0;
    std::optional<os::FileLock> lock = os::try_lock_file(dir_ + "/" + kRunLockName, &holder);
    if (!lock) {
      throw ValueError(str("train.run_dir ", dir_, " is in use by another medfast train (pid ",
                           holder > 0 ? std::to_string(holder) : std::string("unknown"),
                           "): wait for it to finish, or choose another run_dir"));
    }
    lock_ = std::move(*lock);
  }
  if (resume && overwrite) throw ValueError("train: --resume and --overwrite exclude each other");
  if (!resume && os::exists(last_) && !overwrite) {
    throw ValueError(str("train.run_dir ", dir_, " already holds a run (", last_, ", epoch ",
                         read_checkpoint_meta(last_).value("epoch", 0),
                         "): pass --resume to continue it, --overwrite to start again, or choose another run_dir"));
  }
  overwrite_ = !resume && overwrite && rank0_;
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
  }
  if (rank0_) {
    // Temporaries of a writer that was killed (last.ckpt.tmp-<pid>-<n>, config.json.tmp-...).
    const os::Removed stale = os::remove_stale_temporaries(dir_);
    if (!stale.paths.empty() && say_) {
      say_(str("removed ", stale.paths.size(), " temporary files of an interrupted run from ", dir_, " (",
               format_bytes(stale.bytes), ")"));
    }
  }
  return first_epoch;
}

// The old run's files are moved into run_dir/<kOverwrittenName> when the new run is about to
// write its own, dropped once it has written its first checkpoint, and put back if it fails
// before: a run that cannot train does not cost the run it was to replace. (A process killed
// in between leaves them there, and says nothing; the next --overwrite replaces them.)
void RunFolder::set_aside_old_run() {
  if (!overwrite_) return;
  const std::string aside = dir_ + "/" + kOverwrittenName;
  if (os::exists(aside)) remove_aside(aside);
  std::vector<std::string> old;
  for (const std::string& f : os::list_directory(dir_)) {
    if (old_run_file(f)) old.push_back(f);
  }
  if (old.empty()) return;
  os::make_directories(aside);
  for (const std::string& f : old) os::rename(dir_ + "/" + f, aside + "/" + f);
  aside_ = aside;
}

void RunFolder::first_checkpoint_written() {
  if (aside_.empty()) return;
  remove_aside(aside_);
  aside_.clear();
}

void RunFolder::remove_aside(const std::string& aside) {  // it holds no folders
  for (const std::string& f : os::list_directory(aside)) os::remove_file(aside + "/" + f);
  os::remove_empty_directory(aside);
}

void RunFolder::put_back_old_run(const std::function<void()>& close_files) noexcept {
  if (aside_.empty()) return;
  try {
    if (close_files) close_files();  // the new run's event file is closed, then removed with its other files
    for (const std::string& f : os::list_directory(dir_)) {
      if (old_run_file(f)) os::remove_file(dir_ + "/" + f);
    }
    for (const std::string& f : os::list_directory(aside_)) os::rename(aside_ + "/" + f, dir_ + "/" + f);
    os::remove_empty_directory(aside_);
    if (say_) say_(str("the run this one was to overwrite is back in ", dir_));
  } catch (const std::exception& e) {
    log::warn("train: could not put back the overwritten run (", aside_, "): ", e.what());
  }
  aside_.clear();
}

/// A file of a run that --overwrite replaces: checkpoints, metrics, config, machine, curves.
bool RunFolder::old_run_file(const std::string& name) {
  static const std::set<std::string> files{"last.ckpt", "best.ckpt", "metrics.jsonl", "config.json", "machine.json"};
  return files.count(name) > 0 || profile::is_event_file(name);
}

void write_metrics(const std::string& dir, const std::vector<nlohmann::json>& epochs) {
  std::string text;
  for (const auto& e : epochs) text += e.dump() + "\n";
  os::write_text_file(dir + "/metrics.jsonl", text);
}

}  // namespace medfast::train::detail
