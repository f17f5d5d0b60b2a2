-- wrk script for benchmarks/idempotency.py: POST /orders with an Idempotency-Key.
--
--   wrk -t1 -c32 -d10s -s idempotency.lua http://127.0.0.1:PORT/orders -- MODE TAG KEYS
--
-- MODE "fresh": every request carries a new key, "TAG-<thread>-<random>-<counter>",
--   from a per-thread counter behind a random per-thread prefix; KEYS is ignored.
-- MODE "fresh-random": as fresh, with "<scrambled counter>-" before the counter:
--   8 hex digits that are the counter times an odd constant, modulo 2^32, so
--   that successive keys sort all over the key space, as UUID4 keys do, rather
--   than next to each other.
-- MODE "cycle": thread t cycles over the keys "TAG-t-0" .. "TAG-t-<KEYS-1>", so after
--   the first pass every request repeats an earlier one (a replay).
--
-- The body of key number i is always the same (BODY with i filled in) and so are
-- the other headers: a repeat is the same request, never a fingerprint mismatch.
-- benchmarks/idempotency.py builds the same bytes for its sampled checks.
--
-- response() counts, per thread, the answers that are not 201 and the answers
-- carrying "Idempotent-Replayed: true". The same script (and so the same wrk cost)
-- is used for every target, the bare one included.
--
-- done() prints one machine-readable line, "IDEMPOTENCY_RESULT {json}", with the
-- totals, the latency percentiles (microseconds) and the per-thread counters.

local threads = {}

local BODY = '{"customer":"cus_%s%d","currency":"usd","items":['
   .. '{"sku":"SKU-1001","quantity":2},{"sku":"SKU-2002","quantity":1}],'
   .. '"shipping":{"method":"standard","country":"DE"}}'

function setup(thread)
   thread:set("tid", #threads)
   table.insert(threads, thread)
end

function init(args)
   mode, tag, nkeys = args[1], args[2], tonumber(args[3])
   if mode == "fresh" or mode == "fresh-random" then
      math.randomseed(os.time() * 1000 + tid * 7919 + math.floor(os.clock() * 1e6))
      prefix = string.format("%s-%d-%08x-", tag, tid, math.random(0, 0x7fffffff))
   elseif mode == "cycle" then
      if not nkeys or nkeys < 1 then
         error("cycle mode needs KEYS >= 1")
      end
      prefix = string.format("%s-%d-", tag, tid)
   else
      error("MODE must be fresh, fresh-random or cycle, got " .. tostring(mode))
   end
   head = "POST " .. wrk.path .. " HTTP/1.1\r\n"
      .. "Host: " .. wrk.host .. ":" .. wrk.port .. "\r\n"
      .. "User-Agent: onceonly-bench/1.0\r\n"
      .. "Accept: application/json\r\n"
      .. "Authorization: Bearer sk_test_onceonly_benchmark_" .. tid .. "\r\n"
      .. "Content-Type: application/json\r\n"
      .. "Idempotency-Key: " .. prefix
   calls, responses, non201, replayed = 0, 0, 0, 0
end

function request()
   local i = calls
   if mode == "cycle" then
      i = calls % nkeys
   end
   calls = calls + 1
   local body = string.format(BODY, tag, i)
   local key = i
   if mode == "fresh-random" then
      -- A bijection on 32-bit counters; exact in doubles (below 2^53).
      key = string.format("%08x-%d", (i * 2654435761) % 4294967296, i)
   end
   return head .. key .. "\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body
end

function response(status, headers, body)
   responses = responses + 1
   if status ~= 201 then
      non201 = non201 + 1
   end
   if headers["idempotent-replayed"] == "true" then
      replayed = replayed + 1
   end
end

function done(summary, latency, requests)
   local per_thread = {}
   for i, thread in ipairs(threads) do
      per_thread[i] = string.format(
         '{"calls":%d,"responses":%d,"non201":%d,"replayed":%d,"prefix":"%s"}',
         thread:get("calls"), thread:get("responses"), thread:get("non201"),
         thread:get("replayed"), thread:get("prefix"))
   end
   local e = summary.errors
   io.write(string.format(
      'IDEMPOTENCY_RESULT {"duration_us":%d,"requests":%d,"bytes":%d,'
      .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
      .. '"latency_us":{"min":%d,"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d},'
      .. '"threads":[%s]}\n',
      summary.duration, summary.requests, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency.mean, latency:percentile(50), latency:percentile(90),
      latency:percentile(99), latency:percentile(99.9), latency.max,
      table.concat(per_thread, ",")))
end
