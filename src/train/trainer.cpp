#include "medfast/train/trainer.hpp"

#include "detail.hpp"

#include <torch/torch.h>
#include <torch/version.h>

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
#include "medfast/core/trace.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/nn/dynunet.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/train/self_check.hpp"
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
                    Collective* comm) {
  model.module->eval();
  torch::NoGradGuard no_grad;
  const std::int64_t classes = model.classes;
  MeanMetric dice, hd;
  const Predictor predict =
      detail::inference_predictor(c.model, model.any, c.settings, c.path + ": model", device, precision, c.validation.tta);
  double nonfinite = 0;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const detail::CaseScores scores =
        detail::score_case(ds.get(i), c, predict, device, c.validation.hd95, str("validation item ", ds.global_index(i)));
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
  os::write_text_file(dir + "/metrics.jsonl", text);
}

}  // namespace

namespace {

/// One invocation of Trainer::run, in named steps:
///   check_run_dir -> set_up_device -> prepare_data -> build_model_and_optimizer
///   -> check_validation_window -> restore (resume) -> epochs: train_epoch (train_step
///   per batch) then finish_epoch (validation, best/last checkpoints, metrics).
class Run {
 public:
  Run(const RunConfig& c, const Settings& settings, const TrainCallbacks& cb)
      : c_(c), t_(c.train), settings_(settings), cb_(cb), comm_(c.collective.get()),
        rank0_(!comm_ || comm_->rank() == 0), distributed_(comm_ && comm_->world_size() > 1) {}

  TrainResult run(bool resume, bool overwrite) {
    start_ = Clock::now();
    check_run_dir(resume, overwrite);
    set_up_device();
    if (t_.profile.memory && !device_.is_cuda()) {
      throw ValueError(str("train.profile.memory records the CUDA caching allocator's history, and train.device is ",
                           t_.device, " (on the CPU, metrics.jsonl's peak_rss_bytes and a trace's counters show memory)"));
    }
    if (std::string why; t_.profile.memory && !detail::record_cuda_memory_history(false, why)) {
      throw ValueError(str("train.profile.memory: ", why));
    }
    prepare_data();
    build_model_and_optimizer();
    check_validation_window();
    if (resume) restore();
    if (overwrite_) set_aside_old_run();
    try {
      return train();
    } catch (...) {
      if (!aside_.empty()) put_back_old_run();
      throw;
    }
  }

 private:
  /// The run from its first written file on (run() checks and builds everything before).
  TrainResult train() {
    if (rank0_) {
      os::write_text_file(t_.run_dir + "/config.json", c_.root.dump(2) + "\n");
      os::write_text_file(t_.run_dir + "/machine.json", machine_json().dump(2) + "\n");
      // A resumed run starts a new file whose steps continue: TensorBoard merges a folder's files.
      if (t_.tensorboard) events_.emplace(t_.run_dir);
    }
    if (device_.is_cpu() && rank0_) warn_if_reference_blas();
    say(str("model ", c_.model.value("name", "?"), ": ", nn::count_parameters(*model_.module), " parameters; ",
            "device ", t_.device, ", amp ", precision_name(precision_), ", ", model_threads_, " libtorch threads, ",
            pipeline_.loader.threads, " loader threads; ", loader_->batches_per_epoch(), " steps per epoch"));
    model_.module->train();
    // Only rank 0 writes files: the other ranks' profilers stay off.
    profiler_ = std::make_unique<StepProfiler>(
        rank0_ ? t_.profile : ProfileOptions{}, t_.run_dir + "/profiler",
        nlohmann::json{{"run_dir", t_.run_dir}, {"config", c_.path}, {"device", t_.device},
                       {"rank", comm_ ? comm_->rank() : 0}});
    trace::set_thread_name("main");
    start_gpu_sampler();
    for (int epoch = first_epoch_; epoch < t_.epochs && !result_.reached_target; ++epoch) {
      const auto epoch_start = Clock::now();
      os::reset_peak_rss();
      detail::reset_cuda_memory_peaks(device_);
      EpochRecord rec = train_epoch(epoch);
      finish_epoch(epoch, epoch_start, rec);
      if (!aside_.empty()) drop_old_run();  // the new run has its first checkpoint
    }
    loader_->stop();
    profiler_->finish();
    for (const auto& f : profiler_->written()) say(str("trace: ", f));
    result_.seconds = seconds_since(start_);
    return result_;
  }

  void say(const std::string& m) const {
    if (rank0_ && cb_.message) cb_.message(m);
  }

  /// A fresh run refuses a run_dir holding a run (unless overwrite); a resumed one
  /// needs last.ckpt written with the same data, model, loss, optimizer, schedule,
  /// seed and amp. Temporaries of killed writers go.
  void check_run_dir(bool resume, bool overwrite) {
    last_path_ = t_.run_dir + "/last.ckpt";
    best_path_ = t_.run_dir + "/best.ckpt";
    if (rank0_) {  // one train per run_dir: two would write one folder's files in turn
      os::make_directories(t_.run_dir);
      int holder = 0;
      std::optional<os::FileLock> lock = os::try_lock_file(t_.run_dir + "/" + kRunLockName, &holder);
      if (!lock) {
        throw ValueError(str("train.run_dir ", t_.run_dir, " is in use by another medfast train (pid ",
                             holder > 0 ? std::to_string(holder) : std::string("unknown"),
                             "): wait for it to finish, or choose another run_dir"));
      }
      run_lock_ = std::move(*lock);
    }
    if (resume && overwrite) throw ValueError("train: --resume and --overwrite exclude each other");
    if (!resume && os::exists(last_path_) && !overwrite) {
      throw ValueError(str("train.run_dir ", t_.run_dir, " already holds a run (", last_path_, ", epoch ",
                           read_checkpoint_meta(last_path_).value("epoch", 0),
                           "): pass --resume to continue it, --overwrite to start again, or choose another run_dir"));
    }
    overwrite_ = !resume && overwrite && rank0_;
    if (resume) {
      if (!os::exists(last_path_)) {
        throw ValueError(str("--resume: ", last_path_, " does not exist (train.run_dir is ", t_.run_dir, ")"));
      }
      const nlohmann::json meta = read_checkpoint_meta(last_path_);
      const std::string differs = diff_section(meta.at("config"), c_.root);
      if (!differs.empty()) {
        throw ValueError(str("--resume: the config's ", differs, " differs from the one ", last_path_,
                             " was trained with; resume needs the same ", differs, " (or start a new run_dir)"));
      }
      first_epoch_ = meta.at("epoch").get<int>();
    }
    if (rank0_) {
      // Temporaries of a writer that was killed (last.ckpt.tmp-<pid>-<n>, config.json.tmp-...).
      const os::Removed stale = os::remove_stale_temporaries(t_.run_dir);
      if (!stale.paths.empty()) {
        say(str("removed ", stale.paths.size(), " temporary files of an interrupted run from ", t_.run_dir, " (",
                format_bytes(stale.bytes), ")"));
      }
    }
  }

  /// --overwrite: the old run's files are moved into run_dir/<kOverwrittenName> when the new
  /// run is about to write its own, dropped once it has written its first checkpoint, and put
  /// back if it fails before: a run that cannot train does not cost the run it was to replace.
  /// (A process killed in between leaves them there, and says nothing; the next --overwrite
  /// replaces them.)
  void set_aside_old_run() {
    const std::string aside = t_.run_dir + "/" + kOverwrittenName;
    if (os::exists(aside)) remove_aside(aside);
    std::vector<std::string> old;
    for (const std::string& f : os::list_directory(t_.run_dir)) {
      if (old_run_file(f)) old.push_back(f);
    }
    if (old.empty()) return;
    os::make_directories(aside);
    for (const std::string& f : old) os::rename(t_.run_dir + "/" + f, aside + "/" + f);
    aside_ = aside;
  }
  void drop_old_run() {
    remove_aside(aside_);
    aside_.clear();
  }
  /// The set-aside folder and its files (it holds no folders).
  static void remove_aside(const std::string& aside) {
    for (const std::string& f : os::list_directory(aside)) os::remove_file(aside + "/" + f);
    os::remove_empty_directory(aside);
  }
  void put_back_old_run() noexcept {
    try {
      events_.reset();  // the new run's event file is closed, then removed with its other files
      for (const std::string& f : os::list_directory(t_.run_dir)) {
        if (old_run_file(f)) os::remove_file(t_.run_dir + "/" + f);
      }
      for (const std::string& f : os::list_directory(aside_)) os::rename(aside_ + "/" + f, t_.run_dir + "/" + f);
      os::remove_empty_directory(aside_);
      say(str("the run this one was to overwrite is back in ", t_.run_dir));
    } catch (const std::exception& e) {
      log::warn("train: could not put back the overwritten run (", aside_, "): ", e.what());
    }
    aside_.clear();
  }
  /// A file of a run that --overwrite replaces: checkpoints, metrics, config, machine, curves.
  static bool old_run_file(const std::string& name) {
    static const std::set<std::string> files{"last.ckpt", "best.ckpt", "metrics.jsonl", "config.json", "machine.json"};
    return files.count(name) > 0 || profile::is_event_file(name);
  }

  void set_up_device() {
    // With its index ("cuda" resolved on this thread): the caches and the loader put their
    // tensors there, not on their threads' GPU 0.
    device_ = detail::usable_device(t_.device, c_.path + ": train.device");
    precision_ = parse_precision(t_.amp, device_.is_cuda(), c_.path + ": train.amp");
    if (device_.is_cuda()) {
      at::globalContext().setDeterministicCuDNN(t_.deterministic);
      at::globalContext().setBenchmarkCuDNN(!t_.deterministic);
      if (t_.deterministic) {
        // Deterministic kernels where torch has them; a warning names any op without one.
        ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
        at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
      }
    }
    model_threads_ = apply_network_threads(t_.threads, settings_);
    apply_host_memory_reuse(settings_);
    apply_conv_backward(settings_);
    apply_conv_forward(settings_);
    // Before the first forward, with the threads the network runs on (libtorch picks its
    // convolution kernels by them): wrong math stops here, or its backend is switched off.
    self_check_ = ensure_backends_checked(device_, precision_dtype(precision_), settings_.get_bool("self_check"));
    nonfinite_ = std::make_unique<NonFiniteGuard>(precision_, max_nonfinite_steps(t_.max_nonfinite_steps, precision_));
    clock_ = std::make_unique<detail::StageClock>(device_);
    trace::set_nvtx(device_.is_cuda());  // Nsight Systems shows medfast's ranges beside the kernels
  }

  /// Fills the caches (a killed run resumes the fill where it stopped) and makes the loader.
  void prepare_data() {
    pipeline_ = c_.data;
    pipeline_.loader.device = device_.str();
    pipeline_.cache.store.device = device_.is_cuda() ? device_.str() : pipeline_.cache.store.device;
    pipeline_.loader.pin_memory = pipeline_.loader.pin_memory || device_.is_cuda();
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
    data::Loader::Source source;
    std::size_t train_size = 0;
    if (pipeline_.smart()) {
      smart_ = data::make_smart_cache(pipeline_);
      smart_->start(static_cast<std::size_t>(first_epoch_));  // the window where a resumed run left it
      train_size = smart_->size();
      source = [this](std::size_t i) { return smart_->get(i); };
    } else {
      train_ds_ = std::make_unique<data::CachedDataset>(data::make_cached_dataset(pipeline_));
      const auto r = train_ds_->fill(fill_progress("training items"));
      say(str("training items: ", train_ds_->size(), " (", r.computed, " preprocessed, ", r.reused,
              " from the cache, ", std::lround(r.seconds * 10) / 10.0, " s)"));
      train_size = train_ds_->size();
      source = [this](std::size_t i) { return train_ds_->get(i); };
    }
    if (!pipeline_.validation.items.empty()) {
      val_ds_ = std::make_unique<data::CachedDataset>(data::make_validation_dataset(pipeline_));
      const auto r = val_ds_->fill(fill_progress("validation items"));
      say(str("validation items: ", val_ds_->size(), " (", r.computed, " preprocessed, ", r.reused,
              " from the cache)"));
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
    supervision_weights_ = nn::parse_network(c_.model, c_.path + ": model").deep_supervision_weights;
    result_.run_dir = t_.run_dir;
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
    const at::Tensor out =
        with_context(what, [&] { return model_.forward(at::zeros(shape, at::TensorOptions().device(device_))); });
    std::vector<std::int64_t> want = shape;
    want[1] = model_.classes;
    if (out.sizes() != at::IntArrayRef(want)) {
      throw ValueError(str(what, ": it returns ", out.sizes(), ", not ", at::IntArrayRef(want),
                           " (choose a roi_size the network's strides divide)"));
    }
    model_.module->train();
  }

  void restore() {
    const nlohmann::json meta = load_checkpoint(last_path_, *model_.module, optimizer_.get());
    first_epoch_ = meta.at("epoch");
    elapsed_before_ = meta.value("elapsed", 0.0);
    result_.best_dice = meta.value("best_dice", -1.0);
    result_.best_epoch = meta.value("best_epoch", 0);
    result_.reached_target = meta.value("reached_target", false);
    if (meta.contains("time_to_target") && meta["time_to_target"].is_number()) {
      result_.time_to_target = meta["time_to_target"].get<double>();
    }
    for (const auto& e : meta.at("history")) result_.history.push_back(EpochRecord::from_json(e));
    if (meta.contains("scaler")) scaler_->load_state(meta["scaler"]);
    say(str("resuming ", last_path_, " after epoch ", first_epoch_));
  }

  EpochRecord train_epoch(int epoch) {
    const auto epoch_start = Clock::now();
    EpochRecord rec;
    rec.epoch = epoch + 1;
    rec.lr = scheduled_lr(c_.schedule, c_.optimizer.lr, epoch, t_.epochs);
    set_learning_rate(*optimizer_, rec.lr);
    torch::manual_seed(derive_seed({t_.seed, static_cast<std::uint64_t>(epoch), 0x7a41}));
    loader_->start(static_cast<std::uint64_t>(epoch));
    double loss_sum = 0;
    int finite_steps = 0;  // the epoch's loss is the mean of its finite step losses
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
      rec.samples += batch_tensor(*batch, t_.image_key, "train.image_key").size(0);
      const double step_loss = train_step(*batch, rec);
      if (events_) {  // MONAI's tutorials' x axis: epoch_len * epoch + step, 1-based
        const double now = profile::unix_seconds();
        events_->scalar("train_loss", step_loss, global_step + 1, now);
        events_->scalar("learning_rate", rec.lr, global_step + 1, now);
      }
      if (std::isfinite(step_loss)) {
        loss_sum += step_loss;
        ++finite_steps;
      }
      step.reset();  // the step's range ends before the profiler may write the cycle's trace
      profiler_->after_step(global_step);
    }
    clock_->flush(rec.times);  // the epoch's last step has run on the device too
    const double train_seconds = seconds_since(epoch_start);
    rec.loss = finite_steps ? loss_sum / finite_steps : std::nan("");
    double all_samples = static_cast<double>(rec.samples);
    if (distributed_) {
      at::Tensor l = at::tensor({loss_sum, static_cast<double>(finite_steps), all_samples}, at::kDouble);
      comm_->allreduce_sum(l);
      rec.loss = l[0].item<double>() / std::max(1.0, l[1].item<double>());
      all_samples = l[2].item<double>();
    }
    rec.samples_per_second = train_seconds > 0 ? all_samples / train_seconds : 0;
    return rec;
  }

  /// One batch: copy, forward, backward (gradients averaged across ranks while it
  /// runs), optimizer step with loss scaling. Returns the step's loss. The step's one
  /// host read (its loss, and whether a gradient is inf/NaN) waits for this stream alone;
  /// the stage times come from events on it (StageClock), read a step later.
  double train_step(const data::Batch& batch, EpochRecord& rec) {
    clock_->start();
    std::optional<trace::Range> stage(std::in_place, "copy");
    const at::Tensor x =
        batch_tensor(batch, t_.image_key, "train.image_key").to(device_, at::kFloat, /*non_blocking=*/true);
    const at::Tensor y = batch_tensor(batch, t_.label_key, "train.label_key").to(device_, /*non_blocking=*/true);
    std::string items;
    for (std::size_t i : batch.items) items += (items.empty() ? "" : ", ") + std::to_string(i);
    const std::string where = str("epoch ", rec.epoch, ", step ", rec.steps + 1, " (items ", items, ")");
    clock_->lap(&StageTimes::copy);
    stage.reset();

    if (distributed_ && !buffers_.empty()) {  // BatchNorm statistics: rank 0's, as DDP's broadcast_buffers
      torch::NoGradGuard g;
      comm_->broadcast_coalesced(buffers_, 0);
    }
    stage.emplace("forward");
    at::Tensor loss;
    with_context(where, [&] {
      AutocastGuard autocast(device_.type(), precision_);
      const at::Tensor logits = model_.forward(x);
      loss = supervision_weights_.empty() ? (*loss_fn_)(logits.to(at::kFloat), y)
                                          : deep_supervision_loss(*loss_fn_, logits, y, supervision_weights_);
    });
    if (cb_.loss_filter) loss = cb_.loss_filter(rec.epoch, rec.steps + 1, loss);
    clock_->lap(&StageTimes::forward);

    stage.emplace("backward");
    optimizer_->zero_grad();
    if (grad_sync_) grad_sync_->prepare();
    with_context(where, [&] { scaler_->scale(loss).backward(); });
    clock_->lap(&StageTimes::backward);

    if (grad_sync_) {
      stage.emplace("allreduce");
      grad_sync_->finish();
    }
    stage.emplace("optimizer");
    // fp16: the scaler's unscale finds inf/NaN gradients (and backs off); fp32, bf16: no
    // NaN may reach the weights. Under DDP the gradients are the averaged ones, so every
    // rank decides alike, also when only one rank's loss was NaN.
    if (scaler_->enabled()) scaler_->unscale(*optimizer_);
    const at::Tensor bad = scaler_->enabled() ? scaler_->found_inf(*optimizer_) : nonfinite_gradients();
    const at::Tensor read = at::stack({loss.detach().reshape({}).to(at::kDouble), bad.reshape({}).to(at::kDouble)})
                                .to(at::kCPU);  // the one host read
    const double step_loss = read[0].item<double>();
    const bool clean = read[1].item<double>() == 0 && (scaler_->enabled() || std::isfinite(step_loss));
    clock_->collect(rec.times);  // earlier steps' events have passed
    bool stepped = false;
    if (scaler_->enabled()) {
      stepped = scaler_->step(*optimizer_, clean);
      scaler_->update();
    } else if (clean) {
      optimizer_->step();
      stepped = true;
    }
    clock_->lap(&StageTimes::optimizer);
    if (!stepped) ++rec.skipped_steps;
    ++rec.steps;
    nonfinite_->record(rec.epoch, rec.steps, static_cast<int>(loader_->batches_per_epoch()), step_loss, stepped,
                       [this, &rec] { return nonfinite_context(rec.epoch); });
    if (rank0_ && cb_.step) cb_.step(rec.epoch, rec.steps, static_cast<int>(loader_->batches_per_epoch()), step_loss);
    stage.reset();
    return step_loss;
  }

  /// How many gradient elements are inf or NaN, as a 1-element tensor on the device (no
  /// host read): on CUDA one fused check per dtype group (torch's GradScaler kernel, with
  /// a scale of 1), elsewhere one sum per parameter (inf or NaN anywhere makes it non-finite).
  at::Tensor nonfinite_gradients() const {
    torch::NoGradGuard no_grad;
    if (device_.is_cuda()) {
      std::map<at::ScalarType, std::vector<at::Tensor>> groups;
      for (const auto& p : params_) {
        if (p.grad().defined()) groups[p.grad().scalar_type()].push_back(p.grad());
      }
      at::Tensor found = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
      const at::Tensor one = at::ones({1}, found.options());
      for (auto& [dtype, grads] : groups) at::_amp_foreach_non_finite_check_and_unscale_(grads, found, one);
      return found;
    }
    at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
    for (const auto& p : params_) {
      if (p.grad().defined()) total = total + p.grad().sum(at::kDouble);
    }
    return at::isfinite(total).logical_not().to(at::kFloat);
  }

  /// The end of NonFiniteLoss's message: what is kept, and where to look.
  std::string nonfinite_context(int epoch) const {
    std::string kept;
    if (!rank0_) {
      kept = "Rank 0 keeps the checkpoints written so far";
    } else if (os::exists(last_path_)) {
      kept = str(last_path_, " (epoch ", epoch - 1, ")", os::exists(best_path_) ? str(" and ", best_path_) : "",
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
      const Validation v = validate(model_, *val_ds_, c_, device_, precision_, comm_);
      rec.times.validation = seconds_since(v0);
      rec.dice = v.mean_dice;
      rec.dice_per_class = v.dice;
      rec.hd95 = v.hd95;
      rec.nonfinite_validation_cases = v.nonfinite_cases;
    }
    rec.seconds = seconds_since(epoch_start);
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
      if (improved) save_checkpoint(best_path_, *model_.module, nullptr, meta);
      save_checkpoint(last_path_, *model_.module, optimizer_.get(), meta);
      write_metrics(t_.run_dir, result_.history);
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
                     {"device", t_.device},
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

  const RunConfig& c_;
  const TrainOptions& t_;
  const Settings& settings_;
  const TrainCallbacks& cb_;
  Collective* comm_;
  const bool rank0_, distributed_;
  Clock::time_point start_;
  std::string last_path_, best_path_;
  os::FileLock run_lock_;   // rank 0's lock on run_dir, held for the run
  bool overwrite_ = false;  // --overwrite: the old run is set aside when this one writes
  std::string aside_;       // where it is while this run has no checkpoint yet
  int first_epoch_ = 0;
  double elapsed_before_ = 0;
  c10::Device device_{c10::kCPU};
  Precision precision_ = Precision::fp32;
  SelfCheckReport self_check_;
  std::unique_ptr<NonFiniteGuard> nonfinite_;
  int model_threads_ = 1;
  data::PipelineConfig pipeline_;
  std::unique_ptr<data::CachedDataset> train_ds_, val_ds_;
  std::unique_ptr<data::SmartCacheDataset> smart_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<StepProfiler> profiler_;
  std::unique_ptr<profile::GpuSampler> gpu_sampler_;
  std::optional<profile::EventWriter> events_;  // rank 0, train.tensorboard
  Model model_;
  std::vector<at::Tensor> params_, buffers_;
  std::unique_ptr<GradientSync> grad_sync_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<detail::StageClock> clock_;
  std::unique_ptr<Loss> loss_fn_;
  std::vector<double> supervision_weights_;  // deep supervision's loss weights (none: one output)
  TrainResult result_;
};

}  // namespace

TrainResult Trainer::run(bool resume, const TrainCallbacks& cb, bool overwrite) {
  return Run(s_->config, s_->config.settings, cb).run(resume, overwrite);
}

}  // namespace medfast::train
