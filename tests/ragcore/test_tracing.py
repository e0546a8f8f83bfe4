"""When the `OTEL_*` variables turn tracing on, and that tracing off imports no opentelemetry."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ragcore.errors import ConfigError
from ragcore.tracing import Tracing, parse_traceparent, tracing_configured

pytestmark = pytest.mark.unit

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE}-00f067aa0ba902b7-01", TRACE),
        (f"00-{TRACE}-00f067aa0ba902b7-00", TRACE),  # not sampled: still the caller's trace
        (f" 00-{TRACE}-00f067aa0ba902b7-01 ", TRACE),
        (f"01-{TRACE}-00f067aa0ba902b7-01-future", TRACE),  # later versions may append
        (f"00-{TRACE}-00f067aa0ba902b7-01-extra", None),  # version 00 may not
        (f"ff-{TRACE}-00f067aa0ba902b7-01", None),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),
        ("garbage", None),
        ("", None),
        (None, None),
    ],
)
def test_traceparent_gives_the_trace_id_only_when_valid(
    header: str | None, expected: str | None
) -> None:
    assert parse_traceparent(header) == expected


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_tracing_is_on_only_when_the_otel_variables_say_so(env: dict[str, str], on: bool) -> None:
    assert tracing_configured(env) is on


def test_an_unknown_exporter_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="jaeger"):
        tracing_configured({"OTEL_TRACES_EXPORTER": "jaeger"})
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        Tracing.from_env(
            "svc", {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier"}
        )


def test_configured_tracing_names_the_service_and_records_spans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No collector listens here: the flush at shutdown would retry the refused export with
    # backoff (1 + 2 + 4 s) up to the SDK's 10 s default; what is checked is the span.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0.5")
    tracing = Tracing.from_env("ragstream-test", {"OTEL_TRACES_EXPORTER": "otlp"})
    try:
        assert tracing.enabled
        with tracing.span("outer") as span:
            assert span is not None
            assert len(tracing.current_trace_id()) == 32
            assert span.resource.attributes["service.name"] == "ragstream-test"  # type: ignore[attr-defined]
        assert tracing.current_trace_id() == ""
    finally:
        tracing.shutdown()


def test_tracing_off_imports_no_opentelemetry_on_the_hot_paths() -> None:
    """Both services wired and a stage span opened with tracing off: no opentelemetry module
    is loaded (a fresh interpreter, so other tests' imports do not count)."""
    code = (
        "import sys\n"
        "import retrieval_api.app, retrieval_api.grpc_server, streams.app, streams.consumer\n"
        "from ragcore.tracing import Tracing\n"
        "t = Tracing.from_env('x')\n"
        "assert not t.enabled\n"
        "with t.span('retrieve.embed') as s:\n"
        "    assert s is None\n"
        "with t.server_span('m', [('traceparent', '00-" + TRACE + "-00f067aa0ba902b7-01')]):\n"
        "    assert t.current_trace_id() == '" + TRACE + "'\n"
        "assert t.current_trace_id() == ''\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no OTEL_* of the developer's shell
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
