// Deterministic transforms: MONAI 1.3 geometry (tests/reference, measured with MONAI 1.3.2), values
// against tests/golden/make_transform_golden.py (nibabel, numpy, scipy), and
// the chain's arguments and hash.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include <thread>

#include <cstring>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/transforms/indices.hpp"
#include "medfast/transforms/intensity.hpp"
#include "medfast/transforms/spatial.hpp"
#include "test_util.hpp"

namespace medfast::transforms {
namespace {

Affine affine_of(const nlohmann::json& rows) {
  Affine a;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) a(i, j) = rows[i][j].get<double>();
  return a;
}

// The reference rounds to 6 decimals.
void expect_affine_near(const Affine& got, const Affine& want, double tol) {
  EXPECT_LE(got.max_abs_diff(want), tol) << "got\n" << got.to_string(6) << "\nwant\n" << want.to_string(6);
}

TEST(TransformsGolden, MonaiGeometryOfOrientationAndSpacing) {
  const std::string path = test::source_dir() + "/tests/reference/monai_geometry.json";
  const std::string text = test::read_file(path);
  ASSERT_FALSE(text.empty()) << "missing " << path;
  const auto ref = nlohmann::json::parse(text);
  ASSERT_GE(ref["cases"].size(), 7u);
  for (const auto& c : ref["cases"]) {
    const auto in_shape = c["input_shape"].get<std::vector<std::int64_t>>();
    SCOPED_TRACE(c["input_shape"].dump() + " " + c["input_affine"].dump());
    const auto plan = orientation_plan({in_shape[0], in_shape[1], in_shape[2]}, affine_of(c["input_affine"]), "RAS");
    const auto& o = c["after_orientation_RAS"];
    EXPECT_EQ(std::vector<std::int64_t>(plan.shape.begin(), plan.shape.end()), o["shape"].get<std::vector<std::int64_t>>());
    expect_affine_near(plan.affine, affine_of(o["affine"]), 2e-6);
    const auto pix = c["pixdim"].get<std::vector<double>>();
    const Geometry g = spacing_geometry(plan.shape, plan.affine, {pix[0], pix[1], pix[2]});
    const auto& s = c["after_spacing"];
    EXPECT_EQ(std::vector<std::int64_t>(g.shape.begin(), g.shape.end()), s["shape"].get<std::vector<std::int64_t>>());
    expect_affine_near(g.affine, affine_of(s["affine"]), 2e-6);
  }
}

TEST(TransformsGolden, TransformsApplyTheSameGeometryToData) {
  // The transforms themselves (not only the planning functions) on a MONAI case.
  Sample s;
  Volume v;
  v.data = at::arange(100 * 120 * 60, at::kFloat).view({1, 100, 120, 60});
  v.affine.m = {{{0.9, 0, 0, -200}, {0, -1.1, 0, 150}, {0, 0, -3.0, -80}, {0, 0, 0, 1}}};
  s.volumes["image"] = v;
  make_chain(nlohmann::json::parse(R"([{"name": "Orientation", "keys": "image", "axcodes": "RAS"},
                                       {"name": "Spacing", "keys": "image", "pixdim": [1.5, 1.5, 2.0]}])"))
      .apply(s);
  EXPECT_EQ(s.volume("image").shape(), (std::vector<std::int64_t>{1, 60, 88, 90}));
  Affine want;
  want.m = {{{1.5, 0, 0, -200}, {0, 1.5, 0, 19.1}, {0, 0, 2.0, -257}, {0, 0, 0, 1}}};
  expect_affine_near(s.volume("image").affine, want, 1e-9);
}

// Stage-by-stage values from the Python reference.
class TransformValues : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    const auto r = test::run(test::python() + " " + test::source_dir() + "/tests/golden/make_transform_golden.py " +
                             dir_->path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    manifest_ = nlohmann::json::parse(test::read_file(*dir_ / "manifest.json"));
  }
  static void TearDownTestSuite() { delete dir_; }

  static at::Tensor stage(const std::string& name) {
    const auto& m = manifest_[name];
    const std::string bytes = test::read_file(*dir_ / m["file"].get<std::string>());
    const std::string dt = m["dtype"];
    const at::ScalarType t = dt == "float32" ? at::kFloat : dt == "uint8" ? at::kByte : at::kLong;
    at::Tensor out = at::empty(m["shape"].get<std::vector<std::int64_t>>(), t);
    EXPECT_EQ(bytes.size(), static_cast<std::size_t>(out.numel() * out.element_size()));
    std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
    return out;
  }
  static Affine stage_affine(const std::string& name) { return affine_of(manifest_[name]["affine"]); }

  static test::TempDir* dir_;
  static nlohmann::json manifest_;
};
test::TempDir* TransformValues::dir_ = nullptr;
nlohmann::json TransformValues::manifest_;

TEST_F(TransformValues, SpleenChainMatchesTheReferenceAtEveryStage) {
  const auto chain = make_chain(nlohmann::json::parse(test::spleen_chain_json()));
  ASSERT_EQ(chain.size(), 7u);
  Sample s;
  s.meta = {{"image", *dir_ / "image.nii.gz"}, {"label", *dir_ / "label.nii.gz"}};
  const auto& t = chain.transforms();
  for (int i = 0; i < 3; ++i) t[i]->apply(s);
  EXPECT_TRUE(at::equal(s.volume("image").data, stage("orient_image")));
  EXPECT_TRUE(at::equal(s.volume("label").data, stage("orient_label")));
  EXPECT_EQ(s.volume("label").data.scalar_type(), at::kByte);  // dtype "" keeps the file's type
  expect_affine_near(s.volume("image").affine, stage_affine("orient_image"), 1e-9);

  t[3]->apply(s);
  EXPECT_EQ(s.volume("image").shape(), stage("spacing_image").sizes().vec());
  EXPECT_LT((s.volume("image").data - stage("spacing_image")).abs().max().item<double>(), 2e-3);  // HU scale
  EXPECT_TRUE(at::equal(s.volume("label").data, stage("spacing_label")));
  expect_affine_near(s.volume("image").affine, stage_affine("spacing_image"), 1e-9);
  expect_affine_near(s.volume("label").affine, stage_affine("spacing_label"), 1e-9);

  t[4]->apply(s);
  EXPECT_LT((s.volume("image").data - stage("scale_image")).abs().max().item<double>(), 1e-5);

  t[5]->apply(s);
  EXPECT_EQ(s.volume("image").shape(), stage("crop_image").sizes().vec());
  EXPECT_LT((s.volume("image").data - stage("crop_image")).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(at::equal(s.volume("label").data, stage("crop_label")));
  expect_affine_near(s.volume("image").affine, stage_affine("crop_image"), 1e-9);

  {
    Sample n = s;
    make_normalize_intensity({{"image"}, true, false})->apply(n);
    EXPECT_LT((n.volume("image").data - stage("normalize_image")).abs().max().item<double>(), 1e-4);
    Sample r = s;
    make_resize_with_pad_or_crop({{"image"}, {24, 12, 25}, 0.0})->apply(r);
    EXPECT_EQ(r.volume("image").shape(), stage("resize_image").sizes().vec());
    // Pure pad/crop of the cropped image, which matches the reference within interpolation rounding.
    EXPECT_LT((r.volume("image").data - stage("resize_image")).abs().max().item<double>(), 1e-5);
  }

  t[6]->apply(s);
  EXPECT_TRUE(at::equal(runs_to_indices(s.arrays.at("label_fg_indices")), stage("fg_indices")));
  EXPECT_TRUE(at::equal(runs_to_indices(s.arrays.at("label_bg_indices")), stage("bg_indices")));
}

TEST_F(TransformValues, LibtorchOpPathsUsedForCudaGiveTheSameResults) {
  // The chain through native CPU kernels and through the libtorch-op paths
  // that CUDA/ROCm tensors take (forced here on CPU) must agree.
  const auto chain = make_chain(nlohmann::json::parse(test::spleen_chain_json()));
  Sample native, ops;
  native.meta = ops.meta = {{"image", *dir_ / "image.nii.gz"}, {"label", *dir_ / "label.nii.gz"}};
  chain.apply(native);
  set_native_kernels_enabled(false);
  try {
    chain.apply(ops);
  } catch (...) {
    set_native_kernels_enabled(true);
    throw;
  }
  set_native_kernels_enabled(true);
  for (const auto* key : {"image", "label"}) {
    EXPECT_EQ(native.volume(key).shape(), ops.volume(key).shape()) << key;
    EXPECT_LT((native.volume(key).data.to(at::kDouble) - ops.volume(key).data.to(at::kDouble)).abs().max().item<double>(),
              1e-5)
        << key;
    EXPECT_EQ(native.volume(key).affine.max_abs_diff(ops.volume(key).affine), 0.0) << key;
  }
  for (const auto& [k, runs] : native.arrays) EXPECT_TRUE(at::equal(runs, ops.arrays.at(k))) << k;
}

TEST(Transforms, ObliqueSpacingUsesTheGeneralResamplerConsistently) {
  // A rotated grid resampled onto itself at the same spacing returns the input.
  const double a = 0.3;
  Affine rot;
  rot.m = {{{std::cos(a), -std::sin(a), 0, 5}, {std::sin(a), std::cos(a), 0, -3}, {0, 0, 1, 2}, {0, 0, 0, 1}}};
  Affine scale;
  scale.m = {{{1.5, 0, 0, 0}, {0, 1.5, 0, 0}, {0, 0, 2, 0}, {0, 0, 0, 1}}};
  const Affine affine = rot * scale;
  const at::Tensor data = at::rand({2, 12, 10, 8});
  const Geometry g = spacing_geometry({12, 10, 8}, affine, {1.5, 1.5, 2});
  EXPECT_EQ(g.shape, (Shape3{12, 10, 8}));
  EXPECT_LT(g.affine.max_abs_diff(affine), 1e-12);
  EXPECT_LT((resample(data, affine, g, false) - data).abs().max().item<double>(), 1e-5);
  const at::Tensor labels = at::randint(0, 4, {1, 12, 10, 8}, at::kByte);
  EXPECT_TRUE(at::equal(resample(labels, affine, g, true), labels));
}

// Orientation then Spacing run as one resampling that reads through the orientation's flips
// and axis order: the same values (bit for bit), affines and layouts as one after the other,
// for flipped and permuted inputs, int16 images (linear: float output), uint8 labels
// (nearest), an oblique affine (the general resampler) and key sets that differ.
TEST(Transforms, FusedOrientationSpacingEqualsOneAfterTheOther) {
  const std::vector<std::vector<std::vector<double>>> affines = {
      {{-0.8, 0, 0, 200}, {0, -0.8, 0, 180}, {0, 0, 5, -80}},        // LPS (CT from DICOM)
      {{0, 0, 2.5, -40}, {-1.1, 0, 0, 90}, {0, 0.9, 0, -60}},        // axes permuted and flipped
      {{1.2, 0, 0, 0}, {0, 1.2, 0, 0}, {0, 0, 3, 0}},                 // already RAS
      {{0.9, -0.2, 0, 3}, {0.2, 0.9, 0, 1}, {0, 0, 2.2, -7}}};        // oblique
  const std::string chain = R"([
      {"name": "Orientation", "keys": ["image", "label", "extra"], "axcodes": "RAS"},
      {"name": "Spacing", "keys": ["image", "label", "other"], "pixdim": [1.5, 1.5, 2.0],
       "mode": ["bilinear", "nearest", "bilinear"]}])";
  for (std::size_t a = 0; a < affines.size(); ++a) {
    Sample in;
    Affine aff;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) aff(i, j) = affines[a][static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
    auto volume = [&](at::Tensor data) {
      Volume v;
      v.data = data;
      v.affine = aff;
      return v;
    };
    in.volumes["image"] = volume(at::randint(-1000, 1000, {1, 41, 37, 17}, at::kShort));
    in.volumes["label"] = volume(at::randint(0, 3, {1, 41, 37, 17}, at::kByte));
    in.volumes["extra"] = volume(at::rand({2, 41, 37, 17}));
    in.volumes["other"] = volume(at::rand({1, 41, 37, 17}).permute({0, 3, 2, 1}).contiguous().permute({0, 3, 2, 1}));
    Compose fused = make_chain(nlohmann::json::parse(chain)), steps = make_chain(nlohmann::json::parse(chain));
    steps.set_fuse(false);
    Sample x = in, y = in;
    fused.apply(x);
    steps.apply(y);
    for (const auto& [key, v] : y.volumes) {
      SCOPED_TRACE(str("affine ", a, " key ", key));
      const Volume& f = x.volume(key);
      ASSERT_EQ(f.data.sizes(), v.data.sizes());
      EXPECT_EQ(f.data.scalar_type(), v.data.scalar_type());
      EXPECT_EQ(f.data.strides(), v.data.strides());
      EXPECT_TRUE(at::equal(f.data, v.data));
      EXPECT_EQ(f.affine.max_abs_diff(v.affine), 0.0);
    }
  }
}

// The hook itself: Orientation fuses with a Spacing after it, with nothing else, and
// nothing fuses with what follows it by default.
TEST(Transforms, OnlyOrientationThenSpacingFuse) {
  const auto t = [](const char* text) { return make_chain(nlohmann::json::parse(text)).transforms(); };
  const auto chain = t(R"([{"name": "Orientation", "keys": ["image"], "axcodes": "RAS"},
                           {"name": "Spacing", "keys": ["image"], "pixdim": [2, 2, 2]},
                           {"name": "ScaleIntensityRange", "keys": ["image"], "a_min": 0, "a_max": 1}])");
  Sample s;
  Volume v;
  v.data = at::rand({1, 8, 8, 8});
  s.volumes["image"] = v;
  Sample untouched = s;
  EXPECT_FALSE(chain[1]->apply_with_next(*chain[0], s));  // Spacing then Orientation
  EXPECT_FALSE(chain[0]->apply_with_next(*chain[2], s));  // Orientation then an intensity step
  EXPECT_FALSE(chain[2]->apply_with_next(*chain[1], s));
  EXPECT_TRUE(at::equal(s.volume("image").data, untouched.volume("image").data)) << "a refused fusion changed the sample";
  ASSERT_TRUE(chain[0]->apply_with_next(*chain[1], s));
  EXPECT_EQ(s.volume("image").data.sizes(), (at::IntArrayRef{1, 4, 4, 4}));  // 8 voxels of 1 mm at 2 mm
}

// An affine with absurd spacings: the output size is checked against max_volume_bytes
// before anything is allocated, and many voxels collapsing into one is refused; both
// errors name the transform, the input spacing and the output shape.
TEST(Transforms, SpacingChecksItsOutputSizeBeforeAllocating) {
  auto sample_with_spacing = [](double mm) {
    Sample s;
    Volume v;
    v.data = at::rand({1, 20, 20, 10});
    v.affine.m = {{{mm, 0, 0, 0}, {0, mm, 0, 0}, {0, 0, mm, 0}, {0, 0, 0, 1}}};
    s.volumes["image"] = v;
    return s;
  };
  const auto spacing = make_spacing({{"image"}, {1.5, 1.5, 2.0}, {Interp::bilinear}});
  Sample huge = sample_with_spacing(1e9);
  const std::string big = test::value_error_of([&] { spacing->apply(huge); });
  for (const char* part : {"Spacing", "key image", "input spacing (1e+09, 1e+09, 1e+09)", "output of shape",
                           "max_volume_bytes"}) {
    EXPECT_NE(big.find(part), std::string::npos) << "'" << part << "' missing in: " << big;
  }
  Sample tiny = sample_with_spacing(1e-6);
  const std::string small = test::value_error_of([&] { spacing->apply(tiny); });
  for (const char* part : {"Spacing", "input spacing (1e-06, 1e-06, 1e-06)", "collapses axis 0's 20 voxels into 1",
                           "output shape [1, 1, 1]"}) {
    EXPECT_NE(small.find(part), std::string::npos) << "'" << part << "' missing in: " << small;
  }
  // The limit is the chain's max_volume_bytes: a plausible output over a small limit is refused too.
  Sample normal = sample_with_spacing(1.0);
  {
    OutputLimit limit(1000);
    EXPECT_EQ(max_output_bytes(), 1000u);
    EXPECT_THROW(spacing->apply(normal), ValueError);
    EXPECT_THROW(make_resize_with_pad_or_crop({{"image"}, {64, 64, 64}, 0.0})->apply(normal), ValueError);
  }
  EXPECT_EQ(max_output_bytes(), kDefaultMaxVolumeBytes);
  EXPECT_NO_THROW(spacing->apply(normal));
  Compose limited({spacing});
  limited.set_max_output_bytes(1000);
  Sample again = sample_with_spacing(1.0);
  EXPECT_THROW(limited.apply(again), ValueError);
  EXPECT_EQ(max_output_bytes(), kDefaultMaxVolumeBytes);  // restored after the error too
  // Another thread has its own limit: the default, whatever this one's chain runs with.
  OutputLimit here(1000);
  std::uint64_t there = 0;
  std::thread([&] { there = max_output_bytes(); }).join();
  EXPECT_EQ(there, kDefaultMaxVolumeBytes);
}

TEST(Transforms, ResizeWithPadOrCropCentresLikeMonai) {
  Sample s;
  Volume v;
  v.data = at::arange(8 * 5 * 3, at::kFloat).view({1, 8, 5, 3});
  s.volumes["image"] = v;
  make_resize_with_pad_or_crop({{"image"}, {5, 8, 3}, 0.0})->apply(s);
  const Volume& out = s.volume("image");
  EXPECT_EQ(out.shape(), (std::vector<std::int64_t>{1, 5, 8, 3}));
  // x: 8 -> 5 crops from 8/2 - 5/2 = 2; y: 5 -> 8 pads 1 before, 2 after.
  EXPECT_EQ(out.affine(0, 3), 2);
  EXPECT_EQ(out.affine(1, 3), -1);
  EXPECT_EQ(out.data[0][0][1][0].item<float>(), v.data[0][2][0][0].item<float>());
  EXPECT_EQ(out.data[0][0][0][0].item<float>(), 0.0f);
  EXPECT_EQ(out.data[0][0][7][0].item<float>(), 0.0f);
  // MONAI's mode: constant is what it does; another mode is an error, not ignored.
  EXPECT_NO_THROW(make("ResizeWithPadOrCrop", nlohmann::json::parse(R"({"keys": "image", "spatial_size": 4, "mode": "constant"})")));
  EXPECT_VALUE_ERROR(make("ResizeWithPadOrCrop", nlohmann::json::parse(R"({"keys": "image", "spatial_size": 4, "mode": "edge"})")),
                     "mode: 'edge' is not supported");
}

TEST(Transforms, SpatialPadPadsSymmetricallyLikeMonai) {
  Sample s;
  Volume v;
  v.data = at::arange(8 * 5 * 3, at::kFloat).view({1, 8, 5, 3}) + 1;
  s.volumes["image"] = v;
  make_spatial_pad({{"image"}, {6, 8, 6}, -1.0})->apply(s);
  const Volume& out = s.volume("image");
  // x: 8 >= 6 stays; y: 5 -> 8 pads 1 before, 2 after (MONAI: extra // 2 first); z: 3 -> 6, 1 and 2.
  EXPECT_EQ(out.shape(), (std::vector<std::int64_t>{1, 8, 8, 6}));
  EXPECT_EQ(out.affine(0, 3), 0);
  EXPECT_EQ(out.affine(1, 3), -1);
  EXPECT_EQ(out.affine(2, 3), -1);
  EXPECT_TRUE(out.data.narrow(2, 1, 5).narrow(3, 1, 3).equal(v.data));
  EXPECT_EQ(out.data.eq(-1).sum().item<std::int64_t>(), 8 * 8 * 6 - 8 * 5 * 3);
  // Already large enough: unchanged, the same tensor.
  Sample big;
  big.volumes["image"] = v;
  make_spatial_pad({{"image"}, {4, 4, 3}, 0.0})->apply(big);
  EXPECT_TRUE(big.volume("image").data.is_same(v.data));
  EXPECT_VALUE_ERROR(make("SpatialPad", nlohmann::json::parse(R"({"keys": "image", "spatial_size": 4, "mode": "edge"})")),
                     "mode: 'edge' is not supported");
  EXPECT_VALUE_ERROR(make("SpatialPad", nlohmann::json::parse(R"({"keys": "image", "spatial_size": 4, "method": "end"})")),
                     "method: 'end' is not supported");
}

TEST(Transforms, CropForegroundToTheNonzeroRegion) {
  Sample s;
  Volume v;
  v.data = at::zeros({2, 10, 8, 6});
  v.data[0][2][3][1] = -5;  // negative: not above the threshold, but nonzero
  v.data[1][7][5][4] = 3;   // another channel
  s.volumes["image"] = v;
  make("CropForeground", nlohmann::json::parse(R"({"keys": "image", "source_key": "image", "nonzero": true})"))->apply(s);
  EXPECT_EQ(s.volume("image").shape(), (std::vector<std::int64_t>{2, 6, 3, 4}));  // x 2..7, y 3..5, z 1..4
  EXPECT_EQ(s.volume("image").affine(0, 3), 2);
  Sample t;
  t.volumes["image"] = v;
  make("CropForeground", nlohmann::json::parse(R"({"keys": "image", "source_key": "image"})"))->apply(t);
  EXPECT_EQ(t.volume("image").shape(), (std::vector<std::int64_t>{2, 1, 1, 1}));  // MONAI's x > 0 only
  // On: in the chain's config (its cache key); off: absent, as in earlier versions.
  const auto on = make("CropForeground", nlohmann::json::parse(R"({"keys": "image", "source_key": "image", "nonzero": true})"));
  const auto off = make("CropForeground", nlohmann::json::parse(R"({"keys": "image", "source_key": "image"})"));
  EXPECT_EQ(on->config()["nonzero"], true);
  EXPECT_FALSE(off->config().contains("nonzero"));
}

TEST(Transforms, NormalizeIntensityMatchesTheFormula) {
  Sample s;
  Volume v;
  v.data = at::tensor({0.f, 2.f, 4.f, 0.f, 6.f}).view({1, 5, 1, 1});
  s.volumes["image"] = v;
  make_normalize_intensity({{"image"}, true, false})->apply(s);
  const at::Tensor x = s.volume("image").data.view({-1});
  // nonzero: mean 4, population std sqrt(8/3); zeros untouched.
  const double sd = std::sqrt(8.0 / 3.0);
  EXPECT_NEAR(x[1].item<double>(), (2 - 4) / sd, 1e-6);
  EXPECT_NEAR(x[4].item<double>(), (6 - 4) / sd, 1e-6);
  EXPECT_EQ(x[0].item<double>(), 0.0);
}

TEST(Transforms, RunsHoldTheIndicesCompactly) {
  const at::Tensor mask = at::tensor({0, 1, 1, 0, 1, 0, 0, 1, 1, 1}, at::kByte).to(at::kBool);
  const at::Tensor runs = mask_to_runs(mask);
  EXPECT_EQ(runs.size(0), 3);
  EXPECT_EQ(runs_count(runs), 6);
  EXPECT_TRUE(at::equal(runs_to_indices(runs), at::tensor({1, 2, 4, 7, 8, 9}, at::kLong)));
  EXPECT_EQ(runs_index(runs, 0), 1);
  EXPECT_EQ(runs_index(runs, 2), 4);
  EXPECT_EQ(runs_index(runs, 5), 9);
  EXPECT_THROW(runs_index(runs, 6), ValueError);
  EXPECT_EQ(mask_to_runs(at::zeros({5}, at::kBool)).size(0), 0);
}

TEST(Transforms, BadArgumentsNameTheTransformAndArgument) {
  auto expect_error = [](const char* json, const std::vector<std::string>& parts) {
    SCOPED_TRACE(json);
    EXPECT_TRUE(test::contains_all(test::value_error_of([&] { make_chain(nlohmann::json::parse(json)); }), parts));
  };
  expect_error(R"([{"name": "Spacing", "keys": "image", "pixdims": [1, 1, 1]}])", {"Spacing", "pixdims"});
  expect_error(R"([{"name": "Spacing", "keys": "image", "pixdim": [1, 1]}])", {"Spacing", "pixdim"});
  expect_error(R"([{"name": "Spacing", "keys": "image", "pixdim": 1, "mode": "cubic"}])", {"cubic"});
  expect_error(R"([{"name": "Orientation", "keys": "image", "axcodes": "RAX"}])", {"Orientation", "RAX"});
  expect_error(R"([{"name": "Rotate90", "keys": "image"}])", {"unknown transform", "Rotate90"});
  expect_error(R"([{"name": "ScaleIntensityRange"}])", {"ScaleIntensityRange", "keys"});
  expect_error(R"([{"name": "CastToType", "keys": "image", "dtype": "complex"}])", {"complex"});
  expect_error(R"([{"name": "Orientation", "keys": "image"}, {"keys": "image"}])", {"item 1"});
  // A missing key at apply time names the transform and the key.
  const auto chain = make_chain(nlohmann::json::parse(R"([{"name": "Orientation", "keys": "label"}])"));
  Sample s;
  const std::string m = test::error_of<Error>([&] { chain.apply(s); });
  EXPECT_TRUE(test::contains_all(m, {"Orientation", "label"}));
}

// The chain's config is the cache's key: every deterministic transform's written-back
// arguments, byte for byte as caches written by earlier versions were keyed (a change here
// orphans every user's cache, and needs the cache format version bumped instead).
TEST(Transforms, ChainConfigIsTheCacheKeyOfEarlierVersions) {
  const auto chain = nlohmann::json::parse(R"([
    {"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", ""]},
    {"name": "LoadImage", "keys": "seg", "label_dict": {"GTV-1": 1}},
    {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
    {"name": "Orientation", "keys": ["image", "label"], "axcodes": "LPS"},
    {"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.5, 1.5, 2.0], "mode": ["bilinear", "nearest"]},
    {"name": "Spacing", "keys": "image", "pixdim": 2},
    {"name": "ScaleIntensityRange", "keys": "image", "a_min": -57, "a_max": 164, "b_min": 0.0, "b_max": 1.0, "clip": true},
    {"name": "NormalizeIntensity", "keys": "image", "nonzero": true},
    {"name": "CropForeground", "keys": ["image", "label"], "source_key": "image", "margin": 2, "k_divisible": [2, 4, 8]},
    {"name": "FgBgToIndices", "keys": "label", "image_key": "image"},
    {"name": "ResizeWithPadOrCrop", "keys": ["image"], "spatial_size": [8, 8, 4], "value": 1},
    {"name": "CastToType", "keys": ["image", "label"], "dtype": ["float16", "uint8"]},
    {"name": "EnsureType", "keys": "image"},
    {"name": "ToDevice", "keys": "image", "device": "cpu"}])");
  const std::string dump = make_chain(chain).config().dump();
  EXPECT_EQ(dump, R"([{"args":{"dtype":["float32",""],"keys":["image","label"]},"name":"LoadImage"},{"args":{"dtype":["float32"],"keys":["seg"],"label_dict":[["GTV-1",1]]},"name":"LoadImage"},{"args":{"keys":["image","label"]},"name":"EnsureChannelFirst"},{"args":{"axcodes":"LPS","keys":["image","label"]},"name":"Orientation"},{"args":{"diagonal":false,"keys":["image","label"],"mode":["bilinear","nearest"],"padding_mode":"border","pixdim":[1.5,1.5,2.0]},"name":"Spacing"},{"args":{"diagonal":false,"keys":["image"],"mode":["bilinear"],"padding_mode":"border","pixdim":[2.0,2.0,2.0]},"name":"Spacing"},{"args":{"a_max":164.0,"a_min":-57.0,"b_max":1.0,"b_min":0.0,"clip":true,"keys":["image"]},"name":"ScaleIntensityRange"},{"args":{"channel_wise":false,"keys":["image"],"nonzero":true},"name":"NormalizeIntensity"},{"args":{"allow_smaller":true,"k_divisible":[2,4,8],"keys":["image","label"],"margin":[2,2,2],"source_key":"image","threshold":0.0},"name":"CropForeground"},{"args":{"bg_postfix":"_bg_indices","fg_postfix":"_fg_indices","image_key":"image","image_threshold":0.0,"keys":["label"],"storage":"runs"},"name":"FgBgToIndices"},{"args":{"keys":["image"],"spatial_size":[8,8,4],"value":1.0},"name":"ResizeWithPadOrCrop"},{"args":{"dtype":["float16","uint8"],"keys":["image","label"]},"name":"CastToType"},{"args":{"device":"cpu","keys":["image"]},"name":"EnsureType"},{"args":{"device":"cpu","keys":["image"]},"name":"ToDevice"}])");
  EXPECT_EQ(make_chain(chain).hash(), "26dc0083d0d76f8a");
  // dtype: null keeps every file's type, as MONAI's LoadImaged(dtype=None) (it read as float32 before).
  const auto keep = make_chain(nlohmann::json::parse(R"([{"name": "LoadImage", "keys": ["a", "b"], "dtype": null}])"));
  EXPECT_EQ(keep.config()[0]["args"]["dtype"], nlohmann::json::parse(R"(["", ""])"));
}

// LoadImage refuses an item whose files are not on one grid (another shape, or an affine
// more than 0.001 mm away), naming both files; float rounding of an affine is accepted.
TEST(Transforms, LoadImageRefusesFilesOfOneItemOnDifferentGrids) {
  test::TempDir dir;
  const auto write = [&](const std::string& name, std::vector<std::int64_t> shape, double shift) {
    Volume v;
    v.data = at::zeros(shape, at::kShort);
    v.affine(0, 3) = shift;
    write_nifti(dir / name, v);
    return dir / name;
  };
  const std::string image = write("image.nii", {8, 8, 4}, 0);
  const auto load = [&](const std::string& label) {
    Sample s;
    s.meta = {{"image", image}, {"label", label}};
    make_chain(nlohmann::json::parse(R"([{"name": "LoadImage", "keys": ["image", "label"]}])")).apply(s);
    return s;
  };
  EXPECT_NO_THROW(load(write("rounded.nii", {8, 8, 4}, 1e-5)));
  for (const auto& [label, why] : std::vector<std::pair<std::string, std::string>>{
           {write("longer.nii", {8, 8, 5}, 0), "one spatial shape"},
           {write("shifted.nii", {8, 8, 4}, 1.0), "affines differ by up to 1 mm"}}) {
    const std::string m = test::error_of<FormatError>([&] { load(label); });
    EXPECT_NE(m.find(label), std::string::npos) << m;
    EXPECT_NE(m.find(image), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << m;
  }
}

// A float image with NaN or infinite voxels is named as such when it is read, with the file
// and the counts, before any later step (CropForeground, a random crop) fails far from the cause.
TEST(Transforms, LoadImageNamesNonFiniteVoxelsWithTheFile) {
  test::TempDir dir;
  Volume v;
  v.data = at::ones({8, 8, 4}, at::kFloat);
  v.data.view({-1}).narrow(0, 0, 5).fill_(std::nan(""));
  v.data.view({-1}).narrow(0, 10, 2).fill_(std::numeric_limits<float>::infinity());
  write_nifti(dir / "nan.nii", v);
  Sample s;
  s.meta = {{"image", dir / "nan.nii"}};
  const std::string m = test::error_of<FormatError>(
      [&] { make_chain(nlohmann::json::parse(R"([{"name": "LoadImage", "keys": "image"}])")).apply(s); });
  EXPECT_NE(m.find("LoadImage: key 'image' (" + (dir / "nan.nii") + "): 7 of 256 voxels are not finite (5 NaN, 2 infinite)"),
            std::string::npos)
      << m;
  // Finite values load as ever.
  v.data.fill_(2);
  write_nifti(dir / "fine.nii", v);
  s.meta = {{"image", dir / "fine.nii"}};
  EXPECT_NO_THROW(make_chain(nlohmann::json::parse(R"([{"name": "LoadImage", "keys": "image"}])")).apply(s));
}

// Each deterministic transform reads its arguments from its options' field list and writes
// every one of them back (its config, the cache's key): the key table is complete.
TEST(Transforms, EveryArgumentInTheKeyTableIsWrittenBack) {
  for (const auto& name : names()) {
    nlohmann::json args = {{"keys", "image"}};
    for (const auto& row : argument_docs(name)) {
      if (row.required && row.key == "source_key") args[row.key] = "image";
      else if (row.required && row.key == "regions") args[row.key] = {{1, 2}, {2}};  // LabelToRegions
      else if (row.required && row.key != "keys") args[row.key] = 8;  // pixdim, spatial_size: one number for all
    }
    const nlohmann::json config = make(name, args)->config();
    for (const auto& row : argument_docs(name)) {
      // (An option added after chains were cache keys is written only where set.)
      EXPECT_TRUE(config.contains(row.key) || row.when_set) << name << " does not write back " << row.key << ": " << config.dump();
    }
    if (!argument_docs(name).empty() && argument_docs(name)[0].required) {
      EXPECT_VALUE_ERROR(make(name, nlohmann::json::object()), "keys: is required");
    }
  }
  EXPECT_THROW(argument_docs("Spline"), ValueError);
}

TEST(Transforms, ChainHashChangesWithAnyArgument) {
  const auto base = nlohmann::json::parse(R"([{"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.5, 1.5, 2.0],
                                               "mode": ["bilinear", "nearest"]}])");
  const std::string h = make_chain(base).hash();
  EXPECT_EQ(h, make_chain(base).hash());
  auto changed = base;
  changed[0]["pixdim"][2] = 2.5;
  EXPECT_NE(make_chain(changed).hash(), h);
  changed = base;
  changed[0]["mode"][1] = "bilinear";
  EXPECT_NE(make_chain(changed).hash(), h);
  // Defaults spelled out or left implicit give the same chain.
  const auto a = nlohmann::json::parse(R"([{"name": "Orientation", "keys": "image"}])");
  const auto b = nlohmann::json::parse(R"([{"name": "Orientation", "keys": ["image"], "axcodes": "RAS"}])");
  EXPECT_EQ(make_chain(a).hash(), make_chain(b).hash());
}

}  // namespace
}  // namespace medfast::transforms

namespace medfast::transforms {
namespace {

// resample_index_affine against a plain per-voxel reference (the definition: position
// m * index, zeros outside the box and, with zeros_outside, beyond half a voxel past the
// input; border clamp; trilinear or nearest with ties to even), on random rotations and
// zooms that leave some rows partly inside: the branch-free interior runs and the edges
// must both equal it exactly.
TEST(Transforms, AffineResamplingEqualsThePerVoxelDefinition) {
  at::manual_seed(3);
  for (int round = 0; round < 12; ++round) {
    // Rows of 29 and, from round 6, of 67 (most of each row past the source's 25: long
    // border runs, which the AVX2 kernels also take 8 voxels at a time).
    const Shape3 out_shape{23, 19, round < 6 ? 29 : 67};
    const at::Tensor x = at::rand({2, 17, 21, 25});
    const at::Tensor labels = at::randint(0, 5, {1, 17, 21, 25}, at::kByte);
    Affine m;
    const double a = 0.05 * (round + 1), z = 0.8 + 0.04 * round;
    m.m = {{{z * std::cos(a), -std::sin(a), 0.1, -3.0 + round},
            {std::sin(a), z * std::cos(a), -0.05, 2.5},
            {0.02 * round, 0.1, z, -4.0 + 0.7 * round},
            {0, 0, 0, 1}}};
    const bool zeros = round % 2 == 0;
    const Shape3 lo{round % 3, 1, 2}, hi{out_shape[0] - 1, out_shape[1], out_shape[2] - round % 4};
    // Linear on float; nearest on uint8 and on float labels (the AVX2 run gathers 4-byte
    // values; MEDFAST_NO_SIMD=1 checks the scalar loops alone).
    for (int variant = 0; variant < 3; ++variant) {
      const bool nearest = variant > 0;
      const at::Tensor in = variant == 0 ? x : (variant == 1 ? labels : labels.to(at::kFloat));
      const at::Tensor got = resample_index_affine(in, m, out_shape, nearest, zeros, lo, hi);
      const at::Tensor src = in.to(at::kDouble);
      const auto n = in.sizes();
      std::int64_t mismatches = 0;
      for (std::int64_t c = 0; c < in.size(0); ++c)
        for (std::int64_t i = 0; i < out_shape[0]; ++i)
          for (std::int64_t j = 0; j < out_shape[1]; ++j)
            for (std::int64_t k = 0; k < out_shape[2]; ++k) {
              double want = 0;
              const bool in_box = i >= lo[0] && i < hi[0] && j >= lo[1] && j < hi[1] && k >= lo[2] && k < hi[2];
              double p[3];
              bool outside = false;
              for (int r = 0; r < 3; ++r) {
                p[r] = m(r, 0) * i + m(r, 1) * j + m(r, 3) + m(r, 2) * static_cast<double>(k);
                const double mx = static_cast<double>(n[r + 1] - 1);
                if (p[r] < -0.5 || p[r] > mx + 0.5) outside = true;
                p[r] = std::min(std::max(p[r], 0.0), mx);
              }
              if (in_box && !(outside && zeros)) {
                auto at3 = [&](std::int64_t a0, std::int64_t a1, std::int64_t a2) {
                  return src[c][a0][a1][a2].item<double>();
                };
                if (nearest) {
                  want = at3(static_cast<std::int64_t>(std::nearbyint(p[0])), static_cast<std::int64_t>(std::nearbyint(p[1])),
                             static_cast<std::int64_t>(std::nearbyint(p[2])));
                } else {
                  std::int64_t f[3], g[3];
                  float w[3];
                  for (int r = 0; r < 3; ++r) {
                    f[r] = static_cast<std::int64_t>(p[r]);
                    g[r] = std::min(f[r] + 1, n[r + 1] - 1);
                    w[r] = static_cast<float>(p[r] - static_cast<double>(f[r]));
                  }
                  auto l = [](float u, float v, float t) { return u + (v - u) * t; };
                  auto v = [&](std::int64_t a0, std::int64_t a1, std::int64_t a2) { return static_cast<float>(at3(a0, a1, a2)); };
                  const float c00 = l(v(f[0], f[1], f[2]), v(g[0], f[1], f[2]), w[0]);
                  const float c10 = l(v(f[0], g[1], f[2]), v(g[0], g[1], f[2]), w[0]);
                  const float c01 = l(v(f[0], f[1], g[2]), v(g[0], f[1], g[2]), w[0]);
                  const float c11 = l(v(f[0], g[1], g[2]), v(g[0], g[1], g[2]), w[0]);
                  want = l(l(c00, c10, w[1]), l(c01, c11, w[1]), w[2]);
                }
              }
              if (got[c][i][j][k].item<double>() != want) ++mismatches;
            }
      EXPECT_EQ(mismatches, 0) << "round " << round << (nearest ? " nearest " : " linear ") << in.scalar_type();
    }
  }
}

}  // namespace
}  // namespace medfast::transforms
