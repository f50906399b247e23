// Round trip C++ -> nibabel -> C++: medfast writes every golden case back out,
// nibabel must read the same voxels and affine, and so must medfast.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/os/file.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

bool float32_exact(const Affine& a) {
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      if (static_cast<double>(static_cast<float>(a(i, j))) != a(i, j)) return false;
  return true;
}

nlohmann::json affine_json(const Affine& a) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) rows.push_back({a(i, 0), a(i, 1), a(i, 2), a(i, 3)});
  return rows;
}

TEST(NiftiRoundTrip, MedfastWritesWhatNibabelAndMedfastReadBack) {
  const auto golden = nlohmann::json::parse(test::read_file(test::golden_dir() + "/manifest.json"));
  test::TempDir dir;
  nlohmann::json check = nlohmann::json::array();
  std::vector<std::pair<std::string, Volume>> written;
  for (const auto& c : golden) {
    const std::string name = c["file"];
    const Volume v = read_nifti(test::golden_dir() + "/" + name);
    const std::string out = dir / ("rt_" + name);
    write_nifti(out, v, NiftiWriteOptions().set_gzip_level(1).set_threads(2));
    // NIfTI-1 stores the affine as float32: exact when the affine already is,
    // otherwise within float32 rounding.
    const bool exact = v.meta.nifti_version == 2 || float32_exact(v.affine);
    const std::string dtype = c["dtype"];  // nibabel's dtype of the source
    const bool scaled = c["file"].get<std::string>().rfind("scaled_", 0) == 0;
    check.push_back({{"file", out},
                     {"expected", test::golden_dir() + "/" + c["expected"].get<std::string>()},
                     {"expected_dtype", dtype},
                     // medfast writes scaled data as the float64 values it holds,
                     // unsigned data restored to its on-disk type.
                     {"dtype", scaled ? "float64" : dtype},
                     {"shape", c["shape"]},
                     {"affine", affine_json(v.affine)},
                     {"affine_tolerance", exact ? 0.0 : 1e-5}});
    written.emplace_back(out, v);
  }
  test::write_file(dir / "check.json", check.dump());
  const auto r = test::run(test::python() + " " + test::source_dir() + "/tests/golden/verify_with_nibabel.py " +
                           (dir / "check.json"));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;

  for (const auto& [path, original] : written) {
    SCOPED_TRACE(path);
    const Volume back = read_nifti(path);
    EXPECT_TRUE(at::equal(back.data, original.data));
    EXPECT_EQ(back.data.scalar_type(), original.data.scalar_type());
    EXPECT_LE(back.affine.max_abs_diff(original.affine), float32_exact(original.affine) || original.meta.nifti_version == 2 ? 0.0 : 1e-5);
    EXPECT_EQ(back.axcodes(), original.axcodes());
    // The on-disk type survives (unsigned types restored); scaled data is stored as its float64 values.
    const bool scaled = original.meta.scl_slope != 0 && !(original.meta.scl_slope == 1 && original.meta.scl_inter == 0);
    EXPECT_EQ(back.meta.disk_datatype, scaled ? nifti::DT_FLOAT64 : original.meta.disk_datatype);
  }
}

// Uncompressed voxel blocks of nifti::kEngineReadBytes and more come through the tensor
// file engine, with its io_* options (here posix in pieces of 64 KiB, seen by the OS layer's
// hook): the same values as written; a failing read names the file.
TEST(NiftiRoundTrip, LargeUncompressedVoxelsComeThroughTheEngine) {
  test::TempDir dir;
  Volume v;
  v.data = at::arange(0, 160 * 160 * 200, at::kInt).reshape({160, 160, 200}).remainder(30011).to(at::kShort);
  ASSERT_GE(static_cast<std::size_t>(v.data.numel()) * 2, nifti::kEngineReadBytes);
  const std::string path = dir / "big.nii";
  write_nifti(path, v);
  const auto options =
      NiftiReadOptions().set_threads(2).set_io(io::IoOptions().set_backend("posix").set_block_size(64u << 10));
  std::atomic<int> pieces{0};
  {
    os::testing::ScopedHook count([&](os::Op op, const std::string& p, std::uint64_t, std::size_t size) {
      if (op == os::Op::read && p == path && size <= (64u << 10)) ++pieces;
      return os::testing::HookResult{};
    });
    EXPECT_TRUE(at::equal(read_nifti(path, options).data, v.data));
  }
  EXPECT_GT(pieces.load(), 100);  // 10 MB in pieces of 64 KiB: the engine's
  EXPECT_TRUE(at::equal(read_nifti(path).data, v.data));  // the default engine (auto)
  os::testing::ScopedHook fail([&](os::Op op, const std::string& p, std::uint64_t offset, std::size_t) {
    os::testing::HookResult r;
    if (op == os::Op::read && p == path && offset >= (4u << 20)) r.error = EIO;
    return r;
  });
  EXPECT_NE(test::error_of<OsError>([&] { read_nifti(path, options); }).find(path), std::string::npos);
}

TEST(NiftiRoundTrip, UnsignedTypesAreRestoredOnlyWhenValuesFit) {
  test::TempDir dir;
  Volume v;
  v.data = at::arange(0, 24, at::kInt).reshape({2, 3, 4}) * 2000;  // up to 46000: uint16 range
  v.meta.disk_datatype = nifti::DT_UINT16;
  write_nifti(dir / "u16.nii", v);
  EXPECT_EQ(nifti::read_header(dir / "u16.nii").datatype, nifti::DT_UINT16);
  EXPECT_TRUE(at::equal(read_nifti(dir / "u16.nii").data, v.data));
  v.data = v.data - 1;  // -1 no longer fits: written as int32, still lossless
  write_nifti(dir / "i32.nii", v);
  EXPECT_EQ(nifti::read_header(dir / "i32.nii").datatype, nifti::DT_INT32);
  EXPECT_TRUE(at::equal(read_nifti(dir / "i32.nii").data, v.data));
}

TEST(NiftiRoundTrip, LargeDimensionsSwitchToNifti2) {
  test::TempDir dir;
  Volume v;
  v.data = at::ones({40000, 2}, at::kByte);
  write_nifti(dir / "wide.nii.gz", v);
  const auto h = nifti::read_header(dir / "wide.nii.gz");
  EXPECT_EQ(h.version, 2);
  EXPECT_TRUE(at::equal(read_nifti(dir / "wide.nii.gz").data, v.data));
}

TEST(NiftiRoundTrip, NonContiguousAndBoolTensorsAreWrittenInIndexOrder) {
  test::TempDir dir;
  Volume v;
  v.data = at::arange(60, at::kFloat).reshape({3, 4, 5}).transpose(0, 2);  // shape 5x4x3, strided
  write_nifti(dir / "t.nii", v);
  EXPECT_TRUE(at::equal(read_nifti(dir / "t.nii").data, v.data));
  Volume b;
  b.data = at::arange(24).reshape({2, 3, 4}) > 10;
  write_nifti(dir / "b.nii", b);
  EXPECT_TRUE(at::equal(read_nifti(dir / "b.nii").data, b.data.to(at::kByte)));
}

}  // namespace
}  // namespace medfast
