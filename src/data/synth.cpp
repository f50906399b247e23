#include "medfast/data/synth.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/core/random.hpp"
#include "medfast/core/units.hpp"
#include "medfast/image/dicom.hpp"
#include "medfast/image/dicom_write.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"

namespace medfast {

SynthOptions& SynthOptions::set_cases(int v) {
  if (v < 1) throw ValueError(str("data synth: --cases ", v, " must be at least 1"));
  cases = v;
  return *this;
}

SynthOptions& SynthOptions::set_format(const std::string& v) {
  if (v != "nifti" && v != "dicom") throw ValueError(str("data synth: --format is '", v, "'; expected nifti or dicom"));
  format = v;
  return *this;
}

SynthOptions& SynthOptions::set_kind(const std::string& v) {
  if (v != "spleen" && v != "brats") throw ValueError(str("data synth: --kind is '", v, "'; expected spleen or brats"));
  kind = v;
  if (v == "brats") {
    size_min = size_max = kBratsSynthSize;
    spacing = kBratsSynthSpacing;
    spacing_max = {0, 0, 0};
  }
  return *this;
}

namespace {

/// An option's "X,Y,Z" where each entry is a value or a range "lo-hi": per axis [lo, hi]
/// texts (hi empty for a single value). The range's dash is never the first character (a
/// minus sign: the option's check names it) nor an exponent's (1e-3).
std::array<std::array<std::string, 2>, 3> axis_ranges(const std::string& spec, const std::string& option,
                                                      const char* each) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const auto comma = spec.find(',', start);
    parts.push_back(spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (parts.size() != 3) {
    throw ValueError(str("data synth: ", option, " '", spec, "': expected X,Y,Z, each ", each, " or a range lo-hi"));
  }
  std::array<std::array<std::string, 2>, 3> out;
  for (int i = 0; i < 3; ++i) {
    const std::string& p = parts[static_cast<std::size_t>(i)];
    std::size_t dash = p.find('-', 1);
    while (dash != std::string::npos && (p[dash - 1] == 'e' || p[dash - 1] == 'E')) dash = p.find('-', dash + 1);
    out[i] = {p.substr(0, dash), dash == std::string::npos ? "" : p.substr(dash + 1)};
  }
  return out;
}

}  // namespace

SynthOptions& SynthOptions::set_size(const std::string& spec) {
  const auto ranges = axis_ranges(spec, "--size", "a size");
  SynthOptions next = *this;  // validate a copy: a rejected value leaves the options as they were
  for (int i = 0; i < 3; ++i) {
    const std::string what = str("data synth: --size '", spec, "' axis ", i);
    next.size_min[i] = parse_int(ranges[i][0], what);
    next.size_max[i] = ranges[i][1].empty() ? next.size_min[i] : parse_int(ranges[i][1], what);
  }
  next.validate();
  *this = next;
  return *this;
}

SynthOptions& SynthOptions::set_spacing(const std::array<double, 3>& v) {
  SynthOptions next = *this;
  next.spacing = v;
  next.validate();
  *this = next;
  return *this;
}

SynthOptions& SynthOptions::set_spacing_max(const std::array<double, 3>& v) {
  SynthOptions next = *this;
  next.spacing_max = v;
  next.validate();
  *this = next;
  return *this;
}

SynthOptions& SynthOptions::set_spacing_spec(const std::string& spec) {
  const auto ranges = axis_ranges(spec, "--spacing", "a spacing in mm");
  SynthOptions next = *this;
  for (int i = 0; i < 3; ++i) {
    const std::string what = str("data synth: --spacing '", spec, "' axis ", i);
    next.spacing[i] = parse_double(ranges[i][0], what);
    next.spacing_max[i] = ranges[i][1].empty() ? 0 : parse_double(ranges[i][1], what);
  }
  next.validate();
  *this = next;
  return *this;
}

SynthOptions& SynthOptions::set_modality(const std::string& v) {
  if (v != "CT" && v != "MR") throw ValueError(str("data synth: --modality is '", v, "'; expected CT or MR"));
  modality = v;
  return *this;
}

std::array<double, 3> SynthOptions::spacing_of(int index) const {
  std::array<double, 3> s = spacing;
  Rng rng(derive_seed({seed, static_cast<std::uint64_t>(index), 0x5ac1}));
  for (int i = 0; i < 3; ++i) {
    if (spacing_max[i] > spacing[i]) s[i] = std::round(rng.uniform(spacing[i], spacing_max[i]) * 1000) / 1000;
  }
  return s;
}

void SynthOptions::validate() const {
  for (int i = 0; i < 3; ++i) {
    if (size_min[i] < 8 || size_max[i] < size_min[i] || size_max[i] > 4096) {
      throw ValueError(str("data synth: --size: axis ", i, " is ", size_min[i], "-", size_max[i],
                           "; expected 8 <= lo <= hi <= 4096"));
    }
    if (!(spacing[i] > 0) || !std::isfinite(spacing[i])) {
      throw ValueError(str("data synth: --spacing: axis ", i, " is ", spacing[i], "; expected a positive number"));
    }
    if (spacing_max[i] != 0 && !(spacing_max[i] >= spacing[i] && std::isfinite(spacing_max[i]))) {
      throw ValueError(str("data synth: --spacing: axis ", i, " is ", spacing[i], "-", spacing_max[i],
                           "; expected lo <= hi"));
    }
  }
  if (cases < 1) throw ValueError(str("data synth: cases is ", cases, "; expected at least 1"));
  if (modality != "CT" && modality != "MR") throw ValueError(str("data synth: modality is '", modality, "'; expected CT or MR"));
  if (kind != "spleen" && kind != "brats") throw ValueError(str("data synth: kind is '", kind, "'; expected spleen or brats"));
  if (kind == "brats" && format != "nifti") throw ValueError("data synth: --kind brats is written as NIfTI only (--format nifti)");
  if (modality == "MR" && format == "dicom") throw ValueError("data synth: --modality MR is written as NIfTI only (--format nifti)");
}

namespace {

struct Ellipsoid {
  double cx, cy, cz;  // voxel coordinates
  double rx, ry, rz;  // voxel radii
  double value(double x, double y, double z) const {
    const double dx = (x - cx) / rx, dy = (y - cy) / ry, dz = (z - cz) / rz;
    return dx * dx + dy * dy + dz * dz;
  }
};

}  // namespace

namespace {

/// An LPS affine (x to the patient's left, y posterior, z superior) of a grid of `n` voxels
/// at `spacing`, centred near the origin as scanner coordinates are.
Affine lps_affine(const std::array<std::int64_t, 3>& n, const std::array<double, 3>& spacing) {
  const auto [sx, sy, sz] = spacing;
  Affine a;
  a(0, 0) = -sx;
  a(1, 1) = -sy;
  a(2, 2) = sz;
  a(0, 3) = sx * (n[0] - 1) / 2.0;
  a(1, 3) = sy * (n[1] - 1) / 2.0;
  a(2, 3) = -sz * (n[2] - 1) / 2.0;
  return a;
}

/// Shifts a voxel's squared ellipsoid distance by a smooth bump of its direction, so that
/// the tumour's borders are not plain ellipsoids (a low-order angular ripple, +-`amount`).
double rippled(double d2, double dx, double dy, double dz, const std::array<double, 3>& phase, double amount) {
  const double r = std::sqrt(dx * dx + dy * dy + dz * dz) + 1e-9;
  const double ripple = std::sin(3 * dx / r + phase[0]) * std::cos(2 * dy / r + phase[1]) * std::sin(2 * dz / r + phase[2]);
  return d2 * (1 + amount * ripple);
}

/// kind brats: one MSD Task01-shaped case (see synth.hpp).
SynthCase make_brats_case(const SynthOptions& o, int index) {
  Rng rng(derive_seed({o.seed, static_cast<std::uint64_t>(index), 0xb7a5}));
  std::array<std::int64_t, 3> n{};
  for (int i = 0; i < 3; ++i) n[i] = rng.integer(o.size_min[i], o.size_max[i]);
  const auto [nx, ny, nz] = n;
  const auto [sx, sy, sz] = o.spacing_of(index);
  // The brain: an ellipsoid filling most of the field of view; ventricles (CSF) near its
  // centre; a tumour in one hemisphere: edema around a core whose rim enhances.
  const Ellipsoid brain{nx / 2.0 + rng.uniform(-0.02, 0.02) * nx, ny / 2.0 + rng.uniform(-0.02, 0.02) * ny,
                        nz / 2.0, nx * rng.uniform(0.36, 0.42), ny * rng.uniform(0.40, 0.46), nz * rng.uniform(0.38, 0.44)};
  const Ellipsoid ventricles{brain.cx, brain.cy - brain.ry * 0.05, brain.cz + brain.rz * 0.1, brain.rx * 0.12,
                             brain.ry * 0.3, brain.rz * 0.2};
  const double side = rng.uniform(0, 1) < 0.5 ? -1 : 1;
  Ellipsoid edema{};
  edema.rx = brain.rx * rng.uniform(0.35, 0.5);
  edema.ry = brain.ry * rng.uniform(0.32, 0.48);
  edema.rz = brain.rz * rng.uniform(0.35, 0.5);
  edema.cx = brain.cx + side * brain.rx * rng.uniform(0.25, 0.4);
  edema.cy = brain.cy + brain.ry * rng.uniform(-0.3, 0.3);
  edema.cz = brain.cz + brain.rz * rng.uniform(-0.25, 0.25);
  const double core_scale = rng.uniform(0.5, 0.7);
  const Ellipsoid core{edema.cx + edema.rx * rng.uniform(-0.15, 0.15), edema.cy + edema.ry * rng.uniform(-0.15, 0.15),
                       edema.cz + edema.rz * rng.uniform(-0.15, 0.15), edema.rx * core_scale,
                       edema.ry * core_scale, edema.rz * core_scale};
  const double necrosis = rng.uniform(0.55, 0.75);  // the non-enhancing centre's share of the core's radius
  const std::array<double, 3> phase{rng.uniform(0, 6.28), rng.uniform(0, 6.28), rng.uniform(0, 6.28)};
  // Per channel (FLAIR, T1w, t1gd, T2w): brain, CSF, edema, non-enhancing, enhancing.
  constexpr double kValue[4][5] = {{420, 120, 780, 620, 680},
                                   {520, 180, 430, 300, 440},
                                   {510, 190, 430, 320, 960},
                                   {360, 900, 720, 820, 660}};
  std::array<double, 4> scale{};
  for (auto& f : scale) f = rng.uniform(0.6, 1.6);  // MR channels are not calibrated, each its own
  const double noise_sd = rng.uniform(15, 30);

  at::Tensor image = at::empty({4, nz, ny, nx}, at::kShort);  // file order: x fastest, channel last
  at::Tensor label = at::empty({nz, ny, nx}, at::kByte);
  auto* img = image.data_ptr<std::int16_t>();
  auto* lab = label.data_ptr<std::uint8_t>();
  const std::size_t plane = static_cast<std::size_t>(nx * ny * nz);
  parallel_for(static_cast<std::size_t>(nz), o.threads, [&](std::size_t k) {
    Rng noise(derive_seed({o.seed, static_cast<std::uint64_t>(index), k, 0xb7a5}));
    const double z = static_cast<double>(k);
    for (std::int64_t j = 0; j < ny; ++j) {
      for (std::int64_t i = 0; i < nx; ++i) {
        const double x = static_cast<double>(i), y = static_cast<double>(j);
        const std::size_t at = (static_cast<std::size_t>(k) * ny + j) * nx + i;
        std::uint8_t l = 0;
        int tissue = -1;  // -1 outside the brain
        if (brain.value(x, y, z) <= 1.0) {
          tissue = ventricles.value(x, y, z) <= 1.0 ? 1 : 0;
          const double ex = (x - edema.cx) / edema.rx, ey = (y - edema.cy) / edema.ry, ez = (z - edema.cz) / edema.rz;
          const double cx = (x - core.cx) / core.rx, cy = (y - core.cy) / core.ry, cz = (z - core.cz) / core.rz;
          const double core_d2 = rippled(cx * cx + cy * cy + cz * cz, cx, cy, cz, phase, 0.25);
          if (core_d2 <= 1.0) {
            const bool centre = core_d2 <= necrosis * necrosis;
            l = centre ? 2 : 3;
            tissue = centre ? 3 : 4;
          } else if (rippled(ex * ex + ey * ey + ez * ez, ex, ey, ez, phase, 0.3) <= 1.0) {
            l = 1;
            tissue = 2;
          }
        }
        lab[at] = l;
        for (int c = 0; c < 4; ++c) {
          double v = 0;
          if (tissue >= 0) v = std::max(1.0, (kValue[c][tissue] + noise.normal() * noise_sd) * scale[c]);
          img[static_cast<std::size_t>(c) * plane + at] = static_cast<std::int16_t>(std::lround(std::min(32000.0, v)));
        }
      }
    }
  });

  const Affine a = lps_affine(n, {sx, sy, sz});  // as the spleen kind's: orientation code is exercised
  SynthCase c;
  c.image.data = image.permute({3, 2, 1, 0});
  c.image.affine = a;
  c.image.meta.qform_code = 1;
  c.image.meta.sform_code = 1;
  c.image.meta.xyzt_units = 2 + 8;
  c.image.meta.descrip = "medfast data synth: brain tumour, FLAIR T1w t1gd T2w";
  c.label.data = label.permute({2, 1, 0});
  c.label.affine = a;
  c.label.meta = c.image.meta;
  c.label.meta.descrip = "medfast data synth: 1 edema 2 non-enhancing 3 enhancing";
  return c;
}

}  // namespace

SynthCase make_synth_case(const SynthOptions& o, int index) {
  o.validate();
  if (o.kind == "brats") return make_brats_case(o, index);
  Rng rng(derive_seed({o.seed, static_cast<std::uint64_t>(index), 0x5e11}));
  std::array<std::int64_t, 3> n{};
  for (int i = 0; i < 3; ++i) n[i] = rng.integer(o.size_min[i], o.size_max[i]);
  const auto [nx, ny, nz] = n;
  const auto [sx, sy, sz] = o.spacing_of(index);

  // Body: an elliptic cylinder filling most of the field of view, with a fat
  // layer and a spine behind it. Sizes are fractions of the field of view so
  // that any --size looks alike.
  const double bcx = nx / 2.0 + rng.uniform(-0.03, 0.03) * nx;
  const double bcy = ny / 2.0 + rng.uniform(-0.03, 0.03) * ny;
  const double brx = nx * rng.uniform(0.38, 0.44), bry = ny * rng.uniform(0.30, 0.36);
  const double fat = 0.06;  // relative thickness of subcutaneous fat
  const Ellipsoid spine{bcx, bcy + bry * 0.62, 0, brx * 0.12, bry * 0.14, 1e30};
  // Organ: an ellipsoid of 30-70 mm radii (in-plane) inside the body, on the
  // patient's left (image +x in an LPS affine), spanning several slices.
  const double fov_x = nx * sx, fov_y = ny * sy;
  const double scale_mm = std::min(fov_x, fov_y) / (512 * 0.8);  // shrink organs with small fields of view
  Ellipsoid organ{};
  organ.rx = rng.uniform(30, 60) * scale_mm / sx;
  organ.ry = rng.uniform(25, 50) * scale_mm / sy;
  organ.rz = std::max(2.0, std::min(rng.uniform(40, 80) / sz, nz * 0.35));
  organ.cx = bcx + rng.uniform(0.15, 0.45) * brx;
  organ.cy = bcy + rng.uniform(-0.3, 0.3) * bry;
  organ.cz = rng.uniform(organ.rz, std::max(organ.rz, nz - organ.rz));
  const double organ_hu = rng.uniform(90, 130);
  const double tissue_hu = rng.uniform(30, 50);
  const double noise_hu = rng.uniform(12, 25);
  // MR: T1-like (fat bright, bone dark), nothing outside the body, the whole case scaled by
  // a factor of its own (from its own generator: CT's draws stay as they were).
  const bool mr = o.modality == "MR";
  Rng mr_rng(derive_seed({o.seed, static_cast<std::uint64_t>(index), 0x3a7}));
  const double mr_scale = mr ? mr_rng.uniform(0.5, 2.0) : 1;
  const double mr_organ = mr_rng.uniform(480, 560), mr_tissue = mr_rng.uniform(280, 330);

  at::Tensor image = at::empty({nz, ny, nx}, at::kShort);  // file order: x fastest
  at::Tensor label = at::empty({nz, ny, nx}, at::kByte);
  auto* img = image.data_ptr<std::int16_t>();
  auto* lab = label.data_ptr<std::uint8_t>();
  parallel_for(static_cast<std::size_t>(nz), o.threads, [&](std::size_t k) {
    Rng noise(derive_seed({o.seed, static_cast<std::uint64_t>(index), k}));
    const double z = static_cast<double>(k);
    for (std::int64_t j = 0; j < ny; ++j) {
      for (std::int64_t i = 0; i < nx; ++i) {
        const double x = static_cast<double>(i), y = static_cast<double>(j);
        const double dx = (x - bcx) / brx, dy = (y - bcy) / bry;
        const double body = dx * dx + dy * dy;
        double hu, mr_value;
        std::uint8_t l = 0;
        if (body > 1.0) {
          hu = -1000 + noise.normal() * 5;
          mr_value = 0;
        } else if (body > (1 - fat) * (1 - fat)) {
          hu = -100 + noise.normal() * noise_hu;
          mr_value = 800;  // T1: fat bright
        } else if (spine.value(x, y, 0) <= 1.0) {
          hu = 450 + noise.normal() * noise_hu * 2;
          mr_value = 150;  // bone dark
        } else if (organ.value(x, y, z) <= 1.0) {
          hu = organ_hu + noise.normal() * noise_hu;
          mr_value = mr_organ;
          l = 1;
        } else {
          hu = tissue_hu + noise.normal() * noise_hu;
          mr_value = mr_tissue;
        }
        const std::size_t at = (static_cast<std::size_t>(k) * ny + j) * nx + i;
        if (mr) {  // the same noise draws, scaled to MR's: nothing outside the body
          hu = mr_value == 0 ? 0.0 : std::max(1.0, (mr_value + noise.normal() * noise_hu * 1.5) * mr_scale);
        }
        img[at] = static_cast<std::int16_t>(std::lround(std::max(-1024.0, std::min(mr ? 32000.0 : 3071.0, hu))));
        lab[at] = l;
      }
    }
  });

  const Affine a = lps_affine(n, {sx, sy, sz});

  SynthCase c;
  c.image.data = image.permute({2, 1, 0});
  c.image.affine = a;
  c.image.meta.qform_code = 1;  // scanner
  c.image.meta.sform_code = 1;
  c.image.meta.xyzt_units = 2 + 8;
  c.image.meta.descrip = mr ? "medfast data synth: organ in MR-like T1" : "medfast data synth: spleen-like CT";
  c.label = c.image;
  c.label.data = label.permute({2, 1, 0});
  c.label.meta.descrip = "medfast data synth: organ label";
  return c;
}

namespace {

/// The DICOM flavour: per case a CT series and a SEG, and a dataset.json pairing them.
SynthResult synthesize_dicom(const SynthOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  SynthResult r;
  for (int i = 0; i < o.cases; ++i) {
    const SynthCase c = make_synth_case(o, i);
    const std::string name = str("case_", i < 10 ? "00" : i < 100 ? "0" : "", i);
    // File order (x fastest) is the contiguous layout of the reversed dims.
    const at::Tensor hu = c.image.data.permute({2, 1, 0}).contiguous();
    const at::Tensor label = c.label.data.permute({2, 1, 0}).contiguous();
    dicom::CtToWrite ct;
    ct.shape = {c.image.data.size(0), c.image.data.size(1), c.image.data.size(2)};
    ct.hu = hu.data_ptr<std::int16_t>();
    ct.affine = c.image.affine;
    const std::string root = str("medfast-synth/", o.seed, "/", i);
    ct.study_uid = dicom::make_uid(root + "/study");
    ct.series_uid = dicom::make_uid(root + "/series");
    ct.frame_of_reference_uid = dicom::make_uid(root + "/frame-of-reference");
    ct.patient_id = str("SYNTH-", i);
    const std::string series_dir = name + "/CT";
    const auto uids = dicom::write_ct_series(o.out_dir + "/" + series_dir, ct);
    dicom::write_seg(o.out_dir + "/" + name + "/seg.dcm", ct, uids, label.data_ptr<std::uint8_t>(), "GTV-1");
    // The same lesion as RTSTRUCT contours (NSCLC-Radiomics ships both kinds).
    dicom::write_rtstruct(o.out_dir + "/" + name + "/rtstruct.dcm", ct, uids, label.data_ptr<std::uint8_t>(), "GTV-1");
    r.images.push_back(series_dir);
    r.labels.push_back(name + "/seg.dcm");
    for (const std::string& f : dicom::files_of(o.out_dir + "/" + name)) r.bytes += os::stat(f).size;
  }
  nlohmann::json ds;
  ds["name"] = "NsclcSynth";
  ds["description"] =
      "Synthetic NSCLC-like CT series with DICOM SEG lesions (and the same as RTSTRUCT contours), written by medfast "
      "data synth";
  ds["reference"] = "medfast";
  ds["licence"] = "CC0";
  ds["modality"] = {{"0", "CT"}};
  ds["labels"] = {{"0", "background"}, {"1", "GTV-1"}};
  ds["numTraining"] = o.cases;
  ds["training"] = nlohmann::json::array();
  for (int i = 0; i < o.cases; ++i) {
    ds["training"].push_back({{"image", "./" + r.images[i]}, {"label", "./" + r.labels[i]}});
  }
  ds["medfast_synth"] = {{"seed", o.seed}, {"size_min", o.size_min}, {"size_max", o.size_max},
                         {"spacing", o.spacing}, {"format", "dicom"}};
  if (o.spacing_max != std::array<double, 3>{0, 0, 0}) ds["medfast_synth"]["spacing_max"] = o.spacing_max;
  const std::string text = ds.dump(2) + "\n";
  os::write_text_file(o.out_dir + "/dataset.json", text);
  r.bytes += text.size();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

SynthResult synthesize_dataset(const SynthOptions& o) {
  o.validate();
  MEDFAST_CHECK_T(ValueError, !o.out_dir.empty(), "data synth: --out is required");
  if (o.format == "dicom") return synthesize_dicom(o);
  const auto t0 = std::chrono::steady_clock::now();
  os::make_directories(o.out_dir + "/imagesTr");
  os::make_directories(o.out_dir + "/labelsTr");
  SynthResult r;
  r.images.resize(static_cast<std::size_t>(o.cases));
  r.labels.resize(static_cast<std::size_t>(o.cases));
  const auto write_opts = NiftiWriteOptions().set_gzip_level(o.gzip_level).set_threads(o.threads);
  for (int i = 0; i < o.cases; ++i) {
    const SynthCase c = make_synth_case(o, i);
    const std::string name = o.kind == "brats" ? str("BRATS_", i < 10 ? "00" : i < 100 ? "0" : "", i, ".nii.gz")
                                               : str("spleen_", i, ".nii.gz");
    r.images[i] = "imagesTr/" + name;
    r.labels[i] = "labelsTr/" + name;
    write_nifti(o.out_dir + "/" + r.images[i], c.image, write_opts);
    write_nifti(o.out_dir + "/" + r.labels[i], c.label, write_opts);
    r.bytes += os::stat(o.out_dir + "/" + r.images[i]).size + os::stat(o.out_dir + "/" + r.labels[i]).size;
  }
  nlohmann::json ds;
  const bool mr = o.modality == "MR";
  const bool brats = o.kind == "brats";
  ds["name"] = mr ? "OrganSynthMR" : "SpleenSynth";
  ds["description"] = mr ? "Synthetic abdominal MR-like (T1) volumes with one organ, written by medfast data synth"
                         : "Synthetic spleen-like abdominal CT written by medfast data synth";
  ds["reference"] = "medfast";
  ds["licence"] = "CC0";
  ds["tensorImageSize"] = "3D";
  ds["modality"] = {{"0", o.modality}};
  ds["labels"] = {{"0", "background"}, {"1", "spleen"}};
  if (brats) {  // as MSD Task01's dataset.json
    ds["name"] = "BRATS";
    ds["description"] =
        "Synthetic MSD Task01 (BrainTumour)-shaped MR volumes: 4 channels, edema, non-enhancing and enhancing "
        "tumour nested, written by medfast data synth";
    ds["tensorImageSize"] = "4D";
    ds["modality"] = {{"0", "FLAIR"}, {"1", "T1w"}, {"2", "t1gd"}, {"3", "T2w"}};
    ds["labels"] = {{"0", "background"}, {"1", "edema"}, {"2", "non-enhancing tumor"}, {"3", "enhancing tumour"}};
  }
  ds["numTraining"] = o.cases;
  ds["numTest"] = 0;
  ds["training"] = nlohmann::json::array();
  for (int i = 0; i < o.cases; ++i) {
    ds["training"].push_back({{"image", "./" + r.images[i]}, {"label", "./" + r.labels[i]}});
  }
  ds["test"] = nlohmann::json::array();
  ds["medfast_synth"] = {{"seed", o.seed},
                         {"size_min", o.size_min},
                         {"size_max", o.size_max},
                         {"spacing", o.spacing}};
  if (o.spacing_max != std::array<double, 3>{0, 0, 0}) ds["medfast_synth"]["spacing_max"] = o.spacing_max;
  if (mr && !brats) ds["medfast_synth"]["modality"] = o.modality;
  if (brats) ds["medfast_synth"]["kind"] = o.kind;
  const std::string text = ds.dump(2) + "\n";
  os::write_text_file(o.out_dir + "/dataset.json", text);
  r.bytes += text.size();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace medfast
