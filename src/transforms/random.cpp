#include "medfast/transforms/random.hpp"
#include "medfast/core/trace.hpp"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cmath>

#include "medfast/core/error.hpp"
#include "medfast/transforms/indices.hpp"

namespace medfast::transforms {

std::vector<Sample> RandomTransform::expand(const Sample& sample, Rng&) const { return {sample}; }
bool RandomTransform::compose(SpatialPlan&, const Sample&, Rng&) const { return false; }
bool RandomTransform::compose_index(IndexPlan&, const Sample&, Rng&) const { return false; }

void IndexPlan::flip(const std::string& key, int axis) {
  Key& k = keys[key];
  k.reversed[static_cast<std::size_t>(axis)] = !k.reversed[static_cast<std::size_t>(axis)];
}

void IndexPlan::rot90(const std::string& key, int turns, int a, int b) {
  turns = ((turns % 4) + 4) % 4;
  Key& k = keys[key];
  const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
  for (int t = 0; t < turns; ++t) {  // torch.rot90(x, 1, (a, b)) == x.flip(b).transpose(a, b)
    k.reversed[ub] = !k.reversed[ub];
    std::swap(k.axis[ua], k.axis[ub]);
    std::swap(k.reversed[ua], k.reversed[ub]);
  }
}

void IndexPlan::op(const std::string& key, bool multiply, double value) { keys[key].ops.push_back({multiply, value}); }

namespace {

/// out[c, j0, j1, j2] = ops(in[c, i...]) with i[axis[d]] = reversed[d] ? n - 1 - j_d : j_d.
template <typename T>
void gather_kernel(const at::Tensor& in, at::Tensor& out, const IndexPlan::Key& k) {
  const T* src = in.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  const auto n = in.sizes();
  const auto st = in.strides();
  std::int64_t step[3], start[3];  // per output axis: input stride, and the offset of j_d = 0
  for (int d = 0; d < 3; ++d) {
    const int a = k.axis[static_cast<std::size_t>(d)] + 1;
    const bool rev = k.reversed[static_cast<std::size_t>(d)];
    step[d] = rev ? -st[a] : st[a];
    start[d] = rev ? (n[a] - 1) * st[a] : 0;
  }
  const std::int64_t m0 = out.size(1), m1 = out.size(2), m2 = out.size(3);
  // The ops as (multiply, value) in the values' type, applied in order: the roundings of
  // applying them one tensor at a time.
  std::vector<std::pair<bool, T>> ops;
  for (const auto& o : k.ops) ops.emplace_back(o.multiply, static_cast<T>(o.value));
  const bool plain = ops.empty();
  const bool mul_add = ops.size() == 2 && ops[0].first && !ops[1].first;
  // One row along output axis 2: `load(j)` reads its j-th input value. Written per case so
  // that the common rows (stride +1 or -1, no op or one multiply-add) vectorise.
  auto row = [&](T* q, auto load) {
    if (plain) {
      for (std::int64_t j = 0; j < m2; ++j) q[j] = static_cast<T>(load(j));
    } else if (mul_add) {
      const T a = ops[0].second, b = ops[1].second;
      for (std::int64_t j = 0; j < m2; ++j) {
        const T t = static_cast<T>(load(j)) * a;
        q[j] = t + b;
      }
    } else if (ops.size() == 1) {
      const T x = ops[0].second;
      if (ops[0].first) {
        for (std::int64_t j = 0; j < m2; ++j) q[j] = static_cast<T>(load(j)) * x;
      } else {
        for (std::int64_t j = 0; j < m2; ++j) q[j] = static_cast<T>(load(j)) + x;
      }
    } else {
      for (std::int64_t j = 0; j < m2; ++j) {
        T v = static_cast<T>(load(j));
        for (const auto& [mul, x] : ops) v = mul ? v * x : v + x;
        q[j] = v;
      }
    }
  };
  const std::int64_t s2 = step[2];
  for (std::int64_t c = 0; c < n[0]; ++c) {
    for (std::int64_t j0 = 0; j0 < m0; ++j0) {
      for (std::int64_t j1 = 0; j1 < m1; ++j1) {
        const T* p = src + c * st[0] + start[0] + j0 * step[0] + start[1] + j1 * step[1] + start[2];
        T* q = dst + ((c * m0 + j0) * m1 + j1) * m2;
        if (s2 == 1) {
          row(q, [p](std::int64_t j) { return p[j]; });
        } else if (s2 == -1) {
          row(q, [p](std::int64_t j) { return p[-j]; });
        } else {
          row(q, [p, s2](std::int64_t j) { return p[j * s2]; });
        }
      }
    }
  }
}

/// The same with torch operators (GPU tensors, and dtypes the kernel does not cover).
at::Tensor gather_torch(at::Tensor x, const IndexPlan::Key& k) {
  std::vector<std::int64_t> flips, order{0};
  for (int d = 0; d < 3; ++d) order.push_back(k.axis[static_cast<std::size_t>(d)] + 1);
  x = x.permute(order);
  for (int d = 0; d < 3; ++d) {
    if (k.reversed[static_cast<std::size_t>(d)]) flips.push_back(d + 1);
  }
  if (!flips.empty()) x = x.flip(flips);
  for (const auto& o : k.ops) x = o.multiply ? x * o.value : x + o.value;
  return x.contiguous();
}

}  // namespace

void apply_plan(Sample& s, SpatialPlan& plan) {
  if (!plan.active) return;
  for (const auto& [key, mode] : plan.mode) {
    Volume& v = s.volume(key);
    v.data = resample_index_affine(v.data, plan.out_to_in, plan.shape, mode == "nearest", plan.padding == "zeros",
                                   plan.box_lo, plan.box_hi);
    v.affine = v.affine * plan.out_to_in;
  }
  plan = SpatialPlan{};
}

namespace {

std::pair<std::vector<std::int64_t>, at::ScalarType> index_output(const Sample& s, const IndexPlan& plan,
                                                                  const std::string& key) {
  const Volume& v = s.volume(key);
  auto it = plan.keys.find(key);
  if (it == plan.keys.end()) return {v.data.sizes().vec(), v.data.scalar_type()};
  const Shape3 n = spatial_shape(v.data, key);
  const IndexPlan::Key& k = it->second;
  at::ScalarType t = v.data.scalar_type();
  if (!k.ops.empty() && !at::isFloatingType(t)) t = at::kFloat;  // as the intensity steps do
  return {{v.data.size(0), n[static_cast<std::size_t>(k.axis[0])], n[static_cast<std::size_t>(k.axis[1])],
           n[static_cast<std::size_t>(k.axis[2])]},
          t};
}

void gather_into(const Sample& s, const IndexPlan& plan, const std::string& key, at::Tensor dst) {
  const Volume& v = s.volume(key);
  static const IndexPlan::Key identity;
  auto it = plan.keys.find(key);
  // No steps: still this loop rather than copy_, which would start libtorch's intra-op
  // threads from every loader thread (they then spin, competing with the loader).
  const IndexPlan::Key& k = it == plan.keys.end() ? identity : it->second;
  at::Tensor x = v.data;
  if (!k.ops.empty() && !at::isFloatingType(x.scalar_type())) x = x.to(at::kFloat);
  const at::ScalarType in = x.scalar_type();
  const bool kernel = x.is_cpu() && dst.is_cpu() && dst.is_contiguous() && dst.scalar_type() == in &&
                      (in == at::kFloat || in == at::kDouble || in == at::kByte || in == at::kShort ||
                       in == at::kInt || in == at::kLong || in == at::kChar);
  if (kernel) {
    AT_DISPATCH_ALL_TYPES(in, "gather", [&] { gather_kernel<scalar_t>(x, dst, k); });
  } else {
    dst.copy_(gather_torch(x, k));
  }
}

}  // namespace

std::pair<std::vector<std::int64_t>, at::ScalarType> planned_output(const Sample& s, const PendingSteps& pending,
                                                                    const std::string& key) {
  const SpatialPlan& sp = pending.spatial;
  auto mode = sp.active ? sp.mode.find(key) : sp.mode.end();
  if (mode == sp.mode.end()) return index_output(s, pending.index, key);
  const Volume& v = s.volume(key);
  const bool nearest = mode->second == "nearest";
  const at::ScalarType t = v.data.scalar_type();
  return {{v.data.size(0), sp.shape[0], sp.shape[1], sp.shape[2]},
          nearest || t == at::kFloat || t == at::kDouble ? t : at::kFloat};
}

void write_into(const Sample& s, const PendingSteps& pending, const std::string& key, at::Tensor dst) {
  const SpatialPlan& sp = pending.spatial;
  auto mode = sp.active ? sp.mode.find(key) : sp.mode.end();
  if (mode == sp.mode.end()) {
    gather_into(s, pending.index, key, dst);
    return;
  }
  resample_index_affine_into(s.volume(key).data, sp.out_to_in, sp.shape, mode->second == "nearest",
                             sp.padding == "zeros", sp.box_lo, sp.box_hi, dst);
}

void apply_index_plan(Sample& s, IndexPlan& plan) {
  for (const auto& [key, k] : plan.keys) {
    Volume& v = s.volume(key);
    const Shape3 n = spatial_shape(v.data, key);
    const auto [shape, dtype] = index_output(s, plan, key);
    at::Tensor out = v.data.is_cpu() ? pooled_empty(shape, dtype) : at::empty(shape, v.data.options().dtype(dtype));
    gather_into(s, plan, key, out);
    Affine m;  // output index -> input index
    for (int d = 0; d < 3; ++d) {
      const int a = k.axis[static_cast<std::size_t>(d)];
      const bool rev = k.reversed[static_cast<std::size_t>(d)];
      for (int r = 0; r < 3; ++r) m(r, d) = 0;
      m(a, d) = rev ? -1 : 1;
      m(a, 3) = rev ? static_cast<double>(n[static_cast<std::size_t>(a)] - 1) : 0.0;
    }
    v.data = out;
    v.affine = v.affine * m;
  }
  plan = IndexPlan{};
}

std::vector<Sample> RandomChain::run(const Sample& input, std::uint64_t epoch, std::uint64_t item) const {
  std::vector<PendingSteps> pending;
  std::vector<Sample> samples = run(input, epoch, item, pending);
  trace::Range range("apply_plan", "transform");  // the composed steps' single copy per sample and key
  for (std::size_t k = 0; k < samples.size(); ++k) {
    apply_index_plan(samples[k], pending[k].index);
    apply_plan(samples[k], pending[k].spatial);
  }
  return samples;
}

std::vector<Sample> RandomChain::run(const Sample& input, std::uint64_t epoch, std::uint64_t item,
                                     std::vector<PendingSteps>& pending) const {
  // Item-level draws (crop centres) come from the item's generator; every
  // sample has its own generator per stage (a stage ends at each expansion),
  // so no stream is shared or reused.
  Rng item_rng(derive_seed({seed_, epoch, item, 0, 0}));
  std::uint64_t stage = 1;
  // A copy of the containers: transforms replace tensors in it, never in `input`
  // (the tensors themselves are shared until replaced).
  std::vector<Sample> samples{input};
  std::vector<Rng> rngs{Rng(derive_seed({seed_, epoch, item, stage, 0}))};
  std::vector<SpatialPlan> plans(1);
  std::vector<IndexPlan> index(1);
  auto flush = [&](std::size_t k) {  // pending steps, in the order they were composed
    if (index[k].active()) apply_index_plan(samples[k], index[k]);
    apply_plan(samples[k], plans[k]);
  };
  for (std::size_t t = 0; t < transforms_.size(); ++t) {
    const auto& tr = transforms_[t];
    trace::Range range(tr->name(), "transform");
    try {
      if (tr->expands()) {
        for (std::size_t k = 0; k < samples.size(); ++k) flush(k);
        std::vector<Sample> out;
        for (auto& s : samples) {
          for (auto& m : tr->expand(s, item_rng)) out.push_back(std::move(m));
        }
        samples = std::move(out);
        ++stage;
        rngs.clear();
        for (std::size_t k = 0; k < samples.size(); ++k) rngs.emplace_back(derive_seed({seed_, epoch, item, stage, k}));
        plans.assign(samples.size(), SpatialPlan{});
        index.assign(samples.size(), IndexPlan{});
      } else {
        for (std::size_t k = 0; k < samples.size(); ++k) {
          // Index steps fold in after any pending resampling has been applied; a resampling
          // step first applies pending index steps (it needs the grid they make).
          if (fuse_index_ && tr->index_step()) {
            apply_plan(samples[k], plans[k]);
            tr->compose_index(index[k], samples[k], rngs[k]);
            continue;
          }
          if (index[k].active()) apply_index_plan(samples[k], index[k]);
          if (!tr->compose(plans[k], samples[k], rngs[k])) {
            apply_plan(samples[k], plans[k]);
            tr->apply(samples[k], rngs[k]);
          }
        }
      }
    } catch (...) {
      rethrow_with_context(str("random transform ", t, " (", tr->name(), ")"));
    }
  }
  pending.resize(samples.size());
  for (std::size_t k = 0; k < samples.size(); ++k) {
    pending[k].index = std::move(index[k]);
    pending[k].spatial = std::move(plans[k]);
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
  bool expands() const override { return true; }
  void apply(Sample&, Rng&) const override { throw Error("RandCropByPosNegLabel: internal error: apply() on an expanding transform"); }

  std::vector<Sample> expand(const Sample& s, Rng& rng) const override {
    const Shape3 n = spatial_shape(s.volume(c_.label_key).data, c_.label_key);
    at::Tensor fg, bg;
    if (!c_.fg_indices_key.empty()) {
      if (!s.arrays.count(c_.fg_indices_key)) {  // a misspelt key must not silently recompute every sample
        std::string have;
        for (const auto& [k, v] : s.arrays) have += (have.empty() ? "" : ", ") + k;
        throw ValueError(str("RandCropByPosNegLabel: fg_indices_key '", c_.fg_indices_key,
                             "' is not in the sample (its index arrays: ", have.empty() ? "none" : have,
                             "); FgBgToIndices in the deterministic chain writes <key>_fg_indices and "
                             "<key>_bg_indices (or its fg_postfix/bg_postfix)"));
      }
      fg = s.arrays.at(c_.fg_indices_key);
      require(s.arrays.count(c_.bg_indices_key) > 0,
              str("RandCropByPosNegLabel: the sample has ", c_.fg_indices_key, " but no ", c_.bg_indices_key));
      bg = s.arrays.at(c_.bg_indices_key);
    } else {  // no cached indices: compute them (slower; put FgBgToIndices in the cached chain)
      const at::Tensor label = (s.volume(c_.label_key).data > 0).any(0);
      fg = mask_to_runs(label);
      bg = mask_to_runs(label.logical_not());
    }
    fg = fg.contiguous();  // cached runs are int32 or int64: read as they are, not converted per sample
    bg = bg.contiguous();
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
  bool index_step() const override { return true; }
  bool compose_index(IndexPlan& plan, const Sample& s, Rng& rng) const override {
    for (const auto& key : keys_) (void)s.volume(key);  // a missing key fails as apply() would
    if (!(rng.uniform() < prob_)) return true;
    for (const auto& key : keys_) {
      for (int a : axes_) plan.flip(key, a);
    }
    return true;
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
  bool index_step() const override { return true; }
  bool compose_index(IndexPlan& plan, const Sample& s, Rng& rng) const override {
    for (const auto& key : keys_) (void)s.volume(key);
    const int k = static_cast<int>(rng.integer(0, max_k_ - 1)) + 1;
    if (!(rng.uniform() < prob_)) return true;
    for (const auto& key : keys_) plan.rot90(key, k, axes_[0], axes_[1]);
    return true;
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
  bool index_step() const override {
    bool multiply = false;
    return affine_op(&multiply);
  }
  bool compose_index(IndexPlan& plan, const Sample& s, Rng& rng) const override {
    bool multiply = false;
    if (!affine_op(&multiply)) return false;
    for (const auto& key : keys_) (void)s.volume(key);
    if (!(rng.uniform() < prob_)) return true;
    const auto params = draw(rng);
    for (const auto& key : keys_) plan.op(key, multiply, multiply ? 1.0 + params[0] : params[0]);
    return true;
  }

 protected:
  /// Steps that are x * v (multiply) or x + v: foldable into an index plan.
  virtual bool affine_op(bool* multiply) const { (void)multiply; return false; }
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
  bool affine_op(bool* multiply) const override { return *multiply = true; }

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
  bool affine_op(bool* multiply) const override {
    *multiply = false;
    return true;
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

// Separable Gaussian smoothing: per axis, a kernel of erf-integrated
// Gaussian weights over [-4 sigma, 4 sigma] (normalised), zero padding.
class RandGaussianSmooth final : public RandIntensity {
 public:
  RandGaussianSmooth(std::vector<std::string> keys, double prob, std::array<std::array<double, 2>, 3> sigma)
      : RandIntensity("RandGaussianSmooth", std::move(keys), prob), sigma_(sigma) {
    for (const auto& r : sigma_) {
      require(r[0] >= 0 && r[1] >= r[0], "RandGaussianSmooth: arguments sigma_x/y/z must be non-negative ranges");
    }
  }
  nlohmann::json config() const override {
    return {{"keys", keys_}, {"prob", prob_}, {"sigma_x", sigma_[0]}, {"sigma_y", sigma_[1]}, {"sigma_z", sigma_[2]}};
  }
  static at::Tensor kernel(double sigma) {
    const auto radius = static_cast<std::int64_t>(std::ceil(4.0 * sigma));
    std::vector<double> w(static_cast<std::size_t>(2 * radius + 1));
    double sum = 0;
    for (std::int64_t i = -radius; i <= radius; ++i) {
      const double a = (static_cast<double>(i) - 0.5) / (std::sqrt(2.0) * sigma);
      const double b = (static_cast<double>(i) + 0.5) / (std::sqrt(2.0) * sigma);
      w[static_cast<std::size_t>(i + radius)] = 0.5 * (std::erf(b) - std::erf(a));
      sum += w[static_cast<std::size_t>(i + radius)];
    }
    for (auto& v : w) v /= sum;
    return at::tensor(w, at::kDouble);
  }

 protected:
  std::vector<double> draw(Rng& rng) const override {
    return {rng.uniform(sigma_[0][0], sigma_[0][1]), rng.uniform(sigma_[1][0], sigma_[1][1]),
            rng.uniform(sigma_[2][0], sigma_[2][1])};
  }
  at::Tensor transform(at::Tensor x, const std::vector<double>& sigma, Rng&, bool) const override {
    at::Tensor y = x.unsqueeze(0);  // (1, C, X, Y, Z): channels filtered independently
    const auto channels = x.size(0);
    for (int a = 0; a < 3; ++a) {
      if (sigma[a] <= 0) continue;
      const at::Tensor k = kernel(sigma[a]).to(x.scalar_type()).to(x.device());
      std::vector<std::int64_t> shape{1, 1, 1, 1, 1}, pad{0, 0, 0};
      shape[a + 2] = k.size(0);
      pad[a] = (k.size(0) - 1) / 2;
      const at::Tensor weight = k.view(shape).expand({channels, 1, shape[2], shape[3], shape[4]}).contiguous();
      y = at::conv3d(y, weight, {}, {1, 1, 1}, pad, {1, 1, 1}, channels);
    }
    return y.squeeze(0);
  }

 private:
  std::array<std::array<double, 2>, 3> sigma_;
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

// ResizeWithPadOrCrop after composable transforms: a shift of the output grid.
class ComposableResize final : public RandomTransform {
 public:
  ComposableResize(TransformPtr t, std::vector<std::string> keys, Shape3 size)
      : t_(std::move(t)), keys_(std::move(keys)), size_(size) {}
  std::string name() const override { return t_->name(); }
  nlohmann::json config() const override { return t_->config(); }
  void apply(Sample& s, Rng&) const override { t_->apply(s); }
  bool compose(SpatialPlan& plan, const Sample&, Rng&) const override {
    if (!plan.active) return false;
    for (const auto& k : keys_) {
      if (!plan.mode.count(k)) return false;
    }
    Affine shift;  // new output index o -> plan output index o + start
    for (int a = 0; a < 3; ++a) {
      const std::int64_t n = plan.shape[a], t = size_[a];
      const std::int64_t start = n < t ? -((t - n) / 2) : n / 2 - t / 2;
      shift(a, 3) = static_cast<double>(start);
      // Voxels outside the previous grid are the resize's constant padding.
      plan.box_lo[a] = std::max<std::int64_t>(0, plan.box_lo[a] - start);
      plan.box_hi[a] = std::min<std::int64_t>(t, plan.box_hi[a] - start);
    }
    plan.out_to_in = plan.out_to_in * shift;
    plan.shape = size_;
    return true;
  }

 private:
  TransformPtr t_;
  std::vector<std::string> keys_;
  Shape3 size_;
};

// RandRotate, RandZoom and RandAffine: an index-space affine about the volume
// centre (output shape kept), drawn per sample and composed into the plan.
struct AffineSpec {
  std::string name;
  std::vector<std::string> keys;
  std::vector<std::string> mode;
  double prob = 0.1;
  std::array<std::array<double, 2>, 3> rotate{};     // radians per axis
  std::array<std::array<double, 2>, 3> scale{};      // zoom factors (RandZoom) or 1+range (RandAffine)
  std::array<std::array<double, 2>, 3> translate{};  // voxels
  bool isotropic_zoom = false;
  std::string padding = "border";
};

Affine rotation(double ax, double ay, double az) {
  // MONAI's create_rotate for 3-D: Rz @ Ry @ Rx.
  Affine rx, ry, rz;
  rx.m = {{{1, 0, 0, 0}, {0, std::cos(ax), -std::sin(ax), 0}, {0, std::sin(ax), std::cos(ax), 0}, {0, 0, 0, 1}}};
  ry.m = {{{std::cos(ay), 0, std::sin(ay), 0}, {0, 1, 0, 0}, {-std::sin(ay), 0, std::cos(ay), 0}, {0, 0, 0, 1}}};
  rz.m = {{{std::cos(az), -std::sin(az), 0, 0}, {std::sin(az), std::cos(az), 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}}};
  return rz * ry * rx;
}

class RandAffineFamily final : public RandomTransform {
 public:
  explicit RandAffineFamily(AffineSpec a) : a_(std::move(a)) {
    require_keys(a_.keys, a_.name);
    if (a_.mode.empty()) a_.mode.assign(a_.keys.size(), "bilinear");
    require(a_.mode.size() == a_.keys.size(), str(a_.name, ": argument mode: one mode per key"));
    for (const auto& m : a_.mode) {
      require(m == "bilinear" || m == "nearest", str(a_.name, ": argument mode: '", m, "' is not bilinear or nearest"));
    }
    require(a_.padding == "border" || a_.padding == "zeros",
            str(a_.name, ": argument padding_mode: '", a_.padding, "' is not border or zeros"));
  }
  std::string name() const override { return a_.name; }
  nlohmann::json config() const override {
    return {{"keys", a_.keys}, {"mode", a_.mode}, {"prob", a_.prob}, {"rotate", a_.rotate},
            {"scale", a_.scale}, {"translate", a_.translate}, {"padding_mode", a_.padding}};
  }
  void apply(Sample& s, Rng& rng) const override {
    SpatialPlan plan;
    if (compose(plan, s, rng)) apply_plan(s, plan);
  }
  bool compose(SpatialPlan& plan, const Sample& s, Rng& rng) const override {
    if (plan.active) {
      for (const auto& k : a_.keys) {
        if (!plan.mode.count(k)) return false;  // a different key set: apply the pending plan first
      }
      if (plan.box_lo != Shape3{0, 0, 0} || plan.box_hi != plan.shape) return false;  // after a folded-in pad
    }
    const bool apply = rng.uniform() < a_.prob;
    double rot[3], scl[3], tr[3];
    for (int i = 0; i < 3; ++i) rot[i] = rng.uniform(a_.rotate[i][0], a_.rotate[i][1]);
    for (int i = 0; i < 3; ++i) scl[i] = rng.uniform(a_.scale[i][0], a_.scale[i][1]);
    if (a_.isotropic_zoom) scl[1] = scl[2] = scl[0];
    for (int i = 0; i < 3; ++i) tr[i] = rng.uniform(a_.translate[i][0], a_.translate[i][1]);
    if (!plan.active) {
      plan.active = true;
      plan.out_to_in = Affine();
      plan.shape = spatial_shape(s.volume(a_.keys[0]).data, a_.keys[0]);
      plan.box_lo = {0, 0, 0};
      plan.box_hi = plan.shape;
      for (std::size_t i = 0; i < a_.keys.size(); ++i) plan.mode[a_.keys[i]] = a_.mode[i];
      plan.padding = a_.padding;
    }
    if (!apply) return true;
    // About the centre of the current output grid: o -> c + A^-1 (o - c) - t.
    Affine centre, uncentre, scale;
    for (int i = 0; i < 3; ++i) {
      const double c = (static_cast<double>(plan.shape[i]) - 1) / 2.0;
      centre(i, 3) = c;
      uncentre(i, 3) = -c - tr[i];
      scale(i, i) = scl[i];
    }
    const Affine forward = rotation(rot[0], rot[1], rot[2]) * scale;  // input -> output, about the centre
    plan.out_to_in = plan.out_to_in * centre * forward.inverse() * uncentre;
    return true;
  }

 private:
  AffineSpec a_;
};

}  // namespace

std::vector<std::string> random_names() {
  return {"RandCropByPosNegLabel", "RandSpatialCrop", "RandFlip", "RandRotate90", "RandRotate", "RandZoom",
          "RandAffine", "RandScaleIntensity", "RandShiftIntensity", "RandGaussianNoise", "RandGaussianSmooth",
          "RandAdjustContrast"};
}

/// RandRotate, RandZoom and RandAffine's arguments as one spec (MONAI's names and defaults).
AffineSpec affine_spec(const std::string& name, Args& a, const nlohmann::json& json) {
  AffineSpec sp;
  sp.name = name;
  sp.keys = a.keys();
  sp.prob = a.number("prob", 0.1);
  sp.mode = a.per_key("mode", "bilinear", sp.keys.size());
  sp.padding = a.text("padding_mode", name == "RandAffine" ? "zeros" : "border");
  for (auto& r : sp.scale) r = {1, 1};
  auto range = [&](const std::string& key, double scale_by) -> std::array<double, 2> {
    if (a.has(key) && json[key].is_number()) {
      const double x = a.number(key, 0) * scale_by;
      return {-x, x};
    }
    const auto v = a.numbers(key, 2, {0, 0});
    return {v[0] * scale_by, v[1] * scale_by};
  };
  if (name == "RandRotate") {
    sp.rotate = {range("range_x", 1), range("range_y", 1), range("range_z", 1)};
    a.flag("keep_size", true);
  } else if (name == "RandZoom") {
    const double lo = a.number("min_zoom", 0.9), hi = a.number("max_zoom", 1.1);
    require(lo > 0 && hi >= lo, "RandZoom: arguments min_zoom and max_zoom must be a positive range");
    for (auto& r : sp.scale) r = {lo, hi};
    sp.isotropic_zoom = true;
    a.flag("keep_size", true);
  } else {
    const auto per_axis = [&](const std::string& key) -> std::array<std::array<double, 2>, 3> {
      const auto v = a.numbers(key, 3, {0, 0, 0});
      return {{{-v[0], v[0]}, {-v[1], v[1]}, {-v[2], v[2]}}};
    };
    sp.rotate = per_axis("rotate_range");
    const auto sr = per_axis("scale_range");
    for (int i = 0; i < 3; ++i) sp.scale[i] = {1 + sr[i][0], 1 + sr[i][1]};
    sp.translate = per_axis("translate_range");
  }
  return sp;
}

RandomTransformPtr make_random(const std::string& name, const nlohmann::json& json) {
  const auto known = random_names();
  if (std::find(known.begin(), known.end(), name) == known.end()) {
    TransformPtr t = make(name, json);  // throws for unknown names
    if (name == "ResizeWithPadOrCrop") {
      Args r(name, json);
      const auto keys = r.keys();
      const auto size = r.integers("spatial_size", 3);
      return std::make_shared<ComposableResize>(t, keys, Shape3{size[0], size[1], size[2]});
    }
    return std::make_shared<DeterministicStep>(t);
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
    const auto v = a.numbers(key, 2, {-fallback, fallback});
    return {v[0], v[1]};
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
    // One axis, a list of them, or (absent, MONAI's None) all spatial axes.
    const auto& given = json.contains("spatial_axis") ? json["spatial_axis"] : nlohmann::json();
    const auto list = a.integers("spatial_axis", given.is_array() ? given.size() : 1, {0, 1, 2});
    const std::vector<int> axes(list.begin(), list.end());
    t = std::make_shared<RandFlip>(keys, prob, axes);
  } else if (name == "RandRotate90") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const int max_k = static_cast<int>(a.integer("max_k", 3));
    const auto v = a.integers("spatial_axes", 2, {0, 1});
    const std::array<int, 2> axes{static_cast<int>(v[0]), static_cast<int>(v[1])};
    t = std::make_shared<RandRotate90>(keys, prob, max_k, axes);
  } else if (name == "RandRotate" || name == "RandZoom" || name == "RandAffine") {
    t = std::make_shared<RandAffineFamily>(affine_spec(name, a, json));
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
  } else if (name == "RandGaussianSmooth") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    std::array<std::array<double, 2>, 3> sigma{};
    const char* names[3] = {"sigma_x", "sigma_y", "sigma_z"};
    for (int i = 0; i < 3; ++i) {
      const auto v = a.numbers(names[i], 2, {0.25, 1.5});  // MONAI's default range
      sigma[i] = {v[0], v[1]};
    }
    t = std::make_shared<RandGaussianSmooth>(keys, prob, sigma);
  } else if (name == "RandAdjustContrast") {
    const auto keys = a.keys();
    const double prob = a.number("prob", 0.1);
    const auto g = a.numbers("gamma", 2, {0.5, 4.5});
    t = std::make_shared<RandAdjustContrast>(keys, prob, g[0], g[1]);
  }
  a.finish();
  return t;
}

RandomChain make_random_chain(const nlohmann::json& list, std::uint64_t seed) {
  std::vector<RandomTransformPtr> out;
  for_each_chain_item(list, "random chain", [&](const std::string& name, const nlohmann::json& args) {
    out.push_back(make_random(name, args));
  });
  return RandomChain(std::move(out), seed);
}

}  // namespace medfast::transforms
