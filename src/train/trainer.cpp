#include "medfast/train/trainer.hpp"

#include "detail.hpp"

#include <torch/torch.h>

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "medfast/core/error.hpp"
#include "medfast/core/random.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/nn/unet.hpp"
#include "medfast/os/file.hpp"
#include "medfast/train/amp.hpp"
#include "medfast/train/checkpoint.hpp"
#include "medfast/train/collective.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/metrics.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::train {

using detail::nan_to_null;
using detail::with_context;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr const char* kCheckpointFormat = "medfast-checkpoint";
constexpr int kCheckpointVersion = 1;

/// Sections whose change makes a checkpoint's state meaningless for a resumed run.
const std::vector<std::string> kResumeFixed{"model", "loss", "optimizer", "schedule", "data"};

const at::Tensor& batch_tensor(const data::Batch& b, const std::string& key, const char* setting) {
  const auto it = b.tensors.find(key);
  if (it == b.tensors.end()) {
    std::string keys;
    for (const auto& [k, v] : b.tensors) keys += (keys.empty() ? "" : ", ") + k;
    throw ValueError(str(setting, " '", key, "' is not a key of the training batches (they have: ", keys, ")"));
  }
  return it->second;
}

double null_to_nan(const nlohmann::json& j) { return j.is_number() ? j.get<double>() : std::nan(""); }

}  // namespace

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

nlohmann::json StageTimes::to_json() const {
  return {{"data_wait", data_wait}, {"copy", copy}, {"forward", forward}, {"backward", backward},
          {"optimizer", optimizer}, {"validation", validation}};
}

nlohmann::json EpochRecord::to_json() const {
  nlohmann::json j{{"epoch", epoch}, {"steps", steps}, {"skipped_steps", skipped_steps}, {"loss", loss}, {"lr", lr},
                   {"seconds", seconds}, {"elapsed", elapsed}, {"times", times.to_json()}};
  if (dice) {
    j["dice"] = nan_to_null(*dice);
    nlohmann::json per = nlohmann::json::array();
    for (double d : dice_per_class) per.push_back(nan_to_null(d));
    j["dice_per_class"] = per;
  }
  if (hd95) j["hd95"] = nan_to_null(*hd95);
  return j;
}

EpochRecord EpochRecord::from_json(const nlohmann::json& j) {
  EpochRecord r;
  r.epoch = j.at("epoch");
  r.steps = j.at("steps");
  r.skipped_steps = j.value("skipped_steps", 0);
  r.loss = j.at("loss");
  r.lr = j.at("lr");
  r.seconds = j.at("seconds");
  r.elapsed = j.at("elapsed");
  if (j.contains("dice")) {
    r.dice = null_to_nan(j["dice"]);
    for (const auto& d : j.at("dice_per_class")) r.dice_per_class.push_back(null_to_nan(d));
  }
  if (j.contains("hd95")) r.hd95 = null_to_nan(j["hd95"]);
  const auto& t = j.at("times");
  r.times.data_wait = t.at("data_wait");
  r.times.copy = t.at("copy");
  r.times.forward = t.at("forward");
  r.times.backward = t.at("backward");
  r.times.optimizer = t.at("optimizer");
  r.times.validation = t.at("validation");
  return r;
}

nlohmann::json TrainResult::to_json() const {
  nlohmann::json h = nlohmann::json::array();
  for (const auto& e : history) h.push_back(e.to_json());
  nlohmann::json j{{"run_dir", run_dir},       {"epochs", history.size()}, {"best_dice", nan_to_null(best_dice)},
                   {"best_epoch", best_epoch}, {"reached_target", reached_target},
                   {"seconds", seconds},       {"prepare_seconds", prepare_seconds}, {"history", h}};
  j["time_to_target"] = time_to_target ? nlohmann::json(*time_to_target) : nlohmann::json(nullptr);
  return j;
}

// ---------------------------------------------------------------------------
// The trainer
// ---------------------------------------------------------------------------

struct Trainer::State {
  RunConfig config;
  Settings settings;
};

Trainer::Trainer(nlohmann::json config, std::string path, Settings settings) : s_(std::make_unique<State>()) {
  s_->settings = std::move(settings);
  s_->config = load_run_config(std::move(config), std::move(path), s_->settings);
}

void Trainer::set_collective(std::shared_ptr<Collective> collective) { s_->config.collective = std::move(collective); }

Trainer::~Trainer() = default;

const TrainOptions& Trainer::options() const { return s_->config.train; }

namespace {

struct Model {
  torch::nn::AnyModule any;
  std::shared_ptr<torch::nn::Module> module;
  at::Tensor forward(const at::Tensor& x) { return any.forward<at::Tensor>(x); }
};

Model build_model(const RunConfig& c, c10::Device device) {
  torch::manual_seed(c.train.seed);
  Model m;
  m.any = nn::make_network(c.model, c.path + ": model");
  m.module = m.any.ptr();
  m.module->to(device);
  return m;
}

std::int64_t out_channels(const nlohmann::json& model) { return model.value("out_channels", std::int64_t{2}); }

/// Per-class validation metrics over this rank's items, reduced across ranks.
struct Validation {
  std::vector<double> dice;  // per class
  double mean_dice = std::nan("");
  std::optional<double> hd95;
};

Validation validate(Model& model, data::CachedDataset& ds, const RunConfig& c, c10::Device device, Precision precision,
                    Collective* comm) {
  model.module->eval();
  torch::NoGradGuard no_grad;
  const std::int64_t classes = out_channels(c.model);
  MeanMetric dice, hd;
  const Predictor predict = [&](const at::Tensor& x) {
    AutocastGuard autocast(device.type(), precision);
    return model.forward(x);
  };
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const detail::CaseScores scores =
        detail::score_case(ds.get(i), c, predict, device, c.hd95, str("validation item ", ds.global_index(i)));
    dice.add(scores.dice);
    if (c.hd95) hd.add(scores.hd95);
  }
  auto reduce = [&](MeanMetric& m) {
    at::Tensor sums = m.sums(), counts = m.counts();
    if (!sums.defined() || sums.numel() == 0) {  // a rank without validation items
      const std::int64_t n = c.loss.sigmoid || classes == 1 ? classes : classes - 1;
      sums = at::zeros({n}, at::kDouble);
      counts = at::zeros({n}, at::kDouble);
    }
    if (comm && comm->world_size() > 1) {
      comm->allreduce_sum(sums);
      comm->allreduce_sum(counts);
    }
    return MeanMetric::from_totals(sums, counts);
  };
  Validation v;
  const MeanMetric d = reduce(dice);
  const at::Tensor per = d.per_class().to(at::kDouble).contiguous();
  for (std::int64_t k = 0; k < per.numel(); ++k) v.dice.push_back(per[k].item<double>());
  v.mean_dice = d.mean();
  if (c.hd95) v.hd95 = reduce(hd).mean();
  model.module->train();
  return v;
}

std::string diff_section(const nlohmann::json& a, const nlohmann::json& b) {
  for (const auto& k : kResumeFixed) {
    const nlohmann::json x = a.value(k, nlohmann::json()), y = b.value(k, nlohmann::json());
    if (x != y) return k;
  }
  const nlohmann::json ta = a.value("train", nlohmann::json::object()), tb = b.value("train", nlohmann::json::object());
  for (const char* k : {"seed", "amp"}) {
    if (ta.value(k, nlohmann::json()) != tb.value(k, nlohmann::json())) return str("train.", k);
  }
  return "";
}

void write_metrics(const std::string& dir, const std::vector<EpochRecord>& history) {
  std::string text;
  for (const auto& e : history) text += e.to_json().dump() + "\n";
  os::AtomicWriter w(dir + "/metrics.jsonl");
  w.append(text.data(), text.size());
  w.commit();
}

void write_text(const std::string& path, const std::string& text) {
  os::AtomicWriter w(path);
  w.append(text.data(), text.size());
  w.commit();
}

}  // namespace

TrainResult Trainer::run(bool resume, const TrainCallbacks& cb, bool overwrite) {
  const auto start = Clock::now();
  const RunConfig& c = s_->config;
  const TrainOptions& t = c.train;
  Collective* comm = c.collective.get();
  const bool rank0 = !comm || comm->rank() == 0;
  auto say = [&](const std::string& m) {
    if (rank0 && cb.message) cb.message(m);
  };

  const std::string last_path = t.run_dir + "/last.ckpt", best_path = t.run_dir + "/best.ckpt";
  if (resume && overwrite) throw ValueError("train: --resume and --overwrite exclude each other");
  if (!resume && os::exists(last_path)) {
    if (!overwrite) {
      throw ValueError(str("train.run_dir ", t.run_dir, " already holds a run (", last_path, ", epoch ",
                           read_checkpoint_meta(last_path).value("epoch", 0),
                           "): pass --resume to continue it, --overwrite to start again, or choose another run_dir"));
    }
  }
  if (!resume && overwrite && rank0) {
    for (const char* f : {"/last.ckpt", "/best.ckpt", "/metrics.jsonl"}) {
      if (os::exists(t.run_dir + f)) os::remove_file(t.run_dir + f);
    }
  }
  nlohmann::json resume_meta;
  if (resume) {
    if (!os::exists(last_path)) {
      throw ValueError(str("--resume: ", last_path, " does not exist (train.run_dir is ", t.run_dir, ")"));
    }
    resume_meta = read_checkpoint_meta(last_path);
    const std::string differs = diff_section(resume_meta.at("config"), c.root);
    if (!differs.empty()) {
      throw ValueError(str("--resume: the config's ", differs, " differs from the one ", last_path,
                           " was trained with; resume needs the same ", differs, " (or start a new run_dir)"));
    }
  }
  if (rank0) {
    // Temporaries of a writer that was killed (last.ckpt.tmp-<pid>-<n>, config.json.tmp-...).
    const os::Removed stale = os::remove_stale_temporaries(t.run_dir);
    if (!stale.paths.empty()) {
      say(str("removed ", stale.paths.size(), " temporary files of an interrupted run from ", t.run_dir, " (",
              format_bytes(stale.bytes), ")"));
    }
  }
  const int resume_epoch = resume ? resume_meta.at("epoch").get<int>() : 0;
  const c10::Device device = detail::usable_device(t.device, c.path + ": train.device");
  const Precision precision = parse_precision(t.amp, device.is_cuda(), c.path + ": train.amp");
  if (device.is_cuda()) {
    if (device.has_index()) c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(device);  // this rank's GPU
    at::globalContext().setDeterministicCuDNN(t.deterministic);
    at::globalContext().setBenchmarkCuDNN(!t.deterministic);
    if (t.deterministic) {
      // Deterministic kernels where torch has them; a warning names any op without one.
      ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
      at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    }
  }
  const int model_threads = t.threads > 0 ? t.threads : s_->settings.threads();
  at::set_num_threads(model_threads);

  // Data: fill the caches first (a killed run resumes the fill where it stopped).
  data::PipelineConfig pipeline = c.data;
  pipeline.loader.device = t.device;
  pipeline.loader.pin_memory = pipeline.loader.pin_memory || device.is_cuda();
  // Under DDP each rank's dataset is already its (padded) partition of the items
  // (CachedDataset, from RANK/WORLD_SIZE), so the loader does not split it again.
  // The smart cache's window is the same on every rank: there the loader's
  // DistributedSampler split (padded to equal lengths) divides it.
  if (comm) {  // the process group decides the partition (also under SLURM without RANK set)
    pipeline.cache.rank = comm->rank();
    pipeline.cache.world_size = comm->world_size();
  }
  pipeline.loader.rank = pipeline.smart && comm ? comm->rank() : 0;
  pipeline.loader.world_size = pipeline.smart && comm ? comm->world_size() : 1;
  const auto prep_start = Clock::now();
  std::unique_ptr<data::CachedDataset> train_ds;
  std::unique_ptr<data::SmartCacheDataset> smart;
  data::Loader::Source source;
  std::size_t train_size = 0;
  if (pipeline.smart) {
    smart = data::make_smart_cache(pipeline);
    smart->start(static_cast<std::size_t>(resume_epoch));  // the window where a resumed run left it
    train_size = smart->size();
    source = [&](std::size_t i) { return smart->get(i); };
  } else {
    train_ds = std::make_unique<data::CachedDataset>(data::make_cached_dataset(pipeline));
    const auto r = train_ds->fill();
    say(str("training items: ", train_ds->size(), " (", r.computed, " preprocessed, ", r.reused, " from the cache, ",
            std::lround(r.seconds * 10) / 10.0, " s)"));
    train_size = train_ds->size();
    source = [&](std::size_t i) { return train_ds->get(i); };
  }
  std::unique_ptr<data::CachedDataset> val_ds;
  if (!pipeline.validation.items.empty()) {
    val_ds = std::make_unique<data::CachedDataset>(data::make_validation_dataset(pipeline));
    const auto r = val_ds->fill();
    say(str("validation items: ", val_ds->size(), " (", r.computed, " preprocessed, ", r.reused, " from the cache)"));
  }
  const double prepare_seconds = since(prep_start);

  data::Loader loader(train_size, source, data::make_random_chain(pipeline), pipeline.loader);
  if (train_ds) loader.set_item_ids([&](std::size_t i) { return train_ds->global_index(i); });
  Model model = build_model(c, device);
  if (comm && comm->world_size() > 1) {
    torch::NoGradGuard g;
    comm->broadcast_coalesced(model.module->parameters(), 0);
    comm->broadcast_coalesced(model.module->buffers(), 0);
  }
  if (val_ds) {
    // A validation window through the network now, not after the first epoch: a roi_size
    // the network cannot take (SegResNet: multiples of 8, SwinUNETR: of 32) or a channel
    // mismatch is reported before any training.
    // roi_size entries <= 0 mean the image's own size (MONAI): the first validation
    // image's window stands for them.
    std::vector<std::int64_t> shape{1, c.model.value("in_channels", std::int64_t{1})};
    bool fixed = true;
    for (auto r : c.sliding_window.roi_size) fixed = fixed && r > 0;
    std::optional<std::vector<std::int64_t>> image_shape;
    if (!fixed && val_ds->size() > 0) {
      const Sample first = val_ds->get(0);
      const auto it = first.volumes.find(t.image_key);
      if (it != first.volumes.end()) image_shape = it->second.data.sizes().vec();
    }
    for (std::size_t d = 0; d < c.sliding_window.roi_size.size(); ++d) {
      const std::int64_t r = c.sliding_window.roi_size[d];
      shape.push_back(r > 0 || !image_shape || image_shape->size() <= d + 1 ? r : (*image_shape)[d + 1]);
    }
    if (std::all_of(shape.begin() + 2, shape.end(), [](std::int64_t n) { return n > 0; })) {
      torch::NoGradGuard g;
      model.module->eval();
      const std::string what = str(c.path, ": the network cannot take a validation window of ", at::IntArrayRef(shape),
                                   " (validation.sliding_window.roi_size, model.in_channels)");
      const at::Tensor out =
          with_context(what, [&] { return model.forward(at::zeros(shape, at::TensorOptions().device(device))); });
      std::vector<std::int64_t> want = shape;
      want[1] = out_channels(c.model);
      if (out.sizes() != at::IntArrayRef(want)) {
        throw ValueError(str(what, ": it returns ", out.sizes(), ", not ", at::IntArrayRef(want),
                             " (choose a roi_size the network's strides divide)"));
      }
      model.module->train();
    }
  } else {
    say("no validation items (data.validation): no Dice, no best.ckpt");
  }
  std::vector<at::Tensor> params = model.module->parameters();
  std::vector<at::Tensor> buffers = model.module->buffers();
  const bool distributed = comm && comm->world_size() > 1;
  // DDP: gradients are averaged in buckets that start while backward runs.
  std::unique_ptr<GradientSync> grad_sync = distributed ? comm->gradient_sync(params) : nullptr;
  auto optimizer = make_optimizer(params, c.optimizer);
  GradScalerOptions so;
  so.enabled = precision == Precision::fp16;
  GradScaler scaler(so);
  const Loss loss_fn(c.loss);

  TrainResult result;
  result.run_dir = t.run_dir;
  result.prepare_seconds = prepare_seconds;
  int first_epoch = 0;
  double elapsed_before = 0;
  if (resume) {
    const nlohmann::json meta = load_checkpoint(last_path, *model.module, optimizer.get());
    first_epoch = meta.at("epoch");
    elapsed_before = meta.value("elapsed", 0.0);
    result.best_dice = meta.value("best_dice", -1.0);
    result.best_epoch = meta.value("best_epoch", 0);
    result.reached_target = meta.value("reached_target", false);
    if (meta.contains("time_to_target") && meta["time_to_target"].is_number()) result.time_to_target = meta["time_to_target"].get<double>();
    for (const auto& e : meta.at("history")) result.history.push_back(EpochRecord::from_json(e));
    if (meta.contains("scaler")) scaler.load_state(meta["scaler"]);
    say(str("resuming ", last_path, " after epoch ", first_epoch));
  }
  if (rank0) {
    os::make_directories(t.run_dir);
    write_text(t.run_dir + "/config.json", c.root.dump(2) + "\n");
  }
  say(str("model ", c.model.value("name", "?"), ": ", nn::count_parameters(*model.module), " parameters; ",
          "device ", t.device, ", amp ", precision_name(precision), ", ", model_threads, " libtorch threads, ",
          pipeline.loader.threads, " loader threads; ", loader.batches_per_epoch(), " steps per epoch"));

  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  auto checkpoint_meta = [&](int epochs_done, double elapsed) {
    nlohmann::json h = nlohmann::json::array();
    for (const auto& e : result.history) h.push_back(e.to_json());
    return nlohmann::json{{"format", kCheckpointFormat},
                          {"version", kCheckpointVersion},
                          {"epoch", epochs_done},
                          {"config", c.root},
                          {"config_dir", c.base_dir},
                          {"best_dice", nan_to_null(result.best_dice)},
                          {"best_epoch", result.best_epoch},
                          {"reached_target", result.reached_target},
                          {"time_to_target", result.time_to_target ? nlohmann::json(*result.time_to_target) : nlohmann::json()},
                          {"elapsed", elapsed},
                          {"history", h},
                          {"scaler", scaler.state()},
                          {"torch_threads", at::get_num_threads()}};
  };

  model.module->train();
  for (int epoch = first_epoch; epoch < t.epochs && !result.reached_target; ++epoch) {
    const auto epoch_start = Clock::now();
    EpochRecord rec;
    rec.epoch = epoch + 1;
    rec.lr = scheduled_lr(c.schedule, c.optimizer.lr, epoch, t.epochs);
    set_learning_rate(*optimizer, rec.lr);
    torch::manual_seed(derive_seed({t.seed, static_cast<std::uint64_t>(epoch), 0x7a41}));
    loader.start(static_cast<std::uint64_t>(epoch));
    double loss_sum = 0;
    while (true) {
      auto t0 = Clock::now();
      std::optional<data::Batch> batch = loader.next();
      rec.times.data_wait += since(t0);
      if (!batch) break;
      t0 = Clock::now();
      const at::Tensor x = batch_tensor(*batch, t.image_key, "train.image_key").to(device, at::kFloat, /*non_blocking=*/true);
      const at::Tensor y = batch_tensor(*batch, t.label_key, "train.label_key").to(device, /*non_blocking=*/true);
      std::string items;
      for (std::size_t i : batch->items) items += (items.empty() ? "" : ", ") + std::to_string(i);
      const std::string where = str("epoch ", epoch + 1, ", step ", rec.steps + 1, " (items ", items, ")");
      sync();
      rec.times.copy += since(t0);

      if (distributed && !buffers.empty()) {  // BatchNorm statistics: rank 0's, as DDP's broadcast_buffers
        torch::NoGradGuard g;
        comm->broadcast_coalesced(buffers, 0);
      }
      t0 = Clock::now();
      at::Tensor loss;
      with_context(where, [&] {
        AutocastGuard autocast(device.type(), precision);
        const at::Tensor logits = model.forward(x);
        loss = loss_fn(logits.to(at::kFloat), y);
      });
      sync();
      rec.times.forward += since(t0);

      t0 = Clock::now();
      optimizer->zero_grad();
      if (grad_sync) grad_sync->prepare();
      with_context(where, [&] { scaler.scale(loss).backward(); });
      sync();
      rec.times.backward += since(t0);

      t0 = Clock::now();
      if (grad_sync) grad_sync->finish();
      const bool stepped = scaler.step(*optimizer);
      scaler.update();
      if (!stepped) ++rec.skipped_steps;
      const double step_loss = loss.item<double>();
      loss_sum += step_loss;
      ++rec.steps;
      if (rank0 && cb.step) cb.step(rec.epoch, rec.steps, static_cast<int>(loader.batches_per_epoch()), step_loss);
      rec.times.optimizer += since(t0);
    }
    rec.loss = rec.steps ? loss_sum / rec.steps : std::nan("");
    if (comm && comm->world_size() > 1) {
      at::Tensor l = at::tensor({loss_sum, static_cast<double>(rec.steps)}, at::kDouble);
      comm->allreduce_sum(l);
      rec.loss = l[0].item<double>() / std::max(1.0, l[1].item<double>());
    }

    const bool last_epoch = epoch + 1 == t.epochs;
    if (val_ds && ((epoch + 1) % c.val_interval == 0 || last_epoch)) {
      const auto v0 = Clock::now();
      const Validation v = validate(model, *val_ds, c, device, precision, comm);
      rec.times.validation = since(v0);
      rec.dice = v.mean_dice;
      rec.dice_per_class = v.dice;
      rec.hd95 = v.hd95;
    }
    rec.seconds = since(epoch_start);
    rec.elapsed = elapsed_before + since(start);
    bool improved = false;
    if (rec.dice && std::isfinite(*rec.dice) && *rec.dice > result.best_dice) {
      result.best_dice = *rec.dice;
      result.best_epoch = rec.epoch;
      improved = true;
    }
    if (rec.dice && t.target_dice > 0 && *rec.dice >= t.target_dice && !result.reached_target) {
      result.reached_target = true;
      result.time_to_target = rec.elapsed;
    }
    result.history.push_back(rec);
    if (smart) smart->update();  // MONAI: the window slides at each epoch's end
    if (rank0) {
      const nlohmann::json meta = checkpoint_meta(rec.epoch, rec.elapsed);
      // best before last: last.ckpt's record of the best epoch must never name a best.ckpt not yet written
      if (improved) save_checkpoint(best_path, *model.module, nullptr, meta);
      save_checkpoint(last_path, *model.module, optimizer.get(), meta);
      write_metrics(t.run_dir, result.history);
    }
    if (rank0 && cb.epoch) cb.epoch(rec);
  }
  loader.stop();
  result.seconds = since(start);
  return result;
}

}  // namespace medfast::train
