#include "app.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"
#include "medfast/torch_version.hpp"
#include "medfast/version.hpp"

namespace medfast::cli {

void print_json(const std::string& dumped) { std::cout << dumped << std::endl; }

void configure_app(CLI::App& app, Context& ctx, std::map<std::string, std::string>& flag_values) {
  app.name("medfast");
  app.set_version_flag("--version", version_string());
  app.require_subcommand(1);
  app.fallthrough();  // settings flags may come after the subcommand
  for (const auto& d : setting_defs()) {
    app.add_option(d.flag(), flag_values[d.name],
                   str(d.description, " [env ", d.env_var(), ", default ", d.default_value, "]"))
        ->group("Settings");
  }
  app.add_option("--config-file", ctx.config_file, "YAML/JSON file whose 'settings:' map sets defaults [env MEDFAST_CONFIG_FILE]")
      ->group("Settings");
}

void resolve_settings(const CLI::App& app, Context& ctx, const std::map<std::string, std::string>& flag_values) {
  if (ctx.config_file.empty()) {
    if (const char* f = std::getenv("MEDFAST_CONFIG_FILE")) ctx.config_file = f;
  }
  if (!ctx.config_file.empty()) load_settings_text(ctx.settings, os::read_text_file(ctx.config_file), ctx.config_file);
  ctx.settings.load_env();
  for (const auto& d : setting_defs()) {
    if (app.count(d.flag()) > 0) ctx.settings.set(d.name, flag_values.at(d.name), SettingSource::flag, d.flag());
  }
  log::set_level(log::parse_level(ctx.settings.get("log_level")));
  log::set_sink([](log::Level level, const std::string& message) {
    std::fprintf(stderr, "medfast: %s: %s\n", log::level_name(level), message.c_str());
  });
  os::set_buffer_pool_limit(ctx.settings.get_bytes("buffer_pool_bytes"));
}

int exit_on_parse_error(CLI::App& app, const CLI::ParseError& e) {
  const std::vector<std::string> rest = app.remaining();
  if (app.get_subcommands().empty() && !rest.empty() && !rest.front().empty() && rest.front()[0] != '-') {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    std::fprintf(stderr, "medfast: error: '%s' is not a medfast command (%s); medfast --help says what each does\n",
                 rest.front().c_str(), names.c_str());
    return e.get_exit_code();
  }
  return app.exit(e);
}

std::string version_string() {
  auto on = [](bool b) { return b ? "on" : "off"; };
  return str("medfast ", kVersion, " (libtorch ", kTorchVersion, " ", kTorchDevices, "; compressed DICOM decoders ",
             on(build::kDicomCodecs),
             ", DICOM writing (GDCM) ", on(build::kGdcm), ", io_uring ", on(build::kIoUring), ")");
}

const std::vector<std::pair<std::string, std::string>>& torch_commands() {
  static const std::vector<std::pair<std::string, std::string>> commands{
      {"data", "Datasets"},
      {"bench", "Built-in benchmarks"},
      {"train", "Train a segmentation network (no --config: the built-in default on a synthetic dataset)"},
      {"infer", "Segment NIfTI files or DICOM series with a checkpoint; predictions (NIfTI) on the input's grid"},
      {"eval", "Dice per case and mean of a checkpoint on a config's validation items"},
      {"export", "A checkpoint's network for MONAI: model.pt (state_dict) and a bundle config"},
      {"plan", "Plan a run from a dataset (nnU-Net's rules): spacing, normalization, patch, batch, network"},
      {"launch", "Start N ranks of a medfast command on this machine (torchrun's variables, one GPU per rank)"}};
  return commands;
}

}  // namespace medfast::cli
