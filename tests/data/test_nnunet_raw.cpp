// nnU-Net v2 raw datasets (imagesTr/{case}_{XXXX}, labelsTr/{case}, dataset.json with
// channel_names, labels or regions, numTraining, file_ending) and items whose image is a list
// of channel files: read, stacked as channels, their grids checked, cached by every file;
// LabelToRegions.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "medfast/core/error.hpp"
#include "medfast/data/cached_dataset.hpp"
#include "medfast/data/check.hpp"
#include "medfast/data/dataset.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "medfast/transforms/transform.hpp"
#include "nnunet_raw.hpp"
#include "test_util.hpp"

namespace medfast::data {
namespace {

const nlohmann::json kLoad = nlohmann::json::parse(
    R"([{"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", ""]},
        {"name": "EnsureChannelFirst", "keys": ["image", "label"]}])");

class NnunetRaw : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    test::write_nnunet_raw(dir_->path() + "/raw", {});
  }
  static void TearDownTestSuite() { delete dir_; }
  /// A copy of the dataset to spoil.
  std::string copy() const {
    const std::string to = tmp_ / "raw";
    EXPECT_EQ(std::system(("cp -r '" + dir_->path() + "/raw' '" + to + "'").c_str()), 0);
    return to;
  }
  static std::string raw() { return dir_->path() + "/raw"; }
  static test::TempDir* dir_;
  test::TempDir tmp_;
};
test::TempDir* NnunetRaw::dir_ = nullptr;

TEST_F(NnunetRaw, CasesAreFoundWithTheirChannelsInOrder) {
  const Dataset d = load_dataset(raw() + "/dataset.json");
  ASSERT_EQ(d.items.size(), 5u);
  const FilePaths& image = d.items[2].files.at("image");
  ASSERT_EQ(image.size(), 2u);
  EXPECT_EQ(image[0], raw() + "/imagesTr/case_002_0000.nii.gz");
  EXPECT_EQ(image[1], raw() + "/imagesTr/case_002_0001.nii.gz");
  EXPECT_EQ(d.items[2].files.at("label").first(), raw() + "/labelsTr/case_002.nii.gz");
  // imagesTs: the test section, images only.
  const Dataset t = load_dataset(raw() + "/dataset.json", "test");
  ASSERT_EQ(t.items.size(), 2u);
  EXPECT_EQ(t.items[0].files.at("image").size(), 2u);
  EXPECT_EQ(t.items[0].files.count("label"), 0u);
  // A section the layout has not.
  EXPECT_TRUE(
      test::contains_all(test::error_of<FormatError>([&] { load_dataset(raw() + "/dataset.json", "validation"); }),
                         {"no section 'validation'", "imagesTr", "imagesTs"}));
}

TEST_F(NnunetRaw, ChannelsAreStackedInOrderOnTheFirstFilesGrid) {
  const Dataset d = load_dataset(raw() + "/dataset.json");
  const Sample s = compute_item(d, transforms::make_chain(kLoad), 1);
  const Volume& image = s.volume("image");
  ASSERT_EQ(image.data.dim(), 4);
  EXPECT_EQ(image.data.size(0), 2);
  const Volume t2 = read_nifti(raw() + "/imagesTr/case_001_0000.nii.gz");
  const Volume adc = read_nifti(raw() + "/imagesTr/case_001_0001.nii.gz");
  EXPECT_TRUE(at::equal(image.data[0], t2.data.to(at::kFloat)));
  EXPECT_TRUE(at::equal(image.data[1], adc.data.to(at::kFloat)));
  EXPECT_TRUE(image.affine == t2.affine);
  EXPECT_EQ(s.volume("label").data.size(0), 1);
}

TEST_F(NnunetRaw, ErrorsNameTheFileAndWhatWasExpected) {
  const std::string r = copy();
  const std::string list = r + "/dataset.json";
  const auto error = [&] { return test::error_of<FormatError>([&] { load_dataset(list); }); };
  // A missing channel: the case and the file expected.
  os::rename(r + "/imagesTr/case_003_0001.nii.gz", tmp_ / "moved.nii.gz");
  EXPECT_TRUE(test::contains_all(error(), {"case 'case_003' has no channel 1", r + "/imagesTr/case_003_0001.nii.gz"}));
  os::rename(tmp_ / "moved.nii.gz", r + "/imagesTr/case_003_0001.nii.gz");
  // A channel channel_names has not.
  std::system(("cp '" + r + "/imagesTr/case_003_0001.nii.gz' '" + r + "/imagesTr/case_003_0002.nii.gz'").c_str());
  EXPECT_TRUE(test::contains_all(error(), {r + "/imagesTr/case_003_0002.nii.gz", "channel 2 of case 'case_003'",
                                           "names 2 channel(s) in channel_names (0..1)"}));
  os::remove_file(r + "/imagesTr/case_003_0002.nii.gz");
  // A file that is no channel file.
  test::write_file(r + "/imagesTr/notes.nii.gz", "x");
  EXPECT_TRUE(test::contains_all(error(), {r + "/imagesTr/notes.nii.gz", "expected {case}_{XXXX}.nii.gz"}));
  os::remove_file(r + "/imagesTr/notes.nii.gz");
  // A case without a label; a label without images.
  os::rename(r + "/labelsTr/case_004.nii.gz", tmp_ / "label.nii.gz");
  EXPECT_TRUE(test::contains_all(error(), {"case 'case_004'", "has no label", r + "/labelsTr/case_004.nii.gz"}));
  os::rename(tmp_ / "label.nii.gz", r + "/labelsTr/case_004.nii.gz");
  std::system(("cp '" + r + "/labelsTr/case_004.nii.gz' '" + r + "/labelsTr/case_009.nii.gz'").c_str());
  EXPECT_TRUE(test::contains_all(
      error(), {r + "/labelsTr/case_009.nii.gz", "a label without images", r + "/imagesTr/case_009_0000.nii.gz"}));
  os::remove_file(r + "/labelsTr/case_009.nii.gz");
  EXPECT_EQ(load_dataset(list).items.size(), 5u);  // whole again
  // numTraining off: refused, as nnU-Net's verify_dataset_integrity does.
  nlohmann::json j = nlohmann::json::parse(test::read_file(list));
  j["numTraining"] = 6;
  test::write_file(list, j.dump());
  EXPECT_TRUE(test::contains_all(error(), {list, "'numTraining' is 6", "hold 5 case(s)"}));
  j["numTraining"] = 5;
  // A file_ending medfast cannot read, or one the files do not have.
  j["file_ending"] = ".mha";
  test::write_file(list, j.dump());
  EXPECT_TRUE(test::contains_all(error(), {list, "'file_ending' \".mha\"", "\".nii.gz\" or \".nii\""}));
  j["file_ending"] = ".nii";
  test::write_file(list, j.dump());
  EXPECT_TRUE(test::contains_all(
      error(), {list, "'file_ending' is \".nii\"", "holds .nii.gz files", "set file_ending to \".nii.gz\""}));
}

TEST_F(NnunetRaw, AChannelOffTheFirstFilesGridIsRefusedNamingBoth) {
  const std::string r = copy();
  const std::string first = r + "/imagesTr/case_000_0000.nii.gz", second = r + "/imagesTr/case_000_0001.nii.gz";
  const Dataset d = load_dataset(r + "/dataset.json");
  const auto load_error = [&] {
    return test::error_of<Error>([&] { compute_item(d, transforms::make_chain(kLoad), 0); });
  };
  Volume v = read_nifti(second);
  Volume moved = v;
  moved.affine(2, 2) *= 2;  // another slice spacing
  write_nifti(second, moved);
  EXPECT_TRUE(test::contains_all(load_error(), {second, "is not on the grid of", first, "spacing"}));
  // The dataset check says it too, naming both.
  DatasetCheckOptions o;
  const DatasetCheckReport report = check_dataset(d, {}, o);
  ASSERT_EQ(report.errors(), 1u) << report.error_text();
  EXPECT_TRUE(test::contains_all(report.error_text(), {second, first, "affine"}));
  // Another shape.
  Volume cut = v;
  cut.data = v.data.narrow(0, 0, v.data.size(0) - 1).contiguous();
  write_nifti(second, cut);
  EXPECT_TRUE(test::contains_all(load_error(), {second, first, "shape"}));
  EXPECT_TRUE(test::contains_all(check_dataset(d, {}, o).error_text(), {second, first, "shape"}));
}

TEST(MultiFileImages, AnMsdListWithImageListsStacksChannelsAndCachesByEveryFile) {
  test::TempDir dir;
  test::write_nnunet_raw(dir / "raw", {3, 0, false, "24,20,8"});
  const std::string r = dir / "raw";
  test::write_file(
      dir / "list.json",
      nlohmann::json{{"training",
                      {{{"image", {r + "/imagesTr/case_000_0000.nii.gz", "raw/imagesTr/case_000_0001.nii.gz"}},
                        {"label", "raw/labelsTr/case_000.nii.gz"}},
                       {{"image", "raw/imagesTr/case_001_0000.nii.gz"}, {"label", "raw/labelsTr/case_001.nii.gz"}}}}}
          .dump());
  const Dataset d = load_dataset(dir / "list.json");
  ASSERT_EQ(d.items.size(), 2u);
  ASSERT_EQ(d.items[0].files.at("image").size(), 2u);
  EXPECT_EQ(d.items[0].files.at("image")[1], r + "/imagesTr/case_000_0001.nii.gz");  // relative to the list
  EXPECT_EQ(d.items[1].files.at("image").size(), 1u);
  const transforms::Compose chain = transforms::make_chain(kLoad);
  EXPECT_EQ(compute_item(d, chain, 0).volume("image").data.size(0), 2);
  EXPECT_EQ(compute_item(d, chain, 1).volume("image").data.size(0), 1);
  // An empty list, or one with something else than a file name.
  test::write_file(dir / "bad.json", R"({"training": [{"image": [], "label": "l.nii.gz"}]})");
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { load_dataset(dir / "bad.json"); }),
                                 {"training[0].image is an empty list"}));
  test::write_file(dir / "bad.json", R"({"training": [{"image": ["a.nii.gz", 3], "label": "l.nii.gz"}]})");
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { load_dataset(dir / "bad.json"); }),
                                 {"training[0].image[1] is not a file name"}));
  // The cache key covers every channel file: a changed second channel is a changed item.
  CacheConfig c;
  c.store.set_kind("memory");
  const CachedDataset before(d, transforms::make_chain(kLoad), c);
  const std::string key = before.key(0), other = before.key(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Volume second = read_nifti(r + "/imagesTr/case_000_0001.nii.gz");
  second.data = (second.data + 1).contiguous();
  write_nifti(r + "/imagesTr/case_000_0001.nii.gz", second);
  const CachedDataset after(d, transforms::make_chain(kLoad), c);
  EXPECT_NE(after.key(0), key);
  EXPECT_EQ(after.key(1), other);
}

TEST(DatasetLabels, PlainAndRegionLabelsAsNnunetWritesThem) {
  test::TempDir dir;
  const auto labels_of = [&](const std::string& text) {
    test::write_file(dir / "dataset.json", text);
    return list_labels(dir / "dataset.json");
  };
  const DatasetLabels plain = labels_of(R"({"labels": {"background": 0, "edema": 1, "tumor": 2}})");
  EXPECT_FALSE(plain.has_regions());
  EXPECT_EQ(plain.names, (std::map<std::int64_t, std::string>{{0, "background"}, {1, "edema"}, {2, "tumor"}}));
  EXPECT_EQ(labels_of(R"({"labels": {"0": "background", "1": "spleen"}})").names.at(1), "spleen");  // MSD's
  // Regions, in the order of "labels" (not sorted by name).
  const DatasetLabels r = labels_of(
      R"({"labels": {"background": 0, "whole tumor": [1, 2, 3], "tumor core": [2, 3], "enhancing tumor": [3]},
          "regions_class_order": [1, 2, 3]})");
  ASSERT_TRUE(r.has_regions());
  EXPECT_EQ(r.region_names, (std::vector<std::string>{"whole tumor", "tumor core", "enhancing tumor"}));
  EXPECT_EQ(r.regions, (std::vector<std::vector<std::int64_t>>{{1, 2, 3}, {2, 3}, {3}}));
  EXPECT_EQ(r.regions_class_order, (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(r.names.size(), 4u);  // the values a label file may hold: 0..3
  EXPECT_EQ(r.names.at(3), "enhancing tumor");
  // 1 and 2 are named by no label alone: stand-in names, and said to be so.
  EXPECT_EQ(r.names.at(1), "label 1");
  EXPECT_EQ(r.unnamed, (std::set<std::int64_t>{1, 2}));
  EXPECT_TRUE(plain.unnamed.empty());
  // What a region list lacks is said as such.
  const auto error = [&](const std::string& text) { return test::error_of<FormatError>([&] { labels_of(text); }); };
  EXPECT_TRUE(test::contains_all(error(R"({"labels": {"background": 0, "whole": [1, 2], "core": [2]}})"),
                                 {"defines regions", "no 'regions_class_order'"}));
  EXPECT_TRUE(test::contains_all(
      error(R"({"labels": {"background": 0, "whole": [1, 2], "core": [2]}, "regions_class_order": [1]})"),
      {"'regions_class_order' [1]", "expected 2", "whole, core"}));
  EXPECT_TRUE(test::contains_all(error(R"({"labels": {"background": 0, "whole": [1, "x"]}})"),
                                 {"\"whole\"", "a region lists label values"}));
  EXPECT_TRUE(test::contains_all(error(R"({"labels": {"background": 1, "a": 2}})"), {"background must be 0"}));
  EXPECT_TRUE(test::contains_all(error(R"({"labels": {"spleen": "one"}})"), {"or, for regions, to lists of values"}));
}

TEST(LabelToRegions, OneMaskPerRegionFromClassIndices) {
  const nlohmann::json spec =
      nlohmann::json::parse(R"([{"name": "LabelToRegions", "keys": ["label"], "regions": [[1, 2, 3], [2, 3], [3]]}])");
  const transforms::Compose chain = transforms::make_chain(spec);
  Sample s;
  Volume label;
  label.data = at::tensor({0, 1, 2, 3, 3, 0}, at::kFloat).view({1, 3, 2, 1});
  s.volumes["label"] = label;
  chain.apply(s);
  const at::Tensor out = s.volume("label").data;
  ASSERT_EQ(out.sizes(), (std::vector<std::int64_t>{3, 3, 2, 1}));
  EXPECT_EQ(out.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(out[0].flatten(), at::tensor({0, 1, 1, 1, 1, 0}, at::kByte)));
  EXPECT_TRUE(at::equal(out[1].flatten(), at::tensor({0, 0, 1, 1, 1, 0}, at::kByte)));
  EXPECT_TRUE(at::equal(out[2].flatten(), at::tensor({0, 0, 0, 1, 1, 0}, at::kByte)));
  // Its configuration (the cache key's) covers keys and regions.
  const nlohmann::json c = chain.config();
  EXPECT_EQ(c[0]["args"]["regions"], spec[0]["regions"]) << c.dump();
  EXPECT_EQ(c[0]["args"]["keys"], nlohmann::json({"label"})) << c.dump();
  // A region may be one label value (as nnU-Net's dataset.json writes "enhancing tumor": 3).
  EXPECT_NO_THROW(transforms::make_chain(
      nlohmann::json::parse(R"([{"name": "LabelToRegions", "keys": "label", "regions": [1, [2, 3]]}])")));
  // A label of several channels already is refused, saying what was expected.
  Sample two;
  label.data = at::zeros({2, 3, 2, 1});
  two.volumes["label"] = label;
  EXPECT_TRUE(test::contains_all(test::error_of<ValueError>([&] { chain.apply(two); }),
                                 {"LabelToRegions", "has 2 channels", "one channel [1, X, Y, Z]"}));
}

}  // namespace
}  // namespace medfast::data
