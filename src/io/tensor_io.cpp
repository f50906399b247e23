#include "medfast/io/tensor_io.hpp"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#if MEDFAST_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/memory.hpp"

namespace medfast::io {

namespace {

void check_tensor(const at::Tensor& t, const char* what) {
  MEDFAST_CHECK_T(ValueError, t.defined(), what, ": the tensor is undefined");
  MEDFAST_CHECK_T(ValueError, t.is_contiguous(), what, ": the tensor must be contiguous");
  MEDFAST_CHECK_T(ValueError, t.is_cpu() || t.is_cuda(), what, ": tensors on ", t.device(),
                  " are not supported (CPU or CUDA)");
}

// libtorch 1.13's c10::Event has no host-side wait (and CUDA's own spins a core unless the
// event was made for blocking sync, which c10 cannot ask for): poll it with naps of 20 us
// doubling to 200 us. A buffer is reused two chunks later, after the next chunk's file read,
// so its 16 MiB copy (about a millisecond) has usually ended and no nap is taken at all.
void wait(const c10::Event& e) {
  if (!e.was_marked_for_recording()) return;
  auto nap = std::chrono::microseconds(20);
  while (!e.query()) {
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
}

/// The engine's access to one tensor's device (memory.hpp), with libtorch's ops: pinned
/// buffers from its host allocator, copies on the stream current when it was made (the
/// caller's), an event per bounce buffer. The copies are libtorch ops, so ROCm works the same.
class TorchDevice final : public DeviceAccess {
 public:
  explicit TorchDevice(const at::Tensor& t)
      : flat_(t.view({-1}).view(at::kByte)),
        stream_(c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device())),
        done_{c10::Event(t.device().type()), c10::Event(t.device().type())} {}

  void wait_for_stream() override { stream_.synchronize(); }

  std::shared_ptr<void> pinned(std::size_t size) override {
    at::Tensor h = at::empty({static_cast<std::int64_t>(size)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    pinned_.push_back(h);
    return std::shared_ptr<void>(h.data_ptr(), [h](void*) mutable { h.reset(); });
  }

  void copy_to_device(void* dst, const void* src, std::size_t size, int slot) override {
    device_view(dst, size).copy_(host_view(src, size), /*non_blocking=*/true);
    done_[slot].record(stream_);
  }

  void copy_to_host(void* dst, const void* src, std::size_t size) override {
    host_view(dst, size).copy_(device_view(src, size));  // synchronous
  }

  void wait(int slot) override { io::wait(done_[slot]); }

 private:
  // The tensors behind the engine's pointers: copies of views of the pinned tensors
  // themselves are what let libtorch order the host allocator's reuse after them.
  at::Tensor device_view(const void* p, std::size_t size) const {
    const auto at = static_cast<const char*>(p) - static_cast<const char*>(flat_.data_ptr());
    return flat_.narrow(0, at, static_cast<std::int64_t>(size));
  }
  at::Tensor host_view(const void* p, std::size_t size) const {
    for (const at::Tensor& h : pinned_) {
      const auto at = static_cast<const char*>(p) - static_cast<const char*>(h.data_ptr());
      if (at >= 0 && at + static_cast<std::int64_t>(size) <= h.numel()) return h.narrow(0, at, static_cast<std::int64_t>(size));
    }
    throw Error("tensor I/O: a bounce copy named host memory that is not one of its pinned buffers");
  }

  at::Tensor flat_;
  c10::Stream stream_;
  c10::Event done_[2];
  std::vector<at::Tensor> pinned_;
};

}  // namespace

at::Tensor empty_aligned(std::size_t bytes) {
  os::Buffer b = os::Buffer::allocate(bytes);
  void* p = b.release();
  return at::from_blob(
      p, {static_cast<std::int64_t>(bytes)}, [bytes](void* q) { os::Buffer::free(q, bytes); },
      at::TensorOptions().dtype(at::kByte));
}

std::size_t read_into(FileHandle& file, const at::Tensor& dst, std::uint64_t offset, const HostBytes& observe) {
  check_tensor(dst, "read_into");
  if (dst.is_cpu()) return file.pread(Memory::host(dst.data_ptr(), tensor_bytes(dst)), offset, observe);
  // This thread talks to dst's GPU (cuFile needs its context current; the engine's
  // async calls run on its I/O workers, threads of their own).
  const c10::DeviceGuard on_device(dst.device());
  TorchDevice device(dst);
  return file.pread(Memory::on_device(dst.data_ptr(), tensor_bytes(dst), device), offset, observe);
}

void write_from(FileHandle& file, const at::Tensor& src, std::uint64_t offset) {
  check_tensor(src, "write_from");
  if (src.is_cpu()) return file.pwrite(Memory::host(src.data_ptr(), tensor_bytes(src)), offset);
  const c10::DeviceGuard on_device(src.device());
  TorchDevice device(src);
  file.pwrite(Memory::on_device(src.data_ptr(), tensor_bytes(src), device), offset);
}

namespace {
/// The caller's current stream for a CUDA tensor: the async transfers run on another
/// thread, whose current stream is the default one, and must order themselves after (and
/// put their copies on) the stream the caller queued the tensor's work on.
std::optional<c10::Stream> callers_stream(const at::Tensor& t) {
  if (t.is_cpu()) return std::nullopt;
  return c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
}
}  // namespace

std::future<std::size_t> read_into_async(FileHandle& file, const at::Tensor& dst, std::uint64_t offset) {
  check_tensor(dst, "read_into_async");
  auto done = std::make_shared<std::promise<std::size_t>>();
  std::future<std::size_t> result = done->get_future();
  // On the engine's I/O workers, with a handle sharing `file`'s open file (it may be
  // moved or closed by the caller meanwhile).
  file.run_async([done, dst, offset, stream = callers_stream(dst)](FileHandle& shared) {
    try {
      std::optional<c10::StreamGuard> on_callers;
      if (stream) on_callers.emplace(*stream);
      done->set_value(read_into(shared, dst, offset));
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  });
  return result;
}

std::future<void> write_from_async(FileHandle& file, const at::Tensor& src, std::uint64_t offset) {
  check_tensor(src, "write_from_async");
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> result = done->get_future();
  file.run_async([done, src, offset, stream = callers_stream(src)](FileHandle& shared) {
    try {
      std::optional<c10::StreamGuard> on_callers;
      if (stream) on_callers.emplace(*stream);
      write_from(shared, src, offset);
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  });
  return result;
}

at::Device resolve_device(const std::string& name, const std::function<int()>& current) {
  if (name == "auto") {  // a GPU where one is usable (train::choose_device says why)
    if (current) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(current()));
    if (!at::hasCUDA()) return at::Device(at::kCPU);
    return c10::impl::VirtualGuardImpl(at::kCUDA).getDevice();
  }
  at::Device d(at::kCPU);
  try {
    d = at::Device(name);
  } catch (const std::exception&) {
    throw ValueError(str("device '", name, "' is not auto, cpu, cuda or cuda:N"));
  }
  if (!d.is_cuda() || d.has_index()) return d;
  if (current) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(current()));
  if (!at::hasCUDA()) return d;
  return c10::impl::VirtualGuardImpl(at::kCUDA).getDevice();
}

std::optional<CudaAllocatorBytes> cuda_allocator_bytes(c10::DeviceIndex index) {
#if MEDFAST_TORCH_CUDA
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    constexpr std::size_t aggregate = 0;  // StatType::AGGREGATE
    CudaAllocatorBytes b;
    b.allocated = stats.allocated_bytes[aggregate].current;
    b.reserved = stats.reserved_bytes[aggregate].current;
    b.allocated_peak = stats.allocated_bytes[aggregate].peak;
    b.reserved_peak = stats.reserved_bytes[aggregate].peak;
    return b;
  } catch (const c10::Error&) {
    return std::nullopt;
  }
#else
  (void)index;
  return std::nullopt;
#endif
}

std::optional<std::uint64_t> cuda_free_bytes(const at::Device& device, std::uint64_t* total) {
#if MEDFAST_TORCH_CUDA
  if (device.is_cuda() && at::hasCUDA()) {
    const at::Device d = device.has_index() ? device : resolve_device("cuda");
    c10::cuda::CUDAGuard guard(d.index());
    std::size_t free = 0, all = 0;
    if (cudaMemGetInfo(&free, &all) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    // Reserved but unallocated blocks are free for new tensors too (an allocator that has
    // not allocated yet holds none).
    const auto held = cuda_allocator_bytes(d.index());
    const std::int64_t unused = held ? held->reserved - held->allocated : 0;
    if (total) *total = all;
    return static_cast<std::uint64_t>(free) + static_cast<std::uint64_t>(std::max<std::int64_t>(unused, 0));
  }
#endif
  (void)device;
  (void)total;
  return std::nullopt;
}

}  // namespace medfast::io
