#pragma once
/// \file
/// Page-aligned host buffers. Large buffers are mmap-ed and advised for
/// transparent huge pages, which halves the cost of first-touch page faults
/// when a multi-hundred-MB volume is decoded into fresh memory.

#include <cstddef>

namespace medfast::os {

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
