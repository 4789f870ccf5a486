-- wrk script: POST a ~100-byte chat body; print one machine-readable RESULT line at the end.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_AUTH") or "none")

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %.1f %.1f %.1f %d %d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(95), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
