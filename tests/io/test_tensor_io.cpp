// The file engine's tensor calls on every backend configuration: read_into / write_from
// and their async forms, in place, on aligned and pageable tensors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "medfast/core/error.hpp"
#include "medfast/io/tensor_io.hpp"
#include "io_conformance.hpp"

namespace medfast::io {
namespace {

using conformance::Config;
using conformance::random_bytes;

class TensorConformance : public conformance::Conformance {};

TEST_P(TensorConformance, TensorsReadAndWriteInPlace) {
  const std::string data = random_bytes((2u << 20) + 6, 7);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  at::Tensor aligned = empty_aligned(data.size());
  EXPECT_EQ(read_into(f, aligned, 0), data.size());
  EXPECT_EQ(std::memcmp(aligned.data_ptr(), data.data(), data.size()), 0);
  at::Tensor pageable = at::empty({static_cast<std::int64_t>(data.size() - 6) / 4}, at::kFloat);
  EXPECT_EQ(read_into_async(f, pageable, 6).get(), data.size() - 6);
  EXPECT_EQ(std::memcmp(pageable.data_ptr(), data.data() + 6, data.size() - 6), 0);
  FileHandle w = FileHandle::open(dir / "t", FileHandle::Mode::write, options());
  write_from_async(w, pageable, 0).get();
  EXPECT_EQ(test::read_file(dir / "t"), data.substr(6));
  EXPECT_THROW(read_into(f, pageable.t().reshape({-1}).as_strided({4}, {2}), 0), ValueError);  // not contiguous
}

INSTANTIATE_TEST_SUITE_P(Backends, TensorConformance, ::testing::ValuesIn(conformance::configs()),
                         [](const ::testing::TestParamInfo<Config>& i) { return i.param.name; });

}  // namespace
}  // namespace medfast::io
