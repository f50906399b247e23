#pragma once
/// \file
/// Tensors in and out of files through the engine (file_handle.hpp): a tensor is
/// its memory (memory.hpp), host for CPU tensors (pageable or pinned, read and
/// written in place), device for CUDA ones, whose DeviceAccess is libtorch's
/// (pinned buffers from its host allocator, copies on the caller's current
/// stream, an event per bounce buffer: no device-wide sync; ROCm works the same).
/// Every device transfer makes the tensor's GPU current on the calling thread
/// (cuFile needs its context there). The device helpers at the end
/// (resolve_device, the allocator's and the driver's free bytes) are libtorch's
/// view of the devices the engine moves to.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>

#include "medfast/io/file_handle.hpp"

namespace medfast::io {

/// A CPU uint8 tensor of `bytes` whose memory is aligned for O_DIRECT.
at::Tensor empty_aligned(std::size_t bytes);

/// The bytes of `t`'s elements (numel x element size; a contiguous tensor's storage span).
inline std::size_t tensor_bytes(const at::Tensor& t) {
  return static_cast<std::size_t>(t.numel()) * t.element_size();
}

/// Reads dst.nbytes() bytes at `offset` into a contiguous tensor (CPU or
/// CUDA); returns the bytes read (fewer only at end of file). With `observe`,
/// every byte passes through host memory and is shown to it (a CUDA tensor then
/// takes the pinned bounce, not cuFile): checksums without a second pass.
std::size_t read_into(FileHandle& file, const at::Tensor& dst, std::uint64_t offset = 0,
                      const HostBytes& observe = {});
/// Writes src's bytes (a contiguous tensor, CPU or CUDA) at `offset`.
void write_from(FileHandle& file, const at::Tensor& src, std::uint64_t offset = 0);

std::future<std::size_t> read_into_async(FileHandle& file, const at::Tensor& dst, std::uint64_t offset = 0);
std::future<void> write_from_async(FileHandle& file, const at::Tensor& src, std::uint64_t offset = 0);

/// A device name made definite: "cuda" (no index) becomes the calling thread's current
/// CUDA device, as torch means it (`current`, for tests: what the current device is).
/// Worker threads start on GPU 0 whatever their creator chose, so a plain "cuda" resolved
/// there puts every rank's tensors (and a CUDA context) on GPU 0: resolve on the thread
/// that chose the device and hand the index on. Other names come back parsed; where there
/// is no CUDA, "cuda" stays without an index (whoever uses it reports that). "auto" is the
/// current CUDA device where CUDA is usable, else the CPU (train::choose_device's rule, with
/// its reasons). ValueError for a name that is not a device.
at::Device resolve_device(const std::string& name, const std::function<int()>& current = {});

/// libtorch's CUDA caching allocator on one device: bytes allocated and reserved, now and at
/// their peaks (since the last reset).
struct CudaAllocatorBytes {
  std::int64_t allocated = 0, reserved = 0, allocated_peak = 0, reserved_peak = 0;
};
/// nullopt where this build has no libtorch CUDA headers, or before the allocator's first
/// allocation on that device (libtorch 2.11 refuses its statistics until then: "Invalid
/// device argument", seen on the first GPU machine).
std::optional<CudaAllocatorBytes> cuda_allocator_bytes(c10::DeviceIndex index);

/// Bytes new tensors can still take on a CUDA device: the driver's free memory plus what
/// libtorch's caching allocator holds unused; `total` (if given) gets the device's size.
/// nullopt where unknown (not a CUDA device, or a libtorch built without CUDA).
std::optional<std::uint64_t> cuda_free_bytes(const at::Device& device, std::uint64_t* total = nullptr);

}  // namespace medfast::io
