// A dataset's check before training: lists, files, headers, label values.
#include "medfast/data/check.hpp"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include "medfast/core/error.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"

namespace medfast::data {

namespace {

constexpr double kGridTolerance = 1e-3;  ///< mm: LoadImage's and plan's tolerance for one grid

/// "40 x 40 x 12"
std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s;
  for (const auto d : shape) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
}

std::string join(const std::vector<std::int64_t>& values, std::size_t most = 12) {
  std::string s;
  for (std::size_t i = 0; i < values.size() && i < most; ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  if (values.size() > most) s += str(", ... (", values.size(), " values)");
  return s;
}

std::string spacing_text(const std::array<double, 3>& s) {
  return str(s[0], " x ", s[1], " x ", s[2], " mm");
}

template <typename T>
void count_values(const T* p, std::int64_t n, LabelValues& out) {
  // Small whole values (the usual labels) are counted in an array, others in the map.
  std::array<std::int64_t, 256> small{};
  for (std::int64_t i = 0; i < n; ++i) {
    const T x = p[i];
    std::int64_t k;
    if constexpr (std::is_floating_point_v<T>) {
      // NaN and infinities fail the comparison too.
      if (!(std::abs(x) < static_cast<T>(9.0e18)) || x != std::trunc(x)) {
        if (out.not_whole++ == 0) out.first_not_whole = static_cast<double>(x);
        continue;
      }
      k = static_cast<std::int64_t>(x);
    } else {
      k = static_cast<std::int64_t>(x);
    }
    if (k >= 0 && k < 256) {
      ++small[static_cast<std::size_t>(k)];
    } else {
      ++out.voxels[k];
    }
  }
  for (std::size_t k = 0; k < small.size(); ++k) {
    if (small[k] > 0) out.voxels[static_cast<std::int64_t>(k)] += small[k];
  }
}

/// The text of a label's values that are not whole.
std::string not_whole_text(const LabelValues& v) {
  return str("holds values that are not whole numbers (", v.not_whole, " voxels, e.g. ", v.first_not_whole,
             "): a label holds class indices (a whole-valued float label is fine)");
}

std::string join_files(const std::vector<std::string>& files, std::size_t most = 5) {
  std::string s;
  for (std::size_t i = 0; i < files.size() && i < most; ++i) s += "\n  " + files[i];
  if (files.size() > most) s += str("\n  ... and ", files.size() - most, " more");
  return s;
}

/// A file's geometry: the shape read_image's tensor has (file order: X, Y, Z[, C]) and its affine.
struct Geometry {
  std::vector<std::int64_t> shape;
  Affine affine;
};

struct Entry {
  const char* section;  ///< "training" or "validation"
  std::size_t index;    ///< in its section
  const DatasetItem* item;
  std::string image, label;  ///< "" when the item has none (the first of several)
  FilePaths images;          ///< every image file (channel files stacked in order)
  bool readable = false;     ///< both files named and present
};

/// What one item's reading found.
struct ItemResult {
  std::vector<Finding> findings;
  std::optional<std::int64_t> channels;  ///< the image's, where its header was read
  std::optional<LabelValues> values;     ///< the label's, where its voxels were read
  std::size_t headers = 0;
  std::uint64_t label_bytes = 0;
};

Finding error(const char* check, const std::string& file, std::string message) {
  return {Finding::Severity::error, check, file, std::move(message)};
}
Finding warning(const char* check, const std::string& file, std::string message) {
  return {Finding::Severity::warning, check, file, std::move(message)};
}

/// The image's dimensions: 3D, or 3D with channels last; 2-D and thin images named.
void check_dimensions(const std::string& file, const std::vector<std::int64_t>& shape, const char* what,
                      ItemResult& r) {
  if (shape.size() < 3) {
    r.findings.push_back(error(
        "dimensions", file,
        str("medfast trains 3D images: this ", what, " is ", shape.size(), "-D (shape ", shape_text(shape), ")")));
    return;
  }
  if (shape.size() > 4) {
    r.findings.push_back(error("dimensions", file,
                               str("has ", shape.size(), " dimensions (shape ", shape_text(shape),
                                   "); medfast reads 3D ", what, "s, with channels as a 4th axis")));
    return;
  }
  for (int d = 0; d < 3; ++d) {
    if (shape[static_cast<std::size_t>(d)] == 1) {
      r.findings.push_back(warning("dimensions", file,
                                   str("is 1 voxel thick along axis ", "xyz"[d], " (shape ", shape_text(shape),
                                       "): a slice, not a volume; medfast trains 3D images (a crop thicker than "
                                       "the image fails unless the chain pads it)")));
      return;
    }
  }
}

void check_grid(const Entry& e, const Geometry& image, const Geometry& label, ItemResult& r) {
  if (image.shape.size() < 3 || label.shape.size() < 3) return;
  const std::vector<std::int64_t> a(image.shape.begin(), image.shape.begin() + 3),
      b(label.shape.begin(), label.shape.begin() + 3);
  if (a != b) {
    r.findings.push_back(error("grid", e.label,
                               str("shape ", shape_text(b), " is not its image's ", shape_text(a), " (", e.image,
                                   "): a label must lie on its image's grid")));
    return;
  }
  const double diff = image.affine.max_abs_diff(label.affine);
  if (diff > kGridTolerance) {
    const auto sa = image.affine.spacing(), sb = label.affine.spacing();
    const bool spacing_differs = std::abs(sa[0] - sb[0]) > kGridTolerance || std::abs(sa[1] - sb[1]) > kGridTolerance ||
                                 std::abs(sa[2] - sb[2]) > kGridTolerance;
    r.findings.push_back(
        error("grid", e.label,
              str("its grid is not its image's (", e.image,
                  "): ", spacing_differs ? str("spacing ", spacing_text(sb), " vs ", spacing_text(sa), "; ") : "",
                  "the affines differ by up to ", diff, " mm (allowed ", kGridTolerance, ")")));
  }
}

Geometry header_geometry(const std::string& path) {
  VolumeHeader h = read_nifti_header(path);
  return {std::move(h.shape), h.affine};
}

Geometry volume_geometry(const Volume& v) {
  return {v.data.sizes().vec(), v.affine};
}

/// Reads what the options ask of one item: headers (NIfTI) or volumes (DICOM, and labels
/// whose values are checked).
ItemResult check_item(const Entry& e, const DatasetCheckOptions& o) {
  ItemResult r;
  const bool dicom = is_dicom(e.image) || is_dicom(e.label);
  if (dicom && !o.read_labels) return r;  // a series has no cheap header: LoadImage checks its grid
  std::optional<Geometry> image, label;
  std::optional<Volume> image_volume;
  try {
    if (dicom) {
      image_volume = read_image(e.image);
      image = volume_geometry(*image_volume);
    } else {
      image = header_geometry(e.image);
    }
    ++r.headers;
  } catch (const std::exception& ex) {
    r.findings.push_back(error("unreadable", e.image, str("cannot be read: ", message_of(ex))));
  }
  // Channel files after the first: each on the first's grid, their channels added up.
  std::int64_t more_channels = 0;
  for (std::size_t c = 1; image && !dicom && c < e.images.size(); ++c) {
    const std::string& file = e.images[c];
    try {
      const Geometry g = header_geometry(file);
      ++r.headers;
      check_dimensions(file, g.shape, "image", r);
      if (g.shape.size() < 3) continue;
      more_channels += g.shape.size() == 4 ? g.shape[3] : 1;
      if (image->shape.size() < 3) continue;
      if (!std::equal(g.shape.begin(), g.shape.begin() + 3, image->shape.begin())) {
        r.findings.push_back(
            error("grid", file,
                  str("channel ", c, "'s shape ", shape_text({g.shape.begin(), g.shape.begin() + 3}),
                      " is not channel 0's ", shape_text({image->shape.begin(), image->shape.begin() + 3}), " (",
                      e.image, "): an image's channel files must share one grid")));
      } else if (const double diff = image->affine.max_abs_diff(g.affine); diff > kGridTolerance) {
        r.findings.push_back(error("grid", file,
                                   str("channel ", c, "'s affine is not channel 0's (", e.image, "): spacing ",
                                       spacing_text(g.affine.spacing()), " vs ", spacing_text(image->affine.spacing()),
                                       ", orientation ", axcodes(g.affine), " vs ", axcodes(image->affine),
                                       "; they differ by up to ", diff, " mm (allowed ", kGridTolerance, ")")));
      }
    } catch (const std::exception& ex) {
      r.findings.push_back(error("unreadable", file, str("cannot be read: ", message_of(ex))));
    }
  }
  if (image) {
    check_dimensions(e.image, image->shape, "image", r);
    if (image->shape.size() >= 3 && image->shape.size() <= 4)
      r.channels = (image->shape.size() == 4 ? image->shape[3] : 1) + more_channels;
  }
  std::optional<Volume> label_volume;
  try {
    if (!o.read_labels) {
      label = header_geometry(e.label);
    } else if (is_dicom(e.label) && dicom::is_seg_file(e.label)) {
      if (!image_volume) throw FormatError("a DICOM SEG is placed on its image's series, which cannot be read");
      label_volume = read_seg_volume(e.label, *image_volume);
    } else {
      label_volume = read_image(e.label);
    }
    if (label_volume) label = volume_geometry(*label_volume);
    ++r.headers;
  } catch (const std::exception& ex) {
    r.findings.push_back(error("unreadable", e.label, str("cannot be read: ", message_of(ex))));
  }
  if (label && label->shape.size() < 3) {
    r.findings.push_back(error("dimensions", e.label,
                               str("medfast trains 3D images: this label is ", label->shape.size(), "-D (shape ",
                                   shape_text(label->shape), ")")));
  } else if (image && label) {
    check_grid(e, *image, *label, r);
  }
  if (label_volume) {
    r.label_bytes = label_volume->bytes_in_memory();
    const LabelValues v = label_values(label_volume->data);
    const bool class_indices = label_volume->data.dim() <= 3 || label_volume->data.size(3) == 1;
    if (!v.whole()) {
      r.findings.push_back(error("label_values", e.label, not_whole_text(v)));
    } else if (const std::string p = class_indices ? o.labels.problem(v) : LabelRule{}.problem(v); !p.empty()) {
      r.findings.push_back(error("label_values", e.label, p));
    }
    r.values = v;
  }
  return r;
}

}  // namespace

std::int64_t LabelValues::foreground() const {
  std::int64_t n = 0;
  for (const auto& [v, count] : voxels) n += v != 0 ? count : 0;
  return n + not_whole;
}

LabelValues label_values(const at::Tensor& label) {
  LabelValues out;
  if (!label.defined() || label.numel() == 0) return out;
  const at::Tensor t = label.is_cpu() ? label.contiguous() : label.cpu().contiguous();
  if (t.scalar_type() == at::kBool) {
    const std::int64_t ones = t.sum().item<std::int64_t>();
    if (t.numel() > ones) out.voxels[0] = t.numel() - ones;
    if (ones > 0) out.voxels[1] = ones;
    return out;
  }
  const at::Tensor u = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t;
  AT_DISPATCH_ALL_TYPES(u.scalar_type(), "label_values", [&] { count_values(u.data_ptr<scalar_t>(), u.numel(), out); });
  return out;
}

LabelRule LabelRule::classes(std::int64_t classes, const std::string& source) {
  LabelRule r;
  const std::int64_t n = std::max<std::int64_t>(classes, 2);  // one output: a mask of 0 and 1
  for (std::int64_t v = 0; v < n; ++v) r.allowed.push_back(v);
  r.source = str("the model has ", classes, " output", classes == 1 ? "" : "s", " (", source, "): values 0..", n - 1);
  return r;
}

std::string LabelRule::problem(const LabelValues& values) const {
  std::vector<std::int64_t> bad;
  for (const auto& [v, n] : values.voxels) {
    if (v < 0 || (!allowed.empty() && !std::binary_search(allowed.begin(), allowed.end(), v))) bad.push_back(v);
  }
  if (bad.empty()) return "";
  std::int64_t voxels = 0;
  for (const auto v : bad) voxels += values.voxels.at(v);
  const std::string which = str("holds label value", bad.size() == 1 ? " " : "s ", join(bad), " (", voxels, " voxels)");
  if (allowed.empty()) return str(which, "; labels are class indices, 0 or more");
  return str(which, "; ", source);
}

nlohmann::json Finding::to_json() const {
  return {{"severity", error() ? "error" : "warning"}, {"check", check}, {"file", file}, {"message", message}};
}

std::size_t DatasetCheckReport::errors() const {
  return static_cast<std::size_t>(
      std::count_if(findings.begin(), findings.end(), [](const Finding& f) { return f.error(); }));
}

std::size_t DatasetCheckReport::warnings() const {
  return findings.size() - errors();
}

std::string DatasetCheckReport::error_text() const {
  std::string s = str(list, ": the dataset check found ", errors(), " error", errors() == 1 ? "" : "s",
                      " (medfast data check lists them with the warnings):");
  for (const auto& f : findings) {
    if (f.error()) s += "\n  " + f.text();
  }
  return s;
}

nlohmann::json DatasetCheckReport::to_json() const {
  nlohmann::json fs = nlohmann::json::array();
  for (const auto& f : findings) fs.push_back(f.to_json());
  nlohmann::json voxels = nlohmann::json::object();
  for (const auto& [v, n] : label_voxels) voxels[std::to_string(v)] = n;
  return {{"list", list},
          {"training", training},
          {"validation", validation},
          {"headers_read", headers},
          {"labels_read", labels_read},
          {"label_bytes", label_bytes},
          {"label_voxels", voxels},
          {"seconds", seconds},
          {"errors", errors()},
          {"warnings", warnings()},
          {"findings", fs}};
}

DatasetCheckReport check_dataset(const Dataset& training, const Dataset& validation, const DatasetCheckOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  DatasetCheckReport report;
  report.list = training.source;
  report.training = training.items.size();
  report.validation = validation.items.size();
  std::vector<Entry> entries;
  for (const auto* section : {&training, &validation}) {
    const char* name = section == &training ? "training" : "validation";
    for (std::size_t i = 0; i < section->items.size(); ++i) {
      const DatasetItem& item = section->items[i];
      Entry e{name, i, &item, "", "", {}, false};
      if (item.files.count(o.image_key)) {
        e.images = item.files.at(o.image_key);
        e.image = e.images.first();
      }
      if (item.files.count(o.label_key)) e.label = item.files.at(o.label_key).first();
      entries.push_back(std::move(e));
    }
  }
  std::vector<std::vector<Finding>> per_entry(entries.size());

  // Files: named and there.
  for (std::size_t k = 0; k < entries.size(); ++k) {
    Entry& e = entries[k];
    const std::string& source = e.section[0] == 't' ? training.source : validation.source;
    bool ok = true;
    std::vector<std::pair<std::string, std::string>> files{{o.image_key, e.image}, {o.label_key, e.label}};
    for (std::size_t c = 1; c < e.images.size(); ++c)
      files.emplace_back(str(o.image_key, " (channel ", c, ")"), e.images[c]);
    for (const auto& [key, path] : files) {
      if (path.empty()) {
        per_entry[k].push_back(error("files", source,
                                     str(e.section, " item ", e.index, " (", e.image.empty() ? e.label : e.image,
                                         ") names no '", key, "' file")));
        ok = false;
      } else if (!os::exists(path)) {
        per_entry[k].push_back(
            error("files", path, str("does not exist (the ", key, " of ", e.section, " item ", e.index, ")")));
        ok = false;
      }
    }
    e.readable = ok;
  }

  // Entries listed twice (the same image and label), and validation cases that also train
  // (the same image, whatever its label: the network has seen it).
  std::map<std::string, std::size_t> first_training, first_validation, training_images;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    if (e.image.empty()) continue;
    const std::string id = os::absolute_path(e.image);
    const bool is_training = e.section[0] == 't';
    if (is_training) training_images.emplace(id, k);
    auto& seen = is_training ? first_training : first_validation;
    const auto [it, fresh] = seen.emplace(id + '\n' + (e.label.empty() ? "" : os::absolute_path(e.label)), k);
    if (!fresh) {
      const Entry& first = entries[it->second];
      per_entry[k].push_back(error(
          "duplicate", e.image,
          str("is listed twice among the ", e.section, " items (items ", first.index, " and ", e.index,
              "): a duplicate is trained on twice as often",
              is_training ? ", and a validation split may put one copy on each side" : "", "; list each case once")));
      continue;
    }
    if (!is_training && training_images.count(id)) {
      per_entry[k].push_back(error(
          "validation_in_training", e.image,
          str("is a validation case and also a training case (training item ", entries[training_images.at(id)].index,
              "): its Dice would score a case the network trained on; keep it on one side")));
    }
  }

  // Headers and label voxels, on threads.
  std::vector<std::size_t> readable;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    if (entries[k].readable) readable.push_back(k);
  }
  std::vector<ItemResult> results(entries.size());
  std::mutex progress_mutex;
  std::size_t done = 0;
  parallel_for(readable.size(), o.threads, [&](std::size_t j) {
    const std::size_t k = readable[j];
    results[k] = check_item(entries[k], o);
    if (o.progress) {
      std::lock_guard<std::mutex> lock(progress_mutex);
      o.progress(++done, readable.size());
    }
  });

  // Channels: the options' count, else most cases'.
  std::int64_t channels = o.channels;
  std::map<std::int64_t, int> votes;
  for (const auto& r : results) {
    if (r.channels) ++votes[*r.channels];
  }
  if (channels == 0 && !votes.empty()) {
    channels = std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) {
                 return a.second < b.second;
               })->first;
  }
  // Foreground, per section.
  std::vector<std::string> empty_training, empty_validation;
  std::size_t read_training = 0, read_validation = 0;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    ItemResult& r = results[k];
    const Entry& e = entries[k];
    report.headers += r.headers;
    for (auto& f : r.findings) per_entry[k].push_back(std::move(f));
    if (r.channels && *r.channels != channels) {
      per_entry[k].push_back(error("channels", e.image,
                                   str("has ", *r.channels, " channel(s); ",
                                       o.channels > 0 ? str("the model takes ", channels, " (model.in_channels)")
                                                      : str("most cases have ", channels),
                                       ": every case needs the same channels in the same order")));
    }
    if (!r.values) continue;
    ++report.labels_read;
    report.label_bytes += r.label_bytes;
    for (const auto& [v, n] : r.values->voxels) report.label_voxels[v] += n;
    const bool is_training = e.section[0] == 't';
    ++(is_training ? read_training : read_validation);
    if (r.values->foreground() == 0) (is_training ? empty_training : empty_validation).push_back(e.label);
  }
  std::vector<Finding> dataset_wide;
  const auto foreground = [&](std::vector<std::string>& empty, std::size_t read, std::size_t listed, bool is_training) {
    if (read == 0) return;
    if (empty.size() == read && read == listed) {
      if (is_training) {
        dataset_wide.push_back(error("foreground", report.list,
                                     str("no training label has any foreground (every voxel 0 in all ", read,
                                         "): nothing to train", join_files(empty))));
      } else {
        dataset_wide.push_back(warning("foreground", report.list,
                                       str("no validation label has any foreground (every voxel 0 in all ", read,
                                           "): every class's Dice is NaN (MONAI's DiceMetric leaves a case out where "
                                           "its ground truth is empty), so no best.ckpt would be written",
                                           join_files(empty))));
      }
      return;
    }
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const Entry& e = entries[k];
      if ((e.section[0] == 't') != is_training || !results[k].values || results[k].values->foreground() > 0) continue;
      per_entry[k].push_back(warning("foreground", e.label,
                                     is_training
                                         ? "has no foreground (every voxel 0): it adds only background crops"
                                         : "has no foreground (every voxel 0): its Dice is NaN for every class "
                                           "and it is left out of the mean (MONAI's DiceMetric, ignore_empty)"));
    }
  };
  foreground(empty_training, read_training, training.items.size(), true);
  foreground(empty_validation, read_validation, validation.items.size(), false);
  for (auto& fs : per_entry) {
    for (auto& f : fs) report.findings.push_back(std::move(f));
  }
  for (auto& f : dataset_wide) report.findings.push_back(std::move(f));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

LabelCheck::LabelCheck(std::string label_key, LabelRule rule) : key_(std::move(label_key)), rule_(std::move(rule)) {}

void LabelCheck::operator()(const Sample& s) {
  if (!s.has(key_)) return;
  const at::Tensor& data = s.volume(key_).data;
  const std::string file = s.meta.contains(key_) && s.meta[key_].is_string() ? s.meta[key_].get<std::string>()
                                                                             : str("the '", key_, "' volume");
  const LabelValues v = label_values(data);
  if (!v.whole()) {
    throw FormatError(str(file, ": ", not_whole_text(v),
                          "; seen after data.deterministic: the file holds them, or a step interpolates the label "
                          "(give it mode nearest)"));
  }
  const bool class_indices = data.dim() < 4 || data.size(0) == 1;  // channel first: one channel of indices
  if (const std::string p = class_indices ? rule_.problem(v) : LabelRule{}.problem(v); !p.empty()) {
    throw FormatError(str(file, ": ", p));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (checked_.insert(file).second && v.foreground() == 0) empty_.push_back(file);
}

std::size_t LabelCheck::checked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return checked_.size();
}

std::vector<std::string> LabelCheck::without_foreground() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return empty_;
}

}  // namespace medfast::data
