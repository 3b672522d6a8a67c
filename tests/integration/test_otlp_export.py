"""The real OTLP/HTTP exporter, configured from the standard variables, reaches a real receiver's
``/v1/traces`` (the spec's path under a base endpoint) and its spans decode with opentelemetry-proto."""

from __future__ import annotations

import dataclasses

import pytest
from otlp_receiver import TRACES_PATH, OtlpReceiver

from corral.libs.config import otlp as otlp_config
from corral.libs.config.settings import from_env
from corral.libs.config.values import ConfigError
from corral.libs.runtime import telemetry

pytestmark = pytest.mark.integration


def _export_one(target: otlp_config.OtlpTarget) -> None:
    provider = telemetry.provider("test", target)
    with provider.get_tracer("t").start_as_current_span("hello", attributes={"corral.job.id": 7}):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()


@pytest.mark.parametrize("trailing", ["", "/"], ids=["base", "base-slash"])
def test_a_base_endpoint_gets_the_traces_path(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, trailing: str
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url + trailing)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s%20cret,tenant=a")
    target = otlp_config.target(from_env())
    assert target is not None
    _export_one(target)
    assert [r.path for r in otlp.requests] == [TRACES_PATH]
    assert otlp.requests[0].headers["x-api-key"] == "s cret"
    assert otlp.requests[0].headers["content-type"] == "application/x-protobuf"
    [span] = otlp.spans()
    assert (span.service, span.name, span.attributes) == ("corral-test", "hello", {"corral.job.id": 7})


def test_a_traces_endpoint_is_used_as_it_is(otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # unused: the traces one wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.url + TRACES_PATH)
    target = otlp_config.target(from_env())
    assert target is not None
    _export_one(target)
    assert [r.path for r in otlp.requests] == [TRACES_PATH]
    assert [s.name for s in otlp.spans()] == ["hello"]


def test_bad_otlp_settings_name_the_variable() -> None:
    base = dataclasses.replace(from_env(), otlp_endpoint="http://c:4318", otlp_traces_endpoint=None)
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc'"):
        otlp_config.target(dataclasses.replace(base, otlp_protocol="grpc"))
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_HEADERS: 'novalue'"):
        otlp_config.target(dataclasses.replace(base, otlp_headers="novalue"))
    with pytest.raises(ConfigError, match="not an http"):
        otlp_config.target(dataclasses.replace(base, otlp_endpoint="collector:4318"))
    assert otlp_config.target(dataclasses.replace(base, otlp_endpoint=None)) is None


def test_the_export_delay_is_the_spec_variable_in_milliseconds() -> None:
    base = from_env()
    assert otlp_config.export_delay(dataclasses.replace(base, otel_export_delay=None)) == 5.0
    assert otlp_config.export_delay(dataclasses.replace(base, otel_export_delay="200")) == 0.2
    for bad in ("0", "-5", "1.5s"):
        with pytest.raises(ConfigError, match="OTEL_BSP_SCHEDULE_DELAY: "):
            otlp_config.export_delay(dataclasses.replace(base, otel_export_delay=bad))
