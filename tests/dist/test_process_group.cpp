// The dist layer: c10d (TCPStore + ProcessGroupGloo) behind train::Collective.
// Ranks are threads of this process, each with its own store client and process
// group on 127.0.0.1; the end-to-end test runs the built CLI as two processes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <signal.h>
#include <sstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/dist/process_group.hpp"
#include "medfast/train/checkpoint.hpp"
#include "medfast/train/trainer.hpp"
#include "medfast/os/net.hpp"
#include "test_util.hpp"
#include "train/tiny_run.hpp"

namespace medfast {
namespace {

using dist::DistOptions;
using dist::init_process_group;

/// A port nobody listens on right now: bind port 0 and let the kernel choose.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind/getsockname failed");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

DistOptions local_options(int rank, int world, int port, double timeout = 30) {
  DistOptions o;
  o.rank = rank;
  o.world_size = world;
  o.local_rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.timeout_seconds = timeout;
  return o;
}

/// Runs body(rank, collective) on `world` threads, one rank each; every rank's
/// exception becomes a test failure naming the rank.
void run_ranks(int world, const std::function<void(int, train::Collective&)>& body,
               std::uint64_t bucket_bytes = kDefaultDistBucketBytes) {
  const int port = free_port();
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        DistOptions o = local_options(r, world, port);
        o.bucket_bytes = bucket_bytes;
        const auto c = init_process_group(o);
        EXPECT_EQ(c->rank(), r);
        EXPECT_EQ(c->world_size(), world);
        body(r, *c);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
}

void expect_equal(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  EXPECT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  EXPECT_TRUE(at::allclose(actual.to(at::kDouble), expected.to(at::kDouble), 1e-6, 1e-6))
      << what << ": " << actual << " vs " << expected;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllreduceSumGivesTheSum) {
  const int world = GetParam();
  const double rank_sum = world * (world - 1) / 2.0;  // 0 + 1 + ... + world-1
  run_ranks(world, [&](int r, train::Collective& c) {
    at::Tensor d = at::arange(6, at::kDouble) * (r + 1);
    c.allreduce_sum(d);
    expect_equal(d, at::arange(6, at::kDouble) * (rank_sum + world), "double");

    at::Tensor l = at::tensor(std::vector<std::int64_t>{r, 10 * r + 1}, at::kLong);
    c.allreduce_sum(l);
    expect_equal(l,
                 at::tensor(std::vector<std::int64_t>{static_cast<std::int64_t>(rank_sum),
                                                      static_cast<std::int64_t>(10 * rank_sum + world)},
                            at::kLong),
                 "int64");

    // Not contiguous: reduced through a staging copy and written back in place.
    at::Tensor base = at::arange(12, at::kFloat).view({3, 4});
    at::Tensor t = (base * (r + 1)).t();
    ASSERT_FALSE(t.is_contiguous());
    const void* storage = t.data_ptr();
    c.allreduce_sum(t);
    EXPECT_EQ(t.data_ptr(), storage);
    expect_equal(t, (base * (rank_sum + world)).t(), "float, transposed");

    at::Tensor bf = at::full({5}, r + 1, at::kBFloat16);
    c.allreduce_sum(bf);
    expect_equal(bf, at::full({5}, rank_sum + world, at::kBFloat16), "bfloat16");

    // The trainer's metric reduction: an empty rank sends zeros of the same shape.
    at::Tensor sums = r == 0 ? at::tensor({0.5, 0.25}, at::kDouble) : at::zeros({2}, at::kDouble);
    c.allreduce_sum(sums);
    expect_equal(sums, at::tensor({0.5, 0.25}, at::kDouble), "metric sums");
  });
}

TEST_P(Collectives, AllreduceMeanGradientsAveragesMixedShapesAndDtypes) {
  const int world = GetParam();
  const double mean_rank = (world - 1) / 2.0;
  run_ranks(world, [&](int r, train::Collective& c) {
    auto param = [](at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
      return at::zeros(shape, dtype).requires_grad_();
    };
    std::vector<at::Tensor> ps{param({3, 4}), param({7}), param({2, 3, 5}), param({4}, at::kDouble),
                               param({2, 2}), param({3}), param({})};
    const at::Tensor base0 = at::arange(12, at::kFloat).view({3, 4});
    ps[0].mutable_grad() = base0 + r;
    ps[1].mutable_grad() = at::arange(7, at::kFloat) * (r + 1);
    ps[2].mutable_grad() = (at::ones({5, 3, 2}) * (2 * r)).permute({2, 1, 0});  // not contiguous
    ps[3].mutable_grad() = at::full({4}, r, at::kDouble);
    if (r == 0) ps[4].mutable_grad() = at::full({2, 2}, 6.0);  // only rank 0 has this gradient
    // ps[5]: no rank has a gradient.
    ps[6].mutable_grad() = at::full({}, static_cast<float>(r));
    const void* g0 = ps[0].grad().data_ptr();
    ASSERT_FALSE(ps[2].grad().is_contiguous());

    c.allreduce_mean_gradients(ps);

    EXPECT_EQ(ps[0].grad().data_ptr(), g0) << "a gradient is updated in place";
    expect_equal(ps[0].grad(), base0 + mean_rank, "[3,4]");
    expect_equal(ps[1].grad(), at::arange(7, at::kFloat) * (mean_rank + 1), "[7]");
    expect_equal(ps[2].grad(), at::ones({2, 3, 5}) * (2 * mean_rank), "[2,3,5] permuted");
    expect_equal(ps[3].grad(), at::full({4}, mean_rank, at::kDouble), "double [4]");
    expect_equal(ps[4].grad(), at::full({2, 2}, 6.0 / world), "gradient only on rank 0");
    EXPECT_FALSE(ps[5].grad().defined()) << "no rank had a gradient: none gets one";
    expect_equal(ps[6].grad(), at::full({}, static_cast<float>(mean_rank)), "scalar");

    // Many small parameters (one coalesced buffer, however many there are).
    std::vector<at::Tensor> many;
    for (int i = 0; i < 300; ++i) {
      many.push_back(param({i % 5 + 1}));
      many.back().mutable_grad() = at::full({i % 5 + 1}, static_cast<float>(i + r));
    }
    c.allreduce_mean_gradients(many);
    for (int i = 0; i < 300; ++i) {
      expect_equal(many[static_cast<std::size_t>(i)].grad(), at::full({i % 5 + 1}, static_cast<float>(i + mean_rank)),
                   "many");
    }
  });
}

TEST_P(Collectives, GradientsAreAveragedInBucketsThatStartDuringBackward) {
  const int world = GetParam();
  // A small network whose parameters (about 5 KB) fill several 1 KiB buckets.
  // Ranks are threads sharing torch's global generator: seed and initialise one network at a time.
  static std::mutex init;
  auto make = [] {
    std::lock_guard<std::mutex> lock(init);
    torch::manual_seed(7);
    return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 16),
                                 torch::nn::ReLU(), torch::nn::Linear(16, 4));
  };
  // What every rank's gradient must become: the mean of the ranks' own gradients.
  std::vector<std::vector<at::Tensor>> own(static_cast<std::size_t>(world));
  auto input = [](int r) { return at::arange(24, at::kFloat).view({3, 8}).sin() * (r + 1); };
  for (int r = 0; r < world; ++r) {
    auto net = make();
    net->forward(input(r)).pow(2).sum().backward();
    for (const auto& p : net->parameters()) own[static_cast<std::size_t>(r)].push_back(p.grad().clone());
  }
  run_ranks(
      world,
      [&](int r, train::Collective& c) {
        auto net = make();
        std::vector<at::Tensor> params = net->parameters();
        const auto sync = c.gradient_sync(params);
        EXPECT_GT(sync->buckets(), 2);
        for (int step = 0; step < 2; ++step) {  // the hooks serve every step
          for (auto& p : params) p.mutable_grad() = at::Tensor();
          sync->prepare();
          net->forward(input(r)).pow(2).sum().backward();
          sync->finish();
          EXPECT_EQ(sync->buckets_started_in_backward(), sync->buckets()) << "every bucket started before backward ended";
          for (std::size_t i = 0; i < params.size(); ++i) {
            at::Tensor want = at::zeros_like(own[0][i]);
            for (int q = 0; q < world; ++q) want += own[static_cast<std::size_t>(q)][i];
            expect_equal(params[i].grad(), want / world, str("parameter ", i, ", step ", step));
          }
        }
        // A parameter rank 0 does not use: its bucket starts in finish(), the others' share is
        // averaged over every rank (rank 0 counts as zero), as DistributedDataParallel does.
        at::Tensor extra = at::ones({3}).requires_grad_();
        std::vector<at::Tensor> with_extra = params;
        with_extra.push_back(extra);
        const auto sync2 = c.gradient_sync(with_extra);
        for (auto& p : with_extra) p.mutable_grad() = at::Tensor();
        sync2->prepare();
        at::Tensor loss = net->forward(input(r)).pow(2).sum();
        if (r != 0) loss = loss + (extra * 2).sum();
        loss.backward();
        sync2->finish();
        if (r == 0) EXPECT_LT(sync2->buckets_started_in_backward(), sync2->buckets());
        expect_equal(extra.grad(), at::full({3}, 2.0 * (world - 1) / world), "used on all ranks but 0");
      },
      /*bucket_bytes=*/1024);
}

TEST_P(Collectives, BroadcastCoalescedGivesTheRootsValuesForEveryDtype) {
  const int world = GetParam();
  run_ranks(world, [&](int r, train::Collective& c) {
    std::vector<at::Tensor> ts{at::full({2, 3}, r + 0.5), at::full({4}, r, at::kLong), at::full({}, r * 2.0, at::kDouble),
                               (at::arange(6, at::kFloat).view({2, 3}) + r).t(), at::full({5}, r + 1.0)};
    const int root = world - 1;
    c.broadcast_coalesced(ts, root);
    expect_equal(ts[0], at::full({2, 3}, root + 0.5), "float");
    expect_equal(ts[1], at::full({4}, root, at::kLong), "int64");
    expect_equal(ts[2], at::full({}, root * 2.0, at::kDouble), "double scalar");
    expect_equal(ts[3], (at::arange(6, at::kFloat).view({2, 3}) + root).t(), "transposed view, written in place");
    expect_equal(ts[4], at::full({5}, root + 1.0), "second float");
    EXPECT_STREQ(c.backend(), "gloo");
  });
}

TEST_P(Collectives, BroadcastGivesTheRootsValues) {
  const int world = GetParam();
  run_ranks(world, [&](int r, train::Collective& c) {
    for (const int root : {0, world - 1}) {
      at::Tensor t = at::full({2, 3}, r * 10.0 + 1);
      c.broadcast(t, root);
      expect_equal(t, at::full({2, 3}, root * 10.0 + 1), "float");

      at::Tensor nc = (at::arange(6, at::kLong).view({2, 3}) + r).t();
      c.broadcast(nc, root);
      expect_equal(nc, (at::arange(6, at::kLong).view({2, 3}) + root).t(), "int64 transposed");

      at::Tensor b = at::full({3}, r == root, at::kBool);
      c.broadcast(b, root);
      EXPECT_TRUE(b.all().item<bool>()) << "bool from root " << root;
    }
    // As the trainer does with parameters: a leaf that requires grad, under NoGradGuard.
    at::Tensor p = at::full({4}, r + 0.5).requires_grad_();
    {
      at::NoGradGuard no_grad;
      c.broadcast(p, 0);
    }
    EXPECT_TRUE(p.requires_grad());
    expect_equal(p.detach(), at::full({4}, 0.5), "parameter");

    at::Tensor x = at::zeros({1});
    const std::string m = test::value_error_of([&] { c.broadcast(x, world); });
    EXPECT_TRUE(contains(m, "root")) << "root " << world << ": " << m;
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

// ---------------------------------------------------------------------------
// Failures: a clear error within the timeout, never a hang.
// ---------------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(Rendezvous, MissingPeerFailsWithinTheTimeout) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  // Without rank 1.
  const std::string m = test::error_of<Error>([&] { init_process_group(local_options(0, 2, port, 1.5)); });
  RecordProperty("message", m);
  EXPECT_TRUE(test::contains_all(m, {"rank 0 of 2", "127.0.0.1:" + std::to_string(port), "1 of 2 ranks joined"}));
  EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(Rendezvous, StartOrderDoesNotMatter) {
  // torchrun starts ranks in any order: a client waits for the store's host.
  const int port = free_port();
  std::string error;
  std::thread late_host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    try {
      auto c = init_process_group(local_options(0, 2, port, 20));
      at::Tensor t = at::ones({3});
      c->allreduce_sum(t);
      EXPECT_TRUE(at::equal(t, at::full({3}, 2.0)));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank 0: " << e.what();
    }
  });
  try {
    auto c = init_process_group(local_options(1, 2, port, 20));
    at::Tensor t = at::ones({3});
    c->allreduce_sum(t);
    EXPECT_TRUE(at::equal(t, at::full({3}, 2.0)));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 1: " << e.what();
  }
  late_host.join();
}

TEST(Rendezvous, MissingHostFailsWithinTheTimeout) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  // Without rank 0, the store's host.
  const std::string m = test::error_of<Error>([&] { init_process_group(local_options(1, 2, port, 1.5)); });
  RecordProperty("message", m);
  EXPECT_TRUE(test::contains_all(m, {"rank 1 of 2", "127.0.0.1:" + std::to_string(port), "rendezvous store"}));
  EXPECT_GT(seconds_since(start), 1.0) << "gave up before the timeout";
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(Rendezvous, PortInUseOnRankZeroIsReported) {
  const int port = free_port();
  // Hold the port with a listening socket.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  // Hosting the store on the taken port fails.
  const std::string m = test::error_of<Error>([&] { init_process_group(local_options(0, 2, port, 1.5)); });
  RecordProperty("message", m);
  EXPECT_TRUE(test::contains_all(m, {"rank 0 of 2", std::to_string(port)}));
  ::close(fd);
}

TEST(Rendezvous, APeerThatLeavesMakesCollectivesFailWithContext) {
  const int port = free_port();
  std::thread leaver([&] {
    try {
      auto c = init_process_group(local_options(1, 2, port, 5));
      // Leaves (destroys its process group) without taking part in the collective.
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank 1: " << e.what();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string error = test::error_of<Error>([&] {
    auto c = init_process_group(local_options(0, 2, port, 5));
    leaver.join();
    at::Tensor t = at::ones({1000});
    c->allreduce_sum(t);  // without the peer
  });
  RecordProperty("message", error);
  if (leaver.joinable()) leaver.join();
  EXPECT_TRUE(contains(error, "rank 0 of 2")) << error;
  EXPECT_TRUE(contains(error, "allreduce_sum")) << error;
  EXPECT_TRUE(contains(error, "rank 1 stopped responding")) << "the message names the rank that died: " << error;
  EXPECT_LT(seconds_since(start), 30.0);
}

// A rank that fails with an error leaves it for its peers: their message names it.
TEST(Rendezvous, APeerThatFailsIsNamedWithItsError) {
  const int port = free_port();
  std::thread failing([&] {
    try {
      auto c = init_process_group(local_options(1, 2, port, 5));
      c->announce_failure("rank 1: CUDA out of memory (simulated)");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank 1: " << e.what();
    }
  });
  const std::string error = test::error_of<Error>([&] {
    auto c = init_process_group(local_options(0, 2, port, 5));
    failing.join();
    at::Tensor t = at::ones({1000});
    c->allreduce_sum(t);  // without the peer
  });
  if (failing.joinable()) failing.join();
  EXPECT_TRUE(contains(error, "rank 1 failed: rank 1: CUDA out of memory (simulated)")) << error;
}


TEST(Rendezvous, DivergingCollectivesAreReportedUnderDebugDetail) {
  const char* old = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  const int port = free_port();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto c = init_process_group(local_options(r, 2, port, 10));
        at::Tensor same = at::ones({2});
        c->allreduce_sum(same);  // agrees
        EXPECT_TRUE(at::equal(same, at::full({2}, 2.0)));
        at::Tensor t = at::ones({r == 0 ? 3 : 5});  // diverges
        c->allreduce_sum(t);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  if (saved) {
    ::setenv("TORCH_DISTRIBUTED_DEBUG", saved->c_str(), 1);
  } else {
    ::unsetenv("TORCH_DISTRIBUTED_DEBUG");
  }
  for (int r = 0; r < 2; ++r) {
    const std::string& m = errors[static_cast<std::size_t>(r)];
    RecordProperty("message" + std::to_string(r), m);
    EXPECT_TRUE(contains(m, "rank " + std::to_string(r) + " of 2")) << m;
    EXPECT_TRUE(contains(m, "allreduce_sum")) << m;
    EXPECT_TRUE(contains(m, "mismatch")) << m;
  }
}

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

/// Unsets the variables DistOptions reads and restores them at the end of the test.
class DistEnv {
 public:
  DistEnv() {
    for (const char* n : kNames) {
      if (const char* v = std::getenv(n)) saved_[n] = v;
      ::unsetenv(n);
    }
  }
  ~DistEnv() {
    for (const char* n : kNames) {
      const auto it = saved_.find(n);
      if (it == saved_.end()) {
        ::unsetenv(n);
      } else {
        ::setenv(n, it->second.c_str(), 1);
      }
    }
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  void unset(const char* name) { ::unsetenv(name); }
  void clear() {
    for (const char* n : kNames) ::unsetenv(n);
  }

 private:
  static constexpr const char* kNames[] = {"RANK",        "WORLD_SIZE",   "LOCAL_RANK",   "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                           "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                           "MEDFAST_DIST_TIMEOUT", "MEDFAST_DIST_BACKEND",
                                           "MEDFAST_DIST_BUCKET_BYTES"};
  std::map<std::string, std::string> saved_;
};

/// DistOptions as `medfast train` builds them: the rank environment and the settings
/// (defaults overridden by MEDFAST_DIST_* variables).
DistOptions from_env() {
  Settings s;
  s.load_env();
  return DistOptions::from(s);
}

// Review finding 5: NCCL's wait() only makes the stream wait, so the host polls the
// collective with the peers' heartbeat. The polling, on the CPU, with a fake collective.
TEST(CollectiveWait, ReturnsOnceTheCollectiveCompletesWithoutSpinningACore) {
  int polls = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(60);
  dist::detail::CollectiveWait w;
  w.what = "allreduce";
  w.completed = [&] {
    ++polls;
    return std::chrono::steady_clock::now() >= until;
  };
  int checks = 0;
  w.dead_peers = [&] {
    ++checks;
    return std::string();
  };
  w.timeout = std::chrono::seconds(30);
  dist::detail::wait_until_complete(w);
  EXPECT_GE(std::chrono::steady_clock::now(), until);
  // Naps of 20 us doubling to 1 ms: about 60 polls in 60 ms (a spinning loop makes millions).
  EXPECT_LT(polls, 1000);
  EXPECT_GT(polls, 5);
  EXPECT_EQ(checks, 0);  // the peers are asked every 0.5 s
}

TEST(CollectiveWait, ADeadPeerAbortsTheCollectiveAndIsNamed) {
  bool aborted = false;
  dist::detail::CollectiveWait w;
  w.what = "waiting on the host";
  w.completed = [&] { return aborted; };  // as NCCL: the abort ends the kernel
  int checks = 0;
  w.dead_peers = [&] { return ++checks < 2 ? std::string() : std::string("rank 1 stopped responding"); };
  w.abort = [&] { aborted = true; };
  w.timeout = std::chrono::seconds(30);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = test::error_of<Error>([&] { dist::detail::wait_until_complete(w); });
  EXPECT_TRUE(aborted);
  EXPECT_EQ(m, "waiting on the host: rank 1 stopped responding");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));  // not the 30 s timeout
}

TEST(CollectiveWait, TheTimeoutAbortsWhenEveryPeerStillBeats) {
  int aborts = 0;
  dist::detail::CollectiveWait w;
  w.completed = [] { return false; };
  w.dead_peers = [] { return std::string(); };
  w.abort = [&] {
    ++aborts;
    throw std::runtime_error("ncclCommAbort failed");
  };
  w.timeout = std::chrono::milliseconds(50);
  const std::string m = test::error_of<Error>([&] { dist::detail::wait_until_complete(w); });
  EXPECT_EQ(aborts, 1);
  EXPECT_TRUE(contains(m, "did not complete within 0.05 s (dist_timeout)")) << m;
  EXPECT_TRUE(contains(m, "aborting the collective failed too: ncclCommAbort failed")) << m;
}

// One rank over NCCL on the GPU (the lent machines have one): its collectives reach the
// host's wait (finding 5: NCCL's wait() alone does not block), the gradient buckets
// average, and the group is shut down when the collective goes (no hang, no warning).
TEST(DistGpu, OneRankNcclCollectivesCompleteAndShutDown) {
  MEDFAST_REQUIRE_CUDA();
  if (!dist::nccl_available()) GTEST_SKIP() << "this libtorch has no NCCL (c10d's ProcessGroupNCCL)";
  DistOptions o = local_options(0, 1, free_port());
  o.backend = "nccl";
  o.cuda = true;
  {
    const auto c = init_process_group(o);
    EXPECT_STREQ(c->backend(), "nccl");
    at::Tensor t = at::arange(6, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    c->allreduce_sum(t);
    expect_equal(t.cpu(), at::arange(6, at::kFloat), "allreduce_sum");
    at::Tensor host = at::tensor({1.5, 2.5}, at::kDouble);  // a CPU tensor travels to the GPU and back
    c->broadcast(host, 0);
    expect_equal(host, at::tensor({1.5, 2.5}, at::kDouble), "broadcast of a CPU tensor");
    at::Tensor p = at::ones({4}, at::TensorOptions().device(at::kCUDA)).requires_grad_(true);
    (p * 3).sum().backward();
    c->allreduce_mean_gradients({p});
    expect_equal(p.grad().cpu(), at::full({4}, 3.0f), "mean gradient");
  }
}

TEST(DistOptions, FromEnvironmentReadsTorchrunAndSlurm) {
  DistEnv env;
  DistOptions o = from_env();
  EXPECT_EQ(o.world_size, 1);
  EXPECT_EQ(o.rank, 0);
  EXPECT_FALSE(o.enabled());
  EXPECT_EQ(o.master_addr, DistOptions{}.master_addr);
  EXPECT_EQ(o.master_port, DistOptions{}.master_port);

  env.set("RANK", "2");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "0");
  env.set("MASTER_ADDR", "node7");
  env.set("MASTER_PORT", "12345");
  o = from_env();
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.master_addr, "node7");
  EXPECT_EQ(o.master_port, 12345);
  EXPECT_TRUE(o.enabled());
  EXPECT_NO_THROW(o.validate());

  // SLURM's variables count only when RANK is absent.
  env.set("SLURM_PROCID", "5");
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_LOCALID", "1");
  EXPECT_EQ(from_env().rank, 2);
  env.unset("RANK");
  env.unset("WORLD_SIZE");
  env.unset("LOCAL_RANK");
  o = from_env();
  EXPECT_EQ(o.rank, 5);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.local_rank, 1);

  env.set("MEDFAST_DIST_TIMEOUT", "42.5");
  EXPECT_DOUBLE_EQ(from_env().timeout_seconds, 42.5);
  env.unset("MEDFAST_DIST_TIMEOUT");
  EXPECT_DOUBLE_EQ(from_env().timeout_seconds, kDefaultDistTimeoutSeconds);

  // The dist_* settings, and what auto stands for.
  EXPECT_EQ(from_env().backend, "auto");
  EXPECT_EQ(from_env().bucket_bytes, kDefaultDistBucketBytes);
  EXPECT_EQ(from_env().resolved_backend(), "gloo") << "CPU training reduces through Gloo";
  DistOptions cuda = from_env();
  cuda.cuda = true;
  EXPECT_EQ(cuda.resolved_backend(), dist::nccl_available() ? "nccl" : "gloo");
  env.set("MEDFAST_DIST_BACKEND", "nccl");
  env.set("MEDFAST_DIST_BUCKET_BYTES", "4MiB");
  EXPECT_EQ(from_env().backend, "nccl");
  EXPECT_EQ(from_env().resolved_backend(), "nccl");
  EXPECT_EQ(from_env().bucket_bytes, 4u << 20);
  env.unset("MEDFAST_DIST_BACKEND");
  env.unset("MEDFAST_DIST_BUCKET_BYTES");

  // A single process under torchrun.
  env.clear();
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");
  EXPECT_FALSE(from_env().enabled());
}

// Which GPU a rank takes (issue 21, review finding 7): LOCAL_RANK's where the process sees
// the node's GPUs, its only one where each task sees one (CUDA_VISIBLE_DEVICES per task,
// SLURM --gpus-per-task), never an "invalid device ordinal"; an explicit cuda:N that would
// put several ranks of a node on one GPU is refused. Device counts are injected: the logic
// runs without a GPU.
TEST(DistOptions, EachRankTakesItsOwnGpu) {
  EXPECT_EQ(local_cuda_index(0, 4), 0);
  EXPECT_EQ(local_cuda_index(3, 4), 3);
  EXPECT_EQ(local_cuda_index(3, 1), 0);  // a task that sees one GPU: its own
  EXPECT_EQ(local_cuda_index(0, 1), 0);
  const std::string m = test::error_of<ValueError>([&] { local_cuda_index(5, 4); });
  EXPECT_TRUE(contains(m, "LOCAL_RANK 5 has no GPU")) << m;
  EXPECT_TRUE(contains(m, "sees 4 CUDA devices")) << m;
  const std::string m2 = test::error_of<ValueError>([&] { local_cuda_index(0, 0); });
  EXPECT_TRUE(contains(m2, "sees no CUDA device")) << m2;
  const std::string m3 = test::error_of<ValueError>([&] { check_explicit_cuda_index("cuda:0", 4, 4); });
  EXPECT_TRUE(contains(m3, "train.device cuda:0")) << m3;
  EXPECT_TRUE(contains(m3, "LOCAL_WORLD_SIZE")) << m3;
  EXPECT_NO_THROW(check_explicit_cuda_index("cuda:0", 4, 1));  // each rank sees its own GPU 0
  EXPECT_NO_THROW(check_explicit_cuda_index("cuda:1", 1, 4));  // one rank on this node
  EXPECT_NO_THROW(check_explicit_cuda_index("cuda:1", 0, 4));  // unknown: not refused
  EXPECT_NO_THROW(check_explicit_cuda_index("cuda", 4, 4));
  EXPECT_NO_THROW(check_explicit_cuda_index("cpu", 4, 4));

  DistEnv env;
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "2");
  EXPECT_EQ(from_env().local_world_size, 2);
  env.set("LOCAL_WORLD_SIZE", "1");
  const std::string m4 = test::error_of<ValueError>([&] { from_env(); });
  EXPECT_TRUE(contains(m4, "LOCAL_RANK='1' is not below LOCAL_WORLD_SIZE=1")) << m4;
}

TEST(DistOptions, FromEnvironmentNamesTheBadVariableAndValue) {
  DistEnv env;
  auto expect_error = [&](const std::map<std::string, std::string>& vars, const std::vector<std::string>& want) {
    env.clear();
    for (const auto& [k, v] : vars) env.set(k.c_str(), v);
    EXPECT_TRUE(test::contains_all(test::value_error_of([] { from_env(); }), want));
  };
  expect_error({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, {"RANK", "abc"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2x"}}, {"WORLD_SIZE", "2x"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE", "'0'"});
  expect_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, {"RANK", "-1"});
  expect_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {"RANK", "'2'", "WORLD_SIZE"});
  expect_error({{"RANK", "1"}}, {"RANK", "WORLD_SIZE", "is not"});
  expect_error({{"WORLD_SIZE", "2"}}, {"WORLD_SIZE", "RANK"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "one"}}, {"LOCAL_RANK", "one"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, {"MASTER_PORT", "70000"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "port"}}, {"MASTER_PORT", "port"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}}, {"MASTER_ADDR"});
  expect_error({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}, {"SLURM_PROCID", "'x'"});
  expect_error({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}}, {"SLURM_PROCID", "SLURM_NTASKS"});
  expect_error({{"RANK", "99999999999"}, {"WORLD_SIZE", "2"}}, {"RANK", "99999999999"});
  expect_error({{"MEDFAST_DIST_TIMEOUT", "soon"}}, {"MEDFAST_DIST_TIMEOUT", "soon", "dist_timeout"});
  expect_error({{"MEDFAST_DIST_TIMEOUT", "0"}}, {"MEDFAST_DIST_TIMEOUT", "'0'"});
  expect_error({{"MEDFAST_DIST_TIMEOUT", "1e9"}}, {"MEDFAST_DIST_TIMEOUT", "1e9"});
  expect_error({{"MEDFAST_DIST_BACKEND", "mpi"}}, {"MEDFAST_DIST_BACKEND", "'mpi'", "gloo", "nccl"});
}

TEST(DistOptions, ValidateNamesTheFieldAndValue) {
  auto expect_error = [](DistOptions o, const std::string& want) {
    const std::string m = test::value_error_of([&] { o.validate(); });
    EXPECT_TRUE(contains(m, want)) << m;
  };
  DistOptions o;
  EXPECT_NO_THROW(o.validate());
  o.world_size = 0;
  expect_error(o, "world_size 0");
  o = DistOptions{};
  o.world_size = 2;
  o.rank = 2;
  expect_error(o, "rank 2");
  o.rank = 0;
  o.master_port = 0;
  expect_error(o, "master_port 0");
  o.master_port = 29500;
  o.timeout_seconds = 0;
  expect_error(o, "timeout_seconds 0");
  o.timeout_seconds = 10;
  o.backend = "mpi";
  expect_error(o, "backend 'mpi'");
  o.backend = "auto";
  o.bucket_bytes = 0;
  expect_error(o, "bucket_bytes 0");
  o.bucket_bytes = kDefaultDistBucketBytes;
  o.backend = "nccl";
  EXPECT_NO_THROW(o.validate());
  if (!dist::nccl_available()) {  // a clear error where libtorch has no NCCL or no GPU is present
    EXPECT_TRUE(test::contains_all(test::value_error_of([&] { init_process_group(o); }), {"nccl", "gloo"}));
  }
  o.backend = "gloo";
  o.master_addr = "";
  expect_error(o, "master_addr");
}

// ---------------------------------------------------------------------------
// End to end: `medfast train` as two processes.
// ---------------------------------------------------------------------------

/// The trainer tests' tiny run (train/tiny_run.hpp) for two ranks: `cases` volumes of
/// 40x40x12, batch 1, batch norm. data.synth writes the dataset: rank 0 builds its trainer
/// (and the dataset) before the other ranks build theirs.
nlohmann::json tiny_ddp_config(const test::TempDir& dir, int cases) {
  nlohmann::json c = train::test_run::unprepared_tiny_config(dir);
  c["data"]["synth"]["cases"] = cases;
  c["data"]["synth"]["size"] = "40,40,12";
  // Batch 1 over 5 items: an uneven split unless each rank's share is padded to
  // the same length (ranks running different step counts would deadlock Gloo).
  c["data"]["loader"]["batch_size"] = 1;
  c["model"]["norm"] = "batch";  // BatchNorm buffers: rank 0's are broadcast every step
  return c;
}

TEST(DistCli, TwoRanksTrainAndOnlyRankZeroReports) {
  test::TempDir dir;
  const int cases = 6, validation = 1;
  const nlohmann::json c = tiny_ddp_config(dir, cases);
  test::write_file(dir / "run.json", c.dump(2));

  const int world = 2, port = free_port();
  std::string script;
  for (int r = 0; r < world; ++r) {
    script += "(RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(world) +
              " LOCAL_RANK=" + std::to_string(r) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
              " MEDFAST_THREADS=1 timeout 300 '" + test::medfast_binary() + "' train --config '" + (dir / "run.json") +
              "' --set train.epochs=1 --set train.threads=1 --set data.loader.threads=1 --set train.run_dir='" +
              (dir / "run") + "' >'" + (dir / ("out" + std::to_string(r))) + "' 2>'" +
              (dir / ("err" + std::to_string(r))) + "'; echo $? >'" + (dir / ("rc" + std::to_string(r))) + "') & ";
  }
  script += "wait";
  test::run(script);

  for (int r = 0; r < world; ++r) {
    const std::string rc = test::read_file(dir / ("rc" + std::to_string(r)));
    EXPECT_EQ(rc, "0\n") << "rank " << r << " exit code " << rc << "; stderr:\n"
                         << test::read_file(dir / ("err" + std::to_string(r))) << "\nstdout:\n"
                         << test::read_file(dir / ("out" + std::to_string(r)));
  }
  const std::string out0 = test::read_file(dir / "out0"), out1 = test::read_file(dir / "out1");
  EXPECT_TRUE(contains(out0, "epoch 1/1")) << out0;
  EXPECT_EQ(out1, "") << "rank 1 printed on stdout";
  EXPECT_TRUE(test::read_file(dir / "run/last.ckpt").size() > 0);
  EXPECT_TRUE(contains(test::read_file(dir / "run/config.json"), "\"train\""));

  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  ASSERT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1) << jsonl;
  const auto rec = nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n')));
  EXPECT_EQ(rec["epoch"], 1);
  EXPECT_TRUE(rec["loss"].is_number() && std::isfinite(rec["loss"].get<double>())) << rec;
  EXPECT_TRUE(rec["dice"].is_number()) << rec;
  // DistributedSampler: the training items padded to a multiple of the world size,
  // each rank takes 1/world of them, in batches of data.loader.batch_size.
  const int items = cases - validation;
  const int batch = c["data"]["loader"]["batch_size"].get<int>();
  const int per_rank = (items + world - 1) / world;
  const bool drop_last = c["data"]["loader"].value("drop_last", false);
  const int steps = drop_last ? per_rank / batch : (per_rank + batch - 1) / batch;
  EXPECT_EQ(rec["steps"].get<int>(), steps)
      << "items " << items << ", world " << world << ", batch " << batch << ": " << rec;
}

// A lone rank: one line from medfast on stderr, none from c10d.
TEST(DistCli, ALoneRankSaysOneClearLine) {
  test::TempDir dir;
  test::write_file(dir / "run.json", tiny_ddp_config(dir, 4).dump(2));
  for (const int rank : {0, 1}) {
    const auto r = test::run("RANK=" + std::to_string(rank) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                             std::to_string(free_port()) + " MEDFAST_DIST_TIMEOUT=2 '" + test::medfast_binary() +
                             "' train --config '" + (dir / "run.json") + "'");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "rank " << rank << ":\n" << r.err;
    EXPECT_EQ(r.err.rfind("medfast: error: rank " + std::to_string(rank) + " of 2", 0), 0u) << r.err;
  }
}

// ---------------------------------------------------------------------------
// medfast launch
// ---------------------------------------------------------------------------

std::string launch(const std::string& args) { return "'" + test::medfast_binary() + "' " + args; }

TEST(Launch, TwoRanksTrainThroughTheLauncher) {
  test::TempDir dir;
  test::write_file(dir / "run.json", tiny_ddp_config(dir, 6).dump(2));
  const auto r = test::run(launch("--threads 1 launch --nproc 2 -- train --config '" + (dir / "run.json") +
                                  "' --set train.epochs=1 --set data.loader.threads=1 --set train.run_dir='" +
                                  (dir / "run") + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n') > 0, true);
  const auto first = r.out.find("epoch 1/1");
  EXPECT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("epoch 1/1", first + 1), std::string::npos) << "only rank 0 reports: " << r.out;
  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1) << jsonl;
}

// The brain-tumour recipe as MONAI's guide runs it (brats_training_ddp.py: each rank caching
// only its share of the items), on the CPU with Gloo: examples/brats.yaml with the file's own CPU
// overrides, on a Task01-shaped synthetic set, through the launcher. Rank 0 preprocesses its
// half of the training items and no more, both ranks take the same steps, and the regions are
// reported by their names.
TEST(Launch, TheBrainTumourRecipeTrainsOnTwoRanksEachCachingItsShare) {
  test::TempDir dir;
  const auto synth = test::run(launch("data synth --kind brats --out '" + (dir / "brats") +
                                      "' --cases 6 --size 32,32,24 --seed 2"));
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  const std::string sets =
      " --set data.dataset='" + (dir / "brats/dataset.json") + "' --set data.validation.num=2" +
      " --set data.cache.kind=memory --set data.random.0.roi_size=[16,16,16]" +
      " --set validation.sliding_window.roi_size=[32,32,24] --set validation.interval=1" +
      " --set model.init_filters=8 --set optimizer.lr=0.001 --set data.loader.batch_size=1" +
      " --set data.loader.threads=1 --set train.device=cpu --set train.amp=false --set train.epochs=1" +
      " --set train.run_dir='" + (dir / "run") + "'";
  const auto r = test::run(launch("--threads 1 --dist-backend gloo launch --nproc 2 -- train --config '" +
                                  test::source_dir() + "/examples/brats.yaml'" + sets));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  // 4 training items over 2 ranks: rank 0 (the one that prints) caches 2 of them.
  EXPECT_TRUE(contains(r.out, "training items: 2 (2 preprocessed, 0 from the cache")) << r.out;
  EXPECT_TRUE(contains(r.out, "[TC ")) << r.out;
  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  ASSERT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1) << jsonl;
  const auto rec = nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n')));
  EXPECT_EQ(rec["steps"].get<int>(), 2) << rec;
  EXPECT_TRUE(std::isfinite(rec["loss"].get<double>())) << rec;
  EXPECT_EQ(rec["class_names"], (nlohmann::json{"TC", "WT", "ET"})) << rec;
  ASSERT_TRUE(rec["dice_per_class"].is_array()) << rec;
  EXPECT_EQ(rec["dice_per_class"].size(), 3u) << rec;
}

TEST(Launch, SetsTheRankVariablesAndPassesSettingsOn) {
  test::TempDir dir;
  const auto r = test::run(launch("--dist-timeout 12 launch --nproc 3 --no-medfast -- sh -c 'echo "
                                  "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                                  "$MEDFAST_DIST_TIMEOUT $MEDFAST_THREADS > " +
                                  dir.path() + "/env.$RANK'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream in(test::read_file(dir / ("env." + std::to_string(rank))));
    std::string rk, world, local, local_world, addr, port, timeout, threads;
    in >> rk >> world >> local >> local_world >> addr >> port >> timeout >> threads;
    EXPECT_EQ(rk, std::to_string(rank));
    EXPECT_EQ(local, std::to_string(rank));
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(std::stoi(port), 0);
    ports.insert(port);
    EXPECT_EQ(timeout, "12") << "a setting given to the launcher reaches every rank";
    EXPECT_GE(std::stoi(threads), 1) << "each rank gets a share of the cores";
  }
  EXPECT_EQ(ports.size(), 1u) << "one rendezvous port for all ranks";
}

TEST(Launch, AFailedRankStopsTheOthersAtOnceAndItsCodeIsReturned) {
  test::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const auto r = test::run(launch("launch --nproc 3 --no-medfast -- sh -c 'echo $$ > " + dir.path() +
                                  "/pid.$RANK; if [ $RANK = 1 ]; then sleep 0.5; exit 7; fi; exec sleep 60'"));
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_LT(seconds_since(start), 20.0) << "the other ranks were not stopped";
  EXPECT_TRUE(contains(r.err, "rank 1")) << r.err;
  for (int rank : {0, 2}) {
    const std::string pid = test::read_file(dir / ("pid." + std::to_string(rank)));
    ASSERT_FALSE(pid.empty());
    EXPECT_NE(::kill(std::stoi(pid), 0), 0) << "rank " << rank << " still runs";
  }
}

TEST(Launch, SignalsAreForwardedToEveryRank) {
  test::TempDir dir;
  const std::string d = dir.path();
  test::write_file(dir / "run.sh", launch("launch --nproc 2 --no-medfast -- sh -c 'echo $$ > " + d +
                                          "/pid.$RANK; exec sleep 60'") +
                                       " &\nL=$!\n"
                                       "for i in $(seq 100); do [ -s " + d + "/pid.0 ] && [ -s " + d +
                                       "/pid.1 ] && break; sleep 0.1; done\n"
                                       "kill -TERM $L\nwait $L\necho $? > " + d + "/rc\n");
  const auto start = std::chrono::steady_clock::now();
  test::run("bash '" + (dir / "run.sh") + "'");
  EXPECT_LT(seconds_since(start), 20.0);
  EXPECT_EQ(test::read_file(dir / "rc"), "143\n") << "128 + SIGTERM";
  for (int rank : {0, 1}) {
    const std::string pid = test::read_file(dir / ("pid." + std::to_string(rank)));
    ASSERT_FALSE(pid.empty());
    EXPECT_NE(::kill(std::stoi(pid), 0), 0) << "rank " << rank << " still runs";
  }
}

// A signal to the launcher of a distributed run: every rank stops after the same step (a vote),
// rank 0 writes last.ckpt and says how to go on, the launcher waits for them and returns 128 +
// the signal; resumed through the launcher, the ranks continue from that step.
TEST(Launch, AStopSignalStopsEveryRankAfterTheSameStepAndTheRunResumes) {
  test::TempDir dir;
  test::write_file(dir / "run.json", tiny_ddp_config(dir, 6).dump(2));
  const std::string d = dir.path();
  const std::string train = "--threads 1 launch --nproc 2 -- train --config '" + (dir / "run.json") +
                            "' --set data.loader.threads=1 --set train.run_dir='" + (dir / "run") + "'";
  test::write_file(dir / "run.sh", launch(train + " --set train.epochs=500") + " > " + d + "/out 2>&1 &\nL=$!\n" +
                                       "for i in $(seq 600); do grep -q 'epoch 1/500' " + d + "/out && break; sleep 0.1; done\n"
                                       "kill -TERM $L\nwait $L\necho $? > " + d + "/rc\n");
  const auto start = std::chrono::steady_clock::now();
  test::run("bash '" + (dir / "run.sh") + "'");
  EXPECT_LT(seconds_since(start), 120.0);
  const std::string out = test::read_file(dir / "out");
  EXPECT_EQ(test::read_file(dir / "rc"), "143\n") << out;
  EXPECT_TRUE(contains(out, "stopped by SIGTERM after")) << out;
  EXPECT_TRUE(contains(out, "which stop after their step")) << out;
  const nlohmann::json meta = train::read_checkpoint_meta(dir / "run/last.ckpt");
  const int done = meta["epoch"].get<int>();
  const auto r = test::run(launch(train + " --resume --set train.epochs=" + std::to_string(done + 1)));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(contains(r.out, str("epoch ", done + 1, "/", done + 1))) << r.out;
}

// torchrun's meaning of the variables over nodes: node R's local rank L is global rank R*K+L.
TEST(Launch, NodesGetTorchrunsRankVariables) {
  test::TempDir dir;
  for (int node = 0; node < 2; ++node) {
    const auto r = test::run(launch("launch --nnodes 2 --node-rank " + std::to_string(node) +
                                    " --master-addr 127.0.0.1 --master-port 29555 --nproc 3 --no-medfast -- sh -c 'echo $RANK $LOCAL_RANK "
                                    "$WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_PORT > " + dir.path() +
                                    "/env.$RANK'"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_EQ(test::read_file(dir / ("env." + std::to_string(rank))),
              str(rank, " ", rank % 3, " 6 3 ", rank / 3, " 29555\n"));
  }
}

/// The shell command of node `rank`'s launcher of a two-node run on loopback (2 ranks each)
/// training the config in folder `d` for `epochs`, into d/run; its output in d/out<rank>
/// and d/err<rank>. `settings`: flags before `launch`.
std::string node_launcher(const std::string& d, const std::string& port, int rank, const std::string& settings,
                          int epochs) {
  return launch("--threads 1 " + settings + "launch --nnodes 2 --node-rank " + std::to_string(rank) +
                " --master-addr 127.0.0.1 --master-port " + port + " --nproc 2 -- train --config '" + d +
                "/run.json' --set train.epochs=" + std::to_string(epochs) +
                " --set data.loader.threads=1 --set train.run_dir='" + d + "/run'") +
         " > " + d + "/out" + std::to_string(rank) + " 2> " + d + "/err" + std::to_string(rank);
}

// Multi-node, as on two machines: two launchers on loopback (--nnodes 2, 2 ranks each)
// train one run together; node 1 holds global ranks 2 and 3.
TEST(Launch, TwoNodesOfTwoRanksTrainTogether) {
  test::TempDir dir;
  test::write_file(dir / "run.json", tiny_ddp_config(dir, 9).dump(2));
  const std::string d = dir.path(), port = std::to_string(os::free_tcp_port());
  auto node = [&](int rank) { return node_launcher(d, port, rank, "", 1); };

  test::write_file(dir / "run.sh", node(1) + " &\nN1=$!\n" + node(0) + "\necho $? > " + d + "/rc0\nwait $N1\necho $? > " +
                                       d + "/rc1\n");
  test::run("bash '" + (dir / "run.sh") + "'");
  EXPECT_EQ(test::read_file(dir / "rc0"), "0\n") << test::read_file(dir / "err0");
  EXPECT_EQ(test::read_file(dir / "rc1"), "0\n") << test::read_file(dir / "err1");
  const std::string out0 = test::read_file(dir / "out0"), out1 = test::read_file(dir / "out1");
  EXPECT_NE(out0.find("epoch 1/1"), std::string::npos) << out0;
  EXPECT_EQ(out1.find("epoch 1/1"), std::string::npos) << "only rank 0 (node 0) reports: " << out1;
  const auto machine = nlohmann::json::parse(test::read_file(dir / "run/machine.json"));
  EXPECT_EQ(machine["ranks"], 4);
  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1) << jsonl;
}

// A node's launcher killed outright (as a machine lost) takes its ranks with it; the other
// node's ranks find their peers gone and its launcher stops, naming the node.
TEST(Launch, AKilledNodeStopsTheOtherNamingIt) {
  test::TempDir dir;
  test::write_file(dir / "run.json", tiny_ddp_config(dir, 9).dump(2));
  const std::string d = dir.path(), port = std::to_string(os::free_tcp_port());
  auto node = [&](int rank) { return node_launcher(d, port, rank, "--dist-timeout 30 ", 500); };

  // Node 1 lost once the first epoch is written: its launcher and its ranks killed with
  // SIGKILL at once (a launcher killed alone sends its ranks SIGTERM, and they stop as
  // `train` stops on a signal: every rank after the same step, with last.ckpt).
  test::write_file(dir / "run.sh", node(1) + " &\nN1=$!\n" + node(0) + " &\nN0=$!\n" +
                                       "for i in $(seq 600); do [ -s " + d + "/run/metrics.jsonl ] && break; sleep 0.1; done\n"
                                       "date +%s.%N > " + d + "/killed\npkill -KILL -P $N1\nkill -KILL $N1\nwait $N0\necho $? > " + d +
                                       "/rc0\ndate +%s.%N > " + d + "/stopped\n");
  test::run("bash '" + (dir / "run.sh") + "'");
  ASSERT_FALSE(test::read_file(dir / "run/metrics.jsonl").empty()) << test::read_file(dir / "err0");
  EXPECT_NE(test::read_file(dir / "rc0"), "0\n");
  const double took = std::stod(test::read_file(dir / "stopped")) - std::stod(test::read_file(dir / "killed"));
  EXPECT_LT(took, 45.0) << "within dist_timeout (30 s) and the grace period";
  const std::string err0 = test::read_file(dir / "err0");
  EXPECT_TRUE(contains(err0, "(node 1)")) << err0;
  EXPECT_TRUE(contains(err0, "medfast launch: node 0: ")) << err0;
}

TEST(Launch, BadArgumentsAreClearErrors) {
  auto r = test::run(launch("launch --nproc 0 -- train"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--nproc 0")) << r.err;
  r = test::run(launch("launch --nproc 2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "no command")) << r.err;
  r = test::run(launch("launch --nnodes 2 --node-rank 2 --master-addr 10.0.0.1 --master-port 29500 -- train"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--node-rank 2 is outside 0..1")) << r.err;
  for (const char* partial : {"", " --master-port 29500", " --master-addr 10.0.0.1"}) {
    r = test::run(launch(std::string("launch --nnodes 2 --node-rank 1") + partial + " -- train"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.err, "needs --master-addr (node 0's address) and --master-port")) << partial << ": " << r.err;
  }
  r = test::run(launch("launch --nproc 2 --grace -1 -- train"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "launch: --grace -1: expected seconds >= 0")) << r.err;
  r = test::run(launch("launch --nproc 2 --no-medfast -- /no/such/program"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "/no/such/program")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0")) << r.err;
}

}  // namespace
}  // namespace medfast
