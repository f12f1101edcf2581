// Namespaces and veths through iproute2 (the same commands a user would type).
#include "ifec/live/netns.h"

#include <fcntl.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ifec/common/checks.h"

namespace ifec::live {

int run_command(const std::vector<std::string>& argv, std::string* out) {
  IFEC_CHECK(!argv.empty(), "run_command: no program");
  int pipefd[2];
  IFEC_CHECK(pipe2(pipefd, O_CLOEXEC) == 0, "pipe: " << std::strerror(errno));
  const pid_t pid = fork();
  IFEC_CHECK(pid >= 0, "fork: " << std::strerror(errno));
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const std::string& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "%s: %s\n", argv[0].c_str(), std::strerror(errno));
    _exit(127);
  }
  close(pipefd[1]);
  std::string text;
  std::array<char, 4096> buf;
  ssize_t n;
  while ((n = read(pipefd[0], buf.data(), buf.size())) > 0 || (n < 0 && errno == EINTR)) {
    text.append(buf.data(), n > 0 ? static_cast<size_t>(n) : 0);
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (out != nullptr) {
    *out = text;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Namespaces this project's tests and benches name "ifec-<letter><pid>-..." whose process is gone (it crashed before
// its destructors ran): removed, so a crash leaves nothing behind for long. Others' namespaces are not touched.
void reap_stale_namespaces() {
  std::string list;
  if (run_command({"ip", "netns", "list"}, &list) != 0) {
    return;
  }
  size_t pos = 0;
  while (pos < list.size()) {
    const size_t end = list.find('\n', pos);
    const std::string line = list.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? list.size() : end + 1;
    const std::string name = line.substr(0, line.find(' '));
    if (name.size() < 8 || name.compare(0, 5, "ifec-") != 0 || !std::isalpha(static_cast<unsigned char>(name[5]))) {
      continue;
    }
    const size_t dash = name.find('-', 6);
    const std::string digits = name.substr(6, dash == std::string::npos ? std::string::npos : dash - 6);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      run_command({"ip", "netns", "del", name});
    }
  }
}

bool interface_usable(int fd, const std::string& ifname) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0 || (ifr.ifr_flags & IFF_UP) == 0 || (ifr.ifr_flags & IFF_RUNNING) == 0) {
    return false;
  }
  ethtool_value carrier{ETHTOOL_GLINK, 0};
  ifr.ifr_data = reinterpret_cast<char*>(&carrier);
  return ioctl(fd, SIOCETHTOOL, &ifr) != 0 || carrier.data != 0;
}

std::string netns_unavailable() {
  if (geteuid() != 0) {
    return "needs root (network namespaces and veths)";
  }
  reap_stale_namespaces();
  std::string out;
  const std::string probe = "ifec-probe-" + std::to_string(getpid());
  if (run_command({"ip", "netns", "add", probe}, &out) != 0) {
    return "cannot create a network namespace: " + out;
  }
  run_command({"ip", "netns", "del", probe});
  return "";
}

std::string mgmt_ip(int node) {
  const int host = node + 2;
  return "172.31." + std::to_string(host / 256) + "." + std::to_string(host % 256);
}

std::string mgmt_address(int node, int grpc_port) { return mgmt_ip(node) + ":" + std::to_string(grpc_port); }

NetnsGuard::NetnsGuard(const std::string& name) {
  if (name.empty()) {
    return;
  }
  // A name, not a path: '../x' would open some other file under /var/run/netns's parents.
  IFEC_CHECK(name.find('/') == std::string::npos && name != "." && name != "..",
             "network namespace '" << name << "': not a namespace name (one under /var/run/netns, no '/')");
  self_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  const int target = open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (self_ < 0 || target < 0) {
    const int err = errno;
    if (self_ >= 0) close(self_);
    if (target >= 0) close(target);
    self_ = -1;
    IFEC_FAIL("network namespace '" << name << "': " << std::strerror(err));
  }
  const int rc = setns(target, CLONE_NEWNET);
  const int err = errno;
  close(target);
  if (rc != 0) {
    close(self_);
    self_ = -1;
    IFEC_FAIL("network namespace '" << name << "': setns: " << std::strerror(err));
  }
}

NetnsGuard::~NetnsGuard() {
  if (self_ >= 0) {
    setns(self_, CLONE_NEWNET);
    close(self_);
  }
}

ScopedNetns::ScopedNetns(std::string name) : name_(std::move(name)) {
  std::string out;
  IFEC_CHECK(run_command({"ip", "netns", "add", name_}, &out) == 0, "network namespace " << name_ << ": " << out);
  ip({"link", "set", "lo", "up"});
}

ScopedNetns::~ScopedNetns() { run_command({"ip", "netns", "del", name_}); }

void ScopedNetns::ip(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"ip", "-n", name_};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  if (run_command(argv, &out) != 0) {
    std::string cmd;
    for (const std::string& a : argv) {
      cmd += (cmd.empty() ? "" : " ") + a;
    }
    IFEC_FAIL(cmd << ": " << out);
  }
}

void make_veth(const ScopedNetns& a, const std::string& a_if, const ScopedNetns& b, const std::string& b_if, int mtu) {
  a.ip({"link", "add", a_if, "mtu", std::to_string(mtu), "type", "veth", "peer", "name", b_if, "netns", b.name(), "mtu",
        std::to_string(mtu)});
  a.ip({"link", "set", a_if, "up"});
  b.ip({"link", "set", b_if, "up"});
}

}  // namespace ifec::live
