#pragma once
/// \file
/// Host memory standing in for a device (memory.hpp's DeviceAccess), so that the engine's
/// device paths (the pinned bounce, the cufile backend) run without a GPU. A copy to the
/// "device" is queued and made only when its slot is waited for, as a stream would make it
/// later: a bounce buffer reused before its copy was waited for shows as wrong bytes.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "medfast/io/memory.hpp"

namespace medfast::io::test_device {

class HostAsDevice final : public DeviceAccess {
 public:
  explicit HostAsDevice(std::size_t chunk = 64u << 10) : chunk_(chunk) {}
  ~HostAsDevice() override {
    for (const auto& q : queued_) {
      if (!q.empty()) std::abort();  // a copy never waited for: the engine lost track of it
    }
  }

  void wait_for_stream() override { ++stream_waits; }
  std::shared_ptr<void> pinned(std::size_t size) override {
    ++pinned_buffers;
    return std::shared_ptr<void>(std::malloc(size), std::free);
  }
  void copy_to_device(void* dst, const void* src, std::size_t size, int slot) override {
    queued_[slot].push_back({dst, src, size});
    ++to_device;
  }
  void copy_to_host(void* dst, const void* src, std::size_t size) override {
    std::memcpy(dst, src, size);
    ++to_host;
  }
  void wait(int slot) override {
    for (const Copy& c : queued_[slot]) std::memcpy(c.dst, c.src, c.size);
    queued_[slot].clear();
  }
  std::size_t bounce_chunk() const override { return chunk_; }

  int stream_waits = 0, pinned_buffers = 0, to_device = 0, to_host = 0;

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::size_t size;
  };
  std::size_t chunk_;
  std::vector<Copy> queued_[2];
};

}  // namespace medfast::io::test_device
