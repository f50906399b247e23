// medfast-torch: the whole command line (every subcommand), with libtorch. The `medfast`
// front (main_light.cpp) runs the commands that need no tensors itself and hands the
// others to this binary. A thin layer over the library: it parses flags, resolves
// settings (flag > env > file > default), runs one subcommand and turns exceptions into
// a one-line message and a non-zero exit code.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "app.hpp"
#include "commands.hpp"
#include "medfast/core/error.hpp"

namespace {

/// libtorch's warnings, each distinct message printed once: some come from every step
/// (an op without a deterministic kernel under train.deterministic on CUDA), and a
/// training log of thousands of copies hides everything else.
class OnceWarningHandler : public c10::WarningHandler {
 public:
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override { print(warning.msg()); }
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override { print(msg); }
#endif

 private:
  void print(const std::string& msg) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!seen_.insert(msg).second) return;
    std::fprintf(stderr, "medfast: libtorch warning (shown once): %s\n", msg.c_str());
  }
  std::mutex mutex_;
  std::set<std::string> seen_;
};

void install_once_warning_handler() {
  static OnceWarningHandler handler;
#if TORCH_VERSION_MAJOR >= 2
  c10::WarningUtils::set_warning_handler(&handler);
#else
  c10::Warning::set_warning_handler(&handler);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  using namespace medfast;
  install_once_warning_handler();
  CLI::App app{"medfast: fast end-to-end training of 3D medical-image segmentation models"};
  cli::Context ctx;
  std::map<std::string, std::string> flag_values;
  cli::configure_app(app, ctx, flag_values);

  std::vector<cli::Command> commands{cli::register_config(app, &cli::run_config_tools()).command, cli::register_info(app, &cli::check_backends).command, cli::register_data(app),
                                       cli::register_io(app, &cli::torch_device_io()).command, cli::register_cache(app),
                                       cli::register_bench(app), cli::register_train(app),
                                       cli::register_infer(app), cli::register_eval(app), cli::register_export(app),
                                       cli::register_launch(app), cli::register_plan(app), cli::register_trace(app),
                                       cli::register_report(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli::exit_on_parse_error(app, e);
  }

  try {
    cli::resolve_settings(app, ctx, flag_values);
    at::set_num_threads(ctx.settings.threads());
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
