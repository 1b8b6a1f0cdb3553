"""`fd router`: the front door of a prefill/decode deployment (docs/disaggregation.md).

`registry.py` keeps the instances that heartbeat to it, `proxy.py` runs one request through a prefill
and a decode instance, `metrics.py` merges the instances' /metrics, `app.py` maps it onto HTTP.
"""
