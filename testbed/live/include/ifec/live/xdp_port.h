// A common::Port on a Linux network interface through AF_XDP, the faster alternative to AfPacketPort: an XDP program
// (testbed/live/bpf/ifec_fabric.bpf.c, built into this library) sends the fabric frames AfPacketPort's filter
// accepts (RoCEv2, ECH, PFC) to an AF_XDP socket on receive queue 0 and passes everything else to the kernel (ARP,
// ICMP, the control plane's TCP keep working); frames are sent through the socket's TX ring. Same contract as
// AfPacketPort: the same frames reach the daemon, the port paces itself at the link's rate (LinkPacer) and is busy
// while it is ahead of it or while its rings are full, tx_ready follows each transmission, link state is the
// carrier (refresh_link()).
//
// The program is attached through a BPF link (native XDP where the driver has it, else generic "skb" mode), so it
// goes away with the port, and with the process should it die. The socket is zero-copy where the driver supports
// it, else copy mode (veth: native XDP, copy). Frames longer than a UMEM chunk's room (3840 bytes) span chunks
// (AF_XDP multi-buffer, Linux >= 6.6), so RoCE's 4096-byte MTU and 9216-byte jumbo frames work.
//
// open_fabric_port() is how a daemon gets a port: AF_XDP where it works, else AF_PACKET, with the reason.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ifec/common/counters.h"
#include "ifec/common/interfaces.h"
#include "ifec/live/af_packet_port.h"
#include "ifec/live/epoll_loop.h"

namespace ifec::live {

// What a daemon needs of a fabric interface, whichever socket drives it.
class FabricPort : public common::Port {
 public:
  // Re-reads the carrier; true when it changed.
  virtual bool refresh_link() = 0;
  virtual const std::string& name() const = 0;
  virtual const uint8_t* mac() const = 0;
  virtual int ifindex() const = 0;
  // The counters both drivers keep, under AfPacketCounters' names and meanings (the daemons' per-port metrics).
  virtual AfPacketCounters port_counters() const = 0;
  // Every counter of the driver by name (a status page's per-port table).
  virtual std::map<std::string, uint64_t> counter_map() const = 0;
  // The driver in words: "af_xdp (native XDP, copy mode, queue 0)", "af_packet (recvmmsg with kernel timestamps,
  // send)".
  virtual std::string driver() const = 0;
  // During the receiver's call: when the kernel received that frame (ns, CLOCK_REALTIME), or 0 where the driver
  // does not say.
  virtual common::TimeNs rx_timestamp_ns() const { return 0; }
};

// clang-format off
#define IFEC_XDP_COUNTERS(X)                                                                             \
  X(rx_frames, "")                                                                                       \
  X(rx_bytes, "")                                                                                        \
  X(tx_frames, "")                                                                                       \
  X(tx_bytes, "")                                                                                        \
  X(tx_refused, "send() while down or busy")                                                             \
  X(tx_errors, "frames longer than max_frame, or sendto() failed for another reason than a busy device") \
  X(rx_dropped, "the kernel dropped frames: RX ring full, fill ring empty, or other (XDP_STATISTICS)")   \
  X(rx_truncated, "frames longer than max_frame (dropped)")                                              \
  X(paced, "times the port held its owner back to keep to the link's rate")                              \
  X(tx_ring_full, "times the TX ring or its chunks were full: the port was busy until they freed")       \
  X(tx_kicks, "sendto() calls that started transmission (one per batch of frames)")                      \
  X(tx_invalid, "TX descriptors the kernel refused (XDP_STATISTICS tx_invalid_descs)")                   \
  X(rx_batches, "RX ring reads (frames per batch: rx_frames / rx_batches)")                              \
  X(warm_up_frames, "warm-up frames the port ran through its program at open and dropped (not rx_frames)")  \
  X(native, "1: the XDP program runs in the driver; 0: generic (skb) mode")                              \
  X(zero_copy, "1: the socket is zero-copy; 0: copy mode")
// clang-format on

struct XdpCounters {
  IFEC_COUNTER_SET(XdpCounters, IFEC_XDP_COUNTERS)
};

class XdpPort : public FabricPort {
 public:
  // Opens `ifname` in the calling thread's network namespace, or in `netns` (a name under /var/run/netns) when
  // given; frames up to `max_frame` bytes are received and sent (longer ones are counted: rx_truncated, tx_errors).
  // Loads and attaches the XDP program and binds an AF_XDP socket to receive queue 0, waiting up to 2 s for the
  // kernel to free the socket of a port just closed on it. Throws common::Error naming the interface and the
  // reason (no such interface, more than one receive queue, another XDP program, the kernel's or libbpf's error).
  XdpPort(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps, const std::string& netns = "",
          size_t max_frame = 9216);
  ~XdpPort() override;  // detaches the program and frees the socket and its memory
  XdpPort(const XdpPort&) = delete;
  XdpPort& operator=(const XdpPort&) = delete;

  // Why this process cannot use AF_XDP ports at all ("" when it can): no AF_XDP in the kernel, no permission to
  // load BPF programs, a library built without libxdp. Interface-specific reasons come from the constructor.
  static std::string unavailable();

  bool send(std::vector<uint8_t>&& frame) override;
  bool busy() const override { return gate_.busy(); }
  bool link_up() const override { return up_; }
  uint64_t rate_bps() const override { return rate_bps_; }
  void set_receiver(Receiver rx) override { rx_ = std::move(rx); }
  void set_tx_ready(TxReady ready) override { gate_.set_ready(std::move(ready)); }

  bool refresh_link() override;
  const std::string& name() const override { return ifname_; }
  const uint8_t* mac() const override { return mac_; }
  int ifindex() const override { return ifindex_; }
  AfPacketCounters port_counters() const override;
  std::map<std::string, uint64_t> counter_map() const override;
  std::string driver() const override;
  XdpCounters counters() const;
  // During the receiver's call: when the XDP program took that frame (ns, CLOCK_REALTIME; the program's
  // bpf_ktime_get_ns() in the frame's metadata), 0 where the driver left it no metadata.
  common::TimeNs rx_timestamp_ns() const override { return rx_timestamp_ns_; }
  bool native() const { return native_; }
  bool zero_copy() const { return zero_copy_; }

 private:
  struct Xsk;  // libbpf's and libxdp's state (rings, UMEM, program, link): their headers stay out of this one

  void open();
  void close_all();
  void query_interface();
  void load_program();
  void create_socket();
  int bind_socket();
  void attach_program();
  void drain();
  void warm_rx();
  bool is_warm_up(const uint8_t* data) const;  // a frame of kWarmFrameBytes: warm_rx's
  bool submit(const std::vector<uint8_t>& frame);
  void submitted();
  void kick();
  void reap();
  void retry_pending();
  // Counts a frame of `frame_bytes` as sent at `now` and keeps to the link's rate (busy while ahead of it).
  void took(size_t frame_bytes, common::TimeNs now);
  void later(common::TimeNs at, void (XdpPort::*fn)());

  EpollLoop& loop_;
  std::string ifname_;
  uint64_t rate_bps_;
  size_t max_frame_;
  std::unique_ptr<Xsk> xsk_;
  int ctl_fd_ = -1;  // an ordinary socket in the interface's namespace, for the interface ioctls
  int fd_ = -1;      // the AF_XDP socket
  int ifindex_ = 0;
  uint8_t mac_[6] = {};
  bool native_ = false;
  bool zero_copy_ = false;
  bool up_ = false;
  bool kick_pending_ = false;
  bool retry_pending_ = false;
  uint32_t unkicked_ = 0;  // descriptors submitted since the last kick
  TxGate gate_;
  WireDelay wire_;
  std::vector<uint8_t> pending_;     // a frame the full TX ring refused, sent when it has room
  std::vector<uint8_t> rx_partial_;  // a multi-buffer frame whose last buffer is still to come
  std::vector<std::vector<uint8_t>> rx_batch_;
  std::vector<common::TimeNs> rx_stamps_;  // rx_batch_'s arrival times (CLOCK_MONOTONIC; 0: none)
  common::TimeNs rx_partial_stamp_ = 0;
  common::TimeNs rx_timestamp_ns_ = 0;
  // CLOCK_REALTIME minus CLOCK_MONOTONIC (what turns the XDP program's arrival times into the receivers'), and the
  // monotonic time it was read at: read again every 100 ms, not per batch.
  common::TimeNs real_minus_mono_ = 0;
  common::TimeNs real_minus_mono_at_ = 0;
  common::TimeNs last_rx_stamp_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // scheduled callbacks check it: none outlives us
  Receiver rx_;
  mutable XdpCounters counters_;
};

// An AfPacketPort as a FabricPort (what open_fabric_port returns when AF_XDP is not used).
class AfPacketFabricPort : public FabricPort {
 public:
  AfPacketFabricPort(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps, const std::string& netns = "",
                     size_t max_frame = 9216)
      : port_(loop, ifname, rate_bps, netns, max_frame) {}

  bool send(std::vector<uint8_t>&& frame) override { return port_.send(std::move(frame)); }
  bool busy() const override { return port_.busy(); }
  bool link_up() const override { return port_.link_up(); }
  uint64_t rate_bps() const override { return port_.rate_bps(); }
  void set_receiver(Receiver rx) override { port_.set_receiver(std::move(rx)); }
  void set_tx_ready(TxReady ready) override { port_.set_tx_ready(std::move(ready)); }
  bool refresh_link() override { return port_.refresh_link(); }
  const std::string& name() const override { return port_.name(); }
  const uint8_t* mac() const override { return port_.mac(); }
  int ifindex() const override { return port_.ifindex(); }
  AfPacketCounters port_counters() const override { return port_.counters(); }
  std::map<std::string, uint64_t> counter_map() const override { return common::counters_to_map(port_.counters()); }
  std::string driver() const override { return "af_packet (recvmmsg with kernel timestamps, send)"; }
  common::TimeNs rx_timestamp_ns() const override { return port_.rx_timestamp_ns(); }
  AfPacketPort& device() { return port_; }

 private:
  AfPacketPort port_;
};

// Which socket drives a fabric interface: AF_XDP where it works (else AF_PACKET, saying why), or one of them only.
enum class FabricDriver { kAuto, kAfXdp, kAfPacket };

// "auto", "af_xdp", "af_packet" (a daemon's --driver flag); throws Error naming the bad value and the choices.
FabricDriver parse_fabric_driver(const std::string& name);
const char* fabric_driver_name(FabricDriver driver);

struct OpenedFabricPort {
  std::unique_ptr<FabricPort> port;
  // The driver, and with kAuto on AF_PACKET why AF_XDP was not used: a daemon logs it at start.
  std::string description;
};

// Opens a fabric port on `ifname` (in `netns` when given) with the driver `prefer` asks for; kAuto tries AF_XDP
// and falls back to AF_PACKET. Throws Error when the chosen driver (or, with kAuto, AF_PACKET) cannot open it.
OpenedFabricPort open_fabric_port(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps,
                                  const std::string& netns = "", size_t max_frame = 9216,
                                  FabricDriver prefer = FabricDriver::kAuto);

}  // namespace ifec::live
