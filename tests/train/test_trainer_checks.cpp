// A run's dataset check (train/data_checks.hpp): headers before the cache fill, label values
// and foreground as the fill computes them, each error naming the file; a run without a
// best checkpoint says why; plan keeps a case listed twice once.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "medfast/plan/dataset.hpp"
#include "medfast/train/run_config.hpp"
#include "medfast/train/step.hpp"
#include "medfast/train/trainer.hpp"
#include "test_util.hpp"
#include "tiny_run.hpp"

namespace medfast::train {
namespace {

using test_run::one_thread;

/// A tiny run (tiny_run.hpp): 6 synthetic cases of 40x40x12-14 (the last validates),
/// UNet(4, 8, 16), 2 epochs; its dataset written.
nlohmann::json tiny(const test::TempDir& dir) { return test_run::tiny_config(dir); }

std::string image(const test::TempDir& dir, int i) {
  return dir / ("data/imagesTr/spleen_" + std::to_string(i) + ".nii.gz");
}
std::string label(const test::TempDir& dir, int i) {
  return dir / ("data/labelsTr/spleen_" + std::to_string(i) + ".nii.gz");
}

template <typename F>
void rewrite(const std::string& path, F&& f) {
  Volume v = read_nifti(path);
  f(v);
  write_nifti(path, v);
}

/// The error the run stops with, where it stops before its first checkpoint.
std::string run_error(const test::TempDir& dir, const nlohmann::json& c) {
  const std::string m = test::error_of<FormatError>([&] { Trainer(c, "", one_thread()).run(false); });
  EXPECT_FALSE(os::exists(dir / "run/last.ckpt"));
  return m;
}

// Before: trained as empty labels, "dice nan", rc 0, no word of the fractions.
TEST(TrainDataChecks, FractionalLabelsStopTheRunNamingTheFile) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  rewrite(label(dir, 2), [](Volume& v) { v.data = v.data.to(at::kFloat) * 0.6; });
  EXPECT_TRUE(test::contains_all(run_error(dir, c), {label(dir, 2), "not whole numbers", "e.g. 0.6"}));
}

// Before: "dice nan" every epoch, then "best dice -1.0000 at epoch 0".
TEST(TrainDataChecks, AllZeroTrainingLabelsStopTheRun) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  for (int i = 0; i < 6; ++i) rewrite(label(dir, i), [](Volume& v) { v.data.zero_(); });
  EXPECT_TRUE(test::contains_all(run_error(dir, c),
                                 {"no training label has any foreground", "nothing to train", label(dir, 0)}));
}

// Before: "epoch 1, step 2 (items 1, 4): one_hot: labels must lie in [0, 2), got values from 0 to 7".
TEST(TrainDataChecks, ALabelValueOutsideTheClassesNamesTheFile) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  rewrite(label(dir, 1), [](Volume& v) { v.data = v.data * 7; });
  EXPECT_TRUE(test::contains_all(run_error(dir, c),
                                 {label(dir, 1), "holds label value 7", "model.out_channels", "values 0..1"}));
}

// Before: trained, the validation case among the training ones.
TEST(TrainDataChecks, AValidationCaseAmongTheTrainingOnesIsAnError) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  nlohmann::json list = nlohmann::json::parse(test::read_file(dir / "data/dataset.json"));
  list["training"].insert(list["training"].begin(), list["training"].back());
  test::write_file(dir / "data/dataset.json", list.dump());
  EXPECT_TRUE(test::contains_all(run_error(dir, c), {image(dir, 5), "also a training case"}));
}

// Before: "transform 2 (Orientation): image: expected a channel-first volume ...; put
// EnsureChannelFirst before it", where it already was.
TEST(TrainDataChecks, ATwoDimensionalImageIsNamedBeforeTheFill) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  for (const auto& f : {image(dir, 2), label(dir, 2)})
    rewrite(f, [](Volume& v) { v.data = v.data.select(2, 6).contiguous(); });
  const std::string m = run_error(dir, c);
  EXPECT_TRUE(test::contains_all(m, {image(dir, 2), "medfast trains 3D images", "is 2-D (shape 40 x 40)"}));
  EXPECT_EQ(m.find("EnsureChannelFirst"), std::string::npos) << m;
}

// Before: "loader: batch 0 key 'label' has samples of different shapes, dtypes or devices".
TEST(TrainDataChecks, LabelsStoredInDifferentDtypesTrain) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  rewrite(label(dir, 1), [](Volume& v) { v.data = v.data.to(at::kFloat); });
  const TrainResult r = Trainer(c, "", one_thread()).run(false);
  EXPECT_EQ(r.history.size(), 2u);
  EXPECT_EQ(r.best_checkpoint, dir / "run/best.ckpt");
  EXPECT_TRUE(os::exists(r.best_checkpoint));
}

// Before: "dice nan" every epoch, "best dice -1.0000 at epoch 0", and a summary that listed
// a best.ckpt that did not exist.
TEST(TrainDataChecks, EmptyValidationLabelsEndWithoutABestCheckpointAndSaySo) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  rewrite(label(dir, 5), [](Volume& v) { v.data.zero_(); });
  std::vector<std::string> said;
  TrainCallbacks cb;
  cb.message = [&](const std::string& m) { said.push_back(m); };
  const TrainResult r = Trainer(c, "", one_thread()).run(false, cb);
  ASSERT_EQ(r.history.size(), 2u);
  EXPECT_TRUE(std::isnan(*r.history[1].dice));  // MONAI: a class with an empty ground truth has no Dice
  EXPECT_EQ(r.best_epoch, 0);
  EXPECT_TRUE(r.best_checkpoint.empty());
  EXPECT_TRUE(test::contains_all(r.no_best_checkpoint, {"no validation label has any foreground", "ignore_empty"}));
  EXPECT_FALSE(os::exists(dir / "run/best.ckpt"));
  EXPECT_TRUE(os::exists(dir / "run/last.ckpt"));
  const nlohmann::json j = r.to_json();
  EXPECT_TRUE(j["best_dice"].is_null());
  EXPECT_TRUE(j["best_checkpoint"].is_null());
  EXPECT_EQ(j["no_best_checkpoint"], r.no_best_checkpoint);
  std::string all;
  for (const auto& m : said) all += m + "\n";
  EXPECT_TRUE(test::contains_all(all, {"warning: no validation label has any foreground", label(dir, 5)}));

  // The command line says it, and lists only the files there are.
  nlohmann::json again = c;
  again["train"]["epochs"] = 1;
  test::write_file(dir / "run.json", again.dump());
  const auto cli = test::run(test::medfast_binary() + " --threads 1 train --overwrite --config " + dir / "run.json");
  EXPECT_EQ(cli.exit_code, 0) << cli.out << cli.err;
  EXPECT_TRUE(test::contains_all(cli.out, {"no best.ckpt: no validation label has any foreground",
                                           "run folder " + dir / "run" + ": last.ckpt, metrics.jsonl"}));
  EXPECT_EQ(cli.out.find("best dice -1"), std::string::npos) << cli.out;
  EXPECT_EQ(cli.out.find("best.ckpt, metrics"), std::string::npos) << cli.out;
}

TEST(TrainDataChecks, LabelsWithoutForegroundWarn) {
  test::TempDir dir;
  const nlohmann::json c = tiny(dir);
  rewrite(label(dir, 3), [](Volume& v) { v.data.zero_(); });
  std::vector<std::string> said;
  TrainCallbacks cb;
  cb.message = [&](const std::string& m) { said.push_back(m); };
  nlohmann::json one = c;
  one["train"]["epochs"] = 1;
  const TrainResult r = Trainer(one, "", one_thread()).run(false, cb);
  EXPECT_EQ(r.history.size(), 1u);
  std::string all;
  for (const auto& m : said) all += m + "\n";
  EXPECT_TRUE(test::contains_all(all, {"warning: 1 of 5 training labels have no foreground", label(dir, 3)}));
}

TEST(TrainDataChecks, StepErrorsNameTheBatchFiles) {
  EXPECT_EQ((StepLabel{1, 2, {3, 4}, {"image=a.nii, label=b.nii", "image=c.nii, label=d.nii"}}.text()),
            "epoch 1, step 2 (items 3: image=a.nii, label=b.nii; 4: image=c.nii, label=d.nii)");
  EXPECT_EQ((StepLabel{1, 2, {3, 4}}.text()), "epoch 1, step 2 (items 3, 4)");
}

// Before: a case listed twice was planned (and trained) twice, and the plan's validation
// split (the last cases) could hold one copy while the other trained.
TEST(PlanDataChecks, ACaseListedTwiceIsPlannedOnce) {
  test::TempDir dir;
  tiny(dir);
  nlohmann::json list = nlohmann::json::parse(test::read_file(dir / "data/dataset.json"));
  list["training"].insert(list["training"].begin(), list["training"].back());
  test::write_file(dir / "data/dataset.json", list.dump());
  plan::FingerprintOptions o;
  o.use_cache = false;
  o.total_samples = 1000;
  const plan::DatasetFingerprint fp = plan::dataset_fingerprint(dir / "data", o);
  EXPECT_EQ(fp.listed, 7u);
  EXPECT_EQ(fp.cases.size(), 6u);
  EXPECT_EQ(fp.excluded(), 1u);
  ASSERT_FALSE(fp.notes.empty());
  const plan::CaseNote& n = fp.notes.back();
  EXPECT_TRUE(n.excluded);
  EXPECT_EQ(n.file, image(dir, 5));
  EXPECT_TRUE(test::contains_all(n.text(), {"is listed twice (training items 0 and 6)", "left out"}));
}

}  // namespace
}  // namespace medfast::train
