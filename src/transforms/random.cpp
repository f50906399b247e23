#include "medfast/transforms/random.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "medfast/core/error.hpp"
#include "medfast/transforms/indices.hpp"

namespace medfast::transforms {

std::vector<Sample> RandomTransform::expand(const Sample& sample, Rng&) const { return {sample}; }

namespace {

// Copies the sample's containers so that transforms replacing tensors do not
// touch the input (tensors themselves are shared until replaced).
Sample shallow_copy(const Sample& s) { return s; }

}  // namespace

std::vector<Sample> RandomChain::run(const Sample& input, std::uint64_t epoch, std::uint64_t item) const {
  // Item-level draws (crop centres) come from the item's generator; every
  // sample has its own generator per stage (a stage ends at each expansion),
  // so no stream is shared or reused.
  Rng item_rng(derive_seed({seed_, epoch, item, 0, 0}));
  std::uint64_t stage = 1;
  std::vector<Sample> samples{shallow_copy(input)};
  std::vector<Rng> rngs{Rng(derive_seed({seed_, epoch, item, stage, 0}))};
  for (std::size_t t = 0; t < transforms_.size(); ++t) {
    const auto& tr = transforms_[t];
    try {
      if (tr->samples() > 1) {
        std::vector<Sample> out;
        for (auto& s : samples) {
          for (auto& m : tr->expand(s, item_rng)) out.push_back(std::move(m));
        }
        samples = std::move(out);
        ++stage;
        rngs.clear();
        for (std::size_t k = 0; k < samples.size(); ++k) rngs.emplace_back(derive_seed({seed_, epoch, item, stage, k}));
      } else {
        for (std::size_t k = 0; k < samples.size(); ++k) tr->apply(samples[k], rngs[k]);
      }
    } catch (...) {
      rethrow_with_context(str("random transform ", t, " (", tr->name(), ")"));
    }
  }
  return samples;
}

std::size_t RandomChain::samples_per_item() const {
  std::size_t n = 1;
  for (const auto& t : transforms_) n *= t->samples();
  return n;
}

nlohmann::json RandomChain::config() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : transforms_) list.push_back({{"name", t->name()}, {"args", t->config()}});
  return {{"seed", seed_}, {"transforms", list}};
}

// ---------------------------------------------------------------------------
// Geometry helpers
// ---------------------------------------------------------------------------

void flip_axis(Sample& s, const std::vector<std::string>& keys, int axis) {
  for (const auto& key : keys) {
    Volume& v = s.volume(key);
    const Shape3 n = spatial_shape(v.data, key);
    v.data = flip_dims(v.data, {axis + 1});
    Affine f;  // new index i maps to old index n-1-i
    f(axis, axis) = -1;
    f(axis, 3) = static_cast<double>(n[axis] - 1);
    v.affine = v.affine * f;
  }
}

void rot90(Sample& s, const std::vector<std::string>& keys, int k, int a, int b) {
  k = ((k % 4) + 4) % 4;
  for (int turn = 0; turn < k; ++turn) {
    // torch.rot90(x, 1, (a, b)) == x.flip(b).transpose(a, b)
    flip_axis(s, keys, b);
    for (const auto& key : keys) {
      Volume& v = s.volume(key);
      v.data = v.data.transpose(a + 1, b + 1);
      Affine p;  // swap index axes a and b
      p(a, a) = 0;
      p(b, b) = 0;
      p(a, b) = 1;
      p(b, a) = 1;
      v.affine = v.affine * p;
    }
  }
}

namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw ValueError(msg);
}

// ---------------------------------------------------------------------------
// Transforms
// ---------------------------------------------------------------------------

struct CropSpec {
  std::vector<std::string> keys;
  std::string label_key;
  Shape3 spatial_size{};
  double pos = 1, neg = 1;
  std::size_t num_samples = 1;
  std::string fg_indices_key, bg_indices_key;
  bool allow_smaller = false;
};

class RandCropByPosNegLabel final : public RandomTransform {
 public:
  explicit RandCropByPosNegLabel(CropSpec c) : c_(std::move(c)) {
    require_keys(c_.keys, "RandCropByPosNegLabel");
    require(c_.pos >= 0 && c_.neg >= 0 && c_.pos + c_.neg > 0,
            "RandCropByPosNegLabel: arguments pos and neg must be non-negative and not both zero");
    require(c_.num_samples >= 1, "RandCropByPosNegLabel: argument num_samples must be at least 1");
    for (auto v : c_.spatial_size) require(v >= 1, "RandCropByPosNegLabel: argument spatial_size must be positive");
  }
  std::string name() const override { return "RandCropByPosNegLabel"; }
  nlohmann::json config() const override {
    return {{"keys", c_.keys},           {"label_key", c_.label_key},
            {"spatial_size", c_.spatial_size}, {"pos", c_.pos},
            {"neg", c_.neg},             {"num_samples", c_.num_samples},
            {"fg_indices_key", c_.fg_indices_key}, {"bg_indices_key", c_.bg_indices_key},
            {"allow_smaller", c_.allow_smaller}};
  }
  std::size_t samples() const override { return c_.num_samples; }
  void apply(Sample&, Rng&) const override { throw Error("RandCropByPosNegLabel produces several samples"); }

  std::vector<Sample> expand(const Sample& s, Rng& rng) const override {
    const Shape3 n = spatial_shape(s.volume(c_.label_key).data, c_.label_key);
    at::Tensor fg, bg;
    if (!c_.fg_indices_key.empty() && s.arrays.count(c_.fg_indices_key)) {
      fg = s.arrays.at(c_.fg_indices_key);
      require(s.arrays.count(c_.bg_indices_key) > 0,
              str("RandCropByPosNegLabel: the sample has ", c_.fg_indices_key, " but no ", c_.bg_indices_key));
      bg = s.arrays.at(c_.bg_indices_key);
    } else {  // no cached indices: compute them (slower; put FgBgToIndices in the cached chain)
      const at::Tensor label = (s.volume(c_.label_key).data > 0).any(0);
      fg = mask_to_runs(label);
      bg = mask_to_runs(label.logical_not());
    }
    fg = fg.to(at::kLong).contiguous();
    bg = bg.to(at::kLong).contiguous();
    const std::int64_t n_fg = runs_count(fg), n_bg = runs_count(bg);
    require(n_fg + n_bg > 0, "RandCropByPosNegLabel: the label has neither foreground nor background indices");
    Shape3 size = c_.spatial_size;
    for (int a = 0; a < 3; ++a) {
      if (size[a] > n[a]) {
        require(c_.allow_smaller, str("RandCropByPosNegLabel: spatial_size ", size[0], "x", size[1], "x", size[2],
                                      " is larger than the image ", n[0], "x", n[1], "x", n[2],
                                      " (set allow_smaller: true, or pad with ResizeWithPadOrCrop/SpatialPad first)"));
        size[a] = n[a];
      }
    }
    const double pos_ratio = c_.pos / (c_.pos + c_.neg);
    std::vector<Sample> out;
    for (std::size_t k = 0; k < c_.num_samples; ++k) {
      const bool use_fg = n_bg == 0 || (n_fg > 0 && rng.uniform() < pos_ratio);
      const at::Tensor& runs = use_fg ? fg : bg;
      const std::int64_t flat = runs_index(runs, rng.integer(0, (use_fg ? n_fg : n_bg) - 1));
      const std::int64_t center[3] = {flat / (n[1] * n[2]), (flat / n[2]) % n[1], flat % n[2]};
      Shape3 start{}, end{};
      for (int a = 0; a < 3; ++a) {
        // MONAI's correct_crop_centers: keep the ROI inside the image.
        const std::int64_t lo = size[a] / 2;
        std::int64_t hi = static_cast<std::int64_t>(static_cast<double>(n[a] + 1) - size[a] / 2.0);
        if (hi == lo) ++hi;
        const std::int64_t c = std::min(std::max(center[a], lo), hi - 1);
        start[a] = c - size[a] / 2;
        end[a] = start[a] + size[a];
      }
      Sample crop = s;
      crop_or_pad(crop, c_.keys, start, end, 0.0, /*compact=*/false);  // a view until a later copy
      crop.arrays.erase(c_.fg_indices_key);
      crop.arrays.erase(c_.bg_indices_key);
      out.push_back(std::move(crop));
    }
    return out;
  }

 private:
  CropSpec c_;
};

class RandSpatialCrop final : public RandomTransform {
 public:
  RandSpatialCrop(std::vector<std::string> keys, Shape3 roi) : keys_(std::move(keys)), roi_(roi) {
    require_keys(keys_, "RandSpatialCrop");
  }
  std::string name() const override { return "RandSpatialCrop"; }
  nlohmann::json config() const override { return {{"keys", keys_}, {"roi_size", roi_}}; }
  void apply(Sample& s, Rng& rng) const override {
    const Shape3 n = spatial_shape(s.volume(keys_[0]).data, keys_[0]);
    Shape3 start{}, end{};
    for (int a = 0; a < 3; ++a) {
      const std::int64_t size = std::min(roi_[a], n[a]);
      start[a] = rng.integer(0, n[a] - size);
      end[a] = start[a] + size;
    }
    crop_or_pad(s, keys_, start, end, 0.0, /*compact=*/false);
  }

 private:
  std::vector<std::string> keys_;
  Shape3 roi_;
};

class RandFlip final : public RandomTransform {
 public:
  RandFlip(std::vector<std::string> keys, double prob, std::vector<int> axes)
      : keys_(std::move(keys)), prob_(prob), axes_(std::move(axes)) {
    require_keys(keys_, "RandFlip");
    for (int a : axes_) require(a >= 0 && a < 3, str("RandFlip: argument spatial_axis: ", a, " is not 0, 1 or 2"));
  }
  std::string name() const override { return "RandFlip"; }
  nlohmann::json config() const override { return {{"keys", keys_}, {"prob", prob_}, {"spatial_axis", axes_}}; }
  void apply(Sample& s, Rng& rng) const override {
    if (!(rng.uniform() < prob_)) return;
    for (int a : axes_) flip_axis(s, keys_, a);
  }

 private:
  std::vector<std::string> keys_;
  double prob_;
  std::vector<int> axes_;
};

class RandRotate90 final : public RandomTransform {
 public:
  RandRotate90(std::vector<std::string> keys, double prob, int max_k, std::array<int, 2> axes)
      : keys_(std::move(keys)), prob_(prob), max_k_(max_k), axes_(axes) {
    require_keys(keys_, "RandRotate90");
    require(max_k_ >= 1, "RandRotate90: argument max_k must be at least 1");
    require(axes_[0] != axes_[1] && axes_[0] >= 0 && axes_[0] < 3 && axes_[1] >= 0 && axes_[1] < 3,
            "RandRotate90: argument spatial_axes must be two different axes of 0, 1, 2");
  }
  std::string name() const override { return "RandRotate90"; }
  nlohmann::json config() const override {
    return {{"keys", keys_}, {"prob", prob_}, {"max_k", max_k_}, {"spatial_axes", axes_}};
  }
  void apply(Sample& s, Rng& rng) const override {
    // MONAI draws k (1..max_k) before deciding whether to rotate.
    const int k = static_cast<int>(rng.integer(0, max_k_ - 1)) + 1;
    if (!(rng.uniform() < prob_)) return;
    rot90(s, keys_, k, axes_[0], axes_[1]);
  }

 private:
  std::vector<std::string> keys_;
  double prob_;
  int max_k_;
  std::array<int, 2> axes_;
};

// Intensity transforms share the draw-then-apply shape.
class RandIntensity : public RandomTransform {
 public:
  RandIntensity(std::string name, std::vector<std::string> keys, double prob)
      : name_(std::move(name)), keys_(std::move(keys)), prob_(prob) {
    require_keys(keys_, name_);
  }
  std::string name() const override { return name_; }
  void apply(Sample& s, Rng& rng) const override {
    if (!(rng.uniform() < prob_)) return;
    const auto params = draw(rng);
    for (const auto& key : keys_) {
      Volume& v = s.volume(key);
      at::Tensor x = at::isFloatingType(v.data.scalar_type()) ? v.data : v.data.to(at::kFloat);
      // A tensor that alone owns its dense storage (a flipped or rotated copy)
      // is changed in place; a view of the cached sample never is.
      const bool owned = x.storage().use_count() == 1 && x.is_non_overlapping_and_dense() &&
                         static_cast<std::size_t>(x.numel()) * x.element_size() == x.storage().nbytes();
      v.data = transform(x, params, rng, owned);
    }
  }

 protected:
  virtual std::vector<double> draw(Rng& rng) const = 0;
  virtual at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng& rng, bool in_place) const = 0;
  std::string name_;
  std::vector<std::string> keys_;
  double prob_;
};

class RandScaleIntensity final : public RandIntensity {
 public:
  RandScaleIntensity(std::vector<std::string> keys, double prob, double lo, double hi)
      : RandIntensity("RandScaleIntensity", std::move(keys), prob), lo_(lo), hi_(hi) {}
  nlohmann::json config() const override { return {{"keys", keys_}, {"prob", prob_}, {"factors", {lo_, hi_}}}; }

 protected:
  std::vector<double> draw(Rng& rng) const override { return {rng.uniform(lo_, hi_)}; }
  at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng&, bool in_place) const override {
    return in_place ? x.mul_(1.0 + p[0]) : x * (1.0 + p[0]);
  }

 private:
  double lo_, hi_;
};

class RandShiftIntensity final : public RandIntensity {
 public:
  RandShiftIntensity(std::vector<std::string> keys, double prob, double lo, double hi)
      : RandIntensity("RandShiftIntensity", std::move(keys), prob), lo_(lo), hi_(hi) {}
  nlohmann::json config() const override { return {{"keys", keys_}, {"prob", prob_}, {"offsets", {lo_, hi_}}}; }

 protected:
  std::vector<double> draw(Rng& rng) const override { return {rng.uniform(lo_, hi_)}; }
  at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng&, bool in_place) const override {
    return in_place ? x.add_(p[0]) : x + p[0];
  }

 private:
  double lo_, hi_;
};

class RandGaussianNoise final : public RandIntensity {
 public:
  RandGaussianNoise(std::vector<std::string> keys, double prob, double mean, double std)
      : RandIntensity("RandGaussianNoise", std::move(keys), prob), mean_(mean), std_(std) {
    require(std_ >= 0, "RandGaussianNoise: argument std must be non-negative");
  }
  nlohmann::json config() const override { return {{"keys", keys_}, {"prob", prob_}, {"mean", mean_}, {"std", std_}}; }

 protected:
  // MONAI 1.3 (sample_std=True): the noise's std is drawn from U(0, std).
  std::vector<double> draw(Rng& rng) const override { return {rng.uniform(0, std_)}; }
  at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng& rng, bool) const override {
    at::Tensor noise = at::empty(x.sizes(), x.options().device(at::kCPU).dtype(at::kFloat));
    float* q = noise.data_ptr<float>();
    for (std::int64_t i = 0; i < noise.numel(); ++i) q[i] = static_cast<float>(mean_ + p[0] * rng.normal());
    return x + noise.to(x.device()).to(x.scalar_type());
  }

 private:
  double mean_, std_;
};

class RandAdjustContrast final : public RandIntensity {
 public:
  RandAdjustContrast(std::vector<std::string> keys, double prob, double lo, double hi)
      : RandIntensity("RandAdjustContrast", std::move(keys), prob), lo_(lo), hi_(hi) {
    require(lo_ > 0 && hi_ >= lo_, "RandAdjustContrast: argument gamma must be a positive range");
  }
  nlohmann::json config() const override { return {{"keys", keys_}, {"prob", prob_}, {"gamma", {lo_, hi_}}}; }

 protected:
  std::vector<double> draw(Rng& rng) const override { return {rng.uniform(lo_, hi_)}; }
  at::Tensor transform(at::Tensor x, const std::vector<double>& p, Rng&, bool) const override {
    const double eps = 1e-7;
    const double mn = x.min().item<double>(), range = x.max().item<double>() - mn;
    return ((x - mn) / (range + eps)).pow(p[0]) * range + mn;
  }

 private:
  double lo_, hi_;
};

// A deterministic transform inside a random chain (ResizeWithPadOrCrop...).
class DeterministicStep final : public RandomTransform {
 public:
  explicit DeterministicStep(TransformPtr t) : t_(std::move(t)) {}
  std::string name() const override { return t_->name(); }
  nlohmann::json config() const override { return t_->config(); }
  void apply(Sample& s, Rng&) const override { t_->apply(s); }

 private:
  TransformPtr t_;
};

std::array<double, 2> range_arg(Args& a, const std::string& key, double fallback) {
  if (!a.has(key)) {
    a.number(key, 0);
    return {-fallback, fallback};
  }
  const auto v = a.numbers(key, 2);  // accepts one number too: then (x, x); widen below
  return {v[0], v[1]};
}

}  // namespace

std::vector<std::string> random_names() {
  return {"RandCropByPosNegLabel", "RandSpatialCrop", "RandFlip", "RandRotate90", "RandScaleIntensity",
          "RandShiftIntensity", "RandGaussianNoise", "RandAdjustContrast"};
}

RandomTransformPtr make_random(const std::string& name, const nlohmann::json& json) {
  const auto known = random_names();
  if (std::find(known.begin(), known.end(), name) == known.end()) {
    return std::make_shared<DeterministicStep>(make(name, json));  // throws for unknown names
  }
  Args a(name, json);
  RandomTransformPtr t;
  const auto three = [](const std::vector<std::int64_t>& v) { return Shape3{v[0], v[1], v[2]}; };
  // A single number x for factors/offsets means (-x, x), as in MONAI.
  const auto symmetric = [&](const std::string& key, double fallback) -> std::array<double, 2> {
    if (a.has(key) && json[key].is_number()) {
      const double x = a.number(key, fallback);
      return {-x, x};
    }
    return range_arg(a, key, fallback);
  };
  if (name == "RandCropByPosNegLabel") {
    CropSpec c;
    c.keys = a.keys();
    c.label_key = a.text("label_key", "label");
    c.spatial_size = three(a.integers("spatial_size", 3));
    c.pos = a.number("pos", 1);
    c.neg = a.number("neg", 1);
    c.num_samples = static_cast<std::size_t>(a.integer("num_samples", 1));
    c.fg_indices_key = a.text("fg_indices_key", "");
    c.bg_indices_key = a.text("bg_indices_key", "");
    c.allow_smaller = a.flag("allow_smaller", false);
    a.text("image_key", "");
    a.number("image_threshold", 0);
    t = std::make_shared<RandCropByPosNegLabel>(c);
  } else if (name == "RandSpatialCrop") {
    const auto keys = a.keys();
    t = std::make_shared<RandSpatialCrop>(keys, three(a.integers("roi_size", 3)));
  } else if (name == "RandFlip") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    std::vector<int> axes;
    if (a.has("spatial_axis")) {
      const auto& v = json["spatial_axis"];
      if (v.is_number_integer()) axes = {v.get<int>()};
      else for (auto i : a.integers("spatial_axis", v.size())) axes.push_back(static_cast<int>(i));
      if (v.is_number_integer()) a.integer("spatial_axis", 0);
    } else {
      a.integer("spatial_axis", 0);
      axes = {0, 1, 2};  // MONAI's None: all spatial axes
    }
    t = std::make_shared<RandFlip>(keys, prob, axes);
  } else if (name == "RandRotate90") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const int max_k = static_cast<int>(a.integer("max_k", 3));
    std::array<int, 2> axes{0, 1};
    if (a.has("spatial_axes")) {
      const auto v = a.integers("spatial_axes", 2);
      axes = {static_cast<int>(v[0]), static_cast<int>(v[1])};
    } else {
      a.integer("spatial_axes", 0);
    }
    t = std::make_shared<RandRotate90>(keys, prob, max_k, axes);
  } else if (name == "RandScaleIntensity") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const auto f = symmetric("factors", 0.1);
    t = std::make_shared<RandScaleIntensity>(keys, prob, f[0], f[1]);
  } else if (name == "RandShiftIntensity") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const auto o = symmetric("offsets", 0.1);
    t = std::make_shared<RandShiftIntensity>(keys, prob, o[0], o[1]);
  } else if (name == "RandGaussianNoise") {
    const auto keys = a.keys();
    t = std::make_shared<RandGaussianNoise>(keys, a.number("prob", 0.1), a.number("mean", 0), a.number("std", 0.1));
  } else if (name == "RandAdjustContrast") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    std::array<double, 2> g{0.5, 4.5};
    if (a.has("gamma")) {
      const auto v = a.numbers("gamma", 2);
      g = {v[0], v[1]};
    } else {
      a.number("gamma", 0);
    }
    t = std::make_shared<RandAdjustContrast>(keys, prob, g[0], g[1]);
  }
  a.finish();
  return t;
}

RandomChain make_random_chain(const nlohmann::json& list, std::uint64_t seed) {
  if (!list.is_array()) throw ValueError(str("random chain: expected a list, got ", list.dump()));
  std::vector<RandomTransformPtr> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto& item = list[i];
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) {
      throw ValueError(str("random chain item ", i, ": expected {\"name\": ..., arguments...}, got ", item.dump()));
    }
    nlohmann::json args = item;
    args.erase("name");
    try {
      out.push_back(make_random(item["name"].get<std::string>(), args));
    } catch (Error& e) {
      e.add_context(str("random chain item ", i));
      throw;
    }
  }
  return RandomChain(std::move(out), seed);
}

}  // namespace medfast::transforms
