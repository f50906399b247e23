#include "medfast/dist/process_group.hpp"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "c10d_compat.hpp"
#include "liveness.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/os/net.hpp"

namespace medfast::dist {

namespace {

using detail::Clock;
using detail::Heartbeat;
using detail::Waiter;
using detail::cause;
using detail::guarded;

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

/// Gloo and NCCL reduce these dtypes natively; bfloat16 travels as float (exact
/// for broadcast, more accurate for sums), bool as uint8 (broadcast only).
at::ScalarType wire_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return at::kFloat;
    case at::kBool:
      return at::kByte;
    default:
      return t;
  }
}

std::string describe(const at::Tensor& t) { return str(t.scalar_type(), t.sizes(), " on ", t.device()); }

/// The buffer the backend reads and writes: the tensor itself when it is a
/// contiguous tensor of a wire dtype on the backend's device, else a copy there
/// that commit() writes back. Gloo works on host memory (CUDA tensors take the
/// host route whether or not this libtorch's Gloo was built with CUDA); NCCL on
/// the rank's GPU (CPU tensors, e.g. loss sums, go there and back).
struct Staged {
  at::Tensor& target;
  at::Tensor buffer;
  Staged(at::Tensor& t, const at::Device& wire) : target(t) {
    const at::ScalarType dtype = wire_dtype(t.scalar_type());
    if (t.device() == wire && t.is_contiguous() && dtype == t.scalar_type()) {
      buffer = t;
    } else {
      buffer = t.to(wire, dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
  }
  void commit() {
    if (!buffer.is_same(target)) target.copy_(buffer);
  }
};

/// Parameters grouped into flat buffers on the backend's device, one collective
/// each. A bucket's layout: [grad_0 | grad_1 | ... | grad_n-1 | had_0 ... had_n-1].
/// A parameter without a gradient contributes zeros, so every rank sends the same
/// layout; the trailing flags count the ranks that had a gradient: a parameter
/// gets the mean (sum / world size, as DistributedDataParallel divides) wherever
/// any rank had one, and stays without one on every rank when none had.
///
/// Buckets are started strictly in index order on every rank (a bucket that is
/// complete early waits for its predecessors), so the collectives line up across
/// ranks whatever order backward delivers the gradients in.
class Buckets final : public train::GradientSync {
 public:
  Buckets(std::vector<at::Tensor> params, c10::intrusive_ptr<detail::Backend> group, at::Device wire,
          std::size_t bucket_bytes, int world_size, std::string where, bool hooks, Heartbeat* heartbeat,
          const Waiter* waiter)
      : params_(std::move(params)),
        group_(std::move(group)),
        wire_(wire),
        world_(world_size),
        where_(std::move(where)),
        heartbeat_(heartbeat),
        waiter_(waiter) {
    layout(bucket_bytes);
    if (hooks) {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (!params_[i].requires_grad()) continue;
        hooks_.emplace_back(i, params_[i].register_hook([this, i](const at::Tensor& grad) { arrived(i, grad); }));
      }
    }
    prepare();
  }
  ~Buckets() override {
    for (const auto& [i, h] : hooks_) params_[i].remove_hook(h);
  }

  void prepare() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Bucket& b : buckets_) {
      b.pending = b.members.size();
      b.started = false;
      b.work.reset();
      b.had.assign(b.members.size(), false);
    }
    next_ = 0;
    started_in_backward_ = 0;
    in_backward_ = true;
  }

  void finish() override {
    guarded(str(where_, ": gradient all-reduce over ", params_.size(), " parameters in ", buckets_.size(), " buckets"),
            heartbeat_, [&] {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        in_backward_ = false;
        for (std::size_t k = next_; k < buckets_.size(); ++k) {
          Bucket& b = buckets_[k];
          for (std::size_t m = 0; m < b.members.size(); ++m) {
            if (!b.had[m]) stage(b, m, params_[b.members[m]].grad());
          }
          start(b);
        }
        next_ = buckets_.size();
      }
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> flags;
      for (Bucket& b : buckets_) {
        (*waiter_)(b.work);
        b.flat.narrow(0, 0, b.numel).div_(world_);
        flags.push_back(b.flat.narrow(0, b.numel, static_cast<std::int64_t>(b.members.size())));
      }
      // One device-to-host copy for every bucket's flags.
      const at::Tensor had = at::cat(flags).to(at::kCPU, at::kDouble);
      const double* had_any = had.data_ptr<double>();
      for (Bucket& b : buckets_) {
        for (std::size_t m = 0; m < b.members.size(); ++m, ++had_any) {
          if (*had_any == 0) continue;  // no rank had a gradient: none gets one
          const at::Tensor& p = params_[b.members[m]];
          const at::Tensor slot = b.flat.narrow(0, b.offsets[m], p.numel()).view(p.sizes());
          at::Tensor& g = p.mutable_grad();
          if (g.defined()) {
            g.copy_(slot);
          } else {
            g = at::empty(p.sizes(), p.options().requires_grad(false)).copy_(slot);
          }
        }
      }
    });
  }

  int buckets_started_in_backward() const override { return started_in_backward_; }
  int buckets() const override { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    at::ScalarType dtype;
    at::Device device{at::kCPU};
    std::vector<std::size_t> members;
    std::vector<std::int64_t> offsets;
    std::int64_t numel = 0;
    at::Tensor flat;
    std::size_t pending = 0;
    std::vector<bool> had;
    bool started = false;
    c10::intrusive_ptr<c10d::Work> work;
  };

  /// Parameters in reverse order (backward meets the last layers first), a new
  /// bucket whenever the dtype or device changes or the size would pass the
  /// limit; the first bucket is small (1 MiB), as DDP's, to start communicating early.
  void layout(std::size_t bucket_bytes) {
    const std::size_t first_cap = std::min<std::size_t>(bucket_bytes, 1u << 20);
    std::size_t bytes = 0;
    for (std::size_t n = params_.size(); n-- > 0;) {
      const at::Tensor& p = params_[n];
      if (!p.defined()) throw ValueError(str(where_, ": parameter ", n, " is undefined"));
      const std::size_t pb = static_cast<std::size_t>(p.numel()) * p.element_size();
      const std::size_t cap = buckets_.size() <= 1 ? first_cap : bucket_bytes;
      if (buckets_.empty() || buckets_.back().dtype != p.scalar_type() || buckets_.back().device != p.device() ||
          (bytes > 0 && bytes + pb > cap)) {
        Bucket b;
        b.dtype = p.scalar_type();
        b.device = p.device();
        buckets_.push_back(std::move(b));
        bytes = 0;
      }
      Bucket& b = buckets_.back();
      bucket_of_.resize(params_.size());
      bucket_of_[n] = {buckets_.size() - 1, b.members.size()};
      b.members.push_back(n);
      b.offsets.push_back(b.numel);
      b.numel += p.numel();
      bytes += pb;
    }
    for (Bucket& b : buckets_) {
      const auto count = static_cast<std::int64_t>(b.members.size());
      b.flat = at::zeros({b.numel + count}, at::TensorOptions().dtype(wire_dtype(b.dtype)).device(wire_));
    }
  }

  /// Copies a gradient (or zeros) into its slot and sets its flag.
  void stage(Bucket& b, std::size_t m, const at::Tensor& grad) {
    const at::Tensor& p = params_[b.members[m]];
    at::Tensor slot = b.flat.narrow(0, b.offsets[m], p.numel());
    at::Tensor flag = b.flat.narrow(0, b.numel + static_cast<std::int64_t>(m), 1);
    if (grad.defined()) {
      if (grad.is_sparse() || grad.numel() != p.numel()) {
        throw ValueError(str(where_, ": parameter ", b.members[m], " ", describe(p), " has a gradient ", describe(grad),
                             (grad.is_sparse() ? " that is sparse" : " of another size")));
      }
      slot.view(grad.sizes()).copy_(grad);
      flag.fill_(1);
    } else {
      slot.zero_();
      flag.zero_();
    }
  }

  void start(Bucket& b) {
    std::vector<at::Tensor> v{b.flat};
    b.work = group_->allreduce(v);
    b.started = true;
  }

  /// Autograd hook: parameter i's gradient for this backward.
  void arrived(std::size_t i, const at::Tensor& grad) {
    at::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!in_backward_) return;  // a backward outside prepare()/finish(): not ours to reduce
    const auto [k, m] = bucket_of_[i];
    Bucket& b = buckets_[k];
    if (b.had[m] || b.started) return;
    stage(b, m, grad);
    b.had[m] = true;
    --b.pending;
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      start(buckets_[next_++]);
      ++started_in_backward_;
    }
  }

  std::vector<at::Tensor> params_;
  c10::intrusive_ptr<detail::Backend> group_;
  at::Device wire_;
  int world_;
  std::string where_;
  Heartbeat* heartbeat_;
  const Waiter* waiter_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> bucket_of_;  // parameter -> (bucket, member)
  std::vector<std::pair<std::size_t, unsigned>> hooks_;
  std::mutex mutex_;
  std::size_t next_ = 0;
  int started_in_backward_ = 0;
  bool in_backward_ = false;
};

#if MEDFAST_HAVE_C10D_NCCL
using NcclHandle = c10::intrusive_ptr<c10d::ProcessGroupNCCL>;
#else
struct NcclHandle {
  explicit operator bool() const { return false; }
};
#endif

class GroupCollective final : public train::Collective {
 public:
  /// `nccl`: the NCCL backend behind `group` (abort on a dead peer, shutdown at the end); else null.
  GroupCollective(DistOptions options, std::string backend, at::Device wire, c10::intrusive_ptr<c10d::Store> store,
                  c10::intrusive_ptr<detail::Backend> group, NcclHandle nccl)
      : options_(std::move(options)),
        backend_(std::move(backend)),
        wire_(wire),
        store_(std::move(store)),
        group_(std::move(group)),
        nccl_(std::move(nccl)),
        heartbeat_(std::make_unique<Heartbeat>(store_, options_.rank, options_.world_size, options_.local_world_size)),
        waiter_(heartbeat_.get(), to_ms(options_.timeout_seconds), nccl_abort()) {}

  /// NCCL's communicators are shut down here, on every path out (libtorch 2.4+ warns at
  /// exit otherwise, and a process that skips it may hang in the communicator's teardown).
  /// A rank that failed aborts its communicator instead: a graceful shutdown would wait
  /// for collectives it started (gradient buckets of the step that failed) that its
  /// peers, aborted or gone, will never finish.
  ~GroupCollective() override {
    if (failed_) {
      if (const auto abort = nccl_abort()) {
        try {
          abort();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "medfast: %s: NCCL abort: %s\n", where().c_str(), cause(e).c_str());
        }
      }
    } else {
      nccl_shutdown();
    }
  }

  void announce_failure(const std::string& message) override {
    failed_ = true;
    heartbeat_->announce_failure(message);
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  const char* backend() const override { return backend_.c_str(); }

  void allreduce_sum(at::Tensor& tensor) override {
    const std::string what = "allreduce_sum";
    check(tensor, what);
    MEDFAST_CHECK_T(ValueError, tensor.scalar_type() != at::kBool, where(), ": ", what,
                    " of a bool tensor (sum it as an integer type)");
    guarded(str(where(), ": ", what, " of ", describe(tensor)), heartbeat_.get(), [&] {
      at::NoGradGuard no_grad;
      Staged s(tensor, wire_);
      std::vector<at::Tensor> v{s.buffer};
      waiter_(group_->allreduce(v));
      s.commit();
    });
  }

  void broadcast(at::Tensor& tensor, int root) override {
    const std::string what = str("broadcast from rank ", root);
    check(tensor, what);
    check_root(root);
    guarded(str(where(), ": ", what, " of ", describe(tensor)), heartbeat_.get(), [&] {
      at::NoGradGuard no_grad;
      Staged s(tensor, wire_);
      std::vector<at::Tensor> v{s.buffer};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      waiter_(group_->broadcast(v, o));
      s.commit();
    });
  }

  /// One flat buffer per dtype on the backend's device, one broadcast each.
  void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int root) override {
    check_root(root);
    std::vector<at::ScalarType> dtypes;
    for (const auto& t : tensors) {
      check(t, "broadcast_coalesced");
      if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end()) dtypes.push_back(t.scalar_type());
    }
    guarded(str(where(), ": broadcast from rank ", root, " of ", tensors.size(), " tensors"), heartbeat_.get(), [&] {
      at::NoGradGuard no_grad;
      for (const at::ScalarType dtype : dtypes) {
        std::vector<at::Tensor> members;
        for (const auto& t : tensors) {
          if (t.scalar_type() == dtype) members.push_back(t);
        }
        std::vector<at::Tensor> flat_parts;
        for (const auto& t : members) flat_parts.push_back(t.reshape({-1}).to(wire_, wire_dtype(dtype)));
        std::vector<at::Tensor> v{at::cat(flat_parts)};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        waiter_(group_->broadcast(v, o));
        std::int64_t offset = 0;
        for (auto& t : members) {
          at::Tensor target = t;
          target.copy_(v[0].narrow(0, offset, t.numel()).view(t.sizes()));
          offset += t.numel();
        }
      }
    });
  }

  void allreduce_mean_gradients(const std::vector<at::Tensor>& parameters) override {
    Buckets(parameters, group_, wire_, options_.bucket_bytes, options_.world_size, where(), /*hooks=*/false,
            heartbeat_.get(), &waiter_)
        .finish();
  }

  std::unique_ptr<train::GradientSync> gradient_sync(const std::vector<at::Tensor>& parameters) override {
    return std::make_unique<Buckets>(parameters, group_, wire_, options_.bucket_bytes, options_.world_size, where(),
                                     /*hooks=*/true, heartbeat_.get(), &waiter_);
  }

 private:
  std::string where() const {
    return str("rank ", options_.rank, " of ", options_.world_size, " (", backend_, ", rendezvous ",
               options_.master_addr, ":", options_.master_port, ")");
  }
  void check(const at::Tensor& t, const std::string& what) const {
    if (!t.defined()) throw ValueError(str(where(), ": ", what, " of an undefined tensor"));
    if (t.is_sparse()) throw ValueError(str(where(), ": ", what, " of a sparse tensor ", describe(t)));
  }
  void check_root(int root) const {
    if (root < 0 || root >= options_.world_size) {
      throw ValueError(str(where(), ": broadcast root ", root, " is outside 0..", options_.world_size - 1));
    }
  }

  std::function<void()> nccl_abort() {
#if MEDFAST_NCCL_ABORT_AND_SHUTDOWN
    if (nccl_) {
      return [this] {
        aborted_ = true;
        nccl_->abort();  // the kernels waiting for the dead peer end; the communicator is gone
      };
    }
#endif
    return nullptr;
  }
  void nccl_shutdown() noexcept {
#if MEDFAST_NCCL_ABORT_AND_SHUTDOWN
    if (nccl_ && !aborted_) {
      try {
        nccl_->shutdown();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "medfast: %s: NCCL shutdown: %s\n", where().c_str(), cause(e).c_str());
      }
    }
#endif
  }

  DistOptions options_;
  std::string backend_;
  at::Device wire_;
  c10::intrusive_ptr<c10d::Store> store_;  // the group uses it; rank 0's also serves the others
  c10::intrusive_ptr<detail::Backend> group_;
  NcclHandle nccl_;
  bool aborted_ = false;
  std::atomic<bool> failed_{false};  ///< announce_failure: the destructor aborts rather than shuts down
  std::unique_ptr<Heartbeat> heartbeat_;
  Waiter waiter_;
};

std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const DistOptions& o) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  const char* ifnames_env = std::getenv("GLOO_SOCKET_IFNAME");  // torch's own variable, read as torch reads it
  const std::string ifnames = ifnames_env ? ifnames_env : "";
  if (!ifnames.empty()) {
    std::size_t start = 0;
    while (start <= ifnames.size()) {
      const std::size_t end = std::min(ifnames.find(',', start), ifnames.size());
      const std::string name = ifnames.substr(start, end - start);
      if (!name.empty()) devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      start = end + 1;
    }
  } else if (is_loopback(o.master_addr)) {
    devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return devices;
}

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const DistOptions& o) {
  auto go = c10d::ProcessGroupGloo::Options::create(to_ms(o.timeout_seconds));
  go->devices = gloo_devices(o);
  go->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, go);
}

NcclHandle make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const DistOptions& o) {
#if MEDFAST_HAVE_C10D_NCCL
  auto no = c10d::ProcessGroupNCCL::Options::create();
  // NCCL's watchdog counts from when a collective is queued and tears the process down;
  // medfast's own wait (Waiter) gives up at dist_timeout with a message naming the peers,
  // so NCCL's comes a little later.
  no->timeout = to_ms(o.timeout_seconds + 30);
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world_size, no);
#else
  (void)store;
  (void)o;
  throw ValueError("backend nccl: this libtorch was built without NCCL");
#endif
}

}  // namespace

bool nccl_available() { return detail::kHaveNccl && at::hasCUDA(); }

DistOptions DistOptions::from(const Settings& settings, const RankEnvironment& env) {
  DistOptions o;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.local_rank = env.local_rank;
  o.local_world_size = env.local_world_size;
  o.master_addr = env.master_addr;
  o.master_port = env.master_port;
  o.timeout_seconds = settings.get_seconds("dist_timeout");
  o.backend = settings.get("dist_backend");
  o.bucket_bytes = settings.get_bytes("dist_bucket_bytes");
  return o;
}

void DistOptions::validate() const {
  if (world_size < 1) throw ValueError(str("dist: world_size ", world_size, " must be at least 1"));
  if (rank < 0 || rank >= world_size) {
    throw ValueError(str("dist: rank ", rank, " is outside 0..", world_size - 1, " (world_size ", world_size, ")"));
  }
  if (local_rank < 0) throw ValueError(str("dist: local_rank ", local_rank, " must be at least 0"));
  if (master_addr.empty()) throw ValueError("dist: master_addr is empty (expected a host name or address)");
  if (master_port < 1 || master_port > 65535)
    throw ValueError(str("dist: master_port ", master_port, " is outside 1..65535"));
  if (!(timeout_seconds > 0) || !(timeout_seconds <= kMaxDistTimeoutSeconds)) {
    throw ValueError(str("dist: timeout_seconds ", timeout_seconds, " must be positive (and at most ",
                         kMaxDistTimeoutSeconds, ")"));
  }
  if (backend != "auto" && backend != "gloo" && backend != "nccl")
    throw ValueError(str("dist: backend '", backend, "' is not auto, gloo or nccl"));
  if (bucket_bytes < 1) throw ValueError(str("dist: bucket_bytes ", bucket_bytes, " must be at least 1"));
}

std::string DistOptions::resolved_backend() const {
  if (backend != "auto") return backend;
  return cuda && nccl_available() ? "nccl" : "gloo";
}

namespace {

/// Step 1 of the rendezvous: rank 0 hosts the TCPStore; every rank connects to it
/// as a client, retrying until the deadline (rank 0 may start later).
c10::intrusive_ptr<c10d::TCPStore> connect_store(const DistOptions& o, const std::string& who, const std::string& at,
                                                 Clock::time_point deadline) {
  const auto timeout = to_ms(o.timeout_seconds);
  // Plain-socket checks first: c10d would log lines of its own for a taken port
  // and for every attempt to reach a store that is not up yet.
  if (o.rank == 0 && os::tcp_port_in_use(o.master_port)) {
    throw Error(str(who, ": cannot host the rendezvous store on port ", o.master_port,
                    ": the port is in use (another run on this machine? choose another MASTER_PORT)"));
  }
  while (o.rank != 0 && !os::tcp_connectable(o.master_addr, o.master_port, 250)) {
    if (Clock::now() + std::chrono::milliseconds(250) >= deadline) {
      throw Error(str(who, ": cannot reach the rendezvous store at ", at, " (hosted by rank 0) within ",
                      o.timeout_seconds, " s: nothing accepts connections there (is rank 0 running, with the same "
                      "MASTER_ADDR and MASTER_PORT?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  c10::intrusive_ptr<c10d::TCPStore> store;
  for (;;) {
    try {
      c10d::TCPStoreOptions so;
      so.port = static_cast<std::uint16_t>(o.master_port);
      so.isServer = o.rank == 0;
      so.numWorkers = static_cast<std::size_t>(o.world_size);
      so.waitWorkers = false;  // step 2 waits, with a message that says who is missing
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      so.timeout = o.rank == 0 ? timeout : std::max(left, std::chrono::milliseconds(1));
      store = detail::make_tcp_store(o.master_addr, so);
      store->setTimeout(timeout);
      break;
    } catch (const std::exception& e) {
      if (o.rank == 0) {
        throw Error(str(who, ": cannot host the rendezvous store on port ", o.master_port, " and reach it at ", at,
                        " (is the port in use?): ", cause(e)));
      }
      if (Clock::now() + std::chrono::milliseconds(250) >= deadline) {
        throw Error(str(who, ": cannot reach the rendezvous store at ", at, " (hosted by rank 0) within ",
                        o.timeout_seconds, " s: ", cause(e)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));  // c10d's own retries give up early
    }
  }
  return store;
}

/// Step 2: every rank adds itself to a join counter and waits until all have.
void wait_for_ranks(c10d::Store& store, const DistOptions& o, const std::string& who, const std::string& at,
                    Clock::time_point deadline) {
  try {
    if (store.add(str("medfast/rank/", o.rank), 1) > 1) {
      throw ValueError(
          str(who, ": another process already joined the rendezvous at ", at, " as rank ", o.rank, " (check RANK)"));
    }
    std::int64_t joined = store.add("medfast/joined", 1);
    while (joined < o.world_size) {
      if (Clock::now() >= deadline) {
        throw Error(str(who, ": rendezvous at ", at, " timed out after ", o.timeout_seconds, " s: ", joined, " of ",
                        o.world_size,
                        " ranks joined (are all ranks started, with the same MASTER_ADDR, "
                        "MASTER_PORT and WORLD_SIZE?)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      joined = store.add("medfast/joined", 0);
    }
    if (joined > o.world_size) {
      throw ValueError(
          str(who, ": ", joined, " processes joined the rendezvous at ", at, " but WORLD_SIZE is ", o.world_size));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(str(who, ": rendezvous at ", at, " failed (did rank 0 exit?): ", cause(e)));
  }
}

}  // namespace

std::shared_ptr<train::Collective> init_process_group(const DistOptions& o) {
  o.validate();
  const std::string who = str("rank ", o.rank, " of ", o.world_size);
  const std::string at = str(o.master_addr, ":", o.master_port);
  const std::string backend = o.resolved_backend();
  at::Device wire(at::kCPU);
  if (backend == "nccl") {
    if (!detail::kHaveNccl) {
      throw ValueError(str(who,
                           ": dist_backend nccl: this libtorch was built without NCCL (c10d has no "
                           "ProcessGroupNCCL); use dist_backend gloo, which reduces CUDA tensors through host memory"));
    }
    if (!at::hasCUDA()) {
      throw ValueError(str(who, ": dist_backend nccl needs a CUDA device, and none is available here; "
                                "use dist_backend gloo"));
    }
    // One GPU per rank: LOCAL_RANK's, as torchrun's convention, or the one GPU a task sees
    // (the same choice as train.device cuda: core/rank_env.hpp).
    const int visible = static_cast<int>(at::getNumGPUs());
    wire = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_cuda_index(o.local_rank, visible)));
    c10::impl::VirtualGuardImpl(at::kCUDA).setDevice(wire);
  }
  const auto timeout = to_ms(o.timeout_seconds);

  // 1-2: the store and the join counter (see process_group.hpp).
  const auto deadline = Clock::now() + timeout;
  const c10::intrusive_ptr<c10d::TCPStore> store = connect_store(o, who, at, deadline);
  wait_for_ranks(*store, o, who, at, deadline);

  // 3. The backend's own connections, through the same store. With torch's
  //    TORCH_DISTRIBUTED_DEBUG=DETAIL, c10d's ProcessGroupWrapper first checks on a
  //    second (Gloo) group that every rank runs the same collective with the same
  //    shapes: ranks that diverge get an error naming both collectives, where the
  //    plain backend may hang or abort inside its transport thread.
  c10::intrusive_ptr<detail::Backend> group;
  NcclHandle nccl;
  try {
    if (backend == "nccl") {
      nccl = make_nccl(store, o);
#if MEDFAST_HAVE_C10D_NCCL
      group = nccl;
#endif
    } else {
      group = make_gloo(store, o);
    }
    const char* debug = std::getenv("TORCH_DISTRIBUTED_DEBUG");  // torch's own variable
    if (debug && std::string(debug) == "DETAIL") {
      auto checker = make_gloo(c10::make_intrusive<c10d::PrefixStore>("medfast/checks/", store), o);
      group = c10::make_intrusive<c10d::ProcessGroupWrapper>(group, checker);
    }
  } catch (const std::exception& e) {
    throw Error(str(who, ": ", backend, " process group over the rendezvous at ", at, " failed: ", cause(e)));
  }
  return std::make_shared<GroupCollective>(o, backend, wire, store, group, std::move(nccl));
}

}  // namespace medfast::dist
