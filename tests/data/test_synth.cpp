#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "medfast/core/error.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

SynthOptions small(std::uint64_t seed, int threads = 1) {
  SynthOptions o;
  o.set_size("64,56,12-16");
  o.seed = seed;
  o.threads = threads;
  o.cases = 3;
  return o;
}

TEST(Synth, DeterministicForASeedWhateverTheThreadCount) {
  const auto a = make_synth_case(small(5, 1), 1);
  const auto b = make_synth_case(small(5, 4), 1);
  EXPECT_TRUE(at::equal(a.image.data, b.image.data));
  EXPECT_TRUE(at::equal(a.label.data, b.label.data));
  const auto c = make_synth_case(small(6, 1), 1);
  EXPECT_FALSE(a.image.data.sizes() == c.image.data.sizes() && at::equal(a.image.data, c.image.data));
}

TEST(Synth, LooksLikeAbdominalCtWithAnOrgan) {
  const auto c = make_synth_case(small(11), 0);
  const auto& img = c.image.data;
  EXPECT_EQ(img.scalar_type(), at::kShort);
  EXPECT_EQ(c.label.data.scalar_type(), at::kByte);
  EXPECT_EQ(img.size(0), 64);
  EXPECT_EQ(img.size(1), 56);
  EXPECT_GE(img.size(2), 12);
  EXPECT_LE(img.size(2), 16);
  EXPECT_EQ(c.image.axcodes(), "LPS");  // not RAS, on purpose
  const auto s = c.image.spacing();
  EXPECT_DOUBLE_EQ(s[0], kDefaultSynthSpacing[0]);
  EXPECT_DOUBLE_EQ(s[2], kDefaultSynthSpacing[2]);
  EXPECT_EQ(c.image.affine, c.label.affine);
  // Air at the corners, tissue in the middle, an organ that is brighter than tissue.
  EXPECT_LT(img[0][0][0].item<int>(), -900);
  const auto organ = c.label.data.to(at::kBool);
  const auto n_organ = organ.sum().item<std::int64_t>();
  EXPECT_GT(n_organ, 50);
  EXPECT_LT(n_organ, img.numel() / 4);
  const double organ_mean = img.masked_select(organ).to(at::kDouble).mean().item<double>();
  EXPECT_GT(organ_mean, 80);
  EXPECT_LT(organ_mean, 140);
  // Labels only 0 and 1.
  EXPECT_EQ(std::get<0>(at::_unique(c.label.data)).numel(), 2);
}

TEST(Synth, WritesAnMsdDatasetThatReadsBack) {
  test::TempDir dir;
  auto o = small(3);
  o.out_dir = dir / "ds";
  const auto r = synthesize_dataset(o);
  ASSERT_EQ(r.images.size(), 3u);
  const auto ds = nlohmann::json::parse(test::read_file(dir / "ds/dataset.json"));
  EXPECT_EQ(ds["numTraining"], 3);
  EXPECT_EQ(ds["training"].size(), 3u);
  EXPECT_EQ(ds["labels"]["1"], "spleen");
  for (int i = 0; i < 3; ++i) {
    const std::string img = ds["training"][i]["image"], lab = ds["training"][i]["label"];
    const Volume v = read_nifti(o.out_dir + "/" + img);
    const Volume l = read_nifti(o.out_dir + "/" + lab);
    const auto expected = make_synth_case(o, i);
    EXPECT_TRUE(at::equal(v.data, expected.image.data));
    EXPECT_TRUE(at::equal(l.data, expected.label.data));
    EXPECT_EQ(v.axcodes(), "LPS");
  }
}

TEST(Synth, BadOptionsAreRejectedWithTheOptionName) {
  SynthOptions o;
  for (const char* size : {"64,64", "64,64,0", "64,64,20-10", "64,x,20"}) {
    EXPECT_THROW(o.set_size(size), ValueError) << size;
  }
  EXPECT_THROW(o.set_cases(0), ValueError);
  EXPECT_THROW(o.set_spacing({1, -1, 1}), ValueError);
  const std::string m = test::value_error_of([&] { o.set_size("64,64,3"); });
  EXPECT_NE(m.find("axis 2"), std::string::npos) << m;
}

TEST(Synth, CtCasesAreThoseOfEarlierVersions) {
  // A digest of a case's voxels, pinned: options added later draw from their own
  // generators, so a seed's CT cases stay as they were written.
  const auto c = make_synth_case(small(5), 1);
  const at::Tensor img = c.image.data.contiguous(), lab = c.label.data.contiguous();
  std::uint64_t h = 1469598103934665603ULL;
  const auto mix = [&](const void* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ULL;
  };
  mix(img.data_ptr(), static_cast<std::size_t>(img.numel()) * img.element_size());
  mix(lab.data_ptr(), static_cast<std::size_t>(lab.numel()));
  // Pinned when the spacing ranges and MR were added, after the files written by the version
  // before them (79707bf) and after them were found byte-identical.
  EXPECT_EQ(h, 6116382711625335096ULL) << "digest " << h;
}

TEST(Synth, SpacingDrawnPerCaseAndMrLikeIntensities) {
  SynthOptions o = small(7);
  o.set_spacing_spec("0.7-0.9,0.7-0.9,4-6");
  std::set<double> z;
  for (int i = 0; i < 6; ++i) {
    const auto s = o.spacing_of(i);
    EXPECT_GE(s[0], 0.7);
    EXPECT_LE(s[0], 0.9);
    EXPECT_GE(s[2], 4.0);
    EXPECT_LE(s[2], 6.0);
    z.insert(s[2]);
    const auto c = make_synth_case(o, i);
    EXPECT_NEAR(c.image.spacing()[2], s[2], 1e-9);
  }
  EXPECT_GT(z.size(), 3u);
  // A fixed spacing draws nothing: the CT cases are those of earlier versions.
  SynthOptions fixed = small(7);
  fixed.set_spacing_spec("0.8,0.8,5");
  EXPECT_TRUE(at::equal(make_synth_case(fixed, 1).image.data, make_synth_case(small(7), 1).image.data));
  // MR: the same anatomy (label), 0 around the body, positive inside, a scale per case.
  SynthOptions mr = small(7);
  mr.set_modality("MR");
  const auto ct_case = make_synth_case(small(7), 1), mr_case = make_synth_case(mr, 1);
  EXPECT_TRUE(at::equal(ct_case.label.data, mr_case.label.data));
  const at::Tensor outside = ct_case.image.data.lt(-500);
  EXPECT_TRUE(mr_case.image.data.masked_select(outside).eq(0).all().item<bool>());
  EXPECT_TRUE(mr_case.image.data.masked_select(outside.logical_not()).gt(0).all().item<bool>());
  // Not calibrated: fat is 800 before each case's own scale, so its level differs by case.
  const auto fat_level = [&](int i) {
    const auto ct = make_synth_case(small(7), i), m = make_synth_case(mr, i);
    const at::Tensor fat = ct.image.data.gt(-500).logical_and(ct.image.data.lt(-50));
    return m.image.data.masked_select(fat).to(at::kDouble).median().item<double>();
  };
  const double a = fat_level(1), b = fat_level(2);
  EXPECT_GT(std::abs(a / b - 1), 0.05) << a << " " << b;
  EXPECT_GT(a, 800 * 0.5 * 0.9);
  EXPECT_LT(a, 800 * 2.0 * 1.1);
  EXPECT_EQ(SynthOptions().set_spacing_spec("1e-1,2.5E-1-3e-1,4").spacing_max, (std::array<double, 3>{0, 0.3, 0}));
  EXPECT_THROW(SynthOptions().set_modality("PET"), ValueError);
  EXPECT_THROW(SynthOptions().set_spacing_spec("1,1"), ValueError);
  EXPECT_THROW(SynthOptions().set_spacing_spec("1,1,5-4"), ValueError);
  test::TempDir dir;
  mr.out_dir = dir / "mr";
  mr.cases = 1;
  synthesize_dataset(mr);
  const auto list = nlohmann::json::parse(test::read_file(dir / "mr/dataset.json"));
  EXPECT_EQ(list["modality"]["0"], "MR");
  SynthOptions dicom_mr = mr;
  dicom_mr.set_format("dicom");
  EXPECT_THROW(synthesize_dataset(dicom_mr), ValueError);
}

}  // namespace
}  // namespace medfast

namespace medfast {
namespace {

SynthOptions small_brats(std::uint64_t seed, int threads = 1) {
  SynthOptions o;
  o.set_kind("brats");
  o.set_size("48,40,32");
  o.seed = seed;
  o.threads = threads;
  o.cases = 2;
  return o;
}

// kind brats: MSD Task01's shape (4-D, 4 channels last, labels 0..3 as MSD numbers them) with
// the tumour's sub-regions nested and each channel's contrast where MR shows it.
TEST(Synth, BratsCasesAreTask01Shaped) {
  const auto c = make_synth_case(small_brats(2), 0);
  const auto& img = c.image.data;
  ASSERT_EQ(img.dim(), 4);
  EXPECT_EQ(img.sizes(), (std::vector<std::int64_t>{48, 40, 32, 4}));
  EXPECT_EQ(c.label.data.sizes(), (std::vector<std::int64_t>{48, 40, 32}));
  EXPECT_EQ(c.label.data.scalar_type(), at::kByte);
  EXPECT_EQ(c.image.affine, c.label.affine);
  EXPECT_DOUBLE_EQ(c.image.spacing()[0], 1.0);
  EXPECT_DOUBLE_EQ(c.image.spacing()[2], 1.0);
  const auto label = c.label.data.to(at::kLong);
  // Every label present, edema the largest and the whole tumour a small part of the brain.
  const auto count = [&](int v) { return (label == v).sum().item<std::int64_t>(); };
  const auto brain = (img.select(3, 0) > 0).sum().item<std::int64_t>();
  for (int v = 1; v <= 3; ++v) EXPECT_GT(count(v), 20) << "label " << v;
  EXPECT_GT(count(1), count(2));
  EXPECT_LT(count(1) + count(2) + count(3), brain / 4);
  // Skull-stripped: every channel 0 outside the brain, positive inside.
  const auto outside = img.select(3, 0) == 0;
  for (int ch = 0; ch < 4; ++ch) {
    const auto channel = img.select(3, ch);
    EXPECT_EQ(channel.masked_select(outside).abs().sum().item<std::int64_t>(), 0) << ch;
    EXPECT_EQ((channel.masked_select(outside.logical_not()) <= 0).sum().item<std::int64_t>(), 0) << ch;
  }
  // Nested: the enhancing rim (3) and the non-enhancing centre (2) lie inside the tumour, and
  // the rim surrounds the centre: each centre voxel's neighbours along x are tumour core.
  const auto mean_in = [&](int ch, int v) {
    return img.select(3, ch).masked_select(label == v).to(at::kDouble).mean().item<double>();
  };
  const auto brain_mask = (label == 0) & (img.select(3, 0) > 0);
  const double flair_brain = img.select(3, 0).masked_select(brain_mask).to(at::kDouble).mean().item<double>();
  const double t1gd_brain = img.select(3, 2).masked_select(brain_mask).to(at::kDouble).mean().item<double>();
  EXPECT_GT(mean_in(0, 1), 1.4 * flair_brain);  // FLAIR: edema bright
  EXPECT_GT(mean_in(2, 3), 1.4 * t1gd_brain);   // t1gd: the rim enhances
  EXPECT_LT(mean_in(2, 2), t1gd_brain);         // the centre does not
  const auto centre = (label == 2);
  const auto core = (label >= 2);
  const auto inner = centre.slice(0, 1, 47) & core.slice(0, 0, 46) & core.slice(0, 2, 48);
  EXPECT_EQ(inner.sum().item<std::int64_t>(), centre.slice(0, 1, 47).sum().item<std::int64_t>());
  // Deterministic for a seed, whatever the thread count.
  const auto d = make_synth_case(small_brats(2, 3), 0);
  EXPECT_TRUE(at::equal(img, d.image.data));
  EXPECT_TRUE(at::equal(c.label.data, d.label.data));
}

TEST(Synth, BratsDatasetIsMsdTask01AndReadsBack) {
  test::TempDir dir;
  auto o = small_brats(4);
  o.out_dir = dir / "ds";
  synthesize_dataset(o);
  const auto ds = nlohmann::json::parse(test::read_file(dir / "ds/dataset.json"));
  EXPECT_EQ(ds["tensorImageSize"], "4D");
  EXPECT_EQ(ds["modality"], nlohmann::json({{"0", "FLAIR"}, {"1", "T1w"}, {"2", "t1gd"}, {"3", "T2w"}}));
  EXPECT_EQ(ds["labels"]["1"], "edema");
  EXPECT_EQ(ds["labels"]["3"], "enhancing tumour");
  EXPECT_EQ(ds["training"][1]["image"], "./imagesTr/BRATS_001.nii.gz");
  const Volume v = read_nifti(o.out_dir + "/imagesTr/BRATS_001.nii.gz");
  EXPECT_TRUE(at::equal(v.data, make_synth_case(o, 1).image.data));
  // Options that do not apply are refused, naming them.
  SynthOptions dicom = small_brats(0);
  dicom.format = "dicom";
  EXPECT_NE(test::value_error_of([&] { dicom.validate(); }).find("--kind brats"), std::string::npos);
  EXPECT_THROW(SynthOptions().set_kind("liver"), ValueError);
  const auto r = test::run(test::medfast_binary() + " data synth --kind brats --modality MR --out " + (dir / "x"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--modality does not apply to --kind brats"), std::string::npos) << r.err;
  EXPECT_FALSE(os::exists(dir / "x"));
}

}  // namespace
}  // namespace medfast
