-- wrk script: POST a ~100-byte chat body; print one machine-readable RESULT line at the end.
-- BENCH_HEADER="Name: value" adds a header (e.g. Cache-Control: no-store); BENCH_UNIQUE=1 sends
-- a new deterministic chat question each time (semantic misses; BENCH_SEED varies them between
-- runs) and counts the answers that came from the cache (X-Cache hit or semantic-hit).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_AUTH") or "none")
local extra = os.getenv("BENCH_HEADER")
if extra and extra ~= "" then
  local k, v = extra:match("^([^:]+):%s*(.*)$")
  wrk.headers[k] = v
end

local threads = {}
function setup(thread) table.insert(threads, thread) end

if (os.getenv("BENCH_UNIQUE") or "") ~= "" then
  local words = {"river", "engine", "quantum", "violin", "harvest", "glacier", "pepper", "orbit",
    "lantern", "tariff", "falcon", "mosaic", "thunder", "ledger", "compass", "velvet", "copper",
    "meadow", "cipher", "tundra", "sonnet", "mortar", "jasmine", "reactor", "canyon", "biscuit",
    "pilgrim", "voltage", "saffron", "harbor", "nebula", "quarry", "walrus", "emerald", "piston",
    "lagoon", "chimney", "tablet", "rhythm", "oyster", "turbine", "marble", "dungeon", "parsley"}
  math.randomseed(tonumber(os.getenv("BENCH_SEED") or "") or os.time())
  local n = 0
  hits = 0
  request = function()
    n = n + 1
    local parts = {}
    for i = 1, 9 do parts[i] = words[math.random(#words)] end
    local text = "why would a " .. table.concat(parts, " ") .. " " .. n
    return wrk.format(nil, nil, nil,
      '{"model":"m","temperature":0,"messages":[{"role":"user","content":"' .. text .. '"}]}')
  end
  response = function(status, headers, body)
    local x = headers["X-Cache"] or headers["x-cache"] or ""
    if x == "hit" or x == "semantic-hit" then hits = hits + 1 end
  end
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %.1f %.1f %.1f %d %d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(95), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
  local h = 0
  for _, t in ipairs(threads) do h = h + (t:get("hits") or 0) end
  io.write(string.format("HITS %d\n", h))
end
