// libFuzzer target: the BGP message decoder, an Established session and a FARE speaker (BgpSpeaker, its session
// Established with a switch) must take any bytes without crashing or reading out of bounds; every error must say
// what is wrong; what decodes as an UPDATE must re-encode and decode to the same update; the speaker's decisions
// stay within its topology.
//
// Input: first byte = mode. Odd: the rest is raw stream bytes. Even: the rest is a message body behind a valid
// marker and length, of type 1 + mode / 2 % 5 (so the fuzzer spends its time past the header).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ifec/routing/bgp.h"
#include "ifec/routing/bgp_session.h"
#include "ifec/routing/bgp_speaker.h"

namespace {

using namespace ifec::routing;

void check(const BgpMessage& m, size_t len) {
  for (const BgpError& e : m.errors) {
    if (e.action == BgpErrorAction::kNone || e.what.empty() || e.offset > len) std::abort();
  }
}

// Unknown attributes come back sorted by type with the Partial bit the encoder sets: compare without either.
BgpUpdate without_partial(BgpUpdate u) {
  for (BgpRawAttribute& r : u.attrs.unknown) r.flags &= static_cast<uint8_t>(~kAttrPartial);
  std::stable_sort(u.attrs.unknown.begin(), u.attrs.unknown.end(),
                   [](const BgpRawAttribute& x, const BgpRawAttribute& y) { return x.type < y.type; });
  return u;
}

void round_trip(const BgpMessage& m, const BgpDecodeOptions& opt) {
  const size_t routes =
      m.update.withdrawn.size() + m.update.nlri.size() + (m.update.mp_reach ? m.update.mp_reach->nlri.size() : 0);
  if (!m.ok() || m.type != 2 || routes > 900) return;
  std::vector<uint8_t> again;
  try {
    again = encode_bgp_update(m.update, opt.as4);
  } catch (const std::exception&) {
    return;  // re-encoding can grow past 4096 (AS4_PATH added, segments split): nothing to compare
  }
  const BgpMessage back = decode_bgp(again.data(), again.size(), opt);
  if (!back.ok() || !(without_partial(back.update) == without_partial(m.update))) std::abort();
}

// Two sessions joined in memory, Established; the fuzz bytes then arrive on `a` as if from `b`.
void session(const std::vector<uint8_t>& bytes) {
  BgpSessionConfig ca;
  ca.local_as = 4200000001u;
  ca.peer_as = 4200000002u;
  ca.bgp_id = 1;
  BgpSessionConfig cb = ca;
  cb.local_as = ca.peer_as;
  cb.peer_as = ca.local_as;
  cb.bgp_id = 2;
  cb.passive = true;
  BgpSession a(ca), b(cb);
  a.start(0);
  b.start(0);
  a.connected(0);
  b.connected(0);
  for (int i = 0; i < 4; ++i) {
    const std::vector<uint8_t> x = a.take_output(), y = b.take_output();
    b.receive(x.data(), x.size(), 0);
    a.receive(y.data(), y.size(), 0);
  }
  if (a.state() != BgpState::kEstablished) std::abort();
  for (size_t at = 0; at < bytes.size(); at += 97) {
    a.receive(bytes.data() + at, std::min<size_t>(97, bytes.size() - at), 1);
  }
  a.tick(3600 * kSecondNs);  // every timer due
  a.take_output();
  a.take_events();
}

// GPU 0 of a two-GPU SuperPoD with its first sub-link's session Established (the switch's end is a BgpSession
// here); the fuzz bytes then arrive from the switch, routes and all, and FARE decides on whatever they said.
void speaker(const std::vector<uint8_t>& bytes) {
  static const Topology topo = make_superpod(2, 1);
  const int g0 = topo.gpu_node(0);
  int link = -1;
  for (int l : topo.links_of(g0)) {
    if ((topo.links[l].a == g0 ? topo.links[l].a_port : topo.links[l].b_port) == 0) link = l;
  }
  const int sw = topo.peer(link, g0).first;
  BgpSpeaker sp(topo, g0);
  sp.set_port_up(0, true, 0);
  sp.process(0);
  const int conn = sp.accepted(0, 0);
  BgpSessionConfig cp;
  cp.local_as = bgp_as_of(sw);
  cp.peer_as = bgp_as_of(g0);
  cp.bgp_id = topo.nodes[sw].loopback;
  cp.passive = true;
  BgpSession peer(cp);
  peer.start(0);
  peer.connected(0);
  for (int i = 0; i < 4; ++i) {
    const std::vector<uint8_t> x = sp.take_output(conn), y = peer.take_output();
    peer.receive(x.data(), x.size(), 0);
    sp.received(conn, y.data(), y.size(), 0);
    sp.process(0);
  }
  if (!sp.established(0)) std::abort();
  for (size_t at = 0; at < bytes.size(); at += 97) {
    sp.received(conn, bytes.data() + at, std::min<size_t>(97, bytes.size() - at), 1);
    sp.process(1);
  }
  for (const NextHop& h : sp.next_hops(1)) {
    if (h.port < 0 || h.port >= sp.ports() || !(h.weight >= 0)) std::abort();
  }
  sp.rib();
  sp.tick(3600 * kSecondNs);
  sp.process(3600 * kSecondNs);
  sp.take_requests();
  sp.take_log();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<uint8_t> buf;
  if (data[0] & 1) {
    buf.assign(data + 1, data + size);
  } else {
    const size_t len = std::min<size_t>(kBgpMaxMessage, kBgpHeaderSize + size - 1);
    buf.assign(kBgpMarkerSize, 0xff);
    buf.push_back(static_cast<uint8_t>(len >> 8));
    buf.push_back(static_cast<uint8_t>(len));
    buf.push_back(static_cast<uint8_t>(1 + data[0] / 2 % 5));
    buf.insert(buf.end(), data + 1, data + 1 + (len - kBgpHeaderSize));
  }
  // A heap copy of exactly the message, so ASan flags any read past its end.
  BgpError err;
  const size_t n = bgp_frame_length(buf.data(), buf.size(), &err);
  const std::vector<uint8_t> msg(buf.begin(), buf.begin() + (n ? n : buf.size()));
  for (const BgpDecodeOptions& opt : {BgpDecodeOptions{true, true, 4200000002u}, BgpDecodeOptions{false, false, 0}}) {
    const BgpMessage m = decode_bgp(msg.data(), msg.size(), opt);
    check(m, msg.size());
    round_trip(m, opt);
  }
  session(buf);
  speaker(buf);
  return 0;
}
