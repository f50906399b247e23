#pragma once
/// \file The CLI's subcommand interface: each file registers one subcommand.

#include <CLI/CLI.hpp>
#include <functional>
#include <set>
#include <string>

#include "medfast/core/settings.hpp"

namespace medfast::cli {

/// What every subcommand gets when it runs.
struct Context {
  Settings settings;
  std::string config_file;  ///< settings file used, if any
};

/// A registered subcommand: run it if `app->parsed()`.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(Context&)> run;
};

Command register_config(CLI::App& root);
Command register_info(CLI::App& root);
Command register_data(CLI::App& root);
Command register_io(CLI::App& root);
Command register_cache(CLI::App& root);
Command register_bench(CLI::App& root);
Command register_train(CLI::App& root);
Command register_infer(CLI::App& root);
Command register_eval(CLI::App& root);
Command register_launch(CLI::App& root);
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

/// Prints a JSON value to stdout (for --json).
void print_json(const std::string& dumped);

}  // namespace medfast::cli
