#pragma once
/// \file
/// A training run's folder (private to src/train/). medfast owns what it wrote there and
/// nothing else (os/folder_mark.hpp): the folder carries a mark, `.medfast.json`, that names
/// every file the run wrote (checkpoints, metrics, config, machine, TensorBoard events,
/// profiler traces), each recorded before it is first written.
///
/// - A fresh run takes a missing or empty folder (and marks it), or a marked run folder that
///   holds no run; a folder that holds anything else and has no mark is refused, naming what
///   is there. A marked folder's files are refused as a fresh run's (pass --resume or
///   --overwrite), and a file in the way that the mark does not list (the user's own
///   config.json) is never replaced.
/// - --overwrite moves exactly the files the mark lists into run_dir/.medfast-overwritten-run
///   when the new run is about to write, removes them once it has written its first
///   checkpoint, and puts them back if it fails before: the folder ends as the new run or as
///   it was. Other files are left where they are.
/// - --resume needs last.ckpt written with the same data, model, loss, optimizer, schedule,
///   seed and amp, and epochs left to train. A run folder of an earlier medfast (no mark, a
///   medfast last.ckpt) can be resumed, and is marked then.
/// - One train per folder (a lock on run_dir/.medfast-train.lock, taken once the folder is
///   known to be medfast's). Temporaries of killed writers are removed (a marked folder only).
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"

namespace medfast::train::detail {

class RunFolder {
 public:
  using Say = std::function<void(const std::string&)>;
  /// `rank0`: this process writes the folder (under DDP the other ranks only read it).
  RunFolder(std::string dir, bool rank0, Say say);

  /// Checks the folder for a fresh run, or for --resume of `config` (the whole run config)
  /// with `epochs` to train in all and `target_dice` to stop at (0: none), marks it and
  /// locks it (rank 0). Returns the epoch the run starts at (0 for a fresh run). ValueError
  /// naming the folder and what to do (a resume with nothing left to train is one); nothing
  /// in the folder is changed when it throws.
  int open(bool resume, bool overwrite, const nlohmann::json& config, int epochs, double target_dice);

  const std::string& dir() const { return dir_; }
  const std::string& last_checkpoint() const { return last_; }
  const std::string& best_checkpoint() const { return best_; }

  /// `name` (relative to the folder: "metrics.jsonl", "profiler/3-trace.json.gz") is
  /// medfast's: recorded in the mark before it is first written (rank 0). Returns its path.
  std::string will_write(const std::string& name);

  /// --overwrite: the old run's files (those the mark lists) move into
  /// run_dir/.medfast-overwritten-run when the new run is about to write its own.
  void set_aside_old_run();
  /// The new run wrote its first checkpoint: the old run's files go. No-op without any set aside.
  void first_checkpoint_written();
  /// The new run failed before its first checkpoint: its files go and the old run comes
  /// back (`close_files` first closes what the new run holds open). No-op without any.
  void put_back_old_run(const std::function<void()>& close_files) noexcept;

 private:
  void adopt_earlier_run();
  void remove_set_aside();

  std::string dir_, last_, best_;
  bool rank0_;
  Say say_;
  os::FolderMark mark_;
  os::FileLock lock_;       // rank 0's lock on the folder, held for the run
  bool overwrite_ = false;  // --overwrite: the old run is set aside when this one writes
  std::vector<std::string> aside_;  // the old run's files while this run has no checkpoint yet
};

/// The files of a run that `mark` lists and `dir` holds (not the files a run starts from,
/// such as train --dataset's plan.yaml).
std::vector<std::string> files_of_run(const os::FolderMark& mark, const std::string& dir);

/// An unmarked folder's last.ckpt that reads as medfast's: the epoch it holds.
std::optional<int> earlier_medfast_run_of(const std::string& last);
/// The list of the cases a plan kept, beside it.
inline constexpr const char* kRunPlanListName = "plan.dataset.json";

/// metrics.jsonl: one JSON object per epoch, written whole (atomically).
void write_metrics(const std::string& path, const std::vector<nlohmann::json>& epochs);

}  // namespace medfast::train::detail
