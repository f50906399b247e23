// medfast: the command line. A thin layer over the library: it parses flags,
// resolves settings (flag > env > file > default), runs one subcommand and
// turns exceptions into a one-line message and a non-zero exit code.
#include <ATen/Parallel.h>
#include <torch/csrc/api/include/torch/version.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <vector>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"
#include "medfast/version.hpp"

namespace {

std::string version_string() {
  return medfast::str("medfast ", medfast::kVersion, " (libtorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
                      ".", TORCH_VERSION_PATCH, ")");
}

}  // namespace

namespace medfast::cli {
void print_json(const std::string& dumped) { std::cout << dumped << std::endl; }
}  // namespace medfast::cli

int main(int argc, char** argv) {
  using namespace medfast;
  CLI::App app{"medfast: fast end-to-end training of 3D medical-image segmentation models"};
  app.name("medfast");
  app.set_version_flag("--version", version_string());
  app.require_subcommand(1);
  app.fallthrough();  // settings flags may come after the subcommand

  cli::Context ctx;
  // One flag per declared setting, generated from the registry.
  std::map<std::string, std::string> flag_values;
  for (const auto& d : setting_defs()) {
    app.add_option(d.flag(), flag_values[d.name],
                   str(d.description, " [env ", d.env_var(), ", default ", d.default_value, "]"))
        ->group("Settings");
  }
  app.add_option("--config-file", ctx.config_file, "YAML/JSON file whose 'settings:' map sets defaults [env MEDFAST_CONFIG_FILE]")
      ->group("Settings");

  std::vector<cli::Command> commands{cli::register_config(app), cli::register_info(app), cli::register_data(app),
                                       cli::register_io(app), cli::register_cache(app),
                                       cli::register_bench(app), cli::register_train(app),
                                       cli::register_infer(app), cli::register_eval(app),
                                       cli::register_launch(app), cli::register_trace(app),
                                       cli::register_report(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (ctx.config_file.empty()) {
      if (const char* f = std::getenv("MEDFAST_CONFIG_FILE")) ctx.config_file = f;
    }
    if (!ctx.config_file.empty()) {
      load_settings_text(ctx.settings, os::read_text_file(ctx.config_file), ctx.config_file);
    }
    ctx.settings.load_env();
    for (const auto& d : setting_defs()) {
      if (app.count(d.flag()) > 0) ctx.settings.set(d.name, flag_values[d.name], SettingSource::flag, d.flag());
    }
    log::set_level(log::parse_level(ctx.settings.get("log_level")));
    log::set_sink([](log::Level level, const std::string& message) {
      std::fprintf(stderr, "medfast: %s: %s\n", log::level_name(level), message.c_str());
    });
    at::set_num_threads(ctx.settings.threads());
    os::set_buffer_pool_limit(ctx.settings.get_bytes("buffer_pool_bytes"));

    for (auto& c : commands) {
      if (c.app->parsed()) return c.run(ctx);
    }
    return 2;
  } catch (const c10::Error& e) {  // libtorch's own: the message without its C++ backtrace
    std::fprintf(stderr, "medfast: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "medfast: error: %s\n", e.what());
    return 1;
  }
}
