#include "detail.hpp"

#include "medfast/train/metrics.hpp"

namespace medfast::train::detail {

c10::Device parse_device(const std::string& name, const std::string& what) {
  try {
    return c10::Device(name);
  } catch (const c10::Error&) {
    throw ValueError(str(what, ": '", name, "' is not a device (cpu, cuda, cuda:N)"));
  }
}

c10::Device usable_device(const std::string& name, const std::string& what) {
  const c10::Device device = parse_device(name, what);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw ValueError(str(what, " ", name, ": libtorch has no usable CUDA device here"));
  }
  return device;
}

CaseScores score_case(const Sample& s, const RunConfig& c, const Predictor& predict, c10::Device device, bool hd95,
                      const std::string& where) {
  const Volume& img = s.volume(c.train.image_key);
  const Volume& lab = s.volume(c.train.label_key);
  const at::Tensor x = img.data.unsqueeze(0).to(device, at::kFloat);
  const at::Tensor logits = with_context(where, [&] { return sliding_window_inference(x, predict, c.sliding_window); });
  const MetricInputs m =
      with_context(where, [&] { return metric_inputs(logits, lab.data.unsqueeze(0).to(device), c.loss.sigmoid); });
  CaseScores r;
  r.dice = dice_per_class(m.pred, m.target, m.include_background);
  if (hd95) {
    const auto sp = lab.spacing();
    r.hd95 = hausdorff95_per_class(m.pred, m.target, m.include_background, {sp[0], sp[1], sp[2]});
  }
  return r;
}

}  // namespace medfast::train::detail
