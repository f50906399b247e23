#pragma once
/// \file
/// 4x4 voxel-to-world affines (RAS+ millimetres, as nibabel and MONAI use)
/// and the NIfTI quaternion/orientation conventions, without libtorch.

#include <array>
#include <string>

namespace medfast {

/// A 3x3 matrix of doubles, row-major: m[r][c].
using Mat3 = std::array<std::array<double, 3>, 3>;

/// Row-major 4x4 matrix of doubles; m[r][c].
struct Affine {
  std::array<std::array<double, 4>, 4> m{{{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}}};

  static Affine identity() { return Affine{}; }
  double& operator()(int r, int c) { return m[r][c]; }
  double operator()(int r, int c) const { return m[r][c]; }
  Affine operator*(const Affine& o) const;
  bool operator==(const Affine& o) const { return m == o.m; }
  /// Inverse; throws ValueError if singular.
  Affine inverse() const;
  /// The upper-left 3x3 block: rotations, zooms and shears, without the translation.
  Mat3 linear() const {
    Mat3 r{};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) r[i][j] = m[i][j];
    return r;
  }
  /// Lengths of the first three columns: the voxel spacing in mm.
  std::array<double, 3> spacing() const;
  /// Largest absolute element difference.
  double max_abs_diff(const Affine& o) const;
  std::string to_string(int precision = 6) const;
};

/// Orientation of each voxel axis: out_axis (0=x,1=y,2=z) and sign (+1/-1),
/// chosen as nibabel.orientations.io_orientation does (polar decomposition,
/// then the largest component per column, each world axis used once).
struct AxisOrientation {
  int out_axis = -1;  ///< -1 if the column is all zero
  int sign = 1;
};
std::array<AxisOrientation, 3> io_orientation(const Affine& affine);

/// Axis codes such as "RAS" or "LPS" (nibabel.aff2axcodes with labels R/L, A/P, S/I).
std::string axcodes(const Affine& affine);

/// The NIfTI qform parameters of an affine: quaternion b,c,d, qfac, pixdim and
/// offsets (as nibabel's Nifti1Header.set_qform computes them; any shear is dropped).
struct QForm {
  double b = 0, c = 0, d = 0;
  double qfac = 1;
  std::array<double, 3> pixdim{1, 1, 1};
  std::array<double, 3> offset{0, 0, 0};
};
QForm affine_to_qform(const Affine& affine);

}  // namespace medfast
