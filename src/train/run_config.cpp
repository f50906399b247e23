#include "medfast/train/run_config.hpp"

#include "device.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <filesystem>
#include <set>

#include "medfast/core/config.hpp"
#include "medfast/core/document.hpp"
#include "medfast/data/dataset.hpp"
#include "medfast/core/error.hpp"
#include "medfast/nn/conv.hpp"
#include "medfast/nn/direct_conv.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/process.hpp"
#include "medfast/train/amp.hpp"

namespace medfast::train {

namespace {

// The built-in default run (`medfast train` with no --config): a small
// synthetic spleen-like dataset, the spleen recipe's chains at a smaller scale,
// and a small UNet that reaches a validation Dice of 0.85 on 2 CPU cores in
// seconds. These are the CPU's settings; default_run_config gives a GPU its own.
constexpr const char* kDefaultConfig = R"(
data:
  dataset: data/synth-small/dataset.json
  synth: {cases: 12, size: "96,96,24-32", spacing: [1.6, 1.6, 3.0], seed: 0}
  validation: {num: 3}
  deterministic:
    - {name: LoadImage, keys: [image, label], dtype: [float32, ""]}
    - {name: EnsureChannelFirst, keys: [image, label]}
    - {name: Orientation, keys: [image, label], axcodes: RAS}
    - {name: Spacing, keys: [image, label], pixdim: [2.0, 2.0, 3.0], mode: [bilinear, nearest]}
    - {name: ScaleIntensityRange, keys: image, a_min: -57, a_max: 164, b_min: 0.0, b_max: 1.0, clip: true}
    - {name: CropForeground, keys: [image, label], source_key: image}
    - {name: FgBgToIndices, keys: label, image_key: image}
  random:
    - {name: RandCropByPosNegLabel, keys: [image, label], label_key: label, spatial_size: [32, 32, 16],
       pos: 1, neg: 1, num_samples: 4, fg_indices_key: label_fg_indices, bg_indices_key: label_bg_indices}
    - {name: RandFlip, keys: [image, label], spatial_axis: [0], prob: 0.5}
    - {name: RandFlip, keys: [image, label], spatial_axis: [1], prob: 0.5}
    - {name: RandShiftIntensity, keys: image, offsets: 0.1, prob: 0.5}
  cache: {kind: memory}
  seed: 0
  loader: {batch_size: 2, threads: 1, shuffle: true, prefetch: 4}
model: {name: UNet, in_channels: 1, out_channels: 2, channels: [8, 16, 32, 64], strides: [2, 2, 2],
        num_res_units: 1, norm: instance}
loss: {name: DiceCE, to_onehot_y: true, softmax: true}
optimizer: {name: Adam, lr: 0.005}
schedule: {name: constant}
validation:
  interval: 1
  sliding_window: {roi_size: [32, 32, 16], sw_batch_size: 4, overlap: 0.25, mode: constant}
train: {run_dir: runs/default, epochs: 40, seed: 0, device: auto, amp: false, target_dice: 0.85}
)";


}  // namespace

nlohmann::json default_run_config(c10::Device device, bool bf16) {
  nlohmann::json c = data::parse_yaml(kDefaultConfig, "the built-in default config");
  if (device.is_cuda()) {  // the GPU's settings: mixed precision, the samples kept in GPU memory
    c["train"]["amp"] = bf16 ? "bf16" : "fp16";
    c["data"]["cache"]["kind"] = "device";
  }
  return c;
}

void apply_override(nlohmann::json& config, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ValueError(str("--set ", assignment, ": expected key=value, e.g. train.epochs=5 or optimizer.lr=0.01"));
  }
  const std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  nlohmann::json value = text.empty() ? nlohmann::json("") : data::parse_yaml(text, str("--set ", key));
  nlohmann::json* node = &config;
  std::size_t from = 0;
  while (true) {
    const auto dot = key.find('.', from);
    const std::string part = key.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    const std::string parent = from == 0 ? std::string("the config") : "'" + key.substr(0, from - 1) + "'";
    if (part.empty()) throw ValueError(str("--set ", assignment, ": empty part in key '", key, "'"));
    nlohmann::json* child = nullptr;
    if (node->is_array()) {  // list items by index: data.random.0.num_samples=4
      std::size_t used = 0;
      std::size_t index = 0;
      try {
        index = std::stoul(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != part.size() || index >= node->size()) {
        throw ValueError(str("--set ", assignment, ": ", parent, " is a list of ", node->size(), " items; '", part,
                             "' is not an index into it"));
      }
      child = &(*node)[index];
    } else if (node->is_object()) {
      if (dot != std::string::npos && !node->contains(part)) (*node)[part] = nlohmann::json::object();
      child = &(*node)[part];
    } else {
      throw ValueError(str("--set ", assignment, ": ", parent, " is not a mapping or a list"));
    }
    if (dot == std::string::npos) {
      *child = std::move(value);
      return;
    }
    node = child;
    from = dot + 1;
  }
}

void ValidationOptions::validate() const {
  if (interval < 1) throw ValueError(str("validation.interval: ", interval, " (expected >= 1)"));
}

void TrainOptions::validate() const {
  if (run_dir.empty()) throw ValueError("train.run_dir: must not be empty");
  if (epochs < 1) throw ValueError(str("train.epochs: ", epochs, " (expected >= 1)"));
  if (target_dice < 0 || target_dice > 1) throw ValueError(str("train.target_dice: ", target_dice, " (expected 0..1)"));
  if (threads < 0 || threads > kMaxThreads) {
    throw ValueError(str("train.threads: ", threads, " (expected 0..", kMaxThreads, "; 0: the threads setting)"));
  }
  if (max_nonfinite_steps < -1) {
    throw ValueError(str("train.max_nonfinite_steps: ", max_nonfinite_steps,
                         " (expected >= 0, 0: never stop; absent: 1, or 20 with amp fp16)"));
  }
  if (device != "auto") (void)detail::parse_device(device, "train.device");
}

at::MemoryFormat resolve_memory_format(MemoryFormatChoice choice, c10::Device device) {
  switch (choice) {
    case MemoryFormatChoice::channels_last: return at::MemoryFormat::ChannelsLast3d;
    case MemoryFormatChoice::contiguous: return at::MemoryFormat::Contiguous;
    case MemoryFormatChoice::automatic: break;
  }
  return device.is_cuda() ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
}

at::MemoryFormat memory_format_of(const nlohmann::json& train_section, c10::Device device, const std::string& where) {
  const nlohmann::json v = train_section.is_object() ? train_section.value("memory_format", nlohmann::json("auto"))
                                                     : nlohmann::json("auto");
  const auto choice = v.is_string() ? parse_choice<MemoryFormatChoice>(v.get<std::string>()) : std::nullopt;
  if (!choice) {
    throw ValueError(str(where, ": train.memory_format: expected ", choice_list<MemoryFormatChoice>(), ", got ", v.dump()));
  }
  return resolve_memory_format(*choice, device);
}

bool deterministic_of(const nlohmann::json& train_section, const std::string& where) {
  const nlohmann::json v = train_section.is_object() ? train_section.value("deterministic", nlohmann::json(true))
                                                     : nlohmann::json(true);
  if (!v.is_boolean()) throw ValueError(str(where, ": train.deterministic: expected true or false, got ", v.dump()));
  return v.get<bool>();
}

void apply_cuda_determinism(c10::Device device, bool deterministic) {
  if (!device.is_cuda()) return;
  at::globalContext().setDeterministicCuDNN(deterministic);
  at::globalContext().setBenchmarkCuDNN(!deterministic);
  if (deterministic) {
    // Deterministic kernels where torch has them; a warning names any op without one.
    os::set_env_default("CUBLAS_WORKSPACE_CONFIG", ":4096:8");
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
}

int apply_network_threads(int train_threads, const Settings& settings) {
  const int n = train_threads > 0 ? train_threads : settings.threads();
  at::set_num_threads(n);
  return n;
}

bool apply_host_memory_reuse(const Settings& settings) {
  return settings.get_bool("host_memory_reuse") && os::keep_freed_memory();
}

bool apply_conv_backward(const Settings& settings) {
  const bool on = settings.get("conv_backward") == "auto";
  nn::set_custom_conv_backward(on);
  return on;
}

bool apply_conv_forward(const Settings& settings) {
  const bool on = settings.get("conv_forward") == "auto";
  nn::set_direct_conv(on);
  nn::set_onednn_conv_forward(on);
  return on;
}

namespace {

/// The folder relative paths start from: `base_dir`, else the config's folder ("." for
/// the built-in default).
std::string base_of(const std::string& path, const std::string& base_dir) {
  if (!base_dir.empty()) return base_dir;
  return path.empty() || is_config_name(path) ? "." : os::parent_directory(path);
}

/// Every section but data's lists, read and checked: what a run needs to know is right
/// before any data is prepared (a typo anywhere is reported before data.synth writes).
RunConfig read_sections(const nlohmann::json& root, const std::string& path, const Settings& settings, std::string base_dir) {
  RunConfig c;
  c.path = path.empty() ? "built-in default config" : path;
  base_dir = base_of(path, base_dir);
  c.base_dir = std::filesystem::absolute(base_dir).lexically_normal().string();
  if (c.base_dir.size() > 1 && c.base_dir.back() == '/') c.base_dir.pop_back();
  const std::string base = base_dir;
  auto fail = [&](const std::string& key, const std::string& what) { return ConfigError(str(c.path, ": ", key, ": ", what)); };
  if (!root.is_object()) throw ConfigError(str(c.path, ": expected a mapping with data, model, loss, optimizer, train"));
  ConfigReader sections(root, c.path, ConfigReader::Naming{ConfigReader::Style::top, "section", ""});
  for (const char* s : {"data", "model", "loss", "optimizer", "schedule", "validation", "train", "settings"}) {
    sections.known(s);
  }
  sections.finish();
  // The config's settings sit below flags and the environment.
  c.settings = data::with_config_settings(settings, root, c.path);
  for (const char* required : {"data", "model"}) {
    if (!root.contains(required)) throw fail(required, "missing");
  }
  c.model = root["model"];
  if (!c.model.is_object()) throw fail("model", "expected a mapping with a name (UNet, SegResNet, SwinUNETR)");
  auto section = [&](const char* name) {
    const nlohmann::json v = root.value(name, nlohmann::json::object());
    if (!v.is_object()) throw fail(name, "expected a mapping");
    return v;
  };
  auto in_config = [&](auto&& f) {  // errors of a section's reader, named after this config
    try {
      f();
    } catch (const Error& e) {
      throw ConfigError(str(c.path, ": ", e.what()));
    }
  };
  in_config([&] { nn::parse_network(c.model, "model"); });
  if (c.model.contains("pretrained") && c.model["pretrained"].is_string()) {  // relative to the config's folder
    const std::string file = data::resolve_path(base, c.model["pretrained"].get<std::string>());
    if (!os::exists(file)) throw fail("model.pretrained", str("no such file: ", file));
    c.model["pretrained"] = file;
  }
  in_config([&] { c.loss = LossOptions::from_json(section("loss"), "loss"); });
  in_config([&] { c.optimizer = OptimizerOptions::from_json(section("optimizer"), "optimizer"); });
  if (root.contains("schedule")) {  // absent: a constant learning rate
    in_config([&] { c.schedule = ScheduleOptions::from_json(root["schedule"], "schedule"); });
  }

  ConfigReader val(section("validation"), c.path + ": validation");
  read_fields(val, c.validation);
  const nlohmann::json sw = val.raw("sliding_window");
  val.finish();
  in_config([&] { c.validation.validate(); });
  in_config([&] { c.sliding_window = SlidingWindowOptions::from_json(sw, "validation.sliding_window"); });

  ConfigReader tr(section("train"), c.path + ": train");
  TrainOptions& t = c.train;
  read_fields(tr, t);
  if (tr.has("profile")) {
    const nlohmann::json p = tr.raw("profile");
    in_config([&] { t.profile = ProfileOptions::from_json(p, "train.profile"); });
  }
  tr.known("profile");
  tr.finish();
  t.run_dir = data::resolve_path(base, t.run_dir);
  in_config([&] {
    t.validate();
    // auto may be a GPU: its precisions are checked again once the device is chosen.
    (void)parse_precision(t.amp, t.device == "auto" || c10::Device(t.device).is_cuda(), "train.amp");
  });
  return c;
}

}  // namespace

bool prepare_run(const nlohmann::json& root, const std::string& path, const Settings& settings, std::string base_dir) {
  const RunConfig c = read_sections(root, path, settings, base_dir);
  return data::prepare_dataset(root, c.path, base_of(path, base_dir), c.settings);
}

namespace {

/// The list's "labels" as value sets by name, as data::list_labels reads them (MSD's
/// {"1": "edema"}, nnU-Net's {"edema": 1} and its regions {"whole tumor": [1, 2, 3]}): each value
/// a label names alone (not the stand-in names of DatasetLabels::unnamed), then each region.
/// Empty for a CSV list, a list without labels or one whose labels do not read (names are a
/// nicety: the run reads the list itself and says why).
std::vector<std::pair<std::string, std::set<std::int64_t>>> list_label_sets(const std::string& list) {
  std::vector<std::pair<std::string, std::set<std::int64_t>>> out;
  if (list.empty() || data::is_csv_list(list)) return out;
  try {
    const data::DatasetLabels labels = data::list_labels(list);
    for (const auto& [value, name] : labels.names) {
      if (!labels.unnamed.count(value)) out.emplace_back(name, std::set<std::int64_t>{value});
    }
    for (std::size_t r = 0; r < labels.regions.size(); ++r) {
      out.emplace_back(labels.region_names[r],
                       std::set<std::int64_t>(labels.regions[r].begin(), labels.regions[r].end()));
    }
  } catch (const std::exception&) {
    out.clear();
  }
  return out;
}

/// The label sets of LabelToRegions' regions in a chain, or nothing.
std::optional<std::vector<std::set<std::int64_t>>> chain_regions(const nlohmann::json& chain) {
  for (const auto& t : chain) {
    if (!t.is_object() || t.value("name", "") != "LabelToRegions" || !t.contains("regions")) continue;
    std::vector<std::set<std::int64_t>> regions;
    for (const auto& r : t["regions"]) {
      std::set<std::int64_t> s;
      if (r.is_number_integer()) s.insert(r.get<std::int64_t>());
      if (r.is_array()) {
        for (const auto& v : r) {
          if (v.is_number_integer()) s.insert(v.get<std::int64_t>());
        }
      }
      regions.push_back(s);
    }
    return regions;
  }
  return std::nullopt;
}

bool chain_has(const nlohmann::json& chain, const std::string& name) {
  for (const auto& t : chain) {
    if (t.is_object() && t.value("name", "") == name) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> metric_class_names(const RunConfig& c, std::int64_t classes) {
  const bool each_channel = c.loss.sigmoid || classes == 1;
  const std::int64_t count = each_channel ? classes : classes - 1;
  const std::int64_t first = each_channel ? 0 : 1;
  if (!c.data.class_names.empty()) {
    if (static_cast<std::int64_t>(c.data.class_names.size()) != count) {
      throw ConfigError(str(c.path, ": data.class_names: ", c.data.class_names.size(), " names for the ", count,
                            " classes the metrics report (", each_channel ? "every output channel of a sigmoid model"
                                                                          : "the foreground classes 1..out_channels-1",
                            ")"));
    }
    return c.data.class_names;
  }
  // A plan of nnU-Net regions names them in data.labels.
  if (static_cast<std::int64_t>(c.data.labels.region_names.size()) == count && each_channel) {
    return c.data.labels.region_names;
  }
  std::vector<std::string> names;
  const auto fallback = [&] {
    names.clear();
    for (std::int64_t k = 0; k < count; ++k) names.push_back(str("class_", first + k));
    return names;
  };
  const nlohmann::json& chain = c.data.deterministic;
  if (chain_has(chain, "ConvertToMultiChannelBasedOnBratsClasses")) {
    return count == 3 ? std::vector<std::string>{"TC", "WT", "ET"} : fallback();
  }
  const auto labels = list_label_sets(c.data.dataset.source);
  const auto name_of = [&](const std::set<std::int64_t>& values) -> std::string {
    for (const auto& [name, set] : labels) {
      if (set == values) return name;
    }
    if (values.size() < 2) return "";
    std::string joined;
    for (std::int64_t v : values) {
      const std::string one = [&]() -> std::string {
        for (const auto& [name, set] : labels) {
          if (set == std::set<std::int64_t>{v}) return name;
        }
        return "";
      }();
      if (one.empty()) return "";
      joined += (joined.empty() ? "" : "+") + one;
    }
    return joined;
  };
  if (const auto regions = chain_regions(chain)) {
    if (static_cast<std::int64_t>(regions->size()) != count) return fallback();
    for (const auto& r : *regions) {
      const std::string n = name_of(r);
      if (n.empty()) return fallback();
      names.push_back(n);
    }
    return names;
  }
  // Several sigmoid channels without regions (labels multi-channel in their files): no
  // label value names a channel.
  if (each_channel && classes > 1) return fallback();
  for (std::int64_t k = 0; k < count; ++k) {
    const std::string n = name_of({each_channel ? 1 : first + k});
    if (n.empty()) return fallback();
    names.push_back(n);
  }
  return names;
}

std::string tag_name(const std::string& name) {
  std::string out = name;
  for (char& ch : out) {
    const bool keep = std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
    if (!keep) ch = '_';
  }
  return out;
}

RunConfig load_run_config(nlohmann::json root, std::string path, const Settings& settings, std::string base_dir) {
  RunConfig c = read_sections(root, path, settings, base_dir);
  const std::string base = base_of(path, base_dir);
  const TrainOptions& t = c.train;
  auto fail = [&](const std::string& key, const std::string& what) { return ConfigError(str(c.path, ": ", key, ": ", what)); };
  c.data = data::load_pipeline(root, c.path, base, c.settings);
  if (t.target_dice > 0 && c.data.validation.items.empty()) {
    throw fail("train.target_dice", "needs validation items (set data.validation: {num: N} or {section: NAME})");
  }
  if (c.schedule.name == "warmup_cosine" && c.schedule.warmup_epochs >= t.epochs) {
    throw fail("schedule.warmup_epochs", str(c.schedule.warmup_epochs, " must be below train.epochs (", t.epochs, ")"));
  }
  c.root = std::move(root);
  return c;
}

}  // namespace medfast::train
