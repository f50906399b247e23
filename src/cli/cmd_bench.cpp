// medfast bench loader: fill the cache, then time epochs of the random chain alone.

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/io/tensor_file.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/dynunet.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/process.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/train/run_config.hpp"

#include <torch/torch.h>

#include <algorithm>

namespace medfast::cli {

namespace {

struct LoaderArgs {
  std::string config;
  std::vector<std::string> sets;
  int epochs = 3;
  int batch_size = 0;
  bool json = false;
  std::string save_batches;  ///< write every batch's tensors here (MFTENSOR files)
};

struct StepArgs {
  std::string model = R"({"name": "UNet", "in_channels": 1, "out_channels": 2, "channels": [16, 32, 64, 128, 256], "strides": [2, 2, 2, 2], "num_res_units": 2, "norm": "batch"})";
  std::vector<std::int64_t> input{2, 1, 96, 96, 96};
  int steps = 10, warmup = 3;
  std::string optimizer = "Adam";
  bool channels_last = false;
  bool json = false;
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_loader(const LoaderArgs& a, Context& ctx) {
  MEDFAST_CHECK_T(ValueError, a.epochs >= 1, "bench loader: --epochs ", a.epochs, " must be at least 1");
  data::PipelineConfig cfg = open_pipeline(a.config, a.sets, ctx);
  if (a.batch_size > 0) cfg.loader.batch_size = a.batch_size;
  const auto chain = data::make_random_chain(cfg);
  if (!a.save_batches.empty()) os::make_directories(a.save_batches);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<data::CachedDataset> cached;
  std::unique_ptr<data::SmartCacheDataset> smart;
  data::Loader::Source source;
  std::size_t items = 0;
  if (cfg.smart()) {
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// One training step's forward, backward and optimizer (DiceCE, Adam) on random data, and a
/// validation forward under NoGradGuard and under InferenceMode: the medians over --steps.
int run_step(const StepArgs& a, Context& ctx) {
  MEDFAST_CHECK_T(ValueError, a.input.size() == 5, "bench step: --input needs B,C,X,Y,Z (5 numbers)");
  MEDFAST_CHECK_T(ValueError, a.steps >= 1 && a.warmup >= 0, "bench step: --steps must be >= 1, --warmup >= 0");
  const nlohmann::json spec = nlohmann::json::parse(a.model);
  train::apply_conv_backward(ctx.settings);  // as train does
  train::apply_conv_forward(ctx.settings);
  torch::manual_seed(0);
  torch::nn::AnyModule net = nn::make_network(spec, "--model");
  const auto format = a.channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  if (a.channels_last) {
    for (auto& p : net.ptr()->parameters()) {
      if (p.dim() == 5) p.set_data(p.data().contiguous(format));
    }
  }
  const nn::NetworkSpec parsed = nn::parse_network(spec, "--model");
  const std::int64_t classes = nn::output_channels(parsed, "--model");
  const std::vector<double>& supervision = parsed.deep_supervision_weights;
  const at::Tensor x = torch::rand(a.input).contiguous(format);
  const at::Tensor y = torch::randint(0, classes, {a.input[0], 1, a.input[2], a.input[3], a.input[4]}).to(at::kFloat);
  train::LossOptions lo;
  lo.to_onehot_y = lo.softmax = true;
  const train::Loss loss(lo);
  train::OptimizerOptions oo;
  oo.name = a.optimizer;
  oo.lr = 1e-4;
  if (a.optimizer == "SGD") oo.momentum = 0.99, oo.nesterov = true;  // nnU-Net's (the plan's)
  auto opt = train::make_optimizer(nn::unique_tensors(net.ptr()->parameters()), oo);
  std::vector<double> fwd, bwd, step, val_nograd, val_inference;
  using Clock = std::chrono::steady_clock;
  net.ptr()->train();
  // The first step's peak resident memory above what the network, its input and the
  // optimizer held before it: activations, gradients, optimizer state (what `plan`
  // estimates). Measured in a fresh process, as nothing freed before is there to reuse.
  const bool peak_reset = os::reset_peak_rss();
  const std::uint64_t rss_before = os::peak_rss_bytes();
  std::uint64_t first_step_increase = 0;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    const auto t0 = Clock::now();
    opt->zero_grad();
    const at::Tensor out = net.forward<at::Tensor>(x);
    at::Tensor l = supervision.empty() ? loss(out, y) : train::deep_supervision_loss(loss, out, y, supervision);
    const double f = since(t0);
    const auto t1 = Clock::now();
    l.backward();
    const double b = since(t1);
    const auto t2 = Clock::now();
    opt->step();
    if (i == 0) first_step_increase = os::peak_rss_bytes() - rss_before;
    if (i >= a.warmup) fwd.push_back(f), bwd.push_back(b), step.push_back(since(t2));
  }
  net.ptr()->eval();
  double eval_macs = 0;  // the convolutions' multiply-accumulates of one eval forward
  {
    c10::InferenceMode g;
    nn::MacCounter counter;
    (void)net.forward<at::Tensor>(x);
    eval_macs = counter.macs();
  }
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    auto t0 = Clock::now();
    {
      torch::NoGradGuard g;
      (void)net.forward<at::Tensor>(x);
    }
    const double n = since(t0);
    t0 = Clock::now();
    {
      c10::InferenceMode g;
      (void)net.forward<at::Tensor>(x);
    }
    if (i >= a.warmup) val_nograd.push_back(n), val_inference.push_back(since(t0));
  }
  const nlohmann::json out{{"model", spec},
                           {"input", a.input},
                           {"threads", at::get_num_threads()},
                           {"channels_last", a.channels_last},
                           {"conv_backward", ctx.settings.get("conv_backward")},
                           {"conv_forward", ctx.settings.get("conv_forward")},
                           {"steps", a.steps},
                           {"forward", median(fwd)},
                           {"backward", median(bwd)},
                           {"optimizer", median(step)},
                           {"train_step", median(fwd) + median(bwd) + median(step)},
                           {"eval_forward_no_grad", median(val_nograd)},
                           {"eval_forward_inference_mode", median(val_inference)},
                           {"eval_forward_macs", eval_macs},
                           {"optimizer_name", a.optimizer},
                           {"rss_before_bytes", rss_before},
                           {"first_step_peak_rss_increase_bytes", first_step_increase},
                           {"peak_rss_reset", peak_reset},
                           {"blas", os::library_of_symbol("sgemm_")}};
  if (a.json) {
    print_json(out.dump(2));
  } else {
    std::printf(
        "forward %.4f s, backward %.4f s, optimizer %.4f s (median of %d steps, %d threads); eval forward "
        "%.4f s (no_grad), %.4f s (inference mode), %.3g GMAC (%.1f GMAC/s); conv_backward %s\n",
        median(fwd), median(bwd), median(step), a.steps, at::get_num_threads(), median(val_nograd),
        median(val_inference), eval_macs / 1e9, eval_macs / 1e9 / std::max(median(val_inference), 1e-9),
        ctx.settings.get("conv_backward").c_str());
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
  loader->add_option("--set", la->sets, kDataSetHelp);
  loader->add_option("--epochs", la->epochs, "Epochs to time")->capture_default_str();
  loader->add_option("--batch-size", la->batch_size, "Items per batch (default: data.loader.batch_size)");
  loader->add_flag("--json", la->json, "Print JSON");
  loader->add_option("--save-batches", la->save_batches,
                     "Also write every batch's tensors to this folder (epoch<E>_batch<B>_<key>.mft, load_tensor's format; "
                     "timings then include the writes)");
  auto sa = std::make_shared<StepArgs>();
  auto* step = bench->add_subcommand(
      "step", "Time a training step (forward, backward, Adam) and an eval forward of a network on random data");
  step->add_option("--model", sa->model, "The model section as JSON (default: the spleen recipe's UNet)");
  step->add_option("--input", sa->input, "Batch shape B,C,X,Y,Z")->delimiter(',')->capture_default_str();
  step->add_option("--steps", sa->steps, "Timed steps (the median is reported)")->capture_default_str();
  step->add_option("--warmup", sa->warmup, "Untimed steps first")->capture_default_str();
  step->add_option("--optimizer", sa->optimizer, "Adam | SGD (SGD: momentum 0.99, Nesterov: nnU-Net's)")
      ->capture_default_str()
      ->check(CLI::IsMember({"Adam", "SGD"}));
  step->add_flag("--channels-last", sa->channels_last, "Input and 5-D weights in channels-last (NDHWC) memory format");
  step->add_flag("--json", sa->json, "Print JSON");
  return Command{bench, [la, sa, loader, step](Context& ctx) {
                   if (step->parsed()) return run_step(*sa, ctx);
                   return run_loader(*la, ctx);
                 }};
}

}  // namespace medfast::cli
