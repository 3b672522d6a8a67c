"""infra/otel/collector.yaml is a collector config whose traces pipeline is wired: OTLP/HTTP in on the port
the services export to, through defined processors, out to an OTLP backend (Jaeger or Tempo)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

CONFIG = Path(__file__).resolve().parents[2] / "infra" / "otel" / "collector.yaml"


def test_the_collector_config_wires_otlp_in_to_an_otlp_backend() -> None:
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces"}
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            assert pipeline.get(kind), kind
            assert set(pipeline[kind]) <= set(config[kind]), (kind, pipeline[kind])
    assert set(config["service"].get("extensions", [])) <= set(config.get("extensions", {}))
    http = config["receivers"]["otlp"]["protocols"]["http"]
    assert http["endpoint"].endswith(":4318")  # OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318
    backends = [name for name in pipelines["traces"]["exporters"] if name.split("/")[0] == "otlp"]
    [backend] = backends
    assert "4317" in config["exporters"][backend]["endpoint"]
