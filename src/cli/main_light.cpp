// medfast: the command users run. It does not link libtorch: --version, --help, info,
// config show, cache info/verify/prune, io on the CPU, trace summarize and report run here at
// once (a few milliseconds, a few MB); every command that needs tensors (train, eval,
// infer, data, config keys/resolve, cache build and prune --config, io with --device cuda, bench, launch)
// is handed, arguments unchanged, to medfast-torch beside this binary (exec: same
// process id, so signals, exit codes and the terminal behave as if it ran here).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "app.hpp"
#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/process.hpp"

namespace medfast::cli {
namespace {

/// medfast-torch: $MEDFAST_TORCH_BINARY, else beside this executable.
std::string torch_binary() {
  if (const char* p = std::getenv("MEDFAST_TORCH_BINARY"); p && *p) return p;
  return os::parent_directory(os::self_executable()) + "/medfast-torch";
}

[[noreturn]] void hand_over(int argc, char** argv) {
  const std::string binary = torch_binary();
  std::vector<std::string> args{binary};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  os::exec_program(binary, args);  // returns only by throwing
}

}  // namespace
}  // namespace medfast::cli

int main(int argc, char** argv) {
  using namespace medfast;
  os::mark_command_start();  // process_seconds counts from here, across the exec to medfast-torch
  CLI::App app{"medfast: fast end-to-end training of 3D medical-image segmentation models"};
  cli::Context ctx;
  std::map<std::string, std::string> flag_values;
  cli::configure_app(app, ctx, flag_values);
  const cli::InfoCommand info = cli::register_info(app, nullptr);
  const cli::ConfigCommand config = cli::register_config(app, nullptr);
  std::vector<cli::Command> commands{config.command, info.command, cli::register_trace(app),
                                       cli::register_report(app)};
  // The others by name: whatever follows is theirs (their own --help included).
  std::vector<CLI::App*> handed;
  CLI::App* cache = app.add_subcommand("cache", "Build and maintain the persistent preprocessing cache");
  cache->require_subcommand(1);
  const cli::CacheDirCommand cache_dir = cli::register_cache_dir(cache, nullptr);
  commands.push_back(cache_dir.command);
  const cli::IoCommand io = cli::register_io(app, nullptr);
  commands.push_back(io.command);
  CLI::App* cache_build =
      cache->add_subcommand("build", "Run the deterministic chain of CFG over its dataset into the disk cache");
  cache_build->prefix_command();
  cache_build->allow_extras();
  cache_build->set_help_flag();
  handed.push_back(cache_build);
  for (const auto& [name, description] : cli::torch_commands()) {
    CLI::App* sub = app.add_subcommand(name, description);
    sub->prefix_command();
    sub->allow_extras();
    sub->set_help_flag();
    handed.push_back(sub);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // `medfast train --help`: the help is the full binary's (this one knows only the name).
    try {
      for (const CLI::App* sub : handed) {
        if (sub->parsed()) cli::hand_over(argc, argv);
      }
    } catch (const std::exception& x) {
      std::fprintf(stderr, "medfast: error: %s\n", x.what());
      return 1;
    }
    return cli::exit_on_parse_error(app, e);
  }

  try {
    for (const CLI::App* sub : handed) {
      if (sub->parsed()) cli::hand_over(argc, argv);
    }
    if (cache_dir.needs_pipeline() || io.needs_device() || info.needs_torch() || config.needs_torch()) {
      cli::hand_over(argc, argv);
    }
    cli::resolve_settings(app, ctx, flag_values);
    for (auto& c : commands) {
      if (c.app->parsed()) return c.run(ctx);
    }
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "medfast: error: %s\n", e.what());
    return 1;
  }
}
