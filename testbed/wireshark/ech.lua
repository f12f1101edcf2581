-- Wireshark/tshark dissector for ECH v1 and v2 (docs/ech-v1.md): UDP 4793 -> ECH -> InfiniBand BTH and the rest.
-- v2 is the compact header with a bitmap base (endpoints past 63). Use: tshark -X lua_script:testbed/wireshark/ech.lua
-- -r FILE
local ech = Proto("ech", "IFEC Extended Computing Header")

local formats = { [0] = "compact", [1] = "standard" }
local ops = { [1] = "multicast", [2] = "reduce", [3] = "allreduce", [4] = "barrier" }
local dtypes = { [0] = "fp32", [1] = "fp16", [2] = "bf16", [3] = "int32" }
local redops = { [0] = "sum", [1] = "min", [2] = "max" }

local f = {
  version = ProtoField.uint8("ech.version", "Version", base.DEC, nil, 0xF0),
  format = ProtoField.uint8("ech.format", "Format", base.DEC, formats, 0x0F),
  op = ProtoField.uint8("ech.op", "Operation", base.DEC, ops),
  flags = ProtoField.uint8("ech.flags", "Flags", base.HEX),
  flag_s = ProtoField.bool("ech.flags.strong_ordering", "Strong ordering", 8, nil, 0x80),
  flag_r = ProtoField.bool("ech.flags.retransmission", "Retransmission", 8, nil, 0x40),
  flag_a = ProtoField.bool("ech.flags.anomaly", "Anomaly", 8, nil, 0x20),
  hlen = ProtoField.uint8("ech.hdr_len", "Header length (words)", base.DEC),
  source_id = ProtoField.uint16("ech.source_id", "Source endpoint", base.DEC),
  window_id = ProtoField.uint16("ech.window_id", "Window", base.DEC),
  bitmap = ProtoField.uint64("ech.dest_bitmap", "Destination bitmap", base.HEX),
  bitmap_base = ProtoField.uint16("ech.bitmap_base", "Bitmap base (endpoint of bit 0)", base.DEC),
  dests = ProtoField.string("ech.dests", "Destinations"),
  job_id = ProtoField.uint32("ech.job_id", "Job", base.DEC),
  group_id = ProtoField.uint16("ech.group_id", "Group", base.DEC),
  contributor_id = ProtoField.uint16("ech.contributor_id", "Contributor", base.DEC),
  chunk_index = ProtoField.uint32("ech.chunk_index", "Chunk", base.DEC),
  dtype = ProtoField.uint8("ech.dtype", "Data type", base.DEC, dtypes, 0xF0),
  redop = ProtoField.uint8("ech.redop", "Reduction op", base.DEC, redops, 0x0F),
  element_count = ProtoField.uint16("ech.element_count", "Elements", base.DEC),
  expected = ProtoField.uint8("ech.expected", "Expected contributors (0 = all)", base.DEC),
}
ech.fields = {
  f.version, f.format, f.op, f.flags, f.flag_s, f.flag_r, f.flag_a, f.hlen, f.source_id, f.window_id, f.bitmap,
  f.bitmap_base, f.dests, f.job_id, f.group_id, f.contributor_id, f.chunk_index, f.dtype, f.redop, f.element_count, f.expected,
}

local ef_bad = ProtoExpert.new("ech.malformed", "Malformed ECH", expert.group.MALFORMED, expert.severity.ERROR)
ech.experts = { ef_bad }

-- The RoCEv2 (routable RoCE) dissector that Wireshark itself registers on UDP 4791.
local rroce = DissectorTable.get("udp.port"):get_dissector(4791)

local function bitmap_list(tvb_range, base_endpoint)
  local hi = tvb_range:range(0, 4):uint()
  local lo = tvb_range:range(4, 4):uint()
  local out = {}
  for i = 63, 0, -1 do
    local word = (i >= 32) and hi or lo
    local bit = i % 32
    if math.floor(word / 2 ^ bit) % 2 == 1 then
      table.insert(out, 1, tostring(base_endpoint + i))
    end
  end
  return table.concat(out, ",")
end

-- Marks the frame malformed as Wireshark's own dissectors do: an expert item in the Malformed group on the
-- protocol's tree and "[Malformed Packet: ECH]" in the Info column (never a Lua error).
local function malformed(item, pinfo, why)
  item:add_proto_expert_info(ef_bad, why)
  pinfo.cols.info:append(" [Malformed Packet: ECH]")
end

function ech.dissector(tvb, pinfo, tree)
  pinfo.cols.protocol = "ECH"
  if tvb:len() < 4 then
    malformed(tree:add(ech, tvb(), "IFEC Extended Computing Header (truncated)"), pinfo,
      string.format("%d bytes: shorter than the 4-byte common prefix", tvb:len()))
    return
  end
  local version = tvb(0, 1):bitfield(0, 4)
  local format = tvb(0, 1):bitfield(4, 4)
  local hlen = tvb(3, 1):uint() * 4
  local t = tree:add(ech, tvb(0, math.min(hlen, tvb:len())), "IFEC Extended Computing Header")
  t:add(f.version, tvb(0, 1))
  t:add(f.format, tvb(0, 1))
  t:add(f.op, tvb(1, 1))
  local ft = t:add(f.flags, tvb(2, 1))
  ft:add(f.flag_s, tvb(2, 1))
  ft:add(f.flag_r, tvb(2, 1))
  ft:add(f.flag_a, tvb(2, 1))
  t:add(f.hlen, tvb(3, 1))
  local expect = (format == 0) and ((version == 2) and 20 or 16) or 24
  if (version ~= 1 and version ~= 2) or format > 1 or (version == 2 and format ~= 0) or hlen ~= expect then
    malformed(t, pinfo, string.format(
      "version %d format %d header length %d (v1: 16 compact, 24 standard; v2: 20 compact)", version, format, hlen))
    return
  end
  if tvb:len() < hlen then
    malformed(t, pinfo, string.format("truncated: %d of the %d header bytes", tvb:len(), hlen))
    return
  end
  local op = ops[tvb(1, 1):uint()] or "?"
  if format == 0 then
    t:add(f.source_id, tvb(4, 2))
    t:add(f.window_id, tvb(6, 2))
    local at, base_endpoint = 8, 0
    if version == 2 then
      t:add(f.bitmap_base, tvb(8, 2))
      at, base_endpoint = 12, tvb(8, 2):uint()
    end
    t:add(f.bitmap, tvb(at, 8))
    local dests = bitmap_list(tvb(at, 8), base_endpoint)
    t:add(f.dests, tvb(at, 8), dests)
    t:append_text(string.format(", compact %s to {%s}", op, dests))
  else
    t:add(f.job_id, tvb(4, 4))
    t:add(f.group_id, tvb(8, 2))
    t:add(f.contributor_id, tvb(10, 2))
    t:add(f.chunk_index, tvb(12, 4))
    t:add(f.dtype, tvb(16, 1))
    t:add(f.redop, tvb(16, 1))
    t:add(f.expected, tvb(17, 1))
    t:add(f.element_count, tvb(18, 2))
    t:add(f.window_id, tvb(20, 2))
    t:append_text(string.format(", standard %s job %d group %d chunk %d", op, tvb(4, 4):uint(), tvb(8, 2):uint(),
      tvb(12, 4):uint()))
  end
  pinfo.cols.info:prepend(string.format("ECH %s ", op))
  if tvb:len() == hlen then
    malformed(t, pinfo, "no BTH after the ECH (an ECH frame always carries RoCEv2 headers)")
  elseif rroce ~= nil then
    -- Wireshark's RRoCE dissector reports its own truncation; from Lua that arrives as an error to catch.
    local ok, err = pcall(Dissector.call, rroce, tvb(hlen):tvb(), pinfo, tree)
    pinfo.cols.protocol = "ECH+RRoCE"
    if not ok then
      malformed(t, pinfo, "RoCEv2 headers after the ECH are truncated (" .. tostring(err) .. ")")
    end
  end
end

DissectorTable.get("udp.port"):add(4793, ech)
