// medfast io load|store|bench: the tensor file engine from the command line,
// after DeepSpeed's DeepNVMe example scripts. Each loop prints GB/s; the
// median closes the run; --validate compares with a plain read.
//
// Torch-free: host buffers are the OS layer's aligned buffers, so `medfast io` on the CPU
// runs in the `medfast` binary without loading libtorch. Device memory (--device
// cuda[:N]) comes from a DeviceIo (cmd_io_device.cpp, in medfast-torch); without one the
// command reports needs_device() and the front hands the call over.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/field_settings.hpp"
#include "medfast/core/random.hpp"
#include "medfast/core/units.hpp"
#include "medfast/io/file_handle.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"

namespace medfast::cli {

namespace {

/// The engine's options as flags, one per IoOptions field (--backend, --block-size, ...),
/// each setting io_<key> for this command.
struct EngineFlags {
  std::map<std::string, std::string> given;  // field key -> text
  void add(CLI::App* app) {
    for (const auto& d : setting_defs_of<io::IoOptions>(io::kIoSettingPrefix)) {
      const std::string key = d.name.substr(std::string(io::kIoSettingPrefix).size());
      std::string help = d.description;
      if (!d.choices.empty()) help += ": " + join(d.choices, " | ");
      app->add_option(flag_of(key), given[key], str(help, " (setting ", d.name, ")"));
    }
  }
  void apply(Settings& s) const {
    for (const auto& [key, value] : given) {
      if (!value.empty()) s.set(io::kIoSettingPrefix + key, value, SettingSource::flag, flag_of(key));
    }
  }
  static std::string flag_of(std::string key) {
    std::replace(key.begin(), key.end(), '_', '-');
    return "--" + key;
  }
};

/// Whether --device names the CPU; cuda and cuda:N name a GPU; anything else is an error.
bool is_cpu_device(const std::string& name) {
  if (name == "cpu") return true;
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) return false;
  throw ValueError(str("--device '", name, "' is not cpu or cuda[:N]"));
}

/// Where the bytes of a load or store live: an aligned host buffer, or device memory
/// from the DeviceIo.
class Target {
 public:
  /// `bytes` of zeros on `device` (host memory is faulted in before any timing, as
  /// DeepNVMe's scripts preallocate theirs).
  Target(const std::string& device, std::size_t bytes, const DeviceIo* dev) : bytes_(bytes) {
    if (is_cpu_device(device)) {
      owned_ = os::Buffer::allocate(bytes);
      if (bytes) std::memset(owned_.data(), 0, bytes);
      host_ = owned_.as<char>();
    } else {
      device_ = device_buffer(device, dev, nullptr);
    }
  }
  /// The bytes of `content` on `device`: `content` itself on the CPU (it must outlive
  /// this), a copy on a device.
  Target(const std::string& device, const os::Buffer& content, const DeviceIo* dev) : bytes_(content.size()) {
    if (is_cpu_device(device)) host_ = content.as<char>();
    else device_ = device_buffer(device, dev, content.data());
  }
  std::size_t read(io::FileHandle& f) { return device_ ? device_->read(f, 0) : f.read(host_, bytes_, 0); }
  void write(io::FileHandle& f) {
    if (device_) device_->write(f, 0);
    else f.write(host_, bytes_, 0);
  }
  /// The bytes, in host memory (copied from the device if they live there).
  const char* host_bytes() {
    if (!device_) return host_;
    if (owned_.empty() && bytes_) owned_ = os::Buffer::allocate(bytes_);
    device_->copy_to_host(owned_.data());
    return owned_.as<const char>();
  }

 private:
  std::unique_ptr<DeviceBuffer> device_buffer(const std::string& device, const DeviceIo* dev, const void* host) {
    MEDFAST_CHECK(dev != nullptr, "--device ", device, ": device memory needs medfast-torch");
    return dev->allocate(device, bytes_, host);
  }
  std::size_t bytes_;
  os::Buffer owned_;
  char* host_ = nullptr;
  std::unique_ptr<DeviceBuffer> device_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

bool same_bytes_as_plain_read(const std::string& path, const char* data, std::uint64_t bytes) {
  const os::File f = os::File::open(path, os::File::Mode::read);
  std::vector<char> plain(1 << 20);
  for (std::uint64_t pos = 0; pos < bytes; pos += plain.size()) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(plain.size(), bytes - pos));
    f.read_exact(plain.data(), n, pos);
    if (std::memcmp(plain.data(), data + pos, n) != 0) return false;
  }
  return true;
}

nlohmann::json engine_json(const io::FileHandle& f, const io::IoOptions& o) {
  return {{"backend", io::backend_name(f.backend())},
          {"direct", f.direct()},
          {"cache_first", f.direct() && o.cache_first},
          {"block_size", o.block_size},
          {"queue_depth", o.queue_depth},
          {"threads", o.threads}};
}

/// What `io load` and `io store` share: the memory's device, the timed loops, the check
/// against a plain read, JSON, and the engine's flags.
struct TransferArgs {
  std::string device = "cpu";
  int loops = 3;
  bool validate = false, json = false;
  EngineFlags engine;
  /// `verb`: "loads" or "stores"; `check`: what --validate does.
  void add(CLI::App* app, const char* verb, const char* check) {
    app->add_option("--device", device, "cpu | cuda[:N]")->capture_default_str();
    app->add_option("--loop", loops, str("Number of timed ", verb))->capture_default_str();
    app->add_flag("--validate", validate, check);
    app->add_flag("--json", json, "Print JSON");
    engine.add(app);
  }
};

struct LoadArgs : TransferArgs {
  std::string file;
  bool drop_cache = false;
};

struct LoadResult {
  std::vector<double> seconds;
  std::uint64_t bytes = 0;
  bool validated = false;
  nlohmann::json engine;
};

LoadResult load(const std::string& file, const io::IoOptions& options, const std::string& device, const DeviceIo* dev,
                int loops, bool drop_cache, bool validate) {
  io::FileHandle f = io::FileHandle::open(file, io::FileHandle::Mode::read, options);
  LoadResult r;
  r.bytes = f.size();
  r.engine = engine_json(f, options);
  Target buf(device, static_cast<std::size_t>(r.bytes), dev);
  if (!is_cpu_device(device)) {
    r.engine["device_path"] = dev->device_path(f);
    r.engine["device_transfers"] = dev->device_transfers();
  }
  for (int i = 0; i < loops; ++i) {
    if (drop_cache) os::File::open(file, os::File::Mode::read).drop_cache();
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t got = buf.read(f);
    r.seconds.push_back(seconds_since(t0));
    MEDFAST_CHECK(got == r.bytes, file, ": read ", got, " of ", r.bytes, " bytes");
  }
  r.engine["page_cache_bytes"] = f.page_cache_bytes();  // of all loops' bytes, those O_DIRECT reads took from the cache
  if (validate) {
    r.validated = same_bytes_as_plain_read(file, buf.host_bytes(), r.bytes);
    MEDFAST_CHECK(r.validated, "io load --validate: ", file, ": the bytes read differ from a plain read");
  }
  return r;
}

int report(const char* what, const std::string& target, const LoadResult& r, const std::string& device, bool json) {
  std::vector<double> gbps;
  for (double s : r.seconds) gbps.push_back(static_cast<double>(r.bytes) / s / 1e9);
  if (json) {
    nlohmann::json j = r.engine;
    j["operation"] = what;
    j["target"] = target;
    j["bytes"] = r.bytes;
    j["device"] = device;
    j["seconds"] = r.seconds;
    j["gbps"] = gbps;
    j["median_gbps"] = median(gbps);
    j["validated"] = r.validated;
    print_json(j.dump(2));
    return 0;
  }
  std::printf("%s %s: %s, backend %s%s, block %s, queue depth %d, threads %d, device %s\n", what, target.c_str(),
              format_bytes(r.bytes).c_str(), r.engine["backend"].get<std::string>().c_str(),
              r.engine["direct"].get<bool>() ? " (O_DIRECT)" : "",
              format_bytes(r.engine["block_size"].get<std::uint64_t>()).c_str(), r.engine["queue_depth"].get<int>(),
              r.engine["threads"].get<int>(), device.c_str());
  for (std::size_t i = 0; i < gbps.size(); ++i) {
    std::printf("  loop %zu: %.3f s, %.2f GB/s\n", i + 1, r.seconds[i], gbps[i]);
  }
  std::printf("  median: %.2f GB/s%s\n", median(gbps), r.validated ? " (validated against a plain read)" : "");
  if (r.engine.contains("page_cache_bytes") && r.engine["cache_first"].get<bool>()) {
    std::printf("  from the page cache: %s of %s read (io_cache_first)\n",
                format_bytes(r.engine["page_cache_bytes"].get<std::uint64_t>()).c_str(),
                format_bytes(r.bytes * r.seconds.size()).c_str());
  }
  return 0;
}

struct StoreArgs : TransferArgs {
  std::string dir;
  double mb = 1024;
};

int run_store(const StoreArgs& a, Context& ctx, const DeviceIo* dev) {
  a.engine.apply(ctx.settings);
  const auto options = io::IoOptions::from(ctx.settings);
  const bool on_cpu = is_cpu_device(a.device);
  MEDFAST_CHECK_T(ValueError, a.mb > 0, "io store: --mb-size ", a.mb, " must be positive");
  MEDFAST_CHECK_T(ValueError, a.loops >= 1, "io store: --loop ", a.loops, " must be at least 1");
  const auto bytes = static_cast<std::size_t>(a.mb * 1024 * 1024);
  os::make_directories(a.dir);
  const std::string path = str(a.dir, "/medfast-io-store-", ::getpid(), ".bin");
  // Deterministic, incompressible content.
  os::Buffer content = os::Buffer::allocate(bytes);
  Rng rng(derive_seed({0x57023}));
  auto* words = content.as<std::uint64_t>();
  for (std::size_t i = 0; i < bytes / 8; ++i) words[i] = rng.next();
  for (std::size_t i = bytes / 8 * 8; i < bytes; ++i) content.as<char>()[i] = static_cast<char>(i);
  Target src(a.device, content, dev);
  LoadResult r;
  r.bytes = bytes;
  struct Cleanup {
    std::string p;
    ~Cleanup() { os::remove_file(p); }
  } cleanup{path};
  for (int i = 0; i < a.loops; ++i) {
    io::FileHandle f = io::FileHandle::open(path, io::FileHandle::Mode::write, options);
    if (i == 0) {
      r.engine = engine_json(f, options);
      if (!on_cpu) {
        r.engine["device_path"] = dev->device_path(f);
        r.engine["device_transfers"] = dev->device_transfers();
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    src.write(f);
    f.sync();  // timed: a store is done when it is durable
    r.seconds.push_back(seconds_since(t0));
  }
  if (a.validate) {
    r.validated = same_bytes_as_plain_read(path, content.as<const char>(), bytes) && os::stat(path).size == bytes;
    MEDFAST_CHECK(r.validated, "io store --validate: ", path, " does not hold the bytes written");
  }
  return report("store", a.dir, r, a.device, a.json);
}

struct BenchArgs {
  std::string file;
  int loops = 2;
  bool json = false;
};

int run_bench(const BenchArgs& a, Context& ctx) {
  MEDFAST_CHECK_T(ValueError, a.loops >= 1, "io bench: --loop ", a.loops, " must be at least 1");
  const auto base = io::IoOptions::from(ctx.settings);
  struct Row {
    std::string backend;
    std::uint64_t block;
    int depth, threads;
    bool direct;
    double gbps;
  };
  std::vector<Row> rows;
  auto measure = [&](io::IoOptions o) {
    const LoadResult r = load(a.file, o, "cpu", nullptr, a.loops, /*drop_cache=*/!o.direct, /*validate=*/false);
    std::vector<double> g;
    for (double s : r.seconds) g.push_back(static_cast<double>(r.bytes) / s / 1e9);
    rows.push_back({r.engine["backend"], o.block_size, o.queue_depth, o.threads, r.engine["direct"], median(g)});
    if (!a.json) {
      std::printf("%-9s direct=%-3s block %-9s depth %-4d threads %-3d %7.2f GB/s\n", rows.back().backend.c_str(),
                  rows.back().direct ? "on" : "off", format_bytes(o.block_size).c_str(), o.queue_depth, o.threads,
                  rows.back().gbps);
      std::fflush(stdout);
    }
  };
  for (std::uint64_t block : {std::uint64_t{128} << 10, std::uint64_t{1} << 20, std::uint64_t{4} << 20}) {
    for (int threads : {1, base.threads}) {
      measure(io::IoOptions(base).set_backend("posix").set_block_size(block).set_threads(threads).set_direct(false));
      measure(io::IoOptions(base).set_backend("odirect").set_block_size(block).set_threads(threads).set_direct(true));
      if (threads == base.threads) break;
    }
    if (io::probe().io_uring) {
      for (int depth : {8, 32, 128}) {
        measure(io::IoOptions(base).set_backend("io_uring").set_block_size(block).set_queue_depth(depth).set_direct(true));
      }
    }
  }
  const auto best = std::max_element(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.gbps < y.gbps; });
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : rows) {
      j.push_back({{"backend", r.backend}, {"block_size", r.block}, {"queue_depth", r.depth}, {"threads", r.threads},
                   {"direct", r.direct}, {"gbps", r.gbps}});
    }
    print_json(nlohmann::json{{"file", a.file}, {"results", j}, {"best", j[best - rows.begin()]}}.dump(2));
  } else {
    std::printf("best: %s direct=%s block %s depth %d threads %d: %.2f GB/s\n", best->backend.c_str(),
                best->direct ? "on" : "off", format_bytes(best->block).c_str(), best->depth, best->threads, best->gbps);
  }
  return 0;
}

}  // namespace

IoCommand register_io(CLI::App& root, const DeviceIo* device) {
  auto* io = root.add_subcommand("io", "Tensor file I/O engine: load, store, sweep");
  io->require_subcommand(1);

  auto la = std::make_shared<LoadArgs>();
  auto* load_cmd = io->add_subcommand("load", "Read a file into host or CUDA memory, timing each loop");
  load_cmd->add_option("--file", la->file, "File to read")->required();
  load_cmd->add_flag("--drop-cache", la->drop_cache, "Drop the file from the page cache before each loop (cold reads)");
  la->add(load_cmd, "loads", "Compare the bytes with a plain read");

  auto sa = std::make_shared<StoreArgs>();
  auto* store_cmd = io->add_subcommand("store", "Write host or CUDA memory to a file in DIR (removed afterwards), timing each loop");
  store_cmd->add_option("--dir", sa->dir, "Folder to write in")->required();
  store_cmd->add_option("--mb-size", sa->mb, "MiB to write")->capture_default_str();
  sa->add(store_cmd, "stores", "Read the file back with a plain read and compare");

  auto ba = std::make_shared<BenchArgs>();
  auto* bench_cmd = io->add_subcommand("bench", "Sweep backends, block sizes and queue depths on FILE");
  bench_cmd->add_option("file", ba->file, "File to read")->required();
  bench_cmd->add_option("--loop", ba->loops, "Loads per configuration")->capture_default_str();
  bench_cmd->add_flag("--json", ba->json, "Print JSON");

  IoCommand c;
  c.command.app = io;
  c.command.run = [la, sa, ba, load_cmd, store_cmd, device](Context& ctx) {
    if (load_cmd->parsed()) {
      la->engine.apply(ctx.settings);
      MEDFAST_CHECK_T(ValueError, la->loops >= 1, "io load: --loop ", la->loops, " must be at least 1");
      const LoadResult r = load(la->file, io::IoOptions::from(ctx.settings), la->device, device, la->loops,
                                la->drop_cache, la->validate);
      return report("load", la->file, r, la->device, la->json);
    }
    if (store_cmd->parsed()) return run_store(*sa, ctx, device);
    return run_bench(*ba, ctx);
  };
  // Device memory without a DeviceIo: medfast-torch runs it (a bad --device name is
  // reported here).
  c.needs_device = [la, sa, load_cmd, store_cmd, device] {
    if (device) return false;
    if (load_cmd->parsed()) return !is_cpu_device(la->device);
    if (store_cmd->parsed()) return !is_cpu_device(sa->device);
    return false;
  };
  return c;
}

}  // namespace medfast::cli
