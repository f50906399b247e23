#include "medfast/train/inference.hpp"
#include "medfast/core/trace.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"

namespace medfast::train {

namespace {

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Window starts along one axis, MONAI's dense_patch_slices: 0, i, 2i, ... up to the first
// window that reaches the end of the axis, that one pulled back to end at the border.
std::vector<std::int64_t> axis_starts(std::int64_t size, std::int64_t roi, std::int64_t interval) {
  std::vector<std::int64_t> starts;
  for (std::int64_t k = 0;; ++k) {
    const std::int64_t s = k * interval;
    starts.push_back(std::min(s, size - roi));
    if (s + roi >= size) return starts;
  }
}

// F.pad(mode=...) for the modes MONAI's PytorchPadMode offers (less circular); `pad` is in
// F.pad's order, last axis first.
at::Tensor pad_input(const at::Tensor& x, const std::vector<std::int64_t>& pad, PadMode mode, double cval) {
  if (mode == PadMode::constant) return at::constant_pad_nd(x, pad, cval);
  const std::int64_t spatial = x.dim() - 2;
  if (mode == PadMode::reflect) {
    for (std::int64_t d = 0; d < spatial; ++d) {
      const std::int64_t size = x.size(2 + d), before = pad[2 * (spatial - 1 - d)],
                         after = pad[2 * (spatial - 1 - d) + 1];
      if (before >= size || after >= size) {
        throw ValueError(str("sliding window: padding_mode reflect pads spatial axis ", d, " of size ", size, " by ",
                             before, " and ", after, "; reflection needs pads smaller than the size"));
      }
    }
    if (spatial == 1) return at::reflection_pad1d(x, pad);
    if (spatial == 2) return at::reflection_pad2d(x, pad);
    if (spatial == 3) return at::reflection_pad3d(x, pad);
  } else {
    if (spatial == 1) return at::replication_pad1d(x, pad);
    if (spatial == 2) return at::replication_pad2d(x, pad);
    if (spatial == 3) return at::replication_pad3d(x, pad);
  }
  throw ValueError(
      str("sliding window: padding_mode ", name_of(mode), " supports 1 to 3 spatial axes, the input has ", spatial));
}

// x narrowed to the window starting at `start` (spatial axes only).
at::Tensor window_of(at::Tensor x, const std::vector<std::int64_t>& start, const std::vector<std::int64_t>& roi,
                     std::int64_t first_spatial) {
  for (std::size_t d = 0; d < roi.size(); ++d)
    x = x.narrow(first_spatial + static_cast<std::int64_t>(d), start[d], roi[d]);
  return x;
}

}  // namespace

void SlidingWindowOptions::validate() const {
  if (roi_size.empty()) throw ValueError("sliding window: argument roi_size is empty");
  double voxels = 1;  // entries < 1 take the input's size (MONAI): unknown here
  for (const std::int64_t n : roi_size) voxels *= static_cast<double>(std::max<std::int64_t>(n, 1));
  if (voxels > 2147483648.0) {  // 1290^3: larger than any volume a window is for
    throw ValueError(str("sliding window: argument roi_size ", shape_string(roi_size), " is ", voxels,
                         " voxels a window, more than 2^31"));
  }
  if (sw_batch_size < 1)
    throw ValueError(str("sliding window: argument sw_batch_size ", sw_batch_size, " must be >= 1"));
  if (!(overlap >= 0 && overlap < 1))
    throw ValueError(str("sliding window: argument overlap ", overlap, " is outside [0, 1)"));
  if (!(sigma_scale > 0 && std::isfinite(sigma_scale))) {
    throw ValueError(str("sliding window: argument sigma_scale ", sigma_scale, " must be > 0"));
  }
  if (!std::isfinite(cval)) throw ValueError(str("sliding window: argument cval ", cval, " is not finite"));
  if (!device.empty()) {
    try {
      const at::Device parsed(device);
      (void)parsed;
    } catch (const std::exception&) {
      throw ValueError(str("sliding window: argument device '", device, "' is not cpu or cuda[:N]"));
    }
  }
}

SlidingWindowOptions SlidingWindowOptions::from_json(const nlohmann::json& j, const std::string& where) {
  SlidingWindowOptions o;
  ConfigReader k(j, where);
  read_fields(k, o);  // roi_size: one whole number stands for every axis, as in MONAI
  if (k.has("roi_size") && o.roi_size.empty()) k.fail("roi_size", "expected a list of whole numbers or one whole number");
  k.finish(o);
  return o;
}

std::int64_t tta_forwards(Tta tta, std::int64_t spatial) {
  return tta == Tta::flips ? std::int64_t{1} << spatial : 1;
}

Predictor with_tta(Predictor predictor, Tta tta) {
  if (tta == Tta::none) return predictor;
  return [predictor = std::move(predictor)](const at::Tensor& x) {
    const std::int64_t n = x.size(0), spatial = x.dim() - 2, mirrors = std::int64_t{1} << spatial;
    // Mirror m flips spatial axis d where bit d of m is set; `first` is axis 0's index.
    const auto axes_of = [&](std::int64_t m, std::int64_t first) {
      std::vector<std::int64_t> axes;
      for (std::int64_t d = 0; d < spatial; ++d) {
        if (m >> d & 1) axes.push_back(first + d);
      }
      return axes;
    };
    const auto mirrored = [&](const at::Tensor& t, std::int64_t m, std::int64_t first) {
      return m == 0 ? t : t.flip(axes_of(m, first));
    };
    // Copy k of the n * mirrors inputs is window k / mirrors in mirror k % mirrors.
    at::Tensor sum;
    for (std::int64_t first = 0; first < n * mirrors; first += n) {
      std::vector<at::Tensor> copies;
      for (std::int64_t k = first; k < first + n; ++k) copies.push_back(mirrored(x.narrow(0, k / mirrors, 1), k % mirrors, 2));
      const at::Tensor out = predictor(at::cat(copies));
      if (!out.defined() || out.dim() != x.dim() || out.size(0) != n) return out;  // the caller names the bad shape
      const at::Tensor y = out.to(at::kFloat);
      if (!sum.defined()) {
        std::vector<std::int64_t> shape = y.sizes().vec();
        sum = at::zeros(shape, y.options());
      }
      for (std::int64_t k = first; k < first + n; ++k) {
        sum[k / mirrors].add_(mirrored(y[k - first], k % mirrors, 1));  // one window: spatial axes from 1
      }
    }
    return sum.div_(static_cast<double>(mirrors));
  };
}

at::Tensor importance_map(const std::vector<std::int64_t>& roi_size, BlendMode mode, double sigma_scale,
                          c10::Device device) {
  if (roi_size.empty()) throw ValueError("importance_map: roi_size is empty");
  for (const std::int64_t n : roi_size) {
    if (n < 1) throw ValueError(str("importance_map: roi_size ", shape_string(roi_size), " has an entry < 1"));
  }
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  if (mode == BlendMode::constant) return at::ones(roi_size, options);
  if (!(sigma_scale > 0 && std::isfinite(sigma_scale))) {
    throw ValueError(str("importance_map: sigma_scale ", sigma_scale, " must be > 0"));
  }
  // The same float32 operations, in the same order, as MONAI's compute_importance_map.
  at::Tensor map;
  for (const std::int64_t n : roi_size) {
    const double half = static_cast<double>(n - 1) / 2.0, sigma = static_cast<double>(n) * sigma_scale;
    const at::Tensor x = at::exp(at::arange(-half, half + 1.0, 1.0, options).pow(2) / (-2.0 * sigma * sigma));
    map = map.defined() ? map.unsqueeze(-1) * x : x;
  }
  // MONAI raises weights below max(min, 1e-3) to it, so that far corners still count.
  const double floor = std::max(map.min().item<double>(), 1e-3);
  return map.clamp_min_(floor);
}

namespace {

// What both sliding-window functions share: the checked options, the padded input and
// every window's start, in MONAI's order (image-major, first axis slowest).
struct WindowPlan {
  std::int64_t spatial = 0, batch = 0, num_windows = 0;
  std::vector<std::int64_t> size, roi, padded, before;
  bool any_pad = false;
  std::vector<std::vector<std::int64_t>> windows;  // starts within one image
  at::Tensor x;                                     // the padded input
  at::Device out_device{at::kCPU};
  at::Tensor weight;      // importance map, on the input's device
  at::Tensor weight_out;  // the same on the output's device
  bool in_place = false;  // output on the windows' device: predictions weighted straight into it
};

WindowPlan plan_windows(const at::Tensor& input_, const Predictor& predictor, const SlidingWindowOptions& o) {
  o.validate();
  if (!predictor) throw ValueError("sliding window: no predictor");
  if (!input_.defined() || input_.dim() < 3) {
    throw ValueError(str("sliding window: input must be [batch, channels, spatial...], got ",
                         input_.defined() ? shape_string(input_.sizes()) : std::string("an undefined tensor")));
  }
  WindowPlan p;
  const std::int64_t spatial = p.spatial = input_.dim() - 2;
  if (static_cast<std::int64_t>(o.roi_size.size()) != spatial) {
    throw ValueError(str("sliding window: roi_size ", shape_string(o.roi_size), " has ", o.roi_size.size(),
                         " entries; the input ", shape_string(input_.sizes()), " has ", spatial, " spatial axes"));
  }
  if (input_.numel() == 0) {
    throw ValueError(str("sliding window: the input ", shape_string(input_.sizes()), " is empty"));
  }
  const at::Tensor input = input_.detach();
  p.batch = input.size(0);
  p.out_device = o.device.empty() ? input.device() : at::Device(o.device);

  p.size.resize(spatial), p.roi.resize(spatial), p.padded.resize(spatial), p.before.resize(spatial);
  std::vector<std::int64_t> intervals(spatial), pad(2 * spatial);  // pad: F.pad order, last axis first
  for (std::int64_t d = 0; d < spatial; ++d) {
    p.size[d] = input.size(2 + d);
    p.roi[d] = o.roi_size[d] > 0 ? o.roi_size[d] : p.size[d];
    p.padded[d] = std::max(p.size[d], p.roi[d]);
    p.before[d] = (p.padded[d] - p.size[d]) / 2;
    pad[2 * (spatial - 1 - d)] = p.before[d];
    pad[2 * (spatial - 1 - d) + 1] = p.padded[d] - p.size[d] - p.before[d];
    p.any_pad = p.any_pad || p.padded[d] != p.size[d];
    // int() truncation of the double product, as MONAI's _get_scan_interval.
    const auto step = static_cast<std::int64_t>(static_cast<double>(p.roi[d]) * (1.0 - o.overlap));
    intervals[d] = p.roi[d] == p.padded[d] ? p.roi[d] : std::max<std::int64_t>(step, 1);
  }
  p.x = p.any_pad ? pad_input(input, pad, o.padding_mode, o.cval) : input;

  std::vector<std::vector<std::int64_t>> axes(spatial);
  p.num_windows = 1;
  for (std::int64_t d = 0; d < spatial; ++d) {
    axes[d] = axis_starts(p.padded[d], p.roi[d], intervals[d]);
    p.num_windows *= static_cast<std::int64_t>(axes[d].size());
  }
  p.windows.reserve(static_cast<std::size_t>(p.num_windows));
  for (std::int64_t w = 0; w < p.num_windows; ++w) {
    std::vector<std::int64_t> start(spatial);
    std::int64_t rest = w;
    for (std::int64_t d = spatial - 1; d >= 0; --d) {
      const auto n = static_cast<std::int64_t>(axes[d].size());
      start[d] = axes[d][rest % n];
      rest /= n;
    }
    p.windows.push_back(std::move(start));
  }
  p.weight = importance_map(p.roi, o.mode, o.sigma_scale, p.x.device());
  p.weight_out = p.weight.to(p.out_device);
  p.in_place = p.x.device() == p.out_device;
  return p;
}

// Windows first .. first + n - 1 (numbered image-major) through the predictor, checked, in
// float32: [n, C, roi...]. Where the plan accumulates in place, the predictions as they are
// (add_window weights them); else weighted by the importance map on the window device and
// moved to the output device (MONAI weights in the prediction's dtype). `channels`: the
// channels of earlier batches (-1 for the first).
at::Tensor window_batch(const WindowPlan& p, const Predictor& predictor, std::int64_t first, std::int64_t n,
                        std::int64_t channels) {
  trace::Range range("window_batch", "validation");
  range.arg("first", static_cast<double>(first)).arg("windows", static_cast<double>(n));
  std::vector<at::Tensor> crops;
  crops.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = first; i < first + n; ++i) {
    crops.push_back(window_of(p.x.narrow(0, i / p.num_windows, 1), p.windows[i % p.num_windows], p.roi, 2));
  }
  const at::Tensor pred = predictor(at::cat(crops));
  if (!pred.defined() || pred.dim() != p.spatial + 2 || pred.size(0) != n || !pred.sizes().slice(2).equals(p.roi) ||
      (channels >= 0 && pred.size(1) != channels)) {
    throw ValueError(str("sliding window: the predictor returned ",
                         pred.defined() ? shape_string(pred.sizes()) : std::string("an undefined tensor"), " for ", n,
                         " windows of ", shape_string(p.roi), "; expected [", n, ", ",
                         channels >= 0 ? std::to_string(channels) : std::string("channels"), ", ",
                         shape_string(p.roi).substr(1)));
  }
  const at::Tensor prediction = pred.detach().to(at::kFloat);
  return p.in_place ? prediction : (prediction * p.weight).to(p.out_device);
}

// dest += a window_batch row (or rows `offset` .. `offset` + dest's first-axis length of it)
// as weighted output. In place: sums + prediction * weight in one pass, no product held.
// MONAI rounds the product before adding; a kernel that fuses the two (CUDA's) rounds once:
// the labels may then differ at exact ties (the inference bench checks they differ nowhere else).
void add_window(const WindowPlan& p, at::Tensor dest, const at::Tensor& row, std::int64_t offset = 0) {
  const std::int64_t len = dest.size(1);
  if (p.in_place) {
    dest.addcmul_(row.narrow(1, offset, len), p.weight.narrow(0, offset, len));
  } else {
    dest.add_(row.narrow(1, offset, len));
  }
}

}  // namespace

at::Tensor sliding_window_inference(const at::Tensor& input, const Predictor& predictor,
                                    const SlidingWindowOptions& o) {
  const WindowPlan p = plan_windows(input, predictor, o);
  std::vector<std::int64_t> count_shape{1, 1};
  count_shape.insert(count_shape.end(), p.padded.begin(), p.padded.end());
  at::Tensor count = at::zeros(count_shape, at::TensorOptions().dtype(at::kFloat).device(p.out_device));
  for (const auto& start : p.windows) window_of(count[0][0], start, p.roi, 0).add_(p.weight_out);

  at::Tensor output;
  const std::int64_t total = p.batch * p.num_windows;
  for (std::int64_t first = 0; first < total; first += o.sw_batch_size) {
    const std::int64_t n = std::min(o.sw_batch_size, total - first);
    const at::Tensor batch = window_batch(p, predictor, first, n, output.defined() ? output.size(1) : -1);
    if (!output.defined()) {
      std::vector<std::int64_t> shape{p.batch, batch.size(1)};
      shape.insert(shape.end(), p.padded.begin(), p.padded.end());
      output = at::zeros(shape, at::TensorOptions().dtype(at::kFloat).device(p.out_device));
    }
    for (std::int64_t i = first; i < first + n; ++i) {
      add_window(p, window_of(output[i / p.num_windows], p.windows[i % p.num_windows], p.roi, 1), batch[i - first]);
    }
  }
  output.div_(count);
  if (!p.any_pad) return output;
  at::Tensor cropped = output;
  for (std::int64_t d = 0; d < p.spatial; ++d) cropped = cropped.narrow(2 + d, p.before[d], p.size[d]);
  return cropped.contiguous();
}

namespace {

/// argmax over the classes (the first dimension of `scores`) written into `dest` ([1, ...],
/// uint8) with torch.argmax's rules (the first of equal maxima; NaN counts as the largest), by
/// elementwise passes, one per class. libtorch 1.13's argmax over the outer dimension of a
/// strided slab took most of a small validation's time (165 of 193 profile samples of
/// finishing rows in the default run).
void argmax_classes_into(const at::Tensor& scores, const at::Tensor& dest) {
  at::Tensor out = dest.select(0, 0);
  out.zero_();
  at::Tensor best = scores.select(0, 0);
  const std::int64_t classes = scores.size(0);
  for (std::int64_t c = 1; c < classes; ++c) {
    const at::Tensor x = scores.select(0, c);
    at::Tensor take = at::gt(x, best);
    take.logical_or_(at::isnan(x).logical_and_(at::isnan(best).logical_not_()));
    out.masked_fill_(take, c);
    if (c + 1 < classes) best = at::where(take, x, best);
  }
}

}  // namespace

SlidingWindowLabels sliding_window_labels(const at::Tensor& input, const Predictor& predictor,
                                          const SlidingWindowOptions& o, bool sigmoid, std::int64_t finish_bytes) {
  const WindowPlan p = plan_windows(input, predictor, o);
  const std::int64_t width = p.roi[0];  // rows of the first axis held: [done, done + width)
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(p.out_device);
  SlidingWindowLabels out;
  // A ring of `width` rows: row r of the current image lives in slot r % width, so no row
  // is ever moved; a window's rows are at most two runs of slots.
  at::Tensor sums, counts;  // [C, width, padded...], [width, padded...]
  at::Tensor nonfinite;     // counted on the device, read once at the end
  std::int64_t image = -1, done = 0, chunk = 1;

  // Runs of slots for rows [from, from + n): f(slot, offset into the rows, length).
  const auto slot_runs = [&](std::int64_t from, std::int64_t n, const auto& f) {
    for (std::int64_t k = 0; k < n;) {
      const std::int64_t slot = (from + k) % width, len = std::min(n - k, width - slot);
      f(slot, k, len);
      k += len;
    }
  };

  // Rows [done, upto) of the current image are final: divided by their weights, turned
  // into labels (cropped to the unpadded input) and their slots zeroed, `chunk` rows at a
  // time (the divided values of a few rows exist at once, not of the whole slab).
  const auto finish_rows = [&](std::int64_t upto) {
    for (std::int64_t from = done; from < upto;) {
      const std::int64_t slot = from % width, rows = std::min({chunk, upto - from, width - slot});
      const at::Tensor mean = sums.narrow(1, slot, rows) / counts.narrow(0, slot, rows);
      const at::Tensor bad = (~at::isfinite(mean)).sum();
      nonfinite = nonfinite.defined() ? nonfinite + bad : bad;
      // Rows inside the unpadded input: padded rows [before, before + size).
      const std::int64_t lo = std::max(from, p.before[0]), hi = std::min(from + rows, p.before[0] + p.size[0]);
      if (hi > lo) {
        at::Tensor kept = mean.narrow(1, lo - from, hi - lo);
        for (std::int64_t d = 1; d < p.spatial; ++d) kept = kept.narrow(1 + d, p.before[d], p.size[d]);
        at::Tensor dest = out.labels[image].narrow(1, lo - p.before[0], hi - lo);
        if (sigmoid) {
          dest.copy_(kept > 0);
        } else {
          argmax_classes_into(kept, dest);
        }
      }
      sums.narrow(1, slot, rows).zero_();
      counts.narrow(0, slot, rows).zero_();
      from += rows;
    }
    done = std::max(done, upto);
  };

  const std::int64_t total = p.batch * p.num_windows;
  for (std::int64_t first = 0; first < total; first += o.sw_batch_size) {
    const std::int64_t n = std::min(o.sw_batch_size, total - first);
    const at::Tensor batch = window_batch(p, predictor, first, n, sums.defined() ? sums.size(0) : -1);
    if (!sums.defined()) {
      const std::int64_t channels = batch.size(1);
      out.classes = channels;
      std::vector<std::int64_t> shape{channels, width}, labels_shape{p.batch, sigmoid ? channels : 1};
      shape.insert(shape.end(), p.padded.begin() + 1, p.padded.end());
      labels_shape.insert(labels_shape.end(), p.size.begin(), p.size.end());
      sums = at::zeros(shape, f32);
      counts = at::zeros(at::IntArrayRef(shape).slice(1), f32);
      out.labels = at::empty(labels_shape, at::TensorOptions().dtype(at::kByte).device(p.out_device));
      const std::int64_t row_bytes = std::max<std::int64_t>(1, sums.numel() / width * 4);
      chunk = std::clamp<std::int64_t>(finish_bytes / row_bytes, 1, width);
    }
    for (std::int64_t i = first; i < first + n; ++i) {
      if (i / p.num_windows != image) {  // a new image: the last one's rows are all final
        if (image >= 0) finish_rows(p.padded[0]);
        image = i / p.num_windows;
        done = 0;
      }
      std::vector<std::int64_t> start = p.windows[i % p.num_windows];
      finish_rows(start[0]);  // later windows of this image start at start[0] or after
      slot_runs(start[0], width, [&](std::int64_t slot, std::int64_t offset, std::int64_t len) {
        std::vector<std::int64_t> at = start, roi = p.roi;
        at[0] = slot;
        roi[0] = len;
        add_window(p, window_of(sums, at, roi, 1), batch[i - first], offset);
        window_of(counts, at, roi, 0).add_(p.weight_out.narrow(0, offset, len));
      });
    }
  }
  finish_rows(p.padded[0]);
  if (nonfinite.defined()) out.nonfinite = nonfinite.item<std::int64_t>();
  return out;
}

}  // namespace medfast::train
