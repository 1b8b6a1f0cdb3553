"""`fd bench`: serving benchmark against any OpenAI-compatible server and offline engine benchmarks.

Layout: datasets (request lists), traffic (arrival schedule), sse + client (one streamed request,
timestamped), metrics (pure functions of the records), request_loop (the async loop), render (Rich output),
results (JSON save/compare), offline (latency/throughput over the in-process engine).
Nothing here imports paddle or engine internals at module level.
"""
