// Private to the live daemons: the command line both share and the signal-driven run loop around a daemon. Each
// daemon's main is in its own file (switchd.cpp, hostd.cpp), so ifec-switchd links no part of hostd (nor LibTorch).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/common/heap.h"
#include "ifec/live/daemons.h"

namespace ifec::live {

// Fills `o` from the command line; false after --help (printed). Throws Error naming a bad or missing option.
bool parse_daemon_options(int argc, char** argv, DaemonOptions* o, const char* what);

// Heap a daemon touches before it serves, so that its first operation's frames, slots and buffers reuse written
// pages: each first write to a fresh page costs 15-19 us on this project's VMs (common::fresh_page_ns), and a
// switch's first 1 MiB in-fabric AllReduce faulted in 840-1,130 of them on its one forwarding thread.
inline constexpr size_t kWarmHeapBytes = size_t{16} << 20;

// SIGTERM/SIGINT write one byte here (the handler does only that: async-signal-safe); serve()'s waiter reads it.
inline int g_stop_pipe[2] = {-1, -1};

extern "C" inline void ifec_on_stop_signal(int) {
  const char one = 1;
  const ssize_t n = write(g_stop_pipe[1], &one, 1);
  (void)n;
}

// Runs the daemon until SIGTERM or SIGINT. The daemon's own threads start with both blocked; a waiter thread takes
// them through a handler, which also runs when the signal lands on a thread a library started before main (LibTorch's
// and OpenBLAS's pools in hostd), so the signal always ends in a clean stop, never in the default action.
template <typename Daemon>
int serve(int argc, char** argv, const char* what) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread of ours starts: all inherit the mask
  common::keep_freed_heap();  // frames churn through the heap: keep it, do not trim and refault it (common/heap.h)
  try {
    DaemonOptions o;
    if (!parse_daemon_options(argc, argv, &o, what)) {
      return 0;
    }
    IFEC_CHECK(pipe2(g_stop_pipe, O_CLOEXEC) == 0, "cannot make the stop pipe: " << std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = ifec_on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    Daemon d(o);
    std::thread waiter([&d, set] {
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // one of ours always takes the signals
      char c = 0;
      ssize_t n;
      while ((n = read(g_stop_pipe[0], &c, 1)) < 0 && errno == EINTR) {
      }
      if (n == 1 && c == 1) {
        d.stop();
      }
    });
    std::fprintf(stderr, "%s %s: running\n", argv[0], o.node.c_str());
    std::string failure;
    common::warm_heap(kWarmHeapBytes);  // on the thread that runs the loop (its arena)
    try {
      d.run();
    } catch (const std::exception& e) {  // the waiter must be joined before this frame unwinds
      failure = e.what();
    }
    const char zero = 0;  // wakes the waiter if the daemon stopped on its own
    const ssize_t n = write(g_stop_pipe[1], &zero, 1);
    (void)n;
    waiter.join();
    if (!failure.empty()) {
      std::fprintf(stderr, "%s %s: stopped on an error: %s\n", argv[0], o.node.c_str(), failure.c_str());
      return 1;
    }
    std::fprintf(stderr, "%s %s: stopped\n", argv[0], o.node.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}

}  // namespace ifec::live
