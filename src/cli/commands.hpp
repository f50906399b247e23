#pragma once
/// \file The CLI's subcommand interface: each file registers one subcommand.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "medfast/core/settings.hpp"

namespace medfast::io {
class FileHandle;
}
namespace medfast::data {
struct PipelineConfig;
}

namespace medfast::cli {

/// What every subcommand gets when it runs.
struct Context {
  Settings settings;
  std::string config_file;  ///< settings file used, if any
};

/// data::open_pipeline on the config file at `config`, with `sets` (--set key.path=value,
/// as train's) applied in order, and the command's settings.
data::PipelineConfig open_pipeline(const std::string& config, const std::vector<std::string>& sets, const Context& ctx);

/// The arguments of commands that read a run config's data section (cache build, bench
/// loader): --config (required) and --set, read by open_pipeline.
struct DataConfigArgs {
  std::string config;
  std::vector<std::string> sets;
  void add(CLI::App* app) {
    app->add_option("--config", config, "Run config (YAML/JSON) with a data section")->required();
    app->add_option("--set", sets, "Override a config value: key.path=value (repeatable), e.g. data.validation.num=1");
  }
};

/// A registered subcommand: run it if `app->parsed()`.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(Context&)> run;
};

/// `config show` (settings; torch-free), `config keys` and `config resolve` (the run
/// config's key tables and a run config written back whole: from the options' field
/// lists in the training library). `tools` is null in the torch-free `medfast`, which
/// hands those two over when needs_torch().
struct ConfigTools {
  /// Prints every run config key table (Markdown, or JSON with `json`).
  std::function<int(Context& ctx, bool json)> keys;
  /// Prints the run config at `config` ("" : the built-in default) with `sets` applied,
  /// every option written back with its value (JSON, which is YAML).
  std::function<int(Context& ctx, const std::string& config, const std::vector<std::string>& sets)> resolve;
};
struct ConfigCommand {
  Command command;
  std::function<bool()> needs_torch;
};
ConfigCommand register_config(CLI::App& root, const ConfigTools* tools);
/// medfast-torch's ConfigTools (cmd_train.cpp).
const ConfigTools& run_config_tools();
/// `info FILE` (torch-free) and `info --backends`: the backend self-check, run by
/// `backends` (cmd_info_backends.cpp in medfast-torch; null in the torch-free `medfast`,
/// which hands such a call over when needs_torch()). Returns the JSON report and prints
/// it (as text, or JSON with `json`).
using BackendsCheck = std::function<int(Context& ctx, bool json)>;
struct InfoCommand {
  Command command;
  std::function<bool()> needs_torch;
};
InfoCommand register_info(CLI::App& root, BackendsCheck backends);
/// medfast-torch's `info --backends` (cmd_info_backends.cpp).
int check_backends(Context& ctx, bool json);
Command register_data(CLI::App& root);
Command register_cache(CLI::App& root);
Command register_bench(CLI::App& root);
Command register_train(CLI::App& root);
Command register_infer(CLI::App& root);
Command register_eval(CLI::App& root);
Command register_export(CLI::App& root);
Command register_launch(CLI::App& root);
Command register_plan(CLI::App& root);
/// The run config `train` reads: the file at `path` (YAML/JSON; "": the built-in default
/// recipe for the device it would train on) with `sets` (--set key.path=value) applied.
nlohmann::json run_config_of(const std::string& path, const std::vector<std::string>& sets);
/// The run folder `plan` and `train --dataset` default to: runs/<the dataset folder's name>.
std::string dataset_run_dir(const std::string& dataset);
/// `train --dataset`: plans `dataset` (cmd_plan.cpp) for `epochs` (0: the plan's default) and
/// `validation` cases (negative: the plan's default), writes the plan to <run_dir>/plan.yaml
/// (its train.run_dir: that folder) and returns that path; prints the plan's summary unless
/// `quiet`.
std::string plan_for_training(const std::string& dataset, const std::string& run_dir, int epochs, int validation,
                              Context& ctx, bool quiet);
Command register_trace(CLI::App& root);
Command register_report(CLI::App& root);

/// `cache info|verify|prune`, added to `cache` (cmd_cache_dir.cpp, torch-free). `prune
/// --config` keeps the keys `keys_of` gives for that config (the pipeline's: null in the
/// torch-free `medfast`, which hands such a call to medfast-torch when needs_pipeline()).
using ConfigKeys = std::function<std::set<std::string>(const std::string& config, Context& ctx)>;
struct CacheDirCommand {
  Command command;
  std::function<bool()> needs_pipeline;
};
CacheDirCommand register_cache_dir(CLI::App* cache, ConfigKeys keys_of);

/// Device memory for `io load|store --device cuda[:N]` (cmd_io_device.cpp: libtorch's
/// tensors and the tensor engine's cuFile or pinned-bounce paths).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  /// Reads the whole buffer from `file` at `offset`; returns the bytes read.
  virtual std::size_t read(io::FileHandle& file, std::uint64_t offset) = 0;
  virtual void write(io::FileHandle& file, std::uint64_t offset) = 0;
  /// Copies the buffer into `dst` (host memory of the buffer's size).
  virtual void copy_to_host(void* dst) const = 0;
};
class DeviceIo {
 public:
  virtual ~DeviceIo() = default;
  /// `bytes` on `device` ("cuda" or "cuda:N"): a copy of `host` (`bytes` long), or zeros
  /// when `host` is null. Throws ValueError naming --device when there is no such device.
  virtual std::unique_ptr<DeviceBuffer> allocate(const std::string& device, std::size_t bytes,
                                                 const void* host) const = 0;
  /// How device memory is reached for `file` (cuFile or the pinned bounce).
  virtual std::string device_path(io::FileHandle& file) const = 0;
  /// What cuFile offers on this machine, in one line.
  virtual std::string device_transfers() const = 0;
};
/// medfast-torch's DeviceIo (cmd_io_device.cpp).
const DeviceIo& torch_device_io();

/// `io load|store|bench` (cmd_io.cpp, torch-free). Host memory needs nothing more;
/// --device cuda[:N] needs `device` (null in the torch-free `medfast`, which hands such a
/// call to medfast-torch when needs_device()).
struct IoCommand {
  Command command;
  std::function<bool()> needs_device;
};
IoCommand register_io(CLI::App& root, const DeviceIo* device);

/// Prints a JSON value to stdout (for --json).
void print_json(const std::string& dumped);

}  // namespace medfast::cli
