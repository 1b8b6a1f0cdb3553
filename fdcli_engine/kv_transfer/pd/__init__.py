"""Prefill/decode disaggregation's KV transfer: a prefill instance ships a finished prompt's blocks to
a decode instance over zmq (msgspec frames, a shared token); `connector.PDConnector` is the engine's
side, `settings.py` the options, `params.py` the request's `kv_transfer_params`."""
