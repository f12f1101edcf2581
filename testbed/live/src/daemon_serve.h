// Private to the live daemons: the command line both share and the signal-driven run loop around a daemon. Each
// daemon's main is in its own file (switchd.cpp, hostd.cpp), so ifec-switchd links no part of hostd (nor LibTorch).
#pragma once

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "ifec/live/daemons.h"

namespace ifec::live {

// Fills `o` from the command line; false after --help (printed). Throws Error naming a bad or missing option.
bool parse_daemon_options(int argc, char** argv, DaemonOptions* o, const char* what);

// Runs the daemon until SIGTERM or SIGINT, which a thread waits for on a signalfd.
template <typename Daemon>
int serve(int argc, char** argv, const char* what) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts: all inherit the mask
  try {
    DaemonOptions o;
    if (!parse_daemon_options(argc, argv, &o, what)) {
      return 0;
    }
    Daemon d(o);
    const int sfd = signalfd(-1, &set, SFD_CLOEXEC);
    std::thread waiter([&d, sfd] {
      signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) > 0) {
        d.stop();
      }
    });
    std::fprintf(stderr, "%s %s: running\n", argv[0], o.node.c_str());
    std::string failure;
    try {
      d.run();
    } catch (const std::exception& e) {  // the waiter must be joined before this frame unwinds
      failure = e.what();
    }
    pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter if the daemon stopped on its own
    waiter.join();
    close(sfd);
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
