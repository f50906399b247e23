#pragma once
/// \file
/// A training run's folder (private to src/train/): one `train` per folder (a lock on
/// run_dir/.medfast-train.lock), a fresh run refusing a folder that holds a run unless
/// --overwrite, a resumed run needing last.ckpt written with the same data, model, loss,
/// optimizer, schedule, seed and amp, temporaries of killed writers removed, and
/// --overwrite's old run set aside until the new run's first checkpoint.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/os/file.hpp"

namespace medfast::train::detail {

class RunFolder {
 public:
  using Say = std::function<void(const std::string&)>;
  /// `rank0`: this process writes the folder (under DDP the other ranks only read it).
  RunFolder(std::string dir, bool rank0, Say say);

  /// Locks the folder (rank 0) and checks it for a fresh run, or for --resume of `config`
  /// (the whole run config). Returns the epoch the run starts at (0 for a fresh run).
  /// ValueError naming the folder and what to do.
  int open(bool resume, bool overwrite, const nlohmann::json& config);

  const std::string& dir() const { return dir_; }
  const std::string& last_checkpoint() const { return last_; }
  const std::string& best_checkpoint() const { return best_; }

  /// --overwrite: the old run's files (checkpoints, metrics, config, machine, curves) move
  /// into run_dir/.overwritten-run when the new run is about to write its own.
  void set_aside_old_run();
  /// The new run wrote its first checkpoint: the old run goes. No-op without one set aside.
  void first_checkpoint_written();
  /// The new run failed before its first checkpoint: its files go and the old run comes
  /// back (`close_files` first closes what the new run holds open). No-op without one.
  void put_back_old_run(const std::function<void()>& close_files) noexcept;

 private:
  static void remove_aside(const std::string& aside);
  static bool old_run_file(const std::string& name);

  std::string dir_, last_, best_;
  bool rank0_;
  Say say_;
  os::FileLock lock_;       // rank 0's lock on the folder, held for the run
  bool overwrite_ = false;  // --overwrite: the old run is set aside when this one writes
  std::string aside_;       // where it is while this run has no checkpoint yet
};

/// metrics.jsonl: one JSON object per epoch, written whole (atomically).
void write_metrics(const std::string& dir, const std::vector<nlohmann::json>& epochs);

}  // namespace medfast::train::detail
