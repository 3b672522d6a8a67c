"""Where spans go: the OpenTelemetry exporter's standard variables turned into one URL and its headers.

As the OpenTelemetry specification says (``protocol/exporter.md``):

- ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is the full URL of the traces endpoint, used as it is;
- otherwise ``OTEL_EXPORTER_OTLP_ENDPOINT`` is a base URL, and spans go to ``<base>/v1/traces``;
- ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` (else ``OTEL_EXPORTER_OTLP_HEADERS``) are ``key=value`` pairs
  separated by commas, values URL-encoded;
- the protocol (``..._TRACES_PROTOCOL``, else ``..._PROTOCOL``) must be ``http/protobuf``, the one Corral
  exports with; any other value is an error naming the variable, not a silent fallback.

With neither endpoint set nothing is exported (``target`` is None).
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
