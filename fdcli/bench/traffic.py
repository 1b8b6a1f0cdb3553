"""Arrival schedule: when each request is sent, as offsets in seconds from the benchmark start.

The schedule is computed up front from a seeded generator, so a run's traffic is reproducible and
testable without sleeping. Gaps follow a gamma distribution with shape = burstiness and mean 1/rate:
burstiness 1 is a Poisson process, smaller is burstier, larger is more regular (CV = 1/sqrt(burstiness)).
With ramp-up the rate of request i moves from `start_rate` to `end_rate` by request index
(linear: arithmetic steps; exponential: geometric steps).
"""

from __future__ import annotations

import math

from fdcli_engine.errors import ConfigError

RAMP_UP_KINDS = ("linear", "exponential")


def request_rates(
    num_requests: int,
    rate: float,
    ramp_up: str | None = None,
    start_rate: float | None = None,
    end_rate: float | None = None,
) -> list[float]:
    """The target rate (requests/s) in force for each request."""
    if ramp_up is None:
        if not rate > 0:
            raise ConfigError(f"--request-rate must be positive or inf, got {rate}")
        return [rate] * num_requests
    if ramp_up not in RAMP_UP_KINDS:
        raise ConfigError(f"--ramp-up {ramp_up!r}: use linear or exponential")
    if start_rate is None or end_rate is None:
        raise ConfigError("--ramp-up needs --ramp-up-start-rate and --ramp-up-end-rate")
    if not (math.isfinite(start_rate) and math.isfinite(end_rate)):
        raise ConfigError("--ramp-up start and end rates must be finite")
    if start_rate <= 0 or end_rate <= 0:
        # Zero would mean an infinite gap; exponential interpolation needs positive ends anyway.
        raise ConfigError("--ramp-up-start-rate and --ramp-up-end-rate must be positive")
    if num_requests == 1:
        return [start_rate]
    steps = num_requests - 1
    if ramp_up == "linear":
        return [start_rate + (end_rate - start_rate) * i / steps for i in range(num_requests)]
    return [start_rate * (end_rate / start_rate) ** (i / steps) for i in range(num_requests)]


def arrival_offsets(
    num_requests: int,
    rate: float,
    burstiness: float = 1.0,
    seed: int = 0,
    ramp_up: str | None = None,
    start_rate: float | None = None,
    end_rate: float | None = None,
) -> list[float]:
    """Send time of each request (seconds after start); the first request goes at 0."""
    import numpy as np

    if not burstiness > 0:
        raise ConfigError(f"--burstiness must be positive, got {burstiness}")
    if num_requests <= 0:
        return []
    if ramp_up is None and math.isinf(rate):
        return [0.0] * num_requests
    rates = np.asarray(request_rates(num_requests, rate, ramp_up, start_rate, end_rate))
    rng = np.random.default_rng(seed)
    # gamma(shape=k, scale=1/(rate*k)) has mean 1/rate; one draw per gap after the first request.
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rates[1:] * burstiness))
    return [0.0] + np.cumsum(gaps).tolist()
