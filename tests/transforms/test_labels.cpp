// Label transforms (issue 54): LabelToRegions, ConvertToMultiChannelBasedOnBratsClasses,
// MapLabelValue; RandSpatialCrop's MONAI options; FgBgToIndices of a multi-channel label.
// MONAI's outputs were recorded by `tests/golden/make_transform_golden.py monai` into
// tests/reference/monai_label_transforms.json; a Task01-shaped item (four MRI channels,
// labels 0..3) then runs as region labels through the chain, the caches and the loader.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "medfast/cache/store.hpp"
#include "medfast/data/loader.hpp"
#include "medfast/transforms/indices.hpp"
#include "medfast/transforms/random.hpp"
#include "medfast/transforms/transform.hpp"
#include "test_util.hpp"

namespace medfast::transforms {
namespace {

at::ScalarType dtype_of(const std::string& name) {
  if (name == "bool") return at::kBool;
  return parse_dtype(name, "reference");
}

at::Tensor tensor_of(const nlohmann::json& a) {
  const auto values = a["values"].get<std::vector<double>>();
  return at::tensor(values, at::kDouble)
      .view(a["shape"].get<std::vector<std::int64_t>>())
      .to(dtype_of(a["dtype"].get<std::string>()));
}

nlohmann::json reference() {
  return nlohmann::json::parse(test::read_file(test::source_dir() + "/tests/reference/monai_label_transforms.json"));
}

Sample sample_of(const nlohmann::json& inputs) {
  Sample s;
  for (const auto& [key, a] : inputs.items()) s.volumes[key].data = tensor_of(a);
  return s;
}

TEST(MonaiLabelTransforms, DeterministicOnesEqualMonais) {
  const auto ref = reference();
  for (const char* name :
       {"brats", "map_label_value", "map_label_value_uint8_swap", "task01_regions", "fgbg_multichannel"}) {
    SCOPED_TRACE(name);
    const auto& c = ref.at(name);
    Sample s = sample_of(c["inputs"]);
    nlohmann::json args = c["args"];
    args.erase("name");
    make(c["args"]["name"], args)->apply(s);
    for (const auto& [key, want] : c["outputs"].items()) {
      const at::Tensor w = tensor_of(want);
      const at::Tensor got =
          key.find("_indices") != std::string::npos ? runs_to_indices(s.arrays.at(key)) : s.volume(key).data;
      ASSERT_EQ(got.sizes(), w.sizes()) << key;
      if (w.scalar_type() == at::kBool) {
        // MONAI's BraTS channels are bool; medfast's uint8 0/1 (labels.cpp says why).
        EXPECT_EQ(got.scalar_type(), at::kByte);
        EXPECT_TRUE(at::equal(got, w.to(at::kByte))) << key;
      } else {
        EXPECT_EQ(got.scalar_type(), key.find("_indices") != std::string::npos ? at::kLong : w.scalar_type()) << key;
        EXPECT_TRUE(at::equal(got, w)) << key;
      }
    }
  }
}

TEST(MonaiLabelTransforms, RandSpatialCropThatDrawsNothingEqualsMonais) {
  const auto ref = reference();
  for (const char* name : {"spatial_crop_center", "spatial_crop_center_odd", "spatial_crop_whole"}) {
    SCOPED_TRACE(name);
    const auto& c = ref.at(name);
    nlohmann::json args = c["args"];
    args.erase("name");
    const auto t = make_random("RandSpatialCrop", args);
    for (std::uint64_t seed : {1u, 2u, 3u}) {  // whatever the generator
      Sample s = sample_of(c["inputs"]);
      Rng rng(seed);
      t->apply(s, rng);
      EXPECT_TRUE(at::equal(s.volume("image").data.contiguous(), tensor_of(c["outputs"]["image"])));
    }
  }
}

TEST(LabelToRegions, RegionsAreWrittenAsListsAndCheckedByName) {
  // One value stands for a list of one; the key (and the cache's) does not depend on the form.
  const auto a = make("LabelToRegions", nlohmann::json::parse(R"({"regions": [[1, 2, 3], [2, 3], 3]})"));
  const auto b =
      make("LabelToRegions", nlohmann::json::parse(R"({"keys": "label", "regions": [[1, 2, 3], [2, 3], [3]]})"));
  EXPECT_EQ(a->config(), b->config());
  EXPECT_EQ(a->config(), nlohmann::json::parse(R"({"keys": ["label"], "regions": [[1, 2, 3], [2, 3], [3]]})"));
  EXPECT_NE(Compose({a}).hash(),
            Compose({make("LabelToRegions", nlohmann::json::parse(R"({"regions": [[1, 2], [2, 3], [3]]})"))}).hash());
  const auto message = [](const char* json) {
    return test::value_error_of([&] { make("LabelToRegions", nlohmann::json::parse(json)); });
  };
  EXPECT_TRUE(test::contains_all(message(R"({"keys": "label"})"), {"LabelToRegions", "regions", "required"}));
  EXPECT_TRUE(test::contains_all(message(R"({"regions": []})"), {"argument regions", "no regions"}));
  EXPECT_TRUE(test::contains_all(message(R"({"regions": [[1], []]})"), {"argument regions", "region 1 is empty"}));
  EXPECT_TRUE(
      test::contains_all(message(R"({"regions": [[1.5]]})"), {"argument regions", "1.5 is not a whole number"}));
  EXPECT_TRUE(test::contains_all(message(R"({"regions": [["a"]]})"), {"argument regions", "\"a\""}));
  // A label of several channels is no label of class values.
  Sample s;
  s.volumes["label"].data = at::zeros({2, 3, 3, 3}, at::kByte);
  EXPECT_TRUE(test::contains_all(test::value_error_of([&] { a->apply(s); }),
                                 {"LabelToRegions", "label", "2 channels", "one channel"}));
}

TEST(LabelToRegions, ValuesTheLabelTypeCannotHoldAreInNoRegion) {
  Sample s;
  s.volumes["label"].data = at::tensor({0, 1, 44, 255}, at::kByte).view({1, 4, 1, 1});
  make("LabelToRegions", nlohmann::json::parse(R"({"regions": [[300], [1, 255], 44]})"))->apply(s);
  EXPECT_TRUE(at::equal(s.volume("label").data.view({3, 4}),
                        at::tensor({0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0}, at::kByte).view({3, 4})));
}

TEST(MapLabelValue, MonaisChecksAndItsDefaultType) {
  EXPECT_TRUE(test::contains_all(
      test::value_error_of([] {
        make("MapLabelValue",
             nlohmann::json::parse(R"({"keys": "label", "orig_labels": [1, 2], "target_labels": [3]})"));
      }),
      {"MapLabelValue", "orig_labels", "target_labels", "same length", "2 and 1"}));
  EXPECT_TRUE(test::contains_all(
      test::value_error_of([] {
        make("MapLabelValue",
             nlohmann::json::parse(
                 R"({"keys": "label", "orig_labels": [1], "target_labels": [300], "dtype": "uint8"})"));
      }),
      {"MapLabelValue", "target_labels", "300", "uint8"}));
  const auto t =
      make("MapLabelValue", nlohmann::json::parse(R"({"keys": "label", "orig_labels": [1], "target_labels": [2]})"));
  EXPECT_EQ(t->config()["dtype"], "float32");
}

TEST(ConvertToMultiChannelBasedOnBratsClasses, TakesKeysOnly) {
  const auto t = make("ConvertToMultiChannelBasedOnBratsClasses", nlohmann::json::parse(R"({"keys": "label"})"));
  EXPECT_EQ(t->config(), nlohmann::json::parse(R"({"keys": ["label"]})"));
  // MONAI's argument, refused by name; not MONAI's: unknown.
  EXPECT_TRUE(test::contains_all(
      test::value_error_of([] {
        make("ConvertToMultiChannelBasedOnBratsClasses",
             nlohmann::json::parse(R"({"keys": "label", "allow_missing_keys": true})"));
      }),
      {"ConvertToMultiChannelBasedOnBratsClasses: MONAI's argument 'allow_missing_keys' is not supported by medfast"}));
  EXPECT_TRUE(test::contains_all(test::value_error_of([] {
                                   make("ConvertToMultiChannelBasedOnBratsClasses",
                                        nlohmann::json::parse(R"({"keys": "label", "regions": [1]})"));
                                 }),
                                 {"unknown argument 'regions'", "(known: keys)"}));
}

TEST(RandSpatialCropOptions, RandomSizeDrawsBetweenRoiAndMaxAndCentersWhereAsked) {
  Sample in;
  in.volumes["image"].data = at::arange(20 * 16 * 12, at::kFloat).view({1, 20, 16, 12});
  in.volumes["label"].data = (in.volumes["image"].data.fmod(5) == 0).to(at::kByte);
  const auto t = make_random(
      "RandSpatialCrop",
      nlohmann::json::parse(
          R"({"keys": ["image", "label"], "roi_size": [4, 5, -1], "max_roi_size": [8, 30, 0], "random_size": true})"));
  std::set<std::int64_t> sizes0, sizes1, starts0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    Sample s = in;
    Rng rng(seed);
    t->apply(s, rng);
    const auto shape = s.volume("image").shape();
    ASSERT_EQ(shape, s.volume("label").shape());
    EXPECT_GE(shape[1], 4);
    EXPECT_LE(shape[1], 8);
    EXPECT_GE(shape[2], 5);
    EXPECT_LE(shape[2], 16);  // drawn up to 30, cut to the image
    EXPECT_EQ(shape[3], 12);  // -1 and 0: the image's size
    sizes0.insert(shape[1]);
    sizes1.insert(shape[2]);
    const float first = s.volume("image").data.flatten()[0].item<float>();
    starts0.insert(static_cast<std::int64_t>(first) / (16 * 12));
    // The label is cut with the image.
    EXPECT_TRUE(at::equal(s.volume("label").data, (s.volume("image").data.fmod(5) == 0).to(at::kByte)));
  }
  EXPECT_EQ(sizes0.size(), 5u);  // 4..8
  EXPECT_GT(sizes1.size(), 8u);
  EXPECT_GT(starts0.size(), 5u);
  // random_center false: at the centre whatever the size drawn.
  const auto centred =
      make_random("RandSpatialCrop",
                  nlohmann::json::parse(R"({"keys": "image", "roi_size": [6, 16, 12], "random_center": false})"));
  Sample s = in;
  Rng rng(5);
  centred->apply(s, rng);
  EXPECT_TRUE(at::equal(s.volume("image").data, in.volumes["image"].data.narrow(1, 7, 6)));
  // min larger than max: MONAI's error, with both sizes.
  const auto bad = make_random(
      "RandSpatialCrop",
      nlohmann::json::parse(R"({"keys": "image", "roi_size": [10, 4, 4], "max_roi_size": 8, "random_size": true})"));
  EXPECT_TRUE(test::contains_all(test::value_error_of([&] {
                                   Sample b = in;
                                   Rng r(1);
                                   bad->apply(b, r);
                                 }),
                                 {"RandSpatialCrop", "min ROI size 10x4x4", "larger than max ROI size 8x8x8"}));
  EXPECT_TRUE(test::contains_all(
      test::value_error_of([] {
        make_random("RandSpatialCrop",
                    nlohmann::json::parse(R"({"keys": "image", "roi_size": 4, "max_roi_size": [8, 8]})"));
      }),
      {"RandSpatialCrop", "max_roi_size"}));
  // The defaults are MONAI 1.3.2's (random_size false: a fixed size), written back.
  nlohmann::json args;
  make_random("RandSpatialCrop", nlohmann::json::parse(R"({"keys": "image", "roi_size": 4})"), &args);
  EXPECT_EQ(args["random_size"], false);
  EXPECT_EQ(args["random_center"], true);
}

// A Task01-shaped item (MSD BrainTumour: four MRI channels, labels 0 background, 1 edema,
// 2 non-enhancing tumour, 3 enhancing tumour) through a chain with LabelToRegions (the MONAI
// tutorial's TC, WT, ET), the caches (memory and disk), a random crop and flip, and the loader.
Sample task01_item(std::size_t i) {
  Sample s;
  const auto grid = at::meshgrid({at::arange(24, at::kFloat), at::arange(22, at::kFloat), at::arange(18, at::kFloat)});
  const at::Tensor r2 = (grid[0] - 12).pow(2) + (grid[1] - 11).pow(2) + (grid[2] - 9).pow(2);
  at::Tensor label = at::zeros({24, 22, 18}, at::kByte);
  label.masked_fill_(r2 < 36, 1).masked_fill_(r2 < 16, 2).masked_fill_(r2 < 4, 3);
  label.masked_fill_((grid[0] < 2) | (grid[0] > 21), 0);
  Volume image;
  image.data = at::stack({grid[0] + static_cast<float>(i), grid[1] * 2, grid[2] * 3, r2}) + 1;  // > 0: all body
  image.affine.m = {{{-1, 0, 0, 10}, {0, -1, 0, 20}, {0, 0, 1, -5}, {0, 0, 0, 1}}};  // LPS: Orientation turns it
  Volume lab = image;
  lab.data = label.unsqueeze(0);
  s.volumes["image"] = image;
  s.volumes["label"] = lab;
  s.meta = {{"image", "case_" + std::to_string(i)}, {"index", i}};
  return s;
}

const char* kTask01Chain = R"([
  {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"},
  {"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.0, 1.0, 1.0], "mode": ["bilinear", "nearest"]},
  {"name": "NormalizeIntensity", "keys": "image", "nonzero": true, "channel_wise": true},
  {"name": "CropForeground", "keys": ["image", "label"], "source_key": "label"},
  {"name": "FgBgToIndices", "keys": "label"},
  {"name": "LabelToRegions", "keys": ["label"], "regions": [[2, 3], [1, 2, 3], [2]]}])";

TEST(Task01Regions, RegionLabelsFlowThroughTheChainTheCachesAndTheLoader) {
  const Compose det = make_chain(nlohmann::json::parse(kTask01Chain));
  Sample s = task01_item(0);
  const at::Tensor before = s.volumes["label"].data[0].flip({0, 1});  // as Orientation(RAS) turns LPS
  det.apply(s);
  const at::Tensor regions = s.volume("label").data;
  ASSERT_EQ(regions.dim(), 4);
  EXPECT_EQ(regions.size(0), 3);
  EXPECT_EQ(regions.scalar_type(), at::kByte);
  EXPECT_EQ(s.volume("image").data.size(0), 4);
  EXPECT_EQ(regions.sizes().slice(1), s.volume("image").data.sizes().slice(1));
  // CropForeground on the label: the box of labels 1..3 (a ball of radius 5 voxels).
  EXPECT_EQ(regions.sizes().vec(), (std::vector<std::int64_t>{3, 11, 11, 11}));
  const at::Tensor lo = (before > 0).nonzero().amin(0);
  const at::Tensor cropped = before.narrow(0, lo[0].item<std::int64_t>(), 11)
                                 .narrow(1, lo[1].item<std::int64_t>(), 11)
                                 .narrow(2, lo[2].item<std::int64_t>(), 11);
  EXPECT_TRUE(at::equal(regions[0], ((cropped == 2) | (cropped == 3)).to(at::kByte)));  // TC
  EXPECT_TRUE(at::equal(regions[1], (cropped > 0).to(at::kByte)));                      // WT
  EXPECT_TRUE(at::equal(regions[2], (cropped == 2).to(at::kByte)));                     // ET
  // The indices came from the class label, before the regions: foreground = WT.
  EXPECT_EQ(runs_count(s.arrays.at("label_fg_indices")), regions[1].sum().item<std::int64_t>());

  // The caches keep the regions as they are.
  test::TempDir dir;
  for (const char* kind : {"memory", "disk"}) {
    auto store = cache::make_store(cache::StoreOptions().set_kind(kind).set_dir(dir / kind));
    store->put(det.hash(), s);
    const auto back = store->get(det.hash());
    ASSERT_TRUE(back.has_value()) << kind;
    EXPECT_TRUE(at::equal(back->volume("label").data, regions)) << kind;
    EXPECT_EQ(back->volume("label").data.scalar_type(), at::kByte) << kind;
    EXPECT_EQ(runs_count(back->arrays.at("label_fg_indices")), runs_count(s.arrays.at("label_fg_indices"))) << kind;
  }

  // Random crops (by label, then spatial) and flips, batched by the loader.
  const auto random = nlohmann::json::parse(R"([
    {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "label_key": "label", "spatial_size": [8, 8, 8],
     "fg_indices_key": "label_fg_indices", "bg_indices_key": "label_bg_indices", "num_samples": 2},
    {"name": "RandSpatialCrop", "keys": ["image", "label"], "roi_size": [6, 6, 6], "random_size": false},
    {"name": "RandFlip", "keys": ["image", "label"], "prob": 0.5, "spatial_axis": 0},
    {"name": "RandFlip", "keys": ["image", "label"], "prob": 0.5, "spatial_axis": 2}])");
  data::LoaderOptions o;
  o.threads = 2;
  o.batch_size = 2;
  data::Loader loader(
      3,
      [&](std::size_t i) {
        Sample item = task01_item(i);
        det.apply(item);
        return item;
      },
      make_random_chain(random, 3), o);
  loader.start(0);
  std::size_t batches = 0;
  while (auto b = loader.next()) {
    ++batches;
    const at::Tensor lab = b->tensors.at("label");
    const at::Tensor img = b->tensors.at("image");
    ASSERT_EQ(lab.size(1), 3);
    EXPECT_EQ(lab.sizes().slice(2), (at::IntArrayRef{6, 6, 6}));
    EXPECT_EQ(img.sizes().slice(1), (at::IntArrayRef{4, 6, 6, 6}));
    EXPECT_EQ(lab.scalar_type(), at::kByte);
    EXPECT_LE(lab.max().item<int>(), 1);
    // Nested regions stay nested through crops and flips: ET and TC within WT.
    EXPECT_TRUE(at::equal(lab.select(1, 0) & lab.select(1, 1), lab.select(1, 0)));
    EXPECT_TRUE(at::equal(lab.select(1, 2) & lab.select(1, 0), lab.select(1, 2)));
  }
  EXPECT_EQ(batches, 2u);
}

// Regions made first (as MONAI's BraTS tutorial converts right after loading) or last give the
// same labels, geometry and indices: nearest resampling and crops move voxels, and the regions
// are a function of each voxel's value.
TEST(Task01Regions, RegionsBeforeOrAfterResamplingAreTheSame) {
  const auto steps = nlohmann::json::parse(R"([
    {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"},
    {"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.5, 1.3, 1.7], "mode": ["bilinear", "nearest"]},
    {"name": "CropForeground", "keys": ["image", "label"], "source_key": "label", "margin": 1},
    {"name": "FgBgToIndices", "keys": "label", "image_key": "image"}])");
  const auto regions = nlohmann::json::parse(R"({"name": "LabelToRegions", "regions": [[2, 3], [1, 2, 3], [2]]})");
  auto first = steps, last = steps;
  first.insert(first.begin(), regions);
  last.push_back(regions);
  Sample a = task01_item(1), b = task01_item(1);
  make_chain(first).apply(a);
  make_chain(last).apply(b);
  EXPECT_EQ(a.volume("label").shape()[0], 3);
  EXPECT_GT(a.volume("label").data.sum().item<std::int64_t>(), 0);
  EXPECT_TRUE(at::equal(a.volume("label").data, b.volume("label").data));
  EXPECT_TRUE(at::equal(a.volume("image").data, b.volume("image").data));
  EXPECT_LT(a.volume("label").affine.max_abs_diff(b.volume("label").affine), 1e-12);
  for (const char* k : {"label_fg_indices", "label_bg_indices"}) {
    EXPECT_TRUE(at::equal(runs_to_indices(a.arrays.at(k)), runs_to_indices(b.arrays.at(k)))) << k;
  }
}

// FgBgToIndices of a multi-channel label is MONAI's: channels 1.. (channel 0 is one-hot
// background to MONAI), the same in the native and the libtorch paths.
TEST(Task01Regions, IndicesOfSeveralChannelsLeaveChannelZeroOutAsMonai) {
  Sample s;
  at::Tensor lab = at::zeros({3, 4, 4, 4}, at::kByte);
  lab[0].fill_(1);      // "background": ignored
  lab[1][1][1][1] = 1;  // flat 21
  lab[2][3][3][3] = 1;  // flat 63
  s.volumes["label"].data = lab;
  const auto t = make("FgBgToIndices", nlohmann::json::parse(R"({"keys": "label"})"));
  for (bool native : {true, false}) {
    set_native_kernels_enabled(native);
    Sample c = s;
    t->apply(c);
    EXPECT_TRUE(at::equal(runs_to_indices(c.arrays.at("label_fg_indices")), at::tensor({21, 63}, at::kLong))) << native;
    EXPECT_EQ(runs_count(c.arrays.at("label_bg_indices")), 62) << native;
  }
  set_native_kernels_enabled(true);
}

}  // namespace
}  // namespace medfast::transforms
