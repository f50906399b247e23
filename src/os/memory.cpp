#include "medfast/os/memory.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "medfast/core/error.hpp"

namespace medfast::os {

namespace {
constexpr std::size_t kPage = 4096;
constexpr std::size_t kHugePage = 2u << 20;
// Below this, malloc-class allocation is cheaper than a fresh mapping.
constexpr std::size_t kMmapThreshold = 4u << 20;
}  // namespace

Buffer Buffer::allocate(std::size_t size) {
  Buffer b;
  b.size_ = size;
  if (size == 0) return b;
  if (size < kMmapThreshold) {
    void* p = nullptr;
    const std::size_t rounded = (size + kPage - 1) / kPage * kPage;
    if (::posix_memalign(&p, kPage, rounded) != 0) {
      throw OsError(str("cannot allocate ", size, " bytes of host memory"), ENOMEM);
    }
    b.data_ = p;
    return b;
  }
  // Map with room to align the start to a huge page, then trim the slack so
  // that free() can unmap exactly [data, data + rounded size).
  const std::size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
  const std::size_t span = rounded + kHugePage;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    throw OsError(str("cannot allocate ", size, " bytes of host memory: ", std::strerror(errno)), errno);
  }
  auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) ::munmap(raw, aligned - base);
  const std::uintptr_t end = aligned + rounded;
  const std::uintptr_t span_end = base + span;
  if (span_end > end) ::munmap(reinterpret_cast<void*>(end), span_end - end);
  b.data_ = reinterpret_cast<void*>(aligned);
  ::madvise(b.data_, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return b;
}

void Buffer::free(void* data, std::size_t size) {
  if (data == nullptr) return;
  if (size < kMmapThreshold) {
    std::free(data);
    return;
  }
  const std::size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
  ::munmap(data, rounded);
}

Buffer::Buffer(Buffer&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    free(data_, size_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { free(data_, size_); }

void* Buffer::release() {
  void* p = data_;
  data_ = nullptr;
  size_ = 0;
  return p;
}

}  // namespace medfast::os
