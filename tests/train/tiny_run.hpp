#pragma once
// The tiny run the trainer's tests share: the built-in default run at a tiny size, the same
// on any machine. One definition for test_trainer.cpp and test_trainer_checks.cpp.
#include <nlohmann/json.hpp>

#include "medfast/core/settings.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/train/run_config.hpp"
#include "test_util.hpp"

namespace medfast::train::test_run {

/// Settings of one thread (libtorch's and medfast's pools).
inline Settings one_thread() {
  Settings s;
  s.set("threads", "1", SettingSource::flag, "test");
  return s;
}

/// 6 synthetic cases of 40x40x12-14 (the last validates), UNet(4, 8, 16), 2 epochs on the
/// CPU, its run in dir/run; data.synth not run yet (the dataset not written).
inline nlohmann::json unprepared_tiny_config(const test::TempDir& dir) {
  nlohmann::json c = default_run_config();
  c["train"]["device"] = "cpu";  // the same run on any machine (the default is auto)
  c["data"]["dataset"] = dir / "data/dataset.json";
  c["data"]["synth"] = {{"cases", 6}, {"size", "40,40,12-14"}, {"spacing", {2.0, 2.0, 3.0}}, {"seed", 1}};
  c["data"]["validation"] = {{"num", 1}};
  c["data"]["random"][0]["spatial_size"] = {16, 16, 8};
  c["model"]["channels"] = {4, 8, 16};
  c["model"]["strides"] = {2, 2};
  c["validation"]["sliding_window"]["roi_size"] = {16, 16, 8};
  c["train"]["run_dir"] = dir / "run";
  c["train"]["epochs"] = 2;
  c["train"]["target_dice"] = 0;
  c["train"]["threads"] = 1;
  return c;
}

/// unprepared_tiny_config with its dataset written (the step the CLI takes before a run:
/// prepare_run).
inline nlohmann::json tiny_config(const test::TempDir& dir) {
  nlohmann::json c = unprepared_tiny_config(dir);
  data::prepare_dataset(c, "tiny config", dir.path(), one_thread());
  return c;
}

}  // namespace medfast::train::test_run
