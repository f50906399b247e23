#pragma once
/// \file
/// Distributed data parallel through torch's c10d: a TCPStore for the rendezvous
/// and a Gloo or NCCL process group for the collectives, behind train::Collective
/// so that the trainer (and this header) never see c10d. Gradients are averaged
/// in buckets that start while backward runs (train::GradientSync).
///
/// Rendezvous protocol (init_process_group):
///  1. rank 0 hosts a TCPStore on MASTER_PORT (all interfaces); every rank,
///     rank 0 included, connects to it as a client at MASTER_ADDR:MASTER_PORT;
///     a client retries until `timeout_seconds`, so start order does not matter.
///  2. every rank adds 1 to a join counter in the store and waits, up to
///     `timeout_seconds`, until the counter reaches world_size. A missing peer is
///     therefore reported as "k of N ranks joined" (with rank and address) instead
///     of a hang or a low-level socket message.
///  3. the backend (ProcessGroupGloo, or ProcessGroupNCCL for CUDA training where
///     libtorch has it) exchanges its transport addresses through the same store.
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
#include <cstdint>
#include <memory>
#include <chrono>
#include <functional>
#include <string>

#include "medfast/core/rank_env.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/train/collective.hpp"

namespace medfast::dist {

struct DistOptions {
  int rank = 0, world_size = 1, local_rank = 0;
  int local_world_size = 0;  ///< LOCAL_WORLD_SIZE; 0 where unknown
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Rendezvous and every collective give up after this long (setting dist_timeout).
  double timeout_seconds = kDefaultDistTimeoutSeconds;
  /// auto | gloo | nccl (setting dist_backend). auto: nccl when `cuda` and this
  /// libtorch has NCCL and a GPU, else gloo. gloo reduces CUDA tensors through host
  /// memory; nccl works on the rank's GPU (LOCAL_RANK), and is a clear error where
  /// libtorch has no NCCL (Debian's CPU builds).
  std::string backend = "auto";
  /// The run trains on CUDA (decides backend auto).
  bool cuda = false;
  /// Gradients are all-reduced in buckets of about this size (setting dist_bucket_bytes).
  std::uint64_t bucket_bytes = kDefaultDistBucketBytes;

  /// The launcher's rank variables (RankEnvironment) and medfast's dist_* settings.
  static DistOptions from(const Settings& settings, const RankEnvironment& env = RankEnvironment::read());
  bool enabled() const { return world_size > 1; }
  /// ValueError naming the field and the value.
  void validate() const;
  /// gloo or nccl: what `backend` stands for on this machine.
  std::string resolved_backend() const;
};

/// This libtorch has c10d's NCCL backend and a CUDA device is present.
bool nccl_available();

namespace detail {

/// A collective the host waits for where c10d's wait() does not: NCCL's only makes
/// the current stream wait (a peer that died leaves its kernel waiting for ever, and
/// NCCL's watchdog kills the process after dist_timeout with a message about the
/// watchdog). What waiting needs, as plain callables (the process group's, or a test's).
struct CollectiveWait {
  std::string what;                         ///< the collective, for the message
  std::function<bool()> completed;          ///< without blocking
  std::function<std::string()> dead_peers;  ///< "" while every peer lives; called about every 0.5 s
  std::function<void()> abort;              ///< stops the collective (the communicator) before the throw
  std::chrono::milliseconds timeout{0};     ///< dist_timeout
};

/// Polls `completed` with short sleeps (20 us doubling up to 1 ms: no core is spun)
/// until it returns true. A dead peer, or no completion within the timeout, aborts and
/// throws Error naming the collective and the peer (or the timeout).
void wait_until_complete(const CollectiveWait& wait);

}  // namespace detail

/// Validates `options`, rendezvouses and returns the process group as a
/// train::Collective. Throws Error naming the rank and master address:port on a
/// timeout (a missing peer) or a connection failure, ValueError for bad options
/// (nccl asked for where there is none).
std::shared_ptr<train::Collective> init_process_group(const DistOptions& options);

}  // namespace medfast::dist
