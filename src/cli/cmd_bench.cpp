// medfast bench loader: fill the cache, then time epochs of the random chain alone.

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/io/tensor_file.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/process.hpp"

namespace medfast::cli {

namespace {

struct LoaderArgs {
  std::string config;
  int epochs = 3;
  int batch_size = 0;
  bool json = false;
  std::string save_batches;  ///< write every batch's tensors here (MFTENSOR files)
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_loader(const LoaderArgs& a, Context& ctx) {
  MEDFAST_CHECK_T(ValueError, a.epochs >= 1, "bench loader: --epochs ", a.epochs, " must be at least 1");
  data::PipelineConfig cfg = data::load_pipeline(a.config, ctx.settings);
  if (a.batch_size > 0) cfg.loader.batch_size = a.batch_size;
  const auto chain = data::make_random_chain(cfg);
  if (!a.save_batches.empty()) os::make_directories(a.save_batches);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<data::CachedDataset> cached;
  std::unique_ptr<data::SmartCacheDataset> smart;
  data::Loader::Source source;
  std::size_t items = 0;
  if (cfg.smart) {
    smart = data::make_smart_cache(cfg);
    smart->start();
    items = smart->size();
    source = [&](std::size_t i) { return smart->get(i); };
  } else {
    cached = std::make_unique<data::CachedDataset>(data::make_cached_dataset(cfg));
    cached->fill();
    items = cached->size();
    source = [&](std::size_t i) { return cached->get(i); };
  }
  const double fill_seconds = since(t0);
  data::Loader loader(items, source, chain, cfg.loader);
  nlohmann::json epochs = nlohmann::json::array();
  for (int e = 0; e < a.epochs; ++e) {
    const auto te = std::chrono::steady_clock::now();
    loader.start(static_cast<std::uint64_t>(e));
    std::size_t samples = 0, batches = 0;
    while (auto b = loader.next()) {
      samples += b->samples();
      if (!a.save_batches.empty()) {
        for (const auto& [key, t] : b->tensors) {
          io::save_tensor(t, str(a.save_batches, "/epoch", e, "_batch", batches, "_", key, ".mft"), {},
                          /*durable=*/false);
        }
      }
      ++batches;
    }
    const double s = since(te);
    epochs.push_back({{"epoch", e}, {"samples", samples}, {"batches", batches}, {"seconds", s},
                      {"samples_per_second", samples / s}});
    if (smart) smart->update();
    if (!a.json) {
      std::printf("epoch %d: %zu samples in %zu batches, %.2f s, %.1f samples/s\n", e, samples, batches, s,
                  samples / s);
      std::fflush(stdout);
    }
  }
  const nlohmann::json out = {{"config", a.config},
                              {"items", items},
                              {"fill_seconds", fill_seconds},
                              {"threads", cfg.loader.threads},
                              {"batch_size", cfg.loader.batch_size},
                              {"samples_per_item", chain.samples_per_item()},
                              {"epochs", epochs},
                              {"peak_rss_bytes", os::peak_rss_bytes()}};
  if (a.json) {
    print_json(out.dump(2));
  } else {
    std::printf("cache filled in %.2f s (%zu items); loader threads %d, batch size %d; peak RSS %s\n", fill_seconds,
                items, cfg.loader.threads, cfg.loader.batch_size, format_bytes(os::peak_rss_bytes()).c_str());
  }
  return 0;
}

}  // namespace

Command register_bench(CLI::App& root) {
  auto* bench = root.add_subcommand("bench", "Built-in benchmarks");
  bench->require_subcommand(1);
  auto la = std::make_shared<LoaderArgs>();
  auto* loader = bench->add_subcommand(
      "loader", "Fill the cache of CFG, then time epochs of its random chain (loader threads: --threads)");
  loader->add_option("--config", la->config, "Run config with a data section")->required();
  loader->add_option("--epochs", la->epochs, "Epochs to time")->capture_default_str();
  loader->add_option("--batch-size", la->batch_size, "Items per batch (default: data.loader.batch_size)");
  loader->add_flag("--json", la->json, "Print JSON");
  loader->add_option("--save-batches", la->save_batches,
                     "Also write every batch's tensors to this folder (epoch<E>_batch<B>_<key>.mft, load_tensor's format; "
                     "timings then include the writes)");
  return Command{bench, [la](Context& ctx) { return run_loader(*la, ctx); }};
}

}  // namespace medfast::cli
