import math

import numpy as np
import pytest

from fdcli.bench.traffic import arrival_offsets, request_rates
from fdcli_engine.errors import ConfigError


def _gaps(offsets):
    return np.diff(np.asarray(offsets))


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(5, math.inf) == [0.0] * 5


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(burstiness):
    rate = 20.0
    gaps = _gaps(arrival_offsets(20001, rate, burstiness, seed=3))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_poisson_gaps_pass_a_kolmogorov_smirnov_check_against_the_exponential():
    rate = 5.0
    gaps = np.sort(_gaps(arrival_offsets(5001, rate, 1.0, seed=11)))
    empirical = np.arange(1, len(gaps) + 1) / len(gaps)
    d = np.max(np.abs(empirical - (1 - np.exp(-rate * gaps))))
    assert d < 1.36 / math.sqrt(len(gaps))  # 5 % critical value


def test_same_seed_same_schedule_other_seed_differs():
    a = arrival_offsets(50, 3.0, 1.0, seed=1)
    assert a == arrival_offsets(50, 3.0, 1.0, seed=1)
    assert a != arrival_offsets(50, 3.0, 1.0, seed=2)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))


def test_linear_and_exponential_ramp_rates():
    assert request_rates(5, 1.0, "linear", 1.0, 9.0) == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert request_rates(3, 1.0, "exponential", 1.0, 16.0) == pytest.approx([1.0, 4.0, 16.0])


def test_ramp_up_is_applied_to_the_gaps():
    # Rates 1 → 100 linearly: the early gaps are much longer than the late ones.
    gaps = _gaps(arrival_offsets(4001, math.inf, 1.0, seed=5, ramp_up="linear", start_rate=1, end_rate=100))
    rates = np.asarray(request_rates(4001, math.inf, "linear", 1, 100))[1:]
    # Scaled by their rate, the gaps are unit-mean exponentials again.
    assert (gaps * rates).mean() == pytest.approx(1.0, rel=0.05)
    assert gaps[:200].mean() > 10 * gaps[-200:].mean()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate": 0.0},
        {"rate": 1.0, "burstiness": 0.0},
        {"rate": 1.0, "ramp_up": "linear"},
        {"rate": 1.0, "ramp_up": "sideways", "start_rate": 1, "end_rate": 2},
        {"rate": 1.0, "ramp_up": "exponential", "start_rate": 0, "end_rate": 2},
    ],
)
def test_bad_traffic_options_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        arrival_offsets(10, **kwargs)
