#pragma once
/// \file
/// TCP probes for the rendezvous (dist/) and the launcher: plain sockets, so
/// that medfast can tell "not there yet" and "port taken" apart before c10d
/// tries (and logs its own lines about it).
#include <string>

namespace medfast::os {

/// A TCP port on `address` that nobody listens on now (the kernel's choice for
/// port 0). Another process may take it before it is used, as with torchrun's.
int free_tcp_port(const std::string& address = "127.0.0.1");

/// Whether something accepts TCP connections at host:port within `timeout_ms`
/// (the host resolved like getaddrinfo does; any of its addresses counts).
bool tcp_connectable(const std::string& host, int port, int timeout_ms);

/// Whether a listening socket holds `port` on this machine (binding it on
/// every address fails with EADDRINUSE).
bool tcp_port_in_use(int port);

}  // namespace medfast::os
