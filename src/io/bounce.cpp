// The pinned bounce (file_backend.hpp): device memory the backend cannot reach moves
// through two page-locked host buffers that DeviceAccess provides and copies.
#include <algorithm>

#include "file_backend.hpp"

namespace medfast::io::detail {

std::size_t bounce_read(const HostRead& read_host, const Memory& dst, std::uint64_t off, const HostBytes& observe) {
  DeviceAccess& device = *dst.device;
  const std::size_t chunk = std::min(dst.size, device.bounce_chunk());
  std::shared_ptr<void> host[2] = {device.pinned(chunk), dst.size > chunk ? device.pinned(chunk) : nullptr};
  bool queued[2] = {false, false};
  // No copy may still read a buffer when it is reused or freed (also after an error).
  const auto settle = [&](int b) {
    if (queued[b]) device.wait(b);
    queued[b] = false;
  };
  const auto drain = [&] {
    settle(0);
    settle(1);
  };
  std::size_t pos = 0;
  try {
    for (int i = 0; pos < dst.size; ++i) {
      const int b = i % 2;
      settle(b);  // the copy out of this buffer has finished
      char* at = static_cast<char*>(host[b].get());
      const std::size_t len = std::min(chunk, dst.size - pos);
      const std::size_t got = read_host(at, len, off + pos);
      if (got > 0) {
        if (observe) observe(at, got);
        device.copy_to_device(dst.bytes() + pos, at, got, b);
        queued[b] = true;
      }
      pos += got;
      if (got < len) break;  // end of file
    }
  } catch (...) {
    drain();
    throw;
  }
  drain();
  return pos;
}

void bounce_write(const HostWrite& write_host, const Memory& src, std::uint64_t off) {
  DeviceAccess& device = *src.device;
  const std::size_t chunk = std::min(src.size, device.bounce_chunk());
  const std::shared_ptr<void> host = device.pinned(chunk);
  char* at = static_cast<char*>(host.get());
  for (std::size_t pos = 0; pos < src.size; pos += chunk) {
    const std::size_t len = std::min(chunk, src.size - pos);
    device.copy_to_host(at, src.bytes() + pos, len);
    write_host(at, len, off + pos);
  }
}

}  // namespace medfast::io::detail
