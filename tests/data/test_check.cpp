// The dataset check (data/check.hpp) on a synthetic dataset whose files are rewritten with
// medfast's NIfTI writer, one fault at a time; labels read into one dtype (LoadImage's
// exact casts, the loader's batches); 2-D images named; `medfast data check` end to end.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/data/cached_dataset.hpp"
#include "medfast/data/check.hpp"
#include "medfast/data/loader.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "medfast/transforms/transform.hpp"
#include "test_util.hpp"

namespace medfast::data {
namespace {

constexpr int kCases = 5;

/// A fresh synthetic dataset of kCases small cases (labels uint8, 0 and 1) in a folder of its own.
class DatasetCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions o;
    o.out_dir = dir_ / "ds";
    o.cases = kCases;
    o.set_size("40,36,10-12");
    o.seed = 5;
    synthesize_dataset(o);
  }
  std::string list() const { return dir_ / "ds/dataset.json"; }
  std::string image(int i) const { return dir_ / ("ds/imagesTr/spleen_" + std::to_string(i) + ".nii.gz"); }
  std::string label(int i) const { return dir_ / ("ds/labelsTr/spleen_" + std::to_string(i) + ".nii.gz"); }
  Dataset training() const { return load_dataset(list()); }

  /// Rewrites a file's voxels (and so its header) through `f`.
  template <typename F>
  static void rewrite(const std::string& path, F&& f) {
    Volume v = read_nifti(path);
    f(v);
    write_nifti(path, v);
  }

  static DatasetCheckOptions two_classes() {
    DatasetCheckOptions o;
    o.labels = LabelRule::classes(2, "model.out_channels");
    return o;
  }

  /// The findings of one check, in order.
  static std::vector<Finding> of(const DatasetCheckReport& r, const std::string& check) {
    std::vector<Finding> out;
    for (const auto& f : r.findings) {
      if (f.check == check) out.push_back(f);
    }
    return out;
  }

  /// The findings' texts, one per line, for failure messages and searches.
  static std::string texts(const DatasetCheckReport& r) {
    std::string s;
    for (const auto& f : r.findings) s += std::string(f.error() ? "error: " : "warning: ") + f.text() + "\n";
    return s;
  }

  test::TempDir dir_;
};

TEST_F(DatasetCheck, ACleanDatasetHasNoFindings) {
  const DatasetCheckReport r = check_dataset(training(), {}, two_classes());
  EXPECT_TRUE(r.findings.empty()) << texts(r);
  EXPECT_EQ(r.training, static_cast<std::size_t>(kCases));
  EXPECT_EQ(r.labels_read, static_cast<std::size_t>(kCases));
  EXPECT_EQ(r.headers, static_cast<std::size_t>(2 * kCases));
  EXPECT_GT(r.label_voxels.at(1), 0);
}

TEST_F(DatasetCheck, FractionalLabelValuesAreAnErrorNamingTheFile) {
  rewrite(label(2), [](Volume& v) { v.data = v.data.to(at::kFloat) * 0.6; });
  const DatasetCheckReport r = check_dataset(training(), {}, two_classes());
  ASSERT_EQ(r.errors(), 1u) << texts(r);
  EXPECT_EQ(r.findings[0].check, "label_values");
  EXPECT_EQ(r.findings[0].file, label(2));
  EXPECT_TRUE(test::contains_all(r.findings[0].message, {"not whole numbers", "e.g. 0.6"}));
  // Headers alone do not read the voxels: nothing found.
  DatasetCheckOptions headers = two_classes();
  headers.read_labels = false;
  const DatasetCheckReport h = check_dataset(training(), {}, headers);
  EXPECT_EQ(h.errors(), 0u) << texts(h);
  EXPECT_EQ(h.labels_read, 0u);
}

TEST_F(DatasetCheck, AWholeValuedFloatLabelIsALabel) {
  rewrite(label(1), [](Volume& v) { v.data = v.data.to(at::kFloat); });
  ASSERT_EQ(read_nifti(label(1)).data.scalar_type(), at::kFloat);
  const DatasetCheckReport r = check_dataset(training(), {}, two_classes());
  EXPECT_TRUE(r.findings.empty()) << texts(r);
}

TEST_F(DatasetCheck, LabelValuesOutsideTheClassesNameTheFile) {
  rewrite(label(3), [](Volume& v) { v.data = v.data * 7; });
  const DatasetCheckReport r = check_dataset(training(), {}, two_classes());
  ASSERT_EQ(r.errors(), 1u) << texts(r);
  EXPECT_EQ(r.findings[0].file, label(3));
  EXPECT_TRUE(test::contains_all(r.findings[0].message, {"label value 7", "model.out_channels", "0..1"}));
  // Without a rule, any whole value >= 0 is a class index; a negative one is not.
  EXPECT_TRUE(check_dataset(training(), {}).findings.empty());
  rewrite(label(3), [](Volume& v) { v.data = (v.data > 0).to(at::kShort) * -1; });
  const DatasetCheckReport n = check_dataset(training(), {});
  ASSERT_EQ(n.errors(), 1u) << texts(n);
  EXPECT_TRUE(test::contains_all(n.findings[0].message, {"label value -1", "class indices"}));
}

TEST_F(DatasetCheck, LabelsWithoutForegroundWarnAndNoneAtAllIsAnError) {
  rewrite(label(0), [](Volume& v) { v.data.zero_(); });
  const DatasetCheckReport some = check_dataset(training(), {}, two_classes());
  ASSERT_EQ(some.findings.size(), 1u) << texts(some);
  EXPECT_FALSE(some.findings[0].error());
  EXPECT_EQ(some.findings[0].file, label(0));
  EXPECT_TRUE(test::contains_all(some.findings[0].message, {"no foreground"}));

  for (int i = 1; i < kCases; ++i) rewrite(label(i), [](Volume& v) { v.data.zero_(); });
  const DatasetCheckReport none = check_dataset(training(), {}, two_classes());
  ASSERT_EQ(none.findings.size(), 1u) << texts(none);
  EXPECT_TRUE(none.findings[0].error());
  EXPECT_EQ(none.findings[0].file, list());
  EXPECT_TRUE(test::contains_all(none.findings[0].message, {"no training label has any foreground", label(4)}));
}

TEST_F(DatasetCheck, EmptyValidationLabelsWarnThatNoBestCheckpointIsWritten) {
  Dataset train = training(), validation;
  validation.source = train.source;
  validation.items.assign(train.items.end() - 1, train.items.end());
  train.items.pop_back();
  rewrite(label(kCases - 1), [](Volume& v) { v.data.zero_(); });
  const DatasetCheckReport r = check_dataset(train, validation, two_classes());
  ASSERT_EQ(r.findings.size(), 1u) << texts(r);
  EXPECT_FALSE(r.findings[0].error());
  EXPECT_TRUE(
      test::contains_all(r.findings[0].message, {"no validation label has any foreground", "NaN", "best.ckpt"}));
}

TEST_F(DatasetCheck, DuplicatesAndValidationCasesAmongTheTrainingOnes) {
  Dataset train = training();
  train.items.push_back(train.items[1]);  // listed twice
  Dataset validation;
  validation.source = train.source;
  validation.items = {train.items[3]};  // also trains
  const DatasetCheckReport r = check_dataset(train, validation, two_classes());
  ASSERT_EQ(r.errors(), 2u) << texts(r);
  EXPECT_EQ(r.findings[0].check, "duplicate");
  EXPECT_EQ(r.findings[0].file, image(1));
  EXPECT_TRUE(test::contains_all(r.findings[0].message, {"listed twice", "items 1 and 5"}));
  EXPECT_EQ(r.findings[1].check, "validation_in_training");
  EXPECT_EQ(r.findings[1].file, image(3));
  EXPECT_TRUE(test::contains_all(r.findings[1].message, {"also a training case", "trained on"}));
}

TEST_F(DatasetCheck, TwoDimensionalAndThinImagesAreNamed) {
  for (const auto& f : {image(1), label(1)}) rewrite(f, [](Volume& v) { v.data = v.data.select(2, 5).contiguous(); });
  for (const auto& f : {image(2), label(2)})
    rewrite(f, [](Volume& v) { v.data = v.data.narrow(2, 5, 1).contiguous(); });
  const DatasetCheckReport r = check_dataset(training(), {}, two_classes());
  const std::vector<Finding> dims = of(r, "dimensions");
  ASSERT_EQ(dims.size(), 3u) << texts(r);
  EXPECT_TRUE(dims[0].error());
  EXPECT_EQ(dims[0].file, image(1));
  EXPECT_TRUE(test::contains_all(dims[0].message, {"medfast trains 3D images", "is 2-D (shape 40 x 36)"}));
  EXPECT_EQ(dims[0].message.find("EnsureChannelFirst"), std::string::npos);
  EXPECT_TRUE(dims[1].error());
  EXPECT_EQ(dims[1].file, label(1));
  EXPECT_FALSE(dims[2].error());
  EXPECT_EQ(dims[2].file, image(2));
  EXPECT_TRUE(test::contains_all(dims[2].message, {"1 voxel thick along axis z", "40 x 36 x 1"}));
  EXPECT_EQ(r.errors(), 2u) << texts(r);
}

TEST_F(DatasetCheck, ALabelOffItsImagesGridIsAnError) {
  rewrite(label(1), [](Volume& v) { v.data = v.data.narrow(2, 0, v.data.size(2) - 1).contiguous(); });
  rewrite(label(2), [](Volume& v) {
    Affine a = v.affine;
    a(2, 2) *= 1.5;  // 3 mm slices become 4.5 mm
    v.affine = a;
  });
  const DatasetCheckReport r = check_dataset(training(), {}, two_classes());
  ASSERT_EQ(r.errors(), 2u) << texts(r);
  EXPECT_EQ(r.findings[0].file, label(1));
  EXPECT_TRUE(test::contains_all(r.findings[0].message, {"is not its image's", image(1)}));
  EXPECT_EQ(r.findings[1].file, label(2));
  EXPECT_TRUE(
      test::contains_all(r.findings[1].message, {"grid is not its image's", image(2), "spacing", "allowed 0.001"}));
  // The headers tell it (no voxels read).
  DatasetCheckOptions headers = two_classes();
  headers.read_labels = false;
  EXPECT_EQ(check_dataset(training(), {}, headers).errors(), 2u);
}

TEST_F(DatasetCheck, MissingFilesAndChannelsAreNamed) {
  os::remove_file(label(4));
  rewrite(image(2), [](Volume& v) { v.data = at::stack({v.data, v.data}, 3); });
  const DatasetCheckReport r = check_dataset(training(), {}, two_classes());
  ASSERT_EQ(r.errors(), 2u) << texts(r);
  EXPECT_EQ(r.findings[0].file, image(2));
  EXPECT_TRUE(test::contains_all(r.findings[0].message, {"has 2 channel(s)", "most cases have 1"}));
  EXPECT_EQ(r.findings[1].file, label(4));
  EXPECT_TRUE(test::contains_all(r.findings[1].message, {"does not exist"}));
}

TEST(LabelValuesTest, CountsWholeValuesAndFindsFractions) {
  const LabelValues u = label_values(at::tensor({0, 0, 1, 2, 2, 2}, at::kByte));
  EXPECT_EQ(u.voxels, (std::map<std::int64_t, std::int64_t>{{0, 2}, {1, 1}, {2, 3}}));
  EXPECT_EQ(u.foreground(), 4);
  EXPECT_TRUE(u.whole());
  const LabelValues f = label_values(at::tensor({0.0, 1.0, 0.6, NAN, 300.0, -2.0}, at::kFloat));
  EXPECT_EQ(f.not_whole, 2);
  EXPECT_NEAR(f.first_not_whole, 0.6, 1e-6);
  EXPECT_EQ(f.voxels, (std::map<std::int64_t, std::int64_t>{{-2, 1}, {0, 1}, {1, 1}, {300, 1}}));
  EXPECT_EQ(LabelRule::classes(2, "x").problem(f).find("holds label values -2, 300 (2 voxels)"), 0u);
  EXPECT_EQ(LabelRule::classes(3, "x").allowed, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(LabelRule::classes(1, "x").allowed, (std::vector<std::int64_t>{0, 1}));  // one output: a mask
}

TEST(LabelCheckTest, NamesTheLabelFileAndCollectsEmptyLabels) {
  LabelCheck check("label", LabelRule::classes(2, "model.out_channels"));
  auto sample = [](const std::string& file, at::Tensor label) {
    Sample s;
    s.volumes["label"].data = std::move(label);
    s.meta["label"] = file;
    return s;
  };
  check(sample("/d/a.nii.gz", at::zeros({1, 4, 4, 4}, at::kByte)));
  check(sample("/d/b.nii.gz", at::ones({1, 4, 4, 4}, at::kByte)));
  check(sample("/d/a.nii.gz", at::zeros({1, 4, 4, 4}, at::kByte)));  // a padded partition's repeat
  EXPECT_EQ(check.checked(), 2u);
  EXPECT_EQ(check.without_foreground(), std::vector<std::string>{"/d/a.nii.gz"});
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] {
                                   check(sample("/d/c.nii.gz", at::full({1, 4, 4, 4}, 7, at::kByte)));
                                 }),
                                 {"/d/c.nii.gz: holds label value 7", "values 0..1"}));
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] {
                                   check(sample("/d/e.nii.gz", at::full({1, 4, 4, 4}, 0.6, at::kFloat)));
                                 }),
                                 {"/d/e.nii.gz: holds values that are not whole numbers", "mode nearest"}));
}

// LoadImage's cast to an integer dtype keeps every value or names the file.
TEST_F(DatasetCheck, LoadImageReadsWholeFloatLabelsAsIntegersAndRefusesFractions) {
  const auto load = transforms::make_chain(
      nlohmann::json::parse(R"([{"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", "uint8"]}])"));
  rewrite(label(0), [](Volume& v) { v.data = v.data.to(at::kFloat); });
  rewrite(label(1), [](Volume& v) { v.data = v.data.to(at::kFloat) * 0.6; });
  rewrite(label(2), [](Volume& v) { v.data = v.data.to(at::kShort) * 300; });
  const Dataset d = training();
  const Sample whole = compute_item(d, load, 0);
  EXPECT_EQ(whole.volume("label").data.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(whole.volume("label").data, read_nifti(label(0)).data.to(at::kByte)));
  EXPECT_TRUE(test::contains_all(test::error_of<Error>([&] { compute_item(d, load, 1); }),
                                 {label(1), "dtype uint8 cannot hold", "not whole numbers", "e.g. 0.6"}));
  EXPECT_TRUE(test::contains_all(test::error_of<Error>([&] { compute_item(d, load, 2); }),
                                 {label(2), "range from 0 to 300", "0..255"}));
}

TEST_F(DatasetCheck, EnsureChannelFirstNamesATwoDimensionalImage) {
  rewrite(image(1), [](Volume& v) { v.data = v.data.select(2, 3).contiguous(); });
  rewrite(label(1), [](Volume& v) { v.data = v.data.select(2, 3).contiguous(); });
  const auto chain = transforms::make_chain(nlohmann::json::parse(R"([
      {"name": "LoadImage", "keys": ["image", "label"]}, {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
      {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"}])"));
  const std::string m = test::error_of<Error>([&] { compute_item(training(), chain, 1); });
  EXPECT_TRUE(test::contains_all(m, {image(1), "is a 2-D image (shape 40 x 36)", "medfast trains 3D images"}));
  EXPECT_EQ(m.find("put EnsureChannelFirst"), std::string::npos) << m;
}

// Files of one key stored in different types batch in the type that holds them all.
TEST_F(DatasetCheck, LabelsStoredInDifferentDtypesBatchTogether) {
  rewrite(label(1), [](Volume& v) { v.data = v.data.to(at::kFloat); });
  const auto chain = transforms::make_chain(nlohmann::json::parse(R"([
      {"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", ""]},
      {"name": "EnsureChannelFirst", "keys": ["image", "label"]}])"));
  const Dataset d = training();
  std::vector<Sample> samples{compute_item(d, chain, 0), compute_item(d, chain, 1)};
  ASSERT_EQ(samples[0].volume("label").data.scalar_type(), at::kByte);
  ASSERT_EQ(samples[1].volume("label").data.scalar_type(), at::kFloat);
  LoaderOptions o;
  o.batch_size = 2;
  o.threads = 1;
  o.shuffle = false;
  const auto random = transforms::make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandSpatialCrop", "keys": ["image", "label"], "roi_size": [16, 16, 8]}])"),
                                                    1);
  Loader loader(
      2, [&](std::size_t i) { return samples[i]; }, random, o);
  loader.start(0);
  const auto batch = loader.next();
  ASSERT_TRUE(batch);
  const at::Tensor l = batch->tensors.at("label");
  EXPECT_EQ(l.scalar_type(), at::kFloat);
  EXPECT_EQ(l.sizes(), (at::IntArrayRef{2, 1, 16, 16, 8}));
  EXPECT_TRUE(at::equal(l, l.round()));
  EXPECT_EQ(batch->files.size(), 2u);
  EXPECT_TRUE(test::contains_all(batch->files[1], {"label=" + label(1)}));
}

TEST_F(DatasetCheck, CliChecksAListAndARunConfig) {
  const std::string medfast = test::medfast_binary() + " --threads 2 data check ";
  const auto clean = test::run(medfast + "--dataset " + dir_ / "ds");
  EXPECT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  EXPECT_TRUE(test::contains_all(clean.out, {"checked 5 cases", "0 errors, 0 warnings"}));

  rewrite(label(1), [](Volume& v) { v.data = v.data.to(at::kFloat) * 0.6; });
  rewrite(label(2), [](Volume& v) { v.data.zero_(); });
  const auto bad = test::run(medfast + "--dataset " + list() + " --json");
  EXPECT_EQ(bad.exit_code, 1) << bad.out << bad.err;
  const nlohmann::json j = nlohmann::json::parse(bad.out);
  EXPECT_EQ(j["errors"], 1);
  EXPECT_EQ(j["warnings"], 1);
  EXPECT_EQ(j["findings"][0]["file"], label(1));
  EXPECT_EQ(j["findings"][0]["severity"], "error");
  EXPECT_EQ(j["findings"][1]["file"], label(2));
  EXPECT_EQ(j["findings"][1]["check"], "foreground");
  EXPECT_TRUE(test::contains_all(bad.err, {"data check: 1 error in " + list()}));

  // A run config (the built-in default's, on this list): its validation split and its model's classes.
  rewrite(label(1), [](Volume& v) { v.data = (v.data > 0).to(at::kByte) * 2; });
  const std::string on_list = "--set data.dataset=" + list() + " --set data.validation.num=1";
  const auto config = test::run(medfast + on_list);
  EXPECT_EQ(config.exit_code, 1) << config.out << config.err;
  EXPECT_TRUE(test::contains_all(config.out, {"error: " + label(1) + ": holds label value 2", "model.out_channels",
                                              "warning: " + label(2), "(4 training, 1 validation)"}));
  const auto headers = test::run(medfast + on_list + " --headers-only");
  EXPECT_EQ(headers.exit_code, 0) << headers.out << headers.err;
  EXPECT_TRUE(test::contains_all(headers.out, {"no label voxels (--headers-only)"}));

  const auto help = test::run(medfast + "--help");
  EXPECT_TRUE(test::contains_all(help.out, {"--verify_dataset_integrity", "validation case", "grid", "whole numbers",
                                            "foreground", "--headers-only"}));
}

}  // namespace
}  // namespace medfast::data
