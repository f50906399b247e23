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
#include "medfast/core/progress.hpp"
#include "medfast/cache/entry.hpp"
#include "medfast/cache/folder.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/os/file.hpp"

namespace medfast::cli {

namespace {

struct BuildArgs {
  std::string config;
  bool json = false;
};

int run_build(const BuildArgs& a, Context& ctx) {
  const data::PipelineConfig cfg = data::load_pipeline(a.config, ctx.settings);
  if (cfg.smart || (cfg.cache.store.kind != "disk" && cfg.cache.store.kind != "disk_device")) {
    throw ValueError(str(a.config, ": data.cache.kind is ", cfg.smart ? std::string("smart") : cfg.cache.store.kind,
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

struct DirArgs {
  std::string dir;
  bool json = false;
  std::string config;  ///< prune: keep only this config's entries
};

int run_verify(const DirArgs& a, Context& ctx) {
  const cache::VerifyReport r = cache::verify_folder(a.dir, io::IoOptions::from(ctx.settings));
  if (a.json) {
    nlohmann::json bad = nlohmann::json::array();
    for (const auto& [path, error] : r.corrupt) bad.push_back({{"path", path}, {"error", error}});
    print_json(nlohmann::json{{"dir", a.dir}, {"entries", r.entries}, {"valid", r.valid}, {"corrupt", bad},
                              {"temporary_files", r.temporary_files}}
                   .dump(2));
  } else {
    std::printf("cache verify %s: %zu entries, %zu valid, %zu corrupt, %zu temporary files\n", a.dir.c_str(),
                r.entries, r.valid, r.corrupt.size(), r.temporary_files);
    for (const auto& [path, error] : r.corrupt) std::printf("  corrupt: %s\n", error.c_str());
  }
  if (!r.corrupt.empty()) {
    std::fprintf(stderr, "medfast: error: %zu corrupt cache entries in %s (medfast cache prune --dir %s removes them)\n",
                 r.corrupt.size(), a.dir.c_str(), a.dir.c_str());
    return 1;
  }
  return 0;
}

int run_info(const DirArgs& a) {
  const cache::FolderInfo info = cache::folder_info(a.dir);
  if (a.json) {
    nlohmann::json cj = nlohmann::json::object();
    for (const auto& [h, c] : info.chains) cj[h] = {{"entries", c.first}, {"bytes", c.second}};
    print_json(nlohmann::json{{"dir", a.dir}, {"entries", info.entries}, {"bytes", info.bytes}, {"chains", cj},
                              {"unreadable", info.unreadable}, {"temporary_files", info.temporary_files}}
                   .dump(2));
    return 0;
  }
  std::printf("cache %s: %zu entries, %s", a.dir.c_str(), info.entries, format_bytes(info.bytes).c_str());
  if (info.entries) std::printf(" (%s per entry)", format_bytes(info.bytes / info.entries).c_str());
  std::printf(", format version %u\n", cache::kEntryFormatVersion);
  for (const auto& [h, c] : info.chains) {
    std::printf("  chain %s: %zu entries, %s\n", h.c_str(), c.first, format_bytes(c.second).c_str());
  }
  if (info.unreadable) std::printf("  %zu entries are unreadable (run cache verify)\n", info.unreadable);
  if (info.temporary_files) {
    std::printf("  %zu temporary files from interrupted writes (cache prune removes them)\n", info.temporary_files);
  }
  return 0;
}

int run_prune(const DirArgs& a, Context& ctx) {
  std::set<std::string> keep;  // with --config: the keys it would use
  if (!a.config.empty()) {
    const data::PipelineConfig cfg = data::load_pipeline(a.config, ctx.settings);
    data::CachedDataset ds = data::make_cached_dataset(cfg);
    for (std::size_t i = 0; i < ds.size(); ++i) keep.insert(ds.key(i));
  }
  const cache::PruneReport r = cache::prune_folder(a.dir, keep);
  if (a.json) {
    print_json(nlohmann::json{{"dir", a.dir}, {"temporary_removed", r.temporary_removed},
                              {"corrupt_removed", r.corrupt_removed}, {"stale_removed", r.stale_removed},
                              {"bytes_freed", r.bytes_freed}}
                   .dump(2));
  } else {
    std::printf("cache prune %s: removed %zu temporary, %zu corrupt, %zu stale entries; freed %s\n", a.dir.c_str(),
                r.temporary_removed, r.corrupt_removed, r.stale_removed, format_bytes(r.bytes_freed).c_str());
  }
  return 0;
}

}  // namespace

Command register_cache(CLI::App& root) {
  auto* cache = root.add_subcommand("cache", "Build and maintain the persistent preprocessing cache");
  cache->require_subcommand(1);
  auto ba = std::make_shared<BuildArgs>();
  auto* build = cache->add_subcommand("build", "Run the deterministic chain of CFG over its dataset into the disk cache");
  build->add_option("--config", ba->config, "Run config (YAML/JSON) with a data section")->required();
  build->add_flag("--json", ba->json, "Print JSON");
  auto va = std::make_shared<DirArgs>();
  auto* verify = cache->add_subcommand("verify", "Check every entry's checksums; non-zero exit if any is corrupt");
  verify->add_option("--dir", va->dir, "Cache folder")->required();
  verify->add_flag("--json", va->json, "Print JSON");
  auto ia = std::make_shared<DirArgs>();
  auto* info = cache->add_subcommand("info", "Entries, bytes and chains in a cache folder");
  info->add_option("--dir", ia->dir, "Cache folder")->required();
  info->add_flag("--json", ia->json, "Print JSON");
  auto pa = std::make_shared<DirArgs>();
  auto* prune = cache->add_subcommand("prune", "Remove temporary files of dead writers, corrupt entries, and with "
                                               "--config the entries that config no longer uses");
  prune->add_option("--dir", pa->dir, "Cache folder")->required();
  prune->add_option("--config", pa->config, "Keep only the entries of this config");
  prune->add_flag("--json", pa->json, "Print JSON");
  Command c;
  c.app = cache;
  c.run = [=](Context& ctx) {
    if (build->parsed()) return run_build(*ba, ctx);
    if (verify->parsed()) return run_verify(*va, ctx);
    if (info->parsed()) return run_info(*ia);
    return run_prune(*pa, ctx);
  };
  return c;
}

}  // namespace medfast::cli
