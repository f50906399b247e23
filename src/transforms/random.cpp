// The random transforms' engine: RandomTransform's defaults, the index plan and its gather
// kernels, apply_plan / apply_index_plan / planned_output / write_into, RandomChain, the
// geometry helpers (flip_axis, rot90) and make_random_chain. The transforms themselves are in
// random_crop.cpp, random_intensity.cpp and random_affine.cpp; make_random in random_registry.cpp.
#include "medfast/transforms/random.hpp"
#include "medfast/core/trace.hpp"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/os/memory.hpp"

namespace medfast::transforms {

std::vector<Sample> RandomTransform::expand(const Sample& sample, Rng&) const { return {sample}; }

Expansion RandomTransform::expansion(const Sample& sample) const {
  const std::uint64_t each = sample.bytes() + kSampleOverheadBytes;
  return {static_cast<long double>(samples()) * each, str(samples(), " samples of ", format_bytes(each))};
}

void check_batch_memory(long double bytes, const std::string& what, std::uint64_t max_batch_bytes) {
  if (bytes <= static_cast<long double>(kBatchCheckFloorBytes) && (max_batch_bytes == 0 || bytes <= max_batch_bytes)) {
    return;
  }
  std::string limit;
  std::uint64_t allowed = max_batch_bytes;
  if (max_batch_bytes > 0) {
    limit = str("data.loader.max_batch_bytes (", format_bytes(max_batch_bytes), ")");
  } else {
    allowed = os::available_memory_bytes();
    if (allowed == 0) return;  // not known here
    limit = str("the memory available (", format_bytes(allowed),
                ": MemAvailable, within a cgroup's limit; data.loader.max_batch_bytes sets another limit)");
  }
  if (bytes <= static_cast<long double>(allowed)) return;
  // Past 2^64 bytes (num_samples: 10^18) format_bytes cannot say how much.
  const std::string amount = bytes < 1.8e19L ? format_bytes(static_cast<std::uint64_t>(bytes)) : "more than 16 EiB";
  throw ValueError(str(what, " would take about ", amount, ", more than ", limit));
}
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
    v.data = resample_index_affine(v.data, plan.out_to_in, plan.shape, mode == Interp::nearest, plan.padding == GridPadding::zeros,
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
  const bool nearest = mode->second == Interp::nearest;
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
  resample_index_affine_into(s.volume(key).data, sp.out_to_in, sp.shape, mode->second == Interp::nearest,
                             sp.padding == GridPadding::zeros, sp.box_lo, sp.box_hi, dst);
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
  const OutputLimit limit(max_output_bytes_);
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
  const OutputLimit limit(max_output_bytes_);
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
        // What the expansion would make, before it makes it (num_samples: 10^8 crops).
        long double need = 0;
        std::string what;
        for (const auto& s : samples) {
          const Expansion e = tr->expansion(s);
          need += e.bytes;
          if (what.empty()) what = e.what;
        }
        if (samples.size() > 1) what = str(samples.size(), " samples, each to ", what);
        check_batch_memory(need, what, max_batch_bytes_);
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

RandomChain::RandomChain(std::vector<RandomTransformPtr> transforms, std::uint64_t seed,
                         std::vector<nlohmann::json> arguments)
    : transforms_(std::move(transforms)), arguments_(std::move(arguments)), seed_(seed) {
  if (arguments_.size() != transforms_.size()) {
    throw Error(str("random chain: ", arguments_.size(), " argument lists for ", transforms_.size(), " transforms"));
  }
}

nlohmann::json RandomChain::config() const {
  nlohmann::json list = nlohmann::json::array();
  for (std::size_t i = 0; i < transforms_.size(); ++i) {
    list.push_back({{"name", transforms_[i]->name()}, {"args", arguments_[i]}});
  }
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

RandomChain make_random_chain(const nlohmann::json& list, std::uint64_t seed) {
  std::vector<RandomTransformPtr> out;
  std::vector<nlohmann::json> arguments;
  for_each_chain_item(list, "random chain", [&](const std::string& name, const nlohmann::json& args) {
    out.push_back(make_random(name, args, &arguments.emplace_back()));
  });
  return RandomChain(std::move(out), seed, std::move(arguments));
}

}  // namespace medfast::transforms
