// The resampling engine (include/medfast/transforms/resample.hpp): Spacing's output grid,
// Orientation's plan, and one-pass resampling through axis tables (axis-aligned maps) or
// an index-space affine (RandAffine and friends), with scalar and AVX2 kernels that give
// the same bits. The spatial transforms (spatial.cpp) and the random chain (random*.cpp)
// call it; nothing here knows a transform.
#include "medfast/transforms/resample.hpp"

#include "resample_detail.hpp"

#include "kernel_for.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#include <immintrin.h>
#endif

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <optional>
#include <type_traits>
#include <cmath>
#include <cstring>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/image/volume.hpp"
#include "medfast/transforms/transform.hpp"


namespace medfast::transforms {

namespace {

// Upper-triangular U with U^T U = S (S symmetric positive definite).
Mat3 cholesky_upper(const Mat3& s) {
  Mat3 l{};  // lower: S = L L^T, then U = L^T
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j <= i; ++j) {
      double sum = s[i][j];
      for (int k = 0; k < j; ++k) sum -= l[i][k] * l[j][k];
      if (i == j) {
        if (sum <= 0) throw ValueError("Spacing: the affine's 3x3 part is singular");
        l[i][i] = std::sqrt(sum);
      } else {
        l[i][j] = sum / l[j][j];
      }
    }
  }
  Mat3 u{};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) u[i][j] = l[j][i];
  return u;
}

Mat3 inverse_upper(const Mat3& u) {
  Mat3 inv{};
  for (int i = 2; i >= 0; --i) {
    inv[i][i] = 1.0 / u[i][i];
    for (int j = i + 1; j < 3; ++j) {
      double sum = 0;
      for (int k = i + 1; k <= j; ++k) sum += u[i][k] * inv[k][j];
      inv[i][j] = -sum / u[i][i];
    }
  }
  return inv;
}

bool same_orientation(const Affine& a, const Affine& b) {
  const auto x = io_orientation(a), y = io_orientation(b);
  for (int i = 0; i < 3; ++i) {
    if (x[i].out_axis != y[i].out_axis || x[i].sign != y[i].sign) return false;
  }
  return true;
}

}  // namespace

namespace detail {

Affine translate(const Affine& a, const Shape3& voxels) {
  Affine t;
  for (int i = 0; i < 3; ++i) t(i, 3) = static_cast<double>(voxels[i]);
  return a * t;
}

}  // namespace detail

Shape3 spatial_shape(const at::Tensor& data, const std::string& what) {
  if (!data.defined() || data.dim() != 4) {
    const std::string got = data.defined() ? str(data.dim(), " dimensions ", data.sizes()) : std::string("no data");
    const std::string hint = !data.defined() || data.dim() > 4 ? ""
                             : data.dim() == 3 ? "; a 3-D volume without its channel axis: put EnsureChannelFirst "
                                                 "before this step (a 2-D image with one: medfast trains 3D images)"
                                               : "; put EnsureChannelFirst before this step";
    throw ValueError(str(what, ": expected a channel-first volume (C, X, Y, Z), got ", got, hint));
  }
  return {data.size(1), data.size(2), data.size(3)};
}

namespace {
constexpr double kHugeExtent = 1e15;  // voxels per axis; far above any memory
}  // namespace

Geometry spacing_geometry(const Shape3& shape, const Affine& affine, const std::array<double, 3>& pixdim) {
  // zoom_affine(affine, pixdim, diagonal=False): keep the rotation, set the scales.
  const Mat3 rzs = affine.linear();
  Mat3 sym{};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) sym[i][j] += rzs[k][i] * rzs[k][j];
  const Mat3 zs = cholesky_upper(sym);
  const Mat3 zs_inv = inverse_upper(zs);
  Affine out;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      double rs = 0;
      for (int k = 0; k < 3; ++k) rs += rzs[i][k] * zs_inv[k][j];
      const double s = (zs[j][j] < 0 ? -1.0 : 1.0) * std::abs(pixdim[j] == 0 ? 1.0 : pixdim[j]);
      out(i, j) = rs * s;
    }
  }
  // compute_shape_offset: corners (0 or n-1 per axis) in the new index space.
  const Affine to_out = out.inverse() * affine;
  double lo[3] = {1e300, 1e300, 1e300}, hi[3] = {-1e300, -1e300, -1e300};
  double wlo[3] = {1e300, 1e300, 1e300};
  for (int c = 0; c < 8; ++c) {
    const double p[3] = {(c & 1) ? static_cast<double>(shape[0] - 1) : 0.0,
                         (c & 2) ? static_cast<double>(shape[1] - 1) : 0.0,
                         (c & 4) ? static_cast<double>(shape[2] - 1) : 0.0};
    for (int i = 0; i < 3; ++i) {
      const double q = to_out(i, 0) * p[0] + to_out(i, 1) * p[1] + to_out(i, 2) * p[2] + to_out(i, 3);
      const double w = affine(i, 0) * p[0] + affine(i, 1) * p[1] + affine(i, 2) * p[2] + affine(i, 3);
      lo[i] = std::min(lo[i], q);
      hi[i] = std::max(hi[i], q);
      wlo[i] = std::min(wlo[i], w);
    }
  }
  Geometry g;
  for (int i = 0; i < 3; ++i) {
    const double extent = std::nearbyint(hi[i] - lo[i] + 1.0);  // numpy round: half to even
    // A broken affine (huge, tiny or non-finite spacings) must not overflow the cast:
    // saturate, and let the caller's size check name the cause.
    g.shape[i] = !(extent < kHugeExtent) ? static_cast<std::int64_t>(kHugeExtent)
                                         : std::max<std::int64_t>(1, static_cast<std::int64_t>(extent));
  }
  const bool same = same_orientation(affine, out);
  for (int i = 0; i < 3; ++i) out(i, 3) = same ? affine(i, 3) : wlo[i];
  g.affine = out;
  return g;
}

OrientationPlan orientation_plan(const Shape3& shape, const Affine& affine, const std::string& axcodes) {
  if (axcodes.size() != 3) throw ValueError(str("Orientation: axcodes '", axcodes, "' must be three letters"));
  std::array<AxisOrientation, 3> target{};
  std::array<bool, 3> used{};
  for (int i = 0; i < 3; ++i) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(axcodes[i])));
    int axis = -1, sign = 1;
    switch (c) {
      case 'R': axis = 0; break;
      case 'L': axis = 0; sign = -1; break;
      case 'A': axis = 1; break;
      case 'P': axis = 1; sign = -1; break;
      case 'S': axis = 2; break;
      case 'I': axis = 2; sign = -1; break;
      default: throw ValueError(str("Orientation: axcodes '", axcodes, "': '", axcodes[i], "' is not one of RLAPSI"));
    }
    if (used[axis]) throw ValueError(str("Orientation: axcodes '", axcodes, "' names an axis twice"));
    used[axis] = true;
    target[i] = {axis, sign};
  }
  const auto source = io_orientation(affine);
  // ornt_transform(source, target): input axis i goes to output axis k, flipped or not.
  OrientationPlan plan;
  std::array<int, 3> to_axis{};
  std::array<int, 3> flips{};
  for (int i = 0; i < 3; ++i) {
    if (source[i].out_axis < 0) throw ValueError("Orientation: the affine has a zero column; cannot orient it");
    for (int k = 0; k < 3; ++k) {
      if (target[k].out_axis == source[i].out_axis) {
        to_axis[i] = k;
        flips[i] = source[i].sign == target[k].sign ? 1 : -1;
      }
    }
  }
  for (int i = 0; i < 3; ++i) {
    plan.source_axis[to_axis[i]] = i;
    plan.flip[to_axis[i]] = flips[i] < 0;
    plan.shape[to_axis[i]] = shape[i];
  }
  // inv_ornt_aff(transform, shape): undo_flip @ undo_reorder.
  Affine undo_reorder;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) undo_reorder(i, j) = 0;
  for (int i = 0; i < 3; ++i) undo_reorder(i, to_axis[i]) = 1;
  undo_reorder(3, 3) = 1;
  Affine undo_flip;
  for (int i = 0; i < 3; ++i) {
    const double center = -(static_cast<double>(shape[i]) - 1) / 2.0;
    undo_flip(i, i) = flips[i];
    undo_flip(i, 3) = flips[i] * center - center;
  }
  plan.affine = affine * (undo_flip * undo_reorder);
  return plan;
}

namespace {

// Where output index j of one axis samples the input: two neighbours and a
// weight (trilinear), or one index (nearest). Border padding clamps.
struct AxisTable {
  std::vector<std::int64_t> i0, i1;
  std::vector<double> w;
};

AxisTable axis_table(std::int64_t n_in, std::int64_t n_out, double scale, double shift, bool nearest) {
  AxisTable t;
  t.i0.resize(static_cast<std::size_t>(n_out));
  t.i1.resize(static_cast<std::size_t>(n_out));
  t.w.resize(static_cast<std::size_t>(n_out));
  for (std::int64_t j = 0; j < n_out; ++j) {
    double c = scale * static_cast<double>(j) + shift;
    c = std::min(std::max(c, 0.0), static_cast<double>(n_in - 1));
    if (nearest) {
      t.i0[j] = t.i1[j] = static_cast<std::int64_t>(std::nearbyint(c));  // round half to even, as grid_sample
      continue;
    }
    const auto f = static_cast<std::int64_t>(std::floor(c));
    t.i0[j] = f;
    t.i1[j] = std::min(f + 1, n_in - 1);
    t.w[j] = c - static_cast<double>(f);
  }
  return t;
}

// An empty tensor of `sizes` whose memory order of dims matches `like`'s, so
// that resampling writes (and later reads) in the order the data already has.
at::Tensor empty_in_layout_of(const at::Tensor& like, const std::vector<std::int64_t>& sizes, at::ScalarType dtype) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(like.dim()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<std::int64_t> permuted_sizes;
  for (auto d : order) permuted_sizes.push_back(sizes[static_cast<std::size_t>(d)]);
  std::vector<std::int64_t> inverse(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) inverse[static_cast<std::size_t>(order[i])] = static_cast<std::int64_t>(i);
  return at::empty(permuted_sizes, like.options().dtype(dtype)).permute(inverse);
}


template <typename T, bool Nearest>
void resample_kernel(const at::Tensor& in, const detail::InputView& view, at::Tensor& out, const AxisTable (&t)[3]) {
  const T* src = in.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  // Loop levels: spatial dims from largest to smallest output stride, so the
  // inner loop walks memory; per level, input element offsets of both neighbours.
  int order[3] = {1, 2, 3};
  std::sort(order, order + 3, [&](int a, int b) { return out.stride(a) > out.stride(b); });
  struct Level {
    std::int64_t n, out_stride;
    std::vector<std::int64_t> a, b;  // input offsets of the two neighbours
    std::vector<T> w;
  } lv[3];
  for (int l = 0; l < 3; ++l) {
    const int d = order[l];
    const AxisTable& tab = t[d - 1];
    lv[l].n = out.size(d);
    lv[l].out_stride = out.stride(d);
    for (std::int64_t j = 0; j < lv[l].n; ++j) {
      lv[l].a.push_back(view.offset(d, tab.i0[static_cast<std::size_t>(j)]));
      lv[l].b.push_back(view.offset(d, tab.i1[static_cast<std::size_t>(j)]));
      lv[l].w.push_back(static_cast<T>(tab.w[static_cast<std::size_t>(j)]));
    }
  }
  const std::int64_t channels = out.size(0), in_c = view.stride[0], out_c = out.stride(0);
  const Level &L0 = lv[0], &L1 = lv[1], &L2 = lv[2];
  kernel_for(0, channels * L0.n, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t o = begin; o < end; ++o) {
      const std::int64_t c = o / L0.n, i = o % L0.n;
      const T* base = src + c * in_c;
      T* out_row = dst + c * out_c + i * L0.out_stride;
      for (std::int64_t j = 0; j < L1.n; ++j) {
        T* out_line = out_row + j * L1.out_stride;
        if (Nearest) {
          const T* p = base + L0.a[i] + L1.a[j];
          for (std::int64_t k = 0; k < L2.n; ++k) out_line[k * L2.out_stride] = p[L2.a[k]];
          continue;
        }
        const T* p00 = base + L0.a[i] + L1.a[j];
        const T* p01 = base + L0.a[i] + L1.b[j];
        const T* p10 = base + L0.b[i] + L1.a[j];
        const T* p11 = base + L0.b[i] + L1.b[j];
        const T w0 = L0.w[i], w1 = L1.w[j];
        for (std::int64_t k = 0; k < L2.n; ++k) {
          const std::int64_t ka = L2.a[k], kb = L2.b[k];
          const T w2 = L2.w[k];
          auto lerp = [](T a, T b, T w) { return a + (b - a) * w; };
          const T v00 = lerp(p00[ka], p00[kb], w2), v01 = lerp(p01[ka], p01[kb], w2);
          const T v10 = lerp(p10[ka], p10[kb], w2), v11 = lerp(p11[ka], p11[kb], w2);
          out_line[k * L2.out_stride] = lerp(lerp(v00, v01, w1), lerp(v10, v11, w1), w0);
        }
      }
    }
  });
}

}  // namespace

namespace detail {

/// The axis-aligned resampling of `x` (read through `view`, whose grid is `in` with
/// index->world `from`) onto `to`, in one pass; an undefined tensor when the map is not
/// axis-aligned or the native kernels do not apply. `layout` gives the output's memory order.
at::Tensor resample_aligned(at::Tensor x, const InputView& view, const at::Tensor& layout, const Shape3& in,
                            const Affine& from, const Geometry& to, bool nearest) {
  const Affine m = from.inverse() * to.affine;  // output index -> input index
  double scale_max = 0, off_diag = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      if (i == j) scale_max = std::max(scale_max, std::abs(m(i, j)));
      else off_diag = std::max(off_diag, std::abs(m(i, j)));
    }
  if (!(off_diag <= 1e-9 * std::max(1.0, scale_max)) || !use_native_kernels(x)) return {};
  // Axis-aligned (always the case after Orientation for non-oblique data): one pass, in
  // the data's own memory order. (Linear resampling takes float or double input.)
  TORCH_INTERNAL_ASSERT(nearest || x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
  const AxisTable tables[3] = {axis_table(in[0], to.shape[0], m(0, 0), m(0, 3), nearest),
                               axis_table(in[1], to.shape[1], m(1, 1), m(1, 3), nearest),
                               axis_table(in[2], to.shape[2], m(2, 2), m(2, 3), nearest)};
  at::Tensor out = empty_in_layout_of(layout, {x.size(0), to.shape[0], to.shape[1], to.shape[2]}, x.scalar_type());
  if (nearest) {
    AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, x.scalar_type(), "resample_nearest",
                               [&] { resample_kernel<scalar_t, true>(x, view, out, tables); });
  } else {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "resample_linear",
                               [&] { resample_kernel<scalar_t, false>(x, view, out, tables); });
  }
  return out;
}

}  // namespace detail

at::Tensor resample(const at::Tensor& data, const Affine& from, const Geometry& to, bool nearest) {
  const Shape3 in = spatial_shape(data, "resample");
  at::Tensor x = data;
  if (!nearest && !at::isFloatingType(x.scalar_type())) x = x.to(at::kFloat);
  const at::Tensor xa = nearest || x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  at::Tensor aligned = detail::resample_aligned(xa, detail::InputView::of(xa), xa, in, from, to, nearest);
  if (aligned.defined()) return aligned;
  const Affine m = from.inverse() * to.affine;  // output index -> input index
  // General affine: grid_sampler with align_corners=True normalisation of
  // input indices (so that index i maps exactly to voxel centre i).
  at::Tensor src = x;
  const at::ScalarType original = src.scalar_type();
  // Sampled in float32 at least: a float16 grid (the grid takes the data's type) would place
  // a 512-voxel axis's samples a quarter voxel off.
  const bool reduced = original == at::kHalf || original == at::kBFloat16;
  if (!at::isFloatingType(original) || reduced) src = src.to(at::kFloat);
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(src.device());  // the grid where the data is
  const at::Tensor gi = at::arange(to.shape[0], opts).view({-1, 1, 1});
  const at::Tensor gj = at::arange(to.shape[1], opts).view({1, -1, 1});
  const at::Tensor gk = at::arange(to.shape[2], opts).view({1, 1, -1});
  std::vector<at::Tensor> coords(3);
  for (int axis = 0; axis < 3; ++axis) {
    const at::Tensor c = gi * m(axis, 0) + gj * m(axis, 1) + gk * m(axis, 2) + m(axis, 3);
    const double n = static_cast<double>(in[axis]);
    coords[axis] = n > 1 ? c * (2.0 / (n - 1)) - 1.0 : c * 0.0;
  }
  // grid_sampler's last dimension is (w, h, d) = (z, y, x) for input (N, C, x, y, z).
  const at::Tensor grid = at::stack({coords[2], coords[1], coords[0]}, -1).unsqueeze(0).to(src.scalar_type());
  at::Tensor out = at::grid_sampler(src.unsqueeze(0), grid, nearest ? 1 : 0, /*border*/ 1, /*align_corners*/ true)
                       .squeeze(0);
  if (nearest && !at::isFloatingType(original)) out = out.round().to(original);
  if (reduced) out = out.to(original);
  return out.contiguous();
}

namespace {

template <typename T>
inline T lerp(T a, T b, T w) {
  return a + (b - a) * w;
}

/// std::nearbyint under the default rounding mode (to nearest, ties to even) as one
/// instruction (cvtsd2si; nearbyint is a library call on baseline x86-64).
inline std::int64_t round_half_even(double v) {
#if defined(__x86_64__)
  return _mm_cvtsd_si64(_mm_set_sd(v));
#else
  return static_cast<std::int64_t>(std::nearbyint(v));
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MEDFAST_AVX2_KERNELS 1
/// Whether the CPU runs AVX2 (checked once); MEDFAST_NO_SIMD=1 turns the AVX2 runs off.
bool avx2_kernels() {
  static const bool on = [] {
    const char* off = std::getenv("MEDFAST_NO_SIMD");
    return __builtin_cpu_supports("avx2") && !(off && *off && std::string(off) != "0");
  }();
  return on;
}

/// A row's geometry for the AVX2 runs: source position p0 + d * k, strides (elements),
/// the largest index per axis.
struct RowGeometry {
  const double* p0;
  const double* d;
  std::int32_t stride[3];
  std::int32_t last[3];
  double maxc[3];
};

// The AVX2 run below uses no lambdas or helpers (GCC does not carry the target attribute
// into them), hence the macro.
#define MEDFAST_LERP8(A, B, T) _mm256_add_ps((A), _mm256_mul_ps(_mm256_sub_ps((B), (A)), (T)))

/// The run [k, kb) of a row of 4-byte values, 8 voxels per step: trilinear (float) or
/// nearest (any 4-byte type, copied as bits). Positions are p0 + d * k in double (multiply,
/// then add: no FMA), two halves of 4 lanes; nearest rounds to nearest, ties to even (as
/// cvtsd2si does in the scalar loop); trilinear truncates, rounds the double differences to
/// float weights and lerps (multiply, then add). Clamp = false is the interior run (every
/// position inside, both neighbours exist); Clamp = true is the per-voxel definition at the
/// border: positions clamped to [0, max], the upper neighbour clamped to the last index,
/// and, with `zeros`, a voxel whose position lies more than half a voxel outside is 0. So
/// the result is the scalar loop's, bit for bit. The offsets are computed 8 at a time; the
/// values are loaded one by one (on the CPUs measured, scalar loads beat AVX2 gathers), and
/// the interior run prefetches the source lines 32 voxels ahead, since a rotated row leaves
/// its source line every few voxels. The interior run stops before a last group of fewer
/// than 8 (returns where it stopped); the clamped run also takes that group (its clamped
/// positions are valid for every lane; only the lanes in the run are stored), so it ends
/// at kb, and since clamping changes nothing inside the volume, it also finishes an
/// interior run.
template <bool Nearest, bool Clamp>
__attribute__((target("avx2"))) std::int64_t row_run_avx2(const float* base, float* line, std::int64_t k,
                                                          std::int64_t kb, const RowGeometry& g, bool zeros) {
  constexpr std::int64_t ahead = 32;
  const __m256d step_lo = _mm256_setr_pd(0, 1, 2, 3), step_hi = _mm256_setr_pd(4, 5, 6, 7);
  const __m256d zero_d = _mm256_setzero_pd(), half = _mm256_set1_pd(0.5);
  alignas(32) std::int32_t off[8];
  alignas(32) std::int32_t next[3][8];  // Clamp, linear: the upper neighbour's offset per axis (0 at the last index)
  alignas(32) float v[8][8];
  const std::int32_t sx = g.stride[0], sy = g.stride[1], sz = g.stride[2];
  for (; Clamp ? k < kb : k + 8 <= kb; k += 8) {
    const std::int64_t lanes = Clamp && kb - k < 8 ? kb - k : 8;
    const __m256d kd = _mm256_set1_pd(static_cast<double>(k));
    const __m256d klo = _mm256_add_pd(kd, step_lo), khi = _mm256_add_pd(kd, step_hi);
    __m256i q = _mm256_setzero_si256();
    __m256 w[3];
    int outside = 0;
    for (int a = 0; a < 3; ++a) {
      __m256d plo = _mm256_add_pd(_mm256_set1_pd(g.p0[a]), _mm256_mul_pd(_mm256_set1_pd(g.d[a]), klo));
      __m256d phi = _mm256_add_pd(_mm256_set1_pd(g.p0[a]), _mm256_mul_pd(_mm256_set1_pd(g.d[a]), khi));
      if constexpr (Clamp) {
        const __m256d mx = _mm256_set1_pd(g.maxc[a]);
        if (zeros) {
          const __m256d low = _mm256_sub_pd(zero_d, half), high = _mm256_add_pd(mx, half);
          outside |= _mm256_movemask_pd(_mm256_or_pd(_mm256_cmp_pd(plo, low, _CMP_LT_OQ), _mm256_cmp_pd(plo, high, _CMP_GT_OQ)));
          outside |= _mm256_movemask_pd(_mm256_or_pd(_mm256_cmp_pd(phi, low, _CMP_LT_OQ), _mm256_cmp_pd(phi, high, _CMP_GT_OQ))) << 4;
        }
        // p < 0 ? 0 : (p > max ? max : p), as the scalar loop (max_pd(0, p) keeps -0.0).
        plo = _mm256_min_pd(mx, _mm256_max_pd(zero_d, plo));
        phi = _mm256_min_pd(mx, _mm256_max_pd(zero_d, phi));
      }
      const __m128i ilo = Nearest ? _mm256_cvtpd_epi32(plo) : _mm256_cvttpd_epi32(plo);
      const __m128i ihi = Nearest ? _mm256_cvtpd_epi32(phi) : _mm256_cvttpd_epi32(phi);
      const __m256i idx = _mm256_set_m128i(ihi, ilo);
      const __m256i st = _mm256_set1_epi32(g.stride[a]);
      q = _mm256_add_epi32(q, _mm256_mullo_epi32(idx, st));
      if constexpr (!Nearest) {
        w[a] = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_sub_pd(phi, _mm256_cvtepi32_pd(ihi))),
                               _mm256_cvtpd_ps(_mm256_sub_pd(plo, _mm256_cvtepi32_pd(ilo))));
        if constexpr (Clamp) {
          const __m256i has_next = _mm256_cmpgt_epi32(_mm256_set1_epi32(g.last[a]), idx);
          _mm256_store_si256(reinterpret_cast<__m256i*>(next[a]), _mm256_and_si256(has_next, st));
        }
      }
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(off), q);
    if constexpr (!Clamp) {
      // Prefetch the source lines that voxels `ahead` (and, trilinear, `ahead` + 4) voxels
      // on will read: four per voxel trilinear, two nearest. (A second voxel per group
      // catches the lines a rotated row moves to within the group: 8% on the trilinear
      // interior in a microbenchmark, nothing for nearest.)
      for (std::int64_t extra = 0; extra < (Nearest ? 1 : 8); extra += 4) {
        if (k + ahead + extra >= kb) break;
        const double ka = static_cast<double>(k + ahead + extra);
        const auto* p = reinterpret_cast<const char*>(
            base + static_cast<std::int64_t>(g.p0[0] + g.d[0] * ka) * sx +
            static_cast<std::int64_t>(g.p0[1] + g.d[1] * ka) * sy + static_cast<std::int64_t>(g.p0[2] + g.d[2] * ka) * sz);
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 4 * static_cast<std::int64_t>(sx), _MM_HINT_T0);
        if (!Nearest) {
          _mm_prefetch(p + 4 * static_cast<std::int64_t>(sy), _MM_HINT_T0);
          _mm_prefetch(p + 4 * static_cast<std::int64_t>(sx + sy), _MM_HINT_T0);
        }
      }
    }
    if constexpr (Nearest) {
      const auto* bits = reinterpret_cast<const std::uint32_t*>(base);
      auto* out = reinterpret_cast<std::uint32_t*>(line + k);
      for (int l = 0; l < lanes; ++l) out[l] = (outside >> l) & 1 ? 0u : bits[off[l]];
      continue;
    }
    for (int l = 0; l < 8; ++l) {
      const float* p = base + off[l];
      const std::int32_t ex = Clamp ? next[0][l] : sx, ey = Clamp ? next[1][l] : sy, ez = Clamp ? next[2][l] : sz;
      v[0][l] = p[0];
      v[1][l] = p[ex];
      v[2][l] = p[ey];
      v[3][l] = p[ex + ey];
      v[4][l] = p[ez];
      v[5][l] = p[ex + ez];
      v[6][l] = p[ey + ez];
      v[7][l] = p[ex + ey + ez];
    }
    const __m256 c00 = MEDFAST_LERP8(_mm256_load_ps(v[0]), _mm256_load_ps(v[1]), w[0]);
    const __m256 c10 = MEDFAST_LERP8(_mm256_load_ps(v[2]), _mm256_load_ps(v[3]), w[0]);
    const __m256 c01 = MEDFAST_LERP8(_mm256_load_ps(v[4]), _mm256_load_ps(v[5]), w[0]);
    const __m256 c11 = MEDFAST_LERP8(_mm256_load_ps(v[6]), _mm256_load_ps(v[7]), w[0]);
    const __m256 e0 = MEDFAST_LERP8(c00, c10, w[1]), e1 = MEDFAST_LERP8(c01, c11, w[1]);
    __m256 r = MEDFAST_LERP8(e0, e1, w[2]);
    if constexpr (Clamp) {
      if (outside) {
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        const __m256i drop = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(outside), bit), bit);
        r = _mm256_andnot_ps(_mm256_castsi256_ps(drop), r);
      }
      if (lanes < 8) {
        _mm256_store_ps(v[0], r);
        for (int l = 0; l < lanes; ++l) line[k + l] = v[0][l];
        continue;
      }
    }
    _mm256_storeu_ps(line + k, r);
  }
  return Clamp ? kb : k;
}
#undef MEDFAST_LERP8
#endif

template <typename T, bool Nearest>
void affine_kernel(const at::Tensor& in, at::Tensor& out, const Affine& m, bool zeros_outside, const Shape3& lo,
                   const Shape3& hi) {
  const T* src = in.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  const std::int64_t C = out.size(0), X = out.size(1), Y = out.size(2), Z = out.size(3);
  const std::int64_t nx = in.size(1), ny = in.size(2), nz = in.size(3);
  const std::int64_t sc = in.stride(0), sx = in.stride(1), sy = in.stride(2), sz = in.stride(3);
  const double maxc[3] = {static_cast<double>(nx - 1), static_cast<double>(ny - 1), static_cast<double>(nz - 1)};
#ifdef MEDFAST_AVX2_KERNELS
  // The AVX2 runs compute offsets in 32 bits: a channel of up to 2^31 - 1 elements.
  const std::int64_t span = (nx - 1) * sx + (ny - 1) * sy + (nz - 1) * sz;
  const bool simd = avx2_kernels() && sx > 0 && sy > 0 && sz > 0 && span < std::numeric_limits<std::int32_t>::max();
#endif
  kernel_for(0, C * X, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t ci = begin; ci < end; ++ci) {
      const std::int64_t c = ci / X, i = ci % X;
      const T* base = src + c * sc;
      for (std::int64_t j = 0; j < Y; ++j) {
        T* line = dst + ((c * X + i) * Y + j) * Z;
        if (i < lo[0] || i >= hi[0] || j < lo[1] || j >= hi[1]) {
          std::fill(line, line + Z, T(0));
          continue;
        }
        // Source position of (i, j, 0) and its step per k.
        double p0[3], d[3];
        for (int a = 0; a < 3; ++a) {
          p0[a] = m(a, 0) * static_cast<double>(i) + m(a, 1) * static_cast<double>(j) + m(a, 3);
          d[a] = m(a, 2);
        }
        // A voxel inside the box, every case (outside, border clamps), one by one.
        auto generic = [&](std::int64_t k) {
          double p[3];
          bool outside = false;
          for (int a = 0; a < 3; ++a) {
            p[a] = p0[a] + d[a] * static_cast<double>(k);
            if (p[a] < -0.5 || p[a] > maxc[a] + 0.5) outside = true;
            p[a] = p[a] < 0 ? 0 : (p[a] > maxc[a] ? maxc[a] : p[a]);  // border
          }
          if (outside && zeros_outside) {
            line[k] = T(0);
            return;
          }
          if (Nearest) {
            line[k] = base[round_half_even(p[0]) * sx + round_half_even(p[1]) * sy + round_half_even(p[2]) * sz];
            return;
          }
          const std::int64_t x0 = static_cast<std::int64_t>(p[0]), y0 = static_cast<std::int64_t>(p[1]),
                             z0 = static_cast<std::int64_t>(p[2]);
          const std::int64_t x1 = std::min(x0 + 1, nx - 1), y1 = std::min(y0 + 1, ny - 1), z1 = std::min(z0 + 1, nz - 1);
          const T wx = static_cast<T>(p[0] - static_cast<double>(x0)), wy = static_cast<T>(p[1] - static_cast<double>(y0)),
                  wz = static_cast<T>(p[2] - static_cast<double>(z0));
          auto at3 = [&](std::int64_t x, std::int64_t y, std::int64_t z) { return base[x * sx + y * sy + z * sz]; };
          const T c00 = lerp(at3(x0, y0, z0), at3(x1, y0, z0), wx), c10 = lerp(at3(x0, y1, z0), at3(x1, y1, z0), wx);
          const T c01 = lerp(at3(x0, y0, z1), at3(x1, y0, z1), wx), c11 = lerp(at3(x0, y1, z1), at3(x1, y1, z1), wx);
          line[k] = lerp(lerp(c00, c10, wy), lerp(c01, c11, wy), wz);
        };
        // The interior run [ka, kb) of the row: inside the box, every position within
        // [0, max] (nearest) or [0, max) (linear: both neighbours exist), so no clamp,
        // test or zero applies there and the same arithmetic runs without branches.
        const double top_margin = Nearest ? 0.0 : 1e-9;
        std::int64_t ka = std::max<std::int64_t>(lo[2], 0), kb = std::min<std::int64_t>(hi[2], Z);
        for (int a = 0; a < 3 && ka < kb; ++a) {
          const double lo_p = 0.0, hi_p = maxc[a] - top_margin;
          if (d[a] == 0) {
            if (!(p0[a] >= lo_p && p0[a] <= hi_p)) ka = kb;
            continue;
          }
          double k1 = (lo_p - p0[a]) / d[a], k2 = (hi_p - p0[a]) / d[a];
          if (k1 > k2) std::swap(k1, k2);
          ka = std::max<std::int64_t>(ka, static_cast<std::int64_t>(std::ceil(std::max(k1, -1.0))));
          kb = std::min<std::int64_t>(kb, static_cast<std::int64_t>(std::floor(std::min(k2, static_cast<double>(Z)))) + 1);
        }
        auto inside = [&](std::int64_t k) {
          for (int a = 0; a < 3; ++a) {
            const double p = p0[a] + d[a] * static_cast<double>(k);
            if (!(p >= 0.0 && (Nearest ? p <= maxc[a] : p < maxc[a]))) return false;
          }
          return true;
        };
        while (ka < kb && !inside(ka)) ++ka;  // the bounds above are exact up to rounding
        while (kb > ka && !inside(kb - 1)) --kb;
        // Outside the box: zeros. Inside it: the border runs [box_a, ka) and [kb, box_b)
        // (clamps, zeros outside) around the interior run [ka, kb).
        const std::int64_t box_a = std::clamp<std::int64_t>(lo[2], 0, Z), box_b = std::clamp<std::int64_t>(hi[2], box_a, Z);
        if (ka >= kb) ka = kb = box_b;
        std::fill(line, line + box_a, T(0));
        std::fill(line + box_b, line + Z, T(0));
        // The run [a, b) by the AVX2 kernels where they apply (8 voxels at a time, a last
        // short group included), else voxel by voxel; both give the same values.
#ifdef MEDFAST_AVX2_KERNELS
        const RowGeometry g{p0,
                            d,
                            {static_cast<std::int32_t>(sx), static_cast<std::int32_t>(sy), static_cast<std::int32_t>(sz)},
                            {static_cast<std::int32_t>(nx - 1), static_cast<std::int32_t>(ny - 1),
                             static_cast<std::int32_t>(nz - 1)},
                            {maxc[0], maxc[1], maxc[2]}};
#endif
        auto run = [&](std::int64_t a, std::int64_t b, bool border) {
          std::int64_t k = a;
#ifdef MEDFAST_AVX2_KERNELS
          if constexpr (sizeof(T) == 4 && (Nearest || std::is_same_v<T, float>)) {
            if (simd && b > a) {
              const auto* bp = reinterpret_cast<const float*>(base);
              auto* lp = reinterpret_cast<float*>(line);
              if (!border) k = row_run_avx2<Nearest, false>(bp, lp, k, b, g, zeros_outside);
              k = row_run_avx2<Nearest, true>(bp, lp, k, b, g, zeros_outside);
            }
          }
#endif
          if (border) {
            for (; k < b; ++k) generic(k);
            return;
          }
          const double px0 = p0[0], py0 = p0[1], pz0 = p0[2], dx = d[0], dy = d[1], dz = d[2];
          for (; k < b; ++k) {
            const double px = px0 + dx * static_cast<double>(k), py = py0 + dy * static_cast<double>(k),
                         pz = pz0 + dz * static_cast<double>(k);
            if (Nearest) {
              line[k] = base[round_half_even(px) * sx + round_half_even(py) * sy + round_half_even(pz) * sz];
              continue;
            }
            const std::int64_t x0 = static_cast<std::int64_t>(px), y0 = static_cast<std::int64_t>(py),
                               z0 = static_cast<std::int64_t>(pz);
            const T wx = static_cast<T>(px - static_cast<double>(x0)), wy = static_cast<T>(py - static_cast<double>(y0)),
                    wz = static_cast<T>(pz - static_cast<double>(z0));
            const T* q = base + x0 * sx + y0 * sy + z0 * sz;
            const T c00 = lerp(q[0], q[sx], wx), c10 = lerp(q[sy], q[sx + sy], wx);
            const T c01 = lerp(q[sz], q[sx + sz], wx), c11 = lerp(q[sy + sz], q[sx + sy + sz], wx);
            line[k] = lerp(lerp(c00, c10, wy), lerp(c01, c11, wy), wz);
          }
        };
        run(box_a, ka, true);
        run(ka, kb, false);
        run(kb, box_b, true);
      }
    }
  });
}

}  // namespace

at::Tensor resample_index_affine(const at::Tensor& data, const Affine& m, const Shape3& shape, bool nearest,
                                 bool zeros_outside, const Shape3& box_lo, const Shape3& box_hi) {
  const Shape3 in = spatial_shape(data, "resample");
  check_output_size("resample", "", data.size(0), shape, std::max<std::size_t>(data.element_size(), 4),
                    str("resampling a ", in[0], "x", in[1], "x", in[2], " volume"));
  if (!use_native_kernels(data)) {
    // Device tensors: the sampling-grid path, then the masks as tensor ops.
    Geometry g;
    g.shape = shape;
    g.affine = m;  // index space: the input "affine" is the identity
    at::Tensor out = resample(data, Affine(), g, nearest);
    const auto opts = at::TensorOptions().dtype(at::kDouble).device(data.device());
    const at::Tensor idx[3] = {at::arange(shape[0], opts).view({-1, 1, 1}), at::arange(shape[1], opts).view({1, -1, 1}),
                               at::arange(shape[2], opts).view({1, 1, -1})};
    at::Tensor keep = at::ones({shape[0], shape[1], shape[2]}, opts.dtype(at::kBool));
    for (int a = 0; a < 3; ++a) {
      keep = keep.logical_and(idx[a] >= static_cast<double>(box_lo[a])).logical_and(idx[a] < static_cast<double>(box_hi[a]));
      if (zeros_outside) {
        const at::Tensor c = idx[0] * m(a, 0) + idx[1] * m(a, 1) + idx[2] * m(a, 2) + m(a, 3);
        keep = keep.logical_and(c >= -0.5).logical_and(c <= static_cast<double>(data.size(a + 1)) - 0.5);
      }
    }
    return out * keep.unsqueeze(0).to(out.scalar_type());
  }
  at::Tensor x = data;
  if (!nearest && x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) x = x.to(at::kFloat);
  at::Tensor out = pooled_empty({x.size(0), shape[0], shape[1], shape[2]}, x.scalar_type());
  resample_index_affine_into(x, m, shape, nearest, zeros_outside, box_lo, box_hi, out);
  return out;
}

void resample_index_affine_into(const at::Tensor& data, const Affine& m, const Shape3& shape, bool nearest,
                                bool zeros_outside, const Shape3& box_lo, const Shape3& box_hi, at::Tensor dst) {
  at::Tensor x = data;
  if (!nearest && x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) x = x.to(at::kFloat);
  const bool direct = use_native_kernels(x) && dst.is_cpu() && dst.is_contiguous() && dst.scalar_type() == x.scalar_type() &&
                      dst.sizes() == at::IntArrayRef({x.size(0), shape[0], shape[1], shape[2]});
  if (!direct) {
    dst.copy_(resample_index_affine(data, m, shape, nearest, zeros_outside, box_lo, box_hi));
    return;
  }
  if (nearest) {
    AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, x.scalar_type(), "resample_affine_nearest",
                               [&] { affine_kernel<scalar_t, true>(x, dst, m, zeros_outside, box_lo, box_hi); });
  } else {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "resample_affine_linear",
                               [&] { affine_kernel<scalar_t, false>(x, dst, m, zeros_outside, box_lo, box_hi); });
  }
}

}  // namespace medfast::transforms

#undef MEDFAST_AVX2_KERNELS
