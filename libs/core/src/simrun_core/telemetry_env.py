"""What the OpenTelemetry variables ask of a process, read without importing OpenTelemetry.

`simrun_core.telemetry` makes the process's tracer provider from these answers. A short-lived client (the CLI's
`simrun status`) asks `may_record` first: when it says no, the telemetry would only pass trace context through
(nothing installed a provider, no exporter is configured), so the client leaves OpenTelemetry unimported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

EXPORTER_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER")
"""The variables that configure an exporter: an OTLP endpoint, or `OTEL_TRACES_EXPORTER`'s list of names."""

PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"
"""The variable that names a global provider the OpenTelemetry API loads (an entry point) on first use."""


def disabled(env: Mapping[str, str]) -> bool:
    """`OTEL_SDK_DISABLED=true`: no instrumentation at all."""
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def configured_exporters(env: Mapping[str, str]) -> list[str]:
    """The exporter names asked for: `OTEL_TRACES_EXPORTER`'s list, or `otlp` when only an endpoint is given."""
    named = [name.strip() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    if named:
        return [] if named == ["none"] else [name for name in named if name != "none"]
    if any(env.get(variable, "").strip() for variable in EXPORTER_VARIABLES[:2]):
        return ["otlp"]
    return []


def may_record(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process's telemetry could record spans (or fail on a bad exporter name), so that a client must
    make it: an exporter is configured, `OTEL_PYTHON_TRACER_PROVIDER` names a provider, or the OpenTelemetry API is
    loaded already (the host program may have installed a global provider, which needs the API). Otherwise the
    telemetry would be pass-through, whose client channels carry no interceptor, and nothing needs OpenTelemetry.
    """
    env = os.environ if env is None else env
    if disabled(env):
        return False
    if configured_exporters(env) or env.get(PROVIDER_VARIABLE, "").strip():
        return True
    return "opentelemetry.trace" in sys.modules
