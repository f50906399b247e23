// DICOM through the tensor layer: LoadImage pairing a series with its SEG, patient
// identifiers kept out of volumes and `info`, the cache identity of a series folder, data
// convert checked by nibabel, and the DICOM path giving the same geometry as the NIfTI path
// through Orientation and Spacing. (Golden parity and bad inputs: test_dicom_golden.cpp.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "medfast/cache/store.hpp"
#include "medfast/core/log.hpp"
#include "medfast/data/cached_dataset.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/dicom.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "medfast/transforms/transform.hpp"
#include "dicom_golden.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

using test::dicom_dir;
using test::dicom_manifest;

// Through the tensor layer: LoadImage reads a series folder and places a SEG (or an RT
// Structure Set); the volume keeps the series (for the SEG) but no patient identifier.
// The same for an RT Structure Set, whose contours are rasterised.
class DicomLoadLabels : public ::testing::TestWithParam<std::string> {};

TEST_P(DicomLoadLabels, LoadImagePairsASeriesWithItsSeg) {
  const auto m = dicom_manifest();
  const nlohmann::json* seg_case = nullptr;
  for (const auto& c : m["segs"]) {
    if (c["name"] == GetParam()) seg_case = &c;
  }
  ASSERT_NE(seg_case, nullptr);
  ASSERT_EQ((*seg_case)["label_dict"], nlohmann::json::parse(R"([["GTV-1", 1], ["Lung", 2]])"));
  const std::string chain = R"([{"name": "LoadImage", "keys": ["image", "label"], "dtype": ["", ""],
                                "label_dict": [["GTV-1", 1], ["Lung", 2]]}])";
  const auto compose = transforms::make_chain(nlohmann::json::parse(chain));
  Sample s;
  s.meta["image"] = dicom_dir() + "/" + (*seg_case)["reference"].get<std::string>();
  s.meta["label"] = dicom_dir() + "/" + (*seg_case)["seg"].get<std::string>();
  compose.apply(s);
  const Volume& img = s.volume("image");
  const Volume& lab = s.volume("label");
  EXPECT_EQ(img.data.sizes(), lab.data.sizes());
  EXPECT_EQ(img.affine, lab.affine);
  EXPECT_EQ(lab.data.scalar_type(), at::kByte);
  const std::string bytes = test::read_file(dicom_dir() + "/" + (*seg_case)["expect"]["voxels"].get<std::string>());
  const at::Tensor file_order = lab.data.permute({2, 1, 0}).contiguous();
  ASSERT_EQ(static_cast<std::size_t>(file_order.numel()), bytes.size());
  EXPECT_EQ(std::memcmp(file_order.data_ptr(), bytes.data(), bytes.size()), 0);
  ASSERT_TRUE(img.meta.dicom);
  for (const auto& phi : m["phi"]) {
    const std::string p = phi.get<std::string>();
    for (const auto& [k, v] : img.meta.dicom->phi) EXPECT_EQ(v.find(p), std::string::npos) << k;
    EXPECT_EQ(img.meta.descrip.find(p), std::string::npos);
  }
  // A SEG alone is not an image: a clear error says to load it with its series.
  EXPECT_VALUE_ERROR(read_image(s.meta["label"].get<std::string>()), "load it together with its image");
}

INSTANTIATE_TEST_SUITE_P(SegAndRtstruct, DicomLoadLabels, ::testing::Values("seg_binary", "rtstruct_gtv_last_wins"));

// Orientation and Spacing give the same geometry and values on a DICOM series as on the
// same volume written as NIfTI (data synth writes both from one generator).
TEST(DicomLoad, GeometryEqualsTheNiftiPathThroughOrientationAndSpacing) {
  test::TempDir dir;
  SynthOptions o;
  o.set_cases(1).set_size("40,36,14").set_spacing({1.2, 0.9, 3.0});
  o.seed = 5;
  o.out_dir = dir / "nifti";
  synthesize_dataset(o);
  o.out_dir = dir / "dicom";
  o.set_format("dicom");
  if (!build::kGdcm) {  // a build without GDCM says what writing DICOM needs
    const std::string m = test::error_of<Error>([&] { synthesize_dataset(o); });
    EXPECT_NE(m.find("MEDFAST_WITH_GDCM"), std::string::npos) << m;
    return;
  }
  synthesize_dataset(o);
  const std::string chain = R"([{"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", ""]},
    {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
    {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"},
    {"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.5, 1.5, 2.0], "mode": ["bilinear", "nearest"]}])";
  const auto compose = transforms::make_chain(nlohmann::json::parse(chain));
  Sample a, b;
  a.meta = {{"image", dir / "nifti/imagesTr/spleen_0.nii.gz"}, {"label", dir / "nifti/labelsTr/spleen_0.nii.gz"}};
  b.meta = {{"image", dir / "dicom/case_000/CT"}, {"label", dir / "dicom/case_000/seg.dcm"}};
  compose.apply(a);
  compose.apply(b);
  // NIfTI stores its affine in float32 (0.9 mm is 0.899999976), DICOM in decimal text: the
  // geometry agrees to float32 precision, interpolated values to a rounding error, labels
  // (nearest neighbour) exactly.
  for (const std::string key : {"image", "label"}) {
    SCOPED_TRACE(key);
    EXPECT_LE(a.volume(key).affine.max_abs_diff(b.volume(key).affine), 1e-5);
    ASSERT_EQ(a.volume(key).data.sizes(), b.volume(key).data.sizes());
  }
  EXPECT_TRUE(at::allclose(a.volume("image").data, b.volume("image").data, 1e-5, 1e-2))
      << (a.volume("image").data - b.volume("image").data).abs().max().item<double>();
  EXPECT_TRUE(at::equal(a.volume("label").data, b.volume("label").data));
  EXPECT_GT(b.volume("label").data.sum().item<double>(), 0);

  // The synthetic RTSTRUCT (contours of the same lesion) fills back to the SEG's voxels
  // exactly, through LoadImage and through `data convert` as docs/data.md shows it.
  const auto load = transforms::make_chain(nlohmann::json::parse(
      R"([{"name": "LoadImage", "keys": ["image", "seg", "rt"], "dtype": ["", "", ""], "label_dict": {"GTV-1": 1}}])"));
  Sample c;
  c.meta = {{"image", dir / "dicom/case_000/CT"}, {"seg", dir / "dicom/case_000/seg.dcm"},
            {"rt", dir / "dicom/case_000/rtstruct.dcm"}};
  load.apply(c);
  EXPECT_TRUE(at::equal(c.volume("seg").data, c.volume("rt").data));
  EXPECT_GT(c.volume("rt").data.sum().item<double>(), 0);
  const std::string bin = test::medfast_binary(), base = dir / "dicom/case_000";
  for (const std::string name : {"seg", "rtstruct"}) {
    const auto r = test::run(bin + " data convert --in " + base + "/" + name + ".dcm --reference " + base +
                             "/CT --label-dict '{\"GTV-1\": 1}' --out " + dir / (name + ".nii.gz"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_TRUE(at::equal(read_nifti(dir / "seg.nii.gz").data, read_nifti(dir / "rtstruct.nii.gz").data));
  // A label_dict that matches nothing would write (or train on) a label of background alone:
  // an error naming the segments there are; nothing is written.
  for (const std::string name : {"seg", "rtstruct"}) {
    const auto r = test::run(bin + " data convert --in " + base + "/" + name + ".dcm --reference " + base +
                             "/CT --label-dict '{\"GTV 1\": 1}' --out " + dir / (name + "-none.nii.gz"));
    EXPECT_NE(r.exit_code, 0) << name;
    EXPECT_NE(r.err.find(base + "/" + name + ".dcm: label_dict matches no "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("('GTV 1')"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(": 'GTV-1'"), std::string::npos) << r.err;
    EXPECT_FALSE(os::exists(dir / (name + "-none.nii.gz")));
  }
}

// The cache key covers every file of a series: touching, adding or removing one slice
// gives a new key; series_uid from the dataset entry is part of it too.
// pydicom's rtdose_1frame.dcm: one frame (no NumberOfFrames), GridFrameOffsetVector with 15
// values. pydicom and dcmtk read it; so does medfast (the frame present takes the first
// offset), with one warning naming the field, and its doses equal pydicom's scaled values.
TEST(DicomLoad, AnRtDoseWithMoreOffsetsThanFramesReadsAsPydicomReadsIt) {
  const auto where = test::run(test::python() + " -c \"import os, pydicom; print(os.path.join(os.path.dirname("
                               "pydicom.__file__), 'data', 'test_files', 'rtdose_1frame.dcm'))\"");
  const std::string file = where.out.substr(0, where.out.find('\n'));
  if (where.exit_code != 0 || !os::exists(file)) GTEST_SKIP() << "pydicom's test files are not here: " << where.err;
  const auto want = test::run(test::python() + " -c \"import json, pydicom; d = pydicom.dcmread('" + file +
                              "'); print(json.dumps((d.pixel_array * float(d.DoseGridScaling)).tolist()))\"");
  ASSERT_EQ(want.exit_code, 0) << want.err;
  const auto doses = nlohmann::json::parse(want.out);  // rows of columns
  const Volume v = read_image(file);
  ASSERT_EQ(v.data.numel(), 100);
  const at::Tensor d = v.data.to(at::kDouble).reshape({-1});
  // One frame: the volume's first axis runs along the columns, the second along the rows.
  double worst = 0;
  for (int r = 0; r < 10; ++r) {
    for (int c = 0; c < 10; ++c) {
      worst = std::max(worst, std::abs(v.data.to(at::kDouble)[c][r][0].item<double>() - doses[r][c].get<double>()));
    }
  }
  EXPECT_LE(worst, 1e-6);
  (void)d;
  const auto info = test::run(test::medfast_binary() + " info " + file);
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.err.find("GridFrameOffsetVector (3004,000C) has more than 1 values for 1 frame(s)"), std::string::npos)
      << info.err;
  EXPECT_EQ(info.err.find("GridFrameOffsetVector"), info.err.rfind("GridFrameOffsetVector")) << "said once: " << info.err;
}

TEST(DicomLoad, CacheKeyCoversEveryFileOfTheSeries) {
  test::TempDir dir;
  const std::string series = dir / "CT";
  os::make_directories(series);
  const auto m = dicom_manifest();
  std::string axial;
  for (const auto& c : m["series"]) {
    if (c["name"] == "axial") axial = dicom_dir() + "/" + c["input"].get<std::string>();
  }
  ASSERT_FALSE(axial.empty());
  const auto files = dicom::files_of(axial);
  for (const auto& f : files) {
    test::write_file(series + "/" + f.substr(f.rfind('/') + 1), test::read_file(f));
  }
  const auto key_of = [&](const std::string& uid) {
    data::Dataset ds;
    data::DatasetItem item;
    item.files["image"] = series;
    if (!uid.empty()) item.attrs["series_uid"] = uid;
    ds.items.push_back(item);
    data::CacheConfig cfg;
    cfg.store.kind = cache::StoreKind::memory;
    const auto chain = transforms::make_chain(nlohmann::json::parse(
        R"([{"name": "LoadImage", "keys": ["image"]}, {"name": "EnsureChannelFirst", "keys": ["image"]}])"));
    return data::CachedDataset(ds, chain, cfg).key(0);
  };
  const std::string k0 = key_of("");
  EXPECT_EQ(key_of(""), k0);
  EXPECT_NE(key_of("1.2.3"), k0);
  const auto listed = dicom::files_of(series);
  const std::string victim = listed[listed.size() / 2];
  const std::string bytes = test::read_file(victim);
  os::remove_file(victim);
  const std::string k1 = key_of("");
  EXPECT_NE(k1, k0);
  test::write_file(victim, bytes);  // back, with a new mtime
  EXPECT_NE(key_of(""), k1);
}

// Patient identifiers never reach cache entries or logs: a disk cache filled from a series
// and its SEG holds none of the strings the golden files carry.
TEST(DicomLoad, PatientIdentifiersStayOutOfCacheEntriesAndLogs) {
  const auto m = dicom_manifest();
  const nlohmann::json* seg_case = nullptr;
  for (const auto& c : m["segs"]) {
    if (c["name"] == "seg_binary") seg_case = &c;
  }
  ASSERT_NE(seg_case, nullptr);
  test::TempDir dir;
  data::Dataset ds;
  data::DatasetItem item;
  item.files["image"] = dicom_dir() + "/" + (*seg_case)["reference"].get<std::string>();
  item.files["label"] = dicom_dir() + "/" + (*seg_case)["seg"].get<std::string>();
  ds.items.push_back(item);
  data::CacheConfig cfg;
  cfg.store.kind = cache::StoreKind::disk;
  cfg.store.dir = dir / "cache";
  const auto chain = transforms::make_chain(nlohmann::json::parse(R"([
    {"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", ""], "label_dict": [["GTV-1", 1]]},
    {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
    {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"}])"));
  std::vector<std::string> logged;
  log::set_sink([&](log::Level, const std::string& line) { logged.push_back(line); });
  const auto previous = log::level();
  log::set_level(log::Level::debug);
  {
    data::CachedDataset cached(ds, chain, cfg);
    const auto report = cached.fill();
    EXPECT_EQ(report.computed, 1u);
    const Sample s = cached.get(0);
    EXPECT_GT(s.volume("label").data.sum().item<double>(), 0);
  }
  log::set_level(previous);
  log::set_sink(nullptr);
  std::size_t files = 0;
  for (const std::string& f : dicom::files_of(dir / "cache")) {
    ++files;
    const std::string bytes = test::read_file(f);
    for (const auto& phi : m["phi"]) EXPECT_EQ(bytes.find(phi.get<std::string>()), std::string::npos) << f;
  }
  EXPECT_GE(files, 1u);
  for (const auto& line : logged) {
    for (const auto& phi : m["phi"]) EXPECT_EQ(line.find(phi.get<std::string>()), std::string::npos) << line;
  }
}

// A YAML mapping keeps its order for label_dict (the later entry wins where segments
// overlap), though JSON objects are otherwise sorted.
TEST(DicomLoad, LabelDictKeepsTheOrderWritten) {
  const auto j = data::parse_yaml("label_dict: {Lung: 2, GTV-1: 1}\nother: {b: 1, a: 2}\n", "test");
  ASSERT_TRUE(j["label_dict"].is_array());
  EXPECT_EQ(j["label_dict"][0][0], "Lung");
  EXPECT_EQ(j["label_dict"][1][0], "GTV-1");
  EXPECT_TRUE(j["other"].is_object());
}

// label_dict is read by one parser for LoadImage and `data convert --label-dict`: pairs in
// order, a mapping by class; a bad one names the argument and what was expected.
TEST(DicomLoad, LabelDictParsingAndItsErrors) {
  using L = dicom::LabelDict;
  EXPECT_EQ(dicom::parse_label_dict(nlohmann::json::parse(R"([["Lung", 2], ["GTV-1", 1]])")),
            (L{{"Lung", 2}, {"GTV-1", 1}}));
  EXPECT_EQ(dicom::parse_label_dict(nlohmann::json::parse(R"({"Lung": 2, "GTV-1": 1})")), (L{{"GTV-1", 1}, {"Lung", 2}}));
  EXPECT_TRUE(dicom::parse_label_dict(nlohmann::json()).empty());
  for (const char* bad : {R"({"GTV-1": 300})", R"({"GTV-1": -1})", R"({"GTV-1": "one"})", R"([["GTV-1"]])", R"(7)"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(dicom::parse_label_dict(nlohmann::json::parse(bad)), ValueError);
    EXPECT_VALUE_ERROR(transforms::make_chain(nlohmann::json::parse(
                           std::string(R"([{"name": "LoadImage", "keys": ["image", "label"], "label_dict": )") + bad +
                           "}]")),
                       "label_dict");
    const auto r = test::run(test::medfast_binary() + " data convert --in x --out y.nii.gz --label-dict '" + bad + "'");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--label-dict"), std::string::npos) << r.err;
  }
}

// `medfast info` on a DICOM folder lists the series without patient identifiers; --phi
// shows them; data convert writes NIfTI that nibabel reads back as the pydicom reader did.
TEST(DicomCli, InfoHidesPatientIdentifiersAndConvertMatchesNibabel) {
  const auto m = dicom_manifest();
  std::string axial, two;
  nlohmann::json axial_expect;
  for (const auto& c : m["series"]) {
    if (c["name"] == "axial") {
      axial = dicom_dir() + "/" + c["input"].get<std::string>();
      axial_expect = c["expect"];
    }
    if (c["name"] == "two_series_default") two = dicom_dir() + "/" + c["input"].get<std::string>();
  }
  ASSERT_FALSE(axial.empty());
  ASSERT_FALSE(two.empty());
  for (const std::string& flags : {std::string(""), std::string(" --json"), std::string(" --stats")}) {
    const auto r = test::run(test::medfast_binary() + " info " + two + flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("series"), std::string::npos);
    for (const auto& phi : m["phi"]) {
      EXPECT_EQ(r.out.find(phi.get<std::string>()), std::string::npos) << flags << ": " << r.out;
      EXPECT_EQ(r.err.find(phi.get<std::string>()), std::string::npos) << flags << ": " << r.err;
    }
  }
  const auto shown = test::run(test::medfast_binary() + " info " + axial + " --phi");
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  for (const auto& phi : m["phi"]) EXPECT_NE(shown.out.find(phi.get<std::string>()), std::string::npos) << shown.out;
  const auto json = test::run(test::medfast_binary() + " info " + two + " --json");
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["series"].size(), 2u);

  test::TempDir dir;
  const std::string out = dir / "axial.nii.gz";
  const auto conv = test::run(test::medfast_binary() + " data convert --in " + axial + " --out " + out);
  ASSERT_EQ(conv.exit_code, 0) << conv.err;
  nlohmann::json check = nlohmann::json::array();
  check.push_back({{"file", out},
                   {"expected", dicom_dir() + "/" + axial_expect["voxels"].get<std::string>()},
                   {"expected_dtype", axial_expect["dtype"]},
                   {"dtype", axial_expect["dtype"]},
                   {"shape", axial_expect["shape"]},
                   {"affine", axial_expect["affine"]},
                   {"affine_tolerance", 1e-5}});
  test::write_file(dir / "check.json", check.dump());
  const auto v = test::run(test::python() + " " + test::source_dir() + "/tests/golden/verify_with_nibabel.py " +
                           dir / "check.json");
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;

  const auto bad = test::run(test::medfast_binary() + " data convert --in " + dir.path() + " --out " + dir / "x.nii");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("no DICOM"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace medfast
