// medfast info FILE [--stats] [--json]: what a NIfTI file holds.
#include <ATen/ATen.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/image/nifti.hpp"

namespace medfast::cli {

namespace {

struct InfoArgs {
  std::string file;
  bool stats = false;
  bool json = false;
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

int run_info(const InfoArgs& args, Context& ctx) {
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
  const std::string mem_dtype = memory_dtype(h);
  const std::uint64_t elem = c10::elementSize(parse_dtype(mem_dtype, "info"));
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

  if (args.stats) {
    const Volume v = read_nifti(args.file, options);
    const at::Tensor d = v.data.to(at::kDouble);
    const auto n = d.numel();
    j["stats"] = {{"min", d.min().item<double>()},
                  {"max", d.max().item<double>()},
                  {"mean", d.mean().item<double>()},
                  {"std", n > 1 ? d.std().item<double>() : 0.0},
                  {"nonzero", d.count_nonzero().item<std::int64_t>()},
                  {"voxels", n}};
  }

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

Command register_info(CLI::App& root) {
  auto args = std::make_shared<InfoArgs>();
  auto* app = root.add_subcommand("info", "Show a NIfTI file's shape, dtype, spacing, orientation, affine and sizes");
  app->add_option("file", args->file, "A .nii or .nii.gz file")->required();
  app->add_flag("--stats", args->stats, "Load the voxels (scaling applied) and add min, max, mean, std (n-1) and the non-zero count");
  app->add_flag("--json", args->json, "Print JSON");
  return Command{app, [args](Context& ctx) { return run_info(*args, ctx); }};
}

}  // namespace medfast::cli
