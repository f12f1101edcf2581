// The live daemons' XDP program: fabric frames go to the port's AF_XDP socket, everything else to the kernel.
//
// It accepts exactly what AfPacketPort's classic BPF filter accepts (testbed/live/src/af_packet_port.cpp,
// fabric_filter()), so either driver hands the daemon the same frames:
//   - ethertype 0x8808 (MAC control: PFC);
//   - ethertype 0x0800, IP protocol 17, fragment offset 0 (the MF flag is not looked at: a first fragment
//     passes), UDP destination port 4791 (RoCEv2) or 4793 (ECH), the UDP header found at 14 + 4 * IHL as the
//     classic filter's BPF_MSH finds it (no check of the version nibble or of IHL >= 5 there either).
// The retired FARE ethertype 0x88B5 is not fabric traffic (BGP carries FARE now), nor are ARP, IPv6 ND, the
// control plane's TCP or ICMP: XDP_PASS keeps them the kernel's. Where the classic filter would read past the
// frame (and so drop it), this program passes the frame to the kernel, which is where the AF_PACKET port's
// dropped frames went too.
//
// Each fabric frame carries its arrival time to the socket: 16 bytes of XDP metadata just before the frame in its
// AF_XDP buffer, a tag (IFEC_RX_META_TAG) and bpf_ktime_get_ns() (CLOCK_MONOTONIC) when the program ran, so the
// port hands frames over with their arrival times as the AF_PACKET port does with the kernel's timestamps. Where
// the driver leaves no room for metadata the frame goes without (the port then reports no time).
//
// "xdp.frags": the program handles multi-buffer frames (jumbo frames on a veth with a 9216 MTU; the kernel refuses
// a program without it on such a veth in native mode). The headers it reads are always in the first buffer.
// linux/bpf.h first: bpf_helpers.h uses its types.
// clang-format off
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
// clang-format on

#define IFEC_ETH_HLEN 14
#define IFEC_ETH_P_PFC 0x8808
#define IFEC_ETH_P_IPV4 0x0800
#define IFEC_IPPROTO_UDP 17
#define IFEC_IP_FRAG_OFFSET_MASK 0x1fff
#define IFEC_UDP_ROCEV2 4791
#define IFEC_UDP_ECH 4793
#define IFEC_RX_META_TAG 0x1fec7153ULL  // XdpPort's kRxMetaTag

struct ifec_rx_meta {
  __u64 tag;
  __u64 arrival_ns;
};

// Receive queue -> the AF_XDP socket bound to it. The port binds queue 0 only (and refuses an interface with more
// receive queues); a queue without a socket falls back to XDP_PASS.
struct {
  __uint(type, BPF_MAP_TYPE_XSKMAP);
  __uint(max_entries, 64);
  __type(key, __u32);
  __type(value, __u32);
} ifec_xsks SEC(".maps");

// Big-endian 16 bits at `off`, or -1 when the frame is shorter (the classic filter's out-of-bounds load).
static __always_inline int load_be16(void* data, void* end, __u32 off) {
  __u8* p = (__u8*)data + off;
  if ((void*)(p + 2) > end) {
    return -1;
  }
  return (p[0] << 8) | p[1];
}

static __always_inline int is_fabric(struct xdp_md* ctx) {
  void* data = (void*)(long)ctx->data;
  void* end = (void*)(long)ctx->data_end;
  const int ethertype = load_be16(data, end, 12);
  if (ethertype == IFEC_ETH_P_PFC) {
    return 1;
  }
  if (ethertype != IFEC_ETH_P_IPV4) {
    return 0;
  }
  __u8* ip = (__u8*)data + IFEC_ETH_HLEN;
  if ((void*)(ip + 10) > end || ip[9] != IFEC_IPPROTO_UDP) {
    return 0;
  }
  const int frag = load_be16(data, end, IFEC_ETH_HLEN + 6);
  if (frag < 0 || (frag & IFEC_IP_FRAG_OFFSET_MASK) != 0) {
    return 0;
  }
  const __u32 ihl_bytes = (ip[0] & 0x0f) * 4;  // 0..60: the verifier sees the bound
  const int dport = load_be16(data, end, IFEC_ETH_HLEN + ihl_bytes + 2);
  return dport == IFEC_UDP_ROCEV2 || dport == IFEC_UDP_ECH;
}

SEC("xdp.frags")
int ifec_fabric(struct xdp_md* ctx) {
  if (!is_fabric(ctx)) {
    return XDP_PASS;
  }
  if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct ifec_rx_meta)) == 0) {
    struct ifec_rx_meta* meta = (void*)(long)ctx->data_meta;
    if ((void*)(meta + 1) <= (void*)(long)ctx->data) {
      meta->tag = IFEC_RX_META_TAG;
      meta->arrival_ns = bpf_ktime_get_ns();
    }
  }
  return bpf_redirect_map(&ifec_xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
