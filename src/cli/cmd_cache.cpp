// medfast cache build|verify|info|prune: the persistent disk cache.
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include <memory>

#include "commands.hpp"
#include "medfast/cache/entry.hpp"
#include "medfast/cache/folder.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/progress.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/os/file.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::cli {

data::PipelineConfig open_pipeline(const std::string& config, const std::vector<std::string>& sets,
                                   const Context& ctx) {
  nlohmann::json json = data::load_yaml_as_json(config);
  for (const auto& s : sets) train::apply_override(json, s);
  return data::open_pipeline(json, config, os::parent_directory(config), ctx.settings);
}

namespace {

struct BuildArgs : DataConfigArgs {
  bool json = false;
};

int run_build(const BuildArgs& a, Context& ctx) {
  const data::PipelineConfig cfg = open_pipeline(a.config, a.sets, ctx);
  if (cfg.smart() || !cache::on_disk(cfg.cache.store.kind)) {
    throw ValueError(str(a.config, ": data.cache.kind is ", cfg.cache_options.kind,
                         "; cache build fills a persistent cache (disk or disk_device)"));
  }
  data::CachedDataset ds = data::make_cached_dataset(cfg);
  std::unique_ptr<Progress> progress;
  const auto started = std::chrono::steady_clock::now();
  const Progress::Style style = a.json ? Progress::Style::off : Progress::style_from(ctx.settings.get("progress"));
  const data::FillReport r = ds.fill([&](std::size_t done, std::size_t total) {
    if (!progress) progress = std::make_unique<Progress>("cache build", total, "items", style, stderr, 30.0, started);
    progress->update(done);
  });
  if (progress) progress->finish(/*clear=*/true);
  const auto st = ds.store().stats();
  std::uint64_t on_disk = 0;
  for (std::size_t i = 0; i < ds.size() && i < r.items; ++i) {
    on_disk += os::stat(cache::entry_path(cfg.cache.store.dir, ds.key(i))).size;
  }
  nlohmann::json j = {{"config", a.config},       {"dir", cfg.cache.store.dir},
                      {"items", r.items},         {"computed", r.computed},
                      {"reused", r.reused},       {"seconds", r.seconds},
                      {"bytes_written", st.bytes}, {"bytes_on_disk", on_disk},
                      {"chain", ds.chain().hash()}, {"rank", cfg.cache.rank},
                      {"world_size", cfg.cache.world_size}};
  if (a.json) {
    print_json(j.dump(2));
  } else {
    std::printf("cache build: %zu items (%zu computed, %zu reused) in %.1f s; %s on disk in %s\n", r.items, r.computed,
                r.reused, r.seconds, format_bytes(on_disk).c_str(), cfg.cache.store.dir.c_str());
  }
  return 0;
}

}  // namespace

Command register_cache(CLI::App& root) {
  auto* cache = root.add_subcommand("cache", "Build and maintain the persistent preprocessing cache");
  cache->require_subcommand(1);
  auto ba = std::make_shared<BuildArgs>();
  auto* build = cache->add_subcommand("build", "Run the deterministic chain of CFG over its dataset into the disk cache");
  ba->add(build);
  build->add_flag("--json", ba->json, "Print JSON");
  const CacheDirCommand dir = register_cache_dir(cache, [](const std::string& config, Context& ctx) {
    const data::PipelineConfig cfg = open_pipeline(config, {}, ctx);
    data::CachedDataset ds = data::make_cached_dataset(cfg);
    std::set<std::string> keys;
    for (std::size_t i = 0; i < ds.size(); ++i) keys.insert(ds.key(i));
    return keys;
  });
  Command c;
  c.app = cache;
  c.run = [=](Context& ctx) {
    if (build->parsed()) return run_build(*ba, ctx);
    return dir.command.run(ctx);
  };
  return c;
}

}  // namespace medfast::cli
