/// \file
/// The OS layer's own helpers for its sources (not installed, not for layers above):
/// a descriptor closed on scope exit and errno's text.
#pragma once

#include <unistd.h>

#include <cstring>
#include <string>

namespace medfast::os::detail {

/// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// strerror(e) as a string.
inline std::string errno_text(int e) { return std::strerror(e); }

}  // namespace medfast::os::detail
