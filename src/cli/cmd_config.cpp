// medfast config show: every setting, its value and where the value came from.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"

namespace medfast::cli {

Command register_config(CLI::App& root) {
  auto* config = root.add_subcommand("config", "Inspect medfast's settings");
  config->require_subcommand(1);
  auto* show = config->add_subcommand("show", "Print every setting, its value and its source (flag > env > file > default)");
  auto json = std::make_shared<bool>(false);
  show->add_flag("--json", *json, "Print JSON");
  Command c;
  c.app = config;
  c.run = [json](Context& ctx) {
    if (*json) {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& d : setting_defs()) {
        const auto& e = ctx.settings.entry(d.name);
        out[d.name] = {{"value", e.value}, {"source", source_name(e.source)}, {"origin", e.origin},
                       {"env", d.env_var()}, {"default", d.default_value}, {"description", d.description}};
      }
      print_json(out.dump(2));
      return 0;
    }
    std::printf("%-20s %-14s %-8s %s\n", "SETTING", "VALUE", "SOURCE", "ENV / DESCRIPTION");
    for (const auto& d : setting_defs()) {
      const auto& e = ctx.settings.entry(d.name);
      std::string src = source_name(e.source);
      if (!e.origin.empty()) src += " (" + e.origin + ")";
      std::printf("%-20s %-14s %-8s %s\n%-44s %s\n", d.name.c_str(), e.value.c_str(), src.c_str(),
                  d.env_var().c_str(), "", d.description.c_str());
    }
    return 0;
  };
  return c;
}

}  // namespace medfast::cli
