#include "medfast/os/memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "medfast/core/error.hpp"

namespace medfast::os {

namespace {
constexpr std::size_t kPage = 4096;
constexpr std::size_t kHugePage = 2u << 20;
// Below this, malloc-class allocation is cheaper than a fresh mapping.
constexpr std::size_t kMmapThreshold = 4u << 20;
std::size_t rounded_huge(std::size_t size) { return (size + kHugePage - 1) / kHugePage * kHugePage; }

// Large mappings: live ones by address (to know their capacity), free ones by
// capacity (the pool).
struct Pool {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> capacity;
  std::multimap<std::size_t, void*> free_blocks;
  std::uint64_t pooled = 0;
  std::uint64_t limit = kDefaultBufferPoolBytes;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: tensors may free buffers during static destruction
  return *p;
}

void* map_huge(std::size_t rounded) {
  // Map with room to align the start to a huge page, then trim the slack.
  const std::size_t span = rounded + kHugePage;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    throw OsError(str("cannot allocate ", rounded, " bytes of host memory: ", std::strerror(errno)), errno);
  }
  auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) ::munmap(raw, aligned - base);
  const std::uintptr_t end = aligned + rounded;
  const std::uintptr_t span_end = base + span;
  if (span_end > end) ::munmap(reinterpret_cast<void*>(end), span_end - end);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return p;
}

}  // namespace

namespace {

// A small file of /proc or /sys whole ("" where it cannot be read): their size is 0 to stat.
std::string read_small_file(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || text.size() > (1u << 20)) break;
    text.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

// The first number of `text` after `key` (0 where absent); "max" reads as the largest.
std::uint64_t number_after(const std::string& text, const std::string& key) {
  const auto at = text.find(key);
  if (at == std::string::npos) return 0;
  const char* p = text.c_str() + at + key.size();
  while (*p == ' ' || *p == '\t' || *p == ':') ++p;
  if (std::strncmp(p, "max", 3) == 0) return ~std::uint64_t{0};
  return std::strtoull(p, nullptr, 10);
}

}  // namespace

std::uint64_t available_memory_bytes() {
  const std::uint64_t kib = number_after(read_small_file("/proc/meminfo"), "MemAvailable");
  std::uint64_t available = kib * 1024;
  // A cgroup v2 limit (a container's): what is left of it.
  const std::uint64_t limit = number_after(read_small_file("/sys/fs/cgroup/memory.max"), "");
  const std::uint64_t used = number_after(read_small_file("/sys/fs/cgroup/memory.current"), "");
  if (limit > 0 && limit != ~std::uint64_t{0}) {
    const std::uint64_t left = limit > used ? limit - used : 0;
    available = available == 0 ? left : std::min(available, left);
  }
  return available;
}

void set_buffer_pool_limit(std::uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(pool().mutex);
    pool().limit = bytes;
  }
  if (buffer_pool_bytes() > bytes) trim_buffer_pool();
}

std::uint64_t buffer_pool_limit() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().limit;
}

std::uint64_t buffer_pool_bytes() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().pooled;
}

void trim_buffer_pool() {
  std::multimap<std::size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(pool().mutex);
    blocks.swap(pool().free_blocks);
    for (const auto& [cap, p] : blocks) pool().capacity.erase(p);
    pool().pooled = 0;
  }
  for (const auto& [cap, p] : blocks) ::munmap(p, cap);
}

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
  const std::size_t rounded = rounded_huge(size);
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lock(pl.mutex);
    // Reuse a pooled mapping of at least this size and at most 25% larger.
    auto it = pl.free_blocks.lower_bound(rounded);
    if (it != pl.free_blocks.end() && it->first <= rounded + rounded / 4) {
      b.data_ = it->second;
      pl.pooled -= it->first;
      pl.free_blocks.erase(it);
      return b;
    }
  }
  void* p = map_huge(rounded);
  {
    std::lock_guard<std::mutex> lock(pl.mutex);
    pl.capacity[p] = rounded;
  }
  b.data_ = p;
  return b;
}

void Buffer::free(void* data, std::size_t size) {
  if (data == nullptr) return;
  if (size < kMmapThreshold) {
    std::free(data);
    return;
  }
  Pool& pl = pool();
  std::size_t cap = 0;
  {
    std::lock_guard<std::mutex> lock(pl.mutex);
    auto it = pl.capacity.find(data);
    if (it == pl.capacity.end()) return;  // not ours: nothing sensible to do
    cap = it->second;
    if (pl.pooled + cap <= pl.limit) {
      pl.free_blocks.emplace(cap, data);
      pl.pooled += cap;
      return;
    }
    pl.capacity.erase(it);
  }
  ::munmap(data, cap);
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
