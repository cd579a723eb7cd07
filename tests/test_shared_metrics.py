"""Prometheus metrics for a data directory of the shared layout (``shared:<dir>``): DESIGN
§10 says every operator face works on every engine, a data directory alike."""

from __future__ import annotations

from typing import Any

import nursery_jobs as nj


async def test_metrics_are_served_for_a_shared_layout_directory(tmp_path: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families
    from test_dashboard import fetch

    async with nj.open_runtime(f"shared:{tmp_path / 'data'}", http=("127.0.0.1", 0),
                               stop_on=()) as rt:
        assert rt.http_url is not None
        status, _, text = await fetch(rt.http_url, "/metrics")
        assert status == 200
        names = {f.name for f in text_string_to_metric_families(text)}
        assert "nursery_jobs_dead_letters" in names


