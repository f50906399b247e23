// medfast info FILE [--stats] [--json]: what a NIfTI file holds. Torch-free (the light
// front runs it without loading libtorch): the header, and for --stats one pass over the
// voxels in their file dtype with the scaling applied arithmetically.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/core/units.hpp"
#include "medfast/image/dicom.hpp"
#include "medfast/image/nifti_raw.hpp"

namespace medfast::cli {

namespace {

struct InfoArgs {
  std::string file;
  bool stats = false;
  bool json = false;
  bool phi = false;
  bool backends = false;
};

nlohmann::json affine_json(const Affine& a) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) rows.push_back({a(i, 0), a(i, 1), a(i, 2), a(i, 3)});
  return rows;
}

const char* unit_name(int xyzt_units) {
  switch (xyzt_units & 7) {
    case 1: return "m";
    case 2: return "mm";
    case 3: return "um";
    default: return "unknown";
  }
}

/// Running statistics of a chunk (Welford), merged pairwise (Chan et al.).
struct Moments {
  double n = 0, mean = 0, m2 = 0;
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
  std::int64_t nonzero = 0;
  void merge(const Moments& o) {
    if (o.n == 0) return;
    const double total = n + o.n, delta = o.mean - mean;
    mean += delta * o.n / total;
    m2 += o.m2 + delta * delta * n * o.n / total;
    n = total;
    min = std::min(min, o.min);
    max = std::max(max, o.max);
    nonzero += o.nonzero;
  }
};

/// One pass over `count` values of type T: the moments of slope * x + inter (computed
/// for x, then scaled: the mean and spread scale, the bounds swap for a negative slope),
/// on `threads` threads. Non-zero counts the scaled value, as it is in memory.
template <typename T>
Moments moments(const void* data, std::size_t count, double slope, double inter, int threads) {
  const T* p = static_cast<const T*>(data);
  const std::size_t chunk = 1 << 20, chunks = (count + chunk - 1) / chunk;
  std::vector<Moments> part(chunks);
  const bool scaled = slope != 1.0 || inter != 0.0;
  parallel_for(chunks, threads, [&](std::size_t c) {
    Moments m;
    const std::size_t lo = c * chunk, hi = std::min(count, lo + chunk);
    T mn = p[lo], mx = p[lo];
    double sum = 0;
    std::int64_t nz = 0;
    for (std::size_t i = lo; i < hi; ++i) {  // exact sums per chunk, then Welford across chunks
      const T v = p[i];
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
      sum += static_cast<double>(v);
      nz += scaled ? (slope * static_cast<double>(v) + inter != 0.0) : (v != T(0));
    }
    m.n = static_cast<double>(hi - lo);
    m.mean = sum / m.n;
    double m2 = 0;
    for (std::size_t i = lo; i < hi; ++i) {  // in cache: the chunk was just read
      const double d = static_cast<double>(p[i]) - m.mean;
      m2 += d * d;
    }
    m.m2 = m2;
    m.min = static_cast<double>(mn);
    m.max = static_cast<double>(mx);
    m.nonzero = nz;
    part[c] = m;
  });
  Moments all;
  for (const auto& m : part) all.merge(m);
  if (scaled) {
    all.mean = slope * all.mean + inter;
    all.m2 *= slope * slope;
    const double a = slope * all.min + inter, b = slope * all.max + inter;
    all.min = std::min(a, b);
    all.max = std::max(a, b);
  }
  return all;
}

nlohmann::json voxel_stats(const std::string& file, const NiftiReadOptions& options, int threads) {
  const nifti::RawImage raw = nifti::read_raw(file, options);
  const nifti::Header& h = raw.header;
  const std::size_t n = static_cast<std::size_t>(h.voxel_count());
  const auto [slope, inter] = h.has_scaling() ? h.scaling() : std::pair<double, double>{1.0, 0.0};
  Moments m;
  if (n > 0) {
    switch (h.datatype) {
      case nifti::DT_BINARY:
      case nifti::DT_UINT8: m = moments<std::uint8_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_INT8: m = moments<std::int8_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_INT16: m = moments<std::int16_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_UINT16: m = moments<std::uint16_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_INT32: m = moments<std::int32_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_UINT32: m = moments<std::uint32_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_INT64: m = moments<std::int64_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_UINT64: m = moments<std::uint64_t>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_FLOAT32: m = moments<float>(raw.data(), n, slope, inter, threads); break;
      case nifti::DT_FLOAT64: m = moments<double>(raw.data(), n, slope, inter, threads); break;
      default:
        throw FormatError(str(file, ": --stats: datatype ", nifti::datatype_name(h.datatype), " (", h.datatype,
                              ") has no single value per voxel"));
    }
  }
  return {{"min", n ? m.min : 0.0},
          {"max", n ? m.max : 0.0},
          {"mean", n ? m.mean : 0.0},
          {"std", n > 1 ? std::sqrt(m.m2 / (m.n - 1)) : 0.0},
          {"nonzero", m.nonzero},
          {"voxels", static_cast<std::int64_t>(n)}};
}

std::string joined(const std::vector<double>& v, const char* sep = " x ") {
  std::string out;
  for (double x : v) out += (out.empty() ? "" : sep) + str(x);
  return out;
}

/// medfast info DIR_OR_DICOM_FILE: the series found, their geometry and any problem that
/// would stop them loading. Patient identifiers only with --phi.
int run_dicom_info(const InfoArgs& args, Context& ctx) {
  const auto options = dicom::ReadOptions().set_threads(ctx.settings.threads()).set_phi(args.phi);
  dicom::Scan sc = dicom::scan(args.file, options);
  nlohmann::json j;
  j["path"] = args.file;
  j["format"] = "DICOM";
  j["skipped_files"] = sc.skipped.size();
  j["series"] = nlohmann::json::array();
  for (dicom::Series& s : sc.series) {
    nlohmann::json e;
    e["series_uid"] = s.series_uid;
    e["study_uid"] = s.study_uid;
    e["modality"] = s.modality;
    e["description"] = s.description;
    e["files"] = s.files.size();
    e["transfer_syntax"] = s.transfer_syntax;
    if (s.is_rtstruct) {  // an RT Structure Set: its ROIs (contours are read when it is placed)
      e["kind"] = "RTSTRUCT";
      nlohmann::json rois = nlohmann::json::array();
      for (const auto& roi : s.segments) rois.push_back({{"number", roi.number}, {"name", roi.label}});
      e["rois"] = rois;
      e["referenced_series"] = s.referenced_series;
    } else if (s.is_seg) {
      e["kind"] = "SEG";
      e["frames"] = s.slices.size();
      nlohmann::json segs = nlohmann::json::array();
      for (const auto& seg : s.segments) {
        segs.push_back({{"number", seg.number}, {"label", seg.label}, {"description", seg.description}});
      }
      e["segments"] = segs;
      e["referenced_series"] = s.referenced_series;
    } else {
      e["kind"] = "image";
      e["slices"] = s.slices.size();
      e["rows"] = s.rows;
      e["columns"] = s.columns;
      if (!s.dose_units.empty()) e["dose_units"] = s.dose_units;  // RTDOSE: voxels in this unit
      try {
        dicom::check_geometry(s, args.file);
        const Affine a = s.affine();
        e["shape"] = {s.columns, s.rows, static_cast<std::int64_t>(s.slices.size())};
        e["spacing"] = a.spacing();
        e["orientation"] = axcodes(a);
        e["affine"] = affine_json(a);
        e["slice_spacing"] = s.slice_spacing;
        e["largest_slice_deviation"] = s.largest_deviation;
      } catch (const Error& err) {
        e["problem"] = err.what();
      }
    }
    if (args.phi) e["patient"] = s.phi;
    j["series"].push_back(e);
  }
  if (args.stats) {
    for (auto& e : j["series"]) {
      if (e["kind"] != "image" || e.contains("problem")) continue;
      const dicom::Image img =
          dicom::read_series(args.file, dicom::ReadOptions(options).set_series_uid(e["series_uid"]).set_phi(false));
      const std::size_t n = static_cast<std::size_t>(img.shape[0] * img.shape[1] * img.shape[2]);
      const int threads = ctx.settings.threads();
      const Moments m = img.dtype == "int16" ? moments<std::int16_t>(img.storage.data(), n, 1, 0, threads)
                                             : moments<float>(img.storage.data(), n, 1, 0, threads);
      e["dtype"] = img.dtype;
      e["stats"] = {{"min", m.min}, {"max", m.max}, {"mean", m.mean},
                    {"std", n > 1 ? std::sqrt(m.m2 / (m.n - 1)) : 0.0}, {"nonzero", m.nonzero},
                    {"voxels", static_cast<std::int64_t>(n)}};
    }
  }
  if (args.json) {
    print_json(j.dump(2));
    return 0;
  }
  std::printf("path         %s\n", args.file.c_str());
  std::printf("format       DICOM, %zu series%s\n", sc.series.size(),
              sc.skipped.empty() ? "" : str(", ", sc.skipped.size(), " file(s) skipped (not DICOM images)").c_str());
  for (const auto& e : j["series"]) {
    std::printf("\nseries       %s (%s%s)\n", e["series_uid"].get<std::string>().c_str(),
                e["modality"].get<std::string>().c_str(),
                e["description"].get<std::string>().empty() ? "" : (", " + e["description"].get<std::string>()).c_str());
    std::printf("study        %s\n", e["study_uid"].get<std::string>().c_str());
    std::printf("syntax       %s\n", e["transfer_syntax"].get<std::string>().c_str());
    if (e["kind"] == "RTSTRUCT") {
      std::printf("RTSTRUCT     %zu ROI(s), contours on series %s\n", e["rois"].size(),
                  e["referenced_series"].dump().c_str());
      for (const auto& roi : e["rois"]) {
        std::printf("ROI          %d: %s\n", roi["number"].get<int>(), roi["name"].get<std::string>().c_str());
      }
    } else if (e["kind"] == "SEG") {
      std::printf("SEG          %zu frame(s) in %zu file(s), referencing series %s\n", e["frames"].get<std::size_t>(),
                  e["files"].get<std::size_t>(), e["referenced_series"].dump().c_str());
      for (const auto& seg : e["segments"]) {
        std::printf("segment      %d: %s%s\n", seg["number"].get<int>(), seg["label"].get<std::string>().c_str(),
                    seg["description"].get<std::string>().empty()
                        ? ""
                        : (" (" + seg["description"].get<std::string>() + ")").c_str());
      }
    } else {
      std::printf("slices       %zu in %zu file(s), %d rows x %d columns\n", e["slices"].get<std::size_t>(),
                  e["files"].get<std::size_t>(), e["rows"].get<int>(), e["columns"].get<int>());
      if (e.contains("problem")) {
        std::printf("problem      %s\n", e["problem"].get<std::string>().c_str());
      } else {
        std::printf("shape        %s\n", joined(e["shape"].get<std::vector<double>>()).c_str());
        std::printf("spacing      %s mm (slices %.6g mm apart, largest deviation %.3g mm)\n",
                    joined(e["spacing"].get<std::vector<double>>()).c_str(), e["slice_spacing"].get<double>(),
                    e["largest_slice_deviation"].get<double>());
        std::printf("orientation  %s\n", e["orientation"].get<std::string>().c_str());
      }
      if (e.contains("dose_units")) {
        std::printf("dose         in %s (stored values x DoseGridScaling)\n", e["dose_units"].get<std::string>().c_str());
      }
      if (e.contains("stats")) {
        const auto& st = e["stats"];
        std::printf("dtype        %s\nmin          %.6g\nmax          %.6g\nmean         %.6g\nstd          %.6g\n",
                    e["dtype"].get<std::string>().c_str(), st["min"].get<double>(), st["max"].get<double>(),
                    st["mean"].get<double>(), st["std"].get<double>());
      }
    }
    if (args.phi) {
      for (const auto& [k, v] : e["patient"].items()) std::printf("%-12s %s\n", k.c_str(), v.get<std::string>().c_str());
    }
  }
  if (!args.phi) std::printf("\n(patient identifiers hidden; --phi shows them)\n");
  return 0;
}

int run_info(const InfoArgs& args, Context& ctx) {
  if (dicom::looks_like_dicom(args.file)) return run_dicom_info(args, ctx);
  if (args.phi) throw ValueError(str("info: --phi is for DICOM; ", args.file, " is NIfTI"));
  const auto options = NiftiReadOptions::from(ctx.settings);
  bool gz = false;
  std::uint64_t file_bytes = 0;
  const nifti::Header h = nifti::read_header(args.file, options, &gz, &file_bytes);
  Affine affine;
  try {
    affine = h.best_affine();
  } catch (Error& e) {
    e.add_context(args.file);
    throw;
  }
  const std::string mem_dtype = nifti::memory_dtype_name(h);
  const std::uint64_t elem = nifti::dtype_name_bytes(mem_dtype);
  const std::uint64_t mem_bytes = h.voxel_count() * elem;
  const auto spacing = affine.spacing();
  const auto [slope, inter] = h.scaling();

  nlohmann::json j;
  j["file"] = args.file;
  j["format"] = str("NIfTI-", h.version);
  j["gzip"] = gz;
  j["byte_order"] = h.big_endian ? "big" : "little";
  j["shape"] = h.shape();
  j["dtype"] = mem_dtype;
  j["disk_dtype"] = nifti::datatype_name(h.datatype);
  j["spacing"] = spacing;
  j["pixdim"] = h.pixdim;
  j["units"] = unit_name(h.xyzt_units);
  j["orientation"] = axcodes(affine);
  j["affine"] = affine_json(affine);
  j["qform_code"] = h.qform_code;
  j["sform_code"] = h.sform_code;
  j["scl_slope"] = slope;
  j["scl_inter"] = inter;
  j["description"] = h.descrip;
  j["bytes_on_disk"] = file_bytes;
  j["bytes_in_memory"] = mem_bytes;

  if (args.stats) j["stats"] = voxel_stats(args.file, options, ctx.settings.threads());

  if (args.json) {
    print_json(j.dump(2));
    return 0;
  }
  std::string shape, sp;
  for (auto s : h.shape()) shape += (shape.empty() ? "" : " x ") + std::to_string(s);
  for (double s : spacing) sp += (sp.empty() ? "" : " x ") + str(s);
  std::printf("file         %s\n", args.file.c_str());
  std::printf("format       NIfTI-%d%s, %s endian\n", h.version, gz ? " (gzip)" : "", h.big_endian ? "big" : "little");
  std::printf("shape        %s\n", shape.c_str());
  std::printf("dtype        %s (on disk %s%s)\n", mem_dtype.c_str(), nifti::datatype_name(h.datatype),
              h.has_scaling() ? str(", scaled by ", slope, " and ", inter).c_str() : "");
  std::printf("spacing      %s %s\n", sp.c_str(), unit_name(h.xyzt_units));
  std::printf("orientation  %s\n", axcodes(affine).c_str());
  std::printf("codes        qform %d, sform %d\n", h.qform_code, h.sform_code);
  const std::string aff = affine.to_string(4);
  std::size_t start = 0;
  for (int row = 0; row < 4; ++row) {
    const auto end = aff.find('\n', start);
    std::printf("%s %s\n", row == 0 ? "affine      " : "            ", aff.substr(start, end - start).c_str());
    start = end + 1;
  }
  std::printf("size         %s on disk, %s in memory\n", format_bytes(file_bytes).c_str(), format_bytes(mem_bytes).c_str());
  if (!h.descrip.empty()) std::printf("description  %s\n", h.descrip.c_str());
  if (args.stats) {
    const auto& s = j["stats"];
    std::printf("min          %.6g\nmax          %.6g\nmean         %.6g\nstd          %.6g\nnonzero      %lld of %lld voxels\n",
                s["min"].get<double>(), s["max"].get<double>(), s["mean"].get<double>(), s["std"].get<double>(),
                static_cast<long long>(s["nonzero"].get<std::int64_t>()),
                static_cast<long long>(s["voxels"].get<std::int64_t>()));
  }
  return 0;
}

}  // namespace

InfoCommand register_info(CLI::App& root, BackendsCheck backends) {
  auto args = std::make_shared<InfoArgs>();
  auto* app = root.add_subcommand("info", "Show a NIfTI file's shape, dtype, spacing, orientation, affine and sizes, "
                                          "or the series of a DICOM folder or file; --backends: check libtorch's math");
  app->add_option("file", args->file, "A .nii or .nii.gz file, a DICOM folder or a DICOM file");
  app->add_flag("--stats", args->stats, "Read the voxels once (in their file dtype, scaling applied arithmetically) and add min, max, mean, std (n-1) and the non-zero count");
  app->add_flag("--json", args->json, "Print JSON");
  app->add_flag("--phi", args->phi, "DICOM: also show patient identifiers (name, ID, birth date, accession number...)");
  app->add_flag("--backends", args->backends,
                "Check libtorch's convolutions, matmul and attention against float64 on the CPU and every GPU, in each "
                "training dtype (what `medfast train` does once at start-up), and show what computes them");
  InfoCommand c;
  c.command = Command{app, [args, backends](Context& ctx) {
                        if (args->backends) {
                          if (!args->file.empty()) throw ValueError("info: give a FILE or --backends, not both");
                          MEDFAST_CHECK(backends, "info --backends needs medfast-torch");
                          return backends(ctx, args->json);
                        }
                        if (args->file.empty()) throw ValueError("info: a FILE is required (or --backends)");
                        return run_info(*args, ctx);
                      }};
  c.needs_torch = [args, app, backends] { return app->parsed() && args->backends && !backends; };
  return c;
}

}  // namespace medfast::cli
