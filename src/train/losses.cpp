#include "medfast/train/losses.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <vector>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/nn/layout.hpp"

namespace medfast::train {

namespace {

/// MONAI's one_hot without the range check, for indices known to be valid; in `layout`.
at::Tensor scatter_one_hot(const at::Tensor& indices, std::int64_t num_classes,
                           at::MemoryFormat layout = at::MemoryFormat::Contiguous) {
  std::vector<std::int64_t> shape = indices.sizes().vec();
  shape[1] = num_classes;
  const auto format = shape.size() == 5 ? layout : at::MemoryFormat::Contiguous;
  return at::zeros(shape, indices.options().dtype(at::kFloat).memory_format(format)).scatter_(1, indices, 1.0);
}

/// Softmax (or its log) over the channels. A channels-last tensor's channels are the
/// innermost axis of its memory: there, over the last axis of a [N, D, H, W, C] view, which
/// keeps the layout (libtorch's kernels over dim 1 would make the input contiguous first).
at::Tensor channel_softmax(const at::Tensor& x, bool log) {
  if (!nn::is_channels_last(x)) return log ? at::log_softmax(x, 1) : at::softmax(x, 1);
  const at::Tensor last = x.permute({0, 2, 3, 4, 1});
  return (log ? at::log_softmax(last, -1) : at::softmax(last, -1)).permute({0, 4, 1, 2, 3});
}

/// The Dice term on activated predictions p and one-hot targets t of the same shape.
at::Tensor dice_term(const at::Tensor& p, const at::Tensor& t, const LossOptions& o) {
  std::vector<std::int64_t> axes;
  if (o.batch) axes.push_back(0);
  for (std::int64_t d = 2; d < p.dim(); ++d) axes.push_back(d);
  const at::Tensor intersection = (p * t).sum(axes);
  const at::Tensor pk = o.squared_pred ? p * p : p;
  const at::Tensor tk = o.squared_pred ? t * t : t;
  at::Tensor denominator = pk.sum(axes) + tk.sum(axes);
  if (o.jaccard) denominator = 2.0 * (denominator - intersection);
  return (1.0 - (2.0 * intersection + o.smooth_nr) / (denominator + o.smooth_dr)).mean();
}

/// MONAI's sigmoid focal loss, elementwise, averaged over every element.
at::Tensor sigmoid_focal_term(const at::Tensor& x, const at::Tensor& t, double gamma) {
  const at::Tensor bce = at::binary_cross_entropy_with_logits(x, t, {}, {}, at::Reduction::None);
  // log(1 - p_t) for binary targets, computed without overflow.
  const at::Tensor log_one_minus_pt = at::log_sigmoid(-x * (t * 2.0 - 1.0));
  return (at::exp(log_one_minus_pt * gamma) * bce).mean();
}

}  // namespace

void LossOptions::validate() const {
  MEDFAST_CHECK_T(ValueError, !(sigmoid && softmax),
                  "sigmoid: true together with softmax: true; choose one activation (or neither)");
  for_each_field(*this, [](const auto& f, const auto& v) {  // smoothing terms, weights, gamma
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, double>) {
      MEDFAST_CHECK_T(ValueError, std::isfinite(v) && v >= 0, f.key, ": expected a finite number >= 0, got ", v);
    }
  });
}

LossOptions LossOptions::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) {
    throw ConfigError(str(where, ": expected a mapping such as {name: DiceCE, to_onehot_y: true, softmax: true}, got ",
                          j.dump()));
  }
  LossOptions o;
  ConfigReader k(j, where, ConfigReader::Naming{ConfigReader::Style::path, "argument", ""});
  const nlohmann::json& name = k.raw("name");
  if (!name.is_null() && !name.is_string()) k.fail("name", str("expected a string (", choice_list<LossName>(), "), got ", name.dump()));
  read_fields(k, o);
  k.finish(o, ".");
  return o;
}

Loss::Loss(LossOptions options) : options_(std::move(options)) { options_.validate(); }

at::Tensor deep_supervision_loss(const Loss& loss, const at::Tensor& stacked, const at::Tensor& target,
                                 const std::vector<double>& weights, at::Tensor* label_range) {
  MEDFAST_CHECK_T(ValueError, stacked.defined() && stacked.dim() >= 4 && stacked.size(1) == static_cast<std::int64_t>(weights.size()),
                  "deep supervision: expected ", weights.size(), " outputs stacked on axis 1, got ",
                  stacked.defined() ? stacked.sizes() : at::IntArrayRef{});
  at::Tensor total;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] == 0) continue;  // not computed: a NaN there must not reach the step (0 * NaN)
    const at::Tensor l = loss(stacked.select(1, static_cast<std::int64_t>(i)).to(at::kFloat), target, label_range) * weights[i];
    total = total.defined() ? total + l : l;
  }
  return total;
}

at::Tensor Loss::operator()(const at::Tensor& input, const at::Tensor& target) const {
  return (*this)(input, target, nullptr);
}

at::Tensor Loss::operator()(const at::Tensor& input, const at::Tensor& target, at::Tensor* label_range) const {
  const LossOptions& o = options_;
  MEDFAST_CHECK_T(ValueError, input.defined() && target.defined(), name_of(o.name), " loss: input and target must be defined");
  MEDFAST_CHECK_T(ValueError, input.dim() >= 3 && input.is_floating_point(), name_of(o.name),
                  " loss: input must be floating-point logits [B, C, spatial...], got ", input.scalar_type(), " ",
                  input.sizes());
  const std::int64_t C = input.size(1);
  const bool multi = C > 1;
  const bool onehot_y = o.to_onehot_y && multi;  // MONAI ignores to_onehot_y for a single channel
  {
    std::vector<std::int64_t> want = input.sizes().vec();
    want[1] = onehot_y ? 1 : C;
    MEDFAST_CHECK_T(ValueError, target.sizes().vec() == want, name_of(o.name), " loss: target ", target.sizes(),
                    " does not fit input ", input.sizes(), " (expected ", at::IntArrayRef(want),
                    onehot_y ? ": class indices, as to_onehot_y is set)"
                    : multi ? ": one channel per class; set to_onehot_y for class indices)"
                            : ")");
  }
  MEDFAST_CHECK_T(ValueError, !o.softmax || multi, name_of(o.name),
                  " loss: softmax over a single channel is constant; use sigmoid: true for a one-channel output");

  at::Tensor x = input;
  if (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) x = x.to(at::kFloat);
  const at::Tensor raw_target = target.to(x.device());
  at::Tensor t, indices;  // indices: the class of each voxel ([B, spatial...]), with onehot_y
  if (onehot_y && label_range != nullptr) {  // checked by the caller, later: clamped here
    const at::Tensor all = raw_target.to(at::kLong);
    const auto [lo, hi] = at::aminmax(all);
    *label_range = at::stack({lo, hi});
    const at::Tensor clamped = all.clamp(0, C - 1);
    t = scatter_one_hot(clamped, C, x.suggest_memory_format()).to(x.scalar_type());
    indices = clamped.squeeze(1);
  } else if (onehot_y) {
    t = train::one_hot(raw_target, C).to(x.scalar_type());
    indices = raw_target.squeeze(1).to(at::kLong);
  } else {
    t = raw_target.to(x.scalar_type());
  }

  const bool channels_last = nn::is_channels_last(x);
  const at::Tensor p = o.sigmoid ? at::sigmoid(x) : o.softmax ? channel_softmax(x, /*log=*/false) : x;
  const bool drop_background = !o.include_background && multi;
  const auto foreground = [&](const at::Tensor& a) { return drop_background ? a.narrow(1, 1, C - 1) : a; };
  const at::Tensor dice = dice_term(foreground(p), foreground(t), o);
  if (o.name == LossName::Dice) return dice;

  if (o.name == LossName::DiceCE) {
    at::Tensor ce;
    if (!multi) {
      ce = at::binary_cross_entropy_with_logits(x, t);
    } else if (channels_last) {  // the same sums, the channels innermost (at::cross_entropy_loss: over dim 1)
      const at::Tensor log_p = channel_softmax(x, /*log=*/true);
      ce = onehot_y ? -log_p.gather(1, indices.unsqueeze(1)).mean() : -(log_p * t).sum(1).mean();
    } else if (onehot_y) {
      ce = at::cross_entropy_loss(x, indices);
    } else {
      ce = at::cross_entropy_loss(x, t);  // class probabilities
    }
    return o.lambda_dice * dice + o.lambda_ce * ce;
  }
  return o.lambda_dice * dice + o.lambda_focal * sigmoid_focal_term(foreground(x), foreground(t), o.gamma);
}

at::Tensor one_hot(const at::Tensor& labels, std::int64_t num_classes) {
  MEDFAST_CHECK_T(ValueError, num_classes >= 1, "one_hot: num_classes must be >= 1, got ", num_classes);
  MEDFAST_CHECK_T(ValueError, labels.defined() && labels.dim() >= 2 && labels.size(1) == 1,
                  "one_hot: labels must be [B, 1, ...] class indices, got ",
                  labels.defined() ? labels.sizes() : at::IntArrayRef{});
  const at::Tensor indices = labels.to(at::kLong);  // floats truncate, as MONAI's labels.long()
  if (indices.numel() > 0) {
    const auto [lo_t, hi_t] = at::aminmax(indices);
    const at::Tensor range = at::stack({lo_t, hi_t}).cpu();
    const std::int64_t lo = range[0].item<std::int64_t>(), hi = range[1].item<std::int64_t>();
    MEDFAST_CHECK_T(ValueError, lo >= 0 && hi < num_classes, "one_hot: labels must lie in [0, ", num_classes,
                    "), got values from ", lo, " to ", hi);
  }
  return scatter_one_hot(indices, num_classes);
}

at::Tensor argmax_one_hot(const at::Tensor& logits) {
  MEDFAST_CHECK_T(ValueError, logits.defined() && logits.dim() >= 2 && logits.size(1) >= 1,
                  "argmax_one_hot: expected scores [B, C, ...], got ",
                  logits.defined() ? logits.sizes() : at::IntArrayRef{});
  return scatter_one_hot(logits.argmax(1, /*keepdim=*/true), logits.size(1));
}

}  // namespace medfast::train
