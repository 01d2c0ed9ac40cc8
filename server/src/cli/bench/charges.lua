-- wrk script for `vaultcap bench proxy`: charges of 100 cents, each for
-- another customer and under its own Idempotency-Key, the vault keys taken
-- in turn. Arguments: the file of vault keys (one per line), `twins` to
-- send every charge twice at once (the same Idempotency-Key from two
-- connections, as a queue delivering one message twice does) or `single`,
-- and a tag that starts this run's Idempotency-Keys and customer ids.

local threads = {}
local next_id = 1

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  keys = {}
  for line in io.lines(args[1]) do
    keys[#keys + 1] = line
  end
  twins = args[2] == "twins"
  tag = args[3] .. "-" .. id .. "-"
  sent, ok, conflict, other = 0, 0, 0, 0
end

function request()
  sent = sent + 1
  local n = sent
  if twins then
    n = math.floor((sent + 1) / 2)
  end
  local headers = {
    -- Each thread starts at another key: threads in step would otherwise
    -- send to the same keys at once, and "100 keys" would be a few.
    ["Authorization"] = "Bearer " .. keys[((n + id * 37) % #keys) + 1],
    ["Content-Type"] = "application/x-www-form-urlencoded",
    ["Idempotency-Key"] = tag .. n,
  }
  local body = "amount=100&currency=usd&customer=cus_bench&metadata%5Bcustomer_id%5D=" .. tag .. n
  return wrk.format("POST", "/v1/charges", headers, body)
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    ok = ok + 1
  elseif status == 409 then
    conflict = conflict + 1
  else
    other = other + 1
    if other <= 3 then
      io.stderr:write("answered " .. status .. ": " .. body .. "\n")
    end
  end
end

function done(summary, latency, requests)
  local ok_total, conflict_total, other_total = 0, 0, 0
  for _, thread in ipairs(threads) do
    ok_total = ok_total + thread:get("ok")
    conflict_total = conflict_total + thread:get("conflict")
    other_total = other_total + thread:get("other")
  end
  local errors = summary.errors
  io.write(string.format(
    "VAULTCAP requests=%d duration_us=%d p50_us=%d p99_us=%d ok=%d conflict=%d other=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    ok_total, conflict_total, other_total,
    errors.connect + errors.read + errors.write + errors.timeout))
end
