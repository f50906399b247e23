#include "medfast/train/trainer.hpp"

#include "data_checks.hpp"
#include "detail.hpp"
#include "run_dir.hpp"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <optional>

#include "medfast/core/error.hpp"
#include "medfast/core/random.hpp"
#include "medfast/core/trace.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/nn/dynunet.hpp"
#include "medfast/nn/layout.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/train/self_check.hpp"
#include "medfast/train/placement.hpp"
#include "medfast/train/step.hpp"
#include "medfast/nn/unet.hpp"
#include "medfast/os/file.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/process.hpp"
#include "medfast/profile/events.hpp"
#include "medfast/profile/gpu_sampler.hpp"
#include "medfast/train/amp.hpp"
#include "medfast/train/checkpoint.hpp"
#include "medfast/train/collective.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/metrics.hpp"
#include "medfast/train/nonfinite.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/train/profiler.hpp"
#include "medfast/train/run_config.hpp"
#include "medfast/version.hpp"

namespace medfast::train {

using detail::nan_to_null;

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kCheckpointFormat = "medfast-checkpoint";
constexpr int kCheckpointVersion = 1;

const at::Tensor& batch_tensor(const data::Batch& b, const std::string& key, const char* setting) {
  const auto it = b.tensors.find(key);
  if (it == b.tensors.end()) {
    std::string keys;
    for (const auto& [k, v] : b.tensors) keys += (keys.empty() ? "" : ", ") + k;
    throw ValueError(str(setting, " '", key, "' is not a key of the training batches (they have: ", keys, ")"));
  }
  return it->second;
}

}  // namespace

// ---------------------------------------------------------------------------
// The trainer
// ---------------------------------------------------------------------------

struct Trainer::State {
  RunConfig config;
};

Trainer::Trainer(nlohmann::json config, std::string path, const Settings& settings) : s_(std::make_unique<State>()) {
  s_->config = load_run_config(std::move(config), std::move(path), settings);
}

void Trainer::set_collective(std::shared_ptr<Collective> collective) { s_->config.collective = std::move(collective); }

Trainer::~Trainer() = default;

const TrainOptions& Trainer::options() const { return s_->config.train; }

namespace {

struct Model {
  torch::nn::AnyModule any;
  std::shared_ptr<torch::nn::Module> module;
  std::int64_t classes = 0;  // its out_channels, default included
  at::Tensor forward(const at::Tensor& x) { return any.forward<at::Tensor>(x); }
};

Model build_model(const RunConfig& c, c10::Device device) {
  torch::manual_seed(c.train.seed);
  Model m;
  const std::string where = c.path + ": model";
  m.any = nn::make_network(c.model, where);
  m.classes = nn::output_channels(nn::parse_network(c.model, where), where);
  m.module = m.any.ptr();
  m.module->to(device);
  return m;
}

/// Per-class validation metrics over this rank's items, reduced across ranks.
struct Validation {
  std::vector<double> dice;  // per class
  double mean_dice = std::nan("");
  std::optional<double> hd95;
  std::int64_t nonfinite_cases = 0;  // cases whose logits held NaN or infinity (all ranks)
};

Validation validate(Model& model, data::CachedDataset& ds, const RunConfig& c, c10::Device device, Precision precision,
                    at::MemoryFormat memory_format, Collective* comm) {
  model.module->eval();
  torch::NoGradGuard no_grad;
  const std::int64_t classes = model.classes;
  MeanMetric dice, hd;
  const Predictor predict =
      detail::inference_predictor(c.model, model.any, c.settings, c.path + ": model", device, precision, c.validation.tta,
                                  memory_format);
  double nonfinite = 0;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const Sample sample = ds.get(i);
    const auto file = sample.meta.find(c.train.image_key);
    const std::string where =
        str("validation item ", ds.global_index(i),
            file != sample.meta.end() && file->is_string() ? " (" + file->get<std::string>() + ")" : "");
    const detail::CaseScores scores = detail::score_case(sample, c, predict, device, c.validation.hd95, where);
    if (scores.nonfinite_logits) ++nonfinite;  // its NaN scores would drop out of the means
    dice.add(scores.dice);
    if (c.validation.hd95) hd.add(scores.hd95);
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
  if (comm && comm->world_size() > 1) {
    at::Tensor n = at::full({1}, nonfinite, at::kDouble);
    comm->allreduce_sum(n);
    nonfinite = n.item<double>();
  }
  v.nonfinite_cases = static_cast<std::int64_t>(nonfinite);
  const MeanMetric d = reduce(dice);
  const at::Tensor per = d.per_class().to(at::kDouble).contiguous();
  for (std::int64_t k = 0; k < per.numel(); ++k) v.dice.push_back(per[k].item<double>());
  v.mean_dice = d.mean();
  if (c.validation.hd95) v.hd95 = reduce(hd).mean();
  if (v.nonfinite_cases > 0) {  // not a score of 0, nor a mean over the other cases: no score
    v.mean_dice = std::nan("");
    for (double& x : v.dice) x = std::nan("");
    if (v.hd95) v.hd95 = std::nan("");
  }
  model.module->train();
  return v;
}

/// One invocation of Trainer::run, in named steps:
///   open the run folder (run_dir.hpp) -> set_up_device -> prepare_data ->
///   build_model_and_optimizer -> check_validation_window -> restore (resume) -> epochs:
///   train_epoch (the TrainingStep of step.hpp per batch; each step's outcome taken a step
///   later) then finish_epoch (validation, best/last checkpoints, metrics).
class Run {
 public:
  Run(const RunConfig& c, const Settings& settings, const TrainCallbacks& cb)
      : c_(c), t_(c.train), settings_(settings), cb_(cb), comm_(c.collective.get()),
        rank0_(!comm_ || comm_->rank() == 0), distributed_(comm_ && comm_->world_size() > 1),
        folder_(t_.run_dir, rank0_, [this](const std::string& m) { say(m); }) {}

  TrainResult run(bool resume, bool overwrite) {
    start_ = Clock::now();
    first_epoch_ = folder_.open(resume, overwrite, c_.root, t_.epochs, t_.target_dice);
    set_up_device();
    if (t_.profile.memory && !device_.is_cuda()) {
      throw ValueError(str("train.profile.memory records the CUDA caching allocator's history, and the run's device is ",
                           device_text_, " (on the CPU, metrics.jsonl's peak_rss_bytes and a trace's counters show memory)"));
    }
    if (std::string why; t_.profile.memory && !detail::record_cuda_memory_history(false, why)) {
      throw ValueError(str("train.profile.memory: ", why));
    }
    prepare_data();
    check_cuda_graph();
    build_model_and_optimizer();
    check_validation_window();
    if (resume) restore();
    folder_.set_aside_old_run();
    try {
      return train();
    } catch (...) {
      folder_.put_back_old_run([this] { events_.reset(); });
      throw;
    }
  }

 private:
  /// The run from its first written file on (run() checks and builds everything before).
  TrainResult train() {
    if (rank0_) {
      os::write_text_file(folder_.will_write("config.json"), c_.root.dump(2) + "\n");
      os::write_text_file(folder_.will_write("machine.json"), machine_json().dump(2) + "\n");
      // A resumed run starts a new file whose steps continue: TensorBoard merges a folder's files.
      if (t_.tensorboard) {
        events_.emplace(t_.run_dir);
        folder_.will_write(events_->path().substr(t_.run_dir.size() + 1));
      }
    }
    if (device_.is_cpu() && rank0_) warn_if_reference_blas();
    say(str("model ", c_.model.value("name", "?"), ": ", nn::count_parameters(*model_.module), " parameters; ",
            "device ", device_.str(), ", amp ", precision_name(precision_), ", ", nn::memory_format_name(memory_format_), ", ",
            model_threads_, " libtorch threads, ",
            pipeline_.loader.threads, " loader threads; ", loader_->batches_per_epoch(), " steps per epoch"));
    model_.module->train();
    // Only rank 0 writes files: the other ranks' profilers stay off.
    profiler_ = std::make_unique<StepProfiler>(
        rank0_ ? t_.profile : ProfileOptions{}, t_.run_dir + "/profiler",
        nlohmann::json{{"run_dir", t_.run_dir}, {"config", c_.path}, {"device", device_.str()},
                       {"rank", comm_ ? comm_->rank() : 0}},
        [this](const std::string& path) { folder_.will_write(path.substr(t_.run_dir.size() + 1)); });
    trace::set_thread_name("main");
    start_gpu_sampler();
    for (int epoch = first_epoch_; epoch < t_.epochs && !result_.reached_target; ++epoch) {
      const auto epoch_start = Clock::now();
      os::reset_peak_rss();
      detail::reset_cuda_memory_peaks(device_);
      EpochRecord rec = train_epoch(epoch);
      if (result_.stopped) break;  // mid-epoch: last.ckpt holds the epoch so far
      finish_epoch(epoch, epoch_start, rec);
      folder_.first_checkpoint_written();
      if (epoch + 1 < t_.epochs && !result_.reached_target && stop_agreed()) {
        result_.stopped = StopPoint{stop_signal_, rec.epoch, rec.steps, /*mid_epoch=*/false};
        break;
      }
    }
    loader_->stop();
    profiler_->finish();
    for (const auto& f : profiler_->written()) say(str("trace: ", f));
    result_.seconds = seconds_since(start_);
    if (result_.best_epoch > 0) {
      result_.best_checkpoint = folder_.best_checkpoint();
    } else {
      result_.no_best_checkpoint = no_best_reason();
    }
    return result_;
  }

  /// Why no epoch gave a finite validation Dice (best.ckpt is written at one that does).
  std::string no_best_reason() const {
    if (!val_ds_) return "the run has no validation items (data.validation), so no Dice";
    if (data_checks_ && data_checks_->validation_labels_empty()) {
      return "no validation label has any foreground, and MONAI's DiceMetric (ignore_empty) leaves out a class whose "
             "ground truth is empty: every epoch's Dice is NaN";
    }
    const bool nonfinite = std::any_of(result_.history.begin(), result_.history.end(),
                                       [](const EpochRecord& e) { return e.nonfinite_validation_cases > 0; });
    if (nonfinite) return "validation cases gave NaN or infinite logits, which are not scored";
    const bool validated = std::any_of(result_.history.begin(), result_.history.end(),
                                       [](const EpochRecord& e) { return e.dice.has_value(); });
    if (!validated) return "no epoch was validated";
    return "no epoch gave a finite validation Dice: a class whose ground truth is empty in every validation case has "
           "none (MONAI's DiceMetric, ignore_empty), and the mean is NaN where no class has one";
  }

  void say(const std::string& m) const {
    if (rank0_ && cb_.message) cb_.message(m);
  }

  void set_up_device() {
    // With its index ("cuda" resolved on this thread): the caches and the loader put their
    // tensors there, not on their threads' GPU 0.
    const DeviceChoice chosen = choose_device(t_.device, c_.path + ": train.device");
    device_ = chosen.device;
    device_text_ = chosen.text;
    runtime_ = runtime_info(device_);
    // The first line of the run: which device, and why (auto's reasons name libtorch already).
    const bool versions_said = device_text_.find("libtorch") != std::string::npos;
    say(str("device ", device_text_, versions_said ? "" : str("; ", runtime_text(runtime_))));
    precision_ = parse_precision(t_.amp, device_.is_cuda(), c_.path + ": train.amp");
    memory_format_ = resolve_memory_format(t_.memory_format, device_);
    apply_cuda_determinism(device_, t_.deterministic);
    model_threads_ = apply_network_threads(t_.threads, settings_);
    apply_host_memory_reuse(settings_);
    apply_conv_backward(settings_);
    apply_conv_forward(settings_);
    // Before the first forward, with the threads the network runs on (libtorch picks its
    // convolution kernels by them): wrong math stops here, or its backend is switched off.
    self_check_ = ensure_backends_checked(device_, precision_dtype(precision_), settings_.get_bool("self_check"));
    nonfinite_ = std::make_unique<NonFiniteGuard>(precision_, max_nonfinite_steps(t_.max_nonfinite_steps, precision_));
    trace::set_nvtx(device_.is_cuda());  // Nsight Systems shows medfast's ranges beside the kernels
  }

  /// train.cuda_graph: on, where a captured step can replay: a CUDA device, one process, no
  /// profiler, every batch of one shape (a smaller last batch would not fit the capture).
  void check_cuda_graph() const {
    if (t_.cuda_graph != CudaGraph::on) return;
    const std::string key = c_.path + ": train.cuda_graph: on";
    if (t_.profile.enabled || t_.profile.memory) {
      throw ValueError(str(key, " and train.profile exclude each other (a captured step has no stages to trace); "
                                "set one off"));
    }
    if (distributed_) {
      throw ValueError(str(key, " runs one process: under DDP the gradients are averaged on the host's schedule, "
                                "which a captured step cannot follow; set it off"));
    }
    const std::size_t items = loader_->epoch_order(0).size(), batch = static_cast<std::size_t>(pipeline_.loader.batch_size);
    if (!pipeline_.loader.drop_last && items % batch != 0) {
      throw ValueError(str(key, " replays one step for batches of one shape; ", items, " training items in batches of ",
                           batch, " leave a last batch of ", items % batch,
                           ": set data.loader.drop_last: true (or train.cuda_graph off)"));
    }
    if (!device_.is_cuda()) {
      throw ValueError(str(key, " needs a CUDA device (a CUDA graph replays GPU work); the run's device is ", device_text_));
    }
  }

  /// Fills the caches (a killed run resumes the fill where it stopped) and makes the loader.
  void prepare_data() {
    pipeline_ = c_.data;
    pipeline_.loader.device = device_.str();
    pipeline_.cache.store.device = device_.is_cuda() ? device_.str() : pipeline_.cache.store.device;
    pipeline_.loader.pin_memory = pipeline_.loader.pin_memory || device_.is_cuda();
    pipeline_.loader.channels_last = memory_format_ == at::MemoryFormat::ChannelsLast3d;
    // Under DDP each rank's dataset is already its (padded) partition of the items
    // (CachedDataset, from RANK/WORLD_SIZE), so the loader does not split it again.
    // The smart cache's window is the same on every rank: there the loader's
    // DistributedSampler split (padded to equal lengths) divides it.
    if (comm_) {  // the process group decides the partition (also under SLURM without RANK set)
      pipeline_.cache.rank = comm_->rank();
      pipeline_.cache.world_size = comm_->world_size();
    }
    pipeline_.loader.rank = pipeline_.smart() && comm_ ? comm_->rank() : 0;
    pipeline_.loader.world_size = pipeline_.smart() && comm_ ? comm_->world_size() : 1;
    const auto prep_start = Clock::now();
    // The dataset check (data/check.hpp): headers now, labels as the fill computes them.
    data_checks_ = std::make_unique<detail::RunDataChecks>(c_);
    for (const auto& w : data_checks_->check_headers()) say(w);
    const bool one_process = !distributed_;  // a rank sees its partition only
    data::Loader::Source source;
    std::size_t train_size = 0;
    if (pipeline_.smart()) {
      smart_ = data::make_smart_cache(pipeline_);
      smart_->set_check(data_checks_->training_check());
      smart_->start(static_cast<std::size_t>(first_epoch_));  // the window where a resumed run left it
      train_size = smart_->size();
      const bool whole_window = one_process && train_size == pipeline_.dataset.items.size();
      for (const auto& w : data_checks_->after_training_fill(whole_window)) say(w);
      source = [this](std::size_t i) { return smart_->get(i); };
    } else {
      train_ds_ = std::make_unique<data::CachedDataset>(data::make_cached_dataset(pipeline_));
      train_ds_->set_check(data_checks_->training_check());
      const auto r = train_ds_->fill(fill_progress("training items"));
      say(str("training items: ", train_ds_->size(), " (", r.computed, " preprocessed, ", r.reused,
              " from the cache, ", std::lround(r.seconds * 10) / 10.0, " s)"));
      for (const auto& w : data_checks_->after_training_fill(one_process && r.computed == train_ds_->size())) say(w);
      train_size = train_ds_->size();
      source = [this](std::size_t i) { return train_ds_->get(i); };
    }
    if (!pipeline_.validation.items.empty()) {
      val_ds_ = std::make_unique<data::CachedDataset>(data::make_validation_dataset(pipeline_));
      val_ds_->set_check(data_checks_->validation_check());
      const auto r = val_ds_->fill(fill_progress("validation items"));
      say(str("validation items: ", val_ds_->size(), " (", r.computed, " preprocessed, ", r.reused,
              " from the cache)"));
      for (const auto& w : data_checks_->after_validation_fill(one_process && r.computed == val_ds_->size())) say(w);
    } else {
      say("no validation items (data.validation): no Dice, no best.ckpt");
    }
    result_.prepare_seconds = seconds_since(prep_start);
    loader_ = std::make_unique<data::Loader>(train_size, source, data::make_random_chain(pipeline_), pipeline_.loader);
    if (train_ds_) loader_->set_item_ids([this](std::size_t i) { return train_ds_->global_index(i); });
  }

  std::function<void(std::size_t, std::size_t)> fill_progress(const std::string& what) const {
    if (!rank0_ || !cb_.progress) return {};
    return [this, what](std::size_t done, std::size_t total) { cb_.progress(what, done, total); };
  }

  /// On CUDA: this rank's GPU sampled every second through NVML (one line where it cannot be).
  void start_gpu_sampler() {
    if (!device_.is_cuda()) return;
    std::string why;
    const int index = device_.has_index() ? device_.index() : 0;
    gpu_sampler_ = profile::GpuSampler::start({{detail::cuda_pci_bus_id(device_), static_cast<unsigned>(index)}},
                                              std::chrono::milliseconds(1000), why);
    if (!gpu_sampler_) say(str("GPU sampling off: ", why));
  }

  void build_model_and_optimizer() {
    model_ = build_model(c_, device_);
    class_names_ = metric_class_names(c_, model_.classes);
    nn::set_memory_format(*model_.module, memory_format_);  // before the optimizer: its state follows
    if (distributed_) {
      torch::NoGradGuard g;
      comm_->broadcast_coalesced(nn::unique_tensors(model_.module->parameters()), 0);
      comm_->broadcast_coalesced(nn::unique_tensors(model_.module->buffers()), 0);
    }
    // Each tensor once: a module registered under two names (DynUNet, as MONAI's) lists its
    // tensors twice, which would step them twice and unscale their gradients twice.
    params_ = nn::unique_tensors(model_.module->parameters());
    buffers_ = nn::unique_tensors(model_.module->buffers());
    // DDP: gradients are averaged in buckets that start while backward runs.
    if (distributed_) grad_sync_ = comm_->gradient_sync(params_);
    optimizer_ = make_optimizer(params_, c_.optimizer);
    GradScalerOptions so;
    so.enabled = precision_ == Precision::fp16;
    scaler_ = std::make_unique<GradScaler>(so);
    loss_fn_ = std::make_unique<Loss>(c_.loss);
    TrainingStep::Parts parts;
    parts.model = model_.any;
    parts.params = params_;
    parts.buffers = buffers_;
    parts.optimizer = optimizer_.get();
    parts.optimizer_name = c_.optimizer.name;
    parts.scaler = scaler_.get();
    parts.loss = loss_fn_.get();
    parts.supervision_weights = nn::parse_network(c_.model, c_.path + ": model").deep_supervision_weights;
    parts.comm = distributed_ ? comm_ : nullptr;
    parts.grad_sync = grad_sync_.get();
    parts.loss_filter = cb_.loss_filter;
    StepOptions so_step;
    so_step.device = device_;
    so_step.precision = precision_;
    so_step.memory_format = memory_format_;
    so_step.cuda_graph = t_.cuda_graph == CudaGraph::on;
    step_ = std::make_unique<TrainingStep>(std::move(parts), so_step);
    result_.run_dir = t_.run_dir;
    result_.class_names = class_names_;
  }

  /// A validation window through the network now, not after the first epoch: a
  /// roi_size the network cannot take (SegResNet: multiples of 8, SwinUNETR: of 32)
  /// or a channel mismatch is reported before any training. roi_size entries <= 0
  /// mean the image's own size (MONAI): the first validation image's window stands for them.
  void check_validation_window() {
    if (!val_ds_) return;
    std::vector<std::int64_t> shape{1, c_.model.value("in_channels", std::int64_t{1})};
    std::optional<std::vector<std::int64_t>> image_shape;
    const auto& roi = c_.sliding_window.roi_size;
    if (!std::all_of(roi.begin(), roi.end(), [](std::int64_t r) { return r > 0; }) && val_ds_->size() > 0) {
      const Sample first = val_ds_->get(0);
      const auto it = first.volumes.find(t_.image_key);
      if (it != first.volumes.end()) image_shape = it->second.data.sizes().vec();
    }
    for (std::size_t d = 0; d < roi.size(); ++d) {
      shape.push_back(roi[d] > 0 || !image_shape || image_shape->size() <= d + 1 ? roi[d] : (*image_shape)[d + 1]);
    }
    if (!std::all_of(shape.begin() + 2, shape.end(), [](std::int64_t n) { return n > 0; })) return;
    torch::NoGradGuard g;
    model_.module->eval();
    const std::string what = str(c_.path, ": the network cannot take a validation window of ", at::IntArrayRef(shape),
                                 " (validation.sliding_window.roi_size, model.in_channels)");
    const at::Tensor out = with_context(what, [&] {
      return model_.forward(nn::to_memory_format(at::zeros(shape, at::TensorOptions().device(device_)), memory_format_));
    });
    std::vector<std::int64_t> want = shape;
    want[1] = model_.classes;
    if (out.sizes() != at::IntArrayRef(want)) {
      throw ValueError(str(what, ": it returns ", out.sizes(), ", not ", at::IntArrayRef(want),
                           " (choose a roi_size the network's strides divide)"));
    }
    model_.module->train();
  }

  void restore() {
    const nlohmann::json meta = load_checkpoint(folder_.last_checkpoint(), *model_.module, optimizer_.get());
    first_epoch_ = meta.at("epoch");
    elapsed_before_ = meta.value("elapsed", 0.0);
    result_.best_dice = meta.value("best_dice", -1.0);
    result_.best_epoch = meta.value("best_epoch", 0);
    // Against this run's target: a resumed run with a higher target (or none) trains on.
    result_.reached_target = t_.target_dice > 0 && result_.best_dice >= t_.target_dice;
    if (result_.reached_target && meta.value("reached_target", false) && meta.contains("time_to_target") &&
        meta["time_to_target"].is_number()) {
      result_.time_to_target = meta["time_to_target"].get<double>();
    }
    for (const auto& e : meta.at("history")) result_.history.push_back(EpochRecord::from_json(e));
    if (meta.contains("scaler")) scaler_->load_state(meta["scaler"]);
    lay_out_state_as_parameters(*optimizer_);  // checkpoints hold it contiguous
    if (meta.contains("partial")) {
      partial_ = meta["partial"];
      say(str("resuming ", folder_.last_checkpoint(), " in epoch ", first_epoch_ + 1, " after step ",
              partial_->at("record").at("steps").get<int>()));
    } else {
      say(str("resuming ", folder_.last_checkpoint(), " after epoch ", first_epoch_));
    }
  }

  EpochRecord train_epoch(int epoch) {
    const auto epoch_start = Clock::now();
    EpochRecord rec;
    rec.epoch = epoch + 1;
    rec.lr = scheduled_lr(c_.schedule, c_.optimizer.lr, epoch, t_.epochs);
    set_learning_rate(*optimizer_, rec.lr);
    torch::manual_seed(derive_seed({t_.seed, static_cast<std::uint64_t>(epoch), 0x7a41}));
    EpochLosses losses;
    if (partial_) {  // resumed where a stop left this epoch: its steps so far, losses, times and generators
      rec = EpochRecord::from_json(partial_->at("record"));
      losses.sum = partial_->at("loss_sum");
      losses.finite_steps = partial_->at("finite_steps");
      carried_seconds_ = rec.seconds;
      restore_generators(partial_->at("generators"));
      nonfinite_->set_bad_in_a_row(partial_->value("bad_in_a_row", 0));
      partial_.reset();
    }
    loader_->start(static_cast<std::uint64_t>(epoch), static_cast<std::size_t>(rec.steps));
    const long steps_per_epoch = static_cast<long>(loader_->batches_per_epoch());
    for (;;) {
      const long global_step = epoch * steps_per_epoch + rec.steps;
      profiler_->before_step(global_step);
      std::optional<trace::Range> step;
      step.emplace("step");
      step->arg("epoch", rec.epoch).arg("step", rec.steps + 1);
      const auto t0 = Clock::now();
      std::optional<data::Batch> batch;
      {
        trace::Range wait("data_wait");
        batch = loader_->next();
        if (!batch) wait.cancel();
      }
      rec.times.data_wait += seconds_since(t0);
      if (!batch) {
        step->cancel();
        break;
      }
      const at::Tensor& image = batch_tensor(*batch, t_.image_key, "train.image_key");
      rec.samples += image.size(0);
      const StepLabel label{rec.epoch, rec.steps + 1, batch->items, batch->files};
      const std::optional<StepOutcome> done =
          step_->run(image, batch_tensor(*batch, t_.label_key, "train.label_key"), label, rec.times);
      ++rec.steps;
      if (done) take(*done, rec, losses);
      step.reset();  // the step's range ends before the profiler may write the cycle's trace
      profiler_->after_step(global_step);
      if (stop_requested(global_step + 1)) {
        result_.stopped = StopPoint{stop_signal_, rec.epoch, rec.steps, /*mid_epoch=*/true};
        break;
      }
    }
    // The epoch's last step, read back (on a GPU this waits for it, and its stage times).
    if (const std::optional<StepOutcome> done = step_->finish(rec.times)) take(*done, rec, losses);
    if (result_.stopped) {
      loader_->stop();
      save_partial(epoch, rec, losses, seconds_since(epoch_start) + carried_seconds_);
      return rec;
    }
    const double train_seconds = seconds_since(epoch_start) + carried_seconds_;
    rec.loss = losses.finite_steps ? losses.sum / losses.finite_steps : std::nan("");
    double all_samples = static_cast<double>(rec.samples);
    if (distributed_) {
      at::Tensor l = at::tensor({losses.sum, static_cast<double>(losses.finite_steps), all_samples}, at::kDouble);
      comm_->allreduce_sum(l);
      rec.loss = l[0].item<double>() / std::max(1.0, l[1].item<double>());
      all_samples = l[2].item<double>();
    }
    rec.samples_per_second = train_seconds > 0 ? all_samples / train_seconds : 0;
    return rec;
  }

  /// The epoch's loss is the mean of its finite step losses.
  struct EpochLosses {
    double sum = 0;
    int finite_steps = 0;
  };

  /// A step's outcome, read back a step after it ran (step.hpp): its loss into the epoch's,
  /// TensorBoard and the step callback; a skipped update counted, and the run stopped after
  /// train.max_nonfinite_steps of them in a row (NonFiniteLoss names that step).
  void take(const StepOutcome& done, EpochRecord& rec, EpochLosses& losses) {
    const int steps = static_cast<int>(loader_->batches_per_epoch());
    const int epoch = done.label.epoch;
    if (!done.applied) ++rec.skipped_steps;
    nonfinite_->record(epoch, done.label.step, steps, done.loss, done.applied,
                       [this, epoch] { return nonfinite_context(epoch); });
    if (events_) {  // MONAI's tutorials' x axis: epoch_len * epoch + step, 1-based
      const double now = profile::unix_seconds();
      const long global = static_cast<long>(epoch - 1) * steps + done.label.step;
      events_->scalar("train_loss", done.loss, global, now);
      events_->scalar("learning_rate", rec.lr, global, now);
    }
    if (std::isfinite(done.loss)) {
      losses.sum += done.loss;
      ++losses.finite_steps;
    }
    if (rank0_ && cb_.step) cb_.step(epoch, done.label.step, steps, done.loss);
  }

  /// The end of NonFiniteLoss's message: what is kept, and where to look.
  std::string nonfinite_context(int epoch) const {
    std::string kept;
    if (!rank0_) {
      kept = "Rank 0 keeps the checkpoints written so far";
    } else if (os::exists(folder_.last_checkpoint())) {
      kept = str(folder_.last_checkpoint(), " (epoch ", epoch - 1, ")", os::exists(folder_.best_checkpoint()) ? str(" and ", folder_.best_checkpoint()) : "",
                 " are kept; epoch ", epoch, " is not saved");
    } else {
      kept = "No checkpoint was written yet";
    }
    const std::string check = self_check_.ran ? str("the backend self-check passed (", self_check_.summary(), ")")
                                              : "the backend self-check is off (self_check setting)";
    return str(kept, ". Look at: the learning rate (optimizer.lr ", c_.optimizer.lr, "), mixed precision (train.amp ",
               precision_name(precision_), precision_ == Precision::fp32 ? "" : "; try fp32", "), the data (NaN voxels), ",
               check);
  }

  /// Validation (every validation.interval epochs and the last), the best Dice and the
  /// target, then best.ckpt (before last.ckpt: last.ckpt's record of the best epoch
  /// must never name a best.ckpt not yet written), last.ckpt and metrics.jsonl.
  void finish_epoch(int epoch, Clock::time_point epoch_start, EpochRecord& rec) {
    const bool last_epoch = epoch + 1 == t_.epochs;
    if (val_ds_ && ((epoch + 1) % c_.validation.interval == 0 || last_epoch)) {
      const auto v0 = Clock::now();
      trace::Range range("validation");
      const Validation v = validate(model_, *val_ds_, c_, device_, precision_, memory_format_, comm_);
      rec.times.validation = seconds_since(v0);
      rec.dice = v.mean_dice;
      rec.dice_per_class = v.dice;
      if (class_names_.size() == v.dice.size()) rec.class_names = class_names_;
      rec.hd95 = v.hd95;
      rec.nonfinite_validation_cases = v.nonfinite_cases;
    }
    rec.seconds = seconds_since(epoch_start) + carried_seconds_;
    carried_seconds_ = 0;
    rec.elapsed = elapsed_before_ + seconds_since(start_);
    rec.process_seconds = os::process_seconds();
    rec.peak_rss_bytes = os::peak_rss_bytes();
    if (gpu_sampler_) {
      const profile::GpuEpochStats g = gpu_sampler_->take();
      if (g.samples > 0) rec.gpu = g.to_json();
    }
    if (const auto peaks = detail::cuda_memory_peaks(device_)) {
      rec.cuda_peak_allocated = peaks->first;
      rec.cuda_peak_reserved = peaks->second;
    }
    bool improved = false;
    if (rec.dice && std::isfinite(*rec.dice) && *rec.dice > result_.best_dice) {
      result_.best_dice = *rec.dice;
      result_.best_epoch = rec.epoch;
      improved = true;
    }
    if (rec.dice && t_.target_dice > 0 && *rec.dice >= t_.target_dice && !result_.reached_target) {
      result_.reached_target = true;
      result_.time_to_target = rec.elapsed;
    }
    result_.history.push_back(rec);
    if (smart_) smart_->update();  // MONAI: the window slides at each epoch's end
    if (rank0_) {
      trace::Range range("checkpoint");
      const nlohmann::json meta = checkpoint_meta(rec.epoch, rec.elapsed);
      if (improved) save_checkpoint(folder_.will_write("best.ckpt"), *model_.module, nullptr, meta);
      save_checkpoint(folder_.will_write("last.ckpt"), *model_.module, optimizer_.get(), meta);
      std::vector<nlohmann::json> epochs;
      for (const auto& e : result_.history) epochs.push_back(e.to_json());
      detail::write_metrics(folder_.will_write("metrics.jsonl"), epochs);
      if (events_) {  // after last.ckpt: a run killed before this flush resumes after this epoch, no step twice
        detail::epoch_events(*events_, rec, model_.classes - static_cast<std::int64_t>(rec.dice_per_class.size()));
        events_->flush();
      }
    }
    if (rank0_ && cb_.epoch) cb_.epoch(rec);
  }

  /// Debian's libtorch computes its CPU convolutions through whichever libblas.so.3 is
  /// selected; the reference one (libblas3 alone) trains 2-4x slower than OpenBLAS.
  static void warn_if_reference_blas() {
    const std::string blas = os::library_of_symbol("sgemm_");
    if (blas.find("/blas/libblas.so") == std::string::npos) return;
    medfast::log::warn("libtorch computes with the reference BLAS (", blas, "): CPU training is 2-4x slower than with an "
              "optimised one; install libopenblas0-openmp (Debian, Ubuntu: scripts/setup.sh does) or select one "
              "with update-alternatives --config libblas.so.3-x86_64-linux-gnu");
  }

  /// What `medfast report` shows about where the run ran.
  nlohmann::json machine_json() const {
    const os::MachineInfo m = os::machine_info();
    nlohmann::json j{{"hostname", m.hostname},
                     {"cpu", m.cpu},
                     {"cores", m.cores},
                     {"memory", format_bytes(m.memory_bytes)},
                     {"kernel", m.kernel},
                     {"medfast", kVersion},
                     {"libtorch", str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH)},
                     {"device", device_.str()},
                     {"device_choice", device_text_},
                     {"runtime", runtime_},
                     {"libtorch_threads", model_threads_},
                     {"loader_threads", pipeline_.loader.threads},
                     {"ranks", comm_ ? comm_->world_size() : 1},
                     {"blas", os::library_of_symbol("sgemm_")},
                     {"self_check", self_check_.to_json()}};
    if (device_.is_cuda()) j["cuda_devices"] = static_cast<int>(torch::cuda::device_count());
    return j;
  }

  nlohmann::json checkpoint_meta(int epochs_done, double elapsed) const {
    nlohmann::json h = nlohmann::json::array();
    for (const auto& e : result_.history) h.push_back(e.to_json());
    return nlohmann::json{
        {"format", kCheckpointFormat},
        {"version", kCheckpointVersion},
        {"epoch", epochs_done},
        {"config", c_.root},
        {"config_dir", c_.base_dir},
        {"class_names", class_names_},
        {"best_dice", nan_to_null(result_.best_dice)},
        {"best_epoch", result_.best_epoch},
        {"reached_target", result_.reached_target},
        {"time_to_target", result_.time_to_target ? nlohmann::json(*result_.time_to_target) : nlohmann::json()},
        {"elapsed", elapsed},
        {"history", h},
        {"scaler", scaler_->state()},
        {"torch_threads", at::get_num_threads()},
        {"libtorch", str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH)}};
  }

  /// Steps between a distributed run's votes on a stop (one small all-reduce each): every
  /// step over Gloo (host memory, microseconds), every 8th over NCCL (a vote there waits for
  /// the device).
  long stop_vote_steps() const { return comm_ && std::string(comm_->backend()) == "nccl" ? 8 : 1; }

  /// Whether the run stops after the step that makes `steps_done` (over the run): a stop
  /// signal (TrainCallbacks::stop_signal) alone, or, under DDP, as every rank agrees: a vote
  /// every stop_vote_steps() steps, so that all ranks stop after the same step.
  bool stop_requested(long steps_done) {
    if (!distributed_) {
      stop_signal_ = cb_.stop_signal ? cb_.stop_signal() : 0;
      return stop_signal_ != 0;
    }
    return steps_done % stop_vote_steps() == 0 && stop_agreed();
  }
  /// The ranks' vote (alone: the signal): a stop if any rank was asked to.
  bool stop_agreed() {
    const int local = cb_.stop_signal ? cb_.stop_signal() : 0;
    if (!distributed_) {
      stop_signal_ = local;
      return local != 0;
    }
    at::Tensor vote = at::tensor({local != 0 ? 1 : 0, local}, at::kInt);  // ranks asked, their signals
    comm_->allreduce_sum(vote);
    const int asked = vote[0].item<int>();
    if (asked == 0) return false;
    stop_signal_ = local != 0 ? local : vote[1].item<int>() / asked;  // the others' (one signal, forwarded to all)
    return true;
  }

  /// The CPU's generator, and the run's CUDA device's, as bytes (a mid-epoch checkpoint).
  nlohmann::json generator_states() const {
    const auto bytes = [](const at::Tensor& t) {
      const at::Tensor c = t.contiguous().to(at::kByte);
      return std::vector<std::uint8_t>(c.data_ptr<std::uint8_t>(), c.data_ptr<std::uint8_t>() + c.numel());
    };
    nlohmann::json j{{"cpu", bytes(at::detail::getDefaultCPUGenerator().get_state())}};
    if (device_.is_cuda()) j["cuda"] = bytes(at::globalContext().defaultGenerator(device_).get_state());
    return j;
  }
  void restore_generators(const nlohmann::json& j) {
    const auto tensor = [](const nlohmann::json& v) {
      const auto b = v.get<std::vector<std::uint8_t>>();
      return at::tensor(at::ArrayRef<std::uint8_t>(b), at::kByte);
    };
    const auto set = [&](at::Generator g, const nlohmann::json& v) {  // a handle: the default generator itself
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(tensor(v));
    };
    set(at::detail::getDefaultCPUGenerator(), j.at("cpu"));
    if (device_.is_cuda() && j.contains("cuda")) set(at::globalContext().defaultGenerator(device_), j.at("cuda"));
  }

  /// A stop mid-epoch: last.ckpt holds the weights, the optimizer and this epoch's steps so
  /// far (its record, losses and the generators), so that --resume takes the next step as the
  /// run would have. best.ckpt, metrics.jsonl and the epoch's curves wait for the epoch's end.
  void save_partial(int epoch, EpochRecord rec, const EpochLosses& losses, double seconds) {
    if (!rank0_) return;
    trace::Range range("checkpoint");
    const double elapsed = elapsed_before_ + seconds_since(start_);
    rec.seconds = seconds;
    rec.elapsed = elapsed;
    rec.loss = losses.finite_steps ? losses.sum / losses.finite_steps : 0.0;  // its final value comes at the epoch's end
    nlohmann::json meta = checkpoint_meta(epoch, elapsed);
    meta["partial"] = {{"record", rec.to_json()},
                       {"loss_sum", losses.sum},
                       {"finite_steps", losses.finite_steps},
                       {"bad_in_a_row", nonfinite_->bad_in_a_row()},
                       {"generators", generator_states()},
                       {"signal", stop_signal_}};
    save_checkpoint(folder_.will_write("last.ckpt"), *model_.module, optimizer_.get(), meta);
    folder_.first_checkpoint_written();
    if (events_) events_->flush();
  }

  const RunConfig& c_;
  const TrainOptions& t_;
  const Settings& settings_;
  const TrainCallbacks& cb_;
  Collective* comm_;
  const bool rank0_, distributed_;
  Clock::time_point start_;
  detail::RunFolder folder_;
  int first_epoch_ = 0;
  double elapsed_before_ = 0;
  std::optional<nlohmann::json> partial_;  // last.ckpt's epoch so far, when a stop left one
  double carried_seconds_ = 0;             // that epoch's seconds before the stop
  int stop_signal_ = 0;
  c10::Device device_{c10::kCPU};
  std::string device_text_;  // the device and why (train/placement.hpp)
  nlohmann::json runtime_;   // libtorch, CUDA, cuDNN, the GPU
  Precision precision_ = Precision::fp32;
  at::MemoryFormat memory_format_ = at::MemoryFormat::Contiguous;
  SelfCheckReport self_check_;
  std::unique_ptr<NonFiniteGuard> nonfinite_;
  int model_threads_ = 1;
  data::PipelineConfig pipeline_;
  std::unique_ptr<detail::RunDataChecks> data_checks_;
  std::unique_ptr<data::CachedDataset> train_ds_, val_ds_;
  std::unique_ptr<data::SmartCacheDataset> smart_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<StepProfiler> profiler_;
  std::unique_ptr<profile::GpuSampler> gpu_sampler_;
  std::optional<profile::EventWriter> events_;  // rank 0, train.tensorboard
  Model model_;
  std::vector<std::string> class_names_;  ///< metric_class_names of the run
  std::vector<at::Tensor> params_, buffers_;
  std::unique_ptr<GradientSync> grad_sync_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<TrainingStep> step_;
  std::unique_ptr<Loss> loss_fn_;
  TrainResult result_;
};

}  // namespace

TrainResult Trainer::run(bool resume, const TrainCallbacks& cb, bool overwrite) {
  return Run(s_->config, s_->config.settings, cb).run(resume, overwrite);
}

}  // namespace medfast::train
