// The trainer: config handling, checkpoints, resume equality, one step against
// python3-torch, and the CLI's train / eval / infer end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/profile/trace_file.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/nn/pretrained.hpp"
#include "medfast/nn/unet.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"
#include "medfast/os/process.hpp"
#include "tiny_run.hpp"
#include "medfast/profile/events.hpp"
#include "medfast/train/checkpoint.hpp"
#include "medfast/train/evaluate.hpp"
#include "medfast/train/export.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/nonfinite.hpp"
#include "medfast/transforms/transform.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/train/placement.hpp"
#include "medfast/train/profiler.hpp"
#include "medfast/train/run_config.hpp"
#include "medfast/train/trainer.hpp"
#include "profile/tfevents_reader.hpp"
#include "test_util.hpp"

#if MEDFAST_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#endif

namespace medfast::train {
namespace {

using test_run::one_thread;
using test_run::tiny_config;
using test_run::unprepared_tiny_config;

/// The first line of a run's metrics.jsonl (one JSON line per finished epoch).
nlohmann::json first_metrics_line(const std::string& path) {
  const std::string jsonl = test::read_file(path);
  return nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n')));
}

/// tiny_config trained for one epoch (its run in dir/run): what eval, infer and the run
/// folder tests start from. The config, as trained.
nlohmann::json trained_one_epoch(const test::TempDir& dir) {
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 1;
  Trainer(c, "", one_thread()).run(false);
  return c;
}

/// tiny_config trained on the current GPU with fp16 autocast and loss scaling.
nlohmann::json tiny_fp16_cuda_config(const test::TempDir& dir) {
  nlohmann::json c = tiny_config(dir);
  c["train"]["device"] = "cuda";
  c["train"]["amp"] = "fp16";
  return c;
}

std::map<std::string, at::Tensor> checkpoint_tensors(const std::string& path, const nlohmann::json& model) {
  auto net = nn::make_network(model);
  load_checkpoint(path, *net.ptr(), nullptr);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : net.ptr()->named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : net.ptr()->named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

TEST(TrainConfig, OverridesSetNestedKeysAndParseValues) {
  nlohmann::json c = default_run_config();
  apply_override(c, "train.epochs=7");
  apply_override(c, "optimizer.lr=0.5");
  apply_override(c, "model.channels=[2, 4]");
  apply_override(c, "train.device=cpu");
  apply_override(c, "new.section.key=true");
  apply_override(c, "data.random.0.num_samples=3");
  EXPECT_EQ(c["data"]["random"][0]["num_samples"], 3);
  EXPECT_THROW(apply_override(c, "data.random.99.prob=1"), ValueError);
  EXPECT_THROW(apply_override(c, "data.random.x.prob=1"), ValueError);
  EXPECT_EQ(c["train"]["epochs"], 7);
  EXPECT_DOUBLE_EQ(c["optimizer"]["lr"].get<double>(), 0.5);
  EXPECT_EQ(c["model"]["channels"], nlohmann::json({2, 4}));
  EXPECT_EQ(c["train"]["device"], "cpu");
  EXPECT_EQ(c["new"]["section"]["key"], true);
  const std::string m = test::value_error_of([&] { apply_override(c, "train.epochs"); });
  EXPECT_NE(m.find("expected key=value"), std::string::npos) << m;
  EXPECT_THROW(apply_override(c, "train.epochs.x=1"), ValueError);  // epochs is not a mapping
}

TEST(TrainConfig, ErrorsNameTheConfigAndTheKey) {
  test::TempDir dir;
  Settings s = one_thread();
  auto expect_error = [&](nlohmann::json c, const std::string& want) {
    const std::string m = test::error_of<Error>([&] { load_run_config(std::move(c), dir / "run.yaml", s); });
    EXPECT_TRUE(test::contains_all(m, {want, "run.yaml"}));
  };
  nlohmann::json c = tiny_config(dir);
  c["trian"] = nlohmann::json::object();
  expect_error(c, "trian");
  c = tiny_config(dir);
  c["train"]["epochz"] = 3;
  expect_error(c, "train.epochz");
  c = tiny_config(dir);
  c["train"]["epochs"] = 0;
  expect_error(c, "train.epochs");
  c = tiny_config(dir);
  c["train"]["device"] = "gpu7";
  expect_error(c, "train.device");
  c = tiny_config(dir);
  c["train"]["amp"] = "fp8";
  expect_error(c, "amp");
  c = tiny_config(dir);
  c["loss"]["softmax"] = "yes";
  expect_error(c, "loss.softmax");
  c = tiny_config(dir);
  c["optimizer"]["name"] = "Adagrad";
  expect_error(c, "optimizer");
  c = tiny_config(dir);
  c["validation"]["intervall"] = 2;
  expect_error(c, "validation.intervall");
  c = tiny_config(dir);
  c["data"]["validation"] = {{"num", 6}};
  expect_error(c, "data.validation.num");
  c = tiny_config(dir);
  c["data"].erase("validation");
  c["train"]["target_dice"] = 0.5;
  expect_error(c, "train.target_dice");
  c = tiny_config(dir);
  c["schedule"] = {{"name", "warmup_cosine"}, {"warmup_epochs", 2}};
  expect_error(c, "schedule.warmup_epochs");
  c = tiny_config(dir);
  c["train"]["threads"] = 100000;  // a typo that would start threads without end
  expect_error(c, "train.threads");
  c = tiny_config(dir);
  c["data"]["loader"]["threads"] = 100000;
  expect_error(c, "data.loader");
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"channels", {4, -8, 16}}, {"out_channels", 0}, {"in_channels", 0}, {"strides", {2, 0}}}) {
    c = tiny_config(dir);
    c["model"][key] = value;
    const std::string m = test::value_error_of([&] { Trainer(c, dir / "run.yaml", s).run(false); });
    EXPECT_NE(m.find("argument " + key), std::string::npos) << "model." << key << " " << value.dump() << ": " << m;
  }
  c = tiny_config(dir);
  c["model"]["chanels"] = {4, 8};
  const std::string m = test::error_of<Error>([&] {
    Trainer t(c, dir / "run.yaml", s);
    t.run(false);
  });
  EXPECT_NE(m.find("chanels"), std::string::npos) << m;
}

// Reading a run config is pure; writing data.synth's dataset is the explicit step before
// it (prepare_run), which checks the whole config first.
TEST(TrainConfig, ReadingIsPureAndPrepareRunWritesTheDataset) {
  test::TempDir dir;
  const Settings s = one_thread();
  nlohmann::json c = unprepared_tiny_config(dir);
  c["settings"] = {{"gzip_level", 2}};
  const std::string m = test::error_of<ConfigError>([&] { load_run_config(c, dir / "run.yaml", s); });
  EXPECT_NE(m.find("data.dataset"), std::string::npos) << m;
  EXPECT_NE(m.find("does not exist yet: data.synth writes it"), std::string::npos) << m;
  EXPECT_FALSE(os::exists(dir / "data"));  // reading wrote nothing
  nlohmann::json typo = c;
  typo["train"]["epochz"] = 3;
  EXPECT_THROW(prepare_run(typo, dir / "run.yaml", s), ConfigError);
  EXPECT_FALSE(os::exists(dir / "data"));  // a typo anywhere stops before any data is written
  typo = c;
  typo["data"]["synth"]["casez"] = 3;
  EXPECT_THROW(prepare_run(typo, dir / "run.yaml", s), ConfigError);
  EXPECT_FALSE(os::exists(dir / "data"));
  EXPECT_TRUE(prepare_run(c, dir / "run.yaml", s));
  EXPECT_TRUE(os::exists(dir / "data/dataset.json"));
  EXPECT_FALSE(prepare_run(c, dir / "run.yaml", s));  // once: found there later
  const RunConfig rc = load_run_config(c, dir / "run.yaml", s);
  EXPECT_EQ(rc.data.dataset.items.size(), 5u);
  EXPECT_EQ(rc.settings.get_int("gzip_level"), 2);  // the config's settings, in the run's copy
  EXPECT_EQ(s.get_int("gzip_level"), kDefaultGzipLevel);  // the caller's unchanged
  EXPECT_EQ(rc.settings.threads(), 1);  // a flag stays above the config's settings
  // A config with data.synth still reads as its data section requires (keys checked).
  c["data"]["synth"]["format"] = "tiff";
  const std::string tiff = test::error_of<ConfigError>([&] { load_run_config(c, dir / "run.yaml", s); });
  EXPECT_NE(tiff.find("data.synth.format"), std::string::npos) << tiff;
  EXPECT_NE(tiff.find("'tiff' is not one of nifti | dicom"), std::string::npos) << tiff;
  c["data"]["synth"]["format"] = "nifti";
  c["data"]["synth"]["cases"] = 0;
  const std::string none = test::error_of<ConfigError>([&] { load_run_config(c, dir / "run.yaml", s); });
  EXPECT_NE(none.find("data.synth.cases"), std::string::npos) << none;
  // The cache kinds are the stores' kinds and smart, named as such.
  c = tiny_config(dir);
  c["data"]["cache"]["kind"] = "ssd";
  const std::string kind = test::error_of<ConfigError>([&] { load_run_config(c, dir / "run.yaml", s); });
  EXPECT_NE(kind.find("'ssd' is not one of memory | device | disk | disk_device | smart"), std::string::npos) << kind;
}

TEST(Trainer, WritesCheckpointsMetricsAndResumesBitIdentically) {
  test::TempDir dir;
  const nlohmann::json base = tiny_config(dir);

  // Uninterrupted: 2 epochs.
  nlohmann::json a = base;
  a["train"]["run_dir"] = dir / "a";
  const TrainResult ra = Trainer(a, "", one_thread()).run(false);
  ASSERT_EQ(ra.history.size(), 2u);
  EXPECT_TRUE(os::exists(dir / "a/last.ckpt"));
  EXPECT_TRUE(os::exists(dir / "a/best.ckpt"));
  EXPECT_TRUE(os::exists(dir / "a/config.json"));
  const std::string jsonl = test::read_file(dir / "a/metrics.jsonl");
  ASSERT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 2) << jsonl;
  const auto first = nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n')));
  EXPECT_EQ(first["epoch"], 1);
  EXPECT_TRUE(first["dice"].is_number());
  EXPECT_GT(first["steps"].get<int>(), 0);
  for (const char* k : {"data_wait", "copy", "forward", "backward", "optimizer", "validation"}) {
    EXPECT_TRUE(first["times"].contains(k)) << k;
  }
  // Throughput and memory per epoch: samples are crops (batches of batch_size items x num_samples).
  const std::int64_t crops = base["data"]["random"][0]["num_samples"].get<std::int64_t>();
  EXPECT_EQ(first["samples"].get<std::int64_t>() % crops, 0);
  EXPECT_GE(first["samples"].get<std::int64_t>(), first["steps"].get<std::int64_t>() * crops);
  EXPECT_GT(first["samples_per_second"].get<double>(), 0.0);
  // Since the process started: at least this epoch, at most the test binary's life so far.
  EXPECT_GE(first["process_seconds"].get<double>(), first["seconds"].get<double>() - 0.02);
  EXPECT_LE(first["process_seconds"].get<double>(), os::process_seconds());
  EXPECT_GT(first["peak_rss_bytes"].get<std::uint64_t>(), std::uint64_t{10} << 20);  // libtorch alone is more
  EXPECT_FALSE(first.contains("cuda_peak_allocated_bytes"));  // a CPU run
  for (const auto& e : ra.history) {
    EXPECT_TRUE(std::isfinite(e.loss));
    ASSERT_TRUE(e.dice.has_value());
    EXPECT_GE(*e.dice, 0.0);
    EXPECT_LE(*e.dice, 1.0);
  }

  // TensorBoard: one events file; per step train_loss and learning_rate at MONAI's global
  // step (1-based), per epoch the record's figures at the epoch.
  const int steps_per_epoch = first["steps"].get<int>();
  const nlohmann::json ea = test::read_tfevents(dir / "a");
  ASSERT_EQ(ea["files"].size(), 1u);
  const auto losses_a = test::scalars_of(ea, "train_loss");
  ASSERT_EQ(losses_a.size(), static_cast<std::size_t>(2 * steps_per_epoch));
  for (std::size_t i = 0; i < losses_a.size(); ++i) EXPECT_EQ(losses_a[i].first, static_cast<std::int64_t>(i + 1));
  EXPECT_EQ(test::scalars_of(ea, "learning_rate").size(), losses_a.size());
  const auto epoch_losses = test::scalars_of(ea, "epoch_loss"), dices = test::scalars_of(ea, "val_mean_dice");
  ASSERT_EQ(epoch_losses.size(), 2u);
  ASSERT_EQ(dices.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(epoch_losses[i].first, i + 1);
    EXPECT_EQ(epoch_losses[i].second.get<double>(), static_cast<double>(static_cast<float>(ra.history[i].loss)));
    EXPECT_EQ(dices[i].second.get<double>(), static_cast<double>(static_cast<float>(*ra.history[i].dice)));
  }
  for (const char* tag : {"val_dice/spleen", "time/forward", "time/data_wait", "samples_per_second",
                          "memory/peak_rss_mib"}) {
    EXPECT_EQ(test::scalars_of(ea, tag).size(), 2u) << tag;
  }

  // Interrupted after epoch 1 (the epoch callback throws, as a kill would stop it), then resumed.
  nlohmann::json b = base;
  b["train"]["run_dir"] = dir / "b";
  TrainCallbacks stop;
  stop.epoch = [](const EpochRecord& r) {
    if (r.epoch == 1) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(Trainer(b, "", one_thread()).run(false, stop), std::runtime_error);
  EXPECT_EQ(read_checkpoint_meta(dir / "b/last.ckpt")["epoch"], 1);
  const TrainResult rb = Trainer(b, "", one_thread()).run(true);
  ASSERT_EQ(rb.history.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(ra.history[i].loss, rb.history[i].loss) << "epoch " << i + 1;
    EXPECT_EQ(*ra.history[i].dice, *rb.history[i].dice) << "epoch " << i + 1;
  }
  // The resumed run wrote a second events file whose steps continue the first's: no step
  // twice, none missing, the same losses as the uninterrupted run.
  const nlohmann::json eb = test::read_tfevents(dir / "b");
  ASSERT_EQ(eb["files"].size(), 2u);
  const auto losses_b = test::scalars_of(eb, "train_loss");
  ASSERT_EQ(losses_b.size(), losses_a.size());
  for (std::size_t i = 0; i < losses_b.size(); ++i) {
    EXPECT_EQ(losses_b[i].first, losses_a[i].first);
    EXPECT_EQ(losses_b[i].second, losses_a[i].second) << "step " << i + 1;
  }
  EXPECT_EQ(test::scalars_of(eb, "val_mean_dice").size(), 2u);
  const auto ta = checkpoint_tensors(dir / "a/last.ckpt", base["model"]);
  const auto tb = checkpoint_tensors(dir / "b/last.ckpt", base["model"]);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, t] : ta) EXPECT_TRUE(at::equal(t, tb.at(name))) << name << " differs after resume";

  // Resuming with another model is refused, naming the section.
  nlohmann::json c = b;
  c["model"]["channels"] = {4, 8, 32};
  const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(true); });
  EXPECT_NE(m.find("model"), std::string::npos) << m;
}

// A stop signal lets the step under way finish: last.ckpt then holds the epoch so far (its
// steps, losses and generators), and --resume takes the next step as the run would have:
// the same losses, Dice, TensorBoard steps and weights as a run never stopped.
TEST(Trainer, AStopSignalMidEpochWritesLastCkptAndResumesAsIfUninterrupted) {
  test::TempDir dir;
  nlohmann::json base = tiny_config(dir);
  base["train"]["epochs"] = 3;
  nlohmann::json a = base;
  a["train"]["run_dir"] = dir / "a";
  const TrainResult ra = Trainer(a, "", one_thread()).run(false);
  ASSERT_EQ(ra.history.size(), 3u);
  const int steps = ra.history[0].steps;
  ASSERT_GE(steps, 2);

  nlohmann::json b = base;
  b["train"]["run_dir"] = dir / "b";
  TrainCallbacks cb;
  int taken = 0;  // steps over the run
  cb.step = [&](int, int, int, double) { ++taken; };
  cb.stop_signal = [&] { return taken == steps + 1 ? SIGINT : 0; };  // after step 1 of epoch 2
  const TrainResult stopped = Trainer(b, "", one_thread()).run(false, cb);
  ASSERT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.stopped->signal, SIGINT);
  EXPECT_EQ(stopped.stopped->epoch, 2);
  EXPECT_TRUE(stopped.stopped->mid_epoch);
  EXPECT_EQ(stopped.history.size(), 1u);
  const nlohmann::json meta = read_checkpoint_meta(dir / "b/last.ckpt");
  EXPECT_EQ(meta["epoch"], 1);
  ASSERT_TRUE(meta.contains("partial"));
  EXPECT_EQ(meta["partial"]["record"]["steps"], stopped.stopped->step);
  EXPECT_GE(stopped.stopped->step, 1);
  const std::string jsonl = test::read_file(dir / "b/metrics.jsonl");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1) << "the stopped epoch is not in metrics.jsonl";
  EXPECT_EQ(stopped.to_json()["stopped"]["mid_epoch"], true);

  const TrainResult rb = Trainer(b, "", one_thread()).run(true);
  ASSERT_EQ(rb.history.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ra.history[i].loss, rb.history[i].loss) << "epoch " << i + 1;
    EXPECT_EQ(ra.history[i].steps, rb.history[i].steps) << "epoch " << i + 1;
    EXPECT_EQ(ra.history[i].samples, rb.history[i].samples) << "epoch " << i + 1;
    EXPECT_EQ(*ra.history[i].dice, *rb.history[i].dice) << "epoch " << i + 1;
  }
  const auto losses_a = test::scalars_of(test::read_tfevents(dir / "a"), "train_loss");
  const auto losses_b = test::scalars_of(test::read_tfevents(dir / "b"), "train_loss");
  ASSERT_EQ(losses_b.size(), losses_a.size()) << "a step twice, or one missing";
  for (std::size_t i = 0; i < losses_b.size(); ++i) {
    EXPECT_EQ(losses_b[i].first, losses_a[i].first);
    EXPECT_EQ(losses_b[i].second, losses_a[i].second) << "step " << i + 1;
  }
  const auto ta = checkpoint_tensors(dir / "a/last.ckpt", base["model"]);
  const auto tb = checkpoint_tensors(dir / "b/last.ckpt", base["model"]);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, t] : ta) EXPECT_TRUE(at::equal(t, tb.at(name))) << name << " differs after resume";

  // A stop at an epoch's end: last.ckpt is that epoch's, validated.
  nlohmann::json c = base;
  c["train"]["run_dir"] = dir / "c";
  TrainCallbacks at_end;
  at_end.epoch = [&](const EpochRecord& r) { taken = r.epoch == 1 ? -1 : taken; };
  taken = 0;
  at_end.stop_signal = [&] { return taken == -1 ? SIGTERM : 0; };
  const TrainResult rc = Trainer(c, "", one_thread()).run(false, at_end);
  ASSERT_TRUE(rc.stopped);
  EXPECT_FALSE(rc.stopped->mid_epoch);
  EXPECT_EQ(rc.stopped->epoch, 1);
  EXPECT_FALSE(read_checkpoint_meta(dir / "c/last.ckpt").contains("partial"));
}

// The command: a first SIGINT lets the step finish, writes last.ckpt and says how to go on
// (exit 130, as a shell reports SIGINT); a second signal ends it at once (OsProcess test).
TEST(TrainCli, AStopSignalFinishesTheStepAndSaysHowToContinue) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 200;
  test::write_file(dir / "run.json", c.dump());
  const std::string out = dir / "out.txt";
  const std::string pidfile = dir / "pid";
  test::run("((" + test::medfast_binary() + " --threads 1 train --config " + (dir / "run.json") + " > '" + out +
            "' 2>&1; echo $? > '" + (dir / "rc") + "') & echo $! > '" + pidfile + "')");
  // The shell's pid; medfast is its child: wait for the first epoch line, then signal it.
  for (int i = 0; i < 600 && test::read_file(out).find("epoch 1/200") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(test::read_file(out).find("epoch 1/200"), std::string::npos) << test::read_file(out);
  const std::string shell = std::to_string(std::stoi(test::read_file(pidfile)));
  const std::string child = test::run("pgrep -P " + shell).out;
  ASSERT_FALSE(child.empty() || child[0] < '0' || child[0] > '9') << "shell " << shell << ", child '" << child << "'\n"
                                                                  << test::read_file(out);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(std::stoi(child), SIGINT), 0);
  const auto rc_written = [&] { return os::exists(dir / "rc") && test::read_file(dir / "rc").find('\n') != std::string::npos; };
  for (int i = 0; i < 300 && !rc_written(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(rc_written()) << "train did not stop within 30 s";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(std::stoi(test::read_file(dir / "rc")), 130);
  const std::string said = test::read_file(out);
  EXPECT_TRUE(test::contains_all(said, {"stopped by SIGINT after", "last.ckpt holds it", "--resume"})) << said;
  const nlohmann::json meta = read_checkpoint_meta(dir / "run/last.ckpt");
  EXPECT_GE(meta["epoch"].get<int>(), 1);

  // Resumed: it continues in the epoch where it stopped.
  const auto resumed = test::run(test::medfast_binary() + " --threads 1 train --resume --config " + (dir / "run.json") +
                                 " --set train.epochs=" + std::to_string(meta["epoch"].get<int>() + 1));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  if (meta.contains("partial")) EXPECT_NE(resumed.out.find(" after step "), std::string::npos) << resumed.out;
}

// train.memory_format channels_last on the CPU (where auto picks contiguous): the network,
// its batches and validation run NDHWC; the run trains as the contiguous one does (float
// rounding apart), its checkpoints are contiguous on disk (as PyTorch and MONAI expect
// files), and it resumes bit-identically into its channels-last network.
TEST(Trainer, ChannelsLastTrainsAsContiguousWritesContiguousFilesAndResumes) {
  test::TempDir dir;
  const nlohmann::json base = tiny_config(dir);
  nlohmann::json a = base;
  a["train"]["run_dir"] = dir / "contiguous";
  const TrainResult ra = Trainer(a, "", one_thread()).run(false);
  nlohmann::json b = base;
  b["train"]["run_dir"] = dir / "channels_last";
  b["train"]["memory_format"] = "channels_last";
  std::vector<std::string> said;
  TrainCallbacks cb;
  cb.message = [&](const std::string& m) { said.push_back(m); };
  const TrainResult rb = Trainer(b, "", one_thread()).run(false, cb);
  ASSERT_EQ(rb.history.size(), ra.history.size());
  for (std::size_t i = 0; i < ra.history.size(); ++i) {
    EXPECT_NEAR(rb.history[i].loss, ra.history[i].loss, 1e-3 * std::abs(ra.history[i].loss)) << "epoch " << i + 1;
    EXPECT_NEAR(*rb.history[i].dice, *ra.history[i].dice, 0.02) << "epoch " << i + 1;
  }
  EXPECT_TRUE(std::any_of(said.begin(), said.end(),
                          [](const std::string& m) { return m.find("amp fp32, channels_last") != std::string::npos; }));
  // On disk: every tensor, the optimizer's momentum buffers too, contiguous.
  const auto stored = read_checkpoint_tensors(dir / "channels_last/last.ckpt");
  int five_d = 0, state = 0;
  for (const auto& [name, t] : stored) {
    EXPECT_TRUE(t.is_contiguous()) << name << " strides " << t.strides();
    if (t.dim() == 5 && name.rfind("optimizer/", 0) != 0) {
      ++five_d;
      EXPECT_EQ(t.stride(1), t.size(2) * t.size(3) * t.size(4)) << name << ": NCDHW strides";
    }
    if (name.rfind("optimizer/", 0) == 0 && t.dim() == 5) ++state;
  }
  EXPECT_GT(five_d, 3);
  EXPECT_GT(state, 3);
  // Resumed after epoch 1 into a channels-last network: as the run that went on.
  nlohmann::json c = b;
  c["train"]["run_dir"] = dir / "resumed";
  TrainCallbacks stop;
  stop.epoch = [](const EpochRecord& r) {
    if (r.epoch == 1) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(Trainer(c, "", one_thread()).run(false, stop), std::runtime_error);
  const TrainResult rc = Trainer(c, "", one_thread()).run(true);
  ASSERT_EQ(rc.history.size(), rb.history.size());
  EXPECT_EQ(rc.history.back().loss, rb.history.back().loss);
  const auto tb = checkpoint_tensors(dir / "channels_last/last.ckpt", base["model"]);
  const auto tc = checkpoint_tensors(dir / "resumed/last.ckpt", base["model"]);
  for (const auto& [name, t] : tb) EXPECT_TRUE(at::equal(t, tc.at(name))) << name << " differs after resume";
  // The choice, resolved by device; a bad value names the key and the choices.
  EXPECT_EQ(resolve_memory_format(MemoryFormatChoice::automatic, c10::Device("cuda:0")), at::MemoryFormat::ChannelsLast3d);
  EXPECT_EQ(resolve_memory_format(MemoryFormatChoice::automatic, c10::Device("cpu")), at::MemoryFormat::Contiguous);
  EXPECT_EQ(resolve_memory_format(MemoryFormatChoice::contiguous, c10::Device("cuda:0")), at::MemoryFormat::Contiguous);
  EXPECT_EQ(memory_format_of(nlohmann::json::object(), c10::Device("cuda:0"), "x"), at::MemoryFormat::ChannelsLast3d);
  const std::string m = test::error_of<ValueError>(
      [&] { memory_format_of({{"memory_format", "NDHWC"}}, c10::Device("cpu"), "old.ckpt"); });
  EXPECT_EQ(m, "old.ckpt: train.memory_format: expected auto | channels_last | contiguous, got \"NDHWC\"");
  // train.deterministic as eval and infer read it from a checkpoint's config: true where absent.
  EXPECT_TRUE(deterministic_of(nlohmann::json::object(), "x"));
  EXPECT_FALSE(deterministic_of({{"deterministic", false}}, "x"));
  EXPECT_EQ(test::error_of<ValueError>([&] { deterministic_of({{"deterministic", "yes"}}, "old.ckpt"); }),
            "old.ckpt: train.deterministic: expected true or false, got \"yes\"");
  nlohmann::json bad = base;
  bad["train"]["memory_format"] = "nhwc";
  const std::string k = test::error_of<ConfigError>([&] { Trainer(bad, "", one_thread()); });
  EXPECT_NE(k.find("train.memory_format"), std::string::npos) << k;
  EXPECT_NE(k.find("channels_last"), std::string::npos) << k;
}

// train.cuda_graph: on is refused, naming what to change, where a captured step could not
// replay: with the profiler, with batches of two shapes (a smaller last one), on the CPU. The
// captured step itself is tested on a GPU (TrainingStepGpu).
TEST(Trainer, CudaGraphIsRefusedWhereACapturedStepCannotReplay) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["cuda_graph"] = "on";
  c["train"]["profile"] = true;
  std::string m = test::error_of<ValueError>([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_NE(m.find("train.cuda_graph: on and train.profile exclude each other"), std::string::npos) << m;
  c["train"].erase("profile");
  m = test::error_of<ValueError>([&] { Trainer(c, "", one_thread()).run(false); });  // 5 items, batches of 2
  EXPECT_NE(m.find("5 training items in batches of 2 leave a last batch of 1: set data.loader.drop_last: true"),
            std::string::npos)
      << m;
  c["data"]["loader"]["drop_last"] = true;
  m = test::error_of<ValueError>([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_NE(m.find("train.cuda_graph: on needs a CUDA device (a CUDA graph replays GPU work); the run's device is cpu"),
            std::string::npos)
      << m;
  EXPECT_FALSE(os::exists(dir / "run/last.ckpt"));  // refused before any training
  c["train"]["cuda_graph"] = "sometimes";
  m = test::error_of<ConfigError>([&] { Trainer(c, "", one_thread()); });
  EXPECT_NE(m.find("train.cuda_graph"), std::string::npos) << m;
  EXPECT_NE(m.find("off | on"), std::string::npos) << m;
}

// infer into a folder where an earlier infer was killed mid-write: its temporaries (their
// writer gone) are removed and said once; a running writer's stay. A roi_size the network
// cannot take is named before any file is read, and nothing is written.
TEST(Trainer, InferRemovesDeadWritersTemporariesAndChecksItsWindowFirst) {
  test::TempDir dir;
  const nlohmann::json c = trained_one_epoch(dir);
  const auto images = os::list_directory(dir / "data/imagesTr");
  ASSERT_FALSE(images.empty());
  const std::string input = dir / ("data/imagesTr/" + images[0]);
  os::make_directories(dir / "out");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // a writer that is gone
  const std::string dead = dir / str("out/.a_seg.nii.gz.medfast-tmp-", child, "-0");
  const std::string live = dir / str("out/.b_seg.nii.gz.medfast-tmp-", ::getppid(), "-0");  // a process that runs
  test::write_file(dead, std::string(1000, 'x'));
  test::write_file(live, "y");
  std::vector<std::string> said;
  const auto collect = [&](const std::string& m) { said.push_back(m); };
  InferOptions io;
  io.device = "cpu";
  infer(dir / "run/last.ckpt", {input}, dir / "out", io, one_thread(), collect);
  EXPECT_FALSE(os::exists(dead));
  EXPECT_TRUE(os::exists(live)) << "a running writer's temporary was removed";
  EXPECT_EQ(std::count_if(said.begin(), said.end(),
                          [&](const std::string& m) {
                            return m == str("removed 1 temporary files of an interrupted write from ", dir / "out",
                                            " (1000 B)");
                          }),
            1)
      << (said.empty() ? "" : said[0]);
  // A window of 15x15x7: not a multiple of the network's strides (2, 2).
  io.sliding_window = {{"roi_size", {15, 15, 7}}};
  const std::string m = test::error_of<Error>([&] { infer(dir / "run/last.ckpt", {input}, dir / "out2", io, one_thread()); });
  EXPECT_NE(m.find("infer: the network cannot take a window of [1, 1, 15, 15, 7] (sliding_window roi_size [15, 15, 7]"),
            std::string::npos)
      << m;
  EXPECT_FALSE(os::exists(dir / "out2")) << "the output folder was made before the window was checked";
}

// A NaN loss in fp32 stops the run at that step, naming the epoch, the step and the last
// finite loss; the checkpoints of earlier epochs stay, the bad epoch is not saved.
TEST(Trainer, NonFiniteLossStopsTheRunAndKeepsEarlierCheckpoints) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 3;
  TrainCallbacks cb;
  std::map<std::pair<int, int>, double> losses;  // (epoch, step): the steps' losses
  cb.loss_filter = [&](int epoch, int step, const at::Tensor& loss) {
    if (epoch == 2 && step == 2) return loss * std::nan("");  // as a diverging run's would be
    losses[{epoch, step}] = loss.item<double>();
    return loss;
  };
  Trainer trainer(c, "", one_thread());
  const std::string m = test::error_of<NonFiniteLoss>([&] { trainer.run(false, cb); });
  EXPECT_NE(m.find("training stopped at epoch 2, step 2 of "), std::string::npos) << m;
  EXPECT_NE(m.find("the loss is nan (fp32 has no loss scaler"), std::string::npos) << m;
  // (Its outcome is read while the next step runs: that step's loss came later, and is not the last before.)
  EXPECT_NE(m.find(str("the last finite loss was ", losses.at({2, 1}), " at epoch 2, step 1")), std::string::npos) << m;
  EXPECT_NE(m.find(str(dir / "run/last.ckpt", " (epoch 1)")), std::string::npos) << m;
  EXPECT_NE(m.find("epoch 2 is not saved"), std::string::npos) << m;
  EXPECT_NE(m.find("optimizer.lr 0.005"), std::string::npos) << m;
  EXPECT_NE(m.find("self-check passed"), std::string::npos) << m;
  EXPECT_EQ(read_checkpoint_meta(dir / "run/last.ckpt")["epoch"], 1);
  EXPECT_TRUE(os::exists(dir / "run/best.ckpt"));
  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1) << jsonl;
  // The run was not damaged: it resumes and finishes.
  const TrainResult r = Trainer(c, "", one_thread()).run(true);
  ASSERT_EQ(r.history.size(), 3u);
  for (const auto& e : r.history) EXPECT_TRUE(std::isfinite(e.loss));
}

// train.max_nonfinite_steps: bad steps are skipped (their NaN gradients never reach the
// weights) until that many come in a row; 0 never stops.
TEST(Trainer, NonFiniteStepsAreSkippedUntilTheLimitInARow) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["max_nonfinite_steps"] = 3;
  c["train"]["epochs"] = 3;  // 5 training items in batches of 2: 3 steps an epoch
  TrainCallbacks cb;
  cb.loss_filter = [](int epoch, int step, const at::Tensor& loss) {
    const bool bad = (epoch == 1 && step <= 2) || (epoch == 2 && step >= 2) || epoch == 3;
    return bad ? loss * std::nan("") : loss;
  };
  // The row of bad steps runs on across the epochs' end.
  const std::string m = test::error_of<NonFiniteLoss>([&] { Trainer(c, "", one_thread()).run(false, cb); });
  EXPECT_NE(m.find("training stopped at epoch 3, step 1 of 3"), std::string::npos) << m;
  EXPECT_NE(m.find("3 steps in a row (fp32"), std::string::npos) << m;
  // Epochs 1 and 2 (2 skipped steps each, the others finite) finished with finite mean losses.
  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  ASSERT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 2) << jsonl;
  for (const auto& line : {jsonl.substr(0, jsonl.find('\n')), jsonl.substr(jsonl.find('\n') + 1)}) {
    const auto e = nlohmann::json::parse(line);
    EXPECT_EQ(e["steps"], 3) << line;
    EXPECT_EQ(e["skipped_steps"], 2) << line;
    EXPECT_TRUE(e["loss"].is_number()) << line;
    EXPECT_TRUE(e["dice"].is_number()) << line;
  }

  // 0: never stop; every step skipped leaves the weights as they were initialised.
  c["train"]["max_nonfinite_steps"] = 0;
  c["train"]["epochs"] = 1;
  c["train"]["run_dir"] = dir / "never";
  cb.loss_filter = [](int, int, const at::Tensor& loss) { return loss * std::nan(""); };
  const TrainResult r = Trainer(c, "", one_thread()).run(false, cb);
  ASSERT_EQ(r.history.size(), 1u);
  EXPECT_EQ(r.history[0].skipped_steps, r.history[0].steps);
  EXPECT_TRUE(std::isnan(r.history[0].loss));
  torch::manual_seed(c["train"]["seed"].get<std::uint64_t>());
  auto init = nn::make_network(c["model"]);
  const auto trained = checkpoint_tensors(dir / "never/last.ckpt", c["model"]);
  for (const auto& p : init.ptr()->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), trained.at(p.key()))) << p.key() << " changed by a skipped step";
  }
  c["train"]["max_nonfinite_steps"] = -2;
  EXPECT_THROW(Trainer(c, "", one_thread()), ConfigError);
  EXPECT_EQ(max_nonfinite_steps(-1, Precision::fp32), kDefaultMaxNonfiniteSteps);
  EXPECT_EQ(max_nonfinite_steps(-1, Precision::bf16), kDefaultMaxNonfiniteSteps);
  EXPECT_EQ(max_nonfinite_steps(-1, Precision::fp16), kDefaultMaxNonfiniteStepsFp16);
  EXPECT_EQ(max_nonfinite_steps(5, Precision::fp16), 5);
}

// Logits with NaN are scored as NaN (null), never as Dice 0 nor left out of the mean:
// in training's validation, in eval; infer refuses to write their labels.
TEST(Trainer, NaNLogitsAreReportedAsSuchNotAsDiceZero) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  Trainer(c, "", one_thread()).run(false, {}, false);  // 2 epochs
  // Poison the last checkpoint's weights (NaN everywhere), as a diverged run would leave them.
  c["train"]["epochs"] = 3;
  c["train"]["max_nonfinite_steps"] = 0;  // train on (skipping every step) to reach validation
  {
    torch::manual_seed(0);
    auto net = nn::make_network(c["model"]);
    const RunConfig rc = [&] {
      Settings s = one_thread();
      return load_run_config(c, "", s);
    }();
    auto opt = make_optimizer(net.ptr()->parameters(), rc.optimizer);
    nlohmann::json meta = load_checkpoint(dir / "run/last.ckpt", *net.ptr(), opt.get());
    torch::NoGradGuard g;
    for (auto& p : net.ptr()->parameters()) p.fill_(std::nan(""));
    save_checkpoint(dir / "run/last.ckpt", *net.ptr(), opt.get(), meta);
    save_checkpoint(dir / "run/nan.ckpt", *net.ptr(), nullptr, meta);
  }
  const TrainResult r = Trainer(c, "", one_thread()).run(true);
  ASSERT_EQ(r.history.size(), 3u);
  const EpochRecord& e = r.history[2];
  ASSERT_TRUE(e.dice.has_value());
  EXPECT_TRUE(std::isnan(*e.dice));
  for (double d : e.dice_per_class) EXPECT_TRUE(std::isnan(d));
  EXPECT_EQ(e.nonfinite_validation_cases, 1);
  EXPECT_LT(r.best_epoch, 3);  // NaN is never the best
  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  const auto third = nlohmann::json::parse(jsonl.substr(jsonl.rfind('\n', jsonl.size() - 2) + 1));
  EXPECT_TRUE(third["dice"].is_null()) << third.dump();
  EXPECT_EQ(third["nonfinite_validation_cases"], 1) << third.dump();

  EvalOptions eo;
  const EvalResult er = evaluate(dir / "run/nan.ckpt", nullptr, "", one_thread(), eo);
  ASSERT_FALSE(er.cases.empty());
  EXPECT_EQ(er.nonfinite_cases, static_cast<std::int64_t>(er.cases.size()));
  EXPECT_TRUE(std::isnan(er.mean_dice));
  for (const auto& cs : er.cases) {
    for (double d : cs.dice) EXPECT_TRUE(std::isnan(d));
  }
  EXPECT_TRUE(er.to_json()["mean_dice"].is_null());

  const auto images = os::list_directory(dir / "data/imagesTr");
  ASSERT_FALSE(images.empty());
  InferOptions io;
  const std::string m = test::error_of<Error>(
      [&] { infer(dir / "run/nan.ckpt", {dir / ("data/imagesTr/" + images[0])}, dir / "out", io, one_thread()); });
  EXPECT_NE(m.find("holds NaN or infinity"), std::string::npos) << m;
  EXPECT_NE(m.find(images[0]), std::string::npos) << m;
  EXPECT_TRUE(os::user_entries(dir / "out").empty());  // its mark alone
}

TEST(NonFiniteGuard, CountsBadStepsInARowPerPrecision) {
  NonFiniteGuard fp16(Precision::fp16, 3);
  const auto none = [] { return std::string(); };
  fp16.record(1, 1, 10, 0.5, false, none);  // an overflow while the scale settles
  fp16.record(1, 2, 10, 0.5, false, none);
  fp16.record(1, 3, 10, 0.4, true, none);   // a clean step resets the count
  EXPECT_EQ(fp16.bad_in_a_row(), 0);
  fp16.record(1, 4, 10, std::nan(""), false, none);
  fp16.record(1, 5, 10, INFINITY, false, none);
  const std::string m =
      test::error_of<NonFiniteLoss>([&] { fp16.record(1, 6, 10, 0.7, false, [] { return std::string("kept: nothing"); }); });
  EXPECT_NE(m.find("epoch 1, step 6 of 10: the fp16 loss scaler skipped the step"), std::string::npos) << m;
  EXPECT_NE(m.find("3 steps in a row"), std::string::npos) << m;
  EXPECT_NE(m.find("the last finite loss was 0.7 at epoch 1, step 6"), std::string::npos) << m;
  EXPECT_NE(m.find(". kept: nothing"), std::string::npos) << m;
  NonFiniteGuard fp32(Precision::fp32, 1);
  // A finite loss, non-finite gradients.
  const std::string m2 = test::error_of<NonFiniteLoss>([&] { fp32.record(3, 1, 4, 0.25, false, none); });
  EXPECT_NE(m2.find("the gradients are not finite (loss 0.25)"), std::string::npos) << m2;
  NonFiniteGuard never(Precision::bf16, 0);
  for (int i = 1; i <= 100; ++i) never.record(1, i, 100, std::nan(""), false, none);
  EXPECT_EQ(never.bad_in_a_row(), 100);
  EXPECT_THROW(NonFiniteGuard(Precision::fp32, -1), ValueError);
}

TEST(Trainer, RefusesToOverwriteAnEarlierRun) {
  test::TempDir dir;
  nlohmann::json c = trained_one_epoch(dir);
  const std::string before = test::read_file(dir / "run/last.ckpt");
  const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_TRUE(test::contains_all(m, {"--resume", "--overwrite"}));
  EXPECT_EQ(test::read_file(dir / "run/last.ckpt"), before);  // untouched
  EXPECT_THROW(Trainer(c, "", one_thread()).run(true, {}, true), ValueError);  // both flags
  const TrainResult r = Trainer(c, "", one_thread()).run(false, {}, /*overwrite=*/true);
  EXPECT_EQ(r.history.size(), 1u);
  const std::string jsonl = test::read_file(dir / "run/metrics.jsonl");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1) << jsonl;
  // The old run's TensorBoard file went with it: its curves would be merged with the new run's.
  const nlohmann::json events = test::read_tfevents(dir / "run");
  EXPECT_EQ(events["files"].size(), 1u);
  EXPECT_EQ(test::scalars_of(events, "epoch_loss").size(), 1u);
  // train.tensorboard: false writes none.
  c["train"]["tensorboard"] = false;
  Trainer(c, "", one_thread()).run(false, {}, /*overwrite=*/true);
  for (const std::string& f : os::list_directory(dir / "run")) EXPECT_FALSE(profile::is_event_file(f)) << f;
  EXPECT_FALSE(os::exists(dir / ("run/" + std::string(kOverwrittenName))));
}

// --overwrite keeps the old run until the new one has a checkpoint: a new run that fails in
// its first epoch leaves the old run's files as they were (its own are gone).
TEST(Trainer, AnOverwriteThatFailsBeforeItsFirstCheckpointPutsTheOldRunBack) {
  test::TempDir dir;
  nlohmann::json c = trained_one_epoch(dir);
  std::map<std::string, std::string> before;
  for (const std::string& f : os::list_directory(dir / "run")) {
    if (os::stat(dir / ("run/" + f)).is_regular) before[f] = test::read_file(dir / ("run/" + f));
  }
  ASSERT_TRUE(before.count("last.ckpt") && before.count("metrics.jsonl") && before.count("config.json"));
  c["optimizer"]["lr"] = 0.5;  // the new run's config.json differs
  TrainCallbacks cb;
  cb.loss_filter = [](int, int step, const at::Tensor& loss) -> at::Tensor {
    if (step == 2) throw Error("a failure in the first epoch");
    return loss;
  };
  EXPECT_THROW(Trainer(c, "", one_thread()).run(false, cb, /*overwrite=*/true), Error);
  std::map<std::string, std::string> after;
  for (const std::string& f : os::list_directory(dir / "run")) {
    if (os::stat(dir / ("run/" + f)).is_regular) after[f] = test::read_file(dir / ("run/" + f));
  }
  EXPECT_EQ(after, before);
  EXPECT_FALSE(os::exists(dir / ("run/" + std::string(kOverwrittenName))));
}

// One train per run_dir: a second one is refused, naming the holder's pid, while the first
// holds the folder's lock; the lock goes with the process that held it.
TEST(Trainer, ASecondTrainInTheSameRunDirIsRefused) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 1;
  os::make_directories(dir / "run");
  {
    const auto held = os::try_lock_file(dir / ("run/" + std::string(kRunLockName)));
    ASSERT_TRUE(held);
    const std::string m = test::error_of<ValueError>([&] { Trainer(c, "", one_thread()).run(false); });
    EXPECT_NE(m.find("is in use by another medfast train (pid " + std::to_string(::getpid()) + ")"), std::string::npos)
        << m;
    EXPECT_FALSE(os::exists(dir / "run/config.json"));
  }
  EXPECT_EQ(Trainer(c, "", one_thread()).run(false).history.size(), 1u);
}

TEST(Trainer, ReportsBadKeysAndWindowsBeforeTraining) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["validation"]["sliding_window"]["roi_size"] = {15, 15, 7};  // UNet with strides 2, 2 needs multiples of 4
  const std::string window = test::error_of<Error>([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_NE(window.find("validation window"), std::string::npos) << window;
  EXPECT_EQ(window.find("frame #"), std::string::npos) << "a C++ backtrace in: " << window;
  EXPECT_FALSE(os::exists(dir / "run/last.ckpt"));
  c = tiny_config(dir);
  c["train"]["image_key"] = "img";
  const std::string key = test::error_of<Error>([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_NE(key.find("train.image_key 'img'"), std::string::npos) << key;
}

TEST(Checkpoint, DamageIsDetectedAndNamed) {
  test::TempDir dir;
  nn::UNetOptions o;
  o.channels = {4, 8};
  o.strides = {2};
  nn::UNet net(o);
  const std::string path = dir / "x.ckpt";
  save_checkpoint(path, *net, nullptr, {{"epoch", 3}});
  nn::UNet other(o);
  EXPECT_EQ(load_checkpoint(path, *other, nullptr)["epoch"], 3);
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), other->named_parameters()[p.key()])) << p.key();
  }
  auto expect_error = [&](const std::string& file, const std::string& want) {
    nn::UNet n(o);
    const std::string m = test::error_of<FormatError>([&] { load_checkpoint(file, *n, nullptr); });
    EXPECT_TRUE(test::contains_all(m, {want, file}));
  };
  std::string bytes = test::read_file(path);
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  test::write_file(dir / "flipped.ckpt", flipped);
  expect_error(dir / "flipped.ckpt", "checksum");
  test::write_file(dir / "short.ckpt", bytes.substr(0, bytes.size() - 100));
  expect_error(dir / "short.ckpt", "truncated");
  test::write_file(dir / "other.ckpt", "hello");
  expect_error(dir / "other.ckpt", "not a medfast checkpoint");
  // Another network's tensors: named.
  nn::UNetOptions wide = o;
  wide.channels = {4, 16};
  nn::UNet w(wide);
  save_checkpoint(dir / "wide.ckpt", *w, nullptr, {});
  expect_error(dir / "wide.ckpt", "shape");
  // A failed save leaves the previous file intact.
  os::testing::ScopedHook hook([](os::Op op, const std::string&, std::uint64_t, std::size_t) {
    return op == os::Op::write ? os::testing::HookResult{ENOSPC} : os::testing::HookResult{};
  });
  EXPECT_THROW(save_checkpoint(path, *w, nullptr, {{"epoch", 4}}), Error);
  EXPECT_EQ(read_checkpoint_meta(path)["epoch"], 3);
}

// One training step (forward, DiceCE, backward, SGD with momentum) equals python3-torch
// on the same weights and batch (tests/golden/make_train_step_golden.py).
TEST(Trainer, OneStepMatchesPythonTorch) {
  test::TempDir dir;
  torch::manual_seed(3);
  nn::UNetOptions o;
  o.channels = {4, 8};
  o.strides = {2};
  o.num_res_units = 0;
  o.norm = nn::UNetNorm::instance;
  nn::UNet net(o);
  const at::Tensor x = torch::rand({2, 1, 8, 8, 8});
  const at::Tensor y = (torch::rand({2, 1, 8, 8, 8}) > 0.6).to(at::kByte);
  nlohmann::json manifest = nlohmann::json::object();
  auto dump = [&](const std::string& name, const at::Tensor& t) {
    const at::Tensor c = t.detach().to(at::kFloat).contiguous();
    test::write_file(dir / (name + ".bin"),
                     std::string(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float)));
    manifest[name] = c.sizes().vec();
  };
  for (const auto& p : net->named_parameters()) dump("param." + p.key(), p.value());
  dump("x", x);
  dump("y", y);
  test::write_file(dir / "manifest.json", manifest.dump());

  OptimizerOptions oo;
  oo.name = "SGD";
  oo.lr = 0.1;
  oo.momentum = 0.9;
  oo.nesterov = false;
  oo.weight_decay = 1e-4;
  auto opt = make_optimizer(net->parameters(), oo);
  LossOptions lo;
  lo.to_onehot_y = true;
  lo.softmax = true;
  const Loss loss_fn(lo);
  std::vector<double> losses;
  for (int step = 0; step < 2; ++step) {
    opt->zero_grad();
    const at::Tensor loss = loss_fn(net->forward(x), y);
    loss.backward();
    opt->step();
    losses.push_back(loss.item<double>());
  }

  const auto r = test::run(test::python() + " " + test::source_dir() + "/tests/golden/make_train_step_golden.py " +
                           dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = nlohmann::json::parse(test::read_file(dir / "out.json"));
  ASSERT_EQ(want["losses"].size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(losses[i], want["losses"][i].get<double>(), 1e-5) << "step " << i;
  for (const auto& p : net->named_parameters()) {
    const std::string bytes = test::read_file(dir / ("out." + p.key() + ".bin"));
    ASSERT_EQ(bytes.size(), static_cast<std::size_t>(p.value().numel()) * sizeof(float)) << p.key();
    at::Tensor ref = at::empty(p.value().sizes(), at::kFloat);
    std::memcpy(ref.data_ptr(), bytes.data(), bytes.size());
    EXPECT_TRUE(at::allclose(p.value().detach(), ref, 1e-4, 1e-6))
        << p.key() << " max diff " << (p.value().detach() - ref).abs().max().item<double>();
  }
}

// The CLI end to end on the tiny run: train (JSON), eval, infer (geometry of the input).
TEST(TrainCli, TrainEvalInferEndToEnd) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["run_dir"] = "run";  // relative to the config's folder
  c["data"]["dataset"] = "data/dataset.json";
  test::write_file(dir / "run.json", c.dump());
  const std::string bin = test::medfast_binary();
  auto r = test::run(bin + " --threads 1 train --config " + dir / "run.json" + " --set train.epochs=1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto res = nlohmann::json::parse(r.out);
  EXPECT_EQ(res["epochs"], 1);
  EXPECT_TRUE(os::exists(dir / "run/last.ckpt"));

  r = test::run(bin + " --threads 1 eval --checkpoint " + dir / "run/last.ckpt" + " --json --hd95");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ev = nlohmann::json::parse(r.out);
  ASSERT_EQ(ev["cases"].size(), 1u);
  EXPECT_EQ(ev["cases"][0]["dice"].size(), 1u);
  EXPECT_TRUE(ev.contains("mean_hd95"));
  // The same Dice as the trainer's validation of that epoch.
  EXPECT_NEAR(ev["mean_dice"].get<double>(), res["history"][0]["dice"].get<double>(), 1e-9);
  // --set without --config overrides the checkpoint's own config (its relative paths still
  // anchored where it was trained); a value out of range names its key; the model is fixed.
  r = test::run(bin + " --threads 1 eval --checkpoint " + dir / "run/last.ckpt" +
                " --set validation.sliding_window.mode=gaussian --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["mean_dice"].is_number()) << r.out;
  r = test::run(bin + " eval --checkpoint " + dir / "run/last.ckpt" + " --set validation.sliding_window.overlap=1.5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("overlap"), std::string::npos) << r.err;
  r = test::run(bin + " eval --checkpoint " + dir / "run/last.ckpt" + " --set model.channels=[4,8,32]");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("model differs"), std::string::npos) << r.err;

  const std::string input = dir / "data/imagesTr/spleen_5.nii.gz";
  r = test::run(bin + " --threads 1 infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input +
                " --output " + dir / "pred --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Volume in = read_nifti(input);
  const Volume out = read_nifti(dir / "pred/spleen_5_seg.nii.gz");
  EXPECT_EQ(out.shape(), in.shape());
  EXPECT_EQ(out.affine.max_abs_diff(in.affine), 0.0) << out.affine.to_string() << " vs " << in.affine.to_string();
  EXPECT_EQ(out.data.scalar_type(), at::kByte);
  EXPECT_LE(out.data.max().item<int>(), 1);

  // Progress lines (MEDFAST_PROGRESS=tty as on a terminal): the cache fill and each
  // epoch, eval's cases and infer's files, on stderr; the summaries on stdout.
  const std::string tty = "MEDFAST_PROGRESS=tty " + bin + " --threads 1 ";
  r = test::run(tty + "train --config " + dir / "run.json" + " --set train.epochs=1 --set train.run_dir=run2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("\rtraining items  5/5  100%"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\repoch 1/1  3/3  100%"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("steps/s"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("epoch 1/1  loss"), std::string::npos) << r.out;
  r = test::run(tty + "eval --checkpoint " + dir / "run/last.ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("\reval  1/1  100%"), std::string::npos) << r.err;
  r = test::run(tty + "infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input + " --output " + dir / "pred4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("\rinfer  1/1  100%"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("spleen_5_seg.nii.gz"), std::string::npos) << r.out;
  r = test::run("MEDFAST_PROGRESS=sometimes " + bin + " eval --checkpoint " + dir / "run/last.ckpt");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("MEDFAST_PROGRESS"), std::string::npos) << r.err;

  // Bad input: one line naming the file.
  test::write_file(dir / "bad.nii", "not a nifti");
  r = test::run(bin + " infer --checkpoint " + dir / "run/last.ckpt" + " --input " + dir / "bad.nii" + " --output " +
                dir / "pred2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bad.nii"), std::string::npos) << r.err;
  r = test::run(bin + " eval --checkpoint " + dir / "run/last.ckpt" + " --device gpu7");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--device: 'gpu7' is not a device"), std::string::npos) << r.err;
  r = test::run(bin + " infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input + " --output " +
                dir / "pred3 --device gpu7");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--device: 'gpu7' is not a device"), std::string::npos) << r.err;
  r = test::run(bin + " train --config " + dir / "run.json" + " --set train.epochs=zero");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("train.epochs"), std::string::npos) << r.err;
}

// Test-time augmentation (issue 26): validation.tta: flips scores validation and eval with
// the mirrored windows' mean; infer takes it from the checkpoint or from --tta.
TEST(TrainCli, TestTimeFlipsInValidationEvalAndInfer) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["validation"]["tta"] = "flips";
  test::write_file(dir / "run.json", c.dump());
  const std::string bin = test::medfast_binary() + " --threads 1 ";
  auto r = test::run(bin + "train --config " + dir / "run.json" + " --set train.epochs=1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto res = nlohmann::json::parse(r.out);
  ASSERT_TRUE(res["history"][0]["dice"].is_number());
  r = test::run(bin + "eval --checkpoint " + dir / "run/last.ckpt" + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(nlohmann::json::parse(r.out)["mean_dice"].get<double>(), res["history"][0]["dice"].get<double>(), 1e-9);
  // A config's validation.tta: none scores without it.
  r = test::run(bin + "eval --checkpoint " + dir / "run/last.ckpt" + " --config " + dir / "run.json" +
                " --set validation.tta=none --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["mean_dice"].is_number());

  const std::string input = dir / "data/imagesTr/spleen_5.nii.gz";
  r = test::run(bin + "infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input + " --output " + dir / "flips");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("test-time augmentation flips: 8 network calls per window"), std::string::npos) << r.out;
  r = test::run(bin + "infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input + " --output " + dir / "none" +
                " --tta none");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("test-time augmentation"), std::string::npos) << r.out;
  r = test::run(bin + "infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input + " --output " + dir / "again" +
                " --tta flips");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const at::Tensor flips = read_nifti(dir / "flips/spleen_5_seg.nii.gz").data,
                   again = read_nifti(dir / "again/spleen_5_seg.nii.gz").data,
                   none = read_nifti(dir / "none/spleen_5_seg.nii.gz").data;
  EXPECT_TRUE(at::equal(flips, again));
  EXPECT_EQ(flips.sizes(), none.sizes());

  // Bad values name where they came from.
  r = test::run(bin + "infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input + " --output " + dir / "x" +
                " --tta sideways");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--tta: expected none | flips, got 'sideways'"), std::string::npos) << r.err;
  r = test::run(bin + "train --config " + dir / "run.json" + " --set validation.tta=sideways --set train.run_dir=" + dir / "r2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("validation.tta"), std::string::npos) << r.err;
}

// infer over several files reads the next one and writes the previous one while the current
// one is inferred: the same labels as one file at a time, every case reported in order; a bad
// file in the middle stops there with its name, after the files before it were written whole.
TEST(Trainer, InferOverFilesReadsAheadAndWritesBehind) {
  test::TempDir dir;
  const nlohmann::json c = trained_one_epoch(dir);
  const auto images = os::list_directory(dir / "data/imagesTr");
  ASSERT_GE(images.size(), 3u);
  std::vector<std::string> inputs;
  for (std::size_t i = 0; i < 3; ++i) inputs.push_back(dir / ("data/imagesTr/" + images[i]));
  InferOptions io;
  std::vector<std::string> said;
  std::vector<std::size_t> progress;
  io.on_progress = [&](std::size_t done, std::size_t total) {
    EXPECT_EQ(total, 3u);
    progress.push_back(done);
  };
  const auto all = infer(dir / "run/last.ckpt", inputs, dir / "all", io, one_thread(),
                         [&](const std::string& m) { said.push_back(m); });
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(progress, (std::vector<std::size_t>{1, 2, 3}));
  ASSERT_EQ(said.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(all[i].input, inputs[i]);
    EXPECT_EQ(said[i].rfind(inputs[i] + " -> ", 0), 0u) << said[i];
    EXPECT_GT(all[i].read_seconds, 0);
    EXPECT_GE(all[i].wait_seconds, 0);
    EXPECT_GT(all[i].write_seconds, 0);
    EXPECT_TRUE(all[i].to_json().contains("wait_seconds"));
    const auto one = infer(dir / "run/last.ckpt", {inputs[i]}, dir / ("one" + std::to_string(i)), InferOptions{}, one_thread());
    const Volume a = read_nifti(all[i].output), b = read_nifti(one.at(0).output);
    EXPECT_TRUE(at::equal(a.data, b.data)) << inputs[i];
    EXPECT_EQ(a.affine.max_abs_diff(b.affine), 0.0);
  }
  // The second of three is not a NIfTI file.
  test::write_file(dir / "broken.nii", "not a nifti");
  const std::vector<std::string> mixed{inputs[0], dir / "broken.nii", inputs[2]};
  const std::string m =
      test::error_of<Error>([&] { infer(dir / "run/last.ckpt", mixed, dir / "mixed", InferOptions{}, one_thread()); });
  EXPECT_NE(m.find("broken.nii"), std::string::npos) << m;
  const auto file_name = [](const std::string& path) { return path.substr(path.rfind('/') + 1); };
  const Volume first = read_nifti(dir / ("mixed/" + file_name(all[0].output)));
  EXPECT_TRUE(at::equal(first.data, read_nifti(all[0].output).data));
  EXPECT_FALSE(os::exists(dir / ("mixed/" + file_name(all[2].output))));
  for (const auto& name : os::list_directory(dir / "mixed")) {
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "a temporary file was left: " << name;
  }
}

// infer takes a DICOM series (its folder, with or without a trailing slash) as LoadImage does:
// the labels of the same image converted to NIfTI, on the series' grid, written as
// <folder>_seg.nii.gz; a folder above series infers each series below it. Refused before
// anything is written, naming the input: two series of one folder name (one output file),
// a SEG, a folder without images, a file of neither format.
TEST(Trainer, InferTakesDicomSeries) {
  test::TempDir dir;
  const nlohmann::json c = trained_one_epoch(dir);
  SynthOptions so;
  so.out_dir = dir / "dcm";
  so.set_cases(2).set_format("dicom").set_size("40,40,12-14").set_spacing({2.0, 2.0, 3.0});
  so.seed = 3;
  synthesize_dataset(so);
  const std::string series = dir / "dcm/case_000/CT";
  const Volume image = read_image(series);
  os::make_directories(dir / "nii");
  write_nifti(dir / "nii/CT.nii.gz", image);
  const std::string ckpt = dir / "run/last.ckpt";
  const auto from_dicom = infer(ckpt, {series + "/"}, dir / "out", InferOptions{}, one_thread());
  const auto from_nifti = infer(ckpt, {dir / "nii/CT.nii.gz"}, dir / "ref", InferOptions{}, one_thread());
  ASSERT_EQ(from_dicom.size(), 1u);
  EXPECT_EQ(from_dicom[0].output, dir / "out/CT_seg.nii.gz");
  const Volume got = read_nifti(from_dicom[0].output), want = read_nifti(from_nifti.at(0).output);
  EXPECT_EQ(got.shape(), image.shape());
  EXPECT_LE(got.affine.max_abs_diff(image.affine), 1e-4)
      << got.affine.to_string() << " vs " << image.affine.to_string();
  EXPECT_EQ(got.affine.max_abs_diff(want.affine), 0.0);
  EXPECT_EQ(got.data.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(got.data, want.data)) << (got.data != want.data).sum().item<std::int64_t>() << " voxels differ";
  // The dataset's root: every series below it, named by its path there.
  const auto all = infer(ckpt, {dir / "dcm"}, dir / "all", InferOptions{}, one_thread());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].input, series);
  EXPECT_EQ(all[0].output, dir / "all/case_000_CT_seg.nii.gz");
  EXPECT_EQ(all[1].output, dir / "all/case_001_CT_seg.nii.gz");
  EXPECT_TRUE(at::equal(read_nifti(all[0].output).data, got.data));

  const auto refused = [&](const std::vector<std::string>& inputs, const std::vector<std::string>& fragments) {
    SCOPED_TRACE(inputs.front());
    const std::string m =
        test::value_error_of([&] { infer(ckpt, inputs, dir / "refused", InferOptions{}, one_thread()); });
    EXPECT_TRUE(test::contains_all(m, fragments));
    EXPECT_FALSE(os::exists(dir / "refused")) << "written before the inputs were checked";
  };
  refused({series, dir / "dcm/case_001/CT"},
          {series, dir / "dcm/case_001/CT", "would both be written", "CT_seg.nii.gz"});
  refused({dir / "nii/CT.nii.gz", dir / "nii/CT.nii.gz"}, {"would both be written"});
  refused({dir / "dcm/case_000/seg.dcm"}, {"case_000/seg.dcm", "SEG"});
  os::make_directories(dir / "empty");
  test::write_file(dir / "empty/notes.txt", "no images here");
  refused({dir / "empty"}, {"empty", "holds no .nii or .nii.gz files", "and no DICOM images, in it or below it"});
  refused({dir / "empty/notes.txt"}, {"notes.txt", "not a .nii or .nii.gz file, nor a DICOM file"});
  refused({dir / "missing"}, {"missing", "no such file or folder"});
}

// A validation label with a class the model does not have is an error naming the label file.
TEST(Trainer, EvalNamesTheLabelFileOfAClassOutOfRange) {
  test::TempDir dir;
  const nlohmann::json c = trained_one_epoch(dir);
  const auto list = nlohmann::json::parse(test::read_file(dir / "data/dataset.json"));
  const std::string label = dir / ("data/" + list["training"].back()["label"].get<std::string>());
  Volume v = read_nifti(label);
  ASSERT_GT(v.data.eq(1).sum().item<std::int64_t>(), 0);
  v.data.masked_fill_(v.data.eq(1), 5);  // the organ as class 5 of a 2-class model
  write_nifti(label, v);
  const std::string m = test::error_of<Error>([&] { evaluate(dir / "run/last.ckpt", nullptr, "", one_thread(), {}); });
  EXPECT_NE(m.find("(label "), std::string::npos) << "message: " << m;
  EXPECT_NE(m.find(label.substr(label.rfind('/') + 1) + ")"), std::string::npos) << m;
  EXPECT_NE(m.find("labels must lie in [0, 2)"), std::string::npos) << m;
}

// DynUNet with deep supervision trains (the heads' losses weighted as nnU-Net's), validates
// on the full-size output, evaluates from its checkpoint and exports MONAI's network_def.
TEST(Trainer, DynUNetWithDeepSupervisionTrainsEvaluatesAndExports) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["model"] = nlohmann::json::parse(R"({"name": "DynUNet", "in_channels": 1, "out_channels": 2,
      "kernel_size": [3, 3, 3, 3], "strides": [1, 2, 2, 2], "upsample_kernel_size": [2, 2, 2],
      "filters": [4, 8, 16, 16], "deep_supervision": true, "deep_supr_num": 1, "res_block": true})");
  const TrainResult r = Trainer(c, "", one_thread()).run(false);
  ASSERT_EQ(r.history.size(), 2u);
  for (const auto& e : r.history) {
    EXPECT_TRUE(std::isfinite(e.loss));
    ASSERT_TRUE(e.dice.has_value());
    EXPECT_TRUE(std::isfinite(*e.dice));
  }
  EvalOptions eo;
  const EvalResult er = evaluate(dir / "run/last.ckpt", nullptr, "", one_thread(), eo);
  EXPECT_NEAR(er.mean_dice, *r.history.back().dice, 1e-9);
  const auto def = monai_network_def(c["model"], "model");
  EXPECT_EQ(def["_target_"], "monai.networks.nets.DynUNet");
  EXPECT_EQ(def["norm_name"], nlohmann::json::parse(R"(["INSTANCE", {"affine": true}])"));
  EXPECT_TRUE(def["dropout"].is_null());
  EXPECT_EQ(def["filters"], nlohmann::json::parse("[4, 8, 16, 16]"));
  EXPECT_EQ(def["deep_supr_num"], 1);
}

// `medfast export`: model.pt (MONAI's state_dict; the format and names are checked against
// MONAI's goldens in tests/nn/test_monai_parity.cpp, the bundle against MONAI 1.3.2 itself by
// bench/monai_export_check.py) and configs/; model.pretrained reads the weights back bit for
// bit and infers the same labels as the checkpoint.
TEST(TrainCli, ExportWritesABundleThatModelPretrainedReadsBackBitForBit) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 1;
  c["model"]["norm"] = "batch";  // running statistics: buffers travel too
  Trainer(c, "", one_thread()).run(false);
  const std::string bin = test::medfast_binary(), ckpt = dir / "run/last.ckpt", out = dir / "bundle";
  auto r = test::run(bin + " export --checkpoint " + ckpt + " --out " + out + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto res = nlohmann::json::parse(r.out);
  EXPECT_EQ(res["network"], "UNet");
  EXPECT_EQ(res["model"], out + "/model.pt");
  const nlohmann::json inference = nlohmann::json::parse(test::read_file(out + "/configs/inference.json"));
  const nlohmann::json metadata = nlohmann::json::parse(test::read_file(out + "/configs/metadata.json"));
  const nlohmann::json& def = inference["network_def"];
  EXPECT_EQ(def["_target_"], "monai.networks.nets.UNet");
  // Every argument, by MONAI's names: medfast reads them back to the same network.
  nlohmann::json back = def;
  back.erase("_target_");
  back["name"] = "UNet";
  EXPECT_EQ(nn::parse_network(back).arguments, nn::parse_network(c["model"]).arguments);
  EXPECT_EQ(def["channels"], c["model"]["channels"]);
  EXPECT_EQ(def["norm"], "batch");
  EXPECT_EQ(inference["network"], "$@network_def.to(@device)");
  EXPECT_EQ(inference["inferer"]["_target_"], "SlidingWindowInferer");
  EXPECT_EQ(inference["inferer"]["roi_size"], c["validation"]["sliding_window"]["roi_size"]);
  EXPECT_EQ(inference["medfast"]["epoch"], 1);
  EXPECT_EQ(metadata["network_data_format"]["outputs"]["pred"]["num_channels"], 2);
  // What MONAI's bundle runner needs to infer a folder as `medfast infer` does (run against
  // MONAI 1.3.2 by bench/monai_export_check.py --bundle): the deterministic chain on the
  // image alone, as MONAI's dictionary transforms; the softmax's argmax, mapped back
  // (Invertd) and saved; the classes by name.
  const nlohmann::json& pre = inference["preprocessing"]["transforms"];
  std::vector<std::string> image_steps;  // the chain's steps that touch the image
  for (const auto& t : c["data"]["deterministic"]) {
    const nlohmann::json keys = t["keys"].is_string() ? nlohmann::json::array({t["keys"]}) : t["keys"];
    const std::string name = t["name"];
    if (std::find(keys.begin(), keys.end(), "image") != keys.end() && name != "FgBgToIndices" && name != "ToDevice") {
      image_steps.push_back(name);
    }
  }
  ASSERT_EQ(pre.size(), image_steps.size()) << pre.dump();
  for (std::size_t i = 0; i < pre.size(); ++i) {
    const std::string name = image_steps[i];
    EXPECT_EQ(pre[i]["_target_"], name + "d");
    EXPECT_EQ(pre[i]["keys"], nlohmann::json::array({"image"}));
    for (const auto& [k, v] : pre[i].items()) {
      if (k != "_target_" && k != "keys" && k != "select_fn") EXPECT_TRUE(transforms::is_monai_argument(name, k)) << k;
    }
  }
  std::vector<std::string> post;
  for (const auto& t : inference["postprocessing"]["transforms"]) post.push_back(t["_target_"]);
  EXPECT_EQ(post, (std::vector<std::string>{"AsDiscreted", "Invertd", "SaveImaged"}));
  EXPECT_EQ(inference["postprocessing"]["transforms"][0]["argmax"], true);
  EXPECT_EQ(inference["label_names"], nlohmann::json::array({"spleen"}));
  EXPECT_EQ(metadata["network_data_format"]["outputs"]["pred"]["channel_def"],
            nlohmann::json({{"0", "background"}, {"1", "spleen"}}));
  for (const char* k : {"datalist", "dataset", "initialize", "run", "predict", "dataset_dir", "output_dir"}) {
    EXPECT_TRUE(inference.contains(k)) << k;
  }

  // model.pretrained: the checkpoint's tensors, bit for bit, buffers included.
  torch::NoGradGuard no_grad;
  nlohmann::json pretrained = c["model"];
  pretrained["pretrained"] = out + "/model.pt";
  torch::nn::AnyModule from_export = nn::make_network(pretrained);
  torch::nn::AnyModule from_ckpt = nn::make_network(c["model"]);
  load_checkpoint(ckpt, *from_ckpt.ptr(), nullptr);
  std::size_t compared = 0;
  const auto exported = nn::state_dict_of(*from_export.ptr());
  for (const auto& [name, t] : nn::state_dict_of(*from_ckpt.ptr())) {
    const auto it = std::find_if(exported.begin(), exported.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, exported.end()) << name;
    EXPECT_TRUE(torch::equal(t, it->second)) << name << " differs after export";
    ++compared;
  }
  EXPECT_EQ(compared, exported.size());
  EXPECT_EQ(compared, res["tensors"].get<std::size_t>());
  EXPECT_GT(compared, 30u);
  // torch.load(weights_only=True) in python3-torch reads every tensor.
  r = test::run(str(test::python(), " -c \"import torch,sys; sd=torch.load(sys.argv[1], weights_only=True); "
                    "print(len(sd), sd['model.0.conv.unit0.adn.N.running_var'].dtype)\" ", out, "/model.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, str(compared, " torch.float32\n"));

  // An earlier export is not replaced without --overwrite; a file that is not a checkpoint
  // is named.
  r = test::run(bin + " export --checkpoint " + ckpt + " --out " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(out + "/model.pt exists"), std::string::npos) << r.err;
  r = test::run(bin + " export --checkpoint " + ckpt + " --out " + out + " --overwrite");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  test::write_file(dir / "notes.ckpt", "not a checkpoint");
  r = test::run(bin + " export --checkpoint " + dir / "notes.ckpt" + " --out " + dir / "bundle2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("notes.ckpt"), std::string::npos) << r.err;
  EXPECT_FALSE(os::exists(dir / "bundle2/model.pt"));
}

// model.pretrained (a MONAI state_dict, written here by python3-torch with MONAI's names: see
// tests/golden/write_state_dict.py) starts training, and stands in for a checkpoint in eval
// and infer. With lr 0 and no running statistics the weights stay the file's, so infer and
// eval through --config (pretrained) and through the trained checkpoint must agree exactly.
TEST(TrainCli, PretrainedMonaiWeightsFineTuneEvalAndInfer) {
  test::TempDir dir;
  const std::string weights = dir / "monai_unet.pt";
  auto r = test::run(test::python() + " " + test::source_dir() +
                     "/tests/golden/write_state_dict.py --case unet_res0_instance --out " + weights);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json ref = nlohmann::json::parse(test::read_file(test::source_dir() + "/tests/reference/monai_networks.json"));
  nlohmann::json c = tiny_config(dir);
  c["model"] = ref["networks"]["unet_res0_instance"]["model"];  // UNet(4, 8, 16), instance norm, 3 classes
  c["model"]["pretrained"] = "monai_unet.pt";                    // relative to the config's folder
  c["optimizer"] = {{"name", "SGD"}, {"lr", 0.0}};
  c["train"]["run_dir"] = "run";
  c["data"]["dataset"] = "data/dataset.json";
  test::write_file(dir / "run.json", c.dump());
  const std::string bin = test::medfast_binary() + " --threads 1 ";
  r = test::run(bin + "train --config " + dir / "run.json" + " --set train.epochs=1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("14 tensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("monai_unet.pt"), std::string::npos) << r.err;
  // The checkpoint holds the file's weights (lr 0).
  nlohmann::json model = c["model"];
  model.erase("pretrained");
  const auto trained = checkpoint_tensors(dir / "run/last.ckpt", model);
  nlohmann::json with_file = c["model"];
  with_file["pretrained"] = weights;
  auto net = nn::make_network(with_file);
  for (const auto& p : net.ptr()->named_parameters()) {
    EXPECT_TRUE(torch::equal(trained.at(p.key()), p.value())) << p.key();
  }
  // eval: --config alone (pretrained weights) gives the checkpoint's Dice.
  r = test::run(bin + "eval --config " + dir / "run.json" + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto by_file = nlohmann::json::parse(r.out);
  r = test::run(bin + "eval --checkpoint " + dir / "run/last.ckpt" + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto by_ckpt = nlohmann::json::parse(r.out);
  EXPECT_EQ(by_file["cases"], by_ckpt["cases"]);
  // infer: --config gives the same labels as --checkpoint.
  const std::string input = dir / "data/imagesTr/spleen_5.nii.gz";
  r = test::run(bin + "infer --config " + dir / "run.json" + " --input " + input + " --output " + dir / "a");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run(bin + "infer --checkpoint " + dir / "run/last.ckpt" + " --input " + input + " --output " + dir / "b");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Volume a = read_nifti(dir / "a/spleen_5_seg.nii.gz"), b = read_nifti(dir / "b/spleen_5_seg.nii.gz");
  EXPECT_TRUE(torch::equal(a.data, b.data));
  EXPECT_EQ(a.affine.max_abs_diff(b.affine), 0.0);
  // A chain without spatial steps predicts on the input's grid itself (no resampling back);
  // --json reports each case's seconds and memory.
  nlohmann::json plain = c;
  plain["data"]["deterministic"] = nlohmann::json::parse(
      R"([{"name": "LoadImage", "keys": ["image"]}, {"name": "EnsureChannelFirst", "keys": ["image"]}])");
  test::write_file(dir / "plain.json", plain.dump());
  r = test::run(bin + "infer --config " + dir / "plain.json" + " --input " + input + " --output " + dir / "p --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto report = nlohmann::json::parse(r.out);
  ASSERT_EQ(report["cases"].size(), 1u);
  EXPECT_EQ(report["written"][0], dir / "p/spleen_5_seg.nii.gz");
  EXPECT_EQ(report["cases"][0]["output"], report["written"][0]);
  EXPECT_GT(report["cases"][0]["infer_seconds"].get<double>(), 0);
  EXPECT_GT(report["cases"][0]["peak_rss_bytes"].get<std::uint64_t>(), 0u);
  const Volume in_volume = read_nifti(input), p = read_nifti(dir / "p/spleen_5_seg.nii.gz");
  EXPECT_EQ(p.shape(), in_volume.shape());
  EXPECT_EQ(p.affine.max_abs_diff(in_volume.affine), 0.0);
  // Errors name the file and the key; nothing is trained.
  r = test::run(bin + "train --config " + dir / "run.json" + " --set train.run_dir=run2 --set model.channels=[4,8,32]");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("monai_unet.pt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("has shape"), std::string::npos) << r.err;
  r = test::run(bin + "train --config " + dir / "run.json" + " --set train.run_dir=run3 --set model.pretrained=nope.pt");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("model.pretrained: no such file"), std::string::npos) << r.err;
  r = test::run(bin + "infer --input " + input + " --output " + dir / "c");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("either --checkpoint"), std::string::npos) << r.err;
  c["model"].erase("pretrained");
  test::write_file(dir / "plain.json", c.dump());
  r = test::run(bin + "eval --config " + dir / "plain.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("model.pretrained is not set"), std::string::npos) << r.err;
}

// amp: bf16 autocast on the CPU trains (finite losses, a Dice) and amp: true means bf16 there.
TEST(Trainer, Bf16AutocastOnCpu) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 1;
  c["train"]["amp"] = true;
  int steps_seen = 0, last_step = 0, steps_total = 0;
  TrainCallbacks cb;
  cb.step = [&](int epoch, int step, int steps, double loss) {
    EXPECT_EQ(epoch, 1);
    EXPECT_EQ(step, last_step + 1);
    EXPECT_TRUE(std::isfinite(loss));
    last_step = step;
    steps_total = steps;
    ++steps_seen;
  };
  const TrainResult r = Trainer(c, "", one_thread()).run(false, cb);
  ASSERT_EQ(r.history.size(), 1u);
  EXPECT_EQ(steps_seen, r.history[0].steps);  // one progress call per step
  EXPECT_EQ(steps_total, r.history[0].steps);
  EXPECT_TRUE(std::isfinite(r.history[0].loss));
  EXPECT_EQ(r.history[0].skipped_steps, 0);  // bf16 needs no loss scaling
  ASSERT_TRUE(r.history[0].dice.has_value());
  EXPECT_TRUE(std::isfinite(*r.history[0].dice));
}

// A one-channel sigmoid model (DiceCE becomes Dice + BCE): validation scores its
// channel (logit > 0) and infer writes the mask on the input's grid.
TEST(Trainer, SigmoidModelsAreScoredAndInferredPerChannel) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 1;
  c["model"]["out_channels"] = 1;
  c["loss"] = {{"name", "DiceCE"}, {"sigmoid", true}};
  const TrainResult r = Trainer(c, "", one_thread()).run(false);
  ASSERT_EQ(r.history.size(), 1u);
  ASSERT_TRUE(r.history[0].dice.has_value());
  EXPECT_TRUE(std::isfinite(*r.history[0].dice));
  EXPECT_EQ(r.history[0].dice_per_class.size(), 1u);
  InferOptions o;
  const auto cases = infer(dir / "run/last.ckpt", {dir / "data/imagesTr/spleen_5.nii.gz"}, dir / "pred", o, one_thread());
  ASSERT_EQ(cases.size(), 1u);
  EXPECT_EQ(cases[0].input, dir / "data/imagesTr/spleen_5.nii.gz");
  EXPECT_EQ(cases[0].output, dir / "pred/spleen_5_seg.nii.gz");
  EXPECT_GT(cases[0].infer_seconds, 0);  // each case says where its time and memory went
  EXPECT_GT(cases[0].read_seconds, 0);
  EXPECT_GT(cases[0].write_seconds, 0);
  EXPECT_GT(cases[0].peak_rss_bytes, 0u);
  EXPECT_EQ(cases[0].to_json()["output"], cases[0].output);
  const Volume in = read_nifti(dir / "data/imagesTr/spleen_5.nii.gz");
  const Volume out = read_nifti(cases[0].output);
  EXPECT_EQ(out.shape(), in.shape());
  EXPECT_LE(out.data.max().item<int>(), 1);
}

// Validation, eval and infer run the UNet with its batch norm folded into the convolutions
// (the fold_batch_norm setting, on by default): the scores and labels are those of the trained
// network as it is (fold_batch_norm off), up to float rounding.
TEST(Trainer, FoldedBatchNormScoresAndSegmentsAsTheTrainedNetwork) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["model"]["norm"] = "batch";  // the spleen recipe's UNet (the built-in default has instance norm)
  c["train"]["epochs"] = 1;
  Trainer(c, "", one_thread()).run(false);
  Settings off = one_thread();
  off.set("fold_batch_norm", "off", SettingSource::flag, "test");
  EvalOptions eo;
  const EvalResult folded = evaluate(dir / "run/last.ckpt", nullptr, "", one_thread(), eo);
  const EvalResult plain = evaluate(dir / "run/last.ckpt", nullptr, "", off, eo);
  ASSERT_EQ(folded.cases.size(), plain.cases.size());
  ASSERT_FALSE(folded.cases.empty());
  for (std::size_t i = 0; i < folded.cases.size(); ++i) {
    ASSERT_EQ(folded.cases[i].dice.size(), plain.cases[i].dice.size());
    for (std::size_t k = 0; k < folded.cases[i].dice.size(); ++k) {
      EXPECT_NEAR(folded.cases[i].dice[k], plain.cases[i].dice[k], 1e-3) << "case " << i << " class " << k;
    }
  }
  InferOptions io;
  const std::string image = dir / "data/imagesTr/spleen_5.nii.gz";
  const auto a = infer(dir / "run/last.ckpt", {image}, dir / "folded", io, one_thread());
  const auto b = infer(dir / "run/last.ckpt", {image}, dir / "plain", io, off);
  const at::Tensor la = read_nifti(a.at(0).output).data, lb = read_nifti(b.at(0).output).data;
  ASSERT_EQ(la.sizes(), lb.sizes());
  EXPECT_LE(la.ne(lb).sum().item<std::int64_t>(), la.numel() / 1000) << "more than rounding ties differ";
}

// A run killed while writing leaves .last.ckpt.medfast-tmp-<pid>-<n> and the like: the next
// start removes those of dead writers in its marked folder (and only those). Files of the
// user's named like an earlier medfast's temporaries ("notes.tmp-2023-05") are never touched.
TEST(Trainer, StartRemovesTemporariesOfDeadWritersOnlyInItsOwnFolder) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 1;
  os::make_directories(dir / "run");
  os::write_folder_mark(dir / "run", os::new_folder_mark(os::kRunFolder));  // a run folder medfast made
  const std::string dead_pid = test::run("sh -c 'echo $$'").out;  // that shell has exited
  const int dead = std::stoi(dead_pid);
  ASSERT_NE(dead, ::getpid());
  const std::string dead_ckpt = dir / ("run/.last.ckpt.medfast-tmp-" + std::to_string(dead) + "-0");
  const std::string dead_config = dir / ("run/.config.json.medfast-tmp-" + std::to_string(dead) + "-7");
  const std::string live = dir / ("run/.notes.medfast-tmp-" + std::to_string(::getppid()) + "-1");  // a live process's
  std::map<std::string, std::string> users{{dir / "run/notes.tmp-2023-05", "my notes"},
                                           {dir / "run/report.tmp-2024-06", "my report"},
                                           {dir / "run/my.tmp-notes", "mine"}};
  for (const auto& p : {dead_ckpt, dead_config, live}) test::write_file(p, "partial");
  for (const auto& [p, text] : users) test::write_file(p, text);
  std::vector<std::string> messages;
  TrainCallbacks cb;
  cb.message = [&](const std::string& m) { messages.push_back(m); };
  Trainer(c, "", one_thread()).run(false, cb);
  EXPECT_FALSE(os::exists(dead_ckpt));
  EXPECT_FALSE(os::exists(dead_config));
  EXPECT_TRUE(os::exists(live)) << "a live writer's temporary was removed";
  for (const auto& [p, text] : users) EXPECT_EQ(test::read_file(p), text) << p;
  EXPECT_TRUE(std::any_of(messages.begin(), messages.end(), [](const std::string& m) {
    return m.find("removed 2 temporary files") != std::string::npos;
  }));
}

// A folder medfast did not make is refused for a run, naming what it holds: nothing in it is
// written, replaced or removed (not even the lock or the mark), with or without --overwrite.
TEST(Trainer, ARunFolderMedfastDidNotMakeIsRefusedAndLeftAsItWas) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["epochs"] = 1;
  os::make_directories(dir / "run/sub");
  const std::map<std::string, std::string> users{{"config.json", "{\"mine\": 1}"},
                                                 {"metrics.jsonl", "my metrics\n"},
                                                 {"notes.tmp-2023-05", "notes"},
                                                 {"sub/photo.mfc", "a photo"}};
  for (const auto& [f, text] : users) test::write_file(dir / ("run/" + f), text);
  for (const bool overwrite : {false, true}) {
    const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(false, {}, overwrite); });
    EXPECT_TRUE(test::contains_all(m, {"train.run_dir", dir / "run", "is not a medfast run folder",
                                       "config.json, metrics.jsonl, notes.tmp-2023-05 and sub/", "choose an empty or new run_dir"}))
        << m;
  }
  for (const auto& [f, text] : users) EXPECT_EQ(test::read_file(dir / ("run/" + f)), text) << f;
  EXPECT_EQ(os::list_directory(dir / "run"), (std::vector<std::string>{"config.json", "metrics.jsonl", "notes.tmp-2023-05", "sub"}));
  // --resume too: there is no run of medfast's to resume.
  EXPECT_THROW(Trainer(c, "", one_thread()).run(true), ValueError);
  EXPECT_EQ(os::list_directory(dir / "run").size(), 4u);
}

// A run whose last.ckpt is gone still holds a run (best.ckpt, metrics): a fresh run is refused
// without --overwrite. --overwrite removes exactly the files medfast wrote (the mark lists
// them): the user's notes, another tool's TensorBoard file, a folder of the user's and files
// the user put in the set-aside folder stay, byte for byte.
TEST(Trainer, OverwriteRemovesExactlyWhatMedfastWrote) {
  test::TempDir dir;
  nlohmann::json c = trained_one_epoch(dir);
  const os::FolderMark mark = *os::read_folder_mark(dir / "run");
  EXPECT_EQ(mark.kind, os::kRunFolder);
  for (const char* f : {"config.json", "machine.json", "best.ckpt", "last.ckpt", "metrics.jsonl"}) {
    EXPECT_TRUE(mark.lists(f)) << f << " is not in the mark";
  }
  os::remove_file(dir / "run/last.ckpt");
  const std::string before_best = test::read_file(dir / "run/best.ckpt");
  const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_TRUE(test::contains_all(m, {"already holds a run", "best.ckpt", "--overwrite"})) << m;
  EXPECT_EQ(test::read_file(dir / "run/best.ckpt"), before_best);

  os::make_directories(dir / "run/mine");
  os::make_directories(dir / ("run/" + std::string(kOverwrittenName) + "/sub"));
  const std::map<std::string, std::string> users{
      {"notes.txt", "notes"},
      {"events.out.tfevents.1700000000.host.other", "another tool's curves"},
      {"mine/a.txt", "a"},
      {std::string(kOverwrittenName) + "/kept.txt", "put there by the user"},
      {std::string(kOverwrittenName) + "/sub/deep.txt", "deeper"}};
  for (const auto& [f, text] : users) test::write_file(dir / ("run/" + f), text);
  const TrainResult r = Trainer(c, "", one_thread()).run(false, {}, /*overwrite=*/true);
  EXPECT_EQ(r.history.size(), 1u);
  for (const auto& [f, text] : users) EXPECT_EQ(test::read_file(dir / ("run/" + f)), text) << f;
  std::size_t ours = 0;  // TensorBoard files: the new run's alone, and the other tool's
  for (const std::string& f : os::list_directory(dir / "run")) ours += profile::is_event_file(f) && f.find(".medfast") != std::string::npos;
  EXPECT_EQ(ours, 1u);
  EXPECT_EQ(os::list_directory(dir / ("run/" + std::string(kOverwrittenName))), (std::vector<std::string>{"kept.txt", "sub"}));
}

// --resume of a run with no epochs left to train is an error that changes nothing (it rewrote
// config.json and did nothing); a run that reached its target Dice likewise.
TEST(Trainer, ResumeWithNothingLeftToTrainChangesNothing) {
  test::TempDir dir;
  nlohmann::json c = trained_one_epoch(dir);
  std::map<std::string, std::string> before;
  for (const std::string& f : os::list_directory(dir / "run")) {
    if (os::stat(dir / ("run/" + f)).is_regular) before[f] = test::read_file(dir / ("run/" + f));
  }
  const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(true); });
  EXPECT_TRUE(test::contains_all(m, {"--resume", "holds 1 epochs and train.epochs is 1", "nothing was changed",
                                     "--set train.epochs="})) << m;
  std::map<std::string, std::string> after;
  for (const std::string& f : os::list_directory(dir / "run")) {
    if (os::stat(dir / ("run/" + f)).is_regular) after[f] = test::read_file(dir / ("run/" + f));
  }
  EXPECT_EQ(after, before);
}

// A run folder of an earlier medfast (a medfast last.ckpt, no mark): a fresh run is refused
// (its files cannot be told from the user's); --resume continues it and marks it.
TEST(Trainer, AnEarlierMedfastsRunFolderIsMarkedWhenResumed) {
  test::TempDir dir;
  nlohmann::json c = trained_one_epoch(dir);
  os::remove_file(dir / ("run/" + std::string(os::kFolderMarkName)));
  test::write_file(dir / "run/notes.txt", "mine");
  c["train"]["epochs"] = 2;
  const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(false, {}, true); });
  EXPECT_TRUE(test::contains_all(m, {"holds a run of an earlier medfast", "epoch 1", "--resume"})) << m;
  const TrainResult r = Trainer(c, "", one_thread()).run(true);
  EXPECT_EQ(r.history.size(), 2u);
  const std::optional<os::FolderMark> mark = os::read_folder_mark(dir / "run");
  ASSERT_TRUE(mark);
  EXPECT_TRUE(mark->lists("last.ckpt") && mark->lists("config.json"));
  EXPECT_FALSE(mark->lists("notes.txt"));
  EXPECT_EQ(test::read_file(dir / "run/notes.txt"), "mine");
}

// infer: an --output that is also the --input folder never takes infer's own outputs for
// inputs; outputs that exist are refused unless --overwrite (nothing written); a folder that
// cannot be written is said before any inference.
TEST(Trainer, InferNeverReadsOrSilentlyReplacesItsOwnOutputs) {
  test::TempDir dir;
  trained_one_epoch(dir);
  os::make_directories(dir / "in");
  const auto images = os::list_directory(dir / "data/imagesTr");
  ASSERT_GE(images.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    test::write_file(dir / ("in/" + images[i]), test::read_file(dir / ("data/imagesTr/" + images[i])));
  }
  test::write_file(dir / "in/notes.txt", "mine");
  InferOptions io;
  io.device = "cpu";
  const auto first = infer(dir / "run/last.ckpt", {dir / "in"}, dir / "in", io, one_thread());
  ASSERT_EQ(first.size(), 2u);
  EXPECT_FALSE(os::read_folder_mark(dir / "in")) << "a folder of the user's is not marked";
  const std::string out0 = test::read_file(first[0].output);
  // Again: the outputs exist. Refused, nothing written, and the outputs were not taken for inputs.
  std::vector<std::string> said;
  const std::string m = test::value_error_of(
      [&] { infer(dir / "run/last.ckpt", {dir / "in"}, dir / "in", io, one_thread(), [&](const std::string& s) { said.push_back(s); }); });
  EXPECT_TRUE(test::contains_all(m, {"2 outputs exist already", "--overwrite", "nothing was written"})) << m;
  EXPECT_TRUE(std::any_of(said.begin(), said.end(), [](const std::string& s) {
    return s.find("skipped 2 files that infer wrote itself") != std::string::npos;
  }));
  io.overwrite = true;
  const auto again = infer(dir / "run/last.ckpt", {dir / "in"}, dir / "in", io, one_thread());
  EXPECT_EQ(again.size(), 2u) << "its outputs were segmented again";
  EXPECT_EQ(test::read_file(again[0].output), out0);
  EXPECT_EQ(test::read_file(dir / "in/notes.txt"), "mine");
  EXPECT_EQ(os::list_directory(dir / "in").size(), 5u);  // 2 images, 2 outputs, the notes
  // A fresh folder is made and marked, and lists its outputs.
  const auto fresh = infer(dir / "run/last.ckpt", {dir / ("in/" + images[0])}, dir / "fresh", io, one_thread());
  const std::optional<os::FolderMark> mark = os::read_folder_mark(dir / "fresh");
  ASSERT_TRUE(mark);
  EXPECT_EQ(mark->kind, os::kInferFolder);
  EXPECT_TRUE(mark->lists(std::filesystem::path(fresh[0].output).filename().string()));
  {
    // A read-only file system (root writes anywhere else): the OS layer's hook fails the
    // first file created there, as a read-only mount would.
    os::testing::ScopedHook ro([&](os::Op op, const std::string& path, std::uint64_t, std::size_t) {
      return os::testing::HookResult{op == os::Op::open && path.rfind(dir / "ro/", 0) == 0 ? EROFS : 0};
    });
    os::make_directories(dir / "ro");
    const auto t0 = std::chrono::steady_clock::now();
    const std::string w = test::error_of<OsError>([&] { infer(dir / "run/last.ckpt", {dir / "in"}, dir / "ro", io, one_thread()); });
    EXPECT_TRUE(test::contains_all(w, {"cannot write there", "nothing was inferred"})) << w;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
  // A run folder is not an output folder.
  const std::string r = test::value_error_of([&] { infer(dir / "run/last.ckpt", {dir / "in"}, dir / "run", io, one_thread()); });
  EXPECT_TRUE(test::contains_all(r, {"is a medfast run folder", "not an infer output folder"})) << r;
}

// On a GPU: fp16 with loss scaling, batches copied on the loader's side stream, and
// the same run resumed bit-identically.
// train.profile.memory: its own switch ({memory: true} alone: no trace), a clear error on
// the CPU before any step.
TEST(TrainerProfile, MemorySnapshotIsItsOwnSwitchAndNeedsCuda) {
  const auto alone = ProfileOptions::from_json(nlohmann::json::parse(R"({"memory": true})"), "train.profile");
  EXPECT_TRUE(alone.memory);
  EXPECT_FALSE(alone.enabled) << "memory alone records no trace";
  const auto both = ProfileOptions::from_json(nlohmann::json::parse(R"({"memory": true, "active": 2})"), "p");
  EXPECT_TRUE(both.memory && both.enabled);
  const auto trace = ProfileOptions::from_json(true, "p");
  EXPECT_TRUE(trace.enabled && !trace.memory);
  EXPECT_FALSE(ProfileOptions::from_json(nlohmann::json::parse(R"({"memory": false})"), "p").memory);
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["profile"] = {{"memory", true}};
  const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_NE(m.find("train.profile.memory"), std::string::npos) << m;
  EXPECT_NE(m.find("the run's device is cpu"), std::string::npos) << m;
  EXPECT_FALSE(os::exists(dir / "run/last.ckpt")) << "refused before training";
}

// On CUDA (libtorch >= 2.4): the allocator's history of the first cycle, pickled for
// PyTorch's memory_viz; memory alone writes no trace.
TEST(TrainerGpu, MemorySnapshotOfTheFirstCycleForMemoryViz) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["device"] = "cuda";
  c["train"]["profile"] = {{"memory", true}};
  if (TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 4)) {
    const std::string m = test::value_error_of([&] { Trainer(c, "", one_thread()).run(false); });
    EXPECT_NE(m.find("libtorch >= 2.4"), std::string::npos) << m;
    return;
  }
  Trainer(c, "", one_thread()).run(false);
  const std::string pickle = test::read_file(dir / "run/profiler/memory.pickle");
  ASSERT_GT(pickle.size(), 100u);
  EXPECT_EQ(static_cast<unsigned char>(pickle[0]), 0x80u) << "a pickle";
  for (const char* key : {"segments", "device_traces"}) EXPECT_NE(pickle.find(key), std::string::npos) << key;
  for (const std::string& f : os::list_directory(dir / "run/profiler")) {
    EXPECT_EQ(f.find("-trace.json.gz"), std::string::npos) << "memory alone writes no trace: " << f;
  }
}

TEST(TrainerGpu, Fp16RunAndResumeOnCuda) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  nlohmann::json c = tiny_fp16_cuda_config(dir);
  nlohmann::json a = c;
  a["train"]["run_dir"] = dir / "a";
  const TrainResult ra = Trainer(a, "", one_thread()).run(false);
  ASSERT_EQ(ra.history.size(), 2u);
  for (const auto& e : ra.history) EXPECT_TRUE(std::isfinite(e.loss));
  // The caching allocator's peaks, and where the driver's NVML is there, the GPU's readings.
  const auto first = first_metrics_line(dir / "a/metrics.jsonl");
  EXPECT_GT(first.value("cuda_peak_allocated_bytes", std::uint64_t{0}), 0u) << first.dump();
  EXPECT_GE(first.value("cuda_peak_reserved_bytes", std::uint64_t{0}), first.value("cuda_peak_allocated_bytes", std::uint64_t{0}));
  if (first.contains("gpu")) {
    EXPECT_GT(first["gpu"]["memory_used_max_bytes"].get<std::uint64_t>(), 0u) << first.dump();
  }
  nlohmann::json b = c;
  b["train"]["run_dir"] = dir / "b";
  TrainCallbacks stop;
  stop.epoch = [](const EpochRecord& r) {
    if (r.epoch == 1) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(Trainer(b, "", one_thread()).run(false, stop), std::runtime_error);
  const TrainResult rb = Trainer(b, "", one_thread()).run(true);
  ASSERT_EQ(rb.history.size(), 2u);
  // Not bit-identical on a GPU: some CUDA kernels (atomics in scatter/index ops, cuBLAS
  // split reductions) add in a different order each run, deterministic mode or not. A
  // resume that lost state (weights, Adam's moments, the loss scale) is off by far more.
  EXPECT_NEAR(ra.history[1].loss, rb.history[1].loss, 5e-3 * std::abs(ra.history[1].loss));
}

// fp16 on CUDA: a real overflow (the loss scaled past float16's range) is skipped by the
// scaler, which backs its scale off; train.max_nonfinite_steps skips in a row stop the run.
TEST(TrainerGpu, Fp16OverflowIsSkippedThenStopsAfterTheLimit) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  nlohmann::json c = tiny_fp16_cuda_config(dir);
  c["train"]["max_nonfinite_steps"] = 4;
  c["train"]["epochs"] = 3;  // 3 steps an epoch
  TrainCallbacks cb;
  cb.loss_filter = [](int epoch, int step, const at::Tensor& loss) {
    // Epoch 1, steps 1-2: two overflows (recovered); from epoch 2 on: overflows for good.
    return (epoch == 1 && step <= 2) || epoch >= 2 ? loss * 1e38 : loss;
  };
  const std::string m = test::error_of<NonFiniteLoss>([&] { Trainer(c, "", one_thread()).run(false, cb); });
  EXPECT_NE(m.find("training stopped at epoch 3, step 1 of 3"), std::string::npos) << m;
  EXPECT_NE(m.find("fp16 loss scaler skipped"), std::string::npos) << m;
  const auto first = first_metrics_line(dir / "run/metrics.jsonl");
  EXPECT_EQ(first["skipped_steps"], 2) << first.dump();
  EXPECT_TRUE(first["loss"].is_number()) << first.dump();
}

// A training step waits for its own stream only, never for the whole device: work on
// another stream (as the loader's side-stream copies of future batches) goes on while
// steps run (review finding 4: a device-wide synchronize per stage waited for it). Work
// of about 2 s is queued on a pool stream after step 1 of epoch 2; steps 2 and 3
// (milliseconds on this tiny network) end before it. Epoch 1 is the warm-up: there the
// caching allocators still grow (cudaMalloc, page-locked host memory) and cuDNN picks its
// algorithms, each of which may wait for the whole device. The stage times still come out
// (from CUDA events).
TEST(TrainerGpu, StepsWaitForTheirOwnStreamOnly) {
  MEDFAST_REQUIRE_CUDA();
#if MEDFAST_TORCH_CUDA
  test::TempDir dir;
  nlohmann::json c = tiny_fp16_cuda_config(dir);
  c["train"]["epochs"] = 2;
  std::optional<at::cuda::CUDAStream> other;
  at::cuda::CUDAEvent other_done;
  std::optional<bool> still_running;
  TrainCallbacks cb;
  cb.step = [&](int epoch, int step, int, double) {
    if (epoch != 2) return;
    if (step == 1) {
      other = at::cuda::getStreamFromPool();
      at::cuda::CUDAStreamGuard on(*other);
      at::cuda::sleep(std::int64_t{4'000'000'000});  // cycles: 2 s and more at an H100's 2 GHz
      other_done.record(*other);
    } else if (step == 3) {
      still_running = !other_done.query();
      other_done.synchronize();
    }
  };
  const TrainResult r = Trainer(c, "", one_thread()).run(false, cb);
  ASSERT_TRUE(still_running.has_value()) << "fewer than 3 steps";
  EXPECT_TRUE(*still_running) << "a training step waited for work on another stream";
  const StageTimes& t = r.history.at(1).times;
  EXPECT_GT(t.forward, 0);
  EXPECT_GT(t.backward, 0);
  EXPECT_GT(t.optimizer, 0);
  EXPECT_LT(t.copy + t.forward + t.backward + t.optimizer, r.history[1].seconds);
#else
  GTEST_SKIP() << "this test binary was built without libtorch's CUDA headers (MEDFAST_TORCH_CUDA)";
#endif
}

// On a GPU, each cache kind that keeps samples in GPU memory (device) or reads them
// straight into it (disk_device: cuFile or the pinned bounce) feeds the loader (random
// transforms on its side stream) and the training steps, with the losses of the same
// run fed from host memory.
TEST(TrainerGpu, DeviceCachesFeedTheLoaderAndTrainingSteps) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["device"] = "cuda";
  c["train"]["epochs"] = 1;
  std::vector<double> reference;
  for (const std::string kind : {"memory", "device", "disk_device"}) {
    SCOPED_TRACE(kind);
    nlohmann::json k = c;
    k["data"]["cache"] = {{"kind", kind}, {"dir", dir / ("cache-" + kind)}};
    k["train"]["run_dir"] = dir / ("run-" + kind);
    const TrainResult r = Trainer(k, "", one_thread()).run(false);
    ASSERT_EQ(r.history.size(), 1u);
    ASSERT_TRUE(std::isfinite(r.history[0].loss));
    if (kind == "memory") {
      reference.push_back(r.history[0].loss);
    } else {
      EXPECT_NEAR(r.history[0].loss, reference[0], 1e-5 * std::abs(reference[0]));
    }
  }
}

// Checkpoints written by libtorch 1.13 (Debian 12) load under libtorch 2.x: files in
// tests/data/checkpoints, written by this test on 1.13 with MEDFAST_WRITE_COMPAT_CHECKPOINTS=1.
// Each holds a tiny UNet and an optimizer's state after one step, with the network's
// output then and the parameters after one more step, as 1.13 computed them; loading
// must reproduce both (so the optimizer state is matched to the right parameters).
const nlohmann::json& compat_model() {
  static const nlohmann::json m = {{"name", "UNet"},      {"spatial_dims", 3}, {"in_channels", 1},
                                   {"out_channels", 2},   {"channels", {4, 8}}, {"strides", {2}},
                                   {"num_res_units", 1}};
  return m;
}

struct CompatRun {
  torch::nn::AnyModule net;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

CompatRun compat_run(const nlohmann::json& optimizer) {
  CompatRun r{nn::make_network(compat_model()), nullptr};
  r.opt = make_optimizer(r.net.ptr()->parameters(), OptimizerOptions::from_json(optimizer));
  return r;
}

at::Tensor compat_output(CompatRun& r) {
  const at::Tensor x = at::linspace(-1, 1, 8 * 8 * 8).view({1, 1, 8, 8, 8});
  return r.net.forward(x);
}

void compat_step(CompatRun& r) {
  r.opt->zero_grad();
  compat_output(r).pow(2).mean().backward();
  r.opt->step();
}

/// 33 numbers that stand for a tensor: its sum and 32 evenly spaced elements.
std::vector<double> fingerprint(const at::Tensor& t) {
  const at::Tensor flat = t.detach().reshape({-1}).to(at::kDouble);
  std::vector<double> v{flat.sum().item<double>()};
  for (int i = 0; i < 32; ++i) v.push_back(flat[flat.numel() * i / 32].item<double>());
  return v;
}

at::Tensor all_parameters(CompatRun& r) {
  std::vector<at::Tensor> flat;
  for (const auto& p : r.net.ptr()->parameters()) flat.push_back(p.detach().reshape({-1}));
  return at::cat(flat);
}

/// Per parameter, in order: the sums of its optimizer state tensors and its step
/// count, read from the optimizer's state map under the parameter's own key (so a
/// state attached to the wrong parameter shows).
std::vector<double> state_fingerprint(CompatRun& r) {
  std::vector<double> v;
  auto& state = r.opt->state();
  for (const auto& p : r.net.ptr()->parameters()) {
    const auto key = optimizer_state_key(p);
    const auto it = state.find(key);
    if (it == state.end()) {
      v.insert(v.end(), {-1.0, -1.0, -1.0});
      continue;
    }
    if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      v.insert(v.end(), {sgd->momentum_buffer().sum().item<double>(), 0.0, 0.0});
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      v.insert(v.end(), {adamw->exp_avg().sum().item<double>(), adamw->exp_avg_sq().sum().item<double>(),
                         static_cast<double>(adamw->step())});
    } else if (auto* nv = dynamic_cast<NovogradParamState*>(it->second.get())) {
      v.insert(v.end(), {nv->exp_avg().sum().item<double>(), nv->exp_avg_sq().sum().item<double>(),
                         static_cast<double>(nv->step())});
    } else {
      ADD_FAILURE() << "unexpected optimizer state type";
    }
  }
  return v;
}

void expect_fingerprint(const std::vector<double>& got, const nlohmann::json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    EXPECT_NEAR(got[i], w, 1e-5 * std::max(1.0, std::abs(w))) << what << " [" << i << "]";
  }
}

TEST(CheckpointCompat, CheckpointsWrittenByLibtorch113LoadAndContinue) {
  const std::map<std::string, nlohmann::json> optimizers{
      {"sgd", {{"name", "SGD"}, {"lr", 0.1}, {"momentum", 0.9}}},
      {"adamw", {{"name", "AdamW"}, {"lr", 0.01}}},
      {"novograd", {{"name", "Novograd"}, {"lr", 0.01}}}};
  for (const auto& [name, optimizer] : optimizers) {
    SCOPED_TRACE(name);
    const std::string path = test::source_dir() + "/tests/data/checkpoints/unet_tiny_" + name + "_libtorch1.13.ckpt";
#if TORCH_VERSION_MAJOR < 2
    if (std::getenv("MEDFAST_WRITE_COMPAT_CHECKPOINTS")) {
      torch::manual_seed(5);
      CompatRun r = compat_run(optimizer);
      compat_step(r);
      nlohmann::json meta{{"model", compat_model()},
                          {"optimizer", optimizer},
                          {"written_by", str("libtorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR)},
                          {"output", fingerprint(compat_output(r))},
                          {"state", state_fingerprint(r)}};
      save_checkpoint(path, *r.net.ptr(), r.opt.get(), meta);
      compat_step(r);
      meta["parameters_after_next_step"] = fingerprint(all_parameters(r));
      load_checkpoint(path, *r.net.ptr(), r.opt.get());  // back to the state after one step
      save_checkpoint(path, *r.net.ptr(), r.opt.get(), meta);
    }
#endif
    ASSERT_TRUE(os::exists(path)) << path;
    const nlohmann::json meta = read_checkpoint_meta(path);
    EXPECT_EQ(meta["written_by"], "libtorch 1.13");
    CompatRun r = compat_run(meta["optimizer"]);
    load_checkpoint(path, *r.net.ptr(), r.opt.get());
    expect_fingerprint(fingerprint(compat_output(r)), meta["output"], "output");
    expect_fingerprint(state_fingerprint(r), meta["state"], "optimizer state of each parameter");
    compat_step(r);
    // SGD's step is linear in the gradient, so it continues to within rounding across
    // libtorch versions; Adam-like steps divide by sqrt(v) and amplify the versions' last-bit
    // differences in near-zero gradients, so for them the state check above is the test.
    if (name == "sgd") {
      expect_fingerprint(fingerprint(all_parameters(r)), meta["parameters_after_next_step"], "next step");
    }
  }
}

// examples/*.yaml run on `data synth` output at a smaller size with exactly the two
// commands their header comments give (parsed from the comment, so the comment stays true);
// the dataset, cache and run folder go to a temporary folder.
struct ExampleCommands {
  std::vector<std::string> synth;  ///< `data synth` arguments
  std::vector<std::string> sets;   ///< `train --set` values
};

ExampleCommands example_commands(const std::string& yaml) {
  ExampleCommands c;
  std::istringstream in(test::read_file(yaml));
  std::string line, text;
  while (std::getline(in, line)) {
    if (line.rfind("#   ./build/medfast", 0) == 0 || line.rfind("#     --set", 0) == 0) text += line.substr(1) + " \n";
  }
  std::istringstream words(text);
  std::string w, command;
  std::vector<std::string> tokens;
  while (words >> w) tokens.push_back(w);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == "./build/medfast") command = tokens[i + 1] == "data" ? "synth" : "train";
    else if (command == "train" && tokens[i] == "--set") c.sets.push_back(tokens[++i]);
    else if (command == "synth" && tokens[i].rfind("--", 0) == 0 && tokens[i] != "--out") {
      c.synth.push_back(tokens[i]);
      c.synth.push_back(tokens[++i]);
    }
  }
  return c;
}

TEST(Examples, RunOnSyntheticDataAsTheirCommentsSay) {
  for (const std::string name : {"spleen", "brats", "nsclc"}) {
    if (name == "nsclc" && !build::kGdcm) continue;  // its data is written as DICOM (GDCM; off in this build)
    SCOPED_TRACE(name);
    const std::string yaml = test::source_dir() + "/examples/" + name + ".yaml";
    const ExampleCommands cmd = example_commands(yaml);
    ASSERT_GE(cmd.synth.size(), 6u) << "no data synth command in the comment of " << yaml;
    ASSERT_GE(cmd.sets.size(), 5u) << "no train command in the comment of " << yaml;
    test::TempDir dir;
    std::string synth = test::medfast_binary() + " data synth --out " + dir / "data";
    for (const auto& a : cmd.synth) synth += " " + a;
    const auto r = test::run(synth);
    ASSERT_EQ(r.exit_code, 0) << synth << ": " << r.err;
    nlohmann::json c = data::load_yaml_as_json(yaml);
    for (const auto& s : cmd.sets) apply_override(c, s);
    c["data"]["dataset"] = dir / "data/dataset.json";
    c["data"]["cache"] = {{"kind", "memory"}};
    c["train"]["run_dir"] = dir / "run";
    c["train"]["threads"] = 2;
    const TrainResult res = Trainer(c, yaml, one_thread()).run(false);
    ASSERT_EQ(res.history.size(), static_cast<std::size_t>(c["train"]["epochs"].get<int>()));
    for (const auto& e : res.history) EXPECT_TRUE(std::isfinite(e.loss)) << e.loss;
    ASSERT_TRUE(res.history.back().dice.has_value());
    EXPECT_GE(*res.history.back().dice, 0.0);
    EXPECT_LE(*res.history.back().dice, 1.0);
    if (name == "brats") {  // the guide's regions, by their names, each scored
      EXPECT_EQ(res.class_names, (std::vector<std::string>{"TC", "WT", "ET"}));
      EXPECT_EQ(res.history.back().dice_per_class.size(), 3u);
      EXPECT_EQ(res.history.back().class_names, res.class_names);
    }
  }
}

// The README's main job: `medfast train` with no config reaches its validation Dice
// (the built-in default's target, 0.85; the issue asks for at least 0.8).
TEST(TrainCli, DefaultRunReachesItsDice) {
  test::TempDir dir;
  const auto r = test::run("cd " + dir.path() + " && " + test::medfast_binary() + " --threads 2 train --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto res = nlohmann::json::parse(r.out);
  EXPECT_TRUE(res["reached_target"].get<bool>()) << r.out;
  EXPECT_GE(res["best_dice"].get<double>(), 0.8) << r.out;
  EXPECT_TRUE(os::exists(dir / "data/synth-small/dataset.json"));
  EXPECT_TRUE(os::exists(dir / "runs/default/best.ckpt"));
  // The device auto chose, and why, in the run's records: the CPU's recipe here without a GPU.
  const auto machine = nlohmann::json::parse(test::read_file(dir / "runs/default/machine.json"));
  const auto config = nlohmann::json::parse(test::read_file(dir / "runs/default/config.json"));
  EXPECT_EQ(config["train"]["device"], "auto");
  EXPECT_EQ(machine["device_choice"], choose_device("auto", "train.device").text);
  EXPECT_EQ(machine["runtime"]["libtorch"], runtime_info(c10::Device("cpu"))["libtorch"]);
  if (!at::hasCUDA()) {
    EXPECT_EQ(machine["device"], "cpu");
    EXPECT_EQ(config["train"]["amp"], false);
    EXPECT_EQ(config["data"]["cache"]["kind"], "memory");
  } else {
    EXPECT_EQ(machine["device"].get<std::string>().rfind("cuda:", 0), 0u);
    EXPECT_EQ(config["data"]["cache"]["kind"], "device");
  }
  // eval of best.ckpt reproduces the best validation Dice (before the resume below, whose
  // extra epoch may validate better and so replace best.ckpt).
  const auto ev = test::run("cd " + dir.path() + " && " + test::medfast_binary() +
                            " --threads 2 eval --checkpoint runs/default/best.ckpt --json");
  ASSERT_EQ(ev.exit_code, 0) << ev.err;
  EXPECT_NEAR(nlohmann::json::parse(ev.out)["mean_dice"].get<double>(), res["best_dice"].get<double>(), 1e-9);
  // Resumed past its target: nothing to train, said, and nothing changed.
  const std::string last = test::read_file(dir / "runs/default/last.ckpt");
  const auto done = test::run("cd " + dir.path() + " && " + test::medfast_binary() + " --threads 2 train --resume");
  EXPECT_NE(done.exit_code, 0);
  EXPECT_TRUE(test::contains_all(done.err, {"reached train.target_dice 0.85", "nothing was changed",
                                            "--set train.target_dice=0"})) << done.err;
  EXPECT_EQ(test::read_file(dir / "runs/default/last.ckpt"), last);
  // With the target cleared, one epoch more.
  const int epochs = res["epochs"].get<int>();
  const auto said = test::run("cd " + dir.path() + " && " + test::medfast_binary() +
                              " --threads 2 train --resume --set train.target_dice=0 --set train.epochs=" +
                              std::to_string(epochs + 1));
  ASSERT_EQ(said.exit_code, 0) << said.err;
  EXPECT_NE(said.out.find(str("last.ckpt after epoch ", epochs)), std::string::npos) << said.out;
  EXPECT_NE(said.out.find("device " + choose_device("auto", "train.device").text), std::string::npos) << said.out;
  // infer maps the prediction back onto the input's grid (LPS, 1.6 mm) correctly: it
  // overlaps the file's own label about as well as validation measured on the RAS 2 mm grid.
  const std::string image = dir / "data/synth-small/imagesTr/spleen_11.nii.gz";
  const auto inf = test::run(test::medfast_binary() + " --threads 2 infer --checkpoint " + dir / "runs/default/best.ckpt" +
                             " --input " + image + " --output " + dir / "pred");
  ASSERT_EQ(inf.exit_code, 0) << inf.err;
  const Volume pred = read_nifti(dir / "pred/spleen_11_seg.nii.gz");
  const Volume truth = read_nifti(dir / "data/synth-small/labelsTr/spleen_11.nii.gz");
  ASSERT_EQ(pred.shape(), truth.shape());
  EXPECT_EQ(pred.affine.max_abs_diff(truth.affine), 0.0);
  const at::Tensor p = pred.data > 0, t = truth.data > 0;
  const double dice = 2.0 * (p & t).sum().item<double>() / (p.sum().item<double>() + t.sum().item<double>());
  EXPECT_GT(dice, 0.7) << "prediction on the input's grid vs its label";
  // The stages add up to most of each epoch (nothing large goes unaccounted).
  for (const auto& e : res["history"]) {
    double sum = 0;
    for (const auto& [k, v] : e["times"].items()) sum += v.get<double>();
    EXPECT_LE(sum, e["seconds"].get<double>() + 1e-6);
    EXPECT_GE(sum, 0.8 * e["seconds"].get<double>()) << e.dump();
  }
}

}  // namespace
}  // namespace medfast::train

namespace medfast::train {
namespace {

// train.profile: a Chrome trace of the active steps, with medfast's ranges from the
// main thread and the loader threads, and libtorch's operators inside forward.
TEST(TrainerProfile, WritesATraceOfTheActiveStepsAndItsSummary) {
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["profile"] = {{"wait", 1}, {"warmup", 1}, {"active", 2}, {"repeat", 1}};
  c["data"]["loader"]["threads"] = 2;
  Trainer(c, "", one_thread()).run(false);
  const std::string trace = dir / "run/profiler/4-trace.json.gz";  // steps 3 and 4 active
  ASSERT_TRUE(os::exists(trace)) << os::list_directory(dir / "run").size();
  EXPECT_EQ(os::list_directory(dir / "run/profiler"),
            (std::vector<std::string>{"4-trace.json.gz", "4-trace_summary.txt"}));
  const nlohmann::json j = profile::read_trace_json(trace);
  std::map<std::string, std::set<int>> tids;  // range name -> threads
  std::map<int, std::string> thread_names;
  std::vector<nlohmann::json> forwards, ops;
  for (const auto& e : j.at("traceEvents")) {
    if (e["ph"] == "M" && e["name"] == "thread_name") thread_names[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    tids[e["name"].get<std::string>()].insert(e["tid"].get<int>());
    if (e["name"] == "forward") forwards.push_back(e);
    if (e["cat"] == "op") ops.push_back(e);
  }
  EXPECT_EQ(tids["step"].size(), 1u);
  const int main_tid = *tids["step"].begin();
  EXPECT_EQ(thread_names[main_tid], "main");
  for (const char* k : {"data_wait", "copy", "forward", "backward", "optimizer"}) {
    EXPECT_EQ(tids[k], std::set<int>{main_tid}) << k;
  }
  ASSERT_FALSE(tids["batch"].empty());
  for (const int t : tids["batch"]) {
    EXPECT_NE(t, main_tid);
    EXPECT_EQ(thread_names[t].rfind("loader ", 0), 0u) << thread_names[t];
  }
  EXPECT_FALSE(tids["cache_read"].empty());
  EXPECT_FALSE(tids["RandCropByPosNegLabel"].empty());
  // Nested: libtorch's operators inside a forward range on the main thread.
  ASSERT_EQ(forwards.size(), 2u);
  int inside = 0;
  for (const auto& op : ops) {
    for (const auto& f : forwards) {
      inside += op["tid"] == f["tid"] && op["ts"].get<double>() >= f["ts"].get<double>() &&
                op["ts"].get<double>() + op["dur"].get<double>() <= f["ts"].get<double>() + f["dur"].get<double>();
    }
  }
  EXPECT_GT(inside, 5);
  const profile::TraceSummary s = profile::summarize_trace(trace);
  EXPECT_EQ(s.steps, 2u);
  EXPECT_EQ(s.stats.at("forward").count, 2u);
  const std::string summary = test::read_file(dir / "run/profiler/4-trace_summary.txt");
  EXPECT_NE(summary.find("By self time"), std::string::npos);
  EXPECT_NE(summary.find("forward"), std::string::npos);

  nlohmann::json bad = tiny_config(dir);
  bad["train"]["profile"] = {{"wait", 1}, {"active", 0}};
  const std::string m = test::value_error_of([&] { Trainer(bad, "", one_thread()).run(false); });
  EXPECT_NE(m.find("train.profile"), std::string::npos) << m;
  EXPECT_THROW(ProfileOptions::parse("1,1,x,1", "--profile"), ValueError);
  EXPECT_THROW(ProfileOptions::parse("1,1,3", "--profile"), ValueError);
  EXPECT_EQ(ProfileOptions::parse("0,2,5,3", "--profile").active, 5);
}

}  // namespace
}  // namespace medfast::train

namespace medfast::train {
namespace {

// medfast report on two real runs (one profiled), rendered by headless Chromium:
// no console error, every curve drawn (the page's script counts them into
// data-plots), and a screenshot written.
TEST(ReportCli, TwoRunsRenderInHeadlessChromium) {
  const std::string chromium = MEDFAST_TEST_CHROMIUM;
  if (chromium.empty()) GTEST_SKIP() << "no chromium here (scripts/setup.sh --test installs Debian's chromium)";
  test::TempDir dir;
  nlohmann::json c = tiny_config(dir);
  c["train"]["run_dir"] = dir / "a";
  c["train"]["profile"] = "0,1,2,1";
  test::write_file(dir / "a.json", c.dump());
  c["train"]["run_dir"] = dir / "b";
  c["train"].erase("profile");
  c["optimizer"]["lr"] = 0.001;
  test::write_file(dir / "b.json", c.dump());
  const std::string bin = test::medfast_binary() + " --threads 1 --progress off ";
  for (const char* run : {"a", "b"}) {
    const auto r = test::run(bin + "train --config " + dir / (std::string(run) + ".json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_TRUE(os::exists(dir / "a/machine.json"));
  auto r = test::run(bin + "report " + dir / "a" + " " + dir / "b" + " --out " + dir / "report.html");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = test::read_file(dir / "report.html");
  int paths = 0;
  for (auto at = html.find("<path class=\"series"); at != std::string::npos; at = html.find("<path class=\"series", at + 1)) ++paths;
  EXPECT_GE(paths, 12);  // 6 curves x 2 runs at least
  EXPECT_NE(html.find("trace summary 3-trace_summary.txt"), std::string::npos);

  const std::string flags = " --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 "
                            "--virtual-time-budget=3000 --window-size=1240,1800 ";
  r = test::run(chromium + flags + "--dump-dom file://" + dir / "report.html");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(str("data-plots=\"", paths, "\"")), std::string::npos)
      << "the page's script did not count every curve drawn";
  EXPECT_EQ(r.err.find("Uncaught"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(":CONSOLE"), std::string::npos) << "the page logged to its console:\n" << r.err;
  r = test::run(chromium + flags + "--screenshot=" + dir / "report.png file://" + dir / "report.html");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string png = test::read_file(dir / "report.png");
  ASSERT_GT(png.size(), 20000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");

  r = test::run(bin + "report " + dir / "nowhere");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("nowhere"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace medfast::train
