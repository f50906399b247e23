#include "medfast/os/process.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <thread>

#include "medfast/core/error.hpp"
#include "fd.hpp"

extern char** environ;

namespace medfast::os {

using detail::errno_text;
using detail::Fd;

namespace {

std::atomic<int> g_signal{0};

void on_signal(int sig) { g_signal.store(sig); }

std::atomic<int> g_stop{0};

void on_first_signal(int sig) {  // async-signal-safe: an atomic store and sigaction
  g_stop.store(sig);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &dfl, nullptr);
}

}  // namespace

pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, bool die_with_parent) {
  if (argv.empty()) throw ValueError("spawn: no program given");
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (env.count(name) == 0) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  // A close-on-exec pipe carries exec's errno back: an empty read means exec worked.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw OsError(str("pipe2 for starting ", argv[0], ": ", errno_text(errno)), errno);
  Fd read_end{fds[0]}, write_end{fds[1]};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw OsError(str("fork for starting ", argv[0], ": ", errno_text(errno)), errno);
  if (pid == 0) {
    ::close(fds[0]);
    // The child starts with default signal handling whatever its parent caught.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    if (die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(128 + SIGTERM);  // the parent died before prctl took effect
    }
    ::execvpe(args[0], args.data(), envp.data());
    const int e = errno;
    ssize_t unused = ::write(fds[1], &e, sizeof e);
    (void)unused;
    ::_exit(127);
  }
  ::close(write_end.fd);
  write_end.fd = -1;
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(read_end.fd, &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw OsError(str("cannot start ", argv[0], ": ", errno_text(child_errno)), child_errno);
  }
  return pid;
}

std::optional<ChildExit> wait_child(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0) {
      if (errno == EINTR) continue;
      if (errno == ECHILD) return std::nullopt;
      throw OsError(str("waitpid: ", errno_text(errno)), errno);
    }
    if (pid > 0) {
      ChildExit e;
      e.pid = pid;
      if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
        e.exit_code = 128 + e.signal;
      } else {
        e.exit_code = WEXITSTATUS(status);
      }
      return e;
    }
    if (std::chrono::steady_clock::now() >= deadline || g_signal.load() != 0) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

pid_t process_id() { return ::getpid(); }

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

void send_signal(pid_t pid, int signal) {
  if (::kill(pid, signal) != 0 && errno != ESRCH) {
    throw OsError(str("kill(", pid, ", ", ::strsignal(signal), "): ", errno_text(errno)), errno);
  }
}

void catch_termination_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    if (::sigaction(s, &sa, nullptr) != 0) throw OsError(str("sigaction(", ::strsignal(s), "): ", errno_text(errno)), errno);
  }
}

int pending_signal() { return g_signal.exchange(0); }

void stop_on_first_signal() {
  struct sigaction sa {};
  sa.sa_handler = on_first_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    if (::sigaction(s, &sa, nullptr) != 0) throw OsError(str("sigaction(", ::strsignal(s), "): ", errno_text(errno)), errno);
  }
}

int stop_signal() { return g_stop.load(); }

std::string self_executable() {
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw OsError(str("readlink(/proc/self/exe): ", errno_text(errno)), errno);
  buf.resize(static_cast<std::size_t>(n));
  return buf;
}

void exec_program(const std::string& path, const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(path.c_str(), args.data());
  const int e = errno;
  throw OsError(str("cannot run ", path, ": ", errno_text(e),
                    e == ENOENT ? " (medfast runs the commands that need libtorch with medfast-torch, which belongs "
                                  "beside it: build the medfast_cli target, or set MEDFAST_TORCH_BINARY)"
                                : ""),
                e);
}

std::string library_of_symbol(const char* symbol) {
  void* address = ::dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  char resolved[PATH_MAX];
  return ::realpath(info.dli_fname, resolved) ? std::string(resolved) : std::string(info.dli_fname);
}

void* open_library(const std::string& name, std::string* why) {
  void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib && why) {
    const char* e = ::dlerror();
    *why = e ? e : "dlopen failed";
  }
  return lib;
}

void* library_symbol(void* lib, const char* name) { return lib ? ::dlsym(lib, name) : nullptr; }

void close_library(void* lib) {
  if (lib) ::dlclose(lib);
}

namespace {
/// Up to `limit` first bytes of a /proc file, in one read ("" where it cannot be read).
std::string read_proc(const char* path, std::size_t limit) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text(limit, '\0');
  const ssize_t n = ::read(fd, text.data(), text.size());
  ::close(fd);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return text;
}
}  // namespace

MachineInfo machine_info() {
  MachineInfo m;
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) m.hostname = host;
  struct utsname u {};
  if (::uname(&u) == 0) m.kernel = std::string(u.sysname) + " " + u.release + " " + u.machine;
  m.cores = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) m.memory_bytes = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  {
    const std::string text = read_proc("/proc/cpuinfo", 1 << 16);
    const auto at = text.find("model name");
    if (at != std::string::npos) {
      const auto colon = text.find(':', at), end = text.find('\n', at);
      if (colon != std::string::npos && colon < end) m.cpu = text.substr(colon + 2, end - colon - 2);
    }
  }
  return m;
}

namespace {
constexpr const char* kCommandStart = "MEDFAST_COMMAND_START";

/// CLOCK_BOOTTIME in seconds: the clock /proc/self/stat's start time counts on (a
/// container's /proc/uptime may be rewritten to the container's age; this clock is not).
double boottime_now() {
  timespec t{};
  if (::clock_gettime(CLOCK_BOOTTIME, &t) != 0) return -1;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}
}  // namespace

void mark_command_start() {
  const double now = boottime_now();
  if (now < 0) return;
  char text[64];
  std::snprintf(text, sizeof(text), "%.6f", now);
  ::setenv(kCommandStart, text, 1);
}

void set_env_default(const char* name, const char* value) { ::setenv(name, value, /*overwrite=*/0); }

double process_seconds() {
  const double now = boottime_now();
  if (now < 0) return -1;
  if (const char* marked = std::getenv(kCommandStart); marked && *marked) {
    char* end = nullptr;
    const double start = std::strtod(marked, &end);
    if (end && *end == '\0' && start > 0 && start <= now) return now - start;
  }
  // /proc/self/stat's 22nd field: the start in clock ticks after boot. The 2nd field (the
  // command name, in parentheses) may hold spaces: count after its ')'.
  const std::string stat = read_proc("/proc/self/stat", 4096);
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
  }
  const long ticks = ::sysconf(_SC_CLK_TCK);
  if (!fields || ticks <= 0) return -1;
  return now - std::strtod(field.c_str(), nullptr) / static_cast<double>(ticks);
}

bool keep_freed_memory() {
#if defined(__GLIBC__)
  return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, -1) == 1;
#else
  return false;
#endif
}

std::uint64_t peak_rss_bytes() {
  const std::string status = read_proc("/proc/self/status", 8191);
  if (const auto at = status.find("VmHWM:"); at != std::string::npos) {
    return std::strtoull(status.c_str() + at + 6, nullptr, 10) * 1024;
  }
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

bool reset_peak_rss() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

}  // namespace medfast::os
