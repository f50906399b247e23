#pragma once
/// \file
/// Page-aligned host buffers. Large buffers are mmap-ed and advised for
/// transparent huge pages, so first-touch faults are few.
///
/// Freed large buffers go back to a bounded pool and are handed out again
/// for requests of a similar size (within 25%), as PyTorch's caching
/// allocators do: a loader that decodes volume after volume then writes into
/// memory that is already mapped, instead of paying the kernel to zero fresh
/// pages each time. The pool holds at most buffer_pool_limit() bytes; beyond
/// that, memory goes straight back to the OS.

#include <cstddef>
#include <cstdint>

#include "medfast/core/settings.hpp"

namespace medfast::os {

/// Bytes of freed buffers the pool may keep (0 disables pooling); default kDefaultBufferPoolBytes.
void set_buffer_pool_limit(std::uint64_t bytes);
std::uint64_t buffer_pool_limit();
/// Bytes currently held by the pool.
std::uint64_t buffer_pool_bytes();
/// Returns every pooled buffer to the OS.
void trim_buffer_pool();

/// Bytes of memory this process could still take without swapping: the kernel's
/// MemAvailable (/proc/meminfo), within a cgroup's memory limit less its usage where one is
/// set (a container's). 0 where neither can be read.
std::uint64_t available_memory_bytes();

/// A move-only, 4 KiB-aligned (2 MiB for large sizes) block of host memory.
class Buffer {
 public:
  Buffer() = default;
  /// Allocates `size` bytes (uninitialised). Throws OsError on failure.
  static Buffer allocate(std::size_t size);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  /// Gives up ownership; free it later with Buffer::free(ptr, size).
  void* release();
  static void free(void* data, std::size_t size);

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace medfast::os
