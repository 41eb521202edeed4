// Finding out whether an HTTP client hung up while its request is still being computed.
// cpp-httplib 0.11 does not hand handlers their socket, so the connection is found by its
// addresses among the process's open sockets (Linux: /proc/self/fd), then polled for
// POLLRDHUP / POLLHUP. A failed lookup (other platforms) just means "cannot tell".
// Stateless; thread-safe.
#pragma once

#include <string>

namespace peng::server {

// The fd of the accepted TCP connection whose peer is remote_addr:remote_port and whose local
// port is local_port; -1 if none is found.
int FindClientSocket(const std::string& remote_addr, int remote_port, int local_port);

// True when the peer of `fd` closed its side or the connection failed. false for fd < 0.
bool PeerHungUp(int fd);

}  // namespace peng::server
