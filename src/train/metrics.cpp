/// \file
/// Dice and HD95 per case and class, and their running mean.
///
/// HD95 follows MONAI 1.3 (monai/metrics/hausdorff_distance.py, utils.py): edge
/// voxels by erosion with the face-connected element (the outside counts as
/// background), exact Euclidean distance transform of each edge set, directed 95th
/// percentiles, their maximum. The work is cropped to the bounding box of both masks
/// plus one voxel, which changes neither the edges (the added ring is background, or
/// the image border, which erodes either way) nor the distances (every edge voxel
/// lies inside). The distance transform is Felzenszwalb and Huttenlocher's separable
/// lower envelope of parabolas, in mm along each axis, on squared distances in float64.
#include "medfast/train/metrics.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "medfast/core/error.hpp"
#include "medfast/core/stats.hpp"
#include "medfast/train/losses.hpp"

namespace medfast::train {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void check_masks(const char* what, const at::Tensor& pred, const at::Tensor& target) {
  MEDFAST_CHECK_T(ValueError, pred.defined() && target.defined(), what, ": prediction and ground truth must be defined");
  MEDFAST_CHECK_T(ValueError, pred.dim() >= 3, what, ": expected masks [B, C, spatial...], got ", pred.sizes());
  MEDFAST_CHECK_T(ValueError, pred.sizes() == target.sizes(), what, ": prediction ", pred.sizes(),
                  " and ground truth ", target.sizes(), " differ in shape");
}

/// Channels [first, C) as boolean masks, where first skips the background.
at::Tensor foreground_masks(const at::Tensor& onehot, bool include_background) {
  const std::int64_t C = onehot.size(1);
  const std::int64_t first = (include_background || C == 1) ? 0 : 1;
  return onehot.narrow(1, first, C - first) != 0;
}

/// A dense N-d grid of voxels in C order.
struct Grid {
  std::vector<std::int64_t> shape;
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  /// Elements between neighbours along axis d.
  std::int64_t stride(std::size_t d) const {
    std::int64_t s = 1;
    for (std::size_t k = d + 1; k < shape.size(); ++k) s *= shape[k];
    return s;
  }
};

/// Calls f(index, coordinates) for every voxel in C order.
template <typename F>
void for_each_voxel(const Grid& g, F&& f) {
  std::vector<std::int64_t> c(g.shape.size(), 0);
  const std::int64_t n = g.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    f(i, c);
    for (std::size_t d = g.shape.size(); d-- > 0;) {
      if (++c[d] < g.shape[d]) break;
      c[d] = 0;
    }
  }
}

/// Voxels of `mask` with a face neighbour outside the mask or outside the grid.
std::vector<std::uint8_t> edges(const std::vector<std::uint8_t>& mask, const Grid& g) {
  std::vector<std::uint8_t> out(mask.size(), 0);
  std::vector<std::int64_t> strides(g.shape.size());
  for (std::size_t d = 0; d < g.shape.size(); ++d) strides[d] = g.stride(d);
  for_each_voxel(g, [&](std::int64_t i, const std::vector<std::int64_t>& c) {
    if (!mask[i]) return;
    for (std::size_t d = 0; d < g.shape.size(); ++d) {
      if (c[d] == 0 || c[d] == g.shape[d] - 1 || !mask[i - strides[d]] || !mask[i + strides[d]]) {
        out[i] = 1;
        return;
      }
    }
  });
  return out;
}

/// One line of the separable transform: out[q] = min_p (f[p] + ((q - p) w)^2), over
/// the p with finite f (Felzenszwalb & Huttenlocher 2012). v, z: scratch of n and n + 1.
void lower_envelope(const double* f, double* out, std::int64_t n, double w, std::int64_t* v, double* z) {
  std::int64_t k = -1;
  for (std::int64_t q = 0; q < n; ++q) {
    if (f[q] == kInf) continue;
    const double fq = f[q] + (q * w) * (q * w);
    if (k < 0) {
      k = 0;
      v[0] = q;
      z[0] = -kInf;
      z[1] = kInf;
      continue;
    }
    double s;
    while (true) {
      const std::int64_t p = v[k];
      s = (fq - (f[p] + (p * w) * (p * w))) / (2.0 * w * static_cast<double>(q - p));
      if (s > z[k]) break;
      --k;  // z[0] = -inf ends the loop at k = 0 at the latest
    }
    ++k;
    v[k] = q;
    z[k] = s;
    z[k + 1] = kInf;
  }
  if (k < 0) {
    std::fill(out, out + n, kInf);
    return;
  }
  k = 0;
  for (std::int64_t q = 0; q < n; ++q) {
    const double x = q * w;
    while (z[k + 1] < x) ++k;
    const double dx = x - v[k] * w;
    out[q] = dx * dx + f[v[k]];
  }
}

/// Squared Euclidean distance (mm^2) of every voxel to the nearest voxel of `features`.
std::vector<double> squared_distance_transform(const std::vector<std::uint8_t>& features, const Grid& g,
                                               const std::vector<double>& spacing) {
  std::vector<double> d(features.size());
  for (std::size_t i = 0; i < features.size(); ++i) d[i] = features[i] ? 0.0 : kInf;
  std::int64_t longest = 1;
  for (auto s : g.shape) longest = std::max(longest, s);
  std::vector<double> f(longest), out(longest), z(longest + 1);
  std::vector<std::int64_t> v(longest);
  const std::int64_t total = g.numel();
  for (std::size_t axis = 0; axis < g.shape.size(); ++axis) {
    const std::int64_t n = g.shape[axis], inner = g.stride(axis), outer = total / (n * inner);
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t i = 0; i < inner; ++i) {
        double* line = d.data() + o * n * inner + i;
        for (std::int64_t q = 0; q < n; ++q) f[q] = line[q * inner];
        lower_envelope(f.data(), out.data(), n, spacing[axis], v.data(), z.data());
        for (std::int64_t q = 0; q < n; ++q) line[q * inner] = out[q];
      }
    }
  }
  return d;
}

/// Distances (mm) from each edge voxel of `from` to the nearest edge voxel of `to`.
std::vector<double> surface_distances(const std::vector<std::uint8_t>& from, const std::vector<std::uint8_t>& to,
                                      const Grid& g, const std::vector<double>& spacing) {
  const std::vector<double> d2 = squared_distance_transform(to, g, spacing);
  std::vector<double> out;
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (from[i]) out.push_back(std::sqrt(d2[i]));
  }
  return out;
}

/// HD95 of one pair of boolean masks stored contiguously in C order.
double hausdorff95(const bool* pred, const bool* gt, const Grid& full, const std::vector<double>& spacing) {
  const std::size_t nd = full.shape.size();
  std::vector<std::int64_t> lo(full.shape), hi(nd, -1);
  bool any_pred = false, any_gt = false;
  for_each_voxel(full, [&](std::int64_t i, const std::vector<std::int64_t>& c) {
    if (!pred[i] && !gt[i]) return;
    any_pred |= pred[i];
    any_gt |= gt[i];
    for (std::size_t d = 0; d < nd; ++d) {
      lo[d] = std::min(lo[d], c[d]);
      hi[d] = std::max(hi[d], c[d]);
    }
  });
  if (!any_pred || !any_gt) return kNaN;

  Grid box;
  for (std::size_t d = 0; d < nd; ++d) {
    lo[d] = std::max<std::int64_t>(lo[d] - 1, 0);
    hi[d] = std::min<std::int64_t>(hi[d] + 1, full.shape[d] - 1);
    box.shape.push_back(hi[d] - lo[d] + 1);
  }
  std::vector<std::int64_t> full_strides(nd);
  for (std::size_t d = 0; d < nd; ++d) full_strides[d] = full.stride(d);
  std::vector<std::uint8_t> p(box.numel()), g(box.numel());
  for_each_voxel(box, [&](std::int64_t i, const std::vector<std::int64_t>& c) {
    std::int64_t src = 0;
    for (std::size_t d = 0; d < nd; ++d) src += (c[d] + lo[d]) * full_strides[d];
    p[i] = pred[src];
    g[i] = gt[src];
  });

  const std::vector<std::uint8_t> edge_p = edges(p, box), edge_g = edges(g, box);
  std::vector<double> pred_to_gt = surface_distances(edge_p, edge_g, box, spacing);
  std::vector<double> gt_to_pred = surface_distances(edge_g, edge_p, box, spacing);
  return std::max(numpy_percentile(pred_to_gt, 95.0), numpy_percentile(gt_to_pred, 95.0));
}

}  // namespace

at::Tensor dice_per_class(const at::Tensor& pred_onehot, const at::Tensor& target_onehot, bool include_background) {
  check_masks("dice_per_class", pred_onehot, target_onehot);
  const at::Tensor p = foreground_masks(pred_onehot, include_background);
  const at::Tensor g = foreground_masks(target_onehot.to(pred_onehot.device()), include_background);
  std::vector<std::int64_t> axes;
  for (std::int64_t d = 2; d < p.dim(); ++d) axes.push_back(d);
  const at::Tensor intersection = at::sum(p & g, axes, false, at::kDouble);
  const at::Tensor pred_size = at::sum(p, axes, false, at::kDouble);
  const at::Tensor gt_size = at::sum(g, axes, false, at::kDouble);
  return (2.0 * intersection / (pred_size + gt_size)).masked_fill_(gt_size == 0, kNaN);
}

at::Tensor hausdorff95_per_class(const at::Tensor& pred_onehot, const at::Tensor& target_onehot,
                                 bool include_background, std::vector<double> spacing) {
  check_masks("hausdorff95_per_class", pred_onehot, target_onehot);
  const std::size_t nd = static_cast<std::size_t>(pred_onehot.dim() - 2);
  if (spacing.empty()) spacing.assign(nd, 1.0);
  MEDFAST_CHECK_T(ValueError, spacing.size() == nd, "hausdorff95_per_class: spacing has ", spacing.size(),
                  " values for ", nd, " spatial axes");
  for (std::size_t d = 0; d < nd; ++d) {
    MEDFAST_CHECK_T(ValueError, std::isfinite(spacing[d]) && spacing[d] > 0,
                    "hausdorff95_per_class: spacing must be finite and > 0, got ", spacing[d], " on axis ", d);
  }
  const at::Tensor p = foreground_masks(pred_onehot, include_background).cpu().contiguous();
  const at::Tensor g = foreground_masks(target_onehot, include_background).cpu().contiguous();
  const std::int64_t B = p.size(0), C = p.size(1);
  Grid grid;
  for (std::int64_t d = 2; d < p.dim(); ++d) grid.shape.push_back(p.size(d));
  const std::int64_t voxels = grid.numel();
  at::Tensor out = at::empty({B, C}, at::TensorOptions().dtype(at::kDouble));
  double* result = out.data_ptr<double>();
  const bool* pp = p.data_ptr<bool>();
  const bool* gp = g.data_ptr<bool>();
  at::parallel_for(0, B * C, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) result[i] = hausdorff95(pp + i * voxels, gp + i * voxels, grid, spacing);
  });
  return out.to(pred_onehot.device());
}

MeanMetric::MeanMetric(std::int64_t num_classes) : fixed_classes_(num_classes) {
  MEDFAST_CHECK_T(ValueError, num_classes >= 0, "MeanMetric: num_classes must be >= 0, got ", num_classes);
  reset();
}

void MeanMetric::reset() {
  if (fixed_classes_ > 0) {
    sums_ = at::zeros({fixed_classes_}, at::kDouble);
    counts_ = at::zeros({fixed_classes_}, at::kDouble);
  } else {
    sums_ = counts_ = at::Tensor();
  }
}

void MeanMetric::add(const at::Tensor& per_case) {
  MEDFAST_CHECK_T(ValueError, per_case.defined() && (per_case.dim() == 1 || per_case.dim() == 2),
                  "MeanMetric: expected per-case rows [N, C] or one row [C], got ",
                  per_case.defined() ? per_case.sizes() : at::IntArrayRef{});
  const at::Tensor rows = per_case.to(at::kDouble).cpu().reshape({-1, per_case.size(-1)});
  if (!sums_.defined()) {
    sums_ = at::zeros({rows.size(1)}, at::kDouble);
    counts_ = at::zeros({rows.size(1)}, at::kDouble);
  }
  MEDFAST_CHECK_T(ValueError, rows.size(1) == sums_.size(0), "MeanMetric: rows have ", rows.size(1),
                  " classes, earlier rows ", sums_.size(0));
  const at::Tensor valid = ~at::isnan(rows);
  sums_ += at::where(valid, rows, at::zeros_like(rows)).sum(0);
  counts_ += valid.sum(0, false, at::kDouble);
}

at::Tensor MeanMetric::per_class() const {
  if (!sums_.defined()) return at::empty({0}, at::kDouble);
  return at::where(counts_ > 0, sums_ / counts_, at::full_like(sums_, kNaN));
}

double MeanMetric::mean() const {
  const at::Tensor values = per_class();
  const at::Tensor valid = ~at::isnan(values);
  if (!valid.any().item<bool>()) return kNaN;
  return values.masked_select(valid).mean().item<double>();
}

at::Tensor MeanMetric::sums() const { return sums_.defined() ? sums_.clone() : at::empty({0}, at::kDouble); }
at::Tensor MeanMetric::counts() const { return counts_.defined() ? counts_.clone() : at::empty({0}, at::kDouble); }

MeanMetric MeanMetric::from_totals(at::Tensor sums, at::Tensor counts) {
  MEDFAST_CHECK_T(ValueError, sums.defined() && counts.defined() && sums.dim() == 1 && sums.sizes() == counts.sizes(),
                  "MeanMetric::from_totals: sums and counts must be [C] of the same size, got ",
                  sums.defined() ? sums.sizes() : at::IntArrayRef{}, " and ",
                  counts.defined() ? counts.sizes() : at::IntArrayRef{});
  MeanMetric m;
  m.sums_ = sums.to(at::kDouble).cpu().clone();
  m.counts_ = counts.to(at::kDouble).cpu().clone();
  MEDFAST_CHECK_T(ValueError, m.counts_.numel() == 0 || m.counts_.min().item<double>() >= 0,
                  "MeanMetric::from_totals: counts must be >= 0");
  m.fixed_classes_ = m.sums_.numel();
  if (m.fixed_classes_ == 0) m.sums_ = m.counts_ = at::Tensor();
  return m;
}

MetricInputs metric_inputs(const at::Tensor& logits, const at::Tensor& labels, bool sigmoid) {
  MEDFAST_CHECK_T(ValueError, logits.dim() >= 3 && labels.dim() == logits.dim(), "metrics: logits ", logits.sizes(),
                  " and labels ", labels.sizes(), " must both be [B, C, spatial...]");
  return metric_inputs_from_labels(predicted_labels(logits, sigmoid), labels, logits.size(1), sigmoid);
}

MetricInputs metric_inputs_from_labels(const at::Tensor& predicted, const at::Tensor& labels, std::int64_t classes,
                                       bool sigmoid) {
  MEDFAST_CHECK_T(ValueError, predicted.dim() >= 3 && labels.dim() == predicted.dim(), "metrics: predictions ",
                  predicted.sizes(), " and labels ", labels.sizes(), " must both be [B, C, spatial...]");
  MetricInputs m;
  if (!sigmoid) {
    MEDFAST_CHECK_T(ValueError, labels.size(1) == 1, "metrics: a softmax model's labels must be [B, 1, ...] class indices, got ",
                    labels.sizes());
    m.pred = train::one_hot(predicted, classes);
    m.target = train::one_hot(labels, classes);
    m.include_background = false;
    return m;
  }
  m.pred = predicted.to(at::kFloat);
  if (labels.size(1) == classes) {
    m.target = (labels > 0).to(at::kFloat);
  } else if (labels.size(1) == 1) {
    m.target = train::one_hot(labels, classes);
  } else {
    throw ValueError(str("metrics: labels with ", labels.size(1), " channels for a sigmoid model with ", classes,
                         " outputs (expected 1 or ", classes, ")"));
  }
  m.include_background = true;
  return m;
}

at::Tensor predicted_labels(const at::Tensor& logits, bool sigmoid) {
  if (sigmoid) return (logits > 0).to(at::kByte);
  return logits.argmax(1, /*keepdim=*/true).to(at::kByte);
}

}  // namespace medfast::train
