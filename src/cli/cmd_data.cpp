// medfast data synth: the built-in synthetic dataset.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/synth.hpp"

namespace medfast::cli {

namespace {
struct SynthArgs {
  std::string out;
  int cases = kDefaultSynthCases;
  std::string size;
  std::vector<double> spacing;
  std::uint64_t seed = 0;
  bool json = false;
};
}  // namespace

Command register_data(CLI::App& root) {
  auto* data = root.add_subcommand("data", "Datasets");
  data->require_subcommand(1);
  auto* synth = data->add_subcommand(
      "synth", "Write a synthetic spleen-like CT dataset in the Medical Segmentation Decathlon layout");
  auto a = std::make_shared<SynthArgs>();
  synth->add_option("--out", a->out, "Output folder (imagesTr/, labelsTr/, dataset.json)")->required();
  synth->add_option("--cases", a->cases, "Number of cases")->capture_default_str();
  synth->add_option("--size", a->size,
                    str("X,Y,Z voxels, each a size or a range lo-hi drawn per case [default ", kDefaultSynthSizeMin[0],
                        ",", kDefaultSynthSizeMin[1], ",", kDefaultSynthSizeMin[2], "-", kDefaultSynthSizeMax[2], "]"));
  synth->add_option("--spacing", a->spacing, "Voxel spacing in mm: X,Y,Z [default 0.8,0.8,5]")->delimiter(',')->expected(3);
  synth->add_option("--seed", a->seed, "Seed: the same seed writes the same files")->capture_default_str();
  synth->add_flag("--json", a->json, "Print JSON");
  Command c;
  c.app = data;
  c.run = [a](Context& ctx) {
    SynthOptions o;
    o.out_dir = a->out;
    o.set_cases(a->cases);
    if (!a->size.empty()) o.set_size(a->size);
    if (!a->spacing.empty()) o.set_spacing({a->spacing[0], a->spacing[1], a->spacing[2]});
    o.seed = a->seed;
    o.threads = ctx.settings.threads();
    o.gzip_level = static_cast<int>(ctx.settings.get_int("gzip_level"));
    const SynthResult r = synthesize_dataset(o);
    if (a->json) {
      print_json(nlohmann::json{{"out", o.out_dir},
                                {"cases", o.cases},
                                {"images", r.images},
                                {"labels", r.labels},
                                {"bytes", r.bytes},
                                {"seconds", r.seconds}}
                     .dump(2));
    } else {
      std::printf("wrote %d cases to %s (%s) in %.1f s\n", o.cases, o.out_dir.c_str(), format_bytes(r.bytes).c_str(),
                  r.seconds);
    }
    return 0;
  };
  return c;
}

}  // namespace medfast::cli
