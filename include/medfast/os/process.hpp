#pragma once
/// \file
/// Processes: the system calls `medfast launch` needs (fork/exec, waitpid, kill,
/// signal handlers), with EINTR handled and errors as OsError
/// naming the call and its arguments.
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace medfast::os {

/// How a child ended.
struct ChildExit {
  pid_t pid = -1;
  int exit_code = 0;  ///< its exit status, or 128 + signal when a signal ended it (as shells report)
  int signal = 0;     ///< the signal that ended it, 0 if it exited
  bool ok() const { return signal == 0 && exit_code == 0; }
};

/// Starts argv[0] (searched on PATH when it has no '/') with argv, this
/// process's environment plus `env` (which wins), and the same stdin, stdout and
/// stderr. Throws OsError naming the program when it cannot be started (the
/// exec failure is reported back from the child, not as an exit code).
/// `die_with_parent`: the child gets SIGTERM when this process ends, however it ends (a
/// launcher killed with SIGKILL leaves no children behind; Linux PR_SET_PDEATHSIG).
pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            bool die_with_parent = false);

/// A child that has ended, if any: waits up to `timeout_ms` (0: do not wait).
std::optional<ChildExit> wait_child(int timeout_ms);

/// This process's id (getpid): code that keeps kernel objects shared across fork (an
/// io_uring's queues) compares it with the id of the process that made them.
pid_t process_id();

/// Whether a process with this pid exists (kill(pid, 0); one owned by another user counts).
bool process_alive(pid_t pid);

/// Sends `signal` to `pid`; a process that has already gone is not an error.
void send_signal(pid_t pid, int signal);

/// Catches SIGINT, SIGTERM and SIGHUP for this process from now on: they no
/// longer end it; pending_signal() returns the last one caught (and clears it).
void catch_termination_signals();
int pending_signal();

/// A graceful stop: the first SIGINT, SIGTERM or SIGHUP is caught (stop_signal() then returns
/// it, and keeps returning it) and the handlers go back to the default, so that a second
/// signal ends the process at once.
void stop_on_first_signal();
/// The signal stop_on_first_signal caught; 0 while none came.
int stop_signal();

/// Replaces this process with `path` run with `argv` (execv: the same process id,
/// environment, open terminal). Returns only by throwing OsError naming the program.
[[noreturn]] void exec_program(const std::string& path, const std::vector<std::string>& argv);

/// This program's own executable (/proc/self/exe).
std::string self_executable();

/// The file (symlinks resolved) of the loaded library that defines `symbol`, e.g. the
/// BLAS behind libtorch for "sgemm_"; "" when no loaded library defines it.
std::string library_of_symbol(const char* symbol);

/// dlopen(name, RTLD_NOW | RTLD_LOCAL): the library's handle, or nullptr with dlerror's
/// text in `why` (where given). The shims load optional GPU libraries this way.
void* open_library(const std::string& name, std::string* why = nullptr);
/// dlsym(lib, name), or nullptr where `lib` has no such symbol.
void* library_symbol(void* lib, const char* name);
/// dlclose(lib); nothing for nullptr.
void close_library(void* lib);

/// Points `out` (a function pointer) at `lib`'s `name`; false, with "<what> has no symbol
/// <name>" in `why`, where the library lacks it.
template <typename Fn>
bool bind_symbol(void* lib, const char* name, Fn& out, std::string& why, const char* what) {
  out = reinterpret_cast<Fn>(library_symbol(lib, name));
  if (!out) why = std::string(what) + " has no symbol " + name;
  return out != nullptr;
}

/// What a run report says about the machine: host, CPU model, cores, memory, kernel.
struct MachineInfo {
  std::string hostname, cpu, kernel;
  int cores = 0;
  std::uint64_t memory_bytes = 0;
};
MachineInfo machine_info();

/// Seconds since the medfast command started: since mark_command_start() in this process or
/// the one that exec'd it (the `medfast` front end marks its start before handing a command
/// to medfast-torch), else since this process started (/proc/self/stat, to 10 ms). Negative
/// where neither can be read. metrics.jsonl's process_seconds.
double process_seconds();
/// Marks now as the command's start for process_seconds(), in this process and the programs
/// it execs or starts (the environment's MEDFAST_COMMAND_START, CLOCK_BOOTTIME seconds).
void mark_command_start();
/// Sets environment variable `name` to `value` for this process and the programs it starts,
/// unless it is already set (a user's own value wins).
void set_env_default(const char* name, const char* value);

/// The process's peak resident set size in bytes since it started or since the
/// last reset_peak_rss() (VmHWM in /proc/self/status; getrusage's maxrss where
/// that cannot be read).
std::uint64_t peak_rss_bytes();
/// Starts a new peak (writes 5 to /proc/self/clear_refs); false where the kernel
/// does not allow it, and peak_rss_bytes() then stays the lifetime peak.
bool reset_peak_rss();

/// From now on the C library keeps freed memory in the process for reuse: large blocks
/// come from the heap instead of their own mappings, and the heap is never trimmed
/// (glibc: mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD -1). A network's tensors, allocated
/// and freed every forward, then reuse pages already mapped instead of faulting fresh
/// zeroed ones in each time; the resident size stays at its peak. False where the C
/// library is not glibc or refuses (nothing changed then).
bool keep_freed_memory();

}  // namespace medfast::os
