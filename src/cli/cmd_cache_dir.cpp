// `medfast cache info|verify|prune`: torch-free (in the `medfast` binary itself, no
// libtorch load); `prune --config` needs the pipeline and is handed over (see commands.hpp).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/cache/entry_file.hpp"
#include "medfast/cache/folder.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/io/file_handle.hpp"

namespace medfast::cli {

namespace {

struct DirArgs {
  std::string dir;
  bool json = false;
  std::string config;  ///< prune: keep only this config's entries
  bool dry_run = false;  ///< prune: list what would go, remove nothing
  bool force = false;    ///< prune --config: also where none of the folder's entries is the config's
};

int run_verify(const DirArgs& a, Context& ctx) {
  const cache::VerifyReport r = cache::verify_folder(a.dir, io::IoOptions::from(ctx.settings));
  if (a.json) {
    nlohmann::json bad = nlohmann::json::array();
    for (const auto& [path, error] : r.corrupt) bad.push_back({{"path", path}, {"error", error}});
    print_json(nlohmann::json{{"dir", a.dir}, {"entries", r.entries}, {"valid", r.valid}, {"corrupt", bad},
                              {"temporary_files", r.temporary_files}, {"not_entries", r.foreign},
                              {"not_regular_files", [&] {
                                 nlohmann::json j = nlohmann::json::array();
                                 for (const auto& [path, kind] : r.irregular) j.push_back({{"path", path}, {"kind", kind}});
                                 return j;
                               }()},
                              {"marked", r.marked}}
                   .dump(2));
  } else {
    std::printf("cache verify %s: %zu entries, %zu valid, %zu corrupt, %zu temporary files\n", a.dir.c_str(),
                r.entries, r.valid, r.corrupt.size(), r.temporary_files);
    for (const auto& [path, error] : r.corrupt) std::printf("  corrupt: %s\n", error.c_str());
    for (const auto& path : r.foreign) {
      const auto it = std::find_if(r.irregular.begin(), r.irregular.end(), [&](const auto& x) { return x.first == path; });
      std::printf("  not a cache entry (left alone): %s%s\n", path.c_str(),
                  it == r.irregular.end() ? "" : (": " + it->second + ", not a regular file").c_str());
    }
    if (!r.marked) std::printf("  the folder has no cache mark (.medfast.json): prune will not touch it\n");
  }
  if (!r.irregular.empty()) {  // named as entries, never opened: something is wrong with the folder
    std::fprintf(stderr,
                 "medfast: error: %zu files named as cache entries in %s are not regular files (%s: %s); medfast "
                 "left them alone: remove them yourself\n",
                 r.irregular.size(), a.dir.c_str(), r.irregular[0].first.c_str(), r.irregular[0].second.c_str());
    return 1;
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
                              {"unreadable", info.unreadable}, {"temporary_files", info.temporary_files},
                              {"not_entries", info.foreign}, {"marked", info.marked}}
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
    std::printf("  %zu temporary files from interrupted writes (cache prune removes those whose writer is gone)\n",
                info.temporary_files);
  }
  if (info.foreign) std::printf("  %zu files named *.mfc are not cache entries (left alone)\n", info.foreign);
  if (!info.marked) std::printf("  the folder has no cache mark (.medfast.json): prune will not touch it\n");
  return 0;
}

/// "/data/a/dataset.json (3), /data/b/dataset.json (1)": where a folder's entries came from.
std::string dataset_counts(const std::map<std::string, std::size_t>& datasets) {
  std::string out;
  for (const auto& [d, n] : datasets) out += str(out.empty() ? "" : ", ", d.empty() ? "an unnamed dataset" : d, " (", n, ")");
  return out.empty() ? "none" : out;
}

nlohmann::json file_json(const cache::PruneFile& f) {
  nlohmann::json j{{"path", f.path}, {"bytes", f.bytes}, {"why", cache::prune_reason(f.why)}, {"dataset", f.dataset}};
  if (!f.detail.empty()) j["detail"] = f.detail;
  return j;
}

int run_prune(const DirArgs& a, Context& ctx, const ConfigKeys& keys_of) {
  std::set<std::string> keep;  // with --config: the keys it would use
  if (!a.config.empty()) {
    if (!keys_of) throw ValueError("cache prune --config needs the pipeline (medfast-torch)");
    keep = keys_of(a.config, ctx);
  }
  const cache::PrunePlan plan = cache::plan_prune(a.dir, keep);
  // A config none of whose entries is here, in a folder that holds entries, is almost surely
  // the wrong config or the wrong folder: removing everything would cost the whole fill.
  if (!a.config.empty() && plan.kept == 0 && !plan.datasets.empty() && !a.force) {
    throw ValueError(str("cache prune: none of the ", plan.entries, " entries of ", a.dir, " is one that ", a.config,
                         " computes (the folder's entries come from ", dataset_counts(plan.datasets),
                         "): the wrong config or folder? Nothing was removed; --dry-run lists what would go, --force "
                         "removes it"));
  }
  std::uint64_t bytes = 0;
  for (const auto& f : plan.files) bytes += f.bytes;
  if (a.dry_run) {
    if (a.json) {
      nlohmann::json files = nlohmann::json::array();
      for (const auto& f : plan.files) files.push_back(file_json(f));
      print_json(nlohmann::json{{"dir", a.dir}, {"dry_run", true}, {"would_remove", files}, {"bytes", bytes},
                                {"entries", plan.entries}, {"kept", plan.kept}}
                     .dump(2));
      return 0;
    }
    std::printf("cache prune %s --dry-run: would remove %zu files (%s) and keep %zu of %zu entries\n", a.dir.c_str(),
                plan.files.size(), format_bytes(bytes).c_str(), plan.kept, plan.entries);
    for (const auto& f : plan.files) {
      std::printf("  %s  %s  %s%s%s\n", f.path.c_str(), format_bytes(f.bytes).c_str(), cache::prune_reason(f.why),
                  f.dataset.empty() ? "" : str(", from ", f.dataset).c_str(),
                  f.detail.empty() ? "" : str(": ", f.detail).c_str());
    }
    return 0;
  }
  const cache::PruneReport r = cache::prune_folder(a.dir, keep);
  std::map<std::string, std::size_t> removed_from;  // stale and corrupt entries, by dataset
  for (const auto& f : r.removed) {
    if (f.why != cache::PruneFile::Why::dead_writer) ++removed_from[f.dataset];
  }
  if (a.json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : r.removed) files.push_back(file_json(f));
    print_json(nlohmann::json{{"dir", a.dir}, {"temporary_removed", r.temporary_removed},
                              {"corrupt_removed", r.corrupt_removed}, {"stale_removed", r.stale_removed},
                              {"bytes_freed", r.bytes_freed}, {"removed", files}}
                   .dump(2));
  } else {
    std::printf("cache prune %s: removed %zu temporary, %zu corrupt, %zu stale entries; freed %s\n", a.dir.c_str(),
                r.temporary_removed, r.corrupt_removed, r.stale_removed, format_bytes(r.bytes_freed).c_str());
    if (!removed_from.empty()) std::printf("  entries removed came from: %s\n", dataset_counts(removed_from).c_str());
  }
  return 0;
}

}  // namespace

CacheDirCommand register_cache_dir(CLI::App* cache, ConfigKeys keys_of) {
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
  prune->add_option("--config", pa->config,
                    "Keep only the entries of this config (refused, naming both, where none of the folder's entries "
                    "is this config's: --force)");
  prune->add_flag("--dry-run", pa->dry_run, "List what would be removed (path, size, why, dataset); remove nothing");
  prune->add_flag("--force", pa->force, "With --config: remove the stale entries even where none is the config's");
  prune->add_flag("--json", pa->json, "Print JSON");
  CacheDirCommand c;
  c.command.app = cache;
  c.command.run = [=](Context& ctx) {
    if (verify->parsed()) return run_verify(*va, ctx);
    if (info->parsed()) return run_info(*ia);
    if (prune->parsed()) return run_prune(*pa, ctx, keys_of);
    return 2;
  };
  c.needs_pipeline = [=] { return prune->parsed() && !pa->config.empty(); };
  return c;
}

}  // namespace medfast::cli
