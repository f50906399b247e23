// medfast launch: a launcher for distributed training, as torchrun's (static
// rendezvous), so that multi-GPU and multi-node training need no Python.
//
// On several machines, one launcher per node: `medfast launch --nnodes 2 --node-rank R
// --master-addr HOST0 --master-port P --nproc K -- train ...` (torchrun's meaning: node R
// starts global ranks R*K..R*K+K-1 with LOCAL_RANK 0..K-1, GROUP_RANK R; the ranks meet
// at HOST0:P, hosted by rank 0 on node 0). A launcher's ranks die with it (a killed
// launcher leaves no ranks behind), and the other nodes' ranks then find their peers
// gone, so every launcher stops within dist_timeout, naming the node.
//
// It starts N copies of `medfast ARGS...` (or, with --no-medfast, of any program:
// `medfast launch --nproc 2 --no-medfast -- python3 train.py`) with RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (a
// free port unless one is given): with train.device cuda each rank trains on GPU
// LOCAL_RANK. Settings given to the launcher as flags reach every rank as their
// MEDFAST_* variables, and each rank gets an equal share of the cores (the threads
// setting) unless threads was set. SIGINT, SIGTERM and SIGHUP are forwarded to
// every rank, and the launcher waits for them to stop (`train` finishes its step and writes
// last.ckpt); a second signal stops them at once. When a rank fails, the others are stopped at once (SIGTERM, then
// SIGKILL after a grace period) and the launcher exits with the failed rank's
// code; when all succeed, with 0.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/os/net.hpp"
#include "medfast/os/process.hpp"

namespace medfast::cli {

namespace {

struct LaunchArgs {
  int nproc = 1;
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;  ///< required with nnodes > 1: the other nodes' ranks dial it
  int master_port = 0;
  double grace_seconds = 5;
  bool no_medfast = false;
  std::vector<std::string> command;
};

constexpr int kPollMs = 50;

/// Waits up to `seconds` for every child in `alive` to end; records their exits.
void reap(std::map<pid_t, int>& alive, std::map<int, os::ChildExit>& exits, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!alive.empty() && std::chrono::steady_clock::now() < deadline) {
    if (auto e = os::wait_child(kPollMs)) {
      auto it = alive.find(e->pid);
      if (it != alive.end()) {
        exits[it->second] = *e;
        alive.erase(it);
      }
    }
  }
}

/// Ends every child still running: `first` now, SIGKILL after the grace period.
void stop_all(std::map<pid_t, int>& alive, std::map<int, os::ChildExit>& exits, int first, double grace) {
  for (const auto& [pid, rank] : alive) os::send_signal(pid, first);
  reap(alive, exits, grace);
  for (const auto& [pid, rank] : alive) os::send_signal(pid, SIGKILL);
  reap(alive, exits, 60);
}

int run_launch(const LaunchArgs& a, Context& ctx) {
  if (a.nproc < 1) throw ValueError(str("launch: --nproc ", a.nproc, " must be at least 1"));
  if (!(a.grace_seconds >= 0)) {  // NaN too
    throw ValueError(str("launch: --grace ", a.grace_seconds,
                         ": expected seconds >= 0 (how long the other ranks get to stop before SIGKILL)"));
  }
  if (a.command.empty()) {
    throw ValueError("launch: no command: give the medfast subcommand after --, e.g. `medfast launch --nproc 2 -- train`");
  }
  if (a.master_port < 0 || a.master_port > 65535) {
    throw ValueError(str("launch: --master-port ", a.master_port, " is outside 0..65535 (0: a free port)"));
  }
  if (a.nnodes < 1) throw ValueError(str("launch: --nnodes ", a.nnodes, " must be at least 1"));
  if (a.node_rank < 0 || a.node_rank >= a.nnodes) {
    throw ValueError(str("launch: --node-rank ", a.node_rank, " is outside 0..", a.nnodes - 1, " (--nnodes ", a.nnodes, ")"));
  }
  if (a.nproc > 4096 || a.nnodes > 65536 || static_cast<long long>(a.nproc) * a.nnodes > (1 << 24)) {
    throw ValueError(str("launch: --nnodes ", a.nnodes, " x --nproc ", a.nproc, " ranks is more than this launcher starts"));
  }
  if (a.nnodes > 1 && (a.master_port == 0 || !a.master_addr_given)) {
    throw ValueError(str("launch: --nnodes ", a.nnodes, " needs --master-addr (node 0's address) and --master-port, the "
                         "same on every node's launcher: the ranks of all nodes meet there"));
  }
  const int port = a.master_port > 0 ? a.master_port : os::free_tcp_port(a.master_addr);
  const std::string node = a.nnodes > 1 ? str("node ", a.node_rank, ": ") : "";

  std::map<std::string, std::string> common{{"WORLD_SIZE", std::to_string(a.nnodes * a.nproc)},
                                            {"LOCAL_WORLD_SIZE", std::to_string(a.nproc)},
                                            {"GROUP_RANK", std::to_string(a.node_rank)},
                                            {"MASTER_ADDR", a.master_addr},
                                            {"MASTER_PORT", std::to_string(port)}};
  // Settings given on the launcher's command line reach every rank.
  for (const auto& d : setting_defs()) {
    const auto& e = ctx.settings.entry(d.name);
    if (e.source == SettingSource::flag) common[d.env_var()] = e.value;
  }
  // N ranks on one machine share its cores, unless the user chose.
  if (ctx.settings.entry("threads").source == SettingSource::default_value && a.nproc > 1) {
    common["MEDFAST_THREADS"] = std::to_string(std::max(1, ctx.settings.threads() / a.nproc));
  }
  std::vector<std::string> argv;
  if (!a.no_medfast) argv.push_back(os::self_executable());
  argv.insert(argv.end(), a.command.begin(), a.command.end());

  os::catch_termination_signals();
  std::map<pid_t, int> alive;  // pid -> rank
  std::map<int, os::ChildExit> exits;
  for (int local = 0; local < a.nproc; ++local) {
    const int r = a.node_rank * a.nproc + local;
    auto env = common;
    env["RANK"] = std::to_string(r);
    env["LOCAL_RANK"] = std::to_string(local);
    try {
      alive[os::spawn(argv, env, /*die_with_parent=*/true)] = r;
    } catch (...) {
      stop_all(alive, exits, SIGTERM, a.grace_seconds);
      rethrow_with_context(str("launch: ", node, "rank ", r));
    }
  }

  int failed_rank = -1, interrupted = 0;
  while (!alive.empty()) {
    if (const int sig = os::pending_signal()) {
      if (!interrupted) {
        // The first: every rank gets it and stops as `train` does (the step under way
        // finished, last.ckpt written, all ranks after the same step): the launcher waits.
        interrupted = sig;
        std::fprintf(stderr, "medfast launch: %s%s: forwarding it to %zu ranks, which stop after their step (a "
                     "second signal stops them at once)\n", node.c_str(), ::strsignal(sig), alive.size());
        for (const auto& [pid, rank] : alive) os::send_signal(pid, sig);
        continue;
      }
      std::fprintf(stderr, "medfast launch: %s%s again: stopping %zu ranks at once\n", node.c_str(), ::strsignal(sig),
                   alive.size());
      stop_all(alive, exits, sig, a.grace_seconds);
      break;
    }
    const auto e = os::wait_child(kPollMs);
    if (!e) continue;
    auto it = alive.find(e->pid);
    if (it == alive.end()) continue;
    const int rank = it->second;
    exits[rank] = *e;
    alive.erase(it);
    if (!e->ok() && !interrupted) {  // stopping on a signal, a rank's non-zero code says so: the others go on stopping
      failed_rank = rank;
      if (!alive.empty()) {
        std::fprintf(stderr, "medfast launch: %srank %d %s %d: stopping the other %zu ranks\n", node.c_str(), rank,
                     e->signal ? "was killed by signal" : "exited with code", e->signal ? e->signal : e->exit_code,
                     alive.size());
        stop_all(alive, exits, SIGTERM, a.grace_seconds);
      }
      break;
    }
  }
  if (interrupted) return 128 + interrupted;
  if (failed_rank >= 0) {
    const os::ChildExit& e = exits.at(failed_rank);
    std::fprintf(stderr, "medfast launch: %sfailed: rank %d %s %d\n", node.c_str(), failed_rank,
                 e.signal ? "was killed by signal" : "exited with code", e.signal ? e.signal : e.exit_code);
    return e.exit_code;
  }
  return 0;
}

}  // namespace

Command register_launch(CLI::App& root) {
  auto a = std::make_shared<LaunchArgs>();
  auto* app = root.add_subcommand(
      "launch", "Start N ranks of a medfast command on this machine (torchrun's variables, one GPU per rank)");
  app->add_option("--nproc", a->nproc, "Ranks (processes) to start on this node")->capture_default_str();
  app->add_option("--nnodes", a->nnodes, "Nodes (machines), one launcher each")->capture_default_str();
  app->add_option("--node-rank", a->node_rank, "This node's index, 0..nnodes-1 (node 0 hosts rank 0)")
      ->capture_default_str();
  app->add_option_function<std::string>(
         "--master-addr",
         [a](const std::string& v) {
           a->master_addr = v;
           a->master_addr_given = true;
         },
         "Address rank 0 hosts the rendezvous on (node 0's, reachable from every node; required with --nnodes > 1)")
      ->default_str("127.0.0.1");
  app->add_option("--master-port", a->master_port, "Port of the rendezvous (0: a free one; required with --nnodes > 1)")->capture_default_str();
  app->add_option("--grace", a->grace_seconds, "Seconds the other ranks get to stop before SIGKILL")
      ->capture_default_str();
  app->add_flag("--no-medfast", a->no_medfast, "The command is a program of its own, not a medfast subcommand");
  app->add_option("command", a->command, "After --: the medfast subcommand and its arguments (e.g. train --config X)");
  app->footer("Example: medfast launch --nproc 2 -- train --config examples/spleen.yaml --set train.device=cuda");
  return {app, [a](Context& ctx) { return run_launch(*a, ctx); }};
}

}  // namespace medfast::cli
