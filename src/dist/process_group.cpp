#include "medfast/dist/process_group.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"

namespace medfast::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

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

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
}

/// One line of an exception's message: c10::Error's what() carries a C++ backtrace.
std::string cause(const std::exception& e) {
  std::string m;
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    m = c->what_without_backtrace();
  } else {
    m = e.what();
  }
  const auto nl = m.find('\n');
  if (nl != std::string::npos) m.resize(nl);
  while (!m.empty() && (m.back() == ' ' || m.back() == '\r')) m.pop_back();
  return m;
}

/// Rethrows the current exception as medfast::Error with `context` prepended.
[[noreturn]] void rethrow(const std::string& context) {
  try {
    throw;
  } catch (Error& e) {
    e.add_context(context);
    throw;
  } catch (const std::exception& e) {
    throw Error(context + ": " + cause(e));
  }
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

/// Gloo reduces these dtypes natively; bfloat16 travels as float (exact for
/// broadcast, more accurate for sums), bool as uint8 (broadcast only).
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

std::string describe(const at::Tensor& t) {
  return str(t.scalar_type(), t.sizes(), " on ", t.device());
}

/// The buffer Gloo reads and writes: the tensor itself when it is a contiguous CPU
/// tensor of a dtype Gloo handles, else a host copy that commit() writes back.
/// (CUDA tensors take the host route: it works whether or not this libtorch's Gloo
/// was built with CUDA.)
struct Staged {
  at::Tensor& target;
  at::Tensor buffer;
  explicit Staged(at::Tensor& t) : target(t) {
    const at::ScalarType wire = wire_dtype(t.scalar_type());
    if (t.device().is_cpu() && t.is_contiguous() && wire == t.scalar_type()) {
      buffer = t;
    } else {
      buffer = t.to(at::kCPU, wire, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
  }
  void commit() {
    if (!buffer.is_same(target)) target.copy_(buffer);
  }
};

class GlooCollective final : public train::Collective {
 public:
  GlooCollective(DistOptions options, c10::intrusive_ptr<c10d::Store> store,
                 c10::intrusive_ptr<c10d::ProcessGroup> group)
      : options_(std::move(options)), store_(std::move(store)), group_(std::move(group)) {}

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  void allreduce_sum(at::Tensor& tensor) override {
    const std::string what = "allreduce_sum";
    check(tensor, what);
    MEDFAST_CHECK_T(ValueError, tensor.scalar_type() != at::kBool, where(), ": ", what,
                    " of a bool tensor (sum it as an integer type)");
    try {
      at::NoGradGuard no_grad;
      Staged s(tensor);
      std::vector<at::Tensor> v{s.buffer};
      group_->allreduce(v)->wait();
      s.commit();
    } catch (...) {
      rethrow(str(where(), ": ", what, " of ", describe(tensor)));
    }
  }

  void broadcast(at::Tensor& tensor, int root) override {
    const std::string what = str("broadcast from rank ", root);
    check(tensor, what);
    if (root < 0 || root >= options_.world_size) {
      throw ValueError(str(where(), ": broadcast root ", root, " is outside 0..", options_.world_size - 1));
    }
    try {
      at::NoGradGuard no_grad;
      Staged s(tensor);
      std::vector<at::Tensor> v{s.buffer};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      group_->broadcast(v, o)->wait();
      s.commit();
    } catch (...) {
      rethrow(str(where(), ": ", what, " of ", describe(tensor)));
    }
  }

  /// One flat buffer per parameter dtype, in the order the parameters are given
  /// (the same model on every rank gives the same order and sizes):
  ///   [grad_0 | grad_1 | ... | grad_n-1 | has_grad_0 ... has_grad_n-1]
  /// A parameter without a gradient contributes zeros, so every rank sends the
  /// same layout and no rank waits on a collective the others skip. The trailing
  /// flags count the ranks that had a gradient: a parameter gets the mean
  /// (sum / world size, as DistributedDataParallel divides) wherever any rank had
  /// a gradient for it, and stays without one on every rank when none had.
  void allreduce_mean_gradients(const std::vector<at::Tensor>& parameters) override {
    const std::string what = str("allreduce_mean_gradients over ", parameters.size(), " parameters");
    struct Group {
      at::ScalarType dtype;
      std::vector<std::size_t> members;
      std::int64_t numel = 0;
      at::Tensor flat;
      c10::intrusive_ptr<c10d::Work> work;
    };
    std::vector<Group> groups;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      const at::Tensor& p = parameters[i];
      if (!p.defined()) throw ValueError(str(where(), ": ", what, ": parameter ", i, " is undefined"));
      const at::Tensor& g = p.grad();
      if (g.defined() && (g.is_sparse() || g.numel() != p.numel())) {
        throw ValueError(str(where(), ": ", what, ": parameter ", i, " ", describe(p), " has a gradient ", describe(g),
                             (g.is_sparse() ? " that is sparse" : " of another size")));
      }
      auto it =
          std::find_if(groups.begin(), groups.end(), [&](const Group& gr) { return gr.dtype == p.scalar_type(); });
      if (it == groups.end()) it = groups.insert(groups.end(), Group{p.scalar_type(), {}, 0, {}, {}});
      it->members.push_back(i);
      it->numel += p.numel();
    }
    try {
      at::NoGradGuard no_grad;
      for (Group& gr : groups) {
        const auto count = static_cast<std::int64_t>(gr.members.size());
        gr.flat = at::empty({gr.numel + count}, at::TensorOptions().dtype(wire_dtype(gr.dtype)));
        std::vector<float> has_grad;
        std::int64_t offset = 0;
        for (std::int64_t k = 0; k < count; ++k) {
          const at::Tensor& p = parameters[gr.members[static_cast<std::size_t>(k)]];
          const at::Tensor& g = p.grad();
          at::Tensor slot = gr.flat.narrow(0, offset, p.numel());
          if (g.defined()) {
            slot.view(g.sizes()).copy_(g);
          } else {
            slot.zero_();
          }
          has_grad.push_back(g.defined() ? 1.0F : 0.0F);
          offset += p.numel();
        }
        gr.flat.narrow(0, gr.numel, count).copy_(at::tensor(has_grad));
        std::vector<at::Tensor> v{gr.flat};
        gr.work = group_->allreduce(v);  // queued: Gloo runs them in order while we set up the next
      }
      for (Group& gr : groups) {
        gr.work->wait();
        gr.flat.narrow(0, 0, gr.numel).div_(options_.world_size);
        const at::Tensor had =
            gr.flat.narrow(0, gr.numel, static_cast<std::int64_t>(gr.members.size())).to(at::kDouble);
        const double* had_any = had.data_ptr<double>();
        std::int64_t offset = 0;
        for (std::size_t k = 0; k < gr.members.size(); ++k) {
          const at::Tensor& p = parameters[gr.members[k]];
          at::Tensor slot = gr.flat.narrow(0, offset, p.numel()).view(p.sizes());
          offset += p.numel();
          if (had_any[k] == 0) continue;  // no rank had a gradient: none gets one
          at::Tensor& g = p.mutable_grad();
          if (g.defined()) {
            g.copy_(slot);
          } else {
            g = at::empty(p.sizes(), p.options().requires_grad(false)).copy_(slot);
          }
        }
      }
    } catch (...) {
      rethrow(str(where(), ": ", what));
    }
  }

 private:
  std::string where() const {
    return str("rank ", options_.rank, " of ", options_.world_size, " (rendezvous ", options_.master_addr, ":",
               options_.master_port, ")");
  }
  void check(const at::Tensor& t, const std::string& what) const {
    if (!t.defined()) throw ValueError(str(where(), ": ", what, " of an undefined tensor"));
    if (t.is_sparse()) throw ValueError(str(where(), ": ", what, " of a sparse tensor ", describe(t)));
  }

  DistOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;  // the group uses it; rank 0's also serves the others
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const DistOptions& o) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  const std::string ifnames = env("GLOO_SOCKET_IFNAME").value_or("");
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

}  // namespace

DistOptions DistOptions::from_environment() {
  DistOptions o;
  // torchrun's variables; SLURM's when RANK is absent (srun without torchrun).
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
  if (rank && !world)
    throw ValueError(str("environment ", rank_var, "='", *rank, "' is set but ", world_var, " is not"));
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
  // How long a rank waits for its peers (rendezvous and every collective): a rank that
  // failed makes the others stop after this long.
  if (const auto t = env("MEDFAST_DIST_TIMEOUT")) {
    std::size_t used = 0;
    double v = -1;
    try {
      v = std::stod(*t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t->size() || !(v > 0) || v > 1e7) {
      throw ValueError(str("environment MEDFAST_DIST_TIMEOUT='", *t, "' is not a number of seconds in (0, 1e7]"));
    }
    o.timeout_seconds = v;
  }
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
  if (!(timeout_seconds > 0) || !(timeout_seconds <= 1e7)) {
    throw ValueError(str("dist: timeout_seconds ", timeout_seconds, " must be positive (and at most 1e7)"));
  }
  if (backend != "gloo" && backend != "nccl")
    throw ValueError(str("dist: backend '", backend, "' is not gloo or nccl"));
}

std::shared_ptr<train::Collective> init_process_group(const DistOptions& o) {
  o.validate();
  const std::string who = str("rank ", o.rank, " of ", o.world_size);
  const std::string at = str(o.master_addr, ":", o.master_port);
  if (o.backend == "nccl") {
    throw ValueError(str(who,
                         ": backend nccl: this libtorch was built without NCCL (no c10d ProcessGroupNCCL); "
                         "use backend gloo, which reduces CUDA tensors through host memory"));
  }
  const auto timeout = to_ms(o.timeout_seconds);

  // 1. The store: rank 0 hosts it. A client retries until the deadline (rank 0 may
  //    start later); c10d's own connect retries give up early on short timeouts.
  const auto deadline = Clock::now() + timeout;
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
      store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
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
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

  // 2. Wait until every rank has joined.
  try {
    if (store->add(str("medfast/rank/", o.rank), 1) > 1) {
      throw ValueError(
          str(who, ": another process already joined the rendezvous at ", at, " as rank ", o.rank, " (check RANK)"));
    }
    std::int64_t joined = store->add("medfast/joined", 1);
    while (joined < o.world_size) {
      if (Clock::now() >= deadline) {
        throw Error(str(who, ": rendezvous at ", at, " timed out after ", o.timeout_seconds, " s: ", joined, " of ",
                        o.world_size,
                        " ranks joined (are all ranks started, with the same MASTER_ADDR, "
                        "MASTER_PORT and WORLD_SIZE?)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      joined = store->add("medfast/joined", 0);
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

  // 3. Gloo's own connections, through the same store. With torch's
  //    TORCH_DISTRIBUTED_DEBUG=DETAIL, c10d's ProcessGroupWrapper first checks on a
  //    second Gloo group that every rank runs the same collective with the same
  //    shapes: ranks that diverge get an error naming both collectives, where
  //    plain Gloo may hang or abort inside its transport thread.
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    auto make = [&](const c10::intrusive_ptr<c10d::Store>& s) {
      auto go = c10d::ProcessGroupGloo::Options::create(timeout);
      go->devices = gloo_devices(o);
      go->threads = 2;
      return c10::make_intrusive<c10d::ProcessGroupGloo>(s, o.rank, o.world_size, go);
    };
    group = make(store);
    if (env("TORCH_DISTRIBUTED_DEBUG").value_or("") == "DETAIL") {
      auto checker = make(c10::make_intrusive<c10d::PrefixStore>("medfast/checks/", store));
      group = c10::make_intrusive<c10d::ProcessGroupWrapper>(group, checker);
    }
  } catch (const std::exception& e) {
    throw Error(str(who, ": Gloo process group over the rendezvous at ", at, " failed: ", cause(e)));
  }
  return std::make_shared<GlooCollective>(o, store, group);
}

}  // namespace medfast::dist
