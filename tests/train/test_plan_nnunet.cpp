// nnU-Net v2 raw datasets end to end (issue 54): a tiny dataset of two channel files a case,
// with plain labels and with region labels, through `plan`, `train --dataset`, `eval` and
// `infer` (on imagesTs: one output per case, {case}.nii.gz, on the input's grid; a region
// run writes one label map by regions_class_order). Also a label of several channels planned
// as a sigmoid run, not left out.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <string>

#include "medfast/data/pipeline.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "medfast/plan/dataset.hpp"
#include "nnunet_raw.hpp"
#include "test_util.hpp"

namespace medfast::plan {
namespace {

struct Expect {
  bool regions;
  std::int64_t out_channels;
};

void PrintTo(const Expect& e, std::ostream* os) {
  *os << (e.regions ? "regions" : "plain labels");
}

class NnunetRawRun : public ::testing::TestWithParam<Expect> {};

TEST_P(NnunetRawRun, PlanTrainEvalInfer) {
  const Expect e = GetParam();
  test::TempDir dir;
  test::write_nnunet_raw(dir / "raw", {5, 2, e.regions, "32,28,10-12"});
  const std::string bin = test::medfast_binary() + " --threads 2 ";
  const std::string in_dir = "cd " + dir.path() + " && " + bin;

  // plan: two channels in, one output per class (softmax) or per region (sigmoid).
  auto r = test::run(in_dir + "plan --dataset raw --device cpu --epochs 1 --validation 1 --out p/plan.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json plan = data::load_yaml_as_json(dir / "p/plan.yaml");
  EXPECT_EQ(plan["model"]["in_channels"], 2);
  EXPECT_EQ(plan["model"]["out_channels"], e.out_channels);
  bool to_regions = false;
  for (const auto& step : plan["data"]["deterministic"]) {
    if (step["name"] == "LabelToRegions") {
      to_regions = true;
      EXPECT_EQ(step["keys"], nlohmann::json({"label"}));
      EXPECT_EQ(step["regions"], nlohmann::json::parse("[[1, 2, 3], [2, 3], [3]]"));
    }
  }
  EXPECT_EQ(to_regions, e.regions);
  r = test::run(in_dir + "plan --dataset raw --device cpu --epochs 1 --validation 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json fp = nlohmann::json::parse(r.out)["fingerprint"];
  EXPECT_EQ(fp["cases_kept"], 5);
  EXPECT_EQ(fp["channels"].size(), 2u);
  EXPECT_EQ(fp["regions"].is_null(), !e.regions) << fp["regions"].dump();
  EXPECT_EQ(plan["loss"].value("sigmoid", false), e.regions) << plan["loss"].dump();
  EXPECT_EQ(plan["loss"].value("to_onehot_y", false), !e.regions) << plan["loss"].dump();
  if (e.regions) {
    EXPECT_EQ(plan["data"]["labels"]["names"], nlohmann::json({"whole tumor", "tumor core", "enhancing tumor"}));
    EXPECT_EQ(plan["data"]["labels"]["regions_class_order"], nlohmann::json({1, 2, 3}));
  } else {
    EXPECT_FALSE(plan["data"].contains("labels"));
  }

  // train --dataset, tiny: 1 epoch, the planned network narrowed to 4..8 channels.
  nlohmann::json filters = nlohmann::json::array();
  for (std::size_t i = 0; i < plan["model"]["filters"].size(); ++i) filters.push_back(i == 0 ? 4 : 8);
  r = test::run(in_dir + "train --dataset raw --set train.epochs=1 --set train.run_dir=runs/x --set train.device=cpu " +
                "--set data.validation.num=1 --set 'model.filters=" + filters.dump() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  ASSERT_TRUE(os::exists(dir / "runs/x/last.ckpt")) << r.out;
  // data check of the run's config: a region run's labels hold the regions' values (0..3).
  r = test::run(in_dir + "data check --config runs/x/plan.yaml");
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;

  // eval: one Dice per class (softmax, background left out) or per region.
  r = test::run(in_dir + "eval --checkpoint runs/x/last.ckpt --device cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json ev = nlohmann::json::parse(r.out);
  ASSERT_EQ(ev["cases"].size(), 1u) << r.out;
  EXPECT_EQ(ev["mean_dice_per_class"].size(), 3u) << r.out;
  EXPECT_NE(ev["cases"][0]["image"].get<std::string>().find("case_004_0000.nii.gz"), std::string::npos) << r.out;

  // infer on imagesTs: one output per case, named as nnU-Net names its predictions.
  r = test::run(in_dir + "infer --checkpoint runs/x/last.ckpt --device cpu --input raw/imagesTs --output out --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  for (const char* c : {"case_005", "case_006"}) {
    const std::string out = dir / (std::string("out/") + c + ".nii.gz");
    ASSERT_TRUE(os::exists(out)) << r.out;
    const VolumeHeader in = read_nifti_header(dir / (std::string("raw/imagesTs/") + c + "_0000.nii.gz"));
    const Volume v = read_nifti(out);
    ASSERT_EQ(v.data.dim(), 3) << "one label map, not a mask per region";
    EXPECT_EQ(v.data.sizes().vec(), in.shape);
    EXPECT_LT(v.affine.max_abs_diff(in.affine), 1e-4);
    const at::Tensor values = std::get<0>(at::_unique(v.data.to(at::kLong)));
    for (std::int64_t i = 0; i < values.numel(); ++i) {
      EXPECT_TRUE(values[i].item<std::int64_t>() >= 0 && values[i].item<std::int64_t>() <= 3) << values;
    }
  }
  EXPECT_FALSE(os::exists(dir / "out/case_005_0000_seg.nii.gz"));
  // nibabel reads them on the input's grid too.
  r = test::run(test::python() + " -c \"import nibabel as nib, numpy as np; a = nib.load('" +
                dir / "out/case_005.nii.gz" + "'); b = nib.load('" + dir / "raw/imagesTs/case_005_0001.nii.gz" +
                "'); assert a.shape == b.shape, (a.shape, b.shape); assert np.allclose(a.affine, b.affine, atol=1e-4); "
                "print('ok')\"");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Numbered files of the user's (scan_0001, scan_0002: no channel 0, no nnU-Net folder) are
  // images of their own, each written <name>_seg.
  os::make_directories(dir / "numbered");
  for (const char* n : {"scan_0001", "scan_0002"}) {
    Volume both = read_nifti(dir / "raw/imagesTs/case_005_0000.nii.gz");
    const Volume adc = read_nifti(dir / "raw/imagesTs/case_005_0001.nii.gz");
    both.data = at::stack({both.data.to(at::kFloat), adc.data.to(at::kFloat)}, 3).contiguous();
    write_nifti(dir / (std::string("numbered/") + n + ".nii.gz"), both);
  }
  r = test::run(in_dir + "infer --checkpoint runs/x/last.ckpt --device cpu --input numbered --output out3");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(os::exists(dir / "out3/scan_0001_seg.nii.gz")) << r.out;
  EXPECT_TRUE(os::exists(dir / "out3/scan_0002_seg.nii.gz")) << r.out;
  // A case without one of its channels: named, with the file expected; nothing written.
  os::remove_file(dir / "raw/imagesTs/case_006_0001.nii.gz");
  r = test::run(in_dir + "infer --checkpoint runs/x/last.ckpt --device cpu --input raw/imagesTs --output out2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(test::contains_all(r.err, {"case 'case_006' has no channel 1", "raw/imagesTs/case_006_0001.nii.gz"}))
      << r.err;
  EXPECT_FALSE(os::exists(dir / "out2/case_005.nii.gz"));
}

INSTANTIATE_TEST_SUITE_P(Labels, NnunetRawRun, ::testing::Values(Expect{false, 4}, Expect{true, 3}),
                         [](const auto& info) { return info.param.regions ? "Regions" : "PlainLabels"; });

TEST(PlanDataset, ALabelOfSeveralChannelsIsPlannedAsMasks) {
  test::TempDir dir;
  test::write_nnunet_raw(dir / "raw", {4, 0, false, "24,20,8"});
  // The labels rewritten as three masks (channels last, as NIfTI keeps them) in an MSD list.
  nlohmann::json items = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) {
    const std::string c = test::raw_case(i);
    Volume l = read_nifti(dir / ("raw/labelsTr/" + c + ".nii.gz"));
    std::vector<at::Tensor> masks;
    for (int k = 1; k <= 3; ++k) masks.push_back(l.data.ge(k).to(at::kByte));
    l.data = at::stack(masks, 3).contiguous();
    write_nifti(dir / ("masks_" + c + ".nii.gz"), l);
    items.push_back(
        {{"image", {"raw/imagesTr/" + test::channel_file(c, 0), "raw/imagesTr/" + test::channel_file(c, 1)}},
         {"label", "masks_" + c + ".nii.gz"}});
  }
  test::write_file(dir / "list.json", nlohmann::json{{"training", items}}.dump());
  const DatasetFingerprint fp = dataset_fingerprint(dir / "list.json", {});
  EXPECT_EQ(fp.cases.size(), 4u);
  EXPECT_EQ(fp.excluded(), 0u);
  EXPECT_EQ(fp.label_channels, 3);
  EXPECT_EQ(fp.cases[0].channels, 2);
  const auto r = test::run(test::medfast_binary() + " plan --device cpu --dataset " + dir / "list.json" + " --out " +
                           dir / "plan.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json plan = data::load_yaml_as_json(dir / "plan.yaml");
  EXPECT_EQ(plan["model"]["out_channels"], 3);
  EXPECT_EQ(plan["loss"]["sigmoid"], true);
}

}  // namespace
}  // namespace medfast::plan
