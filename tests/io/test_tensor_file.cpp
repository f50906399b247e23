// Whole tensors in files (io/tensor_file.hpp): raw bytes and MFTENSOR files round
// trip through every CPU backend, and a damaged or foreign file is a FormatError
// naming it, never a crash or a wrong tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/io/tensor_file.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/os/file.hpp"
#include "test_util.hpp"

namespace medfast::io {
namespace {

std::vector<IoOptions> backends() {
  return {IoOptions().set_backend("posix").set_threads(2), IoOptions().set_backend("odirect").set_threads(2),
          IoOptions().set_backend("posix").set_threads(3).set_block_size(8192)};
}

// Damages a file in place, durably: the damage is on the disk before the engine reads
// the file back (with O_DIRECT, past the page cache), whatever the kernel's coherence
// between a buffered write and a direct read of the same range.
void overwrite(const std::string& path, std::size_t offset, const std::string& bytes) {
  os::File f = os::File::open(path, os::File::Mode::read_write);
  f.write_at(bytes.data(), bytes.size(), offset);
  f.sync();
}

template <typename F>
std::string format_error(F&& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no FormatError";
  return "";
}

// Issue 21, review findings 1-2: a plain "cuda" names the GPU current on the thread that
// chose it, resolved there (the caches' fill threads and the loader's workers all start on
// GPU 0). The current device is injected: the logic runs without a GPU.
TEST(DeviceNames, PlainCudaIsTheChoosingThreadsCurrentGpu) {
  const auto third = [] { return 3; };
  EXPECT_EQ(resolve_device("cuda", third).str(), "cuda:3");
  EXPECT_EQ(resolve_device("cuda:1", third).str(), "cuda:1");  // an explicit index stays
  EXPECT_EQ(resolve_device("cpu", third).str(), "cpu");
  if (!at::hasCUDA()) EXPECT_EQ(resolve_device("cuda").str(), "cuda");  // reported by whoever uses it
  // auto: the current GPU where CUDA is usable (here the injected one), else the CPU.
  EXPECT_EQ(resolve_device("auto", third).str(), "cuda:3");
  if (!at::hasCUDA()) EXPECT_EQ(resolve_device("auto").str(), "cpu");
  try {
    resolve_device("gpu0");
    ADD_FAILURE() << "gpu0 was taken for a device";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("device 'gpu0' is not auto, cpu, cuda or cuda:N"), std::string::npos) << e.what();
  }
}

TEST(TensorFile, RoundTripsDtypeShapeAndValuesOnEveryBackend) {
  test::TempDir dir;
  at::manual_seed(1);
  const std::vector<at::Tensor> tensors{
      at::randn({3, 5, 7}),
      (at::randn({1000, 33}) * 100).to(at::kShort),
      at::randn({4097}).to(at::kHalf),
      at::randn({2, 3}).to(at::kBFloat16),
      at::randint(0, 2, {17}).to(at::kBool),
      at::randn({6, 8}).t(),  // not contiguous: saved as its contiguous copy
      at::empty({0, 4}),
  };
  for (const auto& io : backends()) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::string path = dir / ("t" + std::to_string(i) + ".mft");
      save_tensor(tensors[i], path, io, i % 2 == 0);
      const at::Tensor back = load_tensor(path, "cpu", io);
      EXPECT_EQ(back.scalar_type(), tensors[i].scalar_type()) << i;
      EXPECT_EQ(back.sizes(), tensors[i].sizes()) << i;
      EXPECT_TRUE(at::equal(back, tensors[i].contiguous())) << i;
    }
  }
  EXPECT_EQ(os::list_directory(dir.path()).size(), tensors.size()) << "no temporary file left behind";
}

TEST(TensorFile, RawBytesIntoANewOrAPreallocatedTensor) {
  test::TempDir dir;
  const at::Tensor data = at::arange(0, 300000, at::kInt);
  const std::string path = dir / "raw.bin";
  save_bytes(data, path);
  EXPECT_EQ(os::stat(path).size, 1200000u);
  const at::Tensor bytes = load_bytes(path);
  EXPECT_EQ(bytes.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(bytes.view(at::kInt), data));
  at::Tensor out = at::zeros({1000}, at::kInt);  // smaller than the file: its first bytes
  load_bytes(path, out);
  EXPECT_TRUE(at::equal(out, data.narrow(0, 0, 1000)));
  at::Tensor big = at::full({300010}, -1, at::kInt);  // larger: the rest is left alone
  load_bytes(path, big);
  EXPECT_TRUE(at::equal(big.narrow(0, 0, 300000), data));
  EXPECT_EQ(big[300005].item<int>(), -1);
  EXPECT_THROW(load_bytes(path, at::zeros({10, 10}, at::kInt).t()), ValueError);
  EXPECT_THROW(load_bytes(dir / "missing.bin"), OsError);
}

TEST(TensorFile, DamagedAndForeignFilesAreFormatErrorsNamingTheFile) {
  test::TempDir dir;
  const std::string path = dir / "t.mft";
  const at::Tensor t = at::randn({64, 64});
  auto fresh = [&] { save_tensor(t, path, IoOptions(), false); };

  fresh();
  overwrite(path, 0, "NOTATENS");
  std::string e = format_error([&] { load_tensor(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("magic"), std::string::npos) << e;

  fresh();
  overwrite(path, 8, std::string("\x07\0\0\0", 4));
  EXPECT_NE(format_error([&] { load_tensor(path); }).find("version 7"), std::string::npos);

  fresh();
  overwrite(path, 12, std::string("\xff\xff\xff\x7f", 4));
  EXPECT_NE(format_error([&] { load_tensor(path); }).find("header length"), std::string::npos);

  fresh();
  overwrite(path, 16, "{\"dtype\": \"complex7\"");
  EXPECT_NE(format_error([&] { load_tensor(path); }).find("header"), std::string::npos);

  fresh();  // a shape whose product wraps around 2^64 must not pass for the byte count
  {
    std::string head = "{\"dtype\":\"uint8\",\"shape\":[4611686018427387904,4,4096],\"bytes\":0,\"xxh3\":null}";
    std::string fixed = std::string("MFTENSOR\x01\0\0\0", 12);
    const std::uint32_t len = static_cast<std::uint32_t>(head.size());
    fixed.append(reinterpret_cast<const char*>(&len), 4);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << fixed << head << std::string(4096, '\0');
  }
  EXPECT_NE(format_error([&] { load_tensor(path); }).find("disagree"), std::string::npos);

  fresh();  // one flipped payload bit: the checksum says so; verify=false reads it anyway
  overwrite(path, 4096 + 100, "\x55");
  EXPECT_NE(format_error([&] { load_tensor(path); }).find("checksum"), std::string::npos);
  EXPECT_EQ(load_tensor(path, "cpu", IoOptions(), false).sizes(), t.sizes());

  fresh();  // cut short
  ASSERT_EQ(::truncate(path.c_str(), 4096 + 1000), 0);
  EXPECT_NE(format_error([&] { load_tensor(path); }).find("cut short"), std::string::npos);

  std::ofstream(dir / "short.mft") << "MFT";
  EXPECT_NE(format_error([&] { load_tensor(dir / "short.mft"); }).find("too short"), std::string::npos);
}

TEST(TensorFile, AFailedSaveKeepsThePreviousFile) {
  test::TempDir dir;
  const std::string path = dir / "keep.mft";
  const at::Tensor t = at::arange(0, 100, at::kFloat);
  save_tensor(t, path);
  // An unsupported dtype is refused before anything is written.
  EXPECT_THROW(save_tensor(at::zeros({4}, at::kComplexFloat), path), ValueError);
  EXPECT_TRUE(at::equal(load_tensor(path), t));
  EXPECT_EQ(os::list_directory(dir.path()), std::vector<std::string>{"keep.mft"});
  EXPECT_THROW(save_tensor(t, dir / "no/such/folder/x.mft"), OsError);
}

}  // namespace
}  // namespace medfast::io
