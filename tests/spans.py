"""OpenTelemetry's SDK for the tracing tests: the spans this process makes,
kept in memory, and those a spawned worker makes, written to a file the
test reads back (a worker sets up its own provider: see the README's
"Tracing")."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_lock = threading.Lock()
_memory: Optional[InMemorySpanExporter] = None


def in_memory() -> InMemorySpanExporter:
    """The exporter of this process's global provider, emptied: set up on
    first use (a global provider is set once per process)."""
    global _memory
    with _lock:
        if _memory is None:
            _memory = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(_memory))
            trace.set_tracer_provider(provider)
        _memory.clear()
        return _memory


class Span:
    """A finished span as the tests look at it, in this process or read back from a worker's file."""

    def __init__(self, record: Dict[str, Any]) -> None:
        self.name: str = record["name"]
        self.trace_id: int = record["trace_id"]
        self.span_id: int = record["span_id"]
        self.parent: Optional[int] = record["parent"]
        self.links: List[int] = record["links"]
        self.attributes: Dict[str, Any] = record["attributes"]
        self.start: int = record["start"]
        self.end: int = record["end"]
        self.flags: int = record.get("flags", 1)
        self.status: str = record.get("status", "UNSET")
        self.events: List[Any] = record.get("events", [])

    def __repr__(self) -> str:
        return f"Span({self.name!r}, parent={self.parent}, links={self.links})"


def record_of(span: ReadableSpan) -> Dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": context.trace_id,
        "span_id": context.span_id,
        "parent": span.parent.span_id if span.parent is not None else None,
        "links": [link.context.span_id for link in span.links],
        "attributes": dict(span.attributes or {}),
        "start": span.start_time,
        "end": span.end_time,
        "flags": int(context.trace_flags),
        "status": span.status.status_code.name,
        "events": [[event.name, dict(event.attributes or {})] for event in span.events],
    }


def finished(exporter: InMemorySpanExporter) -> List[Span]:
    return [Span(record_of(span)) for span in exporter.get_finished_spans()]


class FileExporter(SpanExporter):
    """Appends each span, as a line of JSON, to a file: how a worker
    process in a test hands its spans back."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as f:
            for span in spans:
                f.write(json.dumps(record_of(span)) + "\n")
        return SpanExportResult.SUCCESS


def export_to_file(path: str) -> None:
    """Set this process's provider to write its spans to ``path`` (a worker's model calls it as it loads)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    trace.set_tracer_provider(provider)


def read_file(path: Path) -> List[Span]:
    if not path.exists():
        return []
    return [Span(json.loads(line)) for line in path.read_text().splitlines() if line]


def shape(spans: Sequence[Span]) -> List[Any]:
    """What a set of spans says, ids and times aside: each span's name, its
    parent's and its links' names, its attributes (a duration's name only),
    flags, status and events (a stack trace's presence only), sorted."""
    names = {span.span_id: span.name for span in spans}
    shown = []
    for span in spans:
        attributes = sorted((k, "<seconds>" if k.endswith("seconds") else v) for k, v in span.attributes.items())
        events = [
            (name, sorted((k, "<stack>" if k == "exception.stacktrace" else v) for k, v in attributes_of.items()))
            for name, attributes_of in span.events
        ]
        shown.append(
            (span.name, names.get(span.parent) if span.parent is not None else None,
             sorted(names.get(link, "<elsewhere>") for link in span.links), attributes, span.flags, span.status,
             events)
        )  # fmt: skip
    return sorted(shown, key=repr)


def named(spans: Sequence[Span], name: str) -> List[Span]:
    return [span for span in spans if span.name == name]
