"""Where spans go: the OpenTelemetry exporter's standard variables turned into one URL and its headers.

As the OpenTelemetry specification says (``protocol/exporter.md``):

- ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is the full URL of the traces endpoint, used as it is;
- otherwise ``OTEL_EXPORTER_OTLP_ENDPOINT`` is a base URL, and spans go to ``<base>/v1/traces``;
- ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` (else ``OTEL_EXPORTER_OTLP_HEADERS``) are ``key=value`` pairs
  separated by commas, values URL-encoded;
- the protocol (``..._TRACES_PROTOCOL``, else ``..._PROTOCOL``) must be ``http/protobuf``, the one Corral
  exports with; any other value is an error naming the variable, not a silent fallback.

With neither endpoint set nothing is exported (``target`` is None).

``OTEL_BSP_SCHEDULE_DELAY`` is the specification's delay between two consecutive exports (ms, default
5000). The SDK's batch span processor reads it in every service; ``export_delay`` gives it to the tracer,
which paces its own exports by it (a POST costs about 1 ms of CPU however few spans it carries).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from corral.libs.config.settings import Settings
from corral.libs.config.values import ConfigError

#: The path the OTLP/HTTP traces endpoint has under a base URL.
TRACES_PATH = "/v1/traces"
#: The one protocol Corral's exporter speaks.
PROTOCOL = "http/protobuf"
#: The specification's default delay between two exports (``OTEL_BSP_SCHEDULE_DELAY``), in seconds.
EXPORT_DELAY_S = 5.0


@dataclass(frozen=True)
class OtlpTarget:
    """Where and how spans are exported."""

    url: str  # the full URL spans are POSTed to
    headers: dict[str, str]  # extra HTTP headers (e.g. an API key of the backend)


def traces_url(base: str | None, traces: str | None) -> str | None:
    """The URL spans are POSTed to: ``traces`` as given, else ``base`` + ``/v1/traces``; None without both."""
    if traces:
        return traces
    if not base:
        return None
    return base.rstrip("/") + TRACES_PATH


def parse_headers(text: str | None) -> dict[str, str]:
    """``k=v,k2=v2`` (URL-encoded) as a dict; ConfigError naming the bad pair."""
    headers: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"OTEL_EXPORTER_OTLP_HEADERS: {item.strip()!r} is not key=value "
                "(give comma-separated pairs, e.g. 'api-key=secret,tenant=a')"
            )
        headers[unquote(key.strip())] = unquote(value.strip())
    return headers


def target(settings: Settings) -> OtlpTarget | None:
    """The export target the settings name, or None when no endpoint is set; ConfigError if one is bad."""
    url = traces_url(settings.otlp_endpoint, settings.otlp_traces_endpoint)
    if url is None:
        return None
    if settings.otlp_protocol not in (None, PROTOCOL):
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: {settings.otlp_protocol!r} is not supported; "
            f"Corral exports spans with {PROTOCOL!r} (unset it or set it to that)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT: {url!r} is not an http(s) URL (e.g. http://collector:4318)"
        )
    return OtlpTarget(url=url, headers=parse_headers(settings.otlp_headers))


def export_delay(settings: Settings) -> float:
    """Seconds between two exports: ``OTEL_BSP_SCHEDULE_DELAY`` (ms) or the default; ConfigError if bad."""
    text = settings.otel_export_delay
    if text is None:
        return EXPORT_DELAY_S
    try:
        millis = int(text)
    except ValueError:
        millis = -1
    if millis <= 0:
        raise ConfigError(
            f"OTEL_BSP_SCHEDULE_DELAY: {text!r} is not a positive whole number of milliseconds (e.g. 5000)"
        )
    return millis / 1000
