// medfast plan (issue 23): the dataset fingerprint (read once, cached by the files'
// identities, bad cases named and left out), the plan against nnU-Net v2's rules (stated
// again in numpy, tests/golden/nnunet_rules.py) on synthetic CT and anisotropic MR sets,
// the network it plans, and the run config `train` runs, on the command line too.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/os/file.hpp"
#include "medfast/plan/dataset.hpp"
#include "medfast/plan/plan.hpp"
#include "medfast/train/run_config.hpp"
#include "test_util.hpp"

namespace medfast::plan {
namespace {

SynthOptions synth(const std::string& out, int cases, const std::string& size, const std::string& spacing,
                   const std::string& modality = "CT") {
  SynthOptions o;
  o.out_dir = out;
  o.set_cases(cases).set_size(size).set_spacing_spec(spacing).set_modality(modality);
  o.seed = 3;
  return o;
}

double voxels(const Shape& s) { return static_cast<double>(s[0]) * static_cast<double>(s[1]) * static_cast<double>(s[2]); }

FingerprintOptions few_samples(int threads = 2) {
  FingerprintOptions o;
  o.threads = threads;
  o.total_samples = 4000;
  return o;
}

TEST(PlanDataset, ReadsEveryCaseOnceAndCachesTheSummaries) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 4, "40,36,10-14", "1.2,1.0,3.0"));
  std::size_t progress_calls = 0;
  FingerprintOptions o = few_samples();
  o.progress = [&](std::size_t done, std::size_t total) {
    ++progress_calls;
    EXPECT_LE(done, total);
    EXPECT_EQ(total, 4u);
  };
  const DatasetFingerprint a = dataset_fingerprint(dir / "ds", o);
  EXPECT_EQ(progress_calls, 4u);
  EXPECT_EQ(a.list, dir / "ds/dataset.json");
  ASSERT_EQ(a.cases.size(), 4u);
  EXPECT_EQ(a.listed, 4u);
  EXPECT_EQ(a.read, 4u);
  EXPECT_EQ(a.cache_path, dir / "ds/.medfast-fingerprint.cbor");
  EXPECT_EQ(a.channel_names, std::vector<std::string>{"CT"});
  EXPECT_EQ(a.classes(), (std::vector<std::int64_t>{0, 1}));
  for (std::size_t i = 0; i < a.cases.size(); ++i) {
    const CaseSummary& c = a.cases[i];
    SCOPED_TRACE(c.image);
    const Volume image = read_nifti(c.image);
    EXPECT_EQ(c.axcodes, "LPS");  // the file's; the summary's axes are RAS (a flip: same sizes)
    EXPECT_EQ(c.shape, (Shape{image.data.size(0), image.data.size(1), image.data.size(2)}));
    for (int d = 0; d < 3; ++d) EXPECT_NEAR(c.crop.spacing[d], (Spacing{1.2, 1.0, 3.0})[d], 1e-6);
    std::int64_t voxels = 0;
    for (const auto& [v, n] : c.label_voxels) voxels += n;
    EXPECT_EQ(voxels, image.data.numel());
    const Volume label = read_nifti(c.label);
    EXPECT_EQ(c.label_voxels.at(1), label.data.gt(0).sum().item<std::int64_t>());
    EXPECT_EQ(c.crop.foreground_voxels, c.label_voxels.at(1));
    ASSERT_EQ(c.crop.samples.size(), 1u);
    EXPECT_EQ(c.crop.samples[0].size(), 1000u);  // 4000 over 4 cases
    // CT air is -1000, not 0: the nonzero crop keeps the whole image.
    EXPECT_EQ(c.crop.shape_after_crop, c.shape);
  }
  EXPECT_TRUE(a.notes.empty()) << a.notes[0].text();

  // Again: nothing read, the same summaries.
  const DatasetFingerprint b = dataset_fingerprint(dir / "ds", few_samples());
  EXPECT_EQ(b.read, 0u);
  ASSERT_EQ(b.cases.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(b.cases[i].crop.samples, a.cases[i].crop.samples);
    EXPECT_EQ(b.cases[i].label_voxels, a.cases[i].label_voxels);
    EXPECT_EQ(b.cases[i].crop.spacing, a.cases[i].crop.spacing);
  }
  // Fewer samples: a prefix of the cached ones (still nothing read); more: every case again.
  FingerprintOptions fewer = few_samples();
  fewer.total_samples = 400;
  const DatasetFingerprint c = dataset_fingerprint(dir / "ds", fewer);
  EXPECT_EQ(c.read, 0u);
  EXPECT_EQ(c.cases[2].crop.samples[0],
            std::vector<double>(a.cases[2].crop.samples[0].begin(), a.cases[2].crop.samples[0].begin() + 100));
  FingerprintOptions more = few_samples();
  more.total_samples = 8000;
  EXPECT_EQ(dataset_fingerprint(dir / "ds", more).read, 4u);
  // A rewritten file is read again, alone.
  const std::string label = a.cases[1].label;
  const std::string bytes = test::read_file(label);
  os::remove_file(label);
  test::write_file(label, bytes);
  EXPECT_EQ(dataset_fingerprint(dir / "ds", more).read, 1u);
  // A damaged cache is read past (every case read again), then rewritten.
  test::write_file(dir / "ds/.medfast-fingerprint.cbor", "not cbor");
  EXPECT_EQ(dataset_fingerprint(dir / "ds", more).read, 4u);
  EXPECT_EQ(dataset_fingerprint(dir / "ds", more).read, 0u);
  // Without the cache: read, and the file left as it is.
  FingerprintOptions none = more;
  none.use_cache = false;
  const std::string before = test::read_file(dir / "ds/.medfast-fingerprint.cbor");
  EXPECT_EQ(dataset_fingerprint(dir / "ds", none).read, 4u);
  EXPECT_EQ(test::read_file(dir / "ds/.medfast-fingerprint.cbor"), before);
}

TEST(PlanDataset, TheSameFingerprintWithAnyThreadCount) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 3, "32,32,8-12", "1.5,1.5,3.0"));
  FingerprintOptions one = few_samples(1), three = few_samples(3);
  one.use_cache = three.use_cache = false;
  const DatasetFingerprint a = dataset_fingerprint(dir / "ds", one), b = dataset_fingerprint(dir / "ds", three);
  ASSERT_EQ(a.cases.size(), b.cases.size());
  for (std::size_t i = 0; i < a.cases.size(); ++i) EXPECT_EQ(a.cases[i].crop.samples, b.cases[i].crop.samples);
}

/// A list of cases, each a problem the plan must name: which file, what is off, what it did.
TEST(PlanDataset, BadCasesAreNamedLeftOutOrKept) {
  test::TempDir dir;
  const SynthOptions o = synth(dir / "ds", 1, "24,24,8", "1.5,1.5,3.0");
  os::make_directories(dir / "ds");
  nlohmann::json training = nlohmann::json::array();
  const auto write_case = [&](const std::string& name, const Volume& image, const Volume& label) {
    write_nifti(dir / ("ds/" + name + "_img.nii.gz"), image);
    write_nifti(dir / ("ds/" + name + "_seg.nii.gz"), label);
    training.push_back({{"image", "./" + name + "_img.nii.gz"}, {"label", "./" + name + "_seg.nii.gz"}});
  };
  for (int i = 0; i < 3; ++i) {  // good cases
    SynthOptions g = o;
    g.seed = 10 + static_cast<std::uint64_t>(i);
    const SynthCase c = make_synth_case(g, 0);
    write_case(str("good", i), c.image, c.label);
  }
  const SynthCase base = make_synth_case(o, 0);
  {  // two channels where the others have one
    Volume two = base.image;
    two.data = at::stack({base.image.data, base.image.data}, 3);
    write_case("twochannels", two, base.label);
  }
  {  // a label value the list does not name
    Volume l = base.label;
    l.data = base.label.data * 3;
    write_case("class3", base.image, l);
  }
  {  // a spacing 10x the others' along z
    Volume img = base.image, l = base.label;
    img.affine(2, 2) *= 10;
    l.affine(2, 2) *= 10;
    write_case("thick", img, l);
  }
  {  // no foreground
    Volume l = base.label;
    l.data = at::zeros_like(base.label.data);
    write_case("empty", base.image, l);
  }
  {  // a label of another shape
    Volume l = base.label;
    l.data = base.label.data.narrow(0, 0, 20).contiguous();
    write_case("shape", base.image, l);
  }
  {  // a label shifted 5 mm from its image
    Volume l = base.label;
    l.affine(2, 3) += 5;
    write_case("shifted", base.image, l);
  }
  test::write_file(dir / "ds/garbage_img.nii.gz", "this is not a NIfTI file");
  training.push_back({{"image", "./garbage_img.nii.gz"}, {"label", "./good0_seg.nii.gz"}});
  training.push_back({{"image", "./good1_img.nii.gz"}, {"label", "./missing_seg.nii.gz"}});
  training.push_back({{"image", "./good2_img.nii.gz"}});
  const nlohmann::json list = {{"modality", {{"0", "CT"}}},
                               {"labels", {{"0", "background"}, {"1", "organ"}}},
                               {"training", training}};
  test::write_file(dir / "ds/dataset.json", list.dump());

  const DatasetFingerprint fp = dataset_fingerprint(dir / "ds/dataset.json", few_samples());
  EXPECT_EQ(fp.listed, 12u);
  std::vector<std::string> kept;
  for (const auto& c : fp.cases) kept.push_back(c.image.substr(c.image.find_last_of('/') + 1));
  EXPECT_EQ(kept, (std::vector<std::string>{"good0_img.nii.gz", "good1_img.nii.gz", "good2_img.nii.gz",
                                            "thick_img.nii.gz", "empty_img.nii.gz"}));
  EXPECT_EQ(fp.items.size(), fp.cases.size());
  EXPECT_EQ(fp.excluded(), 7u);
  const auto note_of = [&](const std::string& file) -> const CaseNote* {
    for (const auto& n : fp.notes) {
      if (n.file.find(file) != std::string::npos) return &n;
    }
    return nullptr;
  };
  const auto expect_note = [&](const std::string& file, bool excluded, const std::string& problem) {
    SCOPED_TRACE(file);
    const CaseNote* n = note_of(file);
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->excluded, excluded);
    EXPECT_NE(n->problem.find(problem), std::string::npos) << n->problem;
    EXPECT_NE(n->action.find(excluded ? "left out of the plan and the run" : "kept"), std::string::npos) << n->action;
  };
  expect_note("twochannels_img", true, "has 2 channel(s); the list names 1");
  expect_note("class3_seg", true, "label values 3 are not among the list's labels (0, 1)");
  expect_note("thick_img", false, "is 10x coarser than the median");
  expect_note("empty_img", false, "no foreground");
  expect_note("shape_img", true, "is not on the grid of key 'image'");
  expect_note("shifted_img", true, "their affines differ by up to 5 mm");
  expect_note("garbage_img", true, "cannot be used");
  expect_note("garbage_img", true, "garbage_img.nii.gz");
  expect_note("good1_img", true, "the label file " + dir / "ds/missing_seg.nii.gz" + " does not exist");
  expect_note("good2_img", true, "the list gives it no 'label' file");
  // What the plan prints names each.
  const Plan p = make_plan(fp, {"cpu", 1ULL << 30, 0, 0, 2, "run"});
  const std::string summary = plan_summary(fp, p);
  for (const char* f : {"twochannels_img", "class3_seg", "thick_img", "empty_img", "shape_img", "shifted_seg", "garbage_img",
                        "missing_seg"}) {
    EXPECT_NE(summary.find(f), std::string::npos) << f << "\n" << summary;
  }
}

TEST(PlanDataset, NothingToPlanWithIsAFormatErrorNamingTheList) {
  test::TempDir dir;
  EXPECT_NE(test::error_of<FormatError>([&] { dataset_fingerprint(dir / "nothing"); }).find("no such dataset folder or list file"),
            std::string::npos);
  os::make_directories(dir / "empty");
  EXPECT_NE(test::error_of<FormatError>([&] { dataset_fingerprint(dir / "empty"); }).find("the folder has no dataset.json"),
            std::string::npos);
  synthesize_dataset(synth(dir / "ds", 2, "24,24,8", "1.5,1.5,3.0"));
  // Every label empty.
  for (const char* name : {"spleen_0", "spleen_1"}) {
    Volume l = read_nifti(dir / str("ds/labelsTr/", name, ".nii.gz"));
    l.data.zero_();
    write_nifti(dir / str("ds/labelsTr/", name, ".nii.gz"), l);
  }
  std::string e = test::error_of<FormatError>([&] { dataset_fingerprint(dir / "ds", few_samples()); });
  EXPECT_NE(e.find(dir / "ds/dataset.json"), std::string::npos) << e;
  EXPECT_NE(e.find("no label has any foreground"), std::string::npos) << e;
  // Every image unreadable: each named.
  for (const char* name : {"spleen_0", "spleen_1"}) test::write_file(dir / str("ds/imagesTr/", name, ".nii.gz"), "x");
  e = test::error_of<FormatError>([&] { dataset_fingerprint(dir / "ds", few_samples()); });
  EXPECT_NE(e.find("no case can be planned with"), std::string::npos) << e;
  EXPECT_NE(e.find("spleen_0.nii.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("spleen_1.nii.gz"), std::string::npos) << e;
  test::write_file(dir / "ds/dataset.json", R"({"training": []})");
  e = test::error_of<FormatError>([&] { dataset_fingerprint(dir / "ds", few_samples()); });
  EXPECT_NE(e.find("lists no cases"), std::string::npos) << e;
}

/// The plan's target spacing and normalization against nnU-Net's rules computed in numpy
/// from the same fingerprint (the done-when's check on a spleen-like and an anisotropic set).
void expect_rules_of_nnunet(const DatasetFingerprint& fp, const Plan& p) {
  nlohmann::json f = {{"spacings", nlohmann::json::array()}, {"shapes", nlohmann::json::array()},
                      {"relative_sizes", nlohmann::json::array()}, {"channels", fp.channel_names},
                      {"classes", p.network.out_channels}};
  std::vector<double> pooled;
  for (const auto& c : fp.cases) {
    f["spacings"].push_back(c.crop.spacing);
    f["shapes"].push_back(c.crop.shape_after_crop);
    f["relative_sizes"].push_back(c.crop.relative_size);
    pooled.insert(pooled.end(), c.crop.samples[0].begin(), c.crop.samples[0].end());
  }
  f["samples"] = {pooled};
  test::TempDir dir;
  test::write_file(dir / "f.json", f.dump());
  const auto r = test::run(test::python() + " " + test::source_dir() + "/tests/golden/nnunet_rules.py < " + dir / "f.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = nlohmann::json::parse(r.out);
  // nnU-Net's 3d_fullres spacing (the plan trains at it unless its compute budget takes 3d_lowres).
  for (int d = 0; d < 3; ++d) EXPECT_NEAR(p.fullres_spacing[d], want["target_spacing"][d].get<double>(), 1e-12);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(p.fullres_median_shape[d], want["median_shape"][d].get<double>());
  if (!p.lowres) {
    EXPECT_EQ(p.target_spacing, p.fullres_spacing);
    EXPECT_EQ(p.median_shape, p.fullres_median_shape);
  }
  // What nnU-Net itself would plan with its 8 GB reference, as plan --json reports it.
  const nlohmann::json j = plan_json(fp, p);
  EXPECT_EQ(j["nnunet_8gb_reference"]["patch_size"], want["patch"]);
  EXPECT_EQ(j["nnunet_8gb_reference"]["batch_size"], want["batch_size"]);
  ASSERT_EQ(p.normalization.size(), 1u);
  const std::string scheme = want["normalization"][0];
  EXPECT_EQ(p.normalization[0].scheme == Normalization::ct ? "ct" : "zscore", scheme);
  EXPECT_EQ(p.normalization[0].use_mask, want["use_mask"][0].get<bool>());
  if (scheme == "ct") {
    const auto& s = want["stats"][0];
    const IntensityStats& got = *p.normalization[0].stats;
    EXPECT_NEAR(got.mean, s["mean"].get<double>(), 1e-9 * std::abs(s["mean"].get<double>()));
    EXPECT_NEAR(got.std, s["std"].get<double>(), 1e-9 * s["std"].get<double>());
    EXPECT_DOUBLE_EQ(got.p00_5, s["p00_5"].get<double>());
    EXPECT_DOUBLE_EQ(got.p99_5, s["p99_5"].get<double>());
  }
}

TEST(Plan, SpleenLikeCtFollowsNnunetsRules) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 5, "64,64,16-24", "1.2-1.6,1.2-1.6,2.5-3.5"));
  const DatasetFingerprint fp = dataset_fingerprint(dir / "ds", few_samples());
  const Plan p = make_plan(fp, {"cpu", 2ULL << 30, 0, 0, 10, "run"});
  expect_rules_of_nnunet(fp, p);
  EXPECT_EQ(p.normalization[0].scheme, Normalization::ct);
  EXPECT_FALSE(p.normalization[0].use_mask);  // CT: never (and its air is -1000, not 0)
  // The config's normalization is the CT rule as one linear map: p00_5 -> (p00_5 - mean) / std.
  const nlohmann::json c = run_config(fp, p, dir / "ds/dataset.json");
  nlohmann::json scale;
  for (const auto& s : c["data"]["deterministic"]) {
    if (s["name"] == "ScaleIntensityRange") scale = s;
  }
  ASSERT_FALSE(scale.is_null());
  const IntensityStats& st = *p.normalization[0].stats;
  EXPECT_NEAR(scale["a_min"].get<double>(), st.p00_5, 1e-5 * std::abs(st.p00_5) + 1e-9);
  EXPECT_NEAR(scale["b_max"].get<double>(), (st.p99_5 - st.mean) / st.std, 1e-5);
  EXPECT_TRUE(scale["clip"].get<bool>());
}

TEST(Plan, AnisotropicMrFollowsNnunetsRules) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 6, "64,64,10-14", "0.7-0.9,0.7-0.9,4-6", "MR"));
  const DatasetFingerprint fp = dataset_fingerprint(dir / "ds", few_samples());
  const Plan p = make_plan(fp, {"cpu", 2ULL << 30, 0, 0, 10, "run"});
  expect_rules_of_nnunet(fp, p);
  EXPECT_EQ(fp.channel_names, std::vector<std::string>{"MR"});
  EXPECT_EQ(p.normalization[0].scheme, Normalization::zscore);
  // MR is 0 around the body: the crop keeps under 3/4, so z-scores use the nonzero region.
  EXPECT_TRUE(p.normalization[0].use_mask);
  // The slices are 5x the in-plane spacing with a fifth of the voxels: the 10th percentile.
  std::vector<double> z;
  for (const auto& c : fp.cases) z.push_back(c.crop.spacing[2]);
  EXPECT_NEAR(p.fullres_spacing[2], percentile(z, 10), 1e-12);
  // In-plane kernels first: 3x3x1 until pooling has made the voxels near-isotropic.
  EXPECT_EQ(p.network.kernels[0], (Shape{3, 3, 1}));
  EXPECT_EQ(p.network.strides[1], (Shape{2, 2, 1}));
}

// A plan's network by hand: 2 channels in, 3 classes, 4 levels, anisotropic first level.
NetworkPlan two_channel_four_level_network(std::vector<std::int64_t> filters) {
  NetworkPlan n;
  n.in_channels = 2;
  n.out_channels = 3;
  n.kernels = {{3, 3, 1}, {3, 3, 3}, {3, 3, 3}, {3, 3, 3}};
  n.strides = {{1, 1, 1}, {2, 2, 1}, {2, 2, 2}, {2, 2, 2}};
  n.filters = std::move(filters);
  return n;
}

TEST(Plan, TheNetworksParametersAndMemoryEstimate) {
  NetworkPlan n = two_channel_four_level_network({32, 64, 128, 256});
  for (const std::int64_t supr : {0, 1, 2}) {
    n.deep_supr_num = supr;
    const nlohmann::json spec = nlohmann::json::parse(n.model_json().dump());
    torch::nn::AnyModule net = nn::make_network(spec, "model");
    std::int64_t count = 0;
    for (const auto& t : nn::unique_tensors(net.ptr()->parameters())) count += t.numel();
    EXPECT_EQ(n.parameters(), count) << "deep_supr_num " << supr;
  }
  // Linear in the batch; the weights' part (gradient + momentum) does not grow with it.
  const MemoryEstimate one = training_memory(n, {64, 64, 16}, 1), three = training_memory(n, {64, 64, 16}, 3);
  EXPECT_DOUBLE_EQ(three.activations, 3 * one.activations);
  EXPECT_DOUBLE_EQ(three.transients - kStepOverheadBytes, 3 * (one.transients - kStepOverheadBytes));
  EXPECT_DOUBLE_EQ(one.parameters, three.parameters);
  EXPECT_DOUBLE_EQ(one.parameters, static_cast<double>(n.parameters()) * 8);
  MemoryOptions half;
  half.activation_bytes = 2;
  EXPECT_LT(training_memory(n, {64, 64, 16}, 1, half).activations, one.activations);
}

TEST(Plan, TheComputeEstimateCountsWhatTheNetworkRuns) {
  // forward_macs against the multiply-accumulates a DynUNet of the plan's arguments performs
  // (nn::MacCounter around a real forward), with and without deep supervision, training and eval.
  NetworkPlan n = two_channel_four_level_network({8, 16, 32, 64});
  const Shape patch = {32, 24, 16};
  const at::Tensor x = at::randn({1, 2, patch[0], patch[1], patch[2]});
  for (const std::int64_t supr : {0, 2}) {
    n.deep_supr_num = supr;
    torch::nn::AnyModule net = nn::make_network(nlohmann::json::parse(n.model_json().dump()), "model");
    torch::NoGradGuard no_grad;
    for (const bool training : {true, false}) {
      net.ptr()->train(training);
      nn::MacCounter counter;
      (void)net.forward<at::Tensor>(x);
      EXPECT_DOUBLE_EQ(forward_macs(n, patch, training), counter.macs())
          << "deep_supr_num " << supr << (training ? ", training" : ", eval");
    }
  }
  EXPECT_DOUBLE_EQ(training_step_macs(n, patch, 4), 12 * forward_macs(n, patch, true));
}

TEST(Plan, TheBudgetDecidesPatchAndBatch) {  // memory alone (no compute budget)
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 4, "96,96,40", "1,1,1"));
  const DatasetFingerprint fp = dataset_fingerprint(dir / "ds", few_samples());
  const Plan big = make_plan(fp, {"cpu", 8ULL << 30, 0, 0, 10, "run", 0});
  const Plan small = make_plan(fp, {"cpu", 600ULL << 20, 0, 0, 10, "run", 0});
  EXPECT_LE(big.memory.total(), 8.0 * (1ULL << 30));
  EXPECT_LE(small.memory.total(), 600.0 * (1 << 20));
  EXPECT_LT(voxels(small.patch.topology.patch), voxels(big.patch.topology.patch));
  EXPECT_GE(small.patch.batch_size, 2);
  EXPECT_EQ(big.budget_reason, "--memory");
  // No budget given: a quarter of the machine's memory on a CPU, 90% of the free memory on CUDA.
  const Plan cpu = make_plan(fp, {"cpu", 0, 0, 16ULL << 30, 10, "run", 0});
  EXPECT_EQ(cpu.budget_bytes, 4ULL << 30);
  EXPECT_NE(cpu.budget_reason.find("25% of the machine's memory"), std::string::npos) << cpu.budget_reason;
  const Plan gpu = make_plan(fp, {"cuda", 0, 10ULL << 30, 16ULL << 30, 10, "run", 0});
  EXPECT_EQ(gpu.budget_bytes, 9ULL << 30);
  EXPECT_TRUE(gpu.amp);
  // Too small for any patch: an error that says so and what to do.
  const std::string e = test::value_error_of([&] { make_plan(fp, {"cpu", 64ULL << 10, 0, 0, 10, "run", 0}); });
  EXPECT_NE(e.find("no patch fits the memory budget"), std::string::npos) << e;
  EXPECT_NE(e.find("raise --memory"), std::string::npos) << e;
}

/// A hand-made MR fingerprint: one case of each shape at `spacing`.
DatasetFingerprint hand_made(const std::vector<Shape>& shapes, const Spacing& spacing) {
  DatasetFingerprint fp;
  fp.list = "hand-made";
  fp.channel_names = {"MR"};
  fp.label_names = {{0, "background"}, {1, "organ"}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    CaseSummary c;
    c.image = c.label = str("case", i);
    c.shape = shapes[i];
    c.channels = 1;
    c.crop.shape_after_crop = c.shape;
    c.crop.spacing = spacing;
    c.crop.samples = {{1.0, 2.0, 3.0}};
    c.crop.foreground_voxels = 3;
    c.label_voxels = {{0, shapes[i][0] * shapes[i][1] * shapes[i][2] - 3}, {1, 3}};
    fp.cases.push_back(c);
  }
  fp.listed = fp.cases.size();
  return fp;
}

/// A CPU plan's compute budget: nnU-Net's network at the memory budget's patch is narrowed
/// (32 -> 16 -> 8 channels) before its patch shrinks, until a training step fits.
TEST(Plan, ACpuPlanFitsItsComputeBudgetNarrowerFirst) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 4, "96,96,40", "1,1,1"));
  const DatasetFingerprint fp = dataset_fingerprint(dir / "ds", few_samples());
  PlanOptions none{"cpu", 2ULL << 30, 0, 0, 10, "run"};
  none.step_macs_budget = 0;
  const Plan wide = make_plan(fp, none);
  EXPECT_EQ(wide.step_macs_budget, 0);
  EXPECT_EQ(wide.network.filters.front(), 32);
  ASSERT_GT(training_step_macs(wide.network, wide.patch.topology.patch, 2), kCpuStepMacs);  // the premise

  const Plan cpu = make_plan(fp, {"cpu", 2ULL << 30, 0, 0, 10, "run"});  // the default budget
  EXPECT_EQ(cpu.step_macs_budget, kCpuStepMacs);
  EXPECT_LE(cpu.step_macs, kCpuStepMacs);
  // Each case of a step gives kCropsPerCase crops; the step's compute and memory count them all.
  EXPECT_EQ(cpu.crops_per_case, kCropsPerCase);
  const std::int64_t crops = cpu.patch.batch_size * kCropsPerCase;
  EXPECT_DOUBLE_EQ(cpu.step_macs, training_step_macs(cpu.network, cpu.patch.topology.patch, crops));
  EXPECT_DOUBLE_EQ(cpu.memory.total(), training_memory(cpu.network, cpu.patch.topology.patch, crops).total());
  EXPECT_EQ(run_config(fp, cpu, dir / "ds/dataset.json")["data"]["random"][0]["num_samples"], kCropsPerCase);
  const std::int64_t base = cpu.network.filters.front();
  EXPECT_TRUE(base == 16 || base == 8) << base;
  EXPECT_EQ(*std::max_element(cpu.network.filters.begin(), cpu.network.filters.end()),
            std::min<std::int64_t>(10 * base, base << (cpu.network.filters.size() - 1)));
  // The narrowest base, or one that kept at least half of the memory budget's patch.
  EXPECT_TRUE(base == 8 || 2 * voxels(cpu.patch.topology.patch) >= voxels(wide.patch.topology.patch));
  EXPECT_GE(cpu.patch.batch_size, 2);
  if (cpu.patch.batch_size > 2) {
    EXPECT_GT(training_step_macs(cpu.network, cpu.patch.topology.patch, crops + kCropsPerCase), kCpuStepMacs);
  }
  EXPECT_NE(cpu.compute_reason.find("the spleen recipe's step"), std::string::npos) << cpu.compute_reason;
  const std::string yaml = run_config_yaml(fp, cpu, dir / "ds/dataset.json");
  std::string comments = yaml;  // the comments' wrapped lines as one text
  for (std::size_t at; (at = comments.find("\n# ")) != std::string::npos;) comments.replace(at, 3, " ");
  EXPECT_NE(comments.find(str("channels ", base, "..", 10 * base, " (nnU-Net's 32..320 narrowed to fit the compute budget)")),
            std::string::npos)
      << yaml;
  EXPECT_NE(yaml.find("(budget a CPU plan's default, the spleen recipe's step: 128 GMAC a step"), std::string::npos)
      << yaml;
  EXPECT_NE(comments.find(str("batch size ", cpu.patch.batch_size, " cases (", crops, " crops)")), std::string::npos)
      << yaml;
  const nlohmann::json j = plan_json(fp, cpu);
  EXPECT_EQ(j["step_macs_budget"], kCpuStepMacs);
  // Validation within the budget: windows overlapping by a quarter (nnU-Net's half without).
  EXPECT_EQ(run_config(fp, cpu, dir / "ds/dataset.json")["validation"]["sliding_window"]["overlap"], 0.25);
  EXPECT_EQ(run_config(fp, wide, dir / "ds/dataset.json")["validation"]["sliding_window"]["overlap"], 0.5);
  EXPECT_EQ(j["network"]["filters"][0], base);

  // A roomier --compute: at least as wide, never over it.
  PlanOptions roomy{"cpu", 2ULL << 30, 0, 0, 10, "run"};
  roomy.step_macs_budget = 8 * kCpuStepMacs;
  const Plan more = make_plan(fp, roomy);
  EXPECT_LE(more.step_macs, roomy.step_macs_budget);
  EXPECT_GE(more.network.filters.front(), base);
  EXPECT_NE(more.compute_reason.find("--compute"), std::string::npos) << more.compute_reason;
  // On CUDA no compute budget unless asked.
  const Plan gpu = make_plan(fp, {"cuda", 0, 10ULL << 30, 16ULL << 30, 10, "run"});
  EXPECT_EQ(gpu.step_macs_budget, 0);
  EXPECT_EQ(gpu.network.filters.front(), 32);
  EXPECT_EQ(gpu.crops_per_case, 1);  // nnU-Net's one patch a sample
  EXPECT_NE(run_config_yaml(fp, gpu, dir / "ds/dataset.json").find("(no compute budget)"), std::string::npos);
  // Images whose memory plan already fits keep nnU-Net's channels.
  test::TempDir small_dir;
  synthesize_dataset(synth(small_dir / "ds", 4, "24,24,8", "1,1,1"));
  const DatasetFingerprint small_fp = dataset_fingerprint(small_dir / "ds", few_samples());
  const Plan small = make_plan(small_fp, {"cpu", 2ULL << 30, 0, 0, 10, "run"});
  EXPECT_EQ(small.network.filters.front(), 32);
  EXPECT_NE(small.compute_reason.find("which the memory budget's plan fits"), std::string::npos)
      << small.compute_reason;
  EXPECT_EQ(small.crops_per_case, kCropsPerCase);  // a step of 2 cases of 4 crops is far within it
  EXPECT_LE(small.step_macs, kCpuStepMacs);
  // ... and as many crops a case (up to kCropsPerCase) as the budget still allows; where not
  // even one a case fits, fewer cases a step. 1000 small cases: the memory plan's batch is
  // large (the 5% cap); a budget of 8 of its crops takes one crop from each of 8 cases.
  const DatasetFingerprint many = hand_made(std::vector<Shape>(1000, Shape{40, 40, 24}), {1.0, 1.0, 1.5});
  const Plan unbudgeted = make_plan(many, {"cpu", 64ULL << 30, 0, 0, 10, "run", 0});
  ASSERT_GT(unbudgeted.patch.batch_size, 8);
  const double crop_macs = training_step_macs(unbudgeted.network, unbudgeted.patch.topology.patch, 1);
  for (const auto& [crops, cases, per_case] : std::vector<std::tuple<double, std::int64_t, std::int64_t>>{
           {8, 8, 1}, {2.0 * unbudgeted.patch.batch_size, unbudgeted.patch.batch_size, 2}}) {
    SCOPED_TRACE(crops);
    const Plan q = make_plan(many, {"cpu", 64ULL << 30, 0, 0, 10, "run", crops * crop_macs * (1 + 1e-9)});
    EXPECT_EQ(q.network.filters, unbudgeted.network.filters);  // the memory plan's network
    EXPECT_EQ(q.crops_per_case, per_case);
    EXPECT_EQ(q.patch.batch_size, cases);
    EXPECT_LE(q.step_macs, q.step_macs_budget);
  }
  // Too small for any patch: an error that names the compute budget and what to do.
  PlanOptions tiny{"cpu", 2ULL << 30, 0, 0, 10, "run"};
  tiny.step_macs_budget = 1e3;
  const std::string e = test::value_error_of([&] { make_plan(fp, tiny); });
  EXPECT_NE(e.find("no patch fits the compute budget"), std::string::npos) << e;
  EXPECT_NE(e.find("raise --compute"), std::string::npos) << e;
  // One that a patch of a few voxels would fit: refused too, not a one-level network.
  tiny.step_macs_budget = 1e6;
  const std::string shallow = test::value_error_of([&] { make_plan(fp, tiny); });
  EXPECT_NE(shallow.find("too small to learn from"), std::string::npos) << shallow;
  EXPECT_NE(shallow.find("raise --compute"), std::string::npos) << shallow;
}

TEST(Plan, TheYamlIsTheRunConfigAndTrainReadsIt) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 4, "40,40,12", "1.5,1.5,3"));
  const DatasetFingerprint fp = dataset_fingerprint(dir / "ds", few_samples());
  const Plan p = make_plan(fp, {"cpu", 1ULL << 30, 0, 0, 3, "run"});
  const std::string yaml = run_config_yaml(fp, p, dir / "ds/dataset.json");
  test::write_file(dir / "plan.yaml", yaml);
  const nlohmann::json read = data::load_yaml_as_json(dir / "plan.yaml");
  EXPECT_EQ(read, run_config(fp, p, dir / "ds/dataset.json"));
  EXPECT_NE(yaml.find("# nnU-Net's target spacing"), std::string::npos);
  EXPECT_NE(yaml.find("# Compute: about "), std::string::npos);
  EXPECT_GT(p.step_macs, 0);
  EXPECT_DOUBLE_EQ(p.step_macs,
                   training_step_macs(p.network, p.patch.topology.patch, p.patch.batch_size * p.crops_per_case));
  const train::RunConfig rc = train::load_run_config(read, dir / "plan.yaml", Settings{});
  (void)rc;
  const nlohmann::json j = plan_json(fp, p);
  for (const char* k : {"target_spacing", "median_shape", "patch_size", "batch_size", "normalization", "network",
                        "estimated_memory_bytes", "estimated_step_macs", "estimated_validation_macs_per_voxel",
                        "validation_window", "largest_case", "estimated_validation_memory_bytes", "crops_per_case"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  for (const char* k : {"name", "strides", "kernel_sizes", "filters"}) EXPECT_TRUE(j["network"].contains(k)) << k;
  for (const char* k : {"kind", "clip", "mean", "std"}) EXPECT_TRUE(j["normalization"][0].contains(k)) << k;
}

TEST(Plan, TheYamlOfAnMrPlanWithNotesReadsBack) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 4, "48,48,10", "0.9,0.9,4", "MR"));
  DatasetFingerprint fp = dataset_fingerprint(dir / "ds", few_samples());
  // A note whose text has line breaks (a matrix in a message): still comments.
  fp.notes.push_back({dir / "ds/x.nii.gz", "an affine\n[1 0 0]\n[0 1 0]", "left out of the plan and the run", true});
  const Plan p = make_plan(fp, {"cpu", 1ULL << 30, 0, 0, 3, "run"});
  const std::string yaml = run_config_yaml(fp, p, dir / "ds/dataset.json");
  test::write_file(dir / "plan.yaml", yaml);
  const nlohmann::json read = data::load_yaml_as_json(dir / "plan.yaml");
  EXPECT_EQ(read, run_config(fp, p, dir / "ds/dataset.json"));
  bool crop = false, masked = false;
  for (const auto& s : read["data"]["deterministic"]) {
    crop = crop || (s["name"] == "CropForeground" && s["nonzero"] == true);
    masked = masked || (s["name"] == "NormalizeIntensity" && s["nonzero"] == true);
  }
  EXPECT_TRUE(crop);
  EXPECT_TRUE(masked);
  (void)train::load_run_config(read, dir / "plan.yaml", Settings{});
}

/// Validation windows are the patch (nnU-Net's), Gaussian-weighted, overlapping by a quarter
/// within a compute budget and by half without one. Their memory: a window's forward and the
/// sliding window's case-sized buffers for the largest case at the target spacing.
TEST(Plan, ValidationWindowsAreThePatch) {
  const DatasetFingerprint fp =
      hand_made({{120, 100, 30}, {131, 97, 34}, {110, 104, 28}, {125, 90, 31}, {118, 99, 29}}, {1.0, 1.0, 2.5});
  const std::uint64_t budget = 2ULL << 30;
  const Plan p = make_plan(fp, {"cpu", budget, 0, 0, 10, "run", -1});  // the CPU's compute budget
  ASSERT_GT(p.step_macs_budget, 0);
  ASSERT_FALSE(p.lowres);
  EXPECT_EQ(p.largest_case, (Shape{131, 104, 34}));
  const Topology& t = p.patch.topology;
  EXPECT_EQ(p.validation_window, t.patch);
  EXPECT_EQ(p.validation_batch, std::min<std::int64_t>(p.patch.batch_size, 4));
  EXPECT_LE(p.validation_memory, static_cast<double>(budget));
  EXPECT_DOUBLE_EQ(p.validation_memory,
                   static_cast<double>(p.validation_batch) * inference_memory(p.network, t.patch, 4) +
                       3.0 * 2 * 4 * (131.0 * 104 * 34));  // 2 classes
  EXPECT_EQ(p.validation_overlap, 0.25);
  const nlohmann::json c = run_config(fp, p, "ds/dataset.json");
  EXPECT_EQ(c["validation"]["sliding_window"]["roi_size"], nlohmann::json(t.patch));
  EXPECT_EQ(c["validation"]["sliding_window"]["sw_batch_size"], std::min<std::int64_t>(p.patch.batch_size, 4));
  EXPECT_EQ(c["validation"]["sliding_window"]["overlap"], 0.25);
  EXPECT_EQ(c["validation"]["sliding_window"]["mode"], "gaussian");
  const nlohmann::json j = plan_json(fp, p);
  EXPECT_EQ(j["validation_window"], nlohmann::json(t.patch));
  EXPECT_EQ(j["largest_case"], nlohmann::json(p.largest_case));
  EXPECT_EQ(j["validation_interval"], p.validation_interval);
  EXPECT_EQ(j["validation_overlap"], 0.25);
  std::string yaml = run_config_yaml(fp, p, "ds/dataset.json");
  for (std::size_t at; (at = yaml.find("\n  # ")) != std::string::npos;) yaml.replace(at, 5, " ");
  EXPECT_NE(yaml.find("nnU-Net's windows of the patch, Gaussian-weighted"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("for the largest case (131 x 104 x 34)"), std::string::npos) << yaml;
  EXPECT_NE(plan_summary(fp, p).find(str("validation: every ", p.validation_interval, " epoch(s), windows of ",
                                         t.patch[0], " x ", t.patch[1], " x ", t.patch[2], " overlapping by 0.25")),
            std::string::npos)
      << plan_summary(fp, p);

  // No compute budget (a GPU's plan, --compute 0): half overlapping.
  const Plan none = make_plan(fp, {"cpu", budget, 0, 0, 10, "run", 0});
  EXPECT_EQ(none.validation_window, none.patch.topology.patch);
  const nlohmann::json n = run_config(fp, none, "ds/dataset.json")["validation"]["sliding_window"];
  EXPECT_EQ(n["roi_size"], nlohmann::json(none.patch.topology.patch));
  EXPECT_EQ(n["overlap"], 0.5);
  EXPECT_EQ(n["sw_batch_size"], std::min<std::int64_t>(none.patch.batch_size, 4));
}

/// Within a compute budget, nnU-Net's 3d_lowres rule: where the budget's patch holds less than
/// a quarter of the median case, the spacing grows 3% a step (on an anisotropic set the finer
/// axes first, until within 2x of the coarsest) until it holds a quarter; the median case is
/// the full-resolution one rescaled. Without a compute budget (or where the patch holds a
/// quarter), the full-resolution spacing.
TEST(Plan, ACpuPlanTrainsAtNnunetsLowresSpacingWhereItsPatchSeesTooLittle) {
  const auto steps_of = [](double ratio) { return std::log(ratio) / std::log(kLowresSpacingStep); };
  const auto expect_lowres = [&](const Plan& p) {
    ASSERT_TRUE(p.lowres);
    const double median = p.median_shape[0] * p.median_shape[1] * p.median_shape[2];
    EXPECT_GE(static_cast<double>(p.patch.topology.patch[0] * p.patch.topology.patch[1] * p.patch.topology.patch[2]),
              kLowresThreshold * median);
    for (int d = 0; d < 3; ++d) {
      const double n = steps_of(p.target_spacing[d] / p.fullres_spacing[d]);
      EXPECT_NEAR(n, std::round(n), 1e-6) << d;  // whole 3% steps
      EXPECT_EQ(p.median_shape[d], std::round(p.fullres_spacing[d] / p.target_spacing[d] * p.fullres_median_shape[d]))
          << d;
    }
  };
  // Isotropic CT, 224 x 224 x 160 at 1.2 mm: the CPU's patch is a few percent of a case.
  const DatasetFingerprint ct = hand_made(std::vector<Shape>(8, Shape{224, 224, 160}), {1.2, 1.2, 1.2});
  const Plan p = make_plan(ct, {"cpu", 6ULL << 30, 0, 0, 10, "run", -1});
  ASSERT_GT(p.step_macs_budget, 0);
  EXPECT_EQ(p.fullres_spacing, (Spacing{1.2, 1.2, 1.2}));
  EXPECT_EQ(p.fullres_median_shape, (Spacing{224, 224, 160}));
  expect_lowres(p);
  EXPECT_DOUBLE_EQ(p.target_spacing[0], p.target_spacing[2]);  // every axis alike
  // Pinned: 20 steps (1.2 x 1.03^20 = 2.167 mm, a median case of 124 x 124 x 89), the
  // ct_fine plan of docs/plan.md.
  EXPECT_NEAR(p.target_spacing[0], 1.2 * std::pow(kLowresSpacingStep, 20), 1e-9);
  EXPECT_EQ(p.median_shape, (Spacing{124, 124, 89}));
  EXPECT_EQ(p.largest_case, (Shape{124, 124, 89}));
  std::string yaml = run_config_yaml(ct, p, "ds/dataset.json");
  for (std::size_t at; (at = yaml.find("\n    # ")) != std::string::npos;) yaml.replace(at, 7, " ");
  EXPECT_NE(yaml.find("nnU-Net's 3d_lowres spacing: its target spacing (1.2 x 1.2 x 1.2 mm) grown 3% a step"),
            std::string::npos)
      << yaml;
  const nlohmann::json c = run_config(ct, p, "ds/dataset.json");
  nlohmann::json spacing;
  for (const auto& step : c["data"]["deterministic"]) {
    if (step["name"] == "Spacing") spacing = step["pixdim"];
  }
  EXPECT_NEAR(spacing[0].get<double>(), p.target_spacing[0], 1e-5);
  const nlohmann::json j = plan_json(ct, p);
  EXPECT_EQ(j["lowres"], true);
  EXPECT_EQ(j["fullres_spacing"], nlohmann::json(p.fullres_spacing));
  EXPECT_NE(plan_summary(ct, p).find("(nnU-Net's 3d_lowres; full resolution 1.2 x 1.2 x 1.2 mm)"), std::string::npos)
      << plan_summary(ct, p);

  // Anisotropic (0.5 x 0.5 x 3 mm): the in-plane axes grow first; the slices stay 3 mm until
  // the others are within 2x of them.
  const DatasetFingerprint mr = hand_made(std::vector<Shape>(8, Shape{448, 448, 48}), {0.5, 0.5, 3.0});
  const Plan q = make_plan(mr, {"cpu", 6ULL << 30, 0, 0, 10, "run", -1});
  expect_lowres(q);
  EXPECT_EQ(q.target_spacing[2], q.fullres_spacing[2]);
  EXPECT_GT(q.target_spacing[0], q.fullres_spacing[0]);

  // Cubes of 64..160 voxels: the larger ones go to 3d_lowres, the smaller keep full resolution
  // where their patch holds a quarter of the case; either way the patch holds a quarter.
  int lowres = 0, fullres = 0;
  for (std::int64_t n = 64; n <= 160; n += 8) {
    SCOPED_TRACE(n);
    const DatasetFingerprint cube = hand_made(std::vector<Shape>(8, Shape{n, n, n}), {1.0, 1.0, 1.0});
    const Plan cp = make_plan(cube, {"cpu", 6ULL << 30, 0, 0, 10, "run", -1});
    const Shape& w = cp.patch.topology.patch;
    const double patch = static_cast<double>(w[0] * w[1] * w[2]);
    const double scale = cp.fullres_spacing[0] / cp.target_spacing[0];
    const double median = std::pow(static_cast<double>(n) * scale, 3);  // unrounded
    EXPECT_GE(patch, kLowresThreshold * median);
    if (cp.lowres) {
      ++lowres;
      EXPECT_GT(static_cast<double>(n * n * n), median);
    } else {
      ++fullres;
      EXPECT_EQ(cp.target_spacing, (Spacing{1.0, 1.0, 1.0}));
    }
  }
  EXPECT_GT(lowres, 0);
  EXPECT_GT(fullres, 0);

  // No compute budget: nnU-Net's 3d_fullres, as nnU-Net trains it.
  const Plan none = make_plan(ct, {"cpu", 6ULL << 30, 0, 0, 10, "run", 0});
  EXPECT_FALSE(none.lowres);
  EXPECT_EQ(none.target_spacing, none.fullres_spacing);
  EXPECT_EQ(plan_json(ct, none)["lowres"], false);
}

/// The validation interval: the fewest epochs whose training keeps validation's forwards within
/// a third of the run's MACs (at most the run's epochs).
TEST(Plan, ValidationTakesAtMostAThirdOfTheRun) {
  std::vector<Shape> shapes(16, Shape{192, 192, 72});
  const DatasetFingerprint fp = hand_made(shapes, {1.5, 1.5, 3.0});
  for (const int validation : {3, 9}) {
    PlanOptions o{"cpu", 6ULL << 30, 0, 0, 100, "run", -1};
    o.validation_cases = validation;
    const Plan p = make_plan(fp, o);
    SCOPED_TRACE(validation);
    ASSERT_TRUE(p.lowres);  // windows counted in the median case at the 3d_lowres spacing
    EXPECT_EQ(p.validation_cases, static_cast<std::size_t>(validation));
    const std::int64_t steps = (16 - validation + p.patch.batch_size - 1) / p.patch.batch_size;
    EXPECT_DOUBLE_EQ(p.epoch_macs, static_cast<double>(steps) * p.step_macs);
    double windows = 1;  // of the median case at the plan's spacing, overlapping by a quarter
    for (int d = 0; d < 3; ++d) {
      const double roi = static_cast<double>(p.validation_window[d]);
      if (p.median_shape[d] > roi) windows *= std::ceil((p.median_shape[d] - roi) / (0.75 * roi)) + 1;
    }
    EXPECT_EQ(p.validation_windows, windows);
    EXPECT_DOUBLE_EQ(p.validation_epoch_macs,
                     validation * windows * forward_macs(p.network, p.validation_window, false));
    const auto share = [&](int k) { return p.validation_epoch_macs / (k * p.epoch_macs + p.validation_epoch_macs); };
    EXPECT_LE(share(p.validation_interval), 1.0 / 3 + 1e-12);
    if (p.validation_interval > 1) EXPECT_GT(share(p.validation_interval - 1), 1.0 / 3);
    EXPECT_EQ(run_config(fp, p, "ds/dataset.json")["validation"]["interval"], p.validation_interval);
    EXPECT_EQ(run_config(fp, p, "ds/dataset.json")["data"]["validation"]["num"], validation);
  }
  // 9 of 16 cases validating every epoch would take over a third: every few epochs instead.
  PlanOptions nine{"cpu", 6ULL << 30, 0, 0, 100, "run", -1};
  nine.validation_cases = 9;
  EXPECT_GT(make_plan(fp, nine).validation_interval, 1);
  // Never more epochs apart than the run has.
  nine.epochs = 1;
  EXPECT_EQ(make_plan(fp, nine).validation_interval, 1);
  nine.epochs = 100;
  nine.validation_cases = 16;
  EXPECT_NE(test::value_error_of([&] { make_plan(fp, nine); }).find("leave none of its 16 to train on"),
            std::string::npos);
  nine.validation_cases = -5;
  EXPECT_NE(test::value_error_of([&] {
              make_plan(fp, nine);
            }).find("-5 validation cases: expected 0 or more (0: none), or -1"),
            std::string::npos);
}

/// SGD's momentum by the run's length: nnU-Net's 0.99 (lr 0.01) for 10,000 steps or more, else
/// 0.9 (lr 0.1), the same step lr / (1 - momentum).
TEST(Plan, ShortRunsTakeTheShorterMomentum) {
  const DatasetFingerprint fp =
      hand_made({{40, 40, 24}, {40, 40, 24}, {40, 40, 24}, {40, 40, 24}, {40, 40, 24}}, {1.0, 1.0, 1.5});
  const Plan short_run = make_plan(fp, {"cpu", 1ULL << 30, 0, 0, 100, "run", 0});
  const std::int64_t steps_an_epoch = (5 - 1 + short_run.patch.batch_size - 1) / short_run.patch.batch_size;
  EXPECT_EQ(short_run.validation_cases, 1U);
  EXPECT_EQ(short_run.planned_steps, 100 * steps_an_epoch);
  EXPECT_EQ(short_run.momentum, kShortRunMomentum);
  EXPECT_EQ(short_run.lr, 0.1);
  const nlohmann::json o = run_config(fp, short_run, "ds/dataset.json")["optimizer"];
  EXPECT_EQ(o["momentum"], 0.9);
  EXPECT_EQ(o["lr"], 0.1);
  EXPECT_EQ(o["nesterov"], true);
  std::string yaml = run_config_yaml(fp, short_run, "ds/dataset.json");
  for (std::size_t at; (at = yaml.find("\n# ")) != std::string::npos;) yaml.replace(at, 3, " ");
  EXPECT_NE(yaml.find(str("this run has about ", 100 * steps_an_epoch, " (100 epochs of ", steps_an_epoch, ")")),
            std::string::npos)
      << yaml;
  const int long_epochs = static_cast<int>((kLongRunSteps + steps_an_epoch - 1) / steps_an_epoch);
  const Plan long_run = make_plan(fp, {"cpu", 1ULL << 30, 0, 0, long_epochs, "run", 0});
  EXPECT_GE(long_run.planned_steps, kLongRunSteps);
  EXPECT_EQ(long_run.momentum, kLongRunMomentum);
  EXPECT_EQ(run_config(fp, long_run, "ds/dataset.json")["optimizer"]["lr"], 0.01);
  const Plan just_short = make_plan(fp, {"cpu", 1ULL << 30, 0, 0, long_epochs - 1, "run", 0});
  EXPECT_LT(just_short.planned_steps, kLongRunSteps);
  EXPECT_EQ(just_short.momentum, kShortRunMomentum);
}

/// A hand-made fingerprint of many cases, so that the 5% cap leaves the budget to decide the
/// batch: the largest batch whose estimate fits, and one more would not.
TEST(Plan, TheBatchIsTheLargestThatFits) {  // memory alone (no compute budget)
  DatasetFingerprint fp;
  fp.list = "hand-made";
  fp.channel_names = {"MR"};
  fp.label_names = {{0, "background"}, {1, "organ"}};
  for (int i = 0; i < 1000; ++i) {  // the 5% cap: 50 patches
    CaseSummary c;
    c.image = c.label = str("case", i);
    c.shape = {40, 40, 24};
    c.channels = 1;
    c.crop.shape_after_crop = c.shape;
    c.crop.spacing = {1.0, 1.0, 1.5};
    c.crop.samples = {{1.0, 2.0, 3.0}};
    c.crop.foreground_voxels = 3;
    c.label_voxels = {{0, 40 * 40 * 24 - 3}, {1, 3}};
    fp.cases.push_back(c);
  }
  fp.listed = fp.cases.size();
  const Plan p = make_plan(fp, {"cpu", 1536ULL << 20, 0, 0, 10, "run", 0});
  EXPECT_GT(p.patch.batch_size, 2);
  EXPECT_LT(p.patch.batch_size, 50);
  EXPECT_LE(p.memory.total(), 1536.0 * (1 << 20));
  EXPECT_GT(training_memory(p.network, p.patch.topology.patch, p.patch.batch_size + 1).total(), 1536.0 * (1 << 20));
}

TEST(PlanDataset, TheCacheServesAListWithACaseMoreAndKeepsOtherLists) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 5, "32,32,10", "1.5,1.5,3"));
  nlohmann::json list = nlohmann::json::parse(test::read_file(dir / "ds/dataset.json"));
  nlohmann::json four = list;
  four["training"].erase(4);
  test::write_file(dir / "ds/four.json", four.dump());
  FingerprintOptions o = few_samples();  // 4000: 1000 a case of four (1024 drawn), 800 of five
  EXPECT_EQ(dataset_fingerprint(dir / "ds/four.json", o).read, 4u);
  const DatasetFingerprint five = dataset_fingerprint(dir / "ds/dataset.json", o);
  EXPECT_EQ(five.read, 1u);
  EXPECT_EQ(five.from_cache, 4u);
  EXPECT_EQ(five.cases[0].crop.samples[0].size(), 800u);
  // The list of four again: all its cases still there.
  EXPECT_EQ(dataset_fingerprint(dir / "ds/four.json", o).read, 0u);
}

TEST(PlanCli, PlanThenTrainTheDataset) {
  test::TempDir dir;
  synthesize_dataset(synth(dir / "ds", 4, "32,32,12", "1.5,1.5,3"));
  const std::string bin = test::medfast_binary() + " --threads 1 ";
  auto r = test::run(bin + "plan --dataset " + dir / "ds" + " --memory 1GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["fingerprint"]["cases_kept"], 4);
  EXPECT_EQ(j["budget_bytes"], 1ULL << 30);
  r = test::run(bin + "plan --dataset " + dir / "ds/dataset.json" + " --memory 1GiB --out " + dir / "p/plan.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("from the cache"), std::string::npos) << r.out;  // the second plan reads no case
  EXPECT_TRUE(os::exists(dir / "p/plan.yaml"));
  // train --dataset: plan (summary first), write <run_dir>/plan.yaml, train it.
  r = test::run("cd " + dir.path() + " && " + bin +
                "train --dataset ds --set train.epochs=1 --set train.run_dir=runs/x --set data.validation.num=2");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(r.out.rfind("plan for ", 0), 0u) << r.out;
  EXPECT_TRUE(os::exists(dir / "runs/x/plan.yaml"));
  EXPECT_TRUE(os::exists(dir / "runs/x/last.ckpt"));
  // Planned for the epochs and validation cases asked for: its validation interval (at most
  // the epochs), momentum and decay.
  const nlohmann::json planned = data::load_yaml_as_json(dir / "runs/x/plan.yaml");
  EXPECT_EQ(planned["train"]["epochs"], 1);
  EXPECT_EQ(planned["validation"]["interval"], 1);
  EXPECT_EQ(planned["data"]["validation"]["num"], 2);
  const std::string yaml = test::read_file(dir / "runs/x/plan.yaml");
  EXPECT_NE(yaml.find("every 1 epoch(s) and the last"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("a validation is 2 cases"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("cases validate (as asked)"), std::string::npos) << yaml;
  // As many validation cases as cases: nothing would train.
  r = test::run(bin + "plan --dataset " + dir / "ds" + " --memory 1GiB --validation 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("4 validation cases leave none of its 4 to train on (data.validation.num: at most 3)"),
            std::string::npos)
      << r.err;
  // The run's folder holds a run now: without --resume or --overwrite, refused before
  // planning; with --resume, the run's own plan (not planned again).
  const std::string plan_text = test::read_file(dir / "runs/x/plan.yaml");
  r = test::run("cd " + dir.path() + " && " + bin + "train --dataset ds --set train.epochs=1 --set train.run_dir=runs/x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("already holds a run"), std::string::npos) << r.err;
  r = test::run("cd " + dir.path() + " && " + bin + "train --dataset ds --resume --set train.epochs=2 --set train.run_dir=runs/x");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("resuming with the run's plan"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(dir / "runs/x/plan.yaml"), plan_text);
  // A case left out by the plan is not in the run's list.
  test::write_file(dir / "ds/imagesTr/spleen_1.nii.gz", "not a NIfTI file");
  r = test::run("cd " + dir.path() + " && " + bin + "train --dataset ds --set train.epochs=1 --set train.run_dir=runs/y");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("spleen_1.nii.gz: cannot be used"), std::string::npos) << r.out;
  const std::string kept = test::read_file(dir / "runs/y/plan.dataset.json");
  EXPECT_EQ(kept.find("spleen_1.nii.gz"), std::string::npos) << kept;
  EXPECT_NE(kept.find("spleen_2.nii.gz"), std::string::npos) << kept;
  EXPECT_NE(test::read_file(dir / "runs/y/plan.yaml").find(dir / "runs/y/plan.dataset.json"), std::string::npos);
  // Under a launcher: refused with what to do instead.
  r = test::run("cd " + dir.path() + " && RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 " + bin +
                "train --dataset ds --set train.run_dir=runs/z");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("plan once with `medfast plan"), std::string::npos) << r.err;
  // Bad input is a message and exit 1, not a crash.
  r = test::run(bin + "plan --dataset " + dir / "nope");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no such dataset folder"), std::string::npos) << r.err;
  r = test::run(bin + "plan --dataset " + dir / "ds" + " --memory lots");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--memory 'lots'"), std::string::npos) << r.err;
  r = test::run(bin + "plan --dataset " + dir / "ds" + " --device cuda:x --memory 1GiB");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--device 'cuda:x' is not one of cpu | cuda | cuda:N"), std::string::npos) << r.err;
  // --out elsewhere: the run's folder is absolute, from where plan ran.
  r = test::run("cd " + dir.path() + " && " + bin + "plan --dataset ds --memory 1GiB --out deep/down/plan.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(test::read_file(dir / "deep/down/plan.yaml").find("run_dir: \"" + dir / "runs/ds\""), std::string::npos);
  // --out into the run's own folder (the README's three commands): plan claims it as train
  // --dataset does, and `train --config` of the plan then trains there.
  r = test::run("cd " + dir.path() + " && " + bin + "plan --dataset ds --memory 1GiB --epochs 1 --out runs/ds/plan.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run("cd " + dir.path() + " && " + bin + "train --config runs/ds/plan.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(os::exists(dir / "runs/ds/last.ckpt"));
  // A folder of the user's own is refused, and what it holds is left as it was.
  os::make_directories(dir / "mine");
  test::write_file(dir / "mine/notes.txt", "mine");
  r = test::run("cd " + dir.path() + " && " + bin + "plan --dataset ds --memory 1GiB --run-dir mine --out mine/plan.yaml");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the folder is not empty and medfast did not make it"), std::string::npos) << r.err;
  EXPECT_FALSE(os::exists(dir / "mine/plan.yaml"));
  EXPECT_EQ(test::read_file(dir / "mine/notes.txt"), "mine");
}

}  // namespace
}  // namespace medfast::plan
