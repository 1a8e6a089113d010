-- Wireshark dissector for the udskit wire protocol (protocol/spec.md):
-- hello, every frame type, call ids, methods, metadata, error codes, and
-- newline-delimited JSON lines.
--
--   tshark -X lua_script:wireshark/udskit.lua -r capture.pcapng -Y udskit
--   wireshark -X lua_script:wireshark/udskit.lua capture.pcapng
--   (or copy it into ~/.local/lib/wireshark/plugins/)
--
-- It registers for TCP port 7377 (where `udskit capture` puts udskit
-- connections) and, heuristically, for any TCP stream that starts with the
-- hello magic "UDSK".

local udskit = Proto("udskit", "udskit IPC protocol")

local PORT = 7377
local HEADER = 16
local MAX_HEAD = 16384
local MAX_LINE = 16 * 1024 * 1024

local types = {
  [1] = "request", [2] = "response", [3] = "error", [4] = "cancel",
  [5] = "stream_data", [6] = "stream_end", [7] = "ping", [8] = "pong",
  [9] = "goaway", [10] = "stream_credit",
  [11] = "request_data", [12] = "request_end", [13] = "request_credit",
}
local codes = {
  [1] = "canceled", [2] = "unknown", [3] = "invalid_argument", [4] = "deadline_exceeded",
  [5] = "not_found", [6] = "already_exists", [7] = "permission_denied", [8] = "resource_exhausted",
  [9] = "failed_precondition", [10] = "aborted", [11] = "out_of_range", [12] = "unimplemented",
  [13] = "internal", [14] = "unavailable", [15] = "data_loss", [16] = "unauthenticated",
  [32] = "protocol_violation",
}

local f = {
  hello         = ProtoField.bytes("udskit.hello", "Hello"),
  magic         = ProtoField.string("udskit.hello.magic", "Magic"),
  version       = ProtoField.uint8("udskit.hello.version", "Version"),
  features      = ProtoField.uint8("udskit.hello.features", "Feature flags", base.HEX),
  stream_credit = ProtoField.bool("udskit.hello.stream_credit", "stream_credit feature", 8, nil, 0x01),
  max_frame     = ProtoField.uint32("udskit.hello.max_frame", "Max frame"),
  max_in_flight = ProtoField.uint32("udskit.hello.max_in_flight", "Max in flight"),
  type          = ProtoField.uint8("udskit.type", "Type", base.DEC, types),
  flags         = ProtoField.uint8("udskit.flags", "Flags", base.HEX),
  head_len      = ProtoField.uint16("udskit.head_len", "Head length"),
  id            = ProtoField.uint32("udskit.id", "Call id"),
  payload_len   = ProtoField.uint32("udskit.payload_len", "Payload length"),
  aux           = ProtoField.uint32("udskit.aux", "Aux"),
  timeout       = ProtoField.uint32("udskit.timeout_us", "Timeout (µs, 0 = none)"),
  stream        = ProtoField.bool("udskit.stream", "Server stream expected"),
  refused       = ProtoField.bool("udskit.refused", "Refused (safe to retry)"),
  code          = ProtoField.uint32("udskit.code", "Error code", base.DEC, codes),
  code_name     = ProtoField.string("udskit.code_name", "Error code name"),
  message       = ProtoField.string("udskit.message", "Message"),
  reason        = ProtoField.uint32("udskit.cancel_reason", "Cancel reason"),
  credit        = ProtoField.uint32("udskit.credit", "Stream credit (bytes)"),
  method        = ProtoField.string("udskit.method", "Method"),
  md            = ProtoField.bytes("udskit.metadata", "Metadata entry"),
  md_key        = ProtoField.string("udskit.md.key", "Key"),
  md_value      = ProtoField.string("udskit.md.value", "Value"),
  payload       = ProtoField.bytes("udskit.payload", "Payload"),
  line          = ProtoField.string("udskit.ndjson.line", "NDJSON line"),
  nd_id         = ProtoField.string("udskit.ndjson.id", "NDJSON id"),
  nd_func       = ProtoField.string("udskit.ndjson.func", "NDJSON func"),
  nd_error      = ProtoField.string("udskit.ndjson.error", "NDJSON error"),
  nd_code       = ProtoField.string("udskit.ndjson.code", "NDJSON code"),
}
local list = {}
for _, v in pairs(f) do list[#list + 1] = v end
udskit.fields = list

local ef_bad = ProtoExpert.new("udskit.malformed", "Malformed udskit data", expert.group.MALFORMED, expert.severity.ERROR)
udskit.experts = { ef_bad }

-- metadata entries: u16 key length, key, u16 value length, value
local function metadata(tvb, tree, off, stop)
  while off < stop do
    if off + 2 > stop then tree:add_proto_expert_info(ef_bad, "truncated metadata key length"); return false end
    local kl = tvb(off, 2):le_uint()
    if kl == 0 or off + 2 + kl + 2 > stop then tree:add_proto_expert_info(ef_bad, "bad metadata key"); return false end
    local vl = tvb(off + 2 + kl, 2):le_uint()
    if off + 4 + kl + vl > stop then tree:add_proto_expert_info(ef_bad, "metadata value overruns the head"); return false end
    local e = tree:add(f.md, tvb(off, 4 + kl + vl))
    local k = tvb(off + 2, kl):string(ENC_UTF_8)
    local v = vl > 0 and tvb(off + 4 + kl, vl):string(ENC_UTF_8) or ""
    if k == ":pad" then v = vl .. " bytes of padding" end -- spec 3.1: aligns the payload, means nothing
    e:add(f.md_key, tvb(off + 2, kl), k)
    if vl > 0 then e:add(f.md_value, tvb(off + 4 + kl, vl), v) else e:add(f.md_value, tvb(off + 4 + kl - 2, 2), v) end
    e:set_text("Metadata: " .. k .. " = " .. v)
    off = off + 4 + kl + vl
  end
  return true
end

local function frame(tvb, pinfo, tree, off)
  local typ = tvb(off, 1):uint()
  local flags = tvb(off + 1, 1):uint()
  local hl = tvb(off + 2, 2):le_uint()
  local id = tvb(off + 4, 4):le_uint()
  local pl = tvb(off + 8, 4):le_uint()
  local aux = tvb(off + 12, 4):le_uint()
  local total = HEADER + hl + pl
  local name = types[typ] or ("type_" .. typ)
  local t = tree:add(udskit, tvb(off, total), "udskit " .. name .. ", id " .. id)
  t:add(f.type, tvb(off, 1))
  t:add(f.flags, tvb(off + 1, 1))
  t:add_le(f.head_len, tvb(off + 2, 2))
  t:add_le(f.id, tvb(off + 4, 4))
  t:add_le(f.payload_len, tvb(off + 8, 4))
  local info = name .. " id=" .. id
  if typ == 1 then
    t:add_le(f.timeout, tvb(off + 12, 4))
    t:add(f.stream, tvb(off + 1, 1), bit.band(flags, 1) ~= 0)
    local h = off + HEADER
    if hl < 2 then
      t:add_proto_expert_info(ef_bad, "request head has no method")
    else
      local ml = tvb(h, 2):le_uint()
      if ml == 0 or 2 + ml > hl then
        t:add_proto_expert_info(ef_bad, "bad method length")
      else
        local m = tvb(h + 2, ml):string(ENC_UTF_8)
        t:add(f.method, tvb(h + 2, ml), m)
        info = info .. " " .. m
        if bit.band(flags, 1) ~= 0 then info = info .. " (stream)" end
        metadata(tvb, t, h + 2 + ml, h + hl)
      end
    end
  elseif typ == 3 then
    t:add_le(f.code, tvb(off + 12, 4))
    t:add(f.code_name, tvb(off + 12, 4), codes[aux] or ("code_" .. aux))
    t:add(f.refused, tvb(off + 1, 1), bit.band(flags, 1) ~= 0)
    local msg = hl > 0 and tvb(off + HEADER, hl):string(ENC_UTF_8) or ""
    if hl > 0 then t:add(f.message, tvb(off + HEADER, hl), msg) end
    info = info .. " " .. (codes[aux] or ("code_" .. aux)) .. ": " .. msg
  elseif typ == 2 or typ == 6 then
    t:add_le(f.aux, tvb(off + 12, 4))
    metadata(tvb, t, off + HEADER, off + HEADER + hl)
  elseif typ == 4 then
    t:add_le(f.reason, tvb(off + 12, 4))
  elseif typ == 10 then
    t:add_le(f.credit, tvb(off + 12, 4))
    info = info .. " +" .. aux
  elseif typ == 9 then
    t:add_le(f.aux, tvb(off + 12, 4))
    if hl > 0 then
      local msg = tvb(off + HEADER, hl):string(ENC_UTF_8)
      t:add(f.message, tvb(off + HEADER, hl), msg)
      info = info .. " " .. msg
    end
  else
    t:add_le(f.aux, tvb(off + 12, 4))
  end
  if pl > 0 then t:add(f.payload, tvb(off + HEADER + hl, pl)) end
  return info
end

local function hello(tvb, tree, off)
  local t = tree:add(udskit, tvb(off, 16), "udskit hello")
  t:add(f.hello, tvb(off, 16))
  t:add(f.magic, tvb(off, 4))
  t:add(f.version, tvb(off + 4, 1))
  t:add(f.features, tvb(off + 5, 1))
  t:add(f.stream_credit, tvb(off + 5, 1))
  t:add_le(f.max_frame, tvb(off + 8, 4))
  t:add_le(f.max_in_flight, tvb(off + 12, 4))
  return "hello v" .. tvb(off + 4, 1):uint() .. " max_frame=" .. tvb(off + 8, 4):le_uint()
end

local function jsonfield(s, key)
  local v = s:match('"' .. key .. '"%s*:%s*("[^"]*")')
  if v then return v end
  return s:match('"' .. key .. '"%s*:%s*([%w%.%-]+)')
end

local function ndjson(tvb, tree, off, len)
  local s = tvb(off, len):string(ENC_UTF_8)
  local t = tree:add(udskit, tvb(off, len + 1), "udskit NDJSON")
  t:add(f.line, tvb(off, len), s)
  local id, fn, er, code = jsonfield(s, "id"), jsonfield(s, "func"), jsonfield(s, "error"), jsonfield(s, "code")
  local info = "ndjson"
  if id then t:add(f.nd_id, tvb(off, len), id); info = info .. " id=" .. id end
  if fn then t:add(f.nd_func, tvb(off, len), (fn:gsub('"', ''))); info = info .. " " .. fn end
  if er then t:add(f.nd_error, tvb(off, len), er); info = info .. " error" end
  if code then t:add(f.nd_code, tvb(off, len), (code:gsub('"', ''))); info = info .. " " .. code end
  return info
end

-- A line may start with whitespace before its '{' (or be blank); a frame
-- whose type byte happens to be a space or newline is followed by a flags
-- byte, which is neither.
local function looks_like_line(tvb, off, n)
  for i = off, math.min(off + 16, n) - 1 do
    local c = tvb(i, 1):uint()
    if c == 0x7b then return true end
    if c ~= 0x20 and c ~= 0x09 and c ~= 0x0d and c ~= 0x0a then return false end
  end
  return false
end

function udskit.dissector(tvb, pinfo, tree)
  local n = tvb:len()
  local off = 0
  local infos = {}
  while off < n do
    local rest = n - off
    local first = tvb(off, 1):uint()
    if first == 0x55 and rest >= 4 and tvb(off, 4):string() == "UDSK" then
      if rest < 16 then pinfo.desegment_offset = off; pinfo.desegment_len = 16 - rest; return n end
      infos[#infos + 1] = hello(tvb, tree, off)
      off = off + 16
    elseif first == 0x7b or looks_like_line(tvb, off, n) then
      local nl = nil
      for i = off, n - 1 do
        if tvb(i, 1):uint() == 0x0a then nl = i; break end
      end
      if not nl then
        if rest > MAX_LINE then break end
        pinfo.desegment_offset = off; pinfo.desegment_len = DESEGMENT_ONE_MORE_SEGMENT; return n
      end
      if nl > off then infos[#infos + 1] = ndjson(tvb, tree, off, nl - off) end
      off = nl + 1
    else
      if rest < HEADER then pinfo.desegment_offset = off; pinfo.desegment_len = HEADER - rest; return n end
      local hl = tvb(off + 2, 2):le_uint()
      local pl = tvb(off + 8, 4):le_uint()
      if hl > MAX_HEAD then
        tree:add(udskit, tvb(off, rest), "udskit: head length over 16384"):add_proto_expert_info(ef_bad, "head_too_large")
        break
      end
      local total = HEADER + hl + pl
      if rest < total then pinfo.desegment_offset = off; pinfo.desegment_len = total - rest; return n end
      infos[#infos + 1] = frame(tvb, pinfo, tree, off)
      off = off + total
    end
  end
  if #infos > 0 then
    pinfo.cols.protocol = "udskit"
    pinfo.cols.info = table.concat(infos, "; ")
  end
  return off
end

DissectorTable.get("tcp.port"):add(PORT, udskit)

local function heuristic(tvb, pinfo, tree)
  if tvb:len() < 4 or tvb(0, 4):string() ~= "UDSK" then return false end
  pinfo.conversation = udskit
  udskit.dissector(tvb, pinfo, tree)
  return true
end
udskit:register_heuristic("tcp", heuristic)
