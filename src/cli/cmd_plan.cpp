// medfast plan: a dataset in, a run config out (nnU-Net's rules, medfast's memory estimate).
#include <ATen/Context.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/progress.hpp"
#include "medfast/core/units.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/process.hpp"
#include "medfast/plan/plan.hpp"
#include "medfast/train/trainer.hpp"

namespace medfast::cli {

namespace {

struct PlanArgs {
  std::string dataset, device, memory, out, run_dir;
  int epochs = 100;
  int validation = -1;                 ///< --validation (negative: a fifth of the cases)
  double compute_gmac = std::nan("");  ///< --compute (NaN: not given)
  bool json = false, no_cache = false;
};

std::string stem_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const auto dot = name.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}


/// The kept cases as a list beside the plan (the list's other fields kept), for the run.
std::string write_kept_list(const plan::DatasetFingerprint& fp, const std::string& out) {
  // The list's description of its data (names, channels, labels), not its other sections:
  // their relative paths would not hold beside the plan.
  // In the list's own order: nnU-Net's regions are the order of "labels".
  nlohmann::ordered_json list = nlohmann::ordered_json::object();
  if (!data::is_csv_list(fp.list)) {
    (void)parse_json_document(os::read_text_file(fp.list), fp.list);  // its errors, as every reader says them
    const nlohmann::ordered_json original = nlohmann::ordered_json::parse(os::read_text_file(fp.list));
    for (const char* k : {"name", "reference", "licence", "release", "tensorImageSize", "modality", "channel_names",
                          "labels", "regions_class_order", "file_ending"}) {
      if (original.contains(k)) list[k] = original[k];
    }
  }
  nlohmann::json training = nlohmann::json::array();
  for (const auto& item : fp.items) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : item.files) {  // the list may live elsewhere
      data::FilePaths absolute;
      for (const auto& f : v) absolute.push_back(os::absolute_path(f));
      j[k] = absolute.to_json();
    }
    for (const auto& [k, v] : item.attrs) j[k] = v;
    if (item.fold >= 0) j["fold"] = item.fold;
    training.push_back(j);
  }
  list["training"] = training;
  list["numTraining"] = training.size();
  list["description"] = str("the cases of ", fp.list, " that medfast plan kept (", fp.excluded(), " left out)");
  const std::string path = os::parent_directory(out) + "/" + stem_of(out) + ".dataset.json";
  const std::string text = list.dump(2) + "\n";
  os::AtomicWriter w(path);
  w.append(text.data(), text.size());
  w.commit();
  return path;
}

struct Planned {
  plan::DatasetFingerprint fingerprint;
  plan::Plan plan;
};

Planned make(const PlanArgs& a, Context& ctx, bool show_progress) {
  plan::FingerprintOptions fo;
  fo.threads = ctx.settings.threads();
  fo.use_cache = !a.no_cache;
  std::unique_ptr<Progress> progress;
  if (show_progress) {
    fo.progress = [&](std::size_t done, std::size_t total) {
      if (!progress) {
        progress = std::make_unique<Progress>("fingerprint", total, "cases",
                                              Progress::style_from(ctx.settings.get("progress")));
      }
      progress->update(done);
    };
  }
  Planned p;
  p.fingerprint = plan::dataset_fingerprint(a.dataset, fo);
  if (progress) progress->finish(/*clear=*/true);
  plan::PlanOptions po;
  po.device = a.device.empty() ? (at::hasCUDA() ? "cuda" : "cpu") : a.device;
  const bool cuda_n = po.device.rfind("cuda:", 0) == 0 && po.device.size() > 5 &&
                      po.device.find_first_not_of("0123456789", 5) == std::string::npos;
  if (po.device != "cpu" && po.device != "cuda" && !cuda_n) {
    throw ValueError(str("plan: --device '", po.device, "' is not one of cpu | cuda | cuda:N"));
  }
  if (!a.memory.empty()) {
    try {
      po.memory_bytes = parse_bytes(a.memory);
    } catch (const std::exception& e) {
      throw ValueError(str("plan: --memory '", a.memory, "': ", e.what(), " (expected e.g. 8GiB)"));
    }
    if (po.memory_bytes == 0) throw ValueError("plan: --memory must be more than 0");
  }
  if (po.device != "cpu" && po.memory_bytes == 0) {
    if (!at::hasCUDA()) throw ValueError(str("plan: --device ", po.device, ": this machine has no CUDA device (give --memory to plan for one)"));
    const auto free = io::cuda_free_bytes(at::Device(po.device));
    if (free) po.device_free_bytes = *free;
  }
  if (!std::isnan(a.compute_gmac)) {
    if (!(a.compute_gmac >= 0) || !std::isfinite(a.compute_gmac)) {
      throw ValueError(
          str("plan: --compute ", a.compute_gmac, ": expected GMAC per training step, at least 0 (0: none)"));
    }
    po.step_macs_budget = a.compute_gmac * 1e9;
  }
  po.host_memory_bytes = os::machine_info().memory_bytes;
  po.epochs = a.epochs;
  po.validation_cases = a.validation;
  po.run_dir = a.run_dir;
  p.plan = plan::make_plan(p.fingerprint, po);
  return p;
}

/// Writes the plan (and, where cases were left out, the list of the kept ones) to `out`;
/// returns the YAML.
std::string write_plan(const Planned& p, const std::string& out) {
  os::make_directories(os::parent_directory(out));
  const std::string list = p.fingerprint.excluded() > 0 ? write_kept_list(p.fingerprint, out) : p.fingerprint.list;
  const std::string yaml = plan::run_config_yaml(p.fingerprint, p.plan, os::absolute_path(list));
  os::AtomicWriter w(out);
  w.append(yaml.data(), yaml.size());
  w.commit();
  return yaml;
}

int run_plan(const PlanArgs& a, Context& ctx) {
  PlanArgs args = a;
  if (args.run_dir.empty()) args.run_dir = dataset_run_dir(a.dataset);
  // From the working directory, wherever the plan is written (a relative run_dir in the
  // config would be taken from the config's folder).
  args.run_dir = os::absolute_path(args.run_dir);
  const Planned p = make(args, ctx, !a.json);
  if (!a.out.empty()) {
    // `--out <run_dir>/plan.yaml`, the plan beside the run it plans (as `train --dataset` writes
    // it): the run folder is claimed for medfast as train would claim it, so that `train
    // --config` of the plan then runs there; a folder medfast did not make is refused now.
    if (os::absolute_path(os::parent_directory(a.out)) == args.run_dir &&
        a.out.substr(a.out.find_last_of('/') + 1) == train::kRunPlanName) {
      train::claim_run_folder_for_plan(args.run_dir, /*resume=*/true, /*overwrite=*/false);
    }
    write_plan(p, a.out);
  }
  if (a.json) {
    nlohmann::json j = plan::plan_json(p.fingerprint, p.plan);
    j["out"] = a.out.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.out);
    print_json(j.dump(2));
    return 0;
  }
  if (a.out.empty()) {
    std::fputs(plan::run_config_yaml(p.fingerprint, p.plan, os::absolute_path(p.fingerprint.list)).c_str(), stdout);
    if (p.fingerprint.excluded() > 0) {
      std::fprintf(stderr,
                   "medfast: plan: %zu case(s) left out are still in %s, which this config names: give --out to write "
                   "the plan with a list of the kept cases beside it\n",
                   p.fingerprint.excluded(), p.fingerprint.list.c_str());
    }
  } else {
    std::printf("%s\nwrote %s\n", plan::plan_summary(p.fingerprint, p.plan).c_str(), a.out.c_str());
  }
  return 0;
}

}  // namespace

std::string dataset_run_dir(const std::string& dataset) {
  const std::string folder = os::absolute_path(os::parent_directory(plan::dataset_list_path(dataset)));
  return "runs/" + folder.substr(folder.find_last_of('/') + 1);
}

std::string plan_for_training(const std::string& dataset, const std::string& run_dir, int epochs, int validation,
                              Context& ctx, bool quiet) {
  PlanArgs a;
  a.dataset = dataset;
  if (epochs > 0) a.epochs = epochs;
  a.validation = validation;
  a.run_dir = ".";  // the plan is written into the run's folder
  const Planned p = make(a, ctx, !quiet);
  const std::string out = run_dir + "/plan.yaml";
  write_plan(p, out);
  if (!quiet) std::printf("%s\nwrote %s\n", plan::plan_summary(p.fingerprint, p.plan).c_str(), out.c_str());
  std::fflush(stdout);
  return out;
}

Command register_plan(CLI::App& root) {
  auto a = std::make_shared<PlanArgs>();
  auto* app = root.add_subcommand(
      "plan", "Plan a run from a dataset (nnU-Net's rules): spacing, normalization, patch, batch, network");
  app->add_option("--dataset", a->dataset, "A folder with dataset.json, or a dataset list (JSON or CSV)")->required();
  app->add_option("--device", a->device, "cpu | cuda | cuda:N: what the plan is for [default: cuda if there is one]");
  app->add_option("--memory", a->memory,
                  str("Memory budget of a training step, e.g. 8GiB [default: CUDA: 90% of the device's free memory; "
                      "CPU: ", static_cast<int>(plan::kCpuMemoryFraction * 100), "% of the machine's memory]"));
  app->add_option("--compute", a->compute_gmac,
                  str("Compute budget of a training step in GMAC (multiply-accumulates; 0: none) [default: CPU: ",
                      plan::kCpuStepMacs / 1e9, ", the spleen recipe's step; CUDA: none]"));
  app->add_option("--epochs", a->epochs, "train.epochs of the run")->capture_default_str();
  app->add_option("--validation", a->validation,
                  "Cases that validate (data.validation.num: the list's last N) [default: a fifth of the cases]");
  app->add_option("--run-dir", a->run_dir, "train.run_dir of the run (written absolute) [default: ./runs/<dataset>]");
  app->add_option("--out", a->out,
                  "Write the run config here (YAML; cases left out: a list of the others beside it) [default: print it]");
  app->add_flag("--no-cache", a->no_cache, "Read every case again (neither read nor write the fingerprint cache)");
  app->add_flag("--json", a->json, "Print the decisions and the fingerprint as JSON");
  return {app, [a](Context& ctx) { return run_plan(*a, ctx); }};
}

}  // namespace medfast::cli
