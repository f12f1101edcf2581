// libFuzzer target: the BGP message decoder and an Established session must take any bytes without crashing or
// reading out of bounds; every error must say what is wrong; what decodes as an UPDATE must re-encode and decode
// to the same update.
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
  if (!m.ok() || m.type != 2 || m.update.withdrawn.size() + m.update.nlri.size() > 900) return;
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
  return 0;
}
