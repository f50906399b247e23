#pragma once
/// \file
/// Where this process stands in a distributed run, as the launcher described it
/// in the environment: torchrun's (and `medfast launch`'s) RANK, WORLD_SIZE,
/// LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or SLURM's SLURM_PROCID, SLURM_NTASKS,
/// SLURM_LOCALID when RANK is absent (srun without torchrun). This is the one
/// place medfast reads them; medfast's own settings (dist_backend, dist_timeout,
/// ...) are in the settings registry.
#include <functional>
#include <optional>
#include <string>

namespace medfast {

struct RankEnvironment {
  int rank = 0, world_size = 1, local_rank = 0;
  int local_world_size = 0;  ///< LOCAL_WORLD_SIZE (torchrun, medfast launch); 0 where not set
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  /// More than one rank.
  bool distributed() const { return world_size > 1; }

  /// Reads the variables through `lookup` (default: the process environment).
  /// Nothing set: a single process. Bad or inconsistent values: ValueError
  /// naming the variable and the value.
  using Lookup = std::function<std::optional<std::string>(const char* name)>;
  static RankEnvironment read(const Lookup& lookup = {});
};

/// The GPU a rank takes when the device is named without an index ("cuda") under a
/// launcher, given how many CUDA devices this process sees: LOCAL_RANK's where it sees the
/// node's GPUs (torchrun, medfast launch), 0 where it sees one alone (CUDA_VISIBLE_DEVICES
/// set per task, SLURM's --gpus-per-task). ValueError naming LOCAL_RANK and the count where
/// LOCAL_RANK has no GPU, or none is visible.
int local_cuda_index(int local_rank, int visible_devices);

/// An explicit device index (cuda:N) under a launcher that puts several ranks on this node,
/// each seeing the node's GPUs, would put them all on GPU N: ValueError saying so. A process
/// that sees one GPU alone, or a single rank on its node (local_world_size 1, or unknown: 0),
/// may name it.
void check_explicit_cuda_index(const std::string& device, int local_world_size, int visible_devices);

}  // namespace medfast
