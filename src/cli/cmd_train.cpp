// medfast train | infer | eval: the training engine's commands.
#include <ATen/ATen.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/progress.hpp"
#include "medfast/core/units.hpp"
#include "medfast/core/error.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/dist/process_group.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/process.hpp"
#include "medfast/train/config_keys.hpp"
#include "medfast/train/evaluate.hpp"
#include "medfast/train/export.hpp"
#include "medfast/train/trainer.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/train/placement.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::string dataset;  ///< --dataset: plan it (medfast plan) and train the plan
  std::vector<std::string> sets;
  bool resume = false;
  bool overwrite = false;
  bool json = false;
  std::string profile;  ///< --profile W,U,A,R: train.profile
};

struct InferArgs {
  std::string checkpoint, config, output, device = "auto", amp = "false";
  std::vector<std::string> inputs;
  std::vector<std::string> sets;  // sliding-window overrides: roi_size=..., overlap=...
  std::string tta;                // none | flips; empty: the config's validation.tta
  bool json = false;
  bool overwrite = false;         // replace outputs that exist already
};

struct ExportArgs {
  std::string checkpoint, out;
  bool overwrite = false, json = false;
};

struct EvalArgs {
  std::string checkpoint, config, section, device = "auto", amp = "false";
  std::vector<std::string> sets;
  bool hd95 = false, json = false;
};

std::string fmt(double v, int digits = 4) {
  if (!std::isfinite(v)) return "nan";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

/// The built-in default recipe for the device it will train on: train.device as --set gives
/// it (else auto), chosen as the trainer chooses (train/placement.hpp): a GPU's settings on a
/// GPU, the CPU's on the CPU.
nlohmann::json default_recipe(const std::vector<std::string>& sets) {
  nlohmann::json probe = train::default_run_config();
  for (const auto& s : sets) train::apply_override(probe, s);
  const nlohmann::json& device = probe["train"]["device"];
  const train::DeviceChoice d = train::choose_device(device.is_string() ? device.get<std::string>() : "auto",
                                                     "train.device");
  return train::default_run_config(d.device, d.bf16);
}

/// The run config: the file (or the built-in default) with --set applied.
nlohmann::json run_config(const std::string& path, const std::vector<std::string>& sets) {
  nlohmann::json c = path.empty() ? default_recipe(sets) : data::load_yaml_as_json(path);
  for (const auto& s : sets) train::apply_override(c, s);
  return c;
}

int print_keys(Context&, bool json) {
  const auto tables = train::run_config_keys();
  if (json) {
    print_json(train::key_tables_json(tables).dump(2));
  } else {
    std::fputs(train::key_tables_markdown(tables).c_str(), stdout);
  }
  return 0;
}

int print_resolved(Context& ctx, const std::string& path, const std::vector<std::string>& sets) {
  const nlohmann::json config = run_config(path, sets);
  // Read as `train` reads it, without its one effect: a data.synth dataset not written yet
  // is written first (prepare_run), so that the dataset lists can be read.
  train::prepare_run(config, path, ctx.settings);
  print_json(train::resolved_run_config(train::load_run_config(config, path, ctx.settings)).dump(2));
  return 0;
}

void print_epoch(const train::EpochRecord& r, int epochs) {
  std::string line = str("epoch ", r.epoch, "/", epochs, "  loss ", fmt(r.loss), "  lr ", r.lr);
  if (r.dice) {
    line += str("  dice ", fmt(*r.dice));
    if (r.dice_per_class.size() > 1) {
      const bool named = r.class_names.size() == r.dice_per_class.size();
      line += " [";
      for (std::size_t i = 0; i < r.dice_per_class.size(); ++i) {
        line += (i ? " " : "") + (named ? r.class_names[i] + " " : "") + fmt(r.dice_per_class[i]);
      }
      line += "]";
    }
  }
  if (r.hd95) line += str("  hd95 ", fmt(*r.hd95, 2));
  const auto& t = r.times;
  line += str("  ", fmt(r.seconds, 1), " s (data ", fmt(t.data_wait, 2), ", copy ", fmt(t.copy, 2), ", fwd ",
              fmt(t.forward, 2), ", bwd ", fmt(t.backward, 2), ", opt ", fmt(t.optimizer, 2), ", val ",
              fmt(t.validation, 2), ")  ", fmt(r.samples_per_second, 1), " samples/s  rss ",
              format_bytes(r.peak_rss_bytes));
  if (r.cuda_peak_allocated) line += str("  cuda ", format_bytes(*r.cuda_peak_allocated));
  if (r.skipped_steps) line += str("  skipped ", r.skipped_steps, " steps (inf/nan loss or gradients)");
  if (r.nonfinite_validation_cases > 0) {
    line += str("  dice not scored: ", r.nonfinite_validation_cases, " validation cases gave NaN/inf logits");
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

/// One progress line at a time: a new `what` ends the previous line.
class ProgressLines {
 public:
  explicit ProgressLines(Progress::Style style) : style_(style) {}
  void update(const std::string& what, std::size_t done, std::size_t total, const char* unit,
              const std::string& suffix = "") {
    if (!line_ || what != what_) {
      end();
      line_ = std::make_unique<Progress>(what, total, unit, style_, stderr, 30.0, since_);
      what_ = what;
    }
    line_->update(done, suffix);
  }
  /// Erases a live line (the summary printed next takes its place).
  void end() {
    if (line_) line_->finish(/*clear=*/true);
    line_.reset();
    what_.clear();
    since_ = std::chrono::steady_clock::now();  // the next line's work starts now
  }
  Progress* current() { return line_.get(); }

 private:
  Progress::Style style_;
  std::unique_ptr<Progress> line_;
  std::string what_;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

/// The run config's train.device (the trainer validates it).
std::string train_device(const nlohmann::json& config) {
  if (config.contains("train") && config["train"].is_object() && config["train"].contains("device") &&
      config["train"]["device"].is_string()) {
    return config["train"]["device"].get<std::string>();
  }
  return train::TrainOptions{}.device;
}

/// Builds the trainer. Under DDP rank 0 builds first and the others wait for it:
/// building may write data.synth's dataset, which the other ranks must find
/// complete rather than write at the same time. Every rank then says whether it
/// succeeded, so a failure on one rank stops the others at once instead of
/// leaving them in a collective until the timeout. Under DDP, train.device "cuda"
/// means this rank's GPU: LOCAL_RANK's, or the one GPU a task sees (local_cuda_index);
/// an explicit cuda:N is kept where it cannot put several ranks on one GPU.
std::unique_ptr<train::Trainer> build_trainer(const TrainArgs& a, Context& ctx, train::Collective* comm,
                                              const dist::DistOptions& dist) {
  auto build = [&] {
    nlohmann::json config = run_config(a.config, a.sets);
    if (!a.profile.empty()) config["train"]["profile"] = a.profile;
    if (comm && config.contains("train") && config["train"].is_object()) {
      nlohmann::json& t = config["train"];
      if (t.contains("device") && t["device"].is_string()) {
        const std::string device = t["device"];
        const int visible = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
        if (device == "cuda" || (device == "auto" && visible > 0)) {  // auto: a GPU where one is usable
          t["device"] = str("cuda:", local_cuda_index(dist.local_rank, visible));
        } else if (device != "auto") {
          check_explicit_cuda_index(device, dist.local_world_size, visible);
        }
      }
    }
    train::prepare_run(config, a.config, ctx.settings);  // writes data.synth's dataset when missing
    return std::make_unique<train::Trainer>(std::move(config), a.config, ctx.settings);
  };
  if (!comm) return build();
  std::unique_ptr<train::Trainer> trainer;
  std::exception_ptr failed;
  auto attempt = [&] {
    try {
      trainer = build();
    } catch (...) {
      failed = std::current_exception();
    }
  };
  auto count_ok = [&](bool ok) {
    at::Tensor t = at::full({1}, ok ? 1.0 : 0.0, at::kDouble);
    comm->allreduce_sum(t);
    return static_cast<int>(std::lround(t.item<double>()));
  };
  const int rank = comm->rank();
  if (rank == 0) attempt();
  const bool rank0_ok = count_ok(rank == 0 && !failed) == 1;
  if (failed) std::rethrow_exception(failed);
  if (!rank0_ok) throw Error(str("rank ", rank, ": rank 0 could not set up the run (its error says why)"));
  if (rank != 0) attempt();
  const int ready = count_ok(!failed);
  if (failed) std::rethrow_exception(failed);
  if (ready < comm->world_size()) {
    throw Error(str("rank ", rank, ": ", comm->world_size() - ready, " of ", comm->world_size(),
                    " ranks could not set up the run (their errors say why)"));
  }
  return trainer;
}

int train_with(const TrainArgs& a, Context& ctx, const std::shared_ptr<train::Collective>& comm,
               const dist::DistOptions& dist_options);

int run_train(const TrainArgs& given, Context& ctx) {
  TrainArgs a = given;
  if (!a.dataset.empty()) {
    // Plan first: the plan is written to <run_dir>/plan.yaml and trained as --config. A
    // --set train.run_dir names that folder (and is not applied again to the plan).
    std::string run_dir;
    int epochs = 0;  // a --set train.epochs plans for that many (validation interval, decay)
    int validation = -1;  // a --set data.validation.num plans for that many (validation interval)
    std::vector<std::string> sets;
    // The value of a --set of `key` (nullptr for another key).
    const auto value_of = [](const std::string& set, const std::string& key) -> const char* {
      return set.rfind(key + "=", 0) == 0 ? set.c_str() + key.size() + 1 : nullptr;
    };
    for (const auto& s : a.sets) {
      if (const char* v = value_of(s, "train.run_dir")) {
        run_dir = v;
        continue;
      }
      if (const char* v = value_of(s, "train.epochs")) epochs = static_cast<int>(parse_int(v, "--set train.epochs"));
      if (const char* v = value_of(s, "data.validation.num")) {
        validation = static_cast<int>(parse_int(v, "--set data.validation.num"));
      }
      sets.push_back(s);
    }
    if (run_dir.empty()) run_dir = dataset_run_dir(a.dataset);
    if (dist::DistOptions::from(ctx.settings).enabled()) {
      throw ValueError(str("train --dataset: under a launcher every rank would plan on its own (and on CUDA from its "
                           "own free memory): plan once with `medfast plan --dataset ", a.dataset, " --out ", run_dir,
                           "/plan.yaml`, then launch `train --config ", run_dir, "/plan.yaml`"));
    }
    const std::string plan_file = run_dir + "/plan.yaml";
    if (a.resume && os::exists(plan_file)) {
      // The run's own plan: planning again could differ (a file changed, other free memory).
      if (!a.json) std::printf("resuming with the run's plan %s\n", plan_file.c_str());
      a.config = plan_file;
    } else {
      // The run folder checked (and marked) as the run would, before the plan is written there.
      train::claim_run_folder_for_plan(run_dir, a.resume, a.overwrite);
      a.config = plan_for_training(a.dataset, run_dir, epochs, validation, ctx, a.json);
    }
    a.sets = sets;
  }
  // A multi-process run (torchrun or srun set RANK/WORLD_SIZE): join the process
  // group first, so that a missing peer is reported before any work.
  dist::DistOptions dist_options = dist::DistOptions::from(ctx.settings);
  std::shared_ptr<train::Collective> comm;
  if (dist_options.enabled()) {
    dist_options.cuda = io::resolve_device(train_device(run_config(a.config, a.sets))).is_cuda();  // decides dist_backend auto
    comm = dist::init_process_group(dist_options);
  }

  try {
    return train_with(a, ctx, comm, dist_options);
  } catch (const std::exception& e) {
    // The other ranks are waiting in a collective this rank will never join: tell them why.
    if (comm) comm->announce_failure(message_of(e));
    throw;
  }
}

/// "SIGINT", "SIGTERM", "SIGHUP" (else "signal N").
std::string sigabbrev(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
  }
  return str("signal ", sig);
}

int train_with(const TrainArgs& a, Context& ctx, const std::shared_ptr<train::Collective>& comm,
               const dist::DistOptions& dist_options) {
  const bool rank0 = !comm || comm->rank() == 0;  // only rank 0 prints
  std::unique_ptr<train::Trainer> trainer = build_trainer(a, ctx, comm.get(), dist_options);
  if (comm) trainer->set_collective(comm);
  train::TrainCallbacks cb;
  // A first SIGINT or SIGTERM lets the step under way finish and last.ckpt be written; a
  // second one ends the process at once (as before: every file is written atomically).
  os::stop_on_first_signal();
  cb.stop_signal = [] { return os::stop_signal(); };
  const int epochs = trainer->options().epochs;
  if (!a.json && rank0) {
    // The cache fill and each epoch show a progress line (a live one on a terminal,
    // else a plain line every 30 s of long work); summaries replace it.
    auto progress = std::make_shared<ProgressLines>(Progress::style_from(ctx.settings.get("progress")));
    cb.message = [progress](const std::string& m) {
      progress->end();
      std::printf("%s\n", m.c_str());
      std::fflush(stdout);
    };
    cb.epoch = [epochs, progress](const train::EpochRecord& r) {
      progress->end();
      print_epoch(r, epochs);
    };
    cb.step = [epochs, progress](int epoch, int step, int steps, double loss) {
      progress->update(str("epoch ", epoch, "/", epochs), step, static_cast<std::size_t>(steps), "steps",
                       str("loss ", fmt(loss)));
    };
    cb.progress = [progress](const std::string& what, std::size_t done, std::size_t total) {
      progress->update(what, done, total, "items");
    };
  }
  const train::TrainResult r = trainer->run(a.resume, cb, a.overwrite);
  const int stopped_code = r.stopped ? 128 + r.stopped->signal : 0;  // as a shell reports a signal's end
  if (!rank0) return stopped_code;
  if (a.json) {
    print_json(r.to_json().dump());
    return stopped_code;
  }
  if (r.stopped) {
    const bool mid_epoch = r.stopped->mid_epoch;
    std::printf("stopped by %s %s; %s/last.ckpt holds it: continue with the same command and --resume\n",
                sigabbrev(r.stopped->signal).c_str(),
                mid_epoch ? str("after step ", r.stopped->step, " of epoch ", r.stopped->epoch).c_str()
                          : str("after epoch ", r.stopped->epoch).c_str(),
                r.run_dir.c_str());
    return stopped_code;
  }
  const std::string target =
      r.reached_target
          ? str("target ", trainer->options().target_dice, " reached after ", fmt(*r.time_to_target, 1), " s")
          : (trainer->options().target_dice > 0 ? "target not reached" : "no target set");
  if (r.best_checkpoint.empty()) {
    std::printf("no best.ckpt: %s; %s\n", r.no_best_checkpoint.c_str(), target.c_str());
  } else {
    std::printf("best dice %s at epoch %d; %s\n", fmt(r.best_dice).c_str(), r.best_epoch, target.c_str());
  }
  std::printf("run folder %s: last.ckpt, %smetrics.jsonl, config.json, machine.json%s\n", r.run_dir.c_str(),
              r.best_checkpoint.empty() ? "" : "best.ckpt, ",
              trainer->options().tensorboard ? ", TensorBoard events (tensorboard --logdir of its parent)" : "");
  return 0;
}

int run_infer(const InferArgs& a, Context& ctx) {
  train::InferOptions o;
  o.device = a.device;
  o.amp = data::parse_yaml(a.amp, "--amp");
  nlohmann::json sw = nlohmann::json::object();
  for (const auto& s : a.sets) train::apply_override(sw, s);
  o.sliding_window = sw;
  o.tta = a.tta;
  o.overwrite = a.overwrite;
  if (a.checkpoint.empty() == a.config.empty()) {
    throw ValueError("infer: pass either --checkpoint (a medfast checkpoint) or --config (a run config with model.pretrained)");
  }
  if (!a.config.empty()) {
    o.config = run_config(a.config, {});
    o.config_path = a.config;
  }
  std::function<void(const std::string&)> say;
  auto progress = std::make_shared<ProgressLines>(Progress::style_from(ctx.settings.get("progress")));
  if (!a.json) {
    say = [progress](const std::string& m) {
      if (Progress* p = progress->current()) {
        p->print_above(m);
      } else {
        std::printf("%s\n", m.c_str());
        std::fflush(stdout);
      }
    };
    o.on_progress = [progress](std::size_t done, std::size_t total) { progress->update("infer", done, total, "files"); };
  }
  const auto cases = train::infer(a.checkpoint, a.inputs, a.output, o, ctx.settings, say);
  progress->end();
  if (a.json) {
    nlohmann::json written = nlohmann::json::array(), each = nlohmann::json::array();
    for (const auto& c : cases) {
      written.push_back(c.output);
      each.push_back(c.to_json());
    }
    print_json(nlohmann::json{{"written", written}, {"cases", each}}.dump());
  }
  return 0;
}

int run_eval(const EvalArgs& a, Context& ctx) {
  nlohmann::json cfg = a.config.empty() ? nlohmann::json() : run_config(a.config, a.sets);
  if (a.checkpoint.empty() && a.config.empty()) {
    throw ValueError("eval: pass --checkpoint (a medfast checkpoint), or --config with model.pretrained");
  }
  train::EvalOptions o;
  o.device = a.device;
  o.amp = data::parse_yaml(a.amp, "--amp");
  o.hd95 = a.hd95;
  o.section = a.section;
  if (a.config.empty()) o.overrides = a.sets;  // on the checkpoint's own config
  auto progress = std::make_shared<ProgressLines>(Progress::style_from(ctx.settings.get("progress")));
  if (!a.json) {
    o.on_progress = [progress](std::size_t done, std::size_t total) { progress->update("eval", done, total, "cases"); };
  }
  const train::EvalResult r = train::evaluate(a.checkpoint, cfg, a.config, ctx.settings, o);
  progress->end();
  if (a.json) {
    print_json(r.to_json().dump());
    return 0;
  }
  std::string names;
  for (const auto& n : r.class_names) names += (names.empty() ? "" : ", ") + n;
  std::printf("%-60s %s%s\n", "case", a.hd95 ? "dice per class | hd95 (mm)" : "dice per class",
              names.empty() ? "" : (" (" + names + ")").c_str());
  for (const auto& c : r.cases) {
    std::string line;
    for (double d : c.dice) line += fmt(d) + " ";
    if (c.hd95) {
      line += "| ";
      for (double h : *c.hd95) line += fmt(h, 2) + " ";
    }
    std::printf("%-60s %s\n", c.image.c_str(), line.c_str());
  }
  std::string per;
  const bool named = r.class_names.size() == r.mean_per_class.size();
  for (std::size_t k = 0; k < r.mean_per_class.size(); ++k) {
    per += (k ? ", " : "") + (named ? r.class_names[k] + " " : "") + fmt(r.mean_per_class[k]);
  }
  std::printf("mean dice %s (per class: %s)\n", fmt(r.mean_dice).c_str(), per.c_str());
  if (r.mean_hd95) std::printf("mean hd95 %s mm\n", fmt(*r.mean_hd95, 2).c_str());
  if (r.nonfinite_cases > 0) {
    std::printf("%lld of %zu cases gave NaN/inf logits: their scores and the means are nan\n",
                static_cast<long long>(r.nonfinite_cases), r.cases.size());
  }
  return 0;
}

}  // namespace

Command register_train(CLI::App& root) {
  auto a = std::make_shared<TrainArgs>();
  auto* app = root.add_subcommand(
      "train", "Train a segmentation network (no --config: the built-in default on a synthetic dataset)");
  auto* config = app->add_option("--config", a->config,
                                  "Run config (YAML/JSON): data, model, loss, optimizer, schedule, validation, train")
                      ->check(CLI::ExistingFile);
  app->add_option("--dataset", a->dataset,
                  "Instead of --config: plan a run for this dataset (a folder with dataset.json, or a list), as "
                  "`medfast plan` does, write it to <run_dir>/plan.yaml and train it (run_dir: runs/<dataset>)")
      ->excludes(config);
  app->add_option("--set", a->sets, "Override a config value: key.path=value (repeatable), e.g. train.epochs=5");
  app->add_flag("--resume", a->resume, "Continue from run_dir/last.ckpt (bit-identical to an uninterrupted run)");
  app->add_flag("--overwrite", a->overwrite,
                "Start again in a run_dir that holds a run (its files are replaced once the new run has its first "
                "checkpoint; kept if it fails before)");
  app->add_flag("--json", a->json, "Print the result (history, best Dice, time to target) as JSON");
  app->add_option("--profile", a->profile,
                  "Trace steps as torch.profiler's schedule: WAIT,WARMUP,ACTIVE,REPEAT (e.g. 1,1,3,1); writes "
                  "run_dir/profiler/<step>-trace.json.gz and <step>-trace_summary.txt (train.profile)");
  return {app, [a](Context& ctx) { return run_train(*a, ctx); }};
}

Command register_infer(CLI::App& root) {
  auto a = std::make_shared<InferArgs>();
  auto* app = root.add_subcommand(
      "infer", "Segment NIfTI files or DICOM series with a checkpoint; predictions (NIfTI) on the input's grid");
  app->add_option("--checkpoint", a->checkpoint, "A checkpoint written by medfast train")->check(CLI::ExistingFile);
  app->add_option("--config", a->config,
                  "Instead of --checkpoint: a run config whose model.pretrained names a MONAI state_dict (its "
                  "deterministic chain and sliding window are used)")
      ->check(CLI::ExistingFile);
  app->add_option("--input", a->inputs,
                  "NIfTI file, folder of them, or DICOM series (its folder, or a multi-frame file) (repeatable)")
      ->required();
  app->add_option("--output", a->output, "Output folder (<name>_seg.nii.gz per input)")->required();
  app->add_option("--device", a->device, "auto (a GPU where one is usable, else the CPU) | cpu | cuda | cuda:N")
      ->capture_default_str();
  app->add_option("--amp", a->amp, "false | true | fp16 | bf16")->capture_default_str();
  app->add_option("--set", a->sets, "Sliding-window override: roi_size=[96,96,96], sw_batch_size=4, overlap=0.5, mode=gaussian");
  app->add_option("--tta", a->tta,
                  "Test-time augmentation: none | flips (the mean logits of each window's 8 mirror images: 8x the "
                  "inference time); default: the config's validation.tta");
  app->add_flag("--overwrite", a->overwrite,
                "Replace outputs that exist already in --output (without it infer refuses, writing nothing)");
  app->add_flag("--json", a->json, "Print the written files as JSON");
  return {app, [a](Context& ctx) { return run_infer(*a, ctx); }};
}

Command register_eval(CLI::App& root) {
  auto a = std::make_shared<EvalArgs>();
  auto* app = root.add_subcommand("eval", "Dice per case and mean of a checkpoint on a config's validation items");
  app->add_option("--checkpoint", a->checkpoint,
                  "A checkpoint written by medfast train (without it: --config's model.pretrained weights)")
      ->check(CLI::ExistingFile);
  app->add_option("--config", a->config, "Run config (default: the one the checkpoint was trained with)")
      ->check(CLI::ExistingFile);
  app->add_option("--set", a->sets, "Override a config value: key.path=value (repeatable; of --config, else of the checkpoint's own config)");
  app->add_option("--section", a->section, "Evaluate every item of this dataset section instead of data.validation");
  app->add_option("--device", a->device, "auto (a GPU where one is usable, else the CPU) | cpu | cuda | cuda:N")
      ->capture_default_str();
  app->add_option("--amp", a->amp, "false | true | fp16 | bf16")->capture_default_str();
  app->add_flag("--hd95", a->hd95, "Also the 95th-percentile Hausdorff distance (mm)");
  app->add_flag("--json", a->json, "Print JSON");
  return {app, [a](Context& ctx) { return run_eval(*a, ctx); }};
}

Command register_export(CLI::App& root) {
  auto a = std::make_shared<ExportArgs>();
  auto* app = root.add_subcommand("export", "A checkpoint's network for MONAI: model.pt (state_dict) and a bundle config");
  app->add_option("--checkpoint", a->checkpoint, "A checkpoint written by medfast train (RUN/best.ckpt)")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--out", a->out, "Folder to write model.pt and configs/ into")->required();
  app->add_flag("--overwrite", a->overwrite, "Replace an earlier export in --out");
  app->add_flag("--json", a->json, "Print JSON");
  return {app, [a](Context&) {
            const train::ExportResult r = train::export_bundle(a->checkpoint, a->out, a->overwrite);
            if (a->json) {
              std::printf("%s\n", r.to_json().dump(2).c_str());
            } else {
              std::printf("%s: %zu tensors of %s (%s)\n%s\n%s\n", r.model_file.c_str(), r.tensors, r.network.c_str(),
                          format_bytes(r.bytes).c_str(), r.inference_config.c_str(), r.metadata.c_str());
            }
            return 0;
          }};
}

nlohmann::json run_config_of(const std::string& path, const std::vector<std::string>& sets) {
  return run_config(path, sets);
}

const ConfigTools& run_config_tools() {
  static const ConfigTools tools{&print_keys, &print_resolved};
  return tools;
}

}  // namespace medfast::cli
