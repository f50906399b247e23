#pragma once
/// \file
/// Distributed data parallel through torch's c10d: a TCPStore for the rendezvous
/// and a ProcessGroupGloo for the collectives, behind train::Collective so that the
/// trainer (and this header) never see c10d.
///
/// Rendezvous protocol (init_process_group):
///  1. rank 0 hosts a TCPStore on MASTER_PORT (all interfaces); every rank,
///     rank 0 included, connects to it as a client at MASTER_ADDR:MASTER_PORT;
///     a client retries until `timeout_seconds`, so start order does not matter.
///  2. every rank adds 1 to a join counter in the store and waits, up to
///     `timeout_seconds`, until the counter reaches world_size. A missing peer is
///     therefore reported as "k of N ranks joined" (with rank and address) instead
///     of a hang or a low-level socket message.
///  3. ProcessGroupGloo exchanges its transport addresses through the same store.
/// Gloo's transport binds to 127.0.0.1 when MASTER_ADDR is a loopback address
/// (every rank is on this host), to the interfaces in GLOO_SOCKET_IFNAME when set
/// (as torch does), else to the address this host's name resolves to.
///
/// Every collective is blocking and must run in the same order, with the same
/// shapes, on every rank; an error (a peer that died, a timeout) is rethrown as
/// medfast::Error naming the rank, the operation and the rendezvous address.
/// Ranks whose collectives diverge can make Gloo hang or abort in its transport
/// thread; TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective first (c10d's
/// ProcessGroupWrapper) and turns that into an error naming both collectives.
#include <memory>
#include <string>

#include "medfast/train/collective.hpp"

namespace medfast::dist {

struct DistOptions {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Rendezvous and every collective give up after this long.
  double timeout_seconds = 300;  ///< MEDFAST_DIST_TIMEOUT (seconds)
  /// gloo (CPU and CUDA tensors; CUDA tensors travel through host memory);
  /// nccl is refused with a clear error: Debian's libtorch has no NCCL.
  std::string backend = "gloo";

  /// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them
  /// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID when RANK is absent). Nothing set:
  /// a single process (world_size 1). Bad values: ValueError naming the variable
  /// and the value.
  static DistOptions from_environment();
  bool enabled() const { return world_size > 1; }
  /// ValueError naming the field and the value.
  void validate() const;
};

/// Validates `options`, rendezvouses and returns the process group as a
/// train::Collective. Throws Error naming the rank and master address:port on a
/// timeout (a missing peer) or a connection failure, ValueError for bad options.
std::shared_ptr<train::Collective> init_process_group(const DistOptions& options);

}  // namespace medfast::dist
