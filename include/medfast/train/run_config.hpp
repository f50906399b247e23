#pragma once
/// \file
/// A training run's config, read and checked in one place (see trainer.hpp for
/// the sections). Every error names the config and the key.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/core/settings.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/train/collective.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/optim.hpp"
#include "medfast/train/trainer.hpp"

namespace medfast::train {

struct RunConfig {
  std::string path;      ///< the config file, or "built-in default config"
  std::string base_dir;  ///< absolute folder that relative paths start from
  nlohmann::json root;   ///< the whole config, as resolved (relative paths kept)
  data::PipelineConfig data;
  nlohmann::json model;
  LossOptions loss;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  SlidingWindowOptions sliding_window;
  int val_interval = 1;
  bool hd95 = false;
  TrainOptions train;
  std::shared_ptr<Collective> collective;  ///< set by the caller under DDP
};

/// Reads `root` (from `path`, "" for the built-in default: paths relative to the
/// working directory). The settings apply the config's `settings:` map below
/// flags and the environment.
/// `base_dir` overrides the folder relative paths start from (a checkpoint's config).
RunConfig load_run_config(nlohmann::json root, std::string path, Settings& settings, std::string base_dir = "");

}  // namespace medfast::train
