// Random transforms: outputs against libtorch references with the drawn
// parameters replayed from the same seeded generator; geometry consistency;
// reproducibility; crop statistics.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/transforms/indices.hpp"
#include "medfast/transforms/random.hpp"
#include "test_util.hpp"

namespace medfast::transforms {
namespace {

// A sample whose image holds, per voxel, a distinct value, and whose label is
// a small box; affine oblique-free but anisotropic with an offset.
Sample make_sample(Shape3 n = {12, 10, 8}) {
  Sample s;
  Volume image;
  image.data = at::arange(n[0] * n[1] * n[2], at::kFloat).view({1, n[0], n[1], n[2]});
  image.affine.m = {{{0.8, 0, 0, -10}, {0, 1.1, 0, 5}, {0, 0, 2.5, 7}, {0, 0, 0, 1}}};
  Volume label = image;
  label.data = at::zeros({1, n[0], n[1], n[2]}, at::kByte);
  label.data.narrow(1, 3, 2).narrow(2, 4, 3).narrow(3, 2, 2).fill_(1);
  s.volumes["image"] = image;
  s.volumes["label"] = label;
  return s;
}

// Every voxel of `out` sits at the world position its source voxel had.
void expect_geometry_follows(const Sample& in, const Sample& out, const std::string& key) {
  const Volume& a = in.volume(key);
  const Volume& b = out.volume(key);
  const auto& src = a.data;
  const auto n = b.data.sizes();
  for (std::int64_t i = 0; i < n[1]; i += 3)
    for (std::int64_t j = 0; j < n[2]; j += 3)
      for (std::int64_t k = 0; k < n[3]; k += 2) {
        const auto v = static_cast<std::int64_t>(b.data[0][i][j][k].item<float>());
        const std::int64_t si = v / (src.size(2) * src.size(3)), sj = (v / src.size(3)) % src.size(2),
                           sk = v % src.size(3);
        for (int r = 0; r < 3; ++r) {
          const double w_out = b.affine(r, 0) * i + b.affine(r, 1) * j + b.affine(r, 2) * k + b.affine(r, 3);
          const double w_in = a.affine(r, 0) * si + a.affine(r, 1) * sj + a.affine(r, 2) * sk + a.affine(r, 3);
          ASSERT_NEAR(w_out, w_in, 1e-9) << key << " voxel " << i << "," << j << "," << k;
        }
      }
}

RandomTransformPtr rt(const char* json) {
  const auto j = nlohmann::json::parse(json);
  nlohmann::json args = j;
  args.erase("name");
  return make_random(j["name"], args);
}

// Each random transform reads MONAI's arguments from its options' one field list, which
// also gives its key table: every key there is accepted, with MONAI's shorthand forms.
TEST(RandomTransforms, ArgumentsComeFromTheKeyTable) {
  for (const auto& name : random_names()) {
    const auto docs = random_argument_docs(name);
    ASSERT_FALSE(docs.empty()) << name;
    EXPECT_EQ(docs[0].key, "keys") << name;
    nlohmann::json args = nlohmann::json::object();
    for (const auto& row : docs) {
      if (row.key == "keys") args["keys"] = "image";
      else if (row.required) args[row.key] = 8;  // spatial_size, roi_size: one number for all
      else args[row.key] = nlohmann::json::parse(row.default_value);  // every default, written out
    }
    EXPECT_NO_THROW(make_random(name, args)) << name << " " << args.dump();
    EXPECT_VALUE_ERROR(make_random(name, nlohmann::json::object()), "keys: is required");
  }
  auto cfg = [](const char* name, const char* args) { return make_random(name, nlohmann::json::parse(args))->steps(); };
  EXPECT_EQ(cfg("RandShiftIntensity", R"({"keys": "image", "offsets": 0.2})")["offsets"], nlohmann::json::parse("[-0.2, 0.2]"));
  EXPECT_EQ(cfg("RandScaleIntensity", R"({"keys": "image", "factors": [0.1, 0.3]})")["factors"],
            nlohmann::json::parse("[0.1, 0.3]"));
  EXPECT_EQ(cfg("RandFlip", R"({"keys": "image", "spatial_axis": 1})")["spatial_axis"], nlohmann::json::parse("[1]"));
  EXPECT_EQ(cfg("RandFlip", R"({"keys": "image"})")["spatial_axis"], nlohmann::json::parse("[0, 1, 2]"));
  EXPECT_EQ(cfg("RandRotate", R"({"keys": "image", "range_x": 0.5})")["rotate"][0], nlohmann::json::parse("[-0.5, 0.5]"));
  EXPECT_EQ(cfg("RandAffine", R"({"keys": "image", "scale_range": 0.1})")["scale"][2], nlohmann::json::parse("[0.9, 1.1]"));
  EXPECT_VALUE_ERROR(make_random("RandAffine", nlohmann::json::parse(R"({"keys": "image", "rotate_rang": 1})")), "rotate_rang");
  EXPECT_THROW(random_argument_docs("RandBlur"), ValueError);
}

// A random chain's config() writes each transform's arguments with every default, by
// MONAI's names, and they read back to the same.
TEST(RandomTransforms, AChainWritesBackItsArgumentsWhole) {
  const RandomChain chain = make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandAffine", "keys": "image", "scale_range": 0.1, "mode": "Nearest"},
      {"name": "RandShiftIntensity", "keys": ["image"], "offsets": 0.2},
      {"name": "ResizeWithPadOrCrop", "keys": "image", "spatial_size": 8}])"), 7);
  const nlohmann::json c = chain.config();
  EXPECT_EQ(c["seed"], 7);
  ASSERT_EQ(c["transforms"].size(), 3u);
  EXPECT_EQ(c["transforms"][0]["name"], "RandAffine");
  EXPECT_EQ(c["transforms"][0]["args"], nlohmann::json::parse(R"({"keys": ["image"], "prob": 0.1,
      "rotate_range": [0.0, 0.0, 0.0], "scale_range": [0.1, 0.1, 0.1], "translate_range": [0.0, 0.0, 0.0],
      "mode": ["nearest"], "padding_mode": "zeros"})"));
  EXPECT_EQ(c["transforms"][1]["args"], nlohmann::json::parse(R"({"keys": ["image"], "prob": 0.1, "offsets": [-0.2, 0.2]})"));
  EXPECT_EQ(c["transforms"][2]["args"], nlohmann::json::parse(R"({"keys": ["image"], "spatial_size": [8, 8, 8], "value": 0.0})"));
  nlohmann::json again = nlohmann::json::array();
  for (const auto& t : c["transforms"]) {
    nlohmann::json item = t["args"];
    item["name"] = t["name"];
    again.push_back(item);
  }
  EXPECT_EQ(make_random_chain(again, 7).config(), c);
}

TEST(RandomTransforms, FlipMatchesTorchFlipAndMovesTheAffine) {
  const Sample in = make_sample();
  Sample out = in;
  Rng rng(1);
  rt(R"({"name": "RandFlip", "keys": ["image", "label"], "prob": 1.0, "spatial_axis": [0, 2]})")->apply(out, rng);
  EXPECT_TRUE(at::equal(out.volume("image").data, in.volume("image").data.flip({1, 3})));
  EXPECT_TRUE(at::equal(out.volume("label").data, in.volume("label").data.flip({1, 3})));
  expect_geometry_follows(in, out, "image");
  Sample same = in;
  Rng r2(1);
  rt(R"({"name": "RandFlip", "keys": "image", "prob": 0.0})")->apply(same, r2);
  EXPECT_TRUE(at::equal(same.volume("image").data, in.volume("image").data));
}

TEST(RandomTransforms, Rotate90MatchesTorchRot90WithTheDrawnK) {
  const Sample in = make_sample({9, 9, 6});
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    Sample out = in;
    Rng rng(seed), replay(seed);
    rt(R"({"name": "RandRotate90", "keys": ["image", "label"], "prob": 1.0, "max_k": 3, "spatial_axes": [0, 1]})")
        ->apply(out, rng);
    const int k = static_cast<int>(replay.integer(0, 2)) + 1;
    EXPECT_TRUE(at::equal(out.volume("image").data, at::rot90(in.volume("image").data, k, {1, 2}))) << "k " << k;
    EXPECT_TRUE(at::equal(out.volume("label").data, at::rot90(in.volume("label").data, k, {1, 2})));
    expect_geometry_follows(in, out, "image");
  }
}

TEST(RandomTransforms, IntensityTransformsApplyTheDrawnParameters) {
  const Sample in = make_sample();
  const at::Tensor x = in.volume("image").data;
  {
    Sample out = in;
    Rng rng(5), replay(5);
    rt(R"({"name": "RandScaleIntensity", "keys": "image", "prob": 1.0, "factors": 0.1})")->apply(out, rng);
    replay.uniform();  // the prob draw
    const double f = replay.uniform(-0.1, 0.1);
    EXPECT_TRUE(at::allclose(out.volume("image").data, x * (1 + f)));
  }
  {
    Sample out = in;
    Rng rng(6), replay(6);
    rt(R"({"name": "RandShiftIntensity", "keys": "image", "prob": 1.0, "offsets": [0.2, 0.5]})")->apply(out, rng);
    replay.uniform();
    const double o = replay.uniform(0.2, 0.5);
    EXPECT_TRUE(at::allclose(out.volume("image").data, x + o));
  }
  {
    Sample out = in;
    Rng rng(7), replay(7);
    rt(R"({"name": "RandAdjustContrast", "keys": "image", "prob": 1.0, "gamma": [0.5, 2.0]})")->apply(out, rng);
    replay.uniform();
    const double g = replay.uniform(0.5, 2.0);
    const double mn = x.min().item<double>(), range = x.max().item<double>() - mn;
    EXPECT_TRUE(at::allclose(out.volume("image").data, ((x - mn) / (range + 1e-7)).pow(g) * range + mn, 1e-5, 1e-3));
  }
  {
    Sample out = in;
    out.volume("image").data = at::zeros({1, 40, 40, 40});
    Rng rng(8);
    rt(R"({"name": "RandGaussianNoise", "keys": "image", "prob": 1.0, "mean": 0.5, "std": 0.2})")->apply(out, rng);
    const at::Tensor n = out.volume("image").data;
    EXPECT_NEAR(n.mean().item<double>(), 0.5, 0.01);
    EXPECT_LE(n.std().item<double>(), 0.2 * 1.05);
  }
}

TEST(RandomTransforms, CropsHaveTheSizeTheGeometryAndThePosNegRatio) {
  Sample in = make_sample({40, 36, 30});
  in.volume("label").data.zero_();
  in.volume("label").data.narrow(1, 30, 4).narrow(2, 2, 3).narrow(3, 20, 2).fill_(1);  // small organ near an edge
  const at::Tensor fg = mask_to_runs(in.volume("label").data[0] > 0);
  in.arrays["label_fg"] = fg;
  in.arrays["label_bg"] = mask_to_runs(in.volume("label").data[0] == 0);
  const auto crop = rt(R"({"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "label_key": "label",
      "spatial_size": [16, 12, 10], "pos": 1, "neg": 1, "num_samples": 4,
      "fg_indices_key": "label_fg", "bg_indices_key": "label_bg"})");
  EXPECT_EQ(crop->samples(), 4u);
  int with_fg = 0, total = 0;
  for (std::uint64_t seed = 0; seed < 250; ++seed) {
    Rng rng(seed);
    const auto out = crop->expand(in, rng);
    ASSERT_EQ(out.size(), 4u);
    for (const auto& s : out) {
      EXPECT_EQ(s.volume("image").shape(), (std::vector<std::int64_t>{1, 16, 12, 10}));
      EXPECT_EQ(s.arrays.count("label_fg"), 0u);  // indices of the whole volume do not travel with crops
      with_fg += s.volume("label").data.sum().item<std::int64_t>() > 0 ? 1 : 0;
      ++total;
    }
    if (seed == 0) expect_geometry_follows(in, out[0], "image");
  }
  // pos = neg: half the centres are foreground (each such crop contains the organ);
  // background centres rarely reach it.
  const double ratio = static_cast<double>(with_fg) / total;
  EXPECT_GT(ratio, 0.45);
  EXPECT_LT(ratio, 0.62);
  const auto all_pos = rt(R"({"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": [16, 12, 10],
      "pos": 1, "neg": 0, "num_samples": 2, "fg_indices_key": "label_fg", "bg_indices_key": "label_bg"})");
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    Rng rng(seed);
    for (const auto& s : all_pos->expand(in, rng)) EXPECT_GT(s.volume("label").data.sum().item<std::int64_t>(), 0);
  }
  // A misspelt index key is an error naming it and the keys there are (it used to recompute
  // the indices for every sample, silently, from the label alone).
  const auto misspelt = rt(R"({"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": [16, 12, 10],
      "fg_indices_key": "label_fg_indices", "bg_indices_key": "label_bg_indices"})");
  {
    Rng r(0);
    const std::string m = test::value_error_of([&] { misspelt->expand(in, r); });
    EXPECT_NE(m.find("fg_indices_key 'label_fg_indices' is not in the sample (its index arrays: label_bg, label_fg)"),
              std::string::npos)
        << m;
  }
  const auto too_big = rt(R"({"name": "RandCropByPosNegLabel", "keys": "image", "spatial_size": [64, 12, 10]})");
  Rng rng(1);
  EXPECT_THROW(too_big->expand(in, rng), ValueError);
}

// num_samples 1 (one crop per item) goes through the chain like any other count.
TEST(RandomTransforms, PosNegCropWithOneSampleRunsInAChain) {
  const auto chain = make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": [6, 6, 4], "num_samples": 1},
      {"name": "RandFlip", "keys": ["image", "label"], "prob": 0.5, "spatial_axis": 0}])"),
                                       3);
  EXPECT_EQ(chain.samples_per_item(), 1u);
  const auto out = chain.run(make_sample(), 0, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].volume("image").shape(), (std::vector<std::int64_t>{1, 6, 6, 4}));
  EXPECT_EQ(out[0].volume("label").shape(), (std::vector<std::int64_t>{1, 6, 6, 4}));
}

TEST(RandomTransforms, ChainsAreReproduciblePerItemAndEpoch) {
  const auto chain = make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": [6, 6, 4], "num_samples": 3},
      {"name": "RandFlip", "keys": ["image", "label"], "prob": 0.5, "spatial_axis": 0},
      {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.5, "max_k": 3},
      {"name": "RandScaleIntensity", "keys": "image", "factors": 0.1, "prob": 0.5},
      {"name": "RandShiftIntensity", "keys": "image", "offsets": 0.1, "prob": 0.5}])"),
                                       42);
  EXPECT_EQ(chain.samples_per_item(), 3u);
  const Sample in = make_sample();
  const auto a = chain.run(in, 1, 7), b = chain.run(in, 1, 7);
  ASSERT_EQ(a.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) EXPECT_TRUE(at::equal(a[k].volume("image").data, b[k].volume("image").data));
  bool differs = false;
  const auto c = chain.run(in, 2, 7), d = chain.run(in, 1, 8);
  for (std::size_t k = 0; k < 3; ++k) {
    differs = differs || !at::equal(a[k].volume("image").data, c[k].volume("image").data) ||
              !at::equal(a[k].volume("image").data, d[k].volume("image").data);
  }
  EXPECT_TRUE(differs);
  EXPECT_TRUE(at::equal(in.volume("image").data, make_sample().volume("image").data));  // input untouched
  // Labels stay labels through flips and rotations.
  for (const auto& s : a) {
    const auto u = std::get<0>(at::_unique(s.volume("label").data));
    EXPECT_TRUE(at::equal(u, u.clamp(0, 1)));
  }
}

Sample smooth_sample(Shape3 n) {
  Sample s;
  const auto o = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor x = at::arange(n[0], o).view({-1, 1, 1}), y = at::arange(n[1], o).view({1, -1, 1}),
                   z = at::arange(n[2], o).view({1, 1, -1});
  Volume image;
  image.data = (at::sin(x * 0.21) + at::cos(y * 0.17) + at::sin(z * 0.13 + x * 0.05)).unsqueeze(0).contiguous();
  image.affine.m = {{{1.5, 0, 0, -10}, {0, 1.5, 0, 5}, {0, 0, 2.0, 7}, {0, 0, 0, 1}}};
  Volume label = image;
  label.data = ((image.data > 0.5).to(at::kByte) + (image.data > 1.5).to(at::kByte)).contiguous();  // labels 0, 1, 2
  s.volumes["image"] = image;
  s.volumes["label"] = label;
  return s;
}

TEST(RandomTransforms, ComposedRotateZoomResizeMatchesStepByStep) {
  const auto chain = make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandRotate", "keys": ["image", "label"], "range_x": 0.1, "range_y": 0.1, "range_z": 0.3, "prob": 1.0,
       "mode": ["bilinear", "nearest"]},
      {"name": "RandZoom", "keys": ["image", "label"], "min_zoom": 0.8, "max_zoom": 1.2, "prob": 1.0,
       "mode": ["bilinear", "nearest"]},
      {"name": "ResizeWithPadOrCrop", "keys": ["image", "label"], "spatial_size": [36, 30, 40]}])"),
                                       3);
  const Sample in = smooth_sample({40, 34, 30});
  for (std::uint64_t item = 0; item < 4; ++item) {
    const auto composed = chain.run(in, 0, item);
    ASSERT_EQ(composed.size(), 1u);
    // Step by step with the same draws: each transform resamples on its own.
    Sample step = in;
    Rng rng(derive_seed({3, 0, item, 1, 0}));
    for (const char* json : {R"({"name": "RandRotate", "keys": ["image", "label"], "range_x": 0.1, "range_y": 0.1,
                               "range_z": 0.3, "prob": 1.0, "mode": ["bilinear", "nearest"]})",
                             R"({"name": "RandZoom", "keys": ["image", "label"], "min_zoom": 0.8, "max_zoom": 1.2,
                               "prob": 1.0, "mode": ["bilinear", "nearest"]})",
                             R"({"name": "ResizeWithPadOrCrop", "keys": ["image", "label"], "spatial_size": [36, 30, 40]})"}) {
      rt(json)->apply(step, rng);
    }
    const Volume& a = composed[0].volume("image");
    const Volume& b = step.volume("image");
    ASSERT_EQ(a.shape(), (std::vector<std::int64_t>{1, 36, 30, 40}));
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_LT(a.affine.max_abs_diff(b.affine), 1e-9);
    // One interpolation instead of two: close on a smooth image (range about 6).
    // Compared in the central region, whose sources are interior for these
    // ranges: at the edges, border padding does not commute with composition.
    auto centre = [](const at::Tensor& t) {
      return t.narrow(1, 7, 22).narrow(2, 6, 18).narrow(3, 8, 24);
    };
    const at::Tensor diff = (centre(a.data) - centre(b.data)).abs();
    EXPECT_LT(diff.mean().item<double>(), 0.01) << "item " << item;
    EXPECT_LT(diff.max().item<double>(), 0.1) << "item " << item;
    // Labels stay labels, and mostly agree.
    const at::Tensor la = composed[0].volume("label").data, lb = step.volume("label").data;
    EXPECT_TRUE(at::equal(std::get<0>(at::_unique(la)).clamp(0, 2), std::get<0>(at::_unique(la))));
    EXPECT_LT((centre(la) != centre(lb)).to(at::kDouble).mean().item<double>(), 0.03);
  }
}

TEST(RandomTransforms, AffineFamilyIdentityAndQuarterTurn) {
  const Sample in = smooth_sample({16, 16, 12});
  Sample same = in;
  Rng rng(1);
  rt(R"({"name": "RandZoom", "keys": ["image", "label"], "min_zoom": 1.0, "max_zoom": 1.0, "prob": 1.0,
        "mode": ["bilinear", "nearest"]})")->apply(same, rng);
  EXPECT_TRUE(at::equal(same.volume("image").data, in.volume("image").data));
  EXPECT_TRUE(at::equal(same.volume("label").data, in.volume("label").data));
  Sample turned = in;
  const double half_pi = 1.5707963267948966;
  rt((std::string(R"({"name": "RandRotate", "keys": "image", "prob": 1.0, "range_z": [)") + std::to_string(half_pi) +
      ", " + std::to_string(half_pi) + "]}").c_str())
      ->apply(turned, rng);
  // A quarter turn of a square grid about its centre is a rot90 of the array.
  const at::Tensor a = turned.volume("image").data;
  const bool matches = at::allclose(a, at::rot90(in.volume("image").data, 1, {1, 2}), 1e-4, 1e-4) ||
                       at::allclose(a, at::rot90(in.volume("image").data, -1, {1, 2}), 1e-4, 1e-4);
  EXPECT_TRUE(matches);
}

TEST(RandomTransforms, GaussianSmoothEqualsADirectConvolution) {
  Sample s;
  Volume v;
  at::manual_seed(3);
  v.data = at::rand({2, 9, 8, 7}, at::kDouble);
  s.volumes["image"] = v;
  Rng rng(4), replay(4);
  rt(R"({"name": "RandGaussianSmooth", "keys": "image", "prob": 1.0, "sigma_x": [0.5, 1.0], "sigma_y": [0.3, 0.6],
        "sigma_z": [0.8, 1.2]})")->apply(s, rng);
  replay.uniform();
  const double sg[3] = {replay.uniform(0.5, 1.0), replay.uniform(0.3, 0.6), replay.uniform(0.8, 1.2)};
  // Independent reference: the 3-D kernel as the product of erf-integrated 1-D weights, zero padding.
  auto weights = [](double sigma) {
    const int r = static_cast<int>(std::ceil(4 * sigma));
    std::vector<double> w;
    double sum = 0;
    for (int i = -r; i <= r; ++i) {
      w.push_back(std::erf((i + 0.5) / (std::sqrt(2.0) * sigma)) - std::erf((i - 0.5) / (std::sqrt(2.0) * sigma)));
      sum += w.back();
    }
    for (auto& x : w) x /= sum;
    return w;
  };
  const auto wx = weights(sg[0]), wy = weights(sg[1]), wz = weights(sg[2]);
  const int rx = static_cast<int>(wx.size() / 2), ry = static_cast<int>(wy.size() / 2), rz = static_cast<int>(wz.size() / 2);
  const auto in = v.data.accessor<double, 4>();
  const at::Tensor out = s.volume("image").data;
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 9; i += 2)
      for (int j = 0; j < 8; j += 3)
        for (int k = 0; k < 7; k += 2) {
          double want = 0;
          for (int a = -rx; a <= rx; ++a)
            for (int b = -ry; b <= ry; ++b)
              for (int d = -rz; d <= rz; ++d) {
                if (i + a < 0 || i + a >= 9 || j + b < 0 || j + b >= 8 || k + d < 0 || k + d >= 7) continue;
                want += wx[a + rx] * wy[b + ry] * wz[d + rz] * in[c][i + a][j + b][k + d];
              }
          EXPECT_NEAR(out[c][i][j][k].item<double>(), want, 1e-12);
        }
}

TEST(RandomTransforms, SpatialCropAndAffineTranslation) {
  const Sample in = make_sample({12, 10, 8});
  for (std::uint64_t seed = 0; seed < 10; ++seed) {
    Sample out = in;
    Rng rng(seed);
    rt(R"({"name": "RandSpatialCrop", "keys": ["image", "label"], "roi_size": [5, 4, 3]})")->apply(out, rng);
    EXPECT_EQ(out.volume("image").shape(), (std::vector<std::int64_t>{1, 5, 4, 3}));
    expect_geometry_follows(in, out, "image");
  }
  // RandAffine with a whole-voxel translation only: the data shifts exactly, zeros come in.
  Sample moved = in;
  Rng rng(2);
  rt(R"({"name": "RandAffine", "keys": "image", "prob": 1.0, "translate_range": [0, 0, 0], "mode": "nearest"})")
      ->apply(moved, rng);
  EXPECT_TRUE(at::equal(moved.volume("image").data, in.volume("image").data));
  const at::Tensor x = in.volume("image").data;
  Sample shifted = in;
  SpatialPlan plan;
  plan.active = true;
  plan.shape = {12, 10, 8};
  plan.box_hi = plan.shape;
  plan.mode["image"] = Interp::bilinear;
  plan.padding = GridPadding::zeros;
  plan.out_to_in(0, 3) = -2;  // output x takes input x - 2
  apply_plan(shifted, plan);
  const at::Tensor y = shifted.volume("image").data;
  EXPECT_TRUE(at::equal(y.narrow(1, 2, 10), x.narrow(1, 0, 10)));
  EXPECT_EQ(y.narrow(1, 0, 2).abs().sum().item<double>(), 0.0);
  // Output voxel 0 sits where input voxel -2 would: the origin moves by two voxels of x.
  EXPECT_NEAR(shifted.volume("image").affine(0, 3), in.volume("image").affine(0, 3) - 2 * 0.8, 1e-12);
}

TEST(RandomTransforms, BadArgumentsNameTheTransform) {
  EXPECT_THROW(rt(R"({"name": "RandFlip", "keys": "image", "spatial_axis": 3})"), ValueError);
  EXPECT_THROW(rt(R"({"name": "RandRotate90", "keys": "image", "spatial_axes": [1, 1]})"), ValueError);
  EXPECT_THROW(rt(R"({"name": "RandCropByPosNegLabel", "keys": "image", "spatial_size": [0, 1, 1]})"), ValueError);
  EXPECT_THROW(rt(R"({"name": "RandScaleIntensity", "keys": "image", "factor": 0.1})"), ValueError);
  EXPECT_THROW(rt(R"({"name": "RandZoom", "keys": "image", "min_zoom": 0})"), ValueError);
  EXPECT_THROW(rt(R"({"name": "RandRotate", "keys": "image", "mode": "cubic"})"), ValueError);
  EXPECT_THROW(rt(R"({"name": "RandAffine", "keys": "image", "rotate_range": [0.1, 0.1]})"), ValueError);
  EXPECT_THROW(rt(R"({"name": "RandGaussianSmooth", "keys": "image", "sigma_x": [1.0, 0.5]})"), ValueError);
  const std::string m = test::value_error_of([] { rt(R"({"name": "RandTwirl", "keys": "image"})"); });
  EXPECT_NE(m.find("RandTwirl"), std::string::npos) << m;
}

}  // namespace
}  // namespace medfast::transforms

namespace medfast::transforms {
namespace {

// Flips, quarter turns and intensity scale/shift fold into one gather per sample and key:
// the outputs (values, dtype, affine) equal applying every step on its own, for every seed,
// around crops, resampling steps (which apply the pending gather first) and other intensity
// steps; and the fused chain makes fewer tensors.
TEST(RandomChainFusion, OneGatherEqualsStepByStep) {
  Sample in = make_sample({20, 18, 14});
  in.volume("image").data = at::rand({2, 20, 18, 14}, at::kFloat) * 100 - 20;  // two channels
  const std::vector<std::string> chains = {
      R"([{"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "label_key": "label", "spatial_size": [9, 8, 6],
           "pos": 1, "neg": 1, "num_samples": 3},
          {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": [0], "prob": 0.5},
          {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": [1], "prob": 0.5},
          {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": [2], "prob": 0.5},
          {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.5, "max_k": 3},
          {"name": "RandScaleIntensity", "keys": "image", "factors": 0.1, "prob": 0.5},
          {"name": "RandShiftIntensity", "keys": "image", "offsets": 0.1, "prob": 0.5}])",
      R"([{"name": "RandShiftIntensity", "keys": ["image", "label"], "offsets": 0.5, "prob": 0.7},
          {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.8, "max_k": 3, "spatial_axes": [0, 2]},
          {"name": "RandFlip", "keys": "image", "spatial_axis": [0, 2], "prob": 0.6},
          {"name": "RandScaleIntensity", "keys": "image", "factors": 0.3, "prob": 0.9},
          {"name": "RandZoom", "keys": ["image", "label"], "min_zoom": 0.9, "max_zoom": 1.1, "prob": 0.5,
           "mode": ["bilinear", "nearest"]},
          {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.5, "spatial_axes": [1, 2]},
          {"name": "RandGaussianNoise", "keys": "image", "prob": 0.5, "std": 0.1},
          {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": 1, "prob": 0.5},
          {"name": "RandScaleIntensity", "keys": "image", "factors": 0.2, "prob": 0.5}])"};
  for (std::size_t c = 0; c < chains.size(); ++c) {
    RandomChain fused = make_random_chain(nlohmann::json::parse(chains[c]), 11);
    RandomChain steps = make_random_chain(nlohmann::json::parse(chains[c]), 11);
    steps.set_fuse_index_steps(false);
    for (std::uint64_t item = 0; item < 40; ++item) {
      const auto a = fused.run(in, 2, item), b = steps.run(in, 2, item);
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t k = 0; k < a.size(); ++k) {
        for (const auto& [key, v] : b[k].volumes) {
          const Volume& f = a[k].volume(key);
          SCOPED_TRACE(str("chain ", c, " item ", item, " sample ", k, " key ", key));
          ASSERT_EQ(f.data.sizes(), v.data.sizes());
          EXPECT_EQ(f.data.scalar_type(), v.data.scalar_type());
          EXPECT_TRUE(at::equal(f.data, v.data)) << (f.data.to(at::kDouble) - v.data.to(at::kDouble)).abs().max();
          EXPECT_LT(f.affine.max_abs_diff(v.affine), 1e-12);  // the same matrices, multiplied in another order
        }
      }
    }
  }
}

}  // namespace
}  // namespace medfast::transforms
