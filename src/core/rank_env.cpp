#include "medfast/core/rank_env.hpp"

#include <cstdint>
#include <cstdlib>
#include <limits>

#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"

namespace medfast {

namespace {

/// An environment variable's whole number; the message names the variable and the value.
int env_int(const char* name, const std::string& value) {
  std::int64_t v = 0;
  try {
    v = parse_int(value, name);
  } catch (const ValueError&) {
    throw ValueError(str("environment ", name, "='", value, "' is not a whole number"));
  }
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    throw ValueError(str("environment ", name, "='", value, "' is out of range"));
  }
  return static_cast<int>(v);
}

}  // namespace

RankEnvironment RankEnvironment::read(const Lookup& lookup) {
  const Lookup env = lookup ? lookup : [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
  };
  RankEnvironment o;
  const bool slurm = !env("RANK") && env("SLURM_PROCID");
  const char* rank_var = slurm ? "SLURM_PROCID" : "RANK";
  const char* world_var = slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  const char* local_var = slurm ? "SLURM_LOCALID" : "LOCAL_RANK";
  const auto rank = env(rank_var), world = env(world_var), local = env(local_var);
  if (rank) o.rank = env_int(rank_var, *rank);
  if (world) o.world_size = env_int(world_var, *world);
  if (local) o.local_rank = env_int(local_var, *local);
  if (world && o.world_size < 1) throw ValueError(str("environment ", world_var, "='", *world, "' must be at least 1"));
  if (rank && o.rank < 0) throw ValueError(str("environment ", rank_var, "='", *rank, "' must be at least 0"));
  if (local && o.local_rank < 0) throw ValueError(str("environment ", local_var, "='", *local, "' must be at least 0"));
  if (!slurm) {
    if (const auto lws = env("LOCAL_WORLD_SIZE")) {
      o.local_world_size = env_int("LOCAL_WORLD_SIZE", *lws);
      if (o.local_world_size < 1) {
        throw ValueError(str("environment LOCAL_WORLD_SIZE='", *lws, "' must be at least 1"));
      }
      if (local && o.local_rank >= o.local_world_size) {
        throw ValueError(str("environment LOCAL_RANK='", *local, "' is not below LOCAL_WORLD_SIZE=", o.local_world_size));
      }
    }
  }
  if (rank && !world) {
    throw ValueError(str("environment ", rank_var, "='", *rank, "' is set but ", world_var, " is not"));
  }
  if (world && !rank && o.world_size > 1) {
    throw ValueError(str("environment ", world_var, "='", *world, "' is set but ", rank_var, " is not"));
  }
  if (rank && o.rank >= o.world_size) {
    throw ValueError(str("environment ", rank_var, "='", *rank, "' is not below ", world_var, "=", o.world_size));
  }
  if (const auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) throw ValueError("environment MASTER_ADDR='' is empty (expected a host name or address)");
    o.master_addr = *addr;
  }
  if (const auto port = env("MASTER_PORT")) {
    o.master_port = env_int("MASTER_PORT", *port);
    if (o.master_port < 1 || o.master_port > 65535) {
      throw ValueError(str("environment MASTER_PORT='", *port, "' is outside 1..65535"));
    }
  }
  return o;
}

int local_cuda_index(int local_rank, int visible_devices) {
  if (visible_devices < 1) {
    throw ValueError(str("LOCAL_RANK ", local_rank, ": this process sees no CUDA device (CUDA_VISIBLE_DEVICES, the driver)"));
  }
  if (visible_devices == 1) return 0;  // one GPU per task: its own, whatever LOCAL_RANK says
  if (local_rank < visible_devices) return local_rank;
  throw ValueError(str("LOCAL_RANK ", local_rank, " has no GPU: this process sees ", visible_devices,
                       " CUDA devices (0..", visible_devices - 1,
                       "); start at most that many ranks on this node, or give each rank one GPU "
                       "(CUDA_VISIBLE_DEVICES)"));
}

void check_explicit_cuda_index(const std::string& device, int local_world_size, int visible_devices) {
  if (device.rfind("cuda:", 0) != 0 || local_world_size <= 1 || visible_devices <= 1) return;
  throw ValueError(str("train.device ", device, " names one GPU for every one of this node's ", local_world_size,
                       " ranks (LOCAL_WORLD_SIZE), which see ", visible_devices,
                       " GPUs: use train.device cuda, and each rank takes LOCAL_RANK's GPU"));
}

}  // namespace medfast
