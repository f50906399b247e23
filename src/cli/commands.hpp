#pragma once
/// \file The CLI's subcommand interface: each file registers one subcommand.

#include <CLI/CLI.hpp>
#include <functional>
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

/// Prints a JSON value to stdout (for --json).
void print_json(const std::string& dumped);

}  // namespace medfast::cli
