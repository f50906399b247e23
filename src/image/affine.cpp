#include "medfast/image/affine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "medfast/core/error.hpp"

namespace medfast {

namespace {


Mat3 mul(const Mat3& a, const Mat3& b) {
  Mat3 r{};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) r[i][j] += a[i][k] * b[k][j];
  return r;
}

Mat3 transpose(const Mat3& a) {
  Mat3 r{};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r[i][j] = a[j][i];
  return r;
}

// Jacobi eigen-decomposition of a symmetric 3x3: a = V diag(w) V^T.
void symmetric_eigen(Mat3 a, std::array<double, 3>& w, Mat3& v) {
  v = Mat3{{{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}};
  for (int sweep = 0; sweep < 64; ++sweep) {
    double off = std::abs(a[0][1]) + std::abs(a[0][2]) + std::abs(a[1][2]);
    if (off < 1e-300) break;
    for (int p = 0; p < 2; ++p) {
      for (int q = p + 1; q < 3; ++q) {
        if (std::abs(a[p][q]) < 1e-300) continue;
        const double theta = (a[q][q] - a[p][p]) / (2 * a[p][q]);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < 3; ++k) {  // a = J^T a J
          const double akp = a[k][p], akq = a[k][q];
          a[k][p] = c * akp - s * akq;
          a[k][q] = s * akp + c * akq;
        }
        for (int k = 0; k < 3; ++k) {
          const double apk = a[p][k], aqk = a[q][k];
          a[p][k] = c * apk - s * aqk;
          a[q][k] = s * apk + c * aqk;
        }
        for (int k = 0; k < 3; ++k) {
          const double vkp = v[k][p], vkq = v[k][q];
          v[k][p] = c * vkp - s * vkq;
          v[k][q] = s * vkp + c * vkq;
        }
      }
    }
  }
  for (int i = 0; i < 3; ++i) w[i] = a[i][i];
}

// Closest orthogonal matrix (polar decomposition) restricted to the rank of
// `a`: sum over kept singular triplets of u_i v_i^T, as io_orientation does
// with numpy's SVD.
Mat3 polar_orthogonal(const Mat3& a) {
  std::array<double, 3> w{};
  Mat3 v{};
  symmetric_eigen(mul(transpose(a), a), w, v);
  double smax = 0;
  for (double x : w) smax = std::max(smax, std::sqrt(std::max(0.0, x)));
  const double tol = smax * 3 * std::numeric_limits<double>::epsilon();
  Mat3 r{};
  for (int i = 0; i < 3; ++i) {
    const double s = std::sqrt(std::max(0.0, w[i]));
    if (s <= tol) continue;
    std::array<double, 3> vi{v[0][i], v[1][i], v[2][i]};
    std::array<double, 3> ui{};
    for (int row = 0; row < 3; ++row) ui[row] = (a[row][0] * vi[0] + a[row][1] * vi[1] + a[row][2] * vi[2]) / s;
    for (int row = 0; row < 3; ++row)
      for (int col = 0; col < 3; ++col) r[row][col] += ui[row] * vi[col];
  }
  return r;
}

double det3(const Mat3& a) {
  return a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
         a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
}

}  // namespace

Affine Affine::operator*(const Affine& o) const {
  Affine r;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += m[i][k] * o.m[k][j];
      r.m[i][j] = s;
    }
  return r;
}

Affine Affine::inverse() const {
  // Gauss-Jordan with partial pivoting.
  double a[4][8];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) a[i][j] = j < 4 ? m[i][j] : (j - 4 == i ? 1.0 : 0.0);
  for (int c = 0; c < 4; ++c) {
    int p = c;
    for (int r = c + 1; r < 4; ++r)
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    if (std::abs(a[p][c]) < 1e-300) throw ValueError("affine is singular and has no inverse:\n" + to_string());
    if (p != c)
      for (int j = 0; j < 8; ++j) std::swap(a[p][j], a[c][j]);
    const double piv = a[c][c];
    for (int j = 0; j < 8; ++j) a[c][j] /= piv;
    for (int r = 0; r < 4; ++r) {
      if (r == c) continue;
      const double f = a[r][c];
      if (f == 0) continue;
      for (int j = 0; j < 8; ++j) a[r][j] -= f * a[c][j];
    }
  }
  Affine inv;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) inv.m[i][j] = a[i][j + 4];
  return inv;
}

std::array<double, 3> Affine::spacing() const {
  std::array<double, 3> s{};
  for (int c = 0; c < 3; ++c) s[c] = std::sqrt(m[0][c] * m[0][c] + m[1][c] * m[1][c] + m[2][c] * m[2][c]);
  return s;
}

double Affine::max_abs_diff(const Affine& o) const {
  double d = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) d = std::max(d, std::abs(m[i][j] - o.m[i][j]));
  return d;
}

std::string Affine::to_string(int precision) const {
  std::string s;
  char buf[64];
  for (int i = 0; i < 4; ++i) {
    s += "[";
    for (int j = 0; j < 4; ++j) {
      std::snprintf(buf, sizeof buf, "%*.*f", precision + 6, precision, m[i][j] == 0 ? 0.0 : m[i][j]);
      s += buf;
    }
    s += " ]";
    if (i < 3) s += "\n";
  }
  return s;
}

std::array<AxisOrientation, 3> io_orientation(const Affine& affine) {
  Mat3 rzs = affine.linear();
  for (int c = 0; c < 3; ++c) {
    double z = std::sqrt(rzs[0][c] * rzs[0][c] + rzs[1][c] * rzs[1][c] + rzs[2][c] * rzs[2][c]);
    if (z == 0) z = 1;
    for (int r = 0; r < 3; ++r) rzs[r][c] /= z;
  }
  Mat3 r = polar_orthogonal(rzs);
  std::array<AxisOrientation, 3> out{};
  for (int in_ax = 0; in_ax < 3; ++in_ax) {
    bool all_zero = true;
    for (int row = 0; row < 3; ++row)
      if (std::abs(r[row][in_ax]) > 1e-8) all_zero = false;  // np.allclose(col, 0)
    if (all_zero) continue;
    int best = 0;
    for (int row = 1; row < 3; ++row)
      if (std::abs(r[row][in_ax]) > std::abs(r[best][in_ax])) best = row;
    out[in_ax].out_axis = best;
    out[in_ax].sign = r[best][in_ax] < 0 ? -1 : 1;
    for (int col = 0; col < 3; ++col) r[best][col] = 0;
  }
  return out;
}

std::string axcodes(const Affine& affine) {
  static const char pos[3] = {'R', 'A', 'S'};
  static const char neg[3] = {'L', 'P', 'I'};
  std::string s;
  for (const auto& o : io_orientation(affine)) {
    if (o.out_axis < 0) s += '?';
    else s += o.sign > 0 ? pos[o.out_axis] : neg[o.out_axis];
  }
  return s;
}

QForm affine_to_qform(const Affine& affine) {
  QForm q;
  Mat3 m = affine.linear();
  for (int c = 0; c < 3; ++c) {
    double z = std::sqrt(m[0][c] * m[0][c] + m[1][c] * m[1][c] + m[2][c] * m[2][c]);
    q.pixdim[c] = z;
    if (z == 0) z = 1;
    for (int r = 0; r < 3; ++r) m[r][c] /= z;
  }
  if (det3(m) < 0) {
    q.qfac = -1;
    for (int r = 0; r < 3; ++r) m[r][2] = -m[r][2];
  }
  const Mat3 r = polar_orthogonal(m);
  // Rotation matrix to quaternion (Shepperd), w >= 0 as NIfTI requires.
  const double trace = r[0][0] + r[1][1] + r[2][2];
  double w, x, y, z;
  if (trace > 0) {
    const double s = std::sqrt(trace + 1.0) * 2;
    w = 0.25 * s;
    x = (r[2][1] - r[1][2]) / s;
    y = (r[0][2] - r[2][0]) / s;
    z = (r[1][0] - r[0][1]) / s;
  } else if (r[0][0] > r[1][1] && r[0][0] > r[2][2]) {
    const double s = std::sqrt(1.0 + r[0][0] - r[1][1] - r[2][2]) * 2;
    w = (r[2][1] - r[1][2]) / s;
    x = 0.25 * s;
    y = (r[0][1] + r[1][0]) / s;
    z = (r[0][2] + r[2][0]) / s;
  } else if (r[1][1] > r[2][2]) {
    const double s = std::sqrt(1.0 + r[1][1] - r[0][0] - r[2][2]) * 2;
    w = (r[0][2] - r[2][0]) / s;
    x = (r[0][1] + r[1][0]) / s;
    y = 0.25 * s;
    z = (r[1][2] + r[2][1]) / s;
  } else {
    const double s = std::sqrt(1.0 + r[2][2] - r[0][0] - r[1][1]) * 2;
    w = (r[1][0] - r[0][1]) / s;
    x = (r[0][2] + r[2][0]) / s;
    y = (r[1][2] + r[2][1]) / s;
    z = 0.25 * s;
  }
  if (w < 0) {
    x = -x;
    y = -y;
    z = -z;
  }
  q.b = x;
  q.c = y;
  q.d = z;
  q.offset = {affine(0, 3), affine(1, 3), affine(2, 3)};
  return q;
}

}  // namespace medfast
