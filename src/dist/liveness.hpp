#pragma once
/// \file
/// Internal to src/dist: the liveness of the ranks (a heartbeat through the rendezvous
/// store, failures left there by the rank that failed) and the host-side wait on c10d
/// work that uses it, so that a dead peer stops the others with its name rather than
/// after a transport timeout. Used by process_group.cpp.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "c10d_compat.hpp"
#include "medfast/core/error.hpp"
#include "medfast/dist/process_group.hpp"

namespace medfast::dist::detail {

using Clock = std::chrono::steady_clock;

/// The first line of an exception's message (c10d's carry stack traces and
/// multi-line transport details).
std::string cause(const std::exception& e);

/// Liveness of the ranks, through the rendezvous store: each rank counts up its
/// key medfast/heartbeat/<rank> every kBeat from a thread of its own, and a rank
/// that fails with an error leaves the error under medfast/failed/<rank>. After a
/// collective fails, diagnose() says which peers failed or stopped (their count
/// no longer moves), so that the survivors' message names the rank that died
/// rather than a socket that closed.
class Heartbeat {
 public:
  static constexpr std::chrono::milliseconds kBeat{500};

  /// `local_world`: ranks per node (LOCAL_WORLD_SIZE; 0 where unknown): over several
  /// nodes the messages name a peer's node too.
  Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank, int world, int local_world = 0)
      : store_(std::move(store)), rank_(rank), world_(world), local_world_(local_world), thread_([this] { run(); }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void announce_failure(const std::string& message) {
    try {
      const std::string m = message.substr(0, 2000);
      store_->set(failed_key(rank_), std::vector<std::uint8_t>(m.begin(), m.end()));
    } catch (const std::exception&) {
      // best effort: the store may be gone too
    }
  }

  /// How long a peer's count may stand still, and how many store errors in a row, before
  /// a wait gives up on it: its verdict aborts the collective, so it leaves room for a
  /// loaded machine (a slow beat thread, a store busy with other ranks).
  static constexpr std::chrono::seconds kSilence{10};
  static constexpr int kStoreFailures = 3;

  /// For a wait on the host: a function that says, each time it is called, whether a
  /// peer failed (its error) or stopped (its count has not moved for kSilence since the
  /// first call, or the store failed kStoreFailures times in a row); "" while every peer
  /// lives. Quick (no sleep), unlike diagnose().
  std::function<std::string()> watch() {
    struct Seen {
      std::vector<std::int64_t> count;
      std::vector<Clock::time_point> moved;
      int store_failures = 0;
    };
    auto seen = std::make_shared<Seen>();
    seen->count.assign(static_cast<std::size_t>(world_), -1);
    seen->moved.assign(static_cast<std::size_t>(world_), Clock::now());
    return [this, seen]() -> std::string {
      const auto now = Clock::now();
      try {
        for (int r = 0; r < world_; ++r) {
          if (r == rank_) continue;
          if (std::string failed = failure_of(r); !failed.empty()) return failed;
          const auto k = static_cast<std::size_t>(r);
          const std::int64_t c = store_->add(beat_key(r), 0);
          if (c != seen->count[k]) {
            seen->count[k] = c;
            seen->moved[k] = now;
          } else if (now - seen->moved[k] > kSilence) {
            return str(who(r), " stopped responding (no heartbeat for ",
                       std::chrono::duration<double>(now - seen->moved[k]).count(), " s: it exited or hangs)");
          }
        }
        seen->store_failures = 0;
      } catch (const std::exception& e) {
        if (++seen->store_failures >= kStoreFailures && rank_ != 0) {
          return str(who(0), ", which hosts the rendezvous store, is unreachable: it exited (", cause(e), ")");
        }
      }
      return "";
    };
  }

  /// "rank 1 failed: ...", "rank 2 stopped responding (...)"; empty if every peer is alive.
  std::string diagnose() {
    std::vector<std::string> found;
    try {
      std::vector<std::int64_t> before(static_cast<std::size_t>(world_), 0);
      std::vector<bool> reported(static_cast<std::size_t>(world_), false);
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        if (std::string failed = failure_of(r); !failed.empty()) {
          found.push_back(std::move(failed));
          reported[static_cast<std::size_t>(r)] = true;
        }
        before[static_cast<std::size_t>(r)] = store_->add(beat_key(r), 0);
      }
      std::this_thread::sleep_for(3 * kBeat);
      for (int r = 0; r < world_; ++r) {
        if (r == rank_ || reported[static_cast<std::size_t>(r)]) continue;
        if (store_->add(beat_key(r), 0) == before[static_cast<std::size_t>(r)]) {
          found.push_back(str(who(r), " stopped responding (no heartbeat for ",
                              std::chrono::duration<double>(3 * kBeat).count(), " s: it exited or hangs)"));
        }
      }
    } catch (const std::exception&) {
      if (rank_ != 0) return who(0) + ", which hosts the rendezvous store, is unreachable: it exited";
      return "";
    }
    std::string out;
    for (const auto& f : found) out += (out.empty() ? "" : "; ") + f;
    return out;
  }

 private:
  static std::string beat_key(int r) { return str("medfast/heartbeat/", r); }
  static std::string failed_key(int r) { return str("medfast/failed/", r); }
  /// "rank r failed: <its error>" where rank r left one (announce_failure), else "".
  std::string failure_of(int r) {
    if (!store_->check({failed_key(r)})) return "";
    const auto bytes = store_->get(failed_key(r));
    return str(who(r), " failed: ", std::string(bytes.begin(), bytes.end()));
  }
  /// "rank 5", or over several nodes "rank 5 (node 1)".
  std::string who(int r) const {
    if (local_world_ <= 0 || world_ <= local_world_) return str("rank ", r);
    return str("rank ", r, " (node ", r / local_world_, ")");
  }
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      try {
        store_->add(beat_key(rank_), 1);
      } catch (const std::exception&) {
        // the store's host is gone; diagnose() says so when a collective fails
      }
      lock.lock();
      cv_.wait_for(lock, kBeat, [this] { return stop_; });
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, world_, local_world_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

/// A collective that wait_until_complete gave up on: its message names the peer already.
class CollectiveAbandoned : public Error {
 public:
  using Error::Error;
};

/// Waits for c10d work on the host: wait() (Gloo blocks there and throws), then, while
/// the work still runs (NCCL: its wait() only made the current stream wait), polls it
/// with the peers' heartbeat and dist_timeout (detail::wait_until_complete), so that a
/// rank that died stops the others with its name, not after NCCL's watchdog timeout.
class Waiter {
 public:
  Waiter(Heartbeat* heartbeat, std::chrono::milliseconds timeout, std::function<void()> abort)
      : heartbeat_(heartbeat), timeout_(timeout), abort_(std::move(abort)) {}

  void operator()(const c10::intrusive_ptr<c10d::Work>& work) const {
    work->wait();
    if (!work->isCompleted()) {
      detail::CollectiveWait w;
      w.what = "waiting on the host";
      w.completed = [&work] { return work->isCompleted(); };
      if (heartbeat_) w.dead_peers = heartbeat_->watch();
      w.abort = abort_;
      w.timeout = timeout_;
      detail::wait_until_complete(w);
    }
    if (const std::exception_ptr e = work->exception()) std::rethrow_exception(e);
  }

 private:
  Heartbeat* heartbeat_;
  std::chrono::milliseconds timeout_;
  std::function<void()> abort_;
};

/// Runs f(); an error gains `what` as context and, unless it is a ValueError of
/// medfast's own checks (or names the peer already), what the heartbeat says about the peers.
template <typename F>
void guarded(const std::string& what, Heartbeat* heartbeat, F&& f) {
  try {
    f();
  } catch (const ValueError&) {
    rethrow_with_context(what);
  } catch (const CollectiveAbandoned&) {
    rethrow_with_context(what);
  } catch (...) {
    const std::string peers = heartbeat ? heartbeat->diagnose() : "";
    rethrow_with_context(peers.empty() ? what : str(what, " (", peers, ")"));
  }
}

}  // namespace medfast::dist::detail
