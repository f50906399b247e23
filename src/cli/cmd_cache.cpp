// medfast cache build|verify|info|prune: the persistent disk cache.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/cache/entry.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/os/file.hpp"

namespace medfast::cli {

namespace {

struct DirListing {
  std::vector<std::string> entries;  ///< *.mfc
  std::vector<std::string> temps;    ///< *.tmp-* left by interrupted writers
};

DirListing list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw OsError(str("cannot list cache folder ", dir, ": ", std::strerror(errno)), errno);
  DirListing l;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.find(".tmp-") != std::string::npos) l.temps.push_back(dir + "/" + name);
    else if (name.size() > 4 && name.compare(name.size() - 4, 4, cache::kEntrySuffix) == 0) l.entries.push_back(dir + "/" + name);
  }
  ::closedir(d);
  std::sort(l.entries.begin(), l.entries.end());
  std::sort(l.temps.begin(), l.temps.end());
  return l;
}

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
  const bool tty = ::isatty(2) && !a.json;
  const data::FillReport r = ds.fill([&](std::size_t done, std::size_t total) {
    if (tty) std::fprintf(stderr, "\rcache build: %zu/%zu items", done, total);
  });
  if (tty) std::fprintf(stderr, "\n");
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
  const DirListing l = list_dir(a.dir);
  const auto io = io::IoOptions::from(ctx.settings);
  std::size_t valid = 0;
  nlohmann::json bad = nlohmann::json::array();
  for (const auto& path : l.entries) {
    try {
      const auto meta = cache::read_entry_meta(path);
      cache::read_entry(path, meta.value("key", ""), io);  // every payload checksum
      ++valid;
    } catch (const Error& e) {
      bad.push_back({{"path", path}, {"error", e.what()}});
    }
  }
  if (a.json) {
    print_json(nlohmann::json{{"dir", a.dir}, {"entries", l.entries.size()}, {"valid", valid}, {"corrupt", bad},
                              {"temporary_files", l.temps.size()}}
                   .dump(2));
  } else {
    std::printf("cache verify %s: %zu entries, %zu valid, %zu corrupt, %zu temporary files\n", a.dir.c_str(),
                l.entries.size(), valid, bad.size(), l.temps.size());
    for (const auto& b : bad) std::printf("  corrupt: %s\n", b["error"].get<std::string>().c_str());
  }
  if (!bad.empty()) {
    std::fprintf(stderr, "medfast: error: %zu corrupt cache entries in %s (medfast cache prune --dir %s removes them)\n",
                 bad.size(), a.dir.c_str(), a.dir.c_str());
    return 1;
  }
  return 0;
}

int run_info(const DirArgs& a) {
  const DirListing l = list_dir(a.dir);
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> chains;
  std::uint64_t total = 0;
  std::size_t unreadable = 0;
  for (const auto& path : l.entries) {
    const std::uint64_t size = os::stat(path).size;
    total += size;
    try {
      const auto meta = cache::read_entry_meta(path);
      auto& c = chains[meta.value("chain", "?")];
      ++c.first;
      c.second += size;
    } catch (const Error&) {
      ++unreadable;
    }
  }
  if (a.json) {
    nlohmann::json cj = nlohmann::json::object();
    for (const auto& [h, c] : chains) cj[h] = {{"entries", c.first}, {"bytes", c.second}};
    print_json(nlohmann::json{{"dir", a.dir}, {"entries", l.entries.size()}, {"bytes", total}, {"chains", cj},
                              {"unreadable", unreadable}, {"temporary_files", l.temps.size()}}
                   .dump(2));
    return 0;
  }
  std::printf("cache %s: %zu entries, %s", a.dir.c_str(), l.entries.size(), format_bytes(total).c_str());
  if (!l.entries.empty()) std::printf(" (%s per entry)", format_bytes(total / l.entries.size()).c_str());
  std::printf(", format version %u\n", cache::kEntryFormatVersion);
  for (const auto& [h, c] : chains) {
    std::printf("  chain %s: %zu entries, %s\n", h.c_str(), c.first, format_bytes(c.second).c_str());
  }
  if (unreadable) std::printf("  %zu entries are unreadable (run cache verify)\n", unreadable);
  if (!l.temps.empty()) std::printf("  %zu temporary files from interrupted writes (cache prune removes them)\n", l.temps.size());
  return 0;
}

int run_prune(const DirArgs& a, Context& ctx) {
  const DirListing l = list_dir(a.dir);
  std::set<std::string> keep;  // with --config: the keys it would use
  if (!a.config.empty()) {
    const data::PipelineConfig cfg = data::load_pipeline(a.config, ctx.settings);
    data::CachedDataset ds = data::make_cached_dataset(cfg);
    for (std::size_t i = 0; i < ds.size(); ++i) keep.insert(ds.key(i));
  }
  std::size_t temps = 0, corrupt = 0, stale = 0;
  std::uint64_t freed = 0;
  // Temporary files: only those whose writer is gone (pid not running).
  for (const auto& t : l.temps) {
    const auto pos = t.rfind(".tmp-");
    const int pid = std::atoi(t.c_str() + pos + 5);
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) == 0) continue;  // a live writer
    freed += os::stat(t).size;
    os::remove_file(t);
    ++temps;
  }
  for (const auto& path : l.entries) {
    bool remove = false;
    try {
      const auto meta = cache::read_entry_meta(path);
      if (!keep.empty() && !keep.count(meta.value("key", ""))) {
        remove = true;
        ++stale;
      }
    } catch (const Error&) {
      remove = true;
      ++corrupt;
    }
    if (remove) {
      freed += os::stat(path).size;
      os::remove_file(path);
    }
  }
  if (a.json) {
    print_json(nlohmann::json{{"dir", a.dir}, {"temporary_removed", temps}, {"corrupt_removed", corrupt},
                              {"stale_removed", stale}, {"bytes_freed", freed}}
                   .dump(2));
  } else {
    std::printf("cache prune %s: removed %zu temporary, %zu corrupt, %zu stale entries; freed %s\n", a.dir.c_str(),
                temps, corrupt, stale, format_bytes(freed).c_str());
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
