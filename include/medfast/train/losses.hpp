#pragma once
/// \file
/// Segmentation losses with MONAI 1.3's semantics, from a config's `loss` section:
///
///   loss: {name: DiceCE, to_onehot_y: true, softmax: true}
///   loss: {name: DiceFocal, include_background: false, to_onehot_y: true, sigmoid: true, gamma: 2.0}
///
/// Argument names and defaults are MONAI's (DiceLoss, DiceCELoss, DiceFocalLoss);
/// every loss uses MONAI's default "mean" reduction.
///
/// - Dice: p = sigmoid/softmax/identity of the input; channel 0 of p and of the
///   (one-hot) target is dropped after the activation without background;
///   per case and class (per class with batch=true) over the spatial axes,
///   1 - (2 sum(p t) + smooth_nr) / (sum(p^k) + sum(t^k) + smooth_dr), k = 2 with
///   squared_pred, the denominator 2 (sum(p^k) + sum(t^k) - sum(p t)) with jaccard;
///   then the mean.
/// - DiceCE adds lambda_ce times cross entropy of the raw logits against the raw
///   target, whatever the activation, exactly as MONAI: class indices for a [B,1,...]
///   target, class probabilities for a [B,C,...] target, and binary cross entropy
///   with logits when the input has a single channel. All channels take part
///   (include_background applies to the Dice term only).
/// - DiceFocal adds lambda_focal times MONAI's sigmoid focal loss of the raw logits:
///   mean over every element of exp(gamma logsigmoid(-x (2t - 1))) BCE(x, t), with the
///   target one-hot encoded and channel 0 dropped as for the Dice term.
///
/// With a single input channel MONAI ignores to_onehot_y and include_background=false
/// (and so does this); softmax over one channel, which MONAI silently ignores, leaving
/// the Dice term on raw logits, is a ValueError here.
///
/// Inputs in half or bfloat16 are computed in float32 (the loss is float32 then).
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"

namespace medfast::train {

/// The losses, by MONAI's class names less "Loss".
enum class LossName { Dice, DiceCE, DiceFocal };
constexpr std::array<Choice<LossName>, 3> choices(LossName) {
  return {{{LossName::Dice, "Dice"}, {LossName::DiceCE, "DiceCE"}, {LossName::DiceFocal, "DiceFocal"}}};
}

/// A loss and its MONAI arguments.
struct LossOptions {
  LossName name = LossName::DiceCE;
  bool include_background = true, to_onehot_y = false, sigmoid = false, softmax = false;
  bool squared_pred = false, jaccard = false, batch = false;
  double smooth_nr = 1e-5, smooth_dr = 1e-5;
  double lambda_dice = 1.0, lambda_ce = 1.0, lambda_focal = 1.0;
  double gamma = 2.0;  ///< DiceFocal
  /// Throws ValueError naming the argument and its value: sigmoid and softmax both set, a negative or non-finite smooth_nr/smooth_dr/lambda/gamma.
  void validate() const;
  static constexpr auto fields() {
    using O = LossOptions;
    return std::make_tuple(
        field("name", &O::name, "the loss"),
        field("include_background", &O::include_background, "score the first channel too"),
        field("to_onehot_y", &O::to_onehot_y, "the target holds class indices: one-hot it"),
        field("sigmoid", &O::sigmoid, "sigmoid on the logits (one channel per label)"),
        field("softmax", &O::softmax, "softmax over the channels"),
        field("squared_pred", &O::squared_pred, "square the predictions in the denominator"),
        field("jaccard", &O::jaccard, "Jaccard (IoU) form of the Dice term"),
        field("batch", &O::batch, "sum over the batch before dividing"),
        field("smooth_nr", &O::smooth_nr, "added to the numerator"),
        field("smooth_dr", &O::smooth_dr, "added to the denominator"),
        field("lambda_dice", &O::lambda_dice, "weight of the Dice term"),
        field("lambda_ce", &O::lambda_ce, "weight of the cross-entropy term (DiceCE)"),
        field("lambda_focal", &O::lambda_focal, "weight of the focal term (DiceFocal)"),
        field("gamma", &O::gamma, "focusing parameter (DiceFocal)"));
  }
  /// From a config's `loss:` mapping, e.g. {name: DiceCE, to_onehot_y: true, softmax: true};
  /// `name` may be left out (DiceCE). Unknown keys and wrong types are ValueErrors
  /// naming `where`.key. The result is validated (its errors prefixed with `where`).
  static LossOptions from_json(const nlohmann::json& j, const std::string& where = "loss");
};

/// One of the losses above, callable on CPU and CUDA tensors alike.
class Loss {
 public:
  /// Validates the options.
  explicit Loss(LossOptions options);
  /// input: logits [B, C, spatial...]; target: [B, 1, spatial...] class indices (any
  /// integer or float dtype) when to_onehot_y (and C > 1), else [B, C, spatial...]
  /// (any dtype; a binary [B, 1, ...] mask when C = 1). Returns the mean-reduced
  /// scalar, differentiable w.r.t. input. Shapes that do not fit are ValueErrors
  /// stating both shapes.
  at::Tensor operator()(const at::Tensor& input, const at::Tensor& target) const;
  /// The same without reading anything on the host (a training step's way): where the
  /// target holds class indices, they are clamped into [0, C) and their range before that
  /// is left in *label_range (int64 [2] on the device: lowest, highest), for the caller to
  /// check when it reads the step back; elsewhere *label_range is left undefined.
  at::Tensor operator()(const at::Tensor& input, const at::Tensor& target, at::Tensor* label_range) const;
  const LossOptions& options() const { return options_; }

 private:
  LossOptions options_;
};

/// Deep supervision (nnU-Net's): `stacked` [B, n, C, spatial...] (a network's training
/// outputs, the full-size one first, the heads resized to it) against one target:
/// sum over i of weights[i] * loss(stacked[:, i], target), in float32; outputs of weight 0
/// are not scored. ValueError when the stack and the weights differ in number.
/// `label_range` as Loss::operator() takes it (the range over every scored output).
at::Tensor deep_supervision_loss(const Loss& loss, const at::Tensor& stacked, const at::Tensor& target,
                                 const std::vector<double>& weights, at::Tensor* label_range = nullptr);

/// [B, 1, ...] class indices (any integer or float dtype; floats are truncated) to a
/// float32 one-hot [B, num_classes, ...] (MONAI's one_hot). Throws ValueError when a
/// label lies outside [0, num_classes). Call it qualified (train::one_hot): with a
/// tensor argument, argument-dependent lookup also finds at::one_hot.
at::Tensor one_hot(const at::Tensor& labels, std::int64_t num_classes);
/// [B, C, ...] scores to the float32 one-hot of their argmax over C (ties: the first).
at::Tensor argmax_one_hot(const at::Tensor& logits);

}  // namespace medfast::train
