// Golden parity with nibabel: every file written by tests/golden/make_nifti_golden.py
// must read back with the same dtype, shape, voxels (bit for bit) and affine
// (exactly) that nibabel reports.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "medfast/image/nifti.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

nlohmann::json manifest() {
  const std::string text = test::read_file(test::golden_dir() + "/manifest.json");
  if (text.empty()) throw std::runtime_error("golden manifest missing: run the golden_files_nibabel test first");
  return nlohmann::json::parse(text);
}

// The dtype medfast holds for a numpy dtype name (unsigned wide types are widened).
at::ScalarType torch_type(const std::string& numpy) {
  if (numpy == "uint8") return at::kByte;
  if (numpy == "int8") return at::kChar;
  if (numpy == "int16") return at::kShort;
  if (numpy == "uint16" || numpy == "int32") return at::kInt;
  if (numpy == "uint32" || numpy == "int64" || numpy == "uint64") return at::kLong;
  if (numpy == "float32") return at::kFloat;
  if (numpy == "float64") return at::kDouble;
  throw std::runtime_error("unexpected dtype " + numpy);
}

// Loads nibabel's expected voxels (Fortran order, little endian) as a tensor
// of medfast's dtype, indexed [x][y][z]... like a Volume.
at::Tensor expected_tensor(const nlohmann::json& c) {
  const std::string bytes = test::read_file(test::golden_dir() + "/" + c["expected"].get<std::string>());
  std::vector<std::int64_t> shape = c["shape"].get<std::vector<std::int64_t>>();
  std::vector<std::int64_t> rev(shape.rbegin(), shape.rend());
  const std::string dt = c["dtype"];
  at::Tensor t;
  if (dt == "uint16") {
    std::vector<std::uint16_t> v(bytes.size() / 2);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    t = at::empty(rev, at::kInt);
    for (std::size_t i = 0; i < v.size(); ++i) t.data_ptr<std::int32_t>()[i] = v[i];
  } else if (dt == "uint32") {
    std::vector<std::uint32_t> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    t = at::empty(rev, at::kLong);
    for (std::size_t i = 0; i < v.size(); ++i) t.data_ptr<std::int64_t>()[i] = v[i];
  } else {
    t = at::empty(rev, torch_type(dt));
    EXPECT_EQ(static_cast<std::size_t>(t.numel() * t.element_size()), bytes.size());
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  }
  std::vector<std::int64_t> perm;
  for (auto i = static_cast<std::int64_t>(shape.size()) - 1; i >= 0; --i) perm.push_back(i);
  return t.permute(perm);
}

Affine affine_of(const nlohmann::json& rows) {
  Affine a;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) a(i, j) = rows[i][j].get<double>();
  return a;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

TEST(NiftiGolden, EveryCaseMatchesNibabelExactly) {
  const auto m = manifest();
  ASSERT_GE(m.size(), 60u);
  for (const auto& c : m) {
    const std::string file = c["file"];
    SCOPED_TRACE(file);
    const Volume v = read_nifti(test::golden_dir() + "/" + file);
    const at::Tensor expected = expected_tensor(c);
    EXPECT_EQ(v.shape(), c["shape"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(v.data.scalar_type(), expected.scalar_type());
    EXPECT_TRUE(bitwise_equal(v.data, expected)) << "voxels differ from nibabel";
    const Affine want = affine_of(c["affine"]);
    EXPECT_EQ(v.affine.max_abs_diff(want), 0.0) << "medfast:\n" << v.affine.to_string(17) << "\nnibabel:\n"
                                                << want.to_string(17);
    EXPECT_EQ(v.axcodes(), c["axcodes"].get<std::string>());
    EXPECT_EQ(v.meta.nifti_version, c["version"].get<int>());
    EXPECT_EQ(v.meta.big_endian, c["big_endian"].get<bool>());
    EXPECT_EQ(nifti::datatype_name(v.meta.disk_datatype), c["disk_dtype"].get<std::string>());
  }
}

TEST(NiftiGolden, StreamingAndThreadedPathsGiveTheSameVoxels) {
  const auto m = manifest();
  for (const auto& c : m) {
    const std::string path = test::golden_dir() + "/" + c["file"].get<std::string>();
    SCOPED_TRACE(path);
    const Volume a = read_nifti(path);
    // gzip_buffer_limit 0 forces the zlib streaming path for every .nii.gz.
    const Volume b = read_nifti(path, NiftiReadOptions().set_gzip_buffer_limit(0).set_threads(3));
    EXPECT_TRUE(bitwise_equal(a.data, b.data));
    EXPECT_EQ(a.affine, b.affine);
  }
}

TEST(NiftiGolden, HeaderOnlyReadAgreesWithFullRead) {
  const auto m = manifest();
  for (const auto& c : m) {
    const std::string path = test::golden_dir() + "/" + c["file"].get<std::string>();
    SCOPED_TRACE(path);
    bool gz = false;
    const nifti::Header h = nifti::read_header(path, {}, &gz);
    EXPECT_EQ(gz, c["gz"].get<bool>());
    EXPECT_EQ(h.shape(), c["shape"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(memory_dtype(h), dtype_name(read_nifti(path).data));
  }
}

}  // namespace
}  // namespace medfast
