// The torch-free NIfTI layer (header parser, raw decoder) on the bad inputs of
// fuzz/seeds (written by fuzz/make_bad_seeds.py, independently of medfast): each
// is refused with a FormatError naming the file and the field. These tests also
// run under ASan/UBSan with leak checking (scripts/test.sh, build-asan).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/image/nifti_raw.hpp"
#include "test_util.hpp"

namespace medfast::nifti {
namespace {

std::string seed(const std::string& name) { return test::source_dir() + "/fuzz/seeds/" + name; }

void expect_refused(const std::string& name, const std::string& field, bool header_reveals_it) {
  SCOPED_TRACE(name);
  const std::string path = seed(name);
  const std::string bytes = test::read_file(path);
  ASSERT_FALSE(bytes.empty()) << path;
  for (const std::uint64_t limit : {NiftiReadOptions().gzip_buffer_limit, std::uint64_t{0}}) {
    SCOPED_TRACE(str("read_raw, gzip_buffer_limit ", limit));
    const std::string m =
        test::error_of<FormatError>([&] { read_raw(path, NiftiReadOptions().set_gzip_buffer_limit(limit)); });
    EXPECT_TRUE(test::contains_all(m, {path, field}));
  }
  const std::string m =
      test::error_of<FormatError>([&] { decode_memory(bytes.data(), bytes.size(), "in-memory " + name); });
  EXPECT_NE(m.find(field), std::string::npos) << "decode_memory: " << m;
  if (header_reveals_it) {
    EXPECT_THROW(read_header(path), FormatError);
  }
}

TEST(NiftiHeaderBadInputs, NonFiniteGeometryFieldsAreNamed) {
  expect_refused("nan_pixdim.nii", "field pixdim[2]", true);
  expect_refused("inf_srow.nii", "field srow_y[1]", true);
  expect_refused("nan_quatern.nii", "field quatern_c", true);
  expect_refused("nan_qoffset.nii.gz", "field qoffset_y", true);
}

TEST(NiftiHeaderBadInputs, HugeNifti2VoxOffsetIsNamed) {
  expect_refused("nifti2_vox_offset_2_62.nii", "field vox_offset", true);
  expect_refused("nifti2_vox_offset_2_62.nii.gz", "field vox_offset", true);
}

TEST(NiftiHeaderBadInputs, FlippedBytesInsideGzipDataFailTheCrc) {
  // The header is intact: only decoding the data (and its CRC) tells.
  expect_refused("flipped_stored.nii.gz", "corrupt gzip data", false);
  expect_refused("flipped_stored_trailing.nii.gz", "corrupt gzip data", false);
}

TEST(NiftiHeaderBadInputs, HugeSpacingIsAValidHeader) {
  // Spacings of 1e9 mm are numbers: the header reader accepts them; the transforms
  // that would resample them refuse the output size (test_transforms.cpp).
  const RawImage img = read_raw(seed("huge_spacing.nii"));
  EXPECT_EQ(img.header.dim[1], 8);
  EXPECT_EQ(img.header.sform_affine()(0, 0), 1e9);
}

}  // namespace
}  // namespace medfast::nifti
