-- wrk script for benchmarks/receive.py: every request is a distinct, pre-signed delivery.
--
--   wrk -t1 -c32 -d10s -s receive.lua http://127.0.0.1:PORT/webhooks/stripe \
--       -- REQUESTS_FILE FIRST LAST THREADS
--
-- REQUESTS_FILE has one delivery per line: "<Stripe-Signature value>\t<JSON body>".
-- Lines FIRST .. LAST-1 (0-based) are used, split into THREADS equal slices, one per
-- wrk thread, so no two threads (and no two wrk runs given disjoint ranges) send the
-- same event. A thread that runs out of its slice starts over and counts a wrap:
-- from then on it sends duplicates, which receive.py reports as a failed check.
--
-- done() prints one machine-readable line, "RECEIVE_RESULT {json}", with the totals,
-- the latency percentiles (microseconds) and the request() calls per thread.

local threads = {}

function setup(thread)
   thread:set("tid", #threads)
   table.insert(threads, thread)
end

function init(args)
   local file = args[1]
   local first, last, nthreads = tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
   local per = math.floor((last - first) / nthreads)
   local lo = first + tid * per
   local hi = lo + per
   local head = "POST " .. wrk.path .. " HTTP/1.1\r\n"
      .. "Host: " .. wrk.host .. ":" .. wrk.port .. "\r\n"
      .. "User-Agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\n"
      .. "Accept: */*; q=0.5, application/xml\r\n"
      .. "Cache-Control: no-cache\r\n"
      .. "Content-Type: application/json; charset=utf-8\r\n"
      .. "Stripe-Signature: "
   pool = {}
   local n, i = 0, 0
   for line in io.lines(file) do
      if i >= hi then
         break
      end
      if i >= lo then
         local tab = line:find("\t", 1, true)
         local body = line:sub(tab + 1)
         n = n + 1
         pool[n] = head .. line:sub(1, tab - 1)
            .. "\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body
      end
      i = i + 1
   end
   if n == 0 then
      error("no requests in lines " .. lo .. ".." .. hi .. " of " .. file)
   end
   size, index, calls, wraps = n, 0, 0, 0
end

function request()
   calls = calls + 1
   index = index + 1
   if index > size then
      index = 1
      wraps = wraps + 1
   end
   return pool[index]
end

function done(summary, latency, requests)
   local per_thread = {}
   for i, thread in ipairs(threads) do
      per_thread[i] = string.format('{"calls":%d,"wraps":%d,"size":%d}',
         thread:get("calls"), thread:get("wraps"), thread:get("size"))
   end
   local e = summary.errors
   io.write(string.format(
      'RECEIVE_RESULT {"duration_us":%d,"requests":%d,"bytes":%d,'
      .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
      .. '"latency_us":{"min":%d,"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d},'
      .. '"threads":[%s]}\n',
      summary.duration, summary.requests, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency.mean, latency:percentile(50), latency:percentile(90),
      latency:percentile(99), latency:percentile(99.9), latency.max,
      table.concat(per_thread, ",")))
end
