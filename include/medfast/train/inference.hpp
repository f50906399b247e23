#pragma once
/// \file
/// Sliding-window inference with MONAI 1.3's semantics
/// (monai.inferers.sliding_window_inference, tensor outputs of the window's size).
///
/// The protocol, per spatial axis: roi entries <= 0 take the input's size; an
/// axis shorter than the roi is padded to it, floor(diff / 2) before and the rest
/// after; the scan interval is the roi where the roi equals the (padded) size,
/// else max(int(roi * (1 - overlap)), 1); window starts are 0, i, 2i, ... up to
/// the first window that reaches the end, which is pulled back to end at the
/// border. Windows enumerate the axes with the first axis slowest; the windows of
/// all images are numbered image-major and go to the predictor in consecutive
/// groups of sw_batch_size (a group may span two images). Each prediction is
/// multiplied by the importance map and summed into the output, the summed
/// weights into a count map; the output is divided by the count map and the
/// padding cropped. Only one group of windows is alive at a time.
///
/// Deviations from MONAI: the output is float32 whatever the input's and the
/// predictor's dtypes (MONAI accumulates in the input's dtype and weights a
/// half-precision prediction in half precision); the predictor's output must have
/// the window's spatial size (MONAI also accepts zoomed outputs); padding_mode has
/// no "circular".

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"

namespace medfast::train {

/// How overlapping windows are weighted (MONAI's BlendMode).
enum class BlendMode { constant, gaussian };
constexpr std::array<Choice<BlendMode>, 2> choices(BlendMode) {
  return {{{BlendMode::constant, "constant"}, {BlendMode::gaussian, "gaussian"}}};
}
/// How an input smaller than the window is padded (MONAI's PytorchPadMode less circular).
enum class PadMode { constant, reflect, replicate };
constexpr std::array<Choice<PadMode>, 3> choices(PadMode) {
  return {{{PadMode::constant, "constant"}, {PadMode::reflect, "reflect"}, {PadMode::replicate, "replicate"}}};
}

struct SlidingWindowOptions {
  std::vector<std::int64_t> roi_size{96, 96, 96};  ///< entries <= 0 mean "the input's size" (MONAI)
  std::int64_t sw_batch_size = 4;                  ///< windows per predictor call
  double overlap = 0.25;                           ///< [0, 1)
  BlendMode mode = BlendMode::constant;
  double sigma_scale = 0.125;                      ///< gaussian sigma = sigma_scale * roi (per axis)
  PadMode padding_mode = PadMode::constant;
  double cval = 0.0;                               ///< fill value of constant padding
  std::string device;                              ///< where the output is accumulated ("" = the input's device)

  static constexpr auto fields() {
    using O = SlidingWindowOptions;
    return std::make_tuple(
        field("roi_size", &O::roi_size, "window size (one number: every axis; <= 0: the input's size)").repeats(3),
        field("sw_batch_size", &O::sw_batch_size, "windows per network call"),
        field("overlap", &O::overlap, "overlap of neighbouring windows, in [0, 1)"),
        field("mode", &O::mode, "blending of overlaps"),
        field("sigma_scale", &O::sigma_scale, "gaussian: sigma as a fraction of the window"),
        field("padding_mode", &O::padding_mode, "padding of small inputs"),
        field("cval", &O::cval, "fill value of constant padding"),
        field("device", &O::device, "where the output is accumulated (empty: the input's device)"));
  }
  /// Throws ValueError naming the argument and the bad value.
  void validate() const;
  /// Reads the keys above from a JSON mapping (roi_size may be one integer for all
  /// three axes). Unknown keys and wrong types throw FormatError, values out of
  /// range ValueError; messages start with `where` ("where.key: ...").
  static SlidingWindowOptions from_json(const nlohmann::json& j,
                                        const std::string& where = "validation.sliding_window");
};

/// [n, C_in, roi...] -> [n, C_out, roi...]
using Predictor = std::function<at::Tensor(const at::Tensor&)>;

/// Test-time augmentation: none, or nnU-Net's mirroring (flips).
enum class Tta { none, flips };
constexpr std::array<Choice<Tta>, 2> choices(Tta) { return {{{Tta::none, "none"}, {Tta::flips, "flips"}}}; }

/// Network calls per window with `tta` over `spatial` axes: 1, or 2^spatial with flips.
std::int64_t tta_forwards(Tta tta, std::int64_t spatial);

/// `predictor` with test-time augmentation. flips: each window and its mirror images along
/// every non-empty subset of the spatial axes (7 more in 3D), each output flipped back, the
/// logits summed in float32 in a fixed order (the identity first) and divided by their
/// number (nnU-Net's mirroring averages logits). The mirrored copies go to `predictor`
/// window by window, all mirror images of a window side by side, n at a time for a call of
/// n windows: a forward batch is as large as without TTA and holds a window's mirror images
/// together; there are 2^spatial times as many. none: `predictor` itself.
Predictor with_tta(Predictor predictor, Tta tta);

/// input [B, C_in, X, Y, Z] (any number of spatial axes matching roi_size; reflect
/// and replicate padding need 1 to 3); returns [B, C_out, X, Y, Z], float32, on
/// options.device, as MONAI computes it (see the file comment). The windows given
/// to the predictor are on the input's device. The result carries no gradient:
/// call it under at::NoGradGuard so that the predictor keeps none either.
at::Tensor sliding_window_inference(const at::Tensor& input, const Predictor& predictor,
                                    const SlidingWindowOptions& options);

/// The labels of sliding_window_inference's output without holding that output:
/// argmax over the channels (uint8 [B, 1, X, Y, Z]) or, with `sigmoid`, each channel > 0
/// (uint8 [B, C, X, Y, Z]), equal to predicted labels of the whole output (tested). The
/// weighted sums are kept for roi_size[0] rows of the first spatial axis only: windows
/// come first axis slowest, so rows before the next window's start are final; they are
/// divided by their weights (the same float32 operations, in the same order, as the whole
/// output), labelled and dropped, `finish_bytes` of divided values at a time. The rows are
/// held in a ring (no row is moved), and where the output is on the windows' device each
/// prediction is weighted straight into it (addcmul: no weighted copy of a batch; where the
/// kernel fuses multiply and add, one rounding less than MONAI's). Peak
/// memory: C x roi_x x Y x Z floats instead of C x X x Y x Z. `nonfinite`: values of the
/// divided output that were NaN or infinite.
struct SlidingWindowLabels {
  at::Tensor labels;
  std::int64_t nonfinite = 0;  ///< blended outputs that are NaN or infinite
  std::int64_t classes = 0;    ///< the predictor's output channels
};
SlidingWindowLabels sliding_window_labels(const at::Tensor& input, const Predictor& predictor,
                                          const SlidingWindowOptions& options, bool sigmoid,
                                          std::int64_t finish_bytes = std::int64_t{16} << 20);

/// The importance map MONAI uses for a window: ones, or the product over axes of
/// exp(-x^2 / (2 sigma^2)) with x centred on the window and sigma = sigma_scale * roi
/// (not normalised: the peak is 1 for odd sizes, a little less for even ones),
/// raised to at least max(its minimum, 1e-3). float32 on `device`.
at::Tensor importance_map(const std::vector<std::int64_t>& roi_size, BlendMode mode, double sigma_scale,
                          c10::Device device);

}  // namespace medfast::train
