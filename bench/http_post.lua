-- wrk script for bench/http_bench.py: POST a JSON body to the URL, and at the
-- end print one line "BENCH_RESULT {...}" with the counts and latencies.
--
-- The body comes from the environment (BENCH_HTTP_BODY, made by the benchmark
-- with json.dumps), else {"s": "hello"}. It is set once, so wrk sends the
-- same prepared request on every connection without calling Lua per request.

-- BENCH_HTTP_BODY_FILE instead names a file holding the body (any bytes: a
-- multipart upload), sent with the type BENCH_HTTP_CONTENT_TYPE.

wrk.method = "POST"
local body_file = os.getenv("BENCH_HTTP_BODY_FILE")
if body_file then
   local handle = assert(io.open(body_file, "rb"))
   wrk.body = handle:read("*a")
   handle:close()
   wrk.headers["Content-Type"] = os.getenv("BENCH_HTTP_CONTENT_TYPE")
else
   wrk.headers["Content-Type"] = "application/json"
   wrk.body = os.getenv("BENCH_HTTP_BODY") or '{"s": "hello"}'
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH_RESULT {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
      '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, ' ..
      '"lat_mean_us": %.1f, "lat_p50_us": %.1f, "lat_p75_us": %.1f, "lat_p90_us": %.1f, ' ..
      '"lat_p95_us": %.1f, "lat_p99_us": %.1f, "lat_p99.9_us": %.1f, "lat_max_us": %.1f}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.mean, latency:percentile(50), latency:percentile(75), latency:percentile(90),
      latency:percentile(95), latency:percentile(99), latency:percentile(99.9), latency.max))
end
