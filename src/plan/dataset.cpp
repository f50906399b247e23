// A dataset's fingerprint: every training case read once, summarised, checked, cached.
#include "medfast/plan/dataset.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/stats.hpp"
#include "medfast/core/thread_pool.hpp"
#include "medfast/data/cached_dataset.hpp"
#include "medfast/os/file.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::plan {

namespace {

constexpr int kCacheFormat = 1;
constexpr std::size_t kCacheMaxCases = 20000;  ///< entries kept in one folder's cache, this list's first

/// FNV-1a: a case's draws depend on its image's name, not on its place in the list.
std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

/// `path` relative to the folder `base` where it lies below it (else as it is).
std::string relative_to(const std::string& path, const std::string& base) {
  const std::string prefix = base.empty() || base == "." ? "" : base + "/";
  return !prefix.empty() && path.compare(0, prefix.size(), prefix) == 0 ? path.substr(prefix.size()) : path;
}

std::int64_t next_power_of_two(std::int64_t n) {
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

/// Samples cut to the first `n` per channel (draws are independent: a prefix is a sample).
void keep_samples(CaseSummary& c, std::int64_t n) {
  for (auto& s : c.crop.samples) {
    if (static_cast<std::int64_t>(s.size()) > n) s.resize(static_cast<std::size_t>(n));
  }
}

std::string join_values(const std::vector<std::int64_t>& v) {
  std::string s;
  for (const auto x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

double median_of(std::vector<double> v) { return numpy_percentile(v, 50); }

/// A JSON key that is a whole number >= 0 ("0", "12"), or -1.
long long key_number(const std::string& key) {
  std::size_t used = 0;
  long long i = -1;
  try {
    i = std::stoll(key, &used);
  } catch (const std::exception&) {
    return -1;
  }
  return used == key.size() && i >= 0 ? i : -1;
}

/// The list's channel names: MSD's "modality" or nnU-Net v2's "channel_names", {"0": "CT"}.
std::vector<std::string> read_channel_names(const nlohmann::json& list, const std::string& path) {
  for (const char* key : {"channel_names", "modality"}) {
    if (!list.contains(key)) continue;
    const auto& m = list[key];
    if (!m.is_object()) throw FormatError(str(path, ": '", key, "' must be an object such as {\"0\": \"CT\"}"));
    std::vector<std::string> names(m.size());
    for (const auto& [k, v] : m.items()) {
      const long long i = key_number(k);
      if (i < 0 || static_cast<std::size_t>(i) >= m.size() || !v.is_string()) {
        throw FormatError(str(path, ": '", key, "' must map channel numbers 0..", m.size() - 1,
                              " to names, e.g. {\"0\": \"CT\"}; got \"", k, "\": ", v.dump()));
      }
      names[static_cast<std::size_t>(i)] = v.get<std::string>();
    }
    return names;
  }
  return {};
}

nlohmann::json summary_json(const CaseSummary& c) {
  nlohmann::json labels = nlohmann::json::array();
  for (const auto& [v, n] : c.label_voxels) labels.push_back({v, n});
  return {{"axcodes", c.axcodes},
          {"shape", c.shape},
          {"channels", c.channels},
          {"shape_after_crop", c.crop.shape_after_crop},
          {"relative_size", c.crop.relative_size},
          {"spacing", c.crop.spacing},
          {"foreground_voxels", c.crop.foreground_voxels},
          {"label_voxels", labels},
          {"label_channels", c.label_channels},
          {"samples", c.crop.samples}};
}

/// A cached summary, its samples cut to `samples` per channel; none when it holds fewer.
std::optional<CaseSummary> summary_from(const nlohmann::json& j, std::int64_t samples) {
  CaseSummary c;
  c.axcodes = j.at("axcodes").get<std::string>();
  c.shape = j.at("shape").get<Shape>();
  c.channels = j.at("channels").get<std::int64_t>();
  c.crop.shape_after_crop = j.at("shape_after_crop").get<Shape>();
  c.crop.relative_size = j.at("relative_size").get<double>();
  c.crop.spacing = j.at("spacing").get<Spacing>();
  c.crop.foreground_voxels = j.at("foreground_voxels").get<std::int64_t>();
  for (const auto& p : j.at("label_voxels")) c.label_voxels[p.at(0).get<std::int64_t>()] = p.at(1).get<std::int64_t>();
  c.label_channels = j.value("label_channels", std::int64_t{1});
  c.crop.samples = j.at("samples").get<std::vector<std::vector<double>>>();
  for (auto& s : c.crop.samples) {
    if (c.crop.foreground_voxels > 0 && static_cast<std::int64_t>(s.size()) < samples) return std::nullopt;
  }
  keep_samples(c, samples);
  return c;
}

nlohmann::json read_cache(const std::string& path) {
  if (!os::exists(path)) return nlohmann::json::object();
  try {
    const std::string bytes = os::read_text_file(path);
    nlohmann::json j = nlohmann::json::from_cbor(bytes);
    if (j.is_object() && j.value("format", 0) == kCacheFormat && j.contains("cases") && j["cases"].is_object()) {
      return j["cases"];
    }
    log::warn("plan: ", path, " is a fingerprint cache of another format: every case is read again");
  } catch (const std::exception& e) {
    log::warn("plan: the fingerprint cache ", path, " cannot be read (", e.what(), "): every case is read again");
  }
  return nlohmann::json::object();
}

bool write_cache(const std::string& path, const nlohmann::json& cases) {
  try {
    const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor({{"format", kCacheFormat}, {"cases", cases}});
    os::AtomicWriter w(path);
    w.append(bytes.data(), bytes.size());
    w.commit();
    return true;
  } catch (const std::exception& e) {
    log::warn("plan: the fingerprint is not cached in ", path, " (", e.what(), "): the next plan reads every case again");
    return false;
  }
}

/// Reads one case: LoadImage, EnsureChannelFirst, Orientation RAS, then its summary.
CaseSummary read_case(const data::Dataset& all, std::size_t index, std::int64_t samples, std::uint64_t seed) {
  static const nlohmann::json load = nlohmann::json::array(
      {{{"name", "LoadImage"}, {"keys", {"image", "label"}}, {"dtype", {"float32", ""}}},
       {{"name", "EnsureChannelFirst"}, {"keys", {"image", "label"}}}});
  static const nlohmann::json orient =
      nlohmann::json::array({{{"name", "Orientation"}, {"keys", {"image", "label"}}, {"axcodes", "RAS"}}});
  const data::DatasetItem& item = all.items.at(index);
  const std::string& image_file = item.files.at("image").first();
  const std::string& label_file = item.files.at("label").first();
  Sample s = data::compute_item(all, transforms::make_chain(load), index);
  CaseSummary c;
  c.image = image_file;
  c.label = label_file;
  c.axcodes = s.volume("image").axcodes();
  transforms::make_chain(orient).apply(s);
  const Volume& image = s.volume("image");
  const Volume& label = s.volume("label");
  // The label lies on the image's grid (nnU-Net's verify_dataset_integrity): LoadImage checks it.
  c.channels = image.data.size(0);
  for (int d = 0; d < 3; ++d) c.shape[d] = image.data.size(1 + d);
  at::Tensor l = label.data;
  c.label_channels = l.dim() == 4 ? l.size(0) : 1;
  if (l.is_floating_point()) {
    if (!at::isfinite(l).all().item<bool>() || l.ne(l.round()).any().item<bool>()) {
      throw FormatError(str("label ", label_file, ": values must be whole numbers (class indices), found fractions or "
                            "NaN/inf"));
    }
  }
  l = l.to(at::kLong);
  if (l.numel() > 0 && l.min().item<std::int64_t>() < 0) {
    throw FormatError(str("label ", label_file, ": values must be class indices >= 0, found ",
                          l.min().item<std::int64_t>()));
  }
  if (!at::isfinite(image.data).all().item<bool>()) {
    throw FormatError(str("image ", image_file, ": holds NaN or infinite values"));
  }
  if (c.label_channels > 1) {
    // A label of several channels (a mask per class or region, as a sigmoid run trains):
    // value k + 1 counts channel k's nonzero voxels, and the foreground is any channel's.
    c.label_voxels[0] = l.ne(0).any(0).logical_not().sum().item<std::int64_t>();
    for (std::int64_t k = 0; k < c.label_channels; ++k) c.label_voxels[k + 1] = l[k].ne(0).sum().item<std::int64_t>();
    l = l.ne(0).any(0).to(at::kLong);
  } else {
    const auto [values, inverse, counts] = at::_unique2(l.reshape({-1}), true, false, true);
    const at::Tensor v = values.contiguous(), n = counts.contiguous();
    for (std::int64_t i = 0; i < v.numel(); ++i)
      c.label_voxels[v.data_ptr<std::int64_t>()[i]] = n.data_ptr<std::int64_t>()[i];
  }
  c.crop = case_fingerprint(image.data, l, image.spacing(), samples, seed, image_file);
  return c;
}

}  // namespace

std::vector<std::int64_t> DatasetFingerprint::classes() const {
  std::set<std::int64_t> out{0};
  if (!label_names.empty()) {
    for (const auto& [v, name] : label_names) out.insert(v);
  } else {
    for (const auto& c : cases) {
      for (const auto& [v, n] : c.label_voxels) out.insert(v);
    }
  }
  return {out.begin(), out.end()};
}

std::vector<double> DatasetFingerprint::pooled_samples(std::size_t channel) const {
  std::vector<double> pooled;
  for (const auto& c : cases) {
    if (channel < c.crop.samples.size()) {
      pooled.insert(pooled.end(), c.crop.samples[channel].begin(), c.crop.samples[channel].end());
    }
  }
  return pooled;
}

std::size_t DatasetFingerprint::excluded() const {
  return static_cast<std::size_t>(std::count_if(notes.begin(), notes.end(), [](const CaseNote& n) { return n.excluded; }));
}

std::string dataset_list_path(const std::string& dataset) {
  if (dataset.empty()) throw ValueError("--dataset: expected a folder with dataset.json or a dataset list file");
  const os::FileInfo fi = os::exists(dataset) ? os::stat(dataset) : os::FileInfo{};
  if (fi.is_directory) {
    const std::string list = (dataset.back() == '/' ? dataset : dataset + "/") + "dataset.json";
    if (!os::exists(list)) throw FormatError(str(dataset, ": the folder has no dataset.json (the list of its cases)"));
    return list;
  }
  if (!fi.is_regular) throw FormatError(str(dataset, ": no such dataset folder or list file"));
  return dataset;
}

std::string fingerprint_cache_path(const std::string& list) {
  return os::parent_directory(list) + "/.medfast-fingerprint.cbor";
}

DatasetFingerprint dataset_fingerprint(const std::string& dataset, const FingerprintOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  DatasetFingerprint fp;
  fp.list = dataset_list_path(dataset);
  const data::Dataset all = data::load_dataset(fp.list, "training");
  fp.listed = all.items.size();
  if (all.items.empty()) throw FormatError(str(fp.list, ": the training section lists no cases"));
  if (!data::is_csv_list(fp.list)) {
    const nlohmann::json raw = parse_json_document(os::read_text_file(fp.list), fp.list);
    fp.channel_names = read_channel_names(raw, fp.list);
    fp.labels = data::list_labels(fp.list);
    fp.label_names = fp.labels.names;
  }

  // Cases without an image or label file are left out before anything is read.
  std::vector<std::size_t> readable;
  std::map<std::size_t, CaseNote> notes;  // by list index
  for (std::size_t i = 0; i < all.items.size(); ++i) {
    const auto& files = all.items[i].files;
    const std::string name = files.count("image") ? files.at("image").first() : str("training item ", i);
    if (!files.count("image") || !files.count("label")) {
      notes[i] = {name, str("the list gives it no '", files.count("image") ? "label" : "image", "' file"),
                  "left out of the plan and the run", true};
      continue;
    }
    readable.push_back(i);
  }

  const std::int64_t samples = std::max<std::int64_t>(
      1, (options.total_samples + static_cast<std::int64_t>(all.items.size()) - 1) / static_cast<std::int64_t>(all.items.size()));
  // Cases draw a power of two >= that: a later plan of a list with a few cases more or less
  // still finds enough in the cache.
  const std::int64_t drawn = next_power_of_two(samples);
  const std::string list_dir = os::parent_directory(fp.list);
  const std::string cache_file = fingerprint_cache_path(fp.list);
  const nlohmann::json cached = options.use_cache ? read_cache(cache_file) : nlohmann::json::object();
  nlohmann::json cache_out = nlohmann::json::object();

  struct Outcome {
    std::optional<CaseSummary> summary;
    std::string error;
    std::string key;
    nlohmann::json fresh;  ///< a case read now: its whole summary, for the cache
    bool from_cache = false;
  };
  std::vector<Outcome> outcomes(readable.size());
  std::mutex progress_mutex;
  std::size_t done = 0;
  {
    ThreadPool pool(std::max(1, std::min<int>(options.threads, static_cast<int>(readable.size()))));
    std::vector<std::future<void>> jobs;
    for (std::size_t k = 0; k < readable.size(); ++k) {
      jobs.push_back(pool.submit([&, k] {
        Outcome& o = outcomes[k];
        const data::DatasetItem& item = all.items[readable[k]];
        const std::uint64_t seed = options.seed ^ name_hash(relative_to(item.files.at("image").first(), list_dir));
        try {
          nlohmann::json id = {{"attrs", item.attrs}, {"seed", seed}};
          for (const char* key : {"image", "label"}) {
            // Every file of the key (an image's channel files): one changed file reads the case again.
            nlohmann::json ids = nlohmann::json::array();
            for (const auto& f : item.files.at(key)) {
              if (!os::exists(f)) throw FormatError(str("the ", key, " file ", f, " does not exist"));
              ids.push_back(data::file_identity(os::absolute_path(f)));
            }
            id[key] = ids.size() == 1 ? ids[0] : ids;
          }
          o.key = id.dump();
          if (cached.contains(o.key)) {
            try {
              o.summary = summary_from(cached[o.key], samples);
            } catch (const std::exception&) {
              o.summary.reset();  // a damaged entry: read the case again
            }
            o.from_cache = o.summary.has_value();
          }
          if (!o.summary) {
            CaseSummary whole = read_case(all, readable[k], drawn, seed);
            o.fresh = summary_json(whole);
            keep_samples(whole, samples);
            o.summary = std::move(whole);
          }
          o.summary->image = item.files.at("image").first();
          o.summary->label = item.files.at("label").first();
        } catch (const std::exception& e) {
          o.summary.reset();
          o.error = e.what();
        }
        if (options.progress) {
          std::lock_guard<std::mutex> lock(progress_mutex);
          options.progress(++done, readable.size());
        }
      }));
    }
    for (auto& j : jobs) j.get();
  }

  // Checks needing every case: channels, label values, spacing, classes, foreground.
  std::map<std::int64_t, int> channel_votes;
  for (const auto& o : outcomes) {
    if (o.summary) ++channel_votes[o.summary->channels];
  }
  std::int64_t channels = static_cast<std::int64_t>(fp.channel_names.size());
  if (channels == 0 && !channel_votes.empty()) {
    channels = std::max_element(channel_votes.begin(), channel_votes.end(), [](const auto& a, const auto& b) {
                 return a.second < b.second;
               })->first;
  }
  // Label channels: most cases' (1: class indices; more: a mask per channel).
  std::map<std::int64_t, int> label_channel_votes;
  for (const auto& o : outcomes) {
    if (o.summary) ++label_channel_votes[o.summary->label_channels];
  }
  if (!label_channel_votes.empty()) {
    fp.label_channels =
        std::max_element(label_channel_votes.begin(), label_channel_votes.end(), [](const auto& a, const auto& b) {
          return a.second < b.second;
        })->first;
  }
  std::vector<std::size_t> kept;  // into outcomes
  // A case listed twice (image and label) is kept once: a copy would train twice as often,
  // and the run's validation split (the list's last cases) could validate a case it trains on.
  std::map<std::string, std::size_t> first_listed;  // absolute image and label paths -> list index
  for (std::size_t k = 0; k < outcomes.size(); ++k) {
    const Outcome& o = outcomes[k];
    const std::size_t i = readable[k];
    const std::string& file = all.items[i].files.at("image").first();
    if (!o.summary) {
      notes[i] = {file, str("cannot be used: ", o.error), "left out of the plan and the run", true};
      continue;
    }
    std::string entry;
    for (const char* key : {"image", "label"}) {
      for (const auto& f : all.items[i].files.at(key)) entry += os::absolute_path(f) + '\n';
    }
    if (const auto [first, fresh] = first_listed.emplace(entry, i); !fresh) {
      notes[i] = {file, str("is listed twice (training items ", first->second, " and ", i, ")"),
                  "this copy left out of the plan and the run (a duplicate trains twice as often, and a validation "
                  "split could put one copy on each side)",
                  true};
      continue;
    }
    // A cached entry is kept whole (its samples may be more than this plan takes).
    if (!o.key.empty()) cache_out[o.key] = o.from_cache ? cached[o.key] : o.fresh;
    if (!o.from_cache) ++fp.read;
    if (o.summary->channels != channels) {
      const std::string expected =
          fp.channel_names.empty() ? str("most cases have ", channels)
                                   : str("the list names ", channels, " (modality / channel_names)");
      notes[i] = {file, str("has ", o.summary->channels, " channel(s); ", expected),
                  "left out of the plan and the run (every case needs the same channels in the same order)", true};
      continue;
    }
    if (o.summary->label_channels != fp.label_channels) {
      notes[i] = {o.summary->label,
                  str("the label has ", o.summary->label_channels, " channel(s); most cases' have ", fp.label_channels),
                  "left out of the plan and the run (every label needs the same channels)", true};
      continue;
    }
    if (!fp.label_names.empty() && o.summary->label_channels == 1) {
      std::vector<std::int64_t> unknown;
      for (const auto& [v, n] : o.summary->label_voxels) {
        if (!fp.label_names.count(v)) unknown.push_back(v);
      }
      if (!unknown.empty()) {
        std::vector<std::int64_t> named;
        for (const auto& [v, name] : fp.label_names) named.push_back(v);
        notes[i] = {o.summary->label,
                    str("label values ", join_values(unknown), " are not among the list's labels (", join_values(named),
                        ")"),
                    "left out of the plan and the run (add them to 'labels' to train them)", true};
        continue;
      }
    }
    kept.push_back(k);
  }
  if (kept.empty()) {
    std::string why;
    for (const auto& [i, n] : notes) why += "\n  " + n.text();
    throw FormatError(str(fp.list, ": no case can be planned with:", why));
  }
  std::array<double, 3> median_spacing{};
  for (int d = 0; d < 3; ++d) {
    std::vector<double> v;
    for (const auto k : kept) v.push_back(outcomes[k].summary->crop.spacing[d]);
    median_spacing[d] = median_of(v);
  }
  std::map<std::int64_t, int> cases_with_class;
  for (const auto k : kept) {
    for (const auto& [v, n] : outcomes[k].summary->label_voxels) ++cases_with_class[v];
  }
  std::int64_t foreground_cases = 0;
  for (const auto k : kept) {
    const CaseSummary& c = *outcomes[k].summary;
    const std::size_t i = readable[k];
    std::vector<std::string> problems;
    for (int d = 0; d < 3; ++d) {
      const double r = c.crop.spacing[d] / median_spacing[d];
      if (r >= 10 || r <= 0.1) {
        problems.push_back(str("spacing ", c.crop.spacing[d], " mm along axis ", "xyz"[d], " is ",
                               r >= 10 ? r : 1 / r, "x ", r >= 10 ? "coarser" : "finer", " than the median (",
                               median_spacing[d], " mm): check its header"));
      }
    }
    if (c.crop.foreground_voxels == 0) {
      problems.push_back("its label has no foreground: it adds no intensity samples, and its crops are background only");
    } else {
      ++foreground_cases;
    }
    if (fp.label_names.empty() && kept.size() >= 3) {
      for (const auto& [v, n] : c.label_voxels) {
        if (v != 0 && cases_with_class[v] == 1) {
          problems.push_back(str("label value ", v, " appears in no other case (the list names no labels)"));
        }
      }
    }
    if (!problems.empty()) {
      std::string p;
      for (const auto& s : problems) p += (p.empty() ? "" : "; ") + s;
      notes[i] = {c.image, p, "kept (resampled to the target spacing like the others)", false};
    }
    fp.items.push_back(all.items[i]);
    fp.cases.push_back(c);
    if (outcomes[k].from_cache) ++fp.from_cache;
  }
  if (foreground_cases == 0) {
    std::string which;
    for (const auto& c : fp.cases) which += "\n  " + c.label;
    throw FormatError(str(fp.list, ": no label has any foreground (every voxel 0), nothing to train:", which));
  }
  if (fp.channel_names.empty()) {
    fp.notes.push_back({fp.list, "names no channel ('modality' or 'channel_names', e.g. {\"0\": \"CT\"})",
                        "each channel is z-scored per image (nnU-Net's rule for unnamed and MR channels); name CT "
                        "channels to have them clipped and scaled by the dataset's foreground statistics",
                        false});
    fp.channel_names.assign(static_cast<std::size_t>(channels), "");
  }
  for (const auto& [v, name] : fp.label_names) {
    if (!cases_with_class.count(v)) {
      fp.notes.push_back({fp.list, str("label ", v, " ('", name, "') appears in no kept case"),
                          "the network still has an output for it", false});
    }
  }
  for (auto& [i, n] : notes) fp.notes.push_back(std::move(n));
  if (options.use_cache) {
    // Other lists' cases in this folder stay; earlier versions of this list's files go.
    std::set<std::string> ours;
    for (const auto& item : all.items) {
      if (item.files.count("image")) ours.insert(os::absolute_path(item.files.at("image").first()));
    }
    bool changed = fp.read > 0;
    for (auto it = cached.begin(); it != cached.end(); ++it) {
      if (cache_out.contains(it.key())) continue;
      std::string image;
      try {
        const nlohmann::json id = nlohmann::json::parse(it.key()).at("image");
        image = (id.is_array() ? id.at(0) : id).at("path").get<std::string>();
      } catch (const std::exception&) {
        changed = true;  // not a key this version writes: dropped
        continue;
      }
      if (ours.count(image) || cache_out.size() >= kCacheMaxCases) {
        changed = true;
      } else {
        cache_out[it.key()] = it.value();
      }
    }
    if (!changed || write_cache(cache_file, cache_out)) fp.cache_path = cache_file;
  }
  fp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return fp;
}

nlohmann::json fingerprint_json(const DatasetFingerprint& fp) {
  nlohmann::json cases = nlohmann::json::array();
  std::vector<double> sizes[3], spacings[3];
  std::map<std::int64_t, std::int64_t> voxels;
  std::int64_t total = 0;
  for (const auto& c : fp.cases) {
    cases.push_back({{"image", c.image},
                     {"label", c.label},
                     {"orientation", c.axcodes},
                     {"shape", c.shape},
                     {"spacing", c.crop.spacing},
                     {"shape_after_crop", c.crop.shape_after_crop},
                     {"relative_size_after_crop", c.crop.relative_size},
                     {"foreground_voxels", c.crop.foreground_voxels}});
    for (int d = 0; d < 3; ++d) {
      sizes[d].push_back(static_cast<double>(c.crop.shape_after_crop[d]));
      spacings[d].push_back(c.crop.spacing[d]);
    }
    for (const auto& [v, n] : c.label_voxels) voxels[v] += n, total += n;
  }
  nlohmann::json shares = nlohmann::json::object();
  for (const auto& [v, n] : voxels) shares[std::to_string(v)] = static_cast<double>(n) / static_cast<double>(total);
  nlohmann::json channels = nlohmann::json::array();
  for (std::size_t ch = 0; ch < fp.channel_names.size(); ++ch) {
    const std::vector<double> pooled = fp.pooled_samples(ch);
    nlohmann::json j = {{"name", fp.channel_names[ch]}, {"samples", pooled.size()}};
    if (!pooled.empty()) {
      const IntensityStats s = intensity_stats(pooled);
      j["foreground"] = {{"mean", s.mean},   {"std", s.std},          {"median", s.median}, {"min", s.min},
                         {"max", s.max},     {"percentile_00_5", s.p00_5}, {"percentile_99_5", s.p99_5}};
    }
    channels.push_back(j);
  }
  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [v, name] : fp.label_names) labels[std::to_string(v)] = name;
  nlohmann::json notes = nlohmann::json::array();
  for (const auto& n : fp.notes) {
    notes.push_back({{"file", n.file}, {"problem", n.problem}, {"action", n.action}, {"excluded", n.excluded}});
  }
  return {{"list", fp.list},
          {"cases_listed", fp.listed},
          {"cases_kept", fp.cases.size()},
          {"cases_read", fp.read},
          {"cases_from_cache", fp.from_cache},
          {"cache", fp.cache_path},
          {"seconds", fp.seconds},
          {"median_shape_after_crop", {median_of(sizes[0]), median_of(sizes[1]), median_of(sizes[2])}},
          {"median_spacing", {median_of(spacings[0]), median_of(spacings[1]), median_of(spacings[2])}},
          {"labels", labels},
          {"classes", fp.classes()},
          {"label_channels", fp.label_channels},
          {"regions", fp.labels.has_regions() ? nlohmann::json{{"names", fp.labels.region_names},
                                                               {"regions", fp.labels.regions},
                                                               {"regions_class_order", fp.labels.regions_class_order}}
                                              : nlohmann::json(nullptr)},
          {"label_voxel_shares", shares},
          {"channels", channels},
          {"notes", notes},
          {"cases", cases}};
}

}  // namespace medfast::plan
