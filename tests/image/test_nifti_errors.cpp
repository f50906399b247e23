// Bad input: every malformed file gives a FormatError that names the file and
// the field, before anything large is allocated.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "medfast/core/error.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/image/gzip.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

// A valid little-endian NIfTI-1 (or -2) file of int16 voxels.
std::string good_file(int version = 1, std::vector<std::int64_t> shape = {4, 3, 2}) {
  nifti::Header h;
  h.version = version;
  h.datatype = nifti::DT_INT16;
  h.dim[0] = static_cast<std::int64_t>(shape.size());
  for (std::size_t i = 0; i < 7; ++i) h.dim[i + 1] = i < shape.size() ? shape[i] : 1;
  h.pixdim = {1, 1, 1, 1, 1, 1, 1, 1};
  h.vox_offset = version == 1 ? nifti::kNifti1MinVoxOffset : nifti::kNifti2MinVoxOffset;
  Affine a;
  h.set_affine(a, 1, 1);
  const auto head = nifti::serialize_header(h);
  std::string bytes(head.begin(), head.end());
  for (std::uint64_t i = 0; i < h.voxel_count(); ++i) {
    const std::int16_t v = static_cast<std::int16_t>(i * 3 - 7);
    bytes.append(reinterpret_cast<const char*>(&v), 2);
  }
  return bytes;
}

template <typename T>
void patch(std::string& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

std::string gzip(const std::string& bytes) {
  const auto gz = gzip_compress(bytes.data(), bytes.size(), 6);
  return std::string(gz.begin(), gz.end());
}

// The message of the FormatError read_nifti(path) throws (a test failure where it throws none).
std::string read_error(const std::string& path) {
  return test::error_of<FormatError>([&] { read_nifti(path); });
}

// Expects read_nifti(path) to throw FormatError mentioning the path and every fragment,
// and nifti::read_header(path), where it throws, to throw the same.
void expect_error(const std::string& path, std::initializer_list<std::string> fragments) {
  SCOPED_TRACE(path);
  std::vector<std::string> wanted{path};
  wanted.insert(wanted.end(), fragments.begin(), fragments.end());
  EXPECT_TRUE(test::contains_all(read_error(path), wanted));
  // Not an expected throw: data-only damage (a truncated gzip body) may be invisible to the
  // header read, which then returns.
  try {
    nifti::read_header(path);
  } catch (const FormatError& e) {
    EXPECT_TRUE(test::contains_all(e.what(), wanted));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

class NiftiErrors : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = dir / name;
    test::write_file(p, bytes);
    return p;
  }
};

TEST_F(NiftiErrors, GoodFilesRead) {
  const Volume v = read_nifti(write("good.nii", good_file()));
  EXPECT_EQ(v.shape(), (std::vector<std::int64_t>{4, 3, 2}));
  EXPECT_EQ(v.data[1][0][0].item<int>(), -4);
  EXPECT_NO_THROW(read_nifti(write("good2.nii.gz", gzip(good_file(2)))));
}

TEST_F(NiftiErrors, EmptyAndTruncatedFiles) {
  expect_error(write("empty.nii", ""), {"truncated"});
  expect_error(write("half_header.nii", good_file().substr(0, 200)), {"truncated"});
  const auto good = good_file();
  EXPECT_TRUE(test::contains_all(read_error(write("short_data.nii", good.substr(0, good.size() - 5))),
                                 {"truncated", "48 bytes of voxel data"}));
}

TEST_F(NiftiErrors, TruncatedAndCorruptGzip) {
  const std::string gz = gzip(good_file(1, {64, 64, 8}));
  expect_error(write("trunc.nii.gz", gz.substr(0, gz.size() / 2)), {"truncated"});
  std::string bad = gz;
  for (std::size_t i = 60; i < 90; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x33);
  const std::string m = read_error(write("corrupt.nii.gz", bad));
  EXPECT_NE(m.find("corrupt.nii.gz"), std::string::npos) << m;
  // The streaming path reports the same damage.
  EXPECT_THROW(read_nifti(dir / "trunc.nii.gz", NiftiReadOptions().set_gzip_buffer_limit(0)), FormatError);
  EXPECT_THROW(read_nifti(dir / "corrupt.nii.gz", NiftiReadOptions().set_gzip_buffer_limit(0)), FormatError);
  expect_error(write("tiny.nii.gz", gz.substr(0, 12)), {"gzip"});
}

// Bytes flipped in the middle of a .nii.gz whose deflate stream still decodes (stored
// blocks): the voxels differ silently unless the CRC is checked, on both read paths.
TEST_F(NiftiErrors, FlippedBytesInsideTheGzipDataAreReported) {
  // Also with bytes after the voxels in the stream: the reader stops before the member's trailer.
  for (const std::size_t trailing : {std::size_t{0}, std::size_t{4096}}) {
    const std::string raw = good_file(1, {64, 64, 8}) + std::string(trailing, '\0');
    const auto stored = gzip_compress(raw.data(), raw.size(), 0);
    std::string bad(stored.begin(), stored.end());
    for (std::size_t i = bad.size() / 2; i < bad.size() / 2 + 8; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    const std::string path = write("flipped.nii.gz", bad);
    for (const std::uint64_t limit : {NiftiReadOptions().gzip_buffer_limit, std::uint64_t{0}}) {
      SCOPED_TRACE(str(limit == 0 ? "streaming" : "whole buffer", ", ", trailing, " bytes after the voxels"));
      EXPECT_TRUE(test::contains_all(
          test::error_of<FormatError>([&] { read_nifti(path, NiftiReadOptions().set_gzip_buffer_limit(limit)); }),
          {"flipped.nii.gz", "corrupt"}));
    }
  }
}

// NaN or infinity in a field the affine is built from: named at once, as info and
// cache build would otherwise print "nan" spacings or report "a zero column".
TEST_F(NiftiErrors, NonFiniteGeometryFieldsAreNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto f = good_file();
  patch<float>(f, 76 + 4 * 2, nan);  // pixdim[2]
  expect_error(write("pixdim.nii", f), {"field pixdim[2]", "nan"});
  f = good_file();
  patch<std::int16_t>(f, 254, 1);     // sform_code: the srows are used
  patch<float>(f, 296 + 4 * 1, inf);  // srow_y[1]
  expect_error(write("srow.nii", f), {"field srow_y[1]", "inf"});
  f = good_file();
  patch<std::int16_t>(f, 252, 1);  // qform_code
  patch<float>(f, 260, nan);       // quatern_c
  expect_error(write("quatern.nii", f), {"field quatern_c", "nan"});
  f = good_file(2);
  patch<double>(f, 104 + 8 * 3, -std::numeric_limits<double>::infinity());  // NIfTI-2 pixdim[3]
  expect_error(write("pixdim2.nii", f), {"field pixdim[3]", "inf"});
  // Unused fields may hold anything (as nibabel ignores them): srows with sform_code 0.
  f = good_file();
  patch<std::int16_t>(f, 254, 0);
  patch<float>(f, 280, nan);
  EXPECT_NO_THROW(read_nifti(write("unused.nii", f)));
}

// A NIfTI-2 vox_offset of 2^62: the message names vox_offset, plain or gzipped.
TEST_F(NiftiErrors, HugeNifti2VoxOffsetIsNamed) {
  auto f = good_file(2);
  patch<std::int64_t>(f, 168, std::int64_t{1} << 62);
  expect_error(write("voxoff.nii", f), {"field vox_offset", std::to_string(std::int64_t{1} << 62)});
  expect_error(write("voxoff.nii.gz", gzip(f)), {"field vox_offset", std::to_string(std::int64_t{1} << 62)});
}

TEST_F(NiftiErrors, HeaderClaimingTerabytes) {
  auto f = good_file();
  patch<std::int16_t>(f, 40 + 2 * 1, 32000);
  patch<std::int16_t>(f, 40 + 2 * 2, 32000);
  patch<std::int16_t>(f, 40 + 2 * 3, 32000);
  // 32000^3 int16 = 65 TB: refused by max_volume_bytes before any allocation.
  expect_error(write("huge.nii", f), {"field dim", "max_volume_bytes"});
  // In a small .nii.gz even an allowed size is refused: deflate cannot expand that far.
  auto g = good_file(1, {64, 64, 8});
  patch<std::int16_t>(g, 40 + 2 * 3, 30000);
  expect_error(write("huge.nii.gz", gzip(g)), {"field dim", "can hold at most"});
}

TEST_F(NiftiErrors, VoxOffsetPastTheEndOrTooSmall) {
  auto f = good_file();
  patch<float>(f, 108, 1e6f);
  expect_error(write("offset.nii", f), {"field vox_offset", "past the end"});
  f = good_file();
  patch<float>(f, 108, 100.0f);
  expect_error(write("offset_small.nii", f), {"field vox_offset", "352"});
  f = good_file();
  patch<float>(f, 108, 352.5f);
  expect_error(write("offset_frac.nii", f), {"field vox_offset", "352.5"});
}

TEST_F(NiftiErrors, UnsupportedDatatypes) {
  for (auto [code, name] : {std::pair<std::int16_t, const char*>{128, "rgb24"},
                            {32, "complex64"},
                            {1792, "complex128"},
                            {1, "binary"},
                            {999, "unknown"}}) {
    auto f = good_file();
    patch<std::int16_t>(f, 70, code);
    expect_error(write(std::string("dt_") + name + ".nii", f), {"field datatype", "unsupported datatype", name});
  }
}

TEST_F(NiftiErrors, NonUnitQuaternionNamesTheFields) {
  auto f = good_file();
  patch<std::int16_t>(f, 254, 0);  // sform_code 0: the qform decides
  patch<float>(f, 256, 0.9f);
  patch<float>(f, 260, 0.9f);
  patch<float>(f, 264, 0.9f);
  EXPECT_TRUE(test::contains_all(read_error(write("quat.nii", f)), {"quat.nii", "quatern_b"}));
}

TEST_F(NiftiErrors, InvalidInterceptWithValidSlope) {
  auto f = good_file();
  patch<float>(f, 112, 2.0f);
  patch<float>(f, 116, std::numeric_limits<float>::quiet_NaN());
  expect_error(write("inter.nii", f), {"field scl_inter"});
}

TEST_F(NiftiErrors, MissingFileIsAnOsError) {
  EXPECT_THROW(read_nifti(dir / "missing.nii.gz"), OsError);
}

}  // namespace
}  // namespace medfast
