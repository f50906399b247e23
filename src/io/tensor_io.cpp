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
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/memory.hpp"
#include "medfast/shim/cufile.hpp"

namespace medfast::io {

namespace {

constexpr std::size_t kBounceChunk = 16u << 20;

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

/// How device memory is reached, decided once per process on the first device
/// transfer (so that CPU-only runs never load libcufile) and logged once.
struct DevicePath {
  bool cufile = false;       ///< cuFile usable at all
  bool gpudirect = false;    ///< ... and not in compatibility mode
  std::string description;
};
const DevicePath& device_probe() {
  static const DevicePath p = [] {
    DevicePath d;
    std::string why;
    const shim::CuFileApi* api = shim::cufile(&why);
    d.cufile = api != nullptr;
    d.gpudirect = api && !api->compat_mode;
    d.description = shim::cufile_description();
    log::info("io: device transfers: ",
              d.gpudirect ? "cuFile (GPUDirect Storage)"
                          : str("pinned host buffers, double-buffered (", d.description,
                                d.cufile ? "; io_backend=cufile uses it anyway" : "", ")"));
    return d;
  }();
  return p;
}

/// cuFile for this handle: with GPUDirect under io_backend auto or cufile, and in
/// compatibility mode only when cufile was asked for by name (medfast's own
/// bounce is as fast there and keeps the host backend's threads and queue depth).
bool use_cufile(FileHandle& f) {
  const bool forced = f.options().backend == "cufile";
  if (!forced && f.options().backend != "auto") return false;
  const DevicePath& d = device_probe();
  if (!(d.gpudirect || (forced && d.cufile))) return false;
  return f.cufile_handle() != nullptr;
}

/// The caching allocator may hand out memory that kernels queued on the current
/// stream still use (freed by an earlier owner), and a fresh tensor may still be
/// being computed: cuFile moves bytes outside any stream, so the stream must be
/// idle before it starts.
void wait_for_stream(const at::Tensor& t) {
  c10::impl::VirtualGuardImpl guard(t.device().type());
  guard.getStream(t.device()).synchronize();
}

// Device transfers through two pinned host buffers, double-buffered. `observe`
// sees each chunk's host bytes in file order (for checksums).
std::size_t bounce_read(FileHandle& f, const at::Tensor& dst, std::uint64_t offset, const HostBytes& observe) {
  const std::size_t total = tensor_bytes(dst);
  const at::Tensor flat = dst.view({-1}).view(at::kByte);
  const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
  const std::size_t chunk = std::min(total, kBounceChunk);
  at::Tensor host[2] = {at::empty({static_cast<std::int64_t>(chunk)}, pinned),
                        at::empty({static_cast<std::int64_t>(chunk)}, pinned)};
  c10::impl::VirtualGuardImpl guard(dst.device().type());
  const c10::Stream stream = guard.getStream(dst.device());
  c10::Event done[2] = {c10::Event(dst.device().type()), c10::Event(dst.device().type())};
  std::size_t pos = 0;
  for (int i = 0; pos < total; ++i) {
    const int b = i % 2;
    if (i >= 2) wait(done[b]);  // the copy out of this buffer has finished
    const std::size_t len = std::min(chunk, total - pos);
    const std::size_t got = f.read(host[b].data_ptr(), len, offset + pos);
    if (got > 0) {
      if (observe) observe(host[b].data_ptr(), got);
      flat.narrow(0, static_cast<std::int64_t>(pos), static_cast<std::int64_t>(got))
          .copy_(host[b].narrow(0, 0, static_cast<std::int64_t>(got)), /*non_blocking=*/true);
      done[b].record(stream);
    }
    pos += got;
    if (got < len) break;  // end of file
  }
  for (auto& e : done) wait(e);
  return pos;
}

void bounce_write(FileHandle& f, const at::Tensor& src, std::uint64_t offset) {
  const std::size_t total = tensor_bytes(src);
  const at::Tensor flat = src.view({-1}).view(at::kByte);
  const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
  const std::size_t chunk = std::min(total, kBounceChunk);
  for (std::size_t pos = 0; pos < total; pos += chunk) {
    const std::size_t len = std::min(chunk, total - pos);
    at::Tensor host = at::empty({static_cast<std::int64_t>(len)}, pinned);
    host.copy_(flat.narrow(0, static_cast<std::int64_t>(pos), static_cast<std::int64_t>(len)));  // synchronous
    f.write(host.data_ptr(), len, offset + pos);
  }
}

/// cuFileRead / cuFileWrite of a whole tensor, continued after short transfers: the bytes
/// moved (a read stops at end of file; a write that moves nothing is an error).
std::size_t cufile_transfer(FileHandle& f, const at::Tensor& t, std::uint64_t offset, bool write) {
  const shim::CuFileApi* api = shim::cufile();
  const std::size_t total = tensor_bytes(t);
  std::size_t pos = 0;
  while (pos < total) {
    const auto at = static_cast<off_t>(offset + pos);
    const ssize_t n = write ? api->write(f.cufile_handle(), t.data_ptr(), total - pos, at, static_cast<off_t>(pos))
                            : api->read(f.cufile_handle(), t.data_ptr(), total - pos, at, static_cast<off_t>(pos));
    if (n < 0 || (write && n == 0)) {
      throw OsError(str(write ? "cuFileWrite of " : "cuFileRead of ", total, " bytes at offset ", offset,
                        write ? " to " : " from ", f.path(), " failed at offset ", offset + pos, " (", n, ")"),
                    EIO);
    }
    if (n == 0) break;
    pos += static_cast<std::size_t>(n);
  }
  return pos;
}

std::size_t cufile_read(FileHandle& f, const at::Tensor& dst, std::uint64_t offset) {
  return cufile_transfer(f, dst, offset, /*write=*/false);
}

void cufile_write(FileHandle& f, const at::Tensor& src, std::uint64_t offset) {
  cufile_transfer(f, src, offset, /*write=*/true);
}

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
  if (dst.is_cpu()) {
    const std::size_t got = file.read(dst.data_ptr(), tensor_bytes(dst), offset);
    if (observe && got > 0) observe(dst.data_ptr(), got);
    return got;
  }
  // This thread talks to dst's GPU (cuFile needs its context current; the engine's
  // async calls run on its I/O workers, threads of their own).
  const c10::DeviceGuard on_device(dst.device());
  if (!observe && use_cufile(file)) {
    wait_for_stream(dst);
    return cufile_read(file, dst, offset);
  }
  return bounce_read(file, dst, offset, observe);
}

void write_from(FileHandle& file, const at::Tensor& src, std::uint64_t offset) {
  check_tensor(src, "write_from");
  if (src.is_cpu()) return file.write(src.data_ptr(), tensor_bytes(src), offset);
  const c10::DeviceGuard on_device(src.device());
  if (use_cufile(file)) {
    wait_for_stream(src);  // the tensor's producers have finished
    return cufile_write(file, src, offset);
  }
  bounce_write(file, src, offset);
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

std::string device_path(FileHandle& file) {
  return use_cufile(file) ? (device_probe().gpudirect ? "cufile" : "cufile (compatibility mode)")
                          : "bounce (pinned host buffers)";
}

std::string device_transfers() { return device_probe().description; }

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
