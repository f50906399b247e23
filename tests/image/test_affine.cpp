#include <gtest/gtest.h>

#include <cmath>

#include "medfast/core/error.hpp"
#include "medfast/image/affine.hpp"
#include "medfast/image/nifti_header.hpp"

namespace medfast {
namespace {

Affine diag(double a, double b, double c) {
  Affine m;
  m(0, 0) = a;
  m(1, 1) = b;
  m(2, 2) = c;
  return m;
}

TEST(Affine, AxisCodesLikeNibabel) {
  EXPECT_EQ(axcodes(diag(1, 1, 1)), "RAS");
  EXPECT_EQ(axcodes(diag(-0.8, -0.8, 5)), "LPS");
  EXPECT_EQ(axcodes(diag(-1, 1, -1)), "LAI");
  Affine p;  // permuted: voxel i -> -z, j -> x, k -> -y
  p.m = {{{0, 0.8, 0, 0}, {0, 0, -0.8, 0}, {-2, 0, 0, 0}, {0, 0, 0, 1}}};
  EXPECT_EQ(axcodes(p), "IRP");
}

TEST(Affine, ObliqueAxisCodesPickTheClosestAxis) {
  const double a = 0.3;
  Affine m;
  m.m = {{{std::cos(a), -std::sin(a), 0, 0}, {std::sin(a), std::cos(a), 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}}};
  EXPECT_EQ(axcodes(m), "RAS");
  const double b = 1.2;  // rotated by more than 45 degrees: axes swap
  m.m = {{{std::cos(b), -std::sin(b), 0, 0}, {std::sin(b), std::cos(b), 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}}};
  EXPECT_EQ(axcodes(m), "ALS");
}

TEST(Affine, InverseAndSpacing) {
  Affine m = diag(-0.8, 0.8, 5);
  m(0, 3) = 10;
  m(1, 3) = -20;
  m(2, 3) = 30;
  const Affine i = m * m.inverse();
  EXPECT_LT(i.max_abs_diff(Affine::identity()), 1e-12);
  const auto s = m.spacing();
  EXPECT_DOUBLE_EQ(s[0], 0.8);
  EXPECT_DOUBLE_EQ(s[2], 5);
  Affine singular = diag(1, 0, 1);
  EXPECT_THROW(singular.inverse(), ValueError);
}

TEST(Affine, QformRoundTripThroughTheHeader) {
  const double a = 0.4, b = -0.7;
  Affine rot;
  rot.m = {{{std::cos(a), 0, std::sin(a), 0}, {0, 1, 0, 0}, {-std::sin(a), 0, std::cos(a), 0}, {0, 0, 0, 1}}};
  Affine rz;
  rz.m = {{{std::cos(b), -std::sin(b), 0, 0}, {std::sin(b), std::cos(b), 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}}};
  for (double flip : {1.0, -1.0}) {
    Affine m = rz * rot * diag(0.7, 0.9, 2.5 * flip);
    m(0, 3) = 1.5;
    m(1, 3) = -2.5;
    m(2, 3) = 3.5;
    nifti::Header h;
    h.version = 2;  // double precision fields
    h.dim = {3, 4, 4, 4, 1, 1, 1, 1};
    h.set_affine(m, 0, 1);
    EXPECT_LT(h.qform_affine().max_abs_diff(m), 1e-12) << "flip " << flip;
    EXPECT_EQ(h.best_affine().max_abs_diff(m) < 1e-12, true);
  }
}

}  // namespace
}  // namespace medfast
