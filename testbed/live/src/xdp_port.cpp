// AF_XDP port: the fabric XDP program on a BPF link, one AF_XDP socket on receive queue 0 with its UMEM, the RX and
// fill rings drained and refilled in batches, the TX ring kicked once per batch of frames; open_fabric_port.
#include "ifec/live/xdp_port.h"

#include <linux/ethtool.h>
#include <linux/if_link.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/live/netns.h"

#if IFEC_HAVE_XDP
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <xdp/libxdp.h>
#include <xdp/xsk.h>

#include "ifec_fabric_bpf.h"  // kIfecFabricBpfObject: testbed/live/bpf/ifec_fabric.bpf.c, compiled by the build
#endif

// Linux 6.6's multi-buffer AF_XDP, newer than the system's uapi headers may be.
#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif
#ifndef XDP_MAX_TX_BUDGET
#define XDP_MAX_TX_BUDGET 9
#endif

namespace ifec::live {

namespace {

constexpr common::TimeNs kBusyRetryNs = 20'000;  // as AfPacketPort's: a full TX ring is tried again this soon

}  // namespace

FabricDriver parse_fabric_driver(const std::string& name) {
  if (name == "auto") {
    return FabricDriver::kAuto;
  }
  if (name == "af_xdp") {
    return FabricDriver::kAfXdp;
  }
  if (name == "af_packet") {
    return FabricDriver::kAfPacket;
  }
  IFEC_FAIL("fabric driver '" << name << "' is not one of auto, af_xdp, af_packet");
}

const char* fabric_driver_name(FabricDriver driver) {
  switch (driver) {
    case FabricDriver::kAuto:
      return "auto";
    case FabricDriver::kAfXdp:
      return "af_xdp";
    case FabricDriver::kAfPacket:
      return "af_packet";
  }
  return "?";
}

OpenedFabricPort open_fabric_port(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps,
                                  const std::string& netns, size_t max_frame, FabricDriver prefer) {
  OpenedFabricPort out;
  std::string why_not_xdp;
  if (prefer != FabricDriver::kAfPacket) {
    try {
      out.port = std::make_unique<XdpPort>(loop, ifname, rate_bps, netns, max_frame);
      out.description = out.port->driver();
      return out;
    } catch (const common::Error& e) {
      if (prefer == FabricDriver::kAfXdp) {
        throw;
      }
      why_not_xdp = e.what();
    }
  }
  out.port = std::make_unique<AfPacketFabricPort>(loop, ifname, rate_bps, netns, max_frame);
  out.description = out.port->driver();
  if (!why_not_xdp.empty()) {
    out.description += "; AF_XDP not used: " + why_not_xdp;
  }
  return out;
}

AfPacketCounters XdpPort::port_counters() const { return common::counters_from_map<AfPacketCounters>(counter_map()); }

std::map<std::string, uint64_t> XdpPort::counter_map() const { return common::counters_to_map(counters()); }

std::string XdpPort::driver() const {
  return std::string("af_xdp (") + (native_ ? "native XDP" : "generic (skb) XDP") + ", " +
         (zero_copy_ ? "zero-copy" : "copy mode") + ", queue 0)";
}

bool XdpPort::refresh_link() {
  const bool up = interface_usable(ctl_fd_, ifname_);
  const bool changed = up != up_;
  up_ = up;
  return changed;
}

// Scheduled member calls check alive_ first: a port destroyed with a retry or a kick outstanding is not called.
void XdpPort::later(common::TimeNs at, void (XdpPort::*fn)()) {
  std::weak_ptr<bool> alive = alive_;
  loop_.schedule(at, [this, alive, fn] {
    if (!alive.expired()) {
      (this->*fn)();
    }
  });
}

void XdpPort::took(size_t frame_bytes, common::TimeNs now) {
  counters_.tx_frames++;
  counters_.tx_bytes += frame_bytes;
  counters_.paced += gate_.took(frame_bytes, now);
}

bool XdpPort::send(std::vector<uint8_t>&& frame) {
  if (!up_ || gate_.busy()) {
    counters_.tx_refused++;
    return false;
  }
  if (frame.empty() || frame.size() > max_frame_) {
    counters_.tx_errors++;  // AF_PACKET's sendto() fails the same frames (EMSGSIZE)
    return false;
  }
  const size_t bytes = frame.size();
  const common::TimeNs now = loop_.now();
  if (wire_.hold(gate_.last_bit(now, bytes), frame, now)) {
    took(bytes, now);
    return true;
  }
  if (submit(frame)) {
    submitted();
    took(frame.size(), now);
    return true;
  }
  // The TX ring or its chunks are all in use: keep this frame and try again shortly; the owner waits for tx_ready.
  counters_.tx_ring_full++;
  pending_ = std::move(frame);
  gate_.set_busy(true);
  if (!retry_pending_) {
    retry_pending_ = true;
    later(loop_.now() + kBusyRetryNs, &XdpPort::retry_pending);
  }
  return true;
}

void XdpPort::retry_pending() {
  retry_pending_ = false;
  kick();
  if (!submit(pending_)) {
    retry_pending_ = true;
    later(loop_.now() + kBusyRetryNs, &XdpPort::retry_pending);
    return;
  }
  const size_t bytes = pending_.size();
  pending_.clear();
  gate_.set_busy(false);
  submitted();
  took(bytes, loop_.now());
}

#if IFEC_HAVE_XDP

namespace {

// UMEM: 4 KiB chunks (a page each, as copy mode and most zero-copy drivers want). RX owns kRxChunks of them, TX
// kTxChunks. The kernel writes a received frame XDP_PACKET_HEADROOM into its chunk, so one chunk holds 3840 bytes of
// frame; longer frames take several (multi-buffer). RX chunks circulate through the fill ring in order, so each frame
// lands in the chunk least recently read: with 2,048 of them (8 MiB a port), reading a frame's first bytes was most
// of a daemon's user time on this project's 2-core VM (a page not touched for thousands of frames; its hypervisor
// makes that dear), and superpod-8x2's 1 MiB in-fabric AllReduce took 105-272 ms with 40-230 contributions resent.
// With 256 (1 MiB a port: a burst of 256 frames while the daemon is not running, 85 jumbo frames) it takes 20-30 ms
// with none, once warm; a longer burst is dropped in the kernel and counted (rx_dropped), as a full AF_PACKET buffer.
constexpr uint32_t kChunk = XSK_UMEM__DEFAULT_FRAME_SIZE;
constexpr uint32_t kRxChunks = 256;
constexpr uint32_t kTxChunks = 1024;
constexpr uint32_t kRxRoom = kChunk - XDP_PACKET_HEADROOM;
constexpr uint32_t kRxBatch = 64;    // descriptors per RX ring read
constexpr uint32_t kKickBatch = 32;  // descriptors that make a kick at once rather than at the end of the turn
constexpr uint32_t kTxBudget = 256;  // descriptors one sendto() may transmit (Linux >= 6.17; 32 before)
constexpr int kMaxKickRounds = 64;   // sendto() calls per kick while the kernel keeps taking descriptors
constexpr uint32_t kXskMapKey = 0;   // receive queue 0
constexpr auto kBindWait = std::chrono::seconds(2);  // for a just-closed socket on the queue to be freed
constexpr common::TimeNs kErrorRetryNs = 1'000'000;  // a device that refuses (down) is tried again this much later

// The warm-up frame (XdpPort::warm_rx): a minimal RoCEv2-shaped UDP datagram to the port's own MAC from the all-zero
// MAC (no interface sends from it), with a marker where a BTH would start; the port recognizes it whole and drops it.
constexpr size_t kWarmFrameBytes = 60;
constexpr uint8_t kWarmMarker[] = {'i', 'f', 'e', 'c', ' ', 'w', 'a', 'r', 'm', '-', 'u', 'p'};
std::array<uint8_t, kWarmFrameBytes> warm_frame(const uint8_t* mac) {
  std::array<uint8_t, kWarmFrameBytes> f{};
  std::memcpy(f.data(), mac, 6);
  f[12] = 0x08;  // IPv4
  uint8_t* ip = f.data() + 14;
  ip[0] = 0x45;
  ip[3] = kWarmFrameBytes - 14;  // total length
  ip[8] = 1;                     // TTL: it goes nowhere
  ip[9] = 17;                    // UDP
  uint8_t* udp = ip + 20;
  udp[2] = 4791 >> 8;  // RoCEv2: the program sends it to the socket
  udp[3] = 4791 & 0xff;
  udp[5] = kWarmFrameBytes - 34;  // UDP length
  std::memcpy(udp + 8, kWarmMarker, sizeof kWarmMarker);
  return f;
}

// The arrival time the XDP program left in a frame's metadata (ifec_fabric.bpf.c: struct ifec_rx_meta, just before
// the frame), CLOCK_MONOTONIC ns; 0 where the buffer has no room before the frame or no tagged metadata. A
// timestamp later than now is not one (room the program did not write).
constexpr uint64_t kRxMetaTag = 0x1fec7153ULL;
common::TimeNs arrival_of(const uint8_t* frame, uint64_t offset_in_chunk, common::TimeNs now_ns) {
  uint64_t meta[2];
  if (offset_in_chunk < sizeof meta) {
    return 0;
  }
  std::memcpy(meta, frame - sizeof meta, sizeof meta);
  return meta[0] == kRxMetaTag && meta[1] != 0 && meta[1] <= now_ns ? meta[1] : 0;
}

// CLOCK_REALTIME minus CLOCK_MONOTONIC from the tightest of three brackets: a read preempted between two clock
// reads is off by the preemption (one made of two plain reads per batch put a batch's arrival times a microsecond
// before the last batch's, under load).
common::TimeNs read_real_minus_mono() {
  common::TimeNs best = 0;
  common::TimeNs width = common::kForever;
  for (int i = 0; i < 3; ++i) {
    const common::TimeNs a = EpollLoop::clock_ns(CLOCK_MONOTONIC);
    const common::TimeNs real = EpollLoop::clock_ns(CLOCK_REALTIME);
    const common::TimeNs b = EpollLoop::clock_ns(CLOCK_MONOTONIC);
    if (b - a < width) {
      width = b - a;
      best = real - (a + (b - a) / 2);
    }
  }
  return best;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
    s.pop_back();
  }
  return s;
}

// libbpf and libxdp print their errors (the verifier's, the kernel's extack) through a callback: keep the last few
// lines of this thread's to put into the exception.
thread_local std::string t_bpf_log;

void remember(const char* format, va_list args) {
  char line[512];
  vsnprintf(line, sizeof line, format, args);
  t_bpf_log += line;
  if (t_bpf_log.size() > 2048) {
    t_bpf_log.erase(0, t_bpf_log.size() - 2048);
  }
}

int libbpf_log(enum libbpf_print_level level, const char* format, va_list args) {
  if (level != LIBBPF_DEBUG) {
    remember(format, args);
  }
  return 0;
}

int libxdp_log(enum libxdp_print_level level, const char* format, va_list args) {
  if (level != LIBXDP_DEBUG) {
    remember(format, args);
  }
  return 0;
}

// Routes both libraries' messages into t_bpf_log for its lifetime (the libraries print to stderr otherwise, which
// a fallback to AF_PACKET would leave as noise in the daemon's log).
class BpfLog {
 public:
  BpfLog() : bpf_(libbpf_set_print(libbpf_log)), xdp_(libxdp_set_print(libxdp_log)) { t_bpf_log.clear(); }
  ~BpfLog() {
    libbpf_set_print(bpf_);
    libxdp_set_print(xdp_);
  }
  BpfLog(const BpfLog&) = delete;
  BpfLog& operator=(const BpfLog&) = delete;
  // Forgets what earlier (successful) steps said, so an error carries its own step's words only.
  static void step() { t_bpf_log.clear(); }
  // strerror of a negative libbpf/libxdp return, with what the library said.
  static std::string error(int neg_errno) {
    std::string s = std::strerror(neg_errno < 0 ? -neg_errno : neg_errno);
    const std::string said = trim(t_bpf_log);
    if (!said.empty()) {
      s += " (" + said.substr(said.rfind('\n') == std::string::npos ? 0 : said.rfind('\n') + 1) + ")";
    }
    return s;
  }

 private:
  libbpf_print_fn_t bpf_;
  libxdp_print_fn_t xdp_;
};

bpf_object* open_fabric_object() {
  bpf_object_open_opts opts{};  // LIBBPF_OPTS is C (designated initializers in a statement expression)
  opts.sz = sizeof opts;
  opts.object_name = "ifec_fabric";
  return bpf_object__open_mem(kIfecFabricBpfObject, kIfecFabricBpfObjectSize, &opts);
}

// Attaches `prog_fd` to `ifindex` in XDP mode `flags` through a BPF link; its fd, or a negative errno.
int link_xdp(int prog_fd, int ifindex, uint32_t flags) {
  bpf_link_create_opts opts{};
  opts.sz = sizeof opts;
  opts.flags = flags;
  return bpf_link_create(prog_fd, ifindex, BPF_XDP, &opts);
}

}  // namespace

struct XdpPort::Xsk {
  bpf_object* obj = nullptr;
  int prog_fd = -1;
  int map_fd = -1;
  int link_fd = -1;  // the attachment: closing it detaches the program
  void* area = nullptr;
  size_t area_bytes = 0;
  xsk_umem* umem = nullptr;
  xsk_socket* socket = nullptr;
  xsk_ring_prod fill{};
  xsk_ring_cons comp{};
  xsk_ring_cons rx{};
  xsk_ring_prod tx{};
  bool sg = false;                // frames span chunks (multi-buffer)
  std::vector<uint64_t> tx_free;  // chunk addresses TX may use
  uint64_t fill_addrs[kRxBatch];  // chunks going back to the fill ring after an RX read

  uint8_t* chunk(uint64_t addr) const { return static_cast<uint8_t*>(area) + addr; }
  // Descriptors in the TX ring the kernel has not taken yet.
  uint32_t tx_outstanding() const { return *tx.producer - __atomic_load_n(tx.consumer, __ATOMIC_ACQUIRE); }
};

std::string XdpPort::unavailable() {
  const int fd = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    return err == EAFNOSUPPORT
               ? "this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS)"
               : std::string("AF_XDP socket: ") + std::strerror(err) + (err == EPERM ? " (needs CAP_NET_RAW)" : "");
  }
  close(fd);
  BpfLog log;
  bpf_object* obj = open_fabric_object();
  if (obj == nullptr) {
    return "opening the fabric XDP program: " + BpfLog::error(errno);
  }
  const int err = bpf_object__load(obj);
  bpf_object__close(obj);
  if (err != 0) {
    return "loading the fabric XDP program: " + BpfLog::error(err) +
           (err == -EPERM ? " (needs CAP_BPF and CAP_NET_ADMIN)" : "");
  }
  return "";
}

XdpPort::XdpPort(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps, const std::string& netns,
                 size_t max_frame)
    : loop_(loop),
      ifname_(ifname),
      rate_bps_(rate_bps),
      max_frame_(max_frame),
      xsk_(std::make_unique<Xsk>()),
      gate_(loop, rate_bps),
      wire_(loop, [this](std::vector<uint8_t>&& f) {  // its serialization over: to the kernel
        if (submit(f)) {
          submitted();
        } else {
          counters_.tx_errors++;  // the TX ring full at a paced link's rate: not seen
        }
      }) {
  IFEC_CHECK(!ifname.empty() && ifname.size() < IFNAMSIZ,
             "interface name '" << ifname << "' is not 1.." << IFNAMSIZ - 1 << " characters");
  IFEC_CHECK(max_frame >= 64 && max_frame <= 65536,
             "interface " << ifname << ": max_frame " << max_frame << " is outside 64..65536 bytes");
  try {
    {
      NetnsGuard in(netns);
      BpfLog log;
      open();
    }
    refresh_link();
    loop_.watch(fd_, [this] { drain(); });
  } catch (...) {
    close_all();
    throw;
  }
}

XdpPort::~XdpPort() {
  if (fd_ >= 0) {
    loop_.unwatch(fd_);
  }
  close_all();
}

void XdpPort::open() {
  query_interface();
  load_program();
  // The program first: another's program on the interface (a second port, a daemon still running) fails the link
  // at once, so a failed bind below can only be a port just closed whose socket the kernel still frees. Until the
  // socket is in the map, fabric frames fall back to the kernel.
  attach_program();
  create_socket();
  warm_rx();
}

// The first frame the kernel copies into an RX chunk is slow on some hypervisors: the kernel writes through its own
// mapping of the UMEM, and its first write to each page costs there what a page fault does (tens of microseconds on
// this project's VM: a 128-byte round trip over a bare veth took 50 us for the first few hundred frames, 16 us
// after). So each chunk takes one frame now: the program runs kRxChunks times on a warm-up frame as if the
// interface had received it (BPF_PROG_TEST_RUN with live frames, Linux >= 5.18), which redirects each copy into this
// socket; drain() recognizes them and drops them (counted: warm_up_frames), here. Best effort: where the kernel
// refuses, the chunks warm up with the first traffic instead.
void XdpPort::warm_rx() {
  Xsk& x = *xsk_;
  const std::array<uint8_t, kWarmFrameBytes> frame = warm_frame(mac_);
  xdp_md ctx{};
  ctx.ingress_ifindex = static_cast<uint32_t>(ifindex_);
  ctx.data_end = kWarmFrameBytes;  // the kernel wants the frame's extent in the context too
  bpf_test_run_opts opts{};
  opts.sz = sizeof opts;
  opts.data_in = frame.data();
  opts.data_size_in = kWarmFrameBytes;
  opts.ctx_in = &ctx;
  opts.ctx_size_in = sizeof ctx;
  opts.repeat = kRxChunks;
  opts.flags = BPF_F_TEST_XDP_LIVE_FRAMES;
  if (bpf_prog_test_run_opts(x.prog_fd, &opts) == 0) {
    drain();  // gives the chunks back to the fill ring at once (no receiver yet: a peer's frame now is not kept)
  }
}

void XdpPort::close_all() {
  Xsk& x = *xsk_;
  if (x.link_fd >= 0) {
    close(x.link_fd);
    x.link_fd = -1;
  }
  if (x.socket != nullptr) {
    xsk_socket__delete(x.socket);
    x.socket = nullptr;
    fd_ = -1;
  }
  if (x.umem != nullptr) {
    xsk_umem__delete(x.umem);
    x.umem = nullptr;
  }
  if (x.area != nullptr) {
    munmap(x.area, x.area_bytes);
    x.area = nullptr;
  }
  if (x.obj != nullptr) {
    bpf_object__close(x.obj);  // closes the program's and the map's fds
    x.obj = nullptr;
  }
  if (ctl_fd_ >= 0) {
    close(ctl_fd_);
    ctl_fd_ = -1;
  }
}

void XdpPort::query_interface() {
  ctl_fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  IFEC_CHECK(ctl_fd_ >= 0, "interface " << ifname_ << ": socket: " << std::strerror(errno));
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname_.c_str(), IFNAMSIZ - 1);
  IFEC_CHECK(ioctl(ctl_fd_, SIOCGIFINDEX, &ifr) == 0, "interface " << ifname_ << ": no such interface");
  ifindex_ = ifr.ifr_ifindex;
  IFEC_CHECK(ioctl(ctl_fd_, SIOCGIFHWADDR, &ifr) == 0,
             "interface " << ifname_ << ": reading its MAC address: " << std::strerror(errno));
  std::memcpy(mac_, ifr.ifr_hwaddr.sa_data, 6);
  // One socket serves queue 0: frames the NIC spreads over other queues would go to the kernel, not the daemon.
  ethtool_channels ch{};
  ch.cmd = ETHTOOL_GCHANNELS;
  ifr.ifr_data = reinterpret_cast<char*>(&ch);
  if (ioctl(ctl_fd_, SIOCETHTOOL, &ifr) == 0) {
    const uint32_t queues = ch.rx_count + ch.combined_count;
    IFEC_CHECK(queues <= 1, "interface " << ifname_ << " has " << queues
                                         << " receive queues; the AF_XDP port serves queue 0 only (ethtool -L "
                                         << ifname_ << " combined 1)");
  }
}

void XdpPort::load_program() {
  Xsk& x = *xsk_;
  BpfLog::step();
  x.obj = open_fabric_object();
  IFEC_CHECK(x.obj != nullptr, "interface " << ifname_ << ": opening the fabric XDP program: " << BpfLog::error(errno));
  const int err = bpf_object__load(x.obj);
  IFEC_CHECK(err == 0, "interface " << ifname_ << ": loading the fabric XDP program: " << BpfLog::error(err));
  bpf_program* prog = bpf_object__find_program_by_name(x.obj, "ifec_fabric");
  bpf_map* map = bpf_object__find_map_by_name(x.obj, "ifec_xsks");
  IFEC_CHECK(prog != nullptr && map != nullptr,
             "interface " << ifname_ << ": the fabric XDP object lacks ifec_fabric or ifec_xsks");
  x.prog_fd = bpf_program__fd(prog);
  x.map_fd = bpf_map__fd(map);
}

// One try: a UMEM and a socket on it, or a negative errno (a failed bind leaves nothing behind: the socket's rings
// cannot be set up twice, so each try starts afresh).
int XdpPort::bind_socket() {
  Xsk& x = *xsk_;
  BpfLog::step();
  xsk_umem_config ucfg{};
  ucfg.fill_size = kRxChunks;  // every RX chunk fits: refilling never fails
  ucfg.comp_size = kTxChunks;
  ucfg.frame_size = kChunk;
  ucfg.frame_headroom = 0;
  int err = xsk_umem__create(&x.umem, x.area, x.area_bytes, &x.fill, &x.comp, &ucfg);
  IFEC_CHECK(err == 0, "interface " << ifname_ << ": registering the UMEM: " << BpfLog::error(err)
                                    << (err == -EPERM || err == -ENOMEM || err == -ENOBUFS
                                            ? " (locked memory: CAP_IPC_LOCK or ulimit -l)"
                                            : ""));
  // No mode flag: the kernel picks zero-copy where the driver has it and copy mode where not (veth).
  xsk_socket_config cfg{};
  cfg.rx_size = kRxChunks;
  cfg.tx_size = kTxChunks;
  cfg.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;  // our program, not libxdp's default one
  cfg.bind_flags = XDP_USE_NEED_WAKEUP | (x.sg ? XDP_USE_SG : 0);
  err = xsk_socket__create(&x.socket, ifname_.c_str(), 0, x.umem, &x.rx, &x.tx, &cfg);
  if (err != 0) {
    x.socket = nullptr;
    xsk_umem__delete(x.umem);
    x.umem = nullptr;
  }
  return err;
}

// Binds the socket, waiting out a port on the same queue that was just closed: the kernel frees a closed socket's
// UMEM and queue after an RCU grace period and a work item, which a restarted daemon or a reopened port can beat.
void XdpPort::create_socket() {
  Xsk& x = *xsk_;
  x.area_bytes = static_cast<size_t>(kRxChunks + kTxChunks) * kChunk;
  void* area = mmap(nullptr, x.area_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  IFEC_CHECK(area != MAP_FAILED,
             "interface " << ifname_ << ": " << x.area_bytes / 1024 << " KiB of UMEM: " << std::strerror(errno));
  x.area = area;
  // Frames longer than a chunk's room need multi-buffer.
  x.sg = max_frame_ > kRxRoom;
  const auto give_up = std::chrono::steady_clock::now() + kBindWait;
  int err = 0;
  while ((err = bind_socket()) == -EBUSY && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  IFEC_CHECK(err == 0, "interface " << ifname_ << ": binding an AF_XDP socket to queue 0"
                                    << (x.sg ? " with multi-buffer frames (max_frame " + std::to_string(max_frame_) +
                                                   " > " + std::to_string(kRxRoom) + "; Linux >= 6.6)"
                                             : "")
                                    << ": " << BpfLog::error(err)
                                    << (err == -EBUSY ? " (another AF_XDP socket has the queue)" : ""));
  fd_ = xsk_socket__fd(x.socket);
  xdp_options opts{};
  socklen_t len = sizeof opts;
  if (getsockopt(fd_, SOL_XDP, XDP_OPTIONS, &opts, &len) == 0) {
    zero_copy_ = (opts.flags & XDP_OPTIONS_ZEROCOPY) != 0;
  }
  const uint32_t budget = kTxBudget;
  setsockopt(fd_, SOL_XDP, XDP_MAX_TX_BUDGET, &budget, sizeof budget);  // best effort: fewer kicks per batch
  uint32_t idx = 0;
  IFEC_CHECK(xsk_ring_prod__reserve(&x.fill, kRxChunks, &idx) == kRxChunks,
             "interface " << ifname_ << ": the fill ring does not take " << kRxChunks << " chunks");
  for (uint32_t i = 0; i < kRxChunks; ++i) {
    *xsk_ring_prod__fill_addr(&x.fill, idx + i) = static_cast<uint64_t>(i) * kChunk;
  }
  xsk_ring_prod__submit(&x.fill, kRxChunks);
  x.tx_free.reserve(kTxChunks);
  for (uint32_t i = 0; i < kTxChunks; ++i) {
    x.tx_free.push_back(static_cast<uint64_t>(kRxChunks + i) * kChunk);
  }
  const uint32_t key = kXskMapKey;
  err = bpf_map_update_elem(x.map_fd, &key, &fd_, BPF_ANY);
  IFEC_CHECK(err == 0, "interface " << ifname_ << ": putting the socket into the XSKMAP: " << BpfLog::error(err));
}

// A BPF link rather than a netlink attachment: it goes away with its fd, so a daemon that dies leaves no program
// behind, and it never replaces a program someone else attached (the kernel answers EBUSY).
void XdpPort::attach_program() {
  Xsk& x = *xsk_;
  BpfLog::step();
  x.link_fd = link_xdp(x.prog_fd, ifindex_, XDP_FLAGS_DRV_MODE);
  if (x.link_fd >= 0) {
    native_ = true;
    return;
  }
  const std::string native_err = BpfLog::error(x.link_fd);
  BpfLog::step();
  x.link_fd = link_xdp(x.prog_fd, ifindex_, XDP_FLAGS_SKB_MODE);
  IFEC_CHECK(x.link_fd >= 0, "interface "
                                 << ifname_ << ": attaching the fabric XDP program: native: " << native_err
                                 << "; generic (skb): " << BpfLog::error(x.link_fd)
                                 << (x.link_fd == -EBUSY || x.link_fd == -EEXIST
                                         ? " (the interface has another XDP program: ip link show " + ifname_ + ")"
                                         : ""));
  native_ = false;
}

void XdpPort::drain() {
  Xsk& x = *xsk_;
  // At most one ring's worth per call: the loop's timers (pacing, tx_ready) run between, and epoll (level-
  // triggered) calls again while frames wait.
  for (uint32_t taken = 0; taken < kRxChunks;) {
    uint32_t idx = 0;
    const uint32_t n = xsk_ring_cons__peek(&x.rx, kRxBatch, &idx);
    if (n == 0) {
      break;
    }
    taken += n;
    counters_.rx_batches++;
    const common::TimeNs mono_now = EpollLoop::clock_ns(CLOCK_MONOTONIC);
    for (uint32_t i = 0; i < n; ++i) {
      const xdp_desc* d = xsk_ring_cons__rx_desc(&x.rx, idx + i);
      const uint8_t* data = x.chunk(d->addr);
      x.fill_addrs[i] = d->addr - d->addr % kChunk;
      if (d->len == kWarmFrameBytes && rx_partial_.empty() && is_warm_up(data)) {
        counters_.warm_up_frames++;
        continue;
      }
      if (rx_partial_.empty() && !(d->options & XDP_PKT_CONTD)) {
        rx_batch_.emplace_back(data, data + d->len);  // the common case: a frame in one buffer
        rx_stamps_.push_back(arrival_of(data, d->addr % kChunk, mono_now));
      } else {
        if (rx_partial_.empty()) {
          rx_partial_.reserve(std::min<size_t>(max_frame_, 2 * kRxRoom));    // a 4 KiB frame: one allocation
          rx_partial_stamp_ = arrival_of(data, d->addr % kChunk, mono_now);  // the first buffer has the metadata
        }
        rx_partial_.insert(rx_partial_.end(), data, data + d->len);
        if (d->options & XDP_PKT_CONTD) {
          continue;
        }
        rx_batch_.push_back(std::move(rx_partial_));
        rx_stamps_.push_back(rx_partial_stamp_);
        rx_partial_.clear();
      }
      if (rx_batch_.back().size() > max_frame_) {
        counters_.rx_truncated++;
        rx_batch_.pop_back();
        rx_stamps_.pop_back();
      }
    }
    xsk_ring_cons__release(&x.rx, n);
    uint32_t fidx = 0;
    xsk_ring_prod__reserve(&x.fill, n, &fidx);  // the fill ring holds every RX chunk: there is room
    for (uint32_t i = 0; i < n; ++i) {
      *xsk_ring_prod__fill_addr(&x.fill, fidx + i) = x.fill_addrs[i];
    }
    xsk_ring_prod__submit(&x.fill, n);
    if (zero_copy_ && xsk_ring_prod__needs_wakeup(&x.fill)) {
      recvfrom(fd_, nullptr, 0, MSG_DONTWAIT, nullptr, nullptr);
    }
    // Handed over after the rings are settled: the receiver may send (on this port too), or even close it.
    std::weak_ptr<bool> alive = alive_;
    if (real_minus_mono_at_ == 0 || mono_now - real_minus_mono_at_ >= 100'000'000) {
      real_minus_mono_ = read_real_minus_mono();
      real_minus_mono_at_ = mono_now;
    }
    for (size_t k = 0; k < rx_batch_.size(); ++k) {
      counters_.rx_frames++;
      counters_.rx_bytes += rx_batch_[k].size();
      if (up_ && rx_) {
        // Frames arrive in order: a stamp a little before the last one (a new reading of the clocks' difference,
        // off by its uncertainty) is taken as the last one; one far before it (the realtime clock stepped back)
        // stands.
        if (rx_stamps_[k] != 0) {
          const common::TimeNs t = rx_stamps_[k] + real_minus_mono_;
          last_rx_stamp_ = t < last_rx_stamp_ && last_rx_stamp_ - t < 1'000'000 ? last_rx_stamp_ : t;
        }
        rx_timestamp_ns_ = rx_stamps_[k] != 0 ? last_rx_stamp_ : 0;
        rx_(std::move(rx_batch_[k]));
        if (alive.expired()) {
          return;
        }
      }
    }
    rx_batch_.clear();
    rx_stamps_.clear();
  }
}

// Only a frame of kWarmFrameBytes gets here; all but the port's own warm-up frames, PFC ones among them, differ in
// their source MAC already.
bool XdpPort::is_warm_up(const uint8_t* data) const {
  static constexpr uint8_t kNoMac[6] = {};
  return std::memcmp(data + 6, kNoMac, 6) == 0 && std::memcmp(data, warm_frame(mac_).data(), kWarmFrameBytes) == 0;
}

bool XdpPort::submit(const std::vector<uint8_t>& frame) {
  Xsk& x = *xsk_;
  reap();
  const uint32_t n = static_cast<uint32_t>((frame.size() + kChunk - 1) / kChunk);
  uint32_t idx = 0;
  if (x.tx_free.size() < n || xsk_ring_prod__reserve(&x.tx, n, &idx) != n) {
    return false;
  }
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t addr = x.tx_free.back();
    x.tx_free.pop_back();
    const size_t off = static_cast<size_t>(i) * kChunk;
    const uint32_t len = static_cast<uint32_t>(std::min<size_t>(kChunk, frame.size() - off));
    std::memcpy(x.chunk(addr), frame.data() + off, len);
    xdp_desc* d = xsk_ring_prod__tx_desc(&x.tx, idx + i);
    d->addr = addr;
    d->len = len;
    d->options = i + 1 < n ? XDP_PKT_CONTD : 0;
  }
  xsk_ring_prod__submit(&x.tx, n);
  unkicked_ += n;
  return true;
}

// Frames sent in one turn of the loop (a switch forwarding an RX batch, a sender's burst) share one sendto(): the
// kick waits for the end of the turn unless a batch is already there.
void XdpPort::submitted() {
  if (unkicked_ >= kKickBatch) {
    kick();
  } else if (!kick_pending_) {
    kick_pending_ = true;
    later(0, &XdpPort::kick);
  }
}

void XdpPort::kick() {
  Xsk& x = *xsk_;
  kick_pending_ = false;
  unkicked_ = 0;
  int err = 0;
  for (int round = 0; round < kMaxKickRounds && x.tx_outstanding() > 0; ++round) {
    if (zero_copy_ && !xsk_ring_prod__needs_wakeup(&x.tx)) {
      break;  // the driver is polling the ring itself
    }
    const uint32_t before = x.tx_outstanding();
    counters_.tx_kicks++;
    err = sendto(fd_, nullptr, 0, MSG_DONTWAIT, nullptr, 0) < 0 ? errno : 0;
    reap();
    if (err != 0 && err != EAGAIN && err != EBUSY && err != ENOBUFS) {
      counters_.tx_errors++;  // ENETDOWN and the like: the descriptors wait in the ring for the device
      break;
    }
    if (x.tx_outstanding() >= before) {
      break;  // the device is busy: no progress this time
    }
  }
  if (x.tx_outstanding() > 0 && !(zero_copy_ && !xsk_ring_prod__needs_wakeup(&x.tx)) && !kick_pending_) {
    kick_pending_ = true;
    const bool hard = err != 0 && err != EAGAIN && err != EBUSY && err != ENOBUFS;
    later(loop_.now() + (hard ? kErrorRetryNs : kBusyRetryNs), &XdpPort::kick);
  }
}

// Completed TX chunks go back to the free list.
void XdpPort::reap() {
  Xsk& x = *xsk_;
  uint32_t idx = 0;
  const uint32_t n = xsk_ring_cons__peek(&x.comp, kTxChunks, &idx);
  for (uint32_t i = 0; i < n; ++i) {
    x.tx_free.push_back(*xsk_ring_cons__comp_addr(&x.comp, idx + i));
  }
  if (n > 0) {
    xsk_ring_cons__release(&x.comp, n);
  }
}

XdpCounters XdpPort::counters() const {
  XdpCounters c = counters_;
  xdp_statistics st{};
  socklen_t len = sizeof st;
  if (fd_ >= 0 && getsockopt(fd_, SOL_XDP, XDP_STATISTICS, &st, &len) == 0) {
    c.rx_dropped = st.rx_dropped + st.rx_ring_full + st.rx_fill_ring_empty_descs;  // the kernel's running totals
    c.tx_invalid = st.tx_invalid_descs;
  }
  c.native = native_ ? 1 : 0;
  c.zero_copy = zero_copy_ ? 1 : 0;
  return c;
}

#else  // built without libxdp/libbpf/clang: XdpPort says so and open_fabric_port falls back to AF_PACKET

struct XdpPort::Xsk {};

std::string XdpPort::unavailable() {
  return "this build has no AF_XDP support (configure with libxdp-dev, libbpf-dev and clang-14 installed)";
}

XdpPort::XdpPort(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps, const std::string& netns,
                 size_t max_frame)
    : loop_(loop), ifname_(ifname), rate_bps_(rate_bps), max_frame_(max_frame), gate_(loop, rate_bps), wire_(loop, {}) {
  IFEC_FAIL("interface " << ifname << ": " << unavailable());
}

XdpPort::~XdpPort() = default;
void XdpPort::drain() {}
void XdpPort::warm_rx() {}
bool XdpPort::is_warm_up(const uint8_t*) const { return false; }
bool XdpPort::submit(const std::vector<uint8_t>&) { return false; }
void XdpPort::submitted() {}
void XdpPort::kick() {}
void XdpPort::reap() {}
XdpCounters XdpPort::counters() const { return counters_; }

#endif

}  // namespace ifec::live
