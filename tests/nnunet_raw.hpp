#pragma once
/// \file
/// A tiny nnU-Net v2 raw dataset for tests, written with medfast's own synthetic cases and
/// NIfTI writer: imagesTr/case_NNN_0000 (the synthetic MR image) and _0001 (a second channel
/// derived from it), labelsTr/case_NNN, imagesTs/ for the last `test_cases`, and a
/// dataset.json with channel_names, labels (plain, or BraTS-like regions with
/// regions_class_order), numTraining and file_ending.
#include <ATen/ATen.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/data/synth.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "test_util.hpp"

namespace medfast::test {

struct RawDatasetOptions {
  int cases = 5;       ///< training cases
  int test_cases = 2;  ///< cases in imagesTs
  bool regions = false;
  std::string size = "32,28,10-12";
};

/// nnU-Net's name of a channel file: {case}_{XXXX}.nii.gz.
inline std::string channel_file(const std::string& c, int channel) {
  char index[16];
  std::snprintf(index, sizeof index, "_%04d", channel);
  return c + index + ".nii.gz";
}

inline std::string raw_case(int i) {
  char name[16];
  std::snprintf(name, sizeof name, "case_%03d", i);
  return name;
}

/// Writes the dataset to `dir` (made). Labels: plain ones are 0 and 1..3 (the synthetic
/// organ split into three bands along x); region datasets hold the same values, read as
/// whole (1, 2, 3), core (2, 3) and enhancing (3).
inline void write_nnunet_raw(const std::string& dir, const RawDatasetOptions& o = {}) {
  SynthOptions s;
  s.out_dir = dir + "/.synth";
  s.set_cases(o.cases + o.test_cases).set_size(o.size).set_modality("MR");
  s.seed = 11;
  synthesize_dataset(s);
  for (const char* sub : {"imagesTr", "labelsTr", "imagesTs"}) os::make_directories(dir + "/" + sub);
  for (int i = 0; i < o.cases + o.test_cases; ++i) {
    const std::string c = raw_case(i);
    const std::string folder = dir + (i < o.cases ? "/imagesTr/" : "/imagesTs/");
    Volume image = read_nifti(s.out_dir + "/imagesTr/spleen_" + std::to_string(i) + ".nii.gz");
    write_nifti(folder + channel_file(c, 0), image);
    Volume second = image;
    second.data = (image.data.to(at::kFloat) * -0.5 + 300).contiguous();  // another contrast, same grid
    write_nifti(folder + channel_file(c, 1), second);
    if (i >= o.cases) continue;
    Volume label = read_nifti(s.out_dir + "/labelsTr/spleen_" + std::to_string(i) + ".nii.gz");
    at::Tensor l = label.data.to(at::kByte);
    const std::int64_t x = l.size(0);
    at::Tensor band = at::arange(x, at::kLong).div(std::max<std::int64_t>(1, (x + 2) / 3), "floor").clamp_max(2) + 1;
    band = band.to(at::kByte).view({x, 1, 1}).expand(l.sizes());
    label.data = (l.gt(0).to(at::kByte) * band).contiguous();
    write_nifti(dir + "/labelsTr/" + c + ".nii.gz", label);
  }
  nlohmann::ordered_json j;
  j["channel_names"] = {{"0", "T2"}, {"1", "ADC"}};
  if (o.regions) {
    j["labels"] = nlohmann::ordered_json::object();
    j["labels"]["background"] = 0;
    j["labels"]["whole tumor"] = {1, 2, 3};
    j["labels"]["tumor core"] = {2, 3};
    j["labels"]["enhancing tumor"] = {3};
    j["regions_class_order"] = {1, 2, 3};
  } else {
    j["labels"] = {{"background", 0}, {"edema", 1}, {"necrosis", 2}, {"enhancing", 3}};
  }
  j["numTraining"] = o.cases;
  j["file_ending"] = ".nii.gz";
  write_file(dir + "/dataset.json", j.dump(2));
  std::system(("rm -rf '" + s.out_dir + "'").c_str());
}

}  // namespace medfast::test
