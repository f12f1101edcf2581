// Prometheus metrics over HTTP: GET /metrics answers the text exposition format (version 0.0.4) that `render`
// writes; anything else is 404. Served on the daemon's event loop (a request is answered between two frames), so
// the numbers are a consistent snapshot of the loop's state.
#pragma once

#include <functional>
#include <string>

#include "ifec/live/epoll_loop.h"

namespace ifec::live {

class MetricsServer {
 public:
  // Listens on "IP:PORT" (throws Error naming it when the address cannot be bound).
  MetricsServer(EpollLoop& loop, const std::string& listen, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  void accept_one();
  EpollLoop& loop_;
  int fd_ = -1;
  std::function<std::string()> render_;
};

// One metric line: name{labels} value.
std::string metric(const std::string& name, const std::string& labels, double value);

}  // namespace ifec::live
