#pragma once
/// \file
/// Validation metrics with MONAI 1.3's semantics, per case and class, and their
/// running mean.
///
/// Inputs are one-hot (or multi-label) masks [B, C, spatial...] of any dtype; a
/// voxel belongs to a class where its value is non-zero. Without background,
/// channel 0 is dropped unless it is the only channel (as MONAI does).
///
/// Empty masks, as MONAI 1.3 treats them:
/// - Dice (DiceMetric, ignore_empty=True): NaN where the ground truth is empty,
///   whatever the prediction; 0 where only the prediction is empty.
/// - HD95 (HausdorffDistanceMetric, percentile=95): NaN where the ground truth or
///   the prediction is empty (or both). MONAI fills the distances of an empty side
///   with inf, and the interpolated 95th percentile of inf values is inf - inf = NaN;
///   both are then left out of the means, as MONAI's aggregation leaves NaN out.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace medfast::train {

/// MONAI DiceMetric per case and class: [B, C'] float64 on the input's device
/// (C' = C, or C - 1 without background), 2 |P & G| / (|P| + |G|); NaN where the
/// ground truth of that class is empty (MONAI ignore_empty=True).
at::Tensor dice_per_class(const at::Tensor& pred_onehot, const at::Tensor& target_onehot,
                          bool include_background = false);

/// MONAI HausdorffDistanceMetric(percentile=95) per case and class: [B, C'] float64
/// on the input's device. Surfaces are the masks' edge voxels (a voxel of the mask
/// with a face neighbour outside it or outside the image); distances from each edge
/// voxel to the other mask's nearest edge voxel are exact Euclidean distances in mm
/// with `spacing` per spatial axis (empty = 1 mm); the result is the larger of the
/// two directed 95th percentiles (numpy's linear interpolation). NaN where the ground
/// truth or the prediction is empty (see the file comment). Runs on the CPU.
at::Tensor hausdorff95_per_class(const at::Tensor& pred_onehot, const at::Tensor& target_onehot,
                                 bool include_background = false, std::vector<double> spacing = {});

/// Running per-class mean of per-case metric rows, leaving NaN out.
///
/// sums() and counts() are the [C'] float64 totals (CPU), so ranks can all-reduce
/// them and rebuild the metric with from_totals(). mean() is the mean over classes
/// of per_class(), over the classes that have a value: MONAI's "mean_batch" averaged
/// over classes, which equals MONAI's "mean" reduction when no value is NaN.
class MeanMetric {
 public:
  /// num_classes = 0: taken from the first add(). Giving it lets a rank that saw no
  /// case still contribute zero totals of the right size to an all-reduce.
  explicit MeanMetric(std::int64_t num_classes = 0);
  /// Adds rows [N, C'] (or one row [C']) of any floating dtype and device.
  /// Throws ValueError when C' differs from earlier rows.
  void add(const at::Tensor& per_case);
  /// [C'] float64: sum / count per class, NaN for a class without values.
  at::Tensor per_class() const;
  /// The mean of per_class() over classes with values; NaN when there are none.
  double mean() const;
  at::Tensor sums() const;    ///< [C'] float64 (CPU)
  at::Tensor counts() const;  ///< [C'] float64 (CPU): the non-NaN values per class
  /// Rebuilds from (all-reduced) totals of any device and floating or integer dtype.
  static MeanMetric from_totals(at::Tensor sums, at::Tensor counts);
  /// Forgets all values (the number of classes too, unless given to the constructor).
  void reset();

 private:
  std::int64_t fixed_classes_ = 0;
  at::Tensor sums_, counts_;  // undefined until the size is known
};

/// What a network's logits [B, C, ...] and the labels are scored as. Softmax models
/// (the default): the one-hot argmax against the one-hot labels ([B, 1, ...] class
/// indices), background (channel 0) left out. Sigmoid models: every channel is a
/// foreground mask (logit > 0) against the labels as masks (labels with C channels,
/// or [B, 1, ...] class indices one-hot encoded when C > 1), every channel counted.
/// Throws ValueError naming the shapes when labels and logits do not fit.
struct MetricInputs {
  at::Tensor pred, target;
  bool include_background = false;
};
MetricInputs metric_inputs(const at::Tensor& logits, const at::Tensor& labels, bool sigmoid);
/// The same from predicted labels (predicted_labels' layout: softmax [B, 1, ...] class
/// indices, sigmoid [B, C, ...] masks) of a `classes`-channel network, as
/// sliding_window_labels gives them without the whole logits.
MetricInputs metric_inputs_from_labels(const at::Tensor& predicted, const at::Tensor& labels, std::int64_t classes,
                                       bool sigmoid);

/// The label volume a prediction is written as: softmax models [B, 1, ...] uint8 class
/// indices (argmax); sigmoid models [B, C, ...] uint8 masks (logit > 0).
at::Tensor predicted_labels(const at::Tensor& logits, bool sigmoid);

}  // namespace medfast::train
