// medfast config show: every setting, its value and where the value came from.
// medfast config keys / resolve: a run config's keys, and a run config written back whole.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "commands.hpp"

namespace medfast::cli {

ConfigCommand register_config(CLI::App& root, const ConfigTools* tools) {
  auto* config = root.add_subcommand("config", "Inspect medfast's settings and run configs");
  config->require_subcommand(1);
  auto* keys = config->add_subcommand("keys", "Print every run config key: its default and meaning (docs/config.md)");
  auto keys_json = std::make_shared<bool>(false);
  keys->add_flag("--json", *keys_json, "Print JSON");
  struct ResolveArgs {
    std::string config;
    std::vector<std::string> sets;
  };
  auto ra = std::make_shared<ResolveArgs>();
  auto* resolve = config->add_subcommand(
      "resolve", "Print a run config with every option's value, defaults included (what `train` would run)");
  resolve->add_option("--config", ra->config, "Run config (YAML/JSON); absent: the built-in default");
  resolve->add_option("--set", ra->sets, "Override a value: key.path=value (repeatable)");
  auto* show = config->add_subcommand("show", "Print every setting, its value and its source (flag > env > file > default)");
  auto json = std::make_shared<bool>(false);
  show->add_flag("--json", *json, "Print JSON");
  ConfigCommand c;
  c.command.app = config;
  c.needs_torch = [=] { return !tools && (keys->parsed() || resolve->parsed()); };
  c.command.run = [=](Context& ctx) {
    if (keys->parsed()) return tools->keys(ctx, *keys_json);
    if (resolve->parsed()) return tools->resolve(ctx, ra->config, ra->sets);
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
