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

}  // namespace medfast
