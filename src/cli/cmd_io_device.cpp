// Device memory for `medfast io load|store --device cuda[:N]`: libtorch tensors moved by
// the tensor engine (cuFile when GPUDirect Storage is there, else the pinned bounce).
#include <ATen/ATen.h>

#include <cstring>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/io/tensor_io.hpp"

namespace medfast::cli {
namespace {

at::Device parse_device(const std::string& name) {
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    if (!at::hasCUDA()) {
      throw ValueError(str("--device ", name, ": no CUDA device is available (libtorch without CUDA, or no GPU)"));
    }
    try {
      return at::Device(name);
    } catch (const c10::Error&) {
      throw ValueError(str("--device '", name, "' is not cpu or cuda[:N]"));
    }
  }
  throw ValueError(str("--device '", name, "' is not cpu or cuda[:N]"));
}

class TensorBuffer final : public DeviceBuffer {
 public:
  explicit TensorBuffer(at::Tensor t) : t_(std::move(t)) {}
  std::size_t read(io::FileHandle& file, std::uint64_t offset) override { return io::read_into(file, t_, offset); }
  void write(io::FileHandle& file, std::uint64_t offset) override { io::write_from(file, t_, offset); }
  void copy_to_host(void* dst) const override {
    const at::Tensor host = t_.cpu();
    if (host.nbytes()) std::memcpy(dst, host.data_ptr(), host.nbytes());
  }

 private:
  at::Tensor t_;
};

class TorchDeviceIo final : public DeviceIo {
 public:
  std::unique_ptr<DeviceBuffer> allocate(const std::string& device, std::size_t bytes, const void* host) const override {
    const at::Device d = parse_device(device);
    const auto n = static_cast<std::int64_t>(bytes);
    const auto bytes_on = at::TensorOptions().dtype(at::kByte).device(d);
    at::Tensor t = host ? at::from_blob(const_cast<void*>(host), {n}, at::TensorOptions().dtype(at::kByte)).to(d)
                        : at::zeros({n}, bytes_on);
    return std::make_unique<TensorBuffer>(std::move(t));
  }
  std::string device_path(io::FileHandle& file) const override { return file.device_path(); }
  std::string device_transfers() const override { return io::device_transfers(); }
};

}  // namespace

const DeviceIo& torch_device_io() {
  static const TorchDeviceIo io;
  return io;
}

}  // namespace medfast::cli
