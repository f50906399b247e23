// Golden parity with MONAI 1.3.2 itself (issue 11, item 4): the spleen deterministic chain on a
// formula-made CT (tests/golden/make_monai_chain.py writes it with nibabel here; MONAI's output
// summary was recorded by the same script from the MONAI peer into tests/reference).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "medfast/transforms/indices.hpp"
#include "medfast/transforms/transform.hpp"
#include "test_util.hpp"

namespace medfast::transforms {
namespace {

TEST(MonaiParity, SpleenDeterministicChainEqualsMonais) {
  const std::string path = test::source_dir() + "/tests/reference/monai_spleen_chain.json";
  const auto ref = nlohmann::json::parse(test::read_file(path));
  test::TempDir dir;
  const auto w = test::run(test::python() + " " + test::source_dir() + "/tests/golden/make_monai_chain.py write " +
                           dir.path());
  ASSERT_EQ(w.exit_code, 0) << w.err;
  Sample s;
  s.meta = {{"image", dir / "image.nii.gz"}, {"label", dir / "label.nii.gz"}};
  make_chain(nlohmann::json::parse(test::spleen_chain_json())).apply(s);
  const Volume& img = s.volume("image");
  const Volume& lab = s.volume("label");
  ASSERT_EQ(img.data.sizes().vec(), ref["image_shape"].get<std::vector<std::int64_t>>());
  ASSERT_EQ(lab.data.sizes().vec(), ref["label_shape"].get<std::vector<std::int64_t>>());
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) {
      EXPECT_NEAR(img.affine(r, c), ref["image_affine"][r][c].get<double>(), 1e-6) << r << "," << c;
      EXPECT_NEAR(lab.affine(r, c), ref["label_affine"][r][c].get<double>(), 1e-6) << r << "," << c;
    }
  const at::Tensor flat = img.data.contiguous().reshape({-1}).to(at::kDouble);
  const double n = static_cast<double>(flat.numel());
  EXPECT_NEAR(flat.sum().item<double>() / n, ref["image_sum"].get<double>() / n, 1e-6);
  EXPECT_NEAR((flat * flat).sum().item<double>(), ref["image_sum_sq"].get<double>(), 1e-5 * ref["image_sum_sq"].get<double>());
  const std::int64_t stride = ref["sample_stride"];
  double worst = 0;
  for (std::size_t k = 0; k < ref["sample"].size(); ++k) {
    worst = std::max(worst, std::abs(flat[static_cast<std::int64_t>(k) * stride].item<double>() - ref["sample"][k].get<double>()));
  }
  EXPECT_LT(worst, 1e-5) << "largest difference from MONAI's values";
  // Labels and the indices the crops sample from: exactly MONAI's.
  const at::Tensor on = (lab.data.contiguous().reshape({-1}) > 0).nonzero().reshape({-1});
  EXPECT_EQ(on.numel(), ref["label_voxels"].get<std::int64_t>());
  EXPECT_EQ(on.sum().item<std::int64_t>(), ref["label_index_sum"].get<std::int64_t>());
  const at::Tensor fg = runs_to_indices(s.arrays.at("label_fg_indices"));
  const at::Tensor bg = runs_to_indices(s.arrays.at("label_bg_indices"));
  EXPECT_EQ(fg.numel(), ref["fg_count"].get<std::int64_t>());
  EXPECT_EQ(fg.sum().item<std::int64_t>(), ref["fg_index_sum"].get<std::int64_t>());
  EXPECT_EQ(bg.numel(), ref["bg_count"].get<std::int64_t>());
  EXPECT_EQ(bg.sum().item<std::int64_t>(), ref["bg_index_sum"].get<std::int64_t>());
}

}  // namespace
}  // namespace medfast::transforms
