"""The dashboard's charts: dispatch rate, failed attempts and alarm lateness per namespace,
over the window the operator picks."""

from __future__ import annotations

from test_dashboard import fetch

import nursery_jobs as nj
from nursery_jobs._core._metrics import Metrics
from nursery_jobs._ops._web_charts import DEFAULT_WINDOW, Recorder, charts, window_of

LOOPBACK = ("127.0.0.1", 0)


def test_rates_failures_and_lateness_per_namespace_over_a_window() -> None:
    metrics = Metrics()
    recorder = Recorder(metrics, interval=5.0)
    recorder.sample(1000.0)
    for _ in range(10):
        metrics.job_ran("shop.Cart", "host", 0.01, True)
    metrics.job_ran("shop.Mail", "queue", 0.01, False)
    metrics.job_ran("shop.Mail", "queue", 0.01, False)
    for _ in range(20):
        metrics.alarm_delivered("shop.Cart", 0.004)
    recorder.sample(1005.0)
    metrics.job_ran("shop.Cart", "host", 0.01, True)
    recorder.sample(1010.0)

    data = recorder.chart_data(60.0)
    assert data.rates == {"shop.Cart": [(1005.0, 2.0), (1010.0, 0.2)],
                          "shop.Mail": [(1005.0, 0.4), (1010.0, 0.0)]}
    assert data.failures["shop.Mail"] == [(1005.0, 0.4), (1010.0, 0.0)]
    assert data.failures["shop.Cart"] == [(1005.0, 0.0), (1010.0, 0.0)]
    (first, p95), (_, none) = data.lateness["shop.Cart"]
    assert first == 1005.0 and p95 is not None and 0.0025 < p95 <= 0.005 and none is None
    # A window holds only its samples; a namespace can be picked alone.
    assert recorder.chart_data(5.0).rates == {"shop.Cart": [(1010.0, 0.2)],
                                              "shop.Mail": [(1010.0, 0.0)]}
    assert list(recorder.chart_data(60.0, "shop.Mail").rates) == ["shop.Mail"]

    html = charts(data, 1010.0, {"ns": "shop.Cart"})
    assert html.count("<svg") == 3 and "Failed attempts" in html
    assert "<title>shop.Cart</title>" in html and "<title>shop.Mail</title>" in html
    assert '<a href="/?ns=shop.Cart&amp;window=300">5 min</a>' in html
    assert "<b>1 min</b>" in html


def test_the_window_is_one_of_the_choices() -> None:
    assert window_of({"window": "300"}) == 300.0
    assert window_of({"window": "7"}) == DEFAULT_WINDOW
    assert window_of({"window": "nan"}) == DEFAULT_WINDOW
    assert window_of({}) == DEFAULT_WINDOW


async def test_the_home_page_draws_the_chosen_window() -> None:
    async with nj.open_runtime(None, http=LOOPBACK) as rt:
        status, _, page = await fetch(rt.http_url or "", "/?window=3600")
        assert status == 200
        assert "<b>1 h</b>" in page and "Failed attempts" in page
