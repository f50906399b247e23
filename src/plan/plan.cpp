// medfast plan: from a dataset fingerprint to a run config, each value with its reason.
#include "medfast/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "medfast/core/error.hpp"
#include "medfast/core/stats.hpp"
#include "medfast/core/units.hpp"

namespace medfast::plan {

namespace {

using Ordered = nlohmann::ordered_json;

std::int64_t volume_of(const Shape& s) { return s[0] * s[1] * s[2]; }
/// The voxels of a shape held as doubles (a median shape, possibly unrounded).
double volume_of(const Spacing& s) {
  return s[0] * s[1] * s[2];
}

/// nnU-Net's approximate dataset size (approximate_n_voxels_dataset): the median shape's voxels
/// times the cases; a batch takes at most 5% of it.
double dataset_voxels_of(const DatasetFingerprint& fp, const Spacing& median_shape) {
  return volume_of(median_shape) * static_cast<double>(fp.cases.size());
}

std::string fmt(double v, int digits = 4) {
  std::ostringstream o;
  o.precision(digits);
  o << v;
  return o.str();
}
std::string fmt3(const std::array<double, 3>& v, int digits = 4) {
  return str(fmt(v[0], digits), " x ", fmt(v[1], digits), " x ", fmt(v[2], digits));
}
std::string fmt3(const Shape& v) { return str(v[0], " x ", v[1], " x ", v[2]); }

/// Voxels of one sample's feature maps at each level of the network (the patch divided by
/// the strides down to that level).
std::vector<double> level_voxels(const NetworkPlan& net, const Shape& patch) {
  Shape s = patch;
  std::vector<double> voxels;
  for (std::size_t k = 0; k < net.filters.size(); ++k) {
    for (int d = 0; d < 3; ++d) s[d] /= net.strides[k][d];
    voxels.push_back(static_cast<double>(volume_of(s)));
  }
  return voxels;
}

/// The plan's compute, as the YAML header and the summary state it.
std::string compute_text(const Plan& p) {
  return str("about ", fmt(p.step_macs / 1e9, 4), " GMAC (multiply-accumulates) per training step, ",
             fmt(p.validation_macs_per_voxel / 1e3, 4), " kMAC per voxel of each validation window",
             p.step_macs_budget > 0 ? str(" (budget ", p.compute_reason, ")") : std::string(" (no compute budget)"));
}

/// JSON numbers that read back the same and stay short: 6 significant digits.
double tidy(double v) { return std::stod(fmt(v, 6)); }

/// The run config in order, with reasons by JSON pointer.
struct Annotated {
  Ordered config;
  std::map<std::string, std::string> why;
};

Annotated build(const DatasetFingerprint& fp, const Plan& p, const std::string& dataset) {
  Annotated a;
  auto& why = a.why;
  const Shape& patch = p.patch.topology.patch;
  const std::vector<std::int64_t> patch_v(patch.begin(), patch.end());
  Ordered det = Ordered::array();
  std::vector<std::string> det_why;
  const auto step = [&](Ordered s, std::string reason) {
    det.push_back(std::move(s));
    det_why.push_back(std::move(reason));
  };
  step({{"name", "LoadImage"}, {"keys", {"image", "label"}}}, "");
  step({{"name", "EnsureChannelFirst"}, {"keys", {"image", "label"}}}, "");
  step({{"name", "Orientation"}, {"keys", {"image", "label"}}, {"axcodes", "RAS"}},
       "every case in one orientation (the plan's axes are RAS)");
  step({{"name", "CropForeground"}, {"keys", {"image", "label"}}, {"source_key", "image"}, {"nonzero", true}},
       "nnU-Net's crop to the region where any channel is nonzero (what the fingerprint measured)");
  step({{"name", "Spacing"},
        {"keys", {"image", "label"}},
        {"pixdim", {tidy(p.target_spacing[0]), tidy(p.target_spacing[1]), tidy(p.target_spacing[2])}},
        {"mode", {"bilinear", "nearest"}}},
       p.lowres ? str("nnU-Net's 3d_lowres spacing: its target spacing (", fmt3(p.fullres_spacing),
                      " mm) grown 3% a step until the patch holds a quarter of the median case (there ",
                      fmt3(p.fullres_median_shape, 5),
                      "): within the compute budget a patch at full resolution sees too little of a case")
                : std::string("nnU-Net's target spacing: the median spacing per axis (the 10th percentile on an "
                              "axis over 3x coarser than the others with a third of their voxels)"));
  const ChannelNormalization& n0 = p.normalization.at(0);
  if (n0.scheme == Normalization::ct) {
    const IntensityStats& s = *n0.stats;
    step({{"name", "ScaleIntensityRange"},
          {"keys", "image"},
          {"a_min", tidy(s.p00_5)},
          {"a_max", tidy(s.p99_5)},
          {"b_min", tidy((s.p00_5 - s.mean) / s.std)},
          {"b_max", tidy((s.p99_5 - s.mean) / s.std)},
          {"clip", true}},
         str("CT: clip to the foreground's 0.5 and 99.5 percentiles (", fmt(s.p00_5), ", ", fmt(s.p99_5),
             "), then subtract its mean ", fmt(s.mean), " and divide by its std ", fmt(s.std),
             " (nnU-Net's CTNormalization, as one linear map)"));
  } else if (n0.scheme == Normalization::zscore) {
    step({{"name", "NormalizeIntensity"}, {"keys", "image"}, {"nonzero", n0.use_mask}, {"channel_wise", true}},
         str("z-score each image and channel by its own statistics (nnU-Net's ZScoreNormalization for ",
             n0.name.empty() ? "unnamed" : n0.name, " channels)",
             n0.use_mask ? ", over the nonzero region only (the crop removed over a quarter)" : ""));
  }
  step({{"name", "SpatialPad"}, {"keys", {"image", "label"}}, {"spatial_size", patch_v}},
       "cases smaller than the patch are padded to it");
  step({{"name", "FgBgToIndices"}, {"keys", "label"}, {"fg_postfix", "_fg"}, {"bg_postfix", "_bg"}},
       "foreground voxels (every labelled voxel, before any regions are made) indexed once, for the crops");
  if (p.labels.has_regions()) {
    std::string names;
    for (const auto& n : p.labels.region_names) names += (names.empty() ? "" : ", ") + n;
    step({{"name", "LabelToRegions"}, {"keys", {"label"}}, {"regions", p.labels.regions}},
         str("nnU-Net's region-based training: one channel per region (", names,
             "), each the voxels whose label is among the region's values"));
  }
  Ordered random = Ordered::array();
  std::vector<std::string> random_why;
  random.push_back({{"name", "RandCropByPosNegLabel"},
                    {"keys", {"image", "label"}},
                    {"label_key", "label"},
                    {"spatial_size", patch_v},
                    {"pos", 1},
                    {"neg", 2},
                    {"num_samples", p.crops_per_case},
                    {"fg_indices_key", "label_fg"},
                    {"bg_indices_key", "label_bg"}});
  random_why.push_back(str(
      "the planned patch; a third of the crops centred on foreground (nnU-Net's oversampling)",
      p.crops_per_case > 1
          ? str("; ", p.crops_per_case, " crops a case (the spleen recipe's num_samples): a step of ",
                p.patch.batch_size, " cases trains ", p.patch.batch_size * p.crops_per_case,
                " crops within the compute budget, and an epoch ", p.crops_per_case, "x the crops of one crop a case")
          : std::string()));
  for (int axis = 0; axis < 3; ++axis) {
    random.push_back({{"name", "RandFlip"}, {"keys", {"image", "label"}}, {"spatial_axis", {axis}}, {"prob", 0.5}});
    random_why.push_back(axis == 0 ? "nnU-Net mirrors every axis" : "");
  }
  random.push_back({{"name", "RandScaleIntensity"}, {"keys", "image"}, {"factors", 0.25}, {"prob", 0.15}});
  random_why.push_back("nnU-Net's brightness: x * U(0.75, 1.25), p 0.15");
  random.push_back({{"name", "RandAdjustContrast"}, {"keys", "image"}, {"gamma", {0.7, 1.5}}, {"prob", 0.3}});
  random_why.push_back(
      "nnU-Net's gamma (0.7, 1.5), p 0.3; its rotations and scaling are left out: they cost more than a step on a CPU");
  random.push_back({{"name", "RandGaussianNoise"}, {"keys", "image"}, {"std", 0.1}, {"prob", 0.1}});
  random_why.push_back("nnU-Net's Gaussian noise, p 0.1");

  Ordered data = Ordered::object();
  data["dataset"] = dataset;
  why["/data/dataset"] = fp.excluded() > 0 ? str("the list's cases less the ", fp.excluded(), " left out (see notes)")
                                           : "the list the plan was made from";
  data["section"] = "training";
  data["deterministic"] = det;
  for (std::size_t i = 0; i < det_why.size(); ++i) {
    if (!det_why[i].empty()) why[str("/data/deterministic/", i)] = det_why[i];
  }
  data["cache"] = {{"kind", "memory"}};
  why["/data/cache"] = "the preprocessed cases are kept in memory (MONAI's CacheDataset)";
  data["random"] = random;
  for (std::size_t i = 0; i < random_why.size(); ++i) {
    if (!random_why[i].empty()) why[str("/data/random/", i)] = random_why[i];
  }
  if (p.labels.has_regions()) {
    data["labels"] = {{"names", p.labels.region_names}, {"regions", p.labels.regions}};
    if (!p.labels.regions_class_order.empty()) data["labels"]["regions_class_order"] = p.labels.regions_class_order;
    why["/data/labels"] =
        "the list's regions: names for the run's Dice, and the order infer writes them into one label "
        "map (nnU-Net's regions_class_order)";
  }
  data["seed"] = 0;
  data["loader"] = {{"batch_size", p.patch.batch_size}, {"shuffle", true}, {"prefetch", 4}};
  why["/data/loader"] =
      str("batch size ", p.patch.batch_size,
          p.crops_per_case > 1 ? str(" cases (", p.patch.batch_size * p.crops_per_case, " crops)") : std::string(),
          ": the largest whose estimated step (", format_bytes(static_cast<std::uint64_t>(p.memory.total())),
          ") fits the budget of ", format_bytes(p.budget_bytes),
          p.step_macs_budget > 0 ? str(" and whose compute (", fmt(p.step_macs / 1e9, 4), " GMAC) fits ",
                                       fmt(p.step_macs_budget / 1e9, 4), " GMAC")
                                 : std::string(),
          ", at most 5% of the dataset's voxels per batch, at least 2");
  if (p.validation_cases > 0) {
    data["validation"] = {{"num", p.validation_cases}};
    why["/data/validation"] = str("the last ", p.validation_cases, " of ", fp.cases.size(), " cases validate (",
                                  p.validation_cases_asked ? "as asked" : "a fifth, as one of nnU-Net's 5 folds", ")");
  }
  a.config["data"] = data;

  a.config["model"] = p.network.model_json();
  why["/model"] = str("MONAI's DynUNet with nnU-Net's topology for a ", fmt3(patch), " patch at ",
                      fmt3(p.target_spacing), " mm: ", p.patch.topology.stages(),
                      " levels, each axis halved while its map keeps 8 voxels and its spacing is under twice the "
                      "finest; 3-wide kernels once an axis is under twice the finest spacing; channels ",
                      p.network.filters.front(), "..", p.network.filters.back(),
                      p.network.filters.front() < 32 ? " (nnU-Net's 32..320 narrowed to fit the compute budget)" : "",
                      "; ", p.network.parameters(), " parameters");
  if (p.sigmoid) {
    // DiceFocal with gamma 0 is Dice plus binary cross-entropy per channel (nnU-Net's
    // DC_and_BCE_loss); DiceCE's cross-entropy takes the channels as one distribution,
    // which overlapping regions are not.
    a.config["loss"] = {{"name", "DiceFocal"}, {"sigmoid", true},   {"include_background", true}, {"batch", true},
                        {"gamma", 0.0},        {"smooth_nr", 1e-5}, {"smooth_dr", 1e-5}};
    why["/loss"] = str(p.labels.has_regions() ? "nnU-Net's for regions" : "a mask per label channel",
                       ": Dice of each channel's sigmoid, batch Dice, plus binary cross-entropy (DiceFocal with gamma "
                       "0: the focal term is BCE; DiceCE's cross-entropy would take overlapping regions for one "
                       "distribution)");
  } else {
    a.config["loss"] = {{"name", "DiceCE"}, {"to_onehot_y", true}, {"softmax", true},  {"include_background", false},
                        {"batch", true},    {"smooth_nr", 1e-5},   {"smooth_dr", 1e-5}};
    why["/loss"] = "nnU-Net's: Dice over the foreground classes, batch Dice, plus cross-entropy";
  }
  a.config["optimizer"] = {
      {"name", "SGD"}, {"lr", p.lr}, {"momentum", p.momentum}, {"nesterov", true}, {"weight_decay", 3e-5}};
  why["/optimizer"] =
      p.momentum == kLongRunMomentum
          ? str("nnU-Net's: SGD, Nesterov momentum 0.99, lr 0.01, weight decay 3e-5 (this run: about ", p.planned_steps,
                " steps)")
          : str("nnU-Net's SGD (Nesterov, weight decay 3e-5) for a short run: its momentum 0.99 averages about 100 "
                "steps, meant for ",
                kLongRunSteps, " or more (nnU-Net trains 250,000); this run has about ", p.planned_steps, " (",
                p.epochs, " epochs of ", p.planned_steps / std::max(1, p.epochs),
                "), so momentum 0.9 and lr 0.1: the same step lr / (1 - momentum), averaged over 10 steps (the "
                "spleen recipe's SGD)");
  a.config["schedule"] = {{"name", "poly"}, {"power", 0.9}};
  why["/schedule"] = "nnU-Net's polynomial decay";
  const int interval = p.validation_interval;
  const bool compute_budgeted = p.step_macs_budget > 0;
  const Shape& window = p.validation_window;
  a.config["validation"] = {{"interval", interval},
                            {"sliding_window",
                             {{"roi_size", std::vector<std::int64_t>(window.begin(), window.end())},
                              {"sw_batch_size", p.validation_batch},
                              {"overlap", p.validation_overlap},
                              {"mode", "gaussian"}}}};
  why["/validation/interval"] =
      str("every ", interval,
          " epoch(s) and the last: the fewest that keep validation within a third of the run's "
          "time (at most train.epochs); a validation is ",
          p.validation_cases, " cases of about ", fmt(p.validation_windows), " window(s), about ",
          fmt(p.validation_epoch_macs / 1e9, 4), " GMAC, against an epoch's training, about ",
          fmt(p.epoch_macs / 1e9, 4), " GMAC (", p.planned_steps / std::max(1, p.epochs), " steps)");
  why["/validation/sliding_window"] =
      str("nnU-Net's windows of the patch, Gaussian-weighted (windows the size of a case scored lower: instance norm "
          "sees other statistics there than in training crops; docs/plan.md), overlapping by ",
          compute_budgeted ? "a quarter (nnU-Net: half; within the compute budget a third as many windows)" : "half",
          "; about ", format_bytes(static_cast<std::uint64_t>(p.validation_memory)), " for the largest case (",
          fmt3(p.largest_case), ")");
  a.config["train"] = {{"run_dir", p.run_dir}, {"epochs", p.epochs}, {"seed", 0}, {"device", p.device}, {"amp", p.amp}};
  why["/train/epochs"] = "set for your time budget (nnU-Net trains 1000 epochs of 250 steps)";
  why["/train/amp"] = p.amp ? "float16 autocast on the GPU (what the memory estimate assumes)"
                            : "float32 on the CPU (what the memory estimate assumes)";
  return a;
}

bool is_flow(const Ordered& v) { return !v.is_object(); }

/// `v` in YAML flow style that every YAML reader types as JSON does: a float in exponent
/// form gets a decimal point and a signed exponent (1.0e-05, not 1e-05, which YAML 1.1
/// readers such as PyYAML take for a string); the rest as JSON writes it.
std::string flow(const Ordered& v) {
  if (v.is_number_float()) {
    std::string t = v.dump();
    const auto e = t.find_first_of("eE");
    if (e == std::string::npos) return t;
    std::string mantissa = t.substr(0, e), exponent = t.substr(e + 1);
    if (mantissa.find('.') == std::string::npos) mantissa += ".0";
    if (!exponent.empty() && exponent[0] != '-' && exponent[0] != '+') exponent = "+" + exponent;
    return mantissa + "e" + exponent;
  }
  if (v.is_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + flow(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += (first ? "" : ",") + Ordered(it.key()).dump() + ":" + flow(it.value());
      first = false;
    }
    return out + "}";
  }
  return v.dump();
}

/// A text for a comment: line breaks (a message with a matrix, a file name) become spaces.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

/// Whether a reason is kept for a key below `path` (then the object is written in block style).
bool has_child_reason(const std::map<std::string, std::string>& why, const std::string& path) {
  const auto it = why.lower_bound(path + "/");
  return it != why.end() && it->first.compare(0, path.size() + 1, path + "/") == 0;
}

void emit(std::ostringstream& out, const Ordered& obj, const std::string& path, int indent,
          const std::map<std::string, std::string>& why) {
  const std::string pad(static_cast<std::size_t>(indent), ' ');
  const auto comment = [&](const std::string& p, const std::string& pad_here) {
    const auto it = why.find(p);
    if (it == why.end()) return;
    // Wrapped at about 100 columns, at spaces (line breaks in the text are spaces too).
    std::string line;
    std::istringstream words(it->second);
    for (std::string w; words >> w;) {
      if (!line.empty() && pad_here.size() + 2 + line.size() + 1 + w.size() > 100) {
        out << pad_here << "# " << line << "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + w;
    }
    if (!line.empty()) out << pad_here << "# " << line << "\n";
  };
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string p = path + "/" + it.key();
    comment(p, pad);
    const Ordered& v = it.value();
    if (v.is_array() && !v.empty() && v[0].is_object()) {
      out << pad << it.key() << ":\n";
      for (std::size_t i = 0; i < v.size(); ++i) {
        comment(str(p, "/", i), pad + "  ");
        out << pad << "  - " << flow(v[i]) << "\n";
      }
    } else if (is_flow(v) || (std::all_of(v.begin(), v.end(), is_flow) && v.size() <= 5 && !has_child_reason(why, p))) {
      out << pad << it.key() << ": " << flow(v) << "\n";
    } else {
      out << pad << it.key() << ":\n";
      emit(out, v, p, indent + 2, why);
    }
  }
}

}  // namespace

nlohmann::ordered_json NetworkPlan::model_json() const {
  nlohmann::ordered_json k = nlohmann::ordered_json::array(), s = nlohmann::ordered_json::array(),
                         up = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    k.push_back(kernels[i]);
    s.push_back(strides[i]);
    if (i > 0) up.push_back(strides[i]);
  }
  nlohmann::ordered_json m = {{"name", "DynUNet"},
                      {"in_channels", in_channels},
                      {"out_channels", out_channels},
                      {"kernel_size", k},
                      {"strides", s},
                      {"upsample_kernel_size", up},
                      {"filters", filters},
                      {"norm_name", "instance"},
                      {"deep_supervision", deep_supr_num > 0}};
  if (deep_supr_num > 0) m["deep_supr_num"] = deep_supr_num;
  return m;
}

std::int64_t NetworkPlan::parameters() const {
  const std::size_t levels = filters.size();
  std::int64_t n = 0;
  const auto block = [&](std::int64_t in, std::int64_t out, const Shape& kernel) {
    n += in * out * volume_of(kernel) + out * out * volume_of(kernel) + 4 * out;  // 2 convolutions, 2 norms
  };
  for (std::size_t k = 0; k < levels; ++k) block(k == 0 ? in_channels : filters[k - 1], filters[k], kernels[k]);
  for (std::size_t k = 0; k + 1 < levels; ++k) {
    n += filters[k + 1] * filters[k] * volume_of(strides[k + 1]);  // the transposed convolution (no bias)
    block(2 * filters[k], filters[k], kernels[k + 1]);             // MONAI: the level below's kernel
  }
  n += filters[0] * out_channels + out_channels;  // the output block (1x1x1, with bias)
  for (std::int64_t i = 1; i <= deep_supr_num; ++i) n += filters[static_cast<std::size_t>(i)] * out_channels + out_channels;
  return n;
}

MemoryEstimate training_memory(const NetworkPlan& net, const Shape& patch, std::int64_t batch,
                               const MemoryOptions& o) {
  const std::size_t levels = net.filters.size();
  const std::vector<double> voxels = level_voxels(net, patch);
  double maps = 0;  // feature-map elements kept for backward, one sample
  for (std::size_t k = 0; k < levels; ++k) maps += 6.0 * static_cast<double>(net.filters[k]) * voxels[k];
  for (std::size_t k = 0; k + 1 < levels; ++k) maps += 8.0 * static_cast<double>(net.filters[k]) * voxels[k];
  const double outputs = static_cast<double>(1 + net.deep_supr_num) * static_cast<double>(net.out_channels) * voxels[0];
  const double b = static_cast<double>(batch);
  MemoryEstimate m;
  m.activations = b * (maps * static_cast<double>(o.activation_bytes) + 10.0 * outputs * 4.0);  // the loss in float32
  // Backward at the top level holds the gradients of its concatenated input, its
  // convolutions' and norms' outputs at once: about 5 maps there.
  m.transients = b * 5.0 * static_cast<double>(net.filters[0]) * voxels[0] * static_cast<double>(o.activation_bytes) +
                 kStepOverheadBytes;
  m.parameters = static_cast<double>(net.parameters()) * 4.0 * static_cast<double>(1 + o.optimizer_states);
  return m;
}

double inference_memory(const NetworkPlan& net, const Shape& window, std::int64_t activation_bytes) {
  const std::vector<double> v = level_voxels(net, window);
  double maps = 10.0 * static_cast<double>(net.filters[0]) * v[0];
  for (std::size_t k = 0; k < net.filters.size(); ++k) maps += static_cast<double>(net.filters[k]) * v[k];
  return maps * static_cast<double>(activation_bytes) + 3.0 * static_cast<double>(net.out_channels) * v[0] * 4.0 +
         kStepOverheadBytes;
}

double forward_macs(const NetworkPlan& net, const Shape& patch, bool training) {
  const std::size_t levels = net.filters.size();
  const std::vector<double> v = level_voxels(net, patch);
  const auto f = [&](std::size_t k) { return static_cast<double>(net.filters[k]); };
  const auto kernel = [&](std::size_t k) { return static_cast<double>(volume_of(net.kernels[k])); };
  double macs = 0;
  for (std::size_t k = 0; k < levels; ++k) {  // encoder: in -> f, f -> f
    const double in = k == 0 ? static_cast<double>(net.in_channels) : f(k - 1);
    macs += (in + f(k)) * f(k) * kernel(k) * v[k];
  }
  for (std::size_t k = 0; k + 1 < levels; ++k) {
    macs += f(k + 1) * f(k) * v[k];                           // transposed convolution: kernel = stride
    macs += (2 * f(k) + f(k)) * f(k) * kernel(k + 1) * v[k];  // 2f -> f, f -> f at the level below's kernel
  }
  const double classes = static_cast<double>(net.out_channels);
  macs += f(0) * classes * v[0];  // the output head (1x1x1)
  if (training) {
    for (std::int64_t i = 1; i <= net.deep_supr_num; ++i) {
      macs += f(static_cast<std::size_t>(i)) * classes * v[static_cast<std::size_t>(i)];
    }
  }
  return macs;
}

Plan make_plan(const DatasetFingerprint& fp, const PlanOptions& o) {
  if (fp.cases.empty()) throw ValueError(str(fp.list, ": no case to plan with"));
  Plan p;
  p.device = o.device;
  p.amp = o.device.rfind("cuda", 0) == 0;
  p.epochs = o.epochs;
  p.run_dir = o.run_dir;
  if (o.epochs < 1) throw ValueError(str("plan: --epochs must be at least 1, got ", o.epochs));
  if (o.validation_cases < -1) {
    throw ValueError(str(fp.list, ": ", o.validation_cases,
                         " validation cases: expected 0 or more (0: none), or -1 (a fifth of the cases)"));
  }
  if (o.validation_cases >= 0 && static_cast<std::size_t>(o.validation_cases) >= fp.cases.size()) {
    throw ValueError(str(fp.list, ": ", o.validation_cases, " validation cases leave none of its ", fp.cases.size(),
                         " to train on (data.validation.num: at most ", fp.cases.size() - 1, ")"));
  }
  std::vector<Spacing> spacings;
  std::vector<Shape> shapes;  // after the crop (nnU-Net's shapes_after_crop)
  std::vector<double> relative;
  for (const auto& c : fp.cases) {
    spacings.push_back(c.crop.spacing);
    shapes.push_back(c.crop.shape_after_crop);
    relative.push_back(c.crop.relative_size);
  }
  p.target_spacing = target_spacing(spacings, shapes);
  p.median_shape = resampled_median_shape(spacings, shapes, p.target_spacing);
  p.fullres_spacing = p.target_spacing;
  p.fullres_median_shape = p.median_shape;
  p.classes = fp.classes();
  p.labels = fp.labels;
  // nnU-Net's region-based training: one sigmoid output per region; a label of several
  // channels (a mask each) likewise one per channel. Else one softmax output per class.
  p.sigmoid = fp.labels.has_regions() || fp.label_channels > 1;
  const std::int64_t out_channels = fp.labels.has_regions() ? static_cast<std::int64_t>(fp.labels.regions.size())
                                    : fp.label_channels > 1 ? fp.label_channels
                                                            : p.classes.back() + 1;  // class indices 0..max
  const double dataset_voxels = dataset_voxels_of(fp, p.median_shape);

  // Normalization per channel (nnU-Net's table by name; the mask rule from the crop's share).
  const double median_relative = numpy_percentile(relative, 50);
  for (std::size_t ch = 0; ch < fp.channel_names.size(); ++ch) {
    ChannelNormalization n;
    n.name = fp.channel_names[ch];
    n.scheme = normalization_for(n.name);
    n.use_mask = use_mask_for_norm(n.scheme, median_relative);
    if (n.scheme == Normalization::ct) {
      n.stats = intensity_stats(fp.pooled_samples(ch));
      if (!(n.stats->std > 0)) {
        throw ValueError(str(fp.list, ": channel ", ch, " (CT): the foreground's intensities are all ", n.stats->mean,
                             "; nothing to normalise by"));
      }
    }
    p.normalization.push_back(n);
  }
  for (const auto& n : p.normalization) {
    if (n.scheme != p.normalization[0].scheme || n.use_mask != p.normalization[0].use_mask) {
      throw ValueError(str(fp.list, ": channels '", p.normalization[0].name, "' and '", n.name,
                           "' need different normalizations (", name_of(p.normalization[0].scheme), ", ",
                           name_of(n.scheme), "); a plan normalises every channel one way (name them alike, or "
                           "write the run config's normalization by hand)"));
    }
    if (n.scheme == Normalization::rescale_to_0_1) {
      throw ValueError(str(fp.list, ": channel '", n.name, "': rescale_to_0_1 is not planned yet (use zscore, CT or noNorm)"));
    }
  }

  // The budget and the patch.
  MemoryOptions mo;
  mo.activation_bytes = p.amp ? 2 : 4;
  if (o.memory_bytes > 0) {
    p.budget_bytes = o.memory_bytes;
    p.budget_reason = "--memory";
  } else if (p.amp) {
    if (o.device_free_bytes == 0) throw ValueError(str("plan: the free memory of ", o.device, " is not known: give --memory"));
    p.budget_bytes = static_cast<std::uint64_t>(0.9 * static_cast<double>(o.device_free_bytes));
    p.budget_reason = str("90% of ", o.device, "'s free memory (", format_bytes(o.device_free_bytes), ")");
  } else {
    if (o.host_memory_bytes == 0) throw ValueError("plan: the machine's memory is not known: give --memory");
    p.budget_bytes = static_cast<std::uint64_t>(kCpuMemoryFraction * static_cast<double>(o.host_memory_bytes));
    p.budget_reason = str(static_cast<int>(kCpuMemoryFraction * 100), "% of the machine's memory (",
                          format_bytes(o.host_memory_bytes), ")");
  }
  const std::int64_t in_channels = static_cast<std::int64_t>(fp.channel_names.size());
  const auto network_for = [&](const Topology& t, const std::vector<std::int64_t>& features) {
    NetworkPlan n;
    n.in_channels = in_channels;
    n.out_channels = out_channels;
    n.kernels = t.kernels;
    n.strides = t.strides;
    n.filters = features;
    n.deep_supr_num = t.stages() >= 3 ? static_cast<std::int64_t>(t.stages()) - 2 : 0;
    return n;
  };
  StepModel model;
  model.budget = static_cast<double>(p.budget_bytes);
  model.describe = [](double bytes) { return format_bytes(static_cast<std::uint64_t>(std::max(0.0, bytes))); };
  model.cost = [&](const Topology& t, const std::vector<std::int64_t>& features, std::int64_t batch) {
    return training_memory(network_for(t, features), t.patch, batch, mo).total();
  };
  const auto planned = [&](const StepModel& m, double voxels, const char* raise) {
    try {
      return plan_patch(p.target_spacing, p.median_shape, voxels, m);
    } catch (const ValueError& e) {
      throw ValueError(str(fp.list, ": ", e.what(), ": raise ", raise));
    }
  };
  p.patch = planned(model, dataset_voxels, "--memory");

  // The compute budget (CPU by default): fewer channels first, then a smaller patch.
  p.step_macs_budget = o.step_macs_budget >= 0 ? o.step_macs_budget : (p.amp ? 0 : kCpuStepMacs);
  const double unbudgeted_macs =
      training_step_macs(network_for(p.patch.topology, p.patch.features), p.patch.topology.patch,
                         2 * kCropsPerCase);  // a step of 2 cases of kCropsPerCase crops, as budgeted
  if (p.step_macs_budget > 0 && unbudgeted_macs > p.step_macs_budget) {
    const Shape memory_patch = p.patch.topology.patch;
    const std::size_t memory_levels = p.patch.topology.stages();
    // Within the budget each case gives kCropsPerCase crops: a step of `batch` cases trains
    // batch * kCropsPerCase of them (and a batch's share of the dataset counts them all).
    StepModel budgeted = model;
    budgeted.cost = [&](const Topology& t, const std::vector<std::int64_t>& features, std::int64_t batch) {
      return training_memory(network_for(t, features), t.patch, batch * kCropsPerCase, mo).total();
    };
    budgeted.compute_budget = p.step_macs_budget;
    budgeted.compute = [&](const Topology& t, const std::vector<std::int64_t>& features, std::int64_t batch) {
      return training_step_macs(network_for(t, features), t.patch, batch * kCropsPerCase);
    };
    // The patch at the plan's spacing: the widest channels whose patch is at least half the
    // memory budget's (by volume), else the narrowest.
    const auto budgeted_patch = [&] {
      const double crop_voxels = dataset_voxels_of(fp, p.median_shape) / static_cast<double>(kCropsPerCase);
      PatchPlan chosen;
      for (std::size_t i = 0; i < kComputeBaseFeatures.size(); ++i) {
        budgeted.base_features = kComputeBaseFeatures[i];
        budgeted.max_features = 10 * kComputeBaseFeatures[i];
        if (i + 1 == kComputeBaseFeatures.size()) return planned(budgeted, crop_voxels, "--compute");
        try {
          chosen = plan_patch(p.target_spacing, p.median_shape, crop_voxels, budgeted);
        } catch (const ValueError&) {
          continue;  // no patch fits with these channels: narrower ones may
        }
        // Half the memory budget's patch, or of the median case where that is smaller (a
        // low-resolution case can be smaller than the full-resolution patch).
        const double yardstick = std::min(static_cast<double>(volume_of(memory_patch)), volume_of(p.median_shape));
        if (2.0 * static_cast<double>(volume_of(chosen.topology.patch)) >= yardstick) break;
      }
      return chosen;
    };
    // A budget that leaves a network too shallow to see context (fewer than 3 levels where
    // the memory budget allows them) is refused rather than planned.
    const auto check_levels = [&] {
      if (p.patch.topology.stages() < std::min<std::size_t>(3, memory_levels)) {
        throw ValueError(str(fp.list, ": the compute budget (", fmt(p.step_macs_budget / 1e9, 4),
                             " GMAC a training step) leaves a patch of ", fmt3(p.patch.topology.patch), " at ",
                             fmt3(p.target_spacing), " mm and ", p.patch.topology.stages(),
                             " level(s), too small to learn from; the memory budget allows ", fmt3(memory_patch),
                             " at ", fmt3(p.fullres_spacing), " mm (", memory_levels, " levels): raise --compute"));
      }
    };
    p.patch = budgeted_patch();
    check_levels();
    // nnU-Net's 3d_lowres where the budget's patch covers less than a quarter of the median
    // case: the spacing grows by 3% a step (axes finer than half the coarsest first) until it
    // does. Within the compute budget it is the configuration that trains (nnU-Net trains
    // both and keeps the better, or cascades them): fewer voxels a case, so more of a case in
    // each crop and fewer validation windows. nnU-Net drops 3d_lowres where the case shrank
    // less than 2x (a cascade over it would add little); trained alone, any shrink saves
    // windows, so medfast keeps it (docs/plan.md).
    double median_voxels = volume_of(p.fullres_median_shape);  // unrounded, as nnU-Net's test takes it
    for (int step = 0;
         step < 1000 && static_cast<double>(volume_of(p.patch.topology.patch)) < kLowresThreshold * median_voxels;
         ++step) {
      const double coarsest = std::max({p.target_spacing[0], p.target_spacing[1], p.target_spacing[2]});
      const bool anisotropic =
          std::any_of(p.target_spacing.begin(), p.target_spacing.end(), [&](double s) { return coarsest / s > 2; });
      for (double& s : p.target_spacing) {
        if (!anisotropic || coarsest / s > 2) s *= kLowresSpacingStep;
      }
      median_voxels = 1;
      for (int d = 0; d < 3; ++d) {
        const double n = p.fullres_spacing[d] / p.target_spacing[d] * p.fullres_median_shape[d];
        median_voxels *= n;
        p.median_shape[d] = std::round(n);
      }
      p.patch = budgeted_patch();
      p.lowres = true;
    }
    check_levels();
    p.crops_per_case = kCropsPerCase;
    p.compute_reason = str(o.step_macs_budget >= 0 ? "--compute" : "a CPU plan's default, the spleen recipe's step",
                           ": ", fmt(p.step_macs_budget / 1e9, 4),
                           " GMAC a step, where nnU-Net's network at the memory "
                           "budget's patch (",
                           fmt3(memory_patch), ") would take ", fmt(unbudgeted_macs / 1e9, 4), " GMAC at batch 2, ",
                           kCropsPerCase, " crops a case");
  } else if (p.step_macs_budget > 0) {
    // The memory budget's plan fits: as many crops a case (up to kCropsPerCase) as still fit;
    // where even one crop a case exceeds the compute budget (a large batch of small cases),
    // fewer cases a step, at least 2.
    const NetworkPlan n = network_for(p.patch.topology, p.patch.features);
    const auto fits = [&](std::int64_t crops) {
      return training_step_macs(n, p.patch.topology.patch, crops) <= p.step_macs_budget &&
             training_memory(n, p.patch.topology.patch, crops, mo).total() <= static_cast<double>(p.budget_bytes);
    };
    p.crops_per_case = 1;
    for (std::int64_t c = kCropsPerCase; c > 1; --c) {
      if (fits(p.patch.batch_size * c)) {
        p.crops_per_case = c;
        break;
      }
    }
    const std::int64_t memory_batch = p.patch.batch_size;
    while (p.crops_per_case == 1 && p.patch.batch_size > 2 && !fits(p.patch.batch_size)) --p.patch.batch_size;
    p.compute_reason = str(o.step_macs_budget >= 0 ? "--compute" : "a CPU plan's default", ": ",
                           fmt(p.step_macs_budget / 1e9, 4), " GMAC a step, which the memory budget's plan fits",
                           p.patch.batch_size < memory_batch
                               ? str(" at ", p.patch.batch_size, " of its ", memory_batch, " cases a step")
                               : std::string());
  }
  const std::int64_t crops = p.patch.batch_size * p.crops_per_case;
  p.network = network_for(p.patch.topology, p.patch.features);
  p.memory = training_memory(p.network, p.patch.topology.patch, crops, mo);
  p.step_macs = training_step_macs(p.network, p.patch.topology.patch, crops);
  p.validation_macs_per_voxel = forward_macs(p.network, p.patch.topology.patch, /*training=*/false) /
                                static_cast<double>(volume_of(p.patch.topology.patch));
  // The validation window: the patch (nnU-Net's). Windows the size of a case were tried: with
  // instance norm their statistics are not the training crops', and trained networks missed
  // whole organs in them (docs/plan.md). The memory: a window's forward and the sliding
  // window's case-sized buffers (probabilities, their weights, the output) for the largest case.
  p.largest_case = resampled_max_shape(spacings, shapes, p.target_spacing);
  p.validation_window = p.patch.topology.patch;
  const double case_buffers =
      3.0 * static_cast<double>(p.network.out_channels) * 4.0 * static_cast<double>(volume_of(p.largest_case));
  // Windows a forward (sw_batch_size): up to 4 of the batch, fewer where memory asks.
  p.validation_batch = std::min<std::int64_t>(p.patch.batch_size, 4);
  const auto validation_memory = [&] {
    return static_cast<double>(p.validation_batch) *
               inference_memory(p.network, p.validation_window, mo.activation_bytes) +
           case_buffers;
  };
  while (p.validation_batch > 1 && validation_memory() > static_cast<double>(p.budget_bytes)) --p.validation_batch;
  p.validation_memory = validation_memory();
  if (o.validation_cases >= 0) {
    p.validation_cases = static_cast<std::size_t>(o.validation_cases);
    p.validation_cases_asked = true;
  } else {
    p.validation_cases =
        fp.cases.size() >= 2
            ? std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(static_cast<double>(fp.cases.size()) / 5)))
            : 0;
  }
  // nnU-Net's momentum where the run is long enough to warm it up, else the recipe's.
  const auto training_cases = static_cast<std::int64_t>(fp.cases.size() - p.validation_cases);
  p.planned_steps = static_cast<std::int64_t>(p.epochs) *
                    std::max<std::int64_t>(1, (training_cases + p.patch.batch_size - 1) / p.patch.batch_size);
  p.momentum = p.planned_steps >= kLongRunSteps ? kLongRunMomentum : kShortRunMomentum;
  p.lr = p.momentum == kLongRunMomentum ? 0.01 : 0.1;

  // Validation at most a third of the run's time: its forwards against an epoch's steps.
  p.validation_overlap = p.step_macs_budget > 0 ? 0.25 : 0.5;
  const Shape& w = p.validation_window;
  double windows = 1;  // a median case's
  for (int d = 0; d < 3; ++d) {
    const double size = p.median_shape[d], roi = static_cast<double>(w[d]);
    if (size > roi) windows *= std::ceil((size - roi) / (roi * (1 - p.validation_overlap))) + 1;
  }
  p.validation_windows = windows;
  p.validation_epoch_macs = static_cast<double>(p.validation_cases) * windows * forward_macs(p.network, w, false);
  p.epoch_macs = static_cast<double>(p.planned_steps / std::max(1, p.epochs)) * p.step_macs;
  p.validation_interval =
      p.epoch_macs > 0
          ? std::max(1, static_cast<int>(std::ceil(
                            (1 - kValidationShare) / kValidationShare * p.validation_epoch_macs / p.epoch_macs - 1e-9)))
          : 1;
  p.validation_interval = std::min(p.validation_interval, std::max(1, p.epochs));  // the last epoch validates
  return p;
}

nlohmann::json run_config(const DatasetFingerprint& fp, const Plan& plan, const std::string& dataset) {
  return nlohmann::json::parse(build(fp, plan, dataset).config.dump());
}

std::string run_config_yaml(const DatasetFingerprint& fp, const Plan& p, const std::string& dataset) {
  const Annotated a = build(fp, p, dataset);
  std::ostringstream out;
  out << "# A run config planned by `medfast plan` from " << one_line(fp.list) << " (" << fp.cases.size() << " of " << fp.listed
      << " cases";
  if (fp.excluded() > 0) out << "; " << fp.excluded() << " left out";
  out << ").\n# Rules and sources: docs/plan.md. Train it with: medfast train --config <this file>\n";
  out << "# Memory: about " << format_bytes(static_cast<std::uint64_t>(p.memory.total())) << " per training step ("
      << p.budget_reason << ": " << format_bytes(p.budget_bytes) << " budget).\n";
  out << "# Compute: " << compute_text(p) << ".\n";
  for (const auto& n : fp.notes) out << "# note: " << one_line(n.text()) << "\n";
  emit(out, a.config, "", 0, a.why);
  return out.str();
}

nlohmann::json plan_json(const DatasetFingerprint& fp, const Plan& p) {
  nlohmann::json norm = nlohmann::json::array();
  for (const auto& n : p.normalization) {
    nlohmann::json j = {{"channel", n.name}, {"kind", name_of(n.scheme)}, {"use_nonzero_mask", n.use_mask}};
    if (n.stats) {
      j["clip"] = {n.stats->p00_5, n.stats->p99_5};
      j["mean"] = n.stats->mean;
      j["std"] = n.stats->std;
    } else {
      j["clip"] = nullptr;
      j["mean"] = nullptr;  // per image
      j["std"] = nullptr;
    }
    norm.push_back(j);
  }
  const Topology& t = p.patch.topology;
  // What nnU-Net's own proxy and 8 GB reference would plan for this fingerprint, beside it.
  const PatchPlan nnunet = plan_patch(p.fullres_spacing, p.fullres_median_shape, p.network.out_channels,
                                      dataset_voxels_of(fp, p.fullres_median_shape));
  return {{"target_spacing", p.target_spacing},
          {"median_shape", p.median_shape},
          {"lowres", p.lowres},
          {"fullres_spacing", p.fullres_spacing},
          {"fullres_median_shape", p.fullres_median_shape},
          {"patch_size", t.patch},
          {"batch_size", p.patch.batch_size},
          {"crops_per_case", p.crops_per_case},
          {"normalization", norm},
          {"classes", p.classes},
          {"network",
           {{"name", "DynUNet"},
            {"strides", t.strides},
            {"kernel_sizes", t.kernels},
            {"filters", p.network.filters},
            {"deep_supr_num", p.network.deep_supr_num},
            {"parameters", p.network.parameters()}}},
          {"estimated_memory_bytes", static_cast<std::uint64_t>(p.memory.total())},
          {"estimated_memory",
           {{"activations", p.memory.activations},
            {"transients", p.memory.transients},
            {"parameters", p.memory.parameters}}},
          {"estimated_step_macs", p.step_macs},
          {"estimated_validation_macs_per_voxel", p.validation_macs_per_voxel},
          {"validation_window", p.validation_window},
          {"largest_case", p.largest_case},
          {"estimated_validation_memory_bytes", static_cast<std::uint64_t>(p.validation_memory)},
          {"step_macs_budget", p.step_macs_budget},
          {"compute_budget", p.compute_reason},
          {"budget_bytes", p.budget_bytes},
          {"budget", p.budget_reason},
          {"nnunet_feature_map_elements", feature_map_elements(t, p.network.filters, p.network.out_channels)},
          {"nnunet_8gb_reference",
           {{"patch_size", nnunet.topology.patch},
            {"batch_size", nnunet.batch_size},
            {"levels", nnunet.topology.stages()}}},
          {"validation_cases", p.validation_cases},
          {"validation_interval", p.validation_interval},
          {"validation_overlap", p.validation_overlap},
          {"planned_steps", p.planned_steps},
          {"optimizer", {{"name", "SGD"}, {"lr", p.lr}, {"momentum", p.momentum}}},
          {"device", p.device},
          {"amp", p.amp},
          {"epochs", p.epochs},
          {"fingerprint", fingerprint_json(fp)}};
}

std::string plan_summary(const DatasetFingerprint& fp, const Plan& p) {
  std::ostringstream o;
  o << "plan for " << fp.list << ": " << fp.cases.size() << " of " << fp.listed << " cases";
  if (fp.from_cache > 0) o << " (" << fp.from_cache << " from the cache)";
  o << "\n  target spacing " << fmt3(p.target_spacing) << " mm"
    << (p.lowres ? str(" (nnU-Net's 3d_lowres; full resolution ", fmt3(p.fullres_spacing), " mm)") : std::string())
    << ", median shape there " << fmt3(p.median_shape, 5) << "\n  patch " << fmt3(p.patch.topology.patch) << ", batch "
    << p.patch.batch_size << ", DynUNet " << p.patch.topology.stages() << " levels, " << p.network.parameters()
    << " parameters"
    << "\n  normalization: ";
  for (std::size_t i = 0; i < p.normalization.size(); ++i) {
    const auto& n = p.normalization[i];
    o << (i ? "; " : "") << (n.name.empty() ? str("channel ", i) : n.name) << ": " << name_of(n.scheme);
    if (n.stats) o << " clip [" << fmt(n.stats->p00_5) << ", " << fmt(n.stats->p99_5) << "] mean " << fmt(n.stats->mean) << " std " << fmt(n.stats->std);
    if (n.use_mask) o << " (nonzero region)";
  }
  o << "\n  memory: about " << format_bytes(static_cast<std::uint64_t>(p.memory.total())) << " per step of a "
    << format_bytes(p.budget_bytes) << " budget (" << p.budget_reason << ")";
  o << "\n  compute: " << compute_text(p);
  o << "\n  validation: every " << p.validation_interval << " epoch(s), windows of " << fmt3(p.validation_window)
    << " overlapping by " << p.validation_overlap << " (the largest case is " << fmt3(p.largest_case) << "), about "
    << format_bytes(static_cast<std::uint64_t>(p.validation_memory));
  for (const auto& n : fp.notes) o << "\n  note: " << n.text();
  return o.str();
}

}  // namespace medfast::plan
