// A minimal HTTP/1.0 responder for Prometheus scrapes.
#include "ifec/live/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ifec/common/checks.h"

namespace ifec::live {

std::string metric(const std::string& name, const std::string& labels, double value) {
  char v[64];
  std::snprintf(v, sizeof v, "%.17g", value);
  return name + (labels.empty() ? "" : "{" + labels + "}") + " " + v + "\n";
}

MetricsServer::MetricsServer(EpollLoop& loop, const std::string& listen, std::function<std::string()> render)
    : loop_(loop), render_(std::move(render)) {
  const auto colon = listen.rfind(':');
  IFEC_CHECK(colon != std::string::npos, "metrics address '" << listen << "' is not IP:PORT");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(listen.substr(colon + 1))));
  IFEC_CHECK(inet_pton(AF_INET, listen.substr(0, colon).c_str(), &a.sin_addr) == 1,
             "metrics address '" << listen << "': not an IPv4 address");
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) {
    const int err = errno;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    IFEC_FAIL("metrics: cannot listen on " << listen << ": " << std::strerror(err));
  }
  loop_.watch(fd_, [this] { accept_one(); });
}

MetricsServer::~MetricsServer() {
  if (fd_ >= 0) {
    loop_.unwatch(fd_);
    close(fd_);
  }
}

void MetricsServer::accept_one() {
  const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) {
    return;
  }
  // The request line arrives with the connection; wait for it briefly (a scraper sends it at once).
  char req[2048];
  pollfd p{c, POLLIN, 0};
  ssize_t n = poll(&p, 1, 200) == 1 ? read(c, req, sizeof req - 1) : -1;
  req[n > 0 ? n : 0] = 0;
  std::string body;
  std::string head;
  if (std::strncmp(req, "GET /metrics", 12) == 0) {
    body = render_();
    head = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n";
  } else {
    body = "not found: GET /metrics\n";
    head = "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n";
  }
  head += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  const std::string out = head + body;
  size_t off = 0;
  while (off < out.size()) {
    const ssize_t w = write(c, out.data() + off, out.size() - off);
    if (w <= 0) {
      break;
    }
    off += static_cast<size_t>(w);
  }
  close(c);
}

}  // namespace ifec::live
