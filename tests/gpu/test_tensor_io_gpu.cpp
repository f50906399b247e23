// GPU half of the tensor file engine (ctest label: gpu). Every test skips,
// saying why, where libtorch has no CUDA or no GPU is present.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "medfast/core/random.hpp"
#include "medfast/io/tensor_io.hpp"
#include "test_util.hpp"

namespace medfast::io {
namespace {

#define MEDFAST_REQUIRE_CUDA()                                                                    \
  do {                                                                                            \
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: libtorch built without CUDA or no GPU"; \
  } while (0)

std::string random_bytes(std::size_t n) {
  Rng rng(99);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.next() >> 56);
  return s;
}

class GpuTensorIo : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuTensorIo, ReadIntoCudaTensorMatchesTheFile) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  const std::string data = random_bytes((40u << 20) + 4097);  // several bounce chunks, unaligned tail
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, IoOptions().set_backend(GetParam()));
  at::Tensor dst = at::empty({static_cast<std::int64_t>(data.size() - 5)}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  EXPECT_EQ(read_into(f, dst, 5), data.size() - 5);
  const at::Tensor host = dst.cpu();
  EXPECT_EQ(std::memcmp(host.data_ptr(), data.data() + 5, data.size() - 5), 0);
  EXPECT_EQ(read_into_async(f, dst, 0).get(), data.size() - 5);
}

TEST_P(GpuTensorIo, WriteFromCudaTensorRoundTrips) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  const at::Tensor src = at::arange(0, 5'000'001, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  {
    FileHandle w = FileHandle::open(dir / "w", FileHandle::Mode::write, IoOptions().set_backend(GetParam()));
    write_from(w, src, 0);
    w.sync();
  }
  const std::string bytes = test::read_file(dir / "w");
  ASSERT_EQ(bytes.size(), static_cast<std::size_t>(src.numel()) * 4);
  const at::Tensor host = src.cpu();
  EXPECT_EQ(std::memcmp(bytes.data(), host.data_ptr(), bytes.size()), 0);
}

TEST(GpuTensorIoPath, CufileBackendReportsItsDevicePath) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  test::write_file(dir / "f", "0123456789");
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, IoOptions().set_backend("cufile"));
  const std::string path = device_path(f);
  EXPECT_EQ(path, probe().cufile ? "cufile" : "bounce (pinned host buffers)");
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuTensorIo, ::testing::Values("posix", "odirect", "io_uring", "cufile"));

}  // namespace
}  // namespace medfast::io
