// medfast bench loader: fill the cache, check every batch of a first epoch off the clock, then time
// epochs of the random chain alone (on the host or a GPU). medfast bench step: a network's training
// step on random data.

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
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
#include "medfast/train/step.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/train/amp.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace medfast::cli {

namespace {

struct LoaderArgs : DataConfigArgs {
  int epochs = 1;             ///< at least this many epochs per timed figure
  double min_seconds = 1.0;   ///< and at least this much epoch time
  int repeats = 5;            ///< figures; the median is reported with the min and max
  int check_epochs = 1;       ///< epochs checked batch by batch, off the clock, before the timed ones
  bool no_check = false;
  int batch_size = 0;
  bool json = false;
  std::string save_batches;  ///< write every batch's tensors here (MFTENSOR files)
  std::string device;        ///< deliver batches here ("": data.loader.device)
};

struct StepArgs {
  std::string model = R"({"name": "UNet", "in_channels": 1, "out_channels": 2, "channels": [16, 32, 64, 128, 256], "strides": [2, 2, 2, 2], "num_res_units": 2, "norm": "batch"})";
  std::vector<std::int64_t> input{2, 1, 96, 96, 96};
  int steps = 10, warmup = 3;
  std::string optimizer = "Adam";
  bool channels_last = false;
  std::string device = "cpu";
  std::string amp = "fp32";
  bool deterministic = false;
  bool json = false;
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// What an epoch's batches must be, checked as they come (shapes, dtypes, devices on the
/// host; finite values and crops that differ on the device, read once the epoch is timed).
struct BatchCheck {
  at::Device device{at::kCPU};
  std::size_t batch_samples = 0;  ///< a full batch's samples (items x crops)
  std::vector<std::string> problems;
  at::Tensor nonfinite, identical;  ///< counts on the device

  void check(const data::Batch& b, std::size_t index) {
    std::optional<std::int64_t> n;
    at::Tensor all_same;  // the first two crops equal in every floating key (a label of background alone may be)
    for (const auto& [key, t] : b.tensors) {
      auto bad = [&](const std::string& what) { problems.push_back(str("batch ", index, " '", key, "': ", what)); };
      if (t.device() != device) bad(str("on ", t.device(), ", expected ", device));
      if (t.dim() < 2) bad(str("shape ", t.sizes(), " (expected [samples, channels, spatial...])"));
      if (n && t.size(0) != *n) bad(str(t.size(0), " samples beside ", *n, " of another key"));
      n = t.size(0);
      if (static_cast<std::size_t>(t.size(0)) > batch_samples) bad(str(t.size(0), " samples, more than ", batch_samples));
      if (!t.is_floating_point()) continue;
      const at::Tensor f = at::isfinite(t).logical_not().any().to(at::kInt);
      nonfinite = nonfinite.defined() ? nonfinite + f : f;
      if (t.size(0) >= 2) {  // random crops of several places: the samples differ
        const at::Tensor same = t.select(0, 0).eq(t.select(0, 1)).all();
        all_same = all_same.defined() ? all_same.logical_and(same) : same;
      }
    }
    if (all_same.defined()) identical = identical.defined() ? identical + all_same.to(at::kInt) : all_same.to(at::kInt);
  }
  /// After the epoch's device work: the device's counts read, problems named.
  void finish(int epoch) {
    if (nonfinite.defined() && nonfinite.item<int>() > 0) {
      problems.push_back(str("epoch ", epoch, ": ", nonfinite.item<int>(), " batch tensors hold NaN or infinity"));
    }
    if (identical.defined() && identical.item<int>() > 0) {
      problems.push_back(str("epoch ", epoch, ": ", identical.item<int>(), " batches whose first two crops are equal"));
    }
    nonfinite = identical = at::Tensor();
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void synchronize(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

/// One timed epoch: the clock starts with the epoch and stops once the device holds its last batch.
struct TimedEpoch {
  std::size_t samples = 0, batches = 0;
  double seconds = 0;
};

/// Bytes a batch delivers per sample, over every key (metadata only: nothing is read).
double bytes_per_sample(const data::Batch& b) {
  std::size_t bytes = 0;
  for (const auto& [key, t] : b.tensors) bytes += t.numel() * t.element_size();
  return b.samples() > 0 ? static_cast<double>(bytes) / static_cast<double>(b.samples()) : 0.0;
}

int run_loader(const LoaderArgs& a, Context& ctx) {
  MEDFAST_CHECK_T(ValueError, a.epochs >= 1, "bench loader: --epochs ", a.epochs, " must be at least 1");
  MEDFAST_CHECK_T(ValueError, a.repeats >= 1, "bench loader: --repeats ", a.repeats, " must be at least 1");
  MEDFAST_CHECK_T(ValueError, a.min_seconds >= 0 && a.min_seconds <= 3600, "bench loader: --min-seconds ",
                  a.min_seconds, " must be between 0 and 3600");
  MEDFAST_CHECK_T(ValueError, a.check_epochs >= 1, "bench loader: --check-epochs ", a.check_epochs,
                  " must be at least 1 (--no-check turns the check off)");
  MEDFAST_CHECK_T(ValueError, !(a.no_check && !a.save_batches.empty()), "bench loader: --save-batches writes the "
                  "checked pass's batches; it cannot go with --no-check");
  data::PipelineConfig cfg = open_pipeline(a.config, a.sets, ctx);
  if (a.batch_size > 0) cfg.loader.batch_size = a.batch_size;
  if (!a.device.empty()) {
    // As the trainer delivers to its device: pinned host batches, the device cache there, and
    // (CUDA) the batches written NDHWC for a channels-last network (train.memory_format auto).
    const at::Device d = io::resolve_device(a.device);
    MEDFAST_CHECK_T(ValueError, !d.is_cuda() || torch::cuda::is_available(), "bench loader: --device ", a.device,
                    ": libtorch has no usable CUDA device here");
    cfg.loader.device = d.str();
    if (d.is_cuda()) {
      cfg.cache.store.device = d.str();
      cfg.loader.pin_memory = true;
      cfg.loader.channels_last = true;
    }
  }
  const at::Device device = io::resolve_device(cfg.loader.device);
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
  const std::size_t want_samples = (cfg.loader.drop_last ? loader.batches_per_epoch() * cfg.loader.batch_size : items) *
                                   chain.samples_per_item();
  std::vector<std::string> problems;
  auto count_check = [&](std::uint64_t e, std::size_t samples) {
    if (samples != want_samples && !cfg.smart()) {
      problems.push_back(str("epoch ", e, ": ", samples, " samples, expected ", want_samples));
    }
  };
  double sample_bytes = 0;  // what a sample weighs, from the first batch seen
  std::uint64_t epoch = 0;  // the loader's epoch, hence its seeds: the checked pass's first, then the timed ones
  auto end_epoch = [&] {
    ++epoch;
    if (smart) smart->update();
  };

  // The checked pass, off the clock: every batch of --check-epochs epochs checked (shapes,
  // dtypes, devices; finite values and crops that differ, read on the device), and written
  // out with --save-batches. What is timed after it is the loader alone.
  const auto tc = std::chrono::steady_clock::now();
  BatchCheck check;
  check.device = device;
  check.batch_samples = static_cast<std::size_t>(cfg.loader.batch_size) * chain.samples_per_item();
  // With --no-check, one epoch unchecked stands in for it, so that both time the same warm loader
  // (a process's first epoch also faults in its batch memory).
  for (int k = 0; k < (a.no_check ? 1 : a.check_epochs); ++k) {
    loader.start(epoch);
    std::size_t samples = 0, batches = 0;
    while (auto b = loader.next()) {
      samples += b->samples();
      if (sample_bytes == 0) sample_bytes = bytes_per_sample(*b);
      if (!a.no_check) check.check(*b, batches);
      if (!a.save_batches.empty()) {
        for (const auto& [key, t] : b->tensors) {
          io::save_tensor(t, str(a.save_batches, "/epoch", epoch, "_batch", batches, "_", key, ".mft"), {},
                          /*durable=*/false);
        }
      }
      ++batches;
    }
    synchronize(device);
    if (!a.no_check) check.finish(static_cast<int>(epoch));
    count_check(epoch, samples);
    end_epoch();
  }
  const double check_seconds = since(tc);
  problems.insert(problems.begin(), check.problems.begin(), check.problems.end());
  if (!problems.empty()) throw Error(str("bench loader: the batches failed their check: ", join(problems, "; ")));

  // The timed figures: each at least --epochs epochs and --min-seconds of epoch time (an epoch
  // of a small dataset takes milliseconds); the clock runs from an epoch's start until the
  // device holds its last batch, and only counts samples meanwhile.
  auto timed_epoch = [&] {
    synchronize(device);
    TimedEpoch t;
    const auto te = std::chrono::steady_clock::now();
    loader.start(epoch);
    while (auto b = loader.next()) {
      if (sample_bytes == 0) sample_bytes = bytes_per_sample(*b);
      t.samples += b->samples();
      ++t.batches;
    }
    synchronize(device);
    t.seconds = since(te);
    count_check(epoch, t.samples);
    return t;
  };
  nlohmann::json epochs = nlohmann::json::array(), figures = nlohmann::json::array();
  std::vector<double> rates;
  for (int r = 0; r < a.repeats; ++r) {
    std::size_t samples = 0;
    double seconds = 0;
    int n = 0;
    for (; n < a.epochs || seconds < a.min_seconds; ++n) {
      const TimedEpoch t = timed_epoch();
      epochs.push_back({{"epoch", epoch}, {"figure", r}, {"samples", t.samples}, {"batches", t.batches},
                        {"seconds", t.seconds}, {"samples_per_second", t.samples / t.seconds}});
      samples += t.samples;
      seconds += t.seconds;
      end_epoch();
    }
    rates.push_back(samples / seconds);
    figures.push_back({{"epochs", n}, {"samples", samples}, {"seconds", seconds},
                       {"samples_per_second", rates.back()}});
    if (!a.json) {
      std::printf("figure %d: %d epochs, %zu samples in %.2f s, %.1f samples/s\n", r, n, samples, seconds, rates.back());
      std::fflush(stdout);
    }
  }
  if (!problems.empty()) throw Error(str("bench loader: the timed epochs failed their count: ", join(problems, "; ")));
  const double med = median(rates);
  const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
  const std::string verified =
      a.no_check ? std::string("samples per epoch only (--no-check; one unchecked epoch untimed first)")
                 : str("shapes, dtypes, devices, finite values, crops that differ in ", a.check_epochs, " untimed epoch",
                       a.check_epochs == 1 ? "" : "s", "; samples per epoch in every epoch");
  const nlohmann::json out = {{"config", a.config},
                              {"items", items},
                              {"device", device.str()},
                              {"channels_last", cfg.loader.channels_last},
                              {"fill_seconds", fill_seconds},
                              {"check_seconds", check_seconds},
                              {"threads", cfg.loader.threads},
                              {"batch_size", cfg.loader.batch_size},
                              {"samples_per_item", chain.samples_per_item()},
                              {"samples_per_epoch", want_samples},
                              {"bytes_per_sample", sample_bytes},
                              {"verified", verified},
                              {"min_seconds", a.min_seconds},
                              {"samples_per_second", med},
                              {"samples_per_second_min", *lo},
                              {"samples_per_second_max", *hi},
                              {"figures", figures},
                              {"epochs", epochs},
                              {"peak_rss_bytes", os::peak_rss_bytes()}};
  if (a.json) {
    print_json(out.dump(2));
  } else {
    std::printf("cache filled in %.2f s (%zu items); off the clock: %s (%.2f s)\n", fill_seconds, items,
                verified.c_str(), check_seconds);
    std::printf("%.1f samples/s, the median of %d figures (%.1f-%.1f), each >= %d epochs and >= %.2f s; loader "
                "threads %d, batch size %d, batches on %s; peak RSS %s\n",
                med, a.repeats, *lo, *hi, a.epochs, a.min_seconds, cfg.loader.threads, cfg.loader.batch_size,
                device.str().c_str(), format_bytes(os::peak_rss_bytes()).c_str());
  }
  return 0;
}

/// The trainer's step timed back to back (run_step).
struct TrainingStepFigures {
  double seconds = 0;  ///< per step
  std::string update;  ///< what the update ran
};

/// One training step's forward, backward and optimizer (DiceCE, Adam) on random data, and a
/// validation forward under NoGradGuard and under InferenceMode: the medians over --steps, each
/// phase timed apart (the device synchronised at its ends). Then the same steps back to back
/// through the trainer's own step (train/step.hpp: outcomes read a step later, the update
/// fused or multi-tensor), timed over all of them between two synchronisations: what a
/// training run gets (pipelined_step, samples_per_second).
int run_step(const StepArgs& a, Context& ctx) {
  MEDFAST_CHECK_T(ValueError, a.input.size() == 5, "bench step: --input needs B,C,X,Y,Z (5 numbers)");
  MEDFAST_CHECK_T(ValueError, a.steps >= 1 && a.warmup >= 0, "bench step: --steps must be >= 1, --warmup >= 0");
  const nlohmann::json spec = parse_json_document(a.model, "bench step: --model");
  const at::Device device = io::resolve_device(a.device);
  MEDFAST_CHECK_T(ValueError, !device.is_cuda() || torch::cuda::is_available(), "bench step: --device ", a.device,
                  ": libtorch has no usable CUDA device here");
  const train::Precision precision = train::parse_precision(a.amp, device.is_cuda(), "bench step: --amp");
  if (device.is_cuda()) {  // as train does: cuDNN autotunes unless deterministic
    at::globalContext().setBenchmarkCuDNN(!a.deterministic);
    at::globalContext().setDeterministicCuDNN(a.deterministic);
  }
  train::apply_conv_backward(ctx.settings);  // as train does
  train::apply_conv_forward(ctx.settings);
  torch::manual_seed(0);
  torch::nn::AnyModule net = nn::make_network(spec, "--model");
  net.ptr()->to(device);
  const auto format = a.channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  nn::set_memory_format(*net.ptr(), format);
  const nn::NetworkSpec parsed = nn::parse_network(spec, "--model");
  const std::int64_t classes = nn::output_channels(parsed, "--model");
  const std::vector<double>& supervision = parsed.deep_supervision_weights;
  const auto on = at::TensorOptions().device(device);
  const at::Tensor x = nn::to_memory_format(torch::rand(a.input, on), format);
  const at::Tensor y =
      torch::randint(0, classes, {a.input[0], 1, a.input[2], a.input[3], a.input[4]}, on).to(at::kFloat);
  train::LossOptions lo;
  lo.to_onehot_y = lo.softmax = true;
  const train::Loss loss(lo);
  train::OptimizerOptions oo;
  oo.name = a.optimizer;
  oo.lr = 1e-4;
  if (a.optimizer == "SGD") oo.momentum = 0.99, oo.nesterov = true;  // nnU-Net's (the plan's)
  const std::vector<at::Tensor> params = nn::unique_tensors(net.ptr()->parameters());
  auto opt = train::make_optimizer(params, oo);
  train::GradScalerOptions so;
  so.enabled = precision == train::Precision::fp16;
  train::GradScaler scaler(so);
  std::vector<double> fwd, bwd, step, val_nograd, val_inference;
  using Clock = std::chrono::steady_clock;
  auto sync_since = [&](Clock::time_point t) {
    synchronize(device);
    return since(t);
  };
  net.ptr()->train();
  // The first step's peak resident memory above what the network, its input and the
  // optimizer held before it: activations, gradients, optimizer state (what `plan`
  // estimates). Measured in a fresh process, as nothing freed before is there to reuse.
  const bool peak_reset = os::reset_peak_rss();
  const std::uint64_t rss_before = os::peak_rss_bytes();
  std::uint64_t first_step_increase = 0;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    synchronize(device);
    const auto t0 = Clock::now();
    opt->zero_grad();
    at::Tensor l;
    {
      train::AutocastGuard autocast(device.type(), precision);
      const at::Tensor out = net.forward<at::Tensor>(x);
      l = supervision.empty() ? loss(out.to(at::kFloat), y) : train::deep_supervision_loss(loss, out, y, supervision);
    }
    const double f = sync_since(t0);
    const auto t1 = Clock::now();
    scaler.scale(l).backward();
    const double b = sync_since(t1);
    const auto t2 = Clock::now();
    if (scaler.enabled()) {
      scaler.step(*opt);
      scaler.update();
    } else {
      opt->step();
    }
    const double o = sync_since(t2);
    if (i == 0) first_step_increase = os::peak_rss_bytes() - rss_before;
    if (i >= a.warmup) fwd.push_back(f), bwd.push_back(b), step.push_back(o);
  }
  // The trainer's step, back to back: no synchronisation between steps.
  TrainingStepFigures pipelined;
  {
    train::TrainingStep::Parts parts;
    parts.model = net;
    parts.params = params;
    parts.optimizer = opt.get();
    parts.optimizer_name = a.optimizer;
    parts.scaler = &scaler;
    parts.loss = &loss;
    parts.supervision_weights = supervision;
    train::StepOptions o;
    o.device = device;
    o.precision = precision;
    o.memory_format = format;
    train::TrainingStep trainer_step(std::move(parts), o);
    train::StageTimes times;
    for (int i = 0; i < a.warmup; ++i) trainer_step.run(x, y, {1, i + 1, {}, {}}, times);
    trainer_step.finish(times);
    synchronize(device);
    const auto t0 = Clock::now();
    for (int i = 0; i < a.steps; ++i) trainer_step.run(x, y, {2, i + 1, {}, {}}, times);
    const std::optional<train::StepOutcome> last = trainer_step.finish(times);
    pipelined.seconds = sync_since(t0) / a.steps;
    pipelined.update = train::update_kernel_name(trainer_step.update_kernel());
    MEDFAST_CHECK(last && std::isfinite(last->loss), "bench step: the last step's loss is not finite");
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
    synchronize(device);
    auto t0 = Clock::now();
    {
      torch::NoGradGuard g;
      train::AutocastGuard autocast(device.type(), precision);
      (void)net.forward<at::Tensor>(x);
    }
    const double n = sync_since(t0);
    t0 = Clock::now();
    {
      c10::InferenceMode g;
      train::AutocastGuard autocast(device.type(), precision);
      (void)net.forward<at::Tensor>(x);
    }
    if (i >= a.warmup) val_nograd.push_back(n), val_inference.push_back(sync_since(t0));
  }
  const nlohmann::json out{{"model", spec},
                           {"input", a.input},
                           {"device", device.str()},
                           {"amp", train::precision_name(precision)},
                           {"deterministic", a.deterministic},
                           {"threads", at::get_num_threads()},
                           {"channels_last", a.channels_last},
                           {"conv_backward", ctx.settings.get("conv_backward")},
                           {"conv_forward", ctx.settings.get("conv_forward")},
                           {"steps", a.steps},
                           {"forward", median(fwd)},
                           {"backward", median(bwd)},
                           {"optimizer", median(step)},
                           {"train_step", median(fwd) + median(bwd) + median(step)},
                           {"pipelined_step", pipelined.seconds},
                           {"samples_per_second", static_cast<double>(a.input[0]) / pipelined.seconds},
                           {"update", pipelined.update},
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
        "forward %.4f s, backward %.4f s, optimizer %.4f s (median of %d steps, %d threads, %s %s); steps back to "
        "back %.4f s (%.1f samples/s, update %s); eval forward %.4f s (no_grad), %.4f s (inference mode), %.3g GMAC "
        "(%.1f GMAC/s); conv_backward %s\n",
        median(fwd), median(bwd), median(step), a.steps, at::get_num_threads(), device.str().c_str(),
        train::precision_name(precision).c_str(), pipelined.seconds, a.input[0] / pipelined.seconds,
        pipelined.update.c_str(), median(val_nograd), median(val_inference), eval_macs / 1e9,
        eval_macs / 1e9 / std::max(median(val_inference), 1e-9), ctx.settings.get("conv_backward").c_str());
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
  la->DataConfigArgs::add(loader);
  loader->add_option("--epochs", la->epochs, "Epochs per timed figure, at least")->capture_default_str();
  loader->add_option("--min-seconds", la->min_seconds,
                     "Epoch time per figure, at least: epochs are added until it is reached")
      ->capture_default_str();
  loader->add_option("--repeats", la->repeats, "Timed figures (the median is reported, with the min and max)")
      ->capture_default_str();
  loader->add_option("--check-epochs", la->check_epochs,
                     "Epochs whose every batch is checked, off the clock, before the timed ones")
      ->capture_default_str();
  loader->add_flag("--no-check", la->no_check,
                   "No checked pass: only the samples of each epoch are counted (to compare with the checks on)");
  loader->add_option("--batch-size", la->batch_size, "Items per batch (default: data.loader.batch_size)");
  loader->add_flag("--json", la->json, "Print JSON");
  loader->add_option("--device", la->device,
                     "Deliver batches here: cpu | cuda | cuda:N (default: data.loader.device); on CUDA a device "
                     "cache holds the items there and the random chain runs there, and batches are written NDHWC, "
                     "as train delivers them to a channels-last network");
  loader->add_option("--save-batches", la->save_batches,
                     "Also write the checked epochs' batches to this folder (epoch<E>_batch<B>_<key>.mft, load_tensor's "
                     "format; untimed)");
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
  step->add_option("--device", sa->device, "cpu | cuda | cuda:N")->capture_default_str();
  step->add_option("--amp", sa->amp, "fp32 | fp16 | bf16 (fp16: CUDA, with a loss scaler)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  step->add_flag("--deterministic", sa->deterministic, "CUDA: deterministic cuDNN algorithms (default: autotuned)");
  step->add_flag("--json", sa->json, "Print JSON");
  return Command{bench, [la, sa, loader, step](Context& ctx) {
                   if (step->parsed()) return run_step(*sa, ctx);
                   return run_loader(*la, ctx);
                 }};
}

}  // namespace medfast::cli
