#pragma once
/// \file
/// The memory the engine reads into and writes from, host or device, as kvikio's
/// FileHandle.pread/pwrite take it: a pointer and a size, and for device memory the
/// DeviceAccess that reaches it. The engine stays free of any device runtime: what it
/// needs of the device (pinned bounce buffers, copies ordered on the caller's stream, a
/// wait for that stream) comes through DeviceAccess, which the layer that knows the
/// runtime supplies (io/tensor_io.cpp: libtorch's streams and events; tests: host memory
/// standing in for a device).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace medfast::io {

/// Sees bytes read, in file order, while they are in host memory.
using HostBytes = std::function<void(const void* data, std::size_t size)>;

/// What the engine may do with one device's memory. One object per transfer (or per
/// thread): its copies are ordered on the stream current when it was made.
class DeviceAccess {
 public:
  virtual ~DeviceAccess() = default;
  /// Blocks until the work queued on the caller's stream has finished: before a transfer
  /// outside any stream (cuFile), the memory's producers (or, for a read, the work the
  /// allocator took the memory from) must be done.
  virtual void wait_for_stream() = 0;
  /// Page-locked host memory of `size` bytes, alive while the pointer is held.
  virtual std::shared_ptr<void> pinned(std::size_t size) = 0;
  /// Queues a copy of `size` bytes from host `src` (pinned) to device `dst`; `slot` (0 or
  /// 1) names the bounce buffer it came from, so that wait(slot) can wait for it.
  virtual void copy_to_device(void* dst, const void* src, std::size_t size, int slot) = 0;
  /// Copies `size` bytes from device `src` to host `dst` (pinned), returning when done.
  virtual void copy_to_host(void* dst, const void* src, std::size_t size) = 0;
  /// Blocks until the copies queued with `slot` have finished.
  virtual void wait(int slot) = 0;
  /// Bytes per bounce buffer (two are used, double-buffered).
  virtual std::size_t bounce_chunk() const { return std::size_t{16} << 20; }
};

/// A span of host or device memory.
struct Memory {
  void* data = nullptr;
  std::size_t size = 0;
  DeviceAccess* device = nullptr;  ///< null: host memory

  bool on_host() const { return device == nullptr; }
  char* bytes() const { return static_cast<char*>(data); }
  static Memory host(void* data, std::size_t size) { return {data, size, nullptr}; }
  /// Memory the engine only reads (a write's source); never written through.
  static Memory host(const void* data, std::size_t size) { return {const_cast<void*>(data), size, nullptr}; }
  static Memory on_device(void* data, std::size_t size, DeviceAccess& access) { return {data, size, &access}; }
  static Memory on_device(const void* data, std::size_t size, DeviceAccess& access) {
    return {const_cast<void*>(data), size, &access};
  }
};

}  // namespace medfast::io
