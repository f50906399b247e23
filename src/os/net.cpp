#include "medfast/os/net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "medfast/core/error.hpp"
#include "fd.hpp"

namespace medfast::os {

using detail::errno_text;
using detail::Fd;

namespace {

/// A non-blocking connect to one address, waiting up to timeout_ms.
bool connects(const addrinfo& a, int timeout_ms) {
  Fd s{::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a.ai_protocol)};
  if (s.fd < 0) return false;
  if (::connect(s.fd, a.ai_addr, a.ai_addrlen) == 0) return true;
  if (errno != EINPROGRESS) return false;
  pollfd p{s.fd, POLLOUT, 0};
  int r;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return false;
  int err = 0;
  socklen_t len = sizeof err;
  return ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
}

}  // namespace

int free_tcp_port(const std::string& address) {
  Fd s{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (s.fd < 0) throw OsError(str("socket: ", errno_text(errno)), errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    throw OsError(str("bind(", address, ":0) to find a free port: ", errno_text(errno)), errno);
  }
  if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw OsError(str("getsockname: ", errno_text(errno)), errno);
  }
  return ntohs(a.sin_port);
}

bool tcp_connectable(const std::string& host, int port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (const addrinfo* a = found; a && !ok; a = a->ai_next) ok = connects(*a, timeout_ms);
  ::freeaddrinfo(found);
  return ok;
}

bool tcp_port_in_use(int port) {
  for (const int family : {AF_INET6, AF_INET}) {
    Fd s{::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    if (s.fd < 0) continue;  // no IPv6 here
    const int one = 1;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as c10d's server does
    int r;
    if (family == AF_INET6) {
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<std::uint16_t>(port));
      r = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      r = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (r == 0) return false;
    if (errno != EADDRINUSE) continue;
    return true;
  }
  return false;
}

}  // namespace medfast::os
