"""An output port's table read for plotting, and the Vega-Lite spec of the plot its columns call for.

A table is CSV (a header row), JSON lines (one object per line), a JSON array of objects, or Parquet (read with
pyarrow). The plot follows the columns chosen: one column alone is a histogram; x and y that form a grid (each pair
once, most of the grid there) are a heatmap coloured by a third column; an ordered numeric x gives lines (one per
colour); anything else points. First opened, a table is plotted as its scanned grid where it has one.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from typing import Any

from simrun_core.errors import InvalidArgument

MAX_TABLE_BYTES = 32 * 1024 * 1024
"""The largest table the web view reads into memory to plot; a bigger one is downloaded instead."""
MAX_ROWS = 200_000
TABLE_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".json", ".parquet")


@dataclass
class Table:
    """Rows of one output file, each a dict of column to a number, a string or None."""

    columns: list[str]
    rows: list[dict[str, Any]]

    def numeric(self, column: str) -> bool:
        """Whether every value present in `column` is a number."""
        present = [row.get(column) for row in self.rows if row.get(column) is not None]
        return bool(present) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=self.columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return out.getvalue()


def is_table(path: str) -> bool:
    """Whether a file of a port is one the web view plots, by its name."""
    return path.lower().endswith(TABLE_SUFFIXES)


def _number(text: str) -> Any:
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value):
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def parse_table(path: str, data: bytes) -> Table:
    """The table in a file of an output port.

    Raises:
        InvalidArgument: it is too big, not UTF-8, or not a table of the kinds named above.
    """
    if len(data) > MAX_TABLE_BYTES:
        raise InvalidArgument(f"{path} is {len(data) >> 20} MiB: the web view plots tables of at most 32 MiB")
    if path.lower().endswith(".parquet"):
        return _parquet(path, data)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{path} is not UTF-8 text: the web view plots CSV and JSON tables") from None
    lower = path.lower()
    if lower.endswith(".csv"):
        reader = csv.DictReader(io.StringIO(text))
        columns = list(reader.fieldnames or [])
        rows = [
            {k: _number(v or "") for k, v in row.items() if k is not None}
            for _, row in zip(range(MAX_ROWS), reader, strict=False)
        ]
        return Table(columns, rows)
    try:
        if lower.endswith(".json"):
            loaded = json.loads(text)
            records = loaded if isinstance(loaded, list) else None
        else:
            records = [json.loads(line) for line in text.splitlines()[:MAX_ROWS] if line.strip()]
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{path} is not JSON ({exc.msg}, line {exc.lineno})") from None
    if records is None or not all(isinstance(r, dict) for r in records):
        raise InvalidArgument(f"{path} is not a table: the web view plots a list of JSON objects, one per row")
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
    return Table(list(names), [{k: _cell(v) for k, v in record.items()} for record in records[:MAX_ROWS]])


def _parquet(path: str, data: bytes) -> Table:
    """A Parquet file's first `MAX_ROWS` rows; a column of dates, lists or structs becomes text, as in JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(pa.BufferReader(data))
        batches = file.iter_batches(batch_size=min(MAX_ROWS, 65_536))
        rows: list[dict[str, Any]] = []
        for batch in batches:
            rows += batch.to_pylist()[: MAX_ROWS - len(rows)]
            if len(rows) >= MAX_ROWS:
                break
        columns = list(file.schema_arrow.names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidArgument(f"{path} is not a Parquet table: {reason}") from None
    return Table(columns, [{k: _parquet_cell(v) for k, v in row.items()} for row in rows])


def _parquet_cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, int | float | str) or value is None:
        return value
    return str(value) if not isinstance(value, list | dict) else json.dumps(value, default=str)


def _cell(value: Any) -> Any:
    """A JSON value as a table's cell: a number, a string or None; lists and objects as their JSON text."""
    return value if isinstance(value, int | float | str) or value is None else json.dumps(value)


def _grid(table: Table, x: str, y: str) -> bool:
    pairs = [(row.get(x), row.get(y)) for row in table.rows]
    distinct = set(pairs)
    if len(distinct) != len(pairs) or not pairs:
        return False
    xs, ys = {p[0] for p in distinct}, {p[1] for p in distinct}
    return len(xs) > 1 and len(ys) > 1 and len(xs) * len(ys) <= 2 * len(distinct)


def first_axes(table: Table) -> tuple[str, str, str]:
    """The x, y and colour a table is first plotted with: the first two columns that form a grid, as the
    parameters of a scan do (a heatmap, shaded as `_shade` chooses); else the first two numeric columns; else the
    first two columns (one column alone: its histogram)."""
    rows = len(table.rows)
    distinct = {c: len({row.get(c) for row in table.rows}) for c in table.columns}
    for i, x in enumerate(table.columns):
        for y in table.columns[i + 1 :]:
            # A column unique to each row is an index, not a scanned setting; and a grid's counts (each pair
            # once, most of the grid there) are checked before its pairs are read.
            axes = 1 < distinct[x] < rows and 1 < distinct[y] < rows
            if axes and rows <= distinct[x] * distinct[y] <= 2 * rows and _grid(table, x, y):
                return x, y, _shade(table, x, y) or ""
    numeric = [c for c in table.columns if table.numeric(c)]
    chosen = numeric[:2] if len(numeric) > 1 else table.columns[:2]
    return (chosen[0] if chosen else ""), (chosen[1] if len(chosen) > 1 else ""), ""


def _shade(table: Table, x: str, y: str) -> str | None:
    """The column a heatmap of x and y is coloured by, unless one is chosen: the first numeric column after both
    (what was measured at each setting comes after the settings), else any other numeric column."""
    after = table.columns[max(table.columns.index(x), table.columns.index(y)) + 1 :]
    others = [c for c in (*after, *table.columns) if c not in (x, y)]
    return next((c for c in others if table.numeric(c)), None)


def plot_kind(table: Table, x: str, y: str | None) -> str:
    """`histogram`, `heatmap`, `line` or `point`: the plot the chosen columns call for."""
    if not y:
        return "histogram"
    if _grid(table, x, y):
        return "heatmap"
    if table.numeric(x) and table.numeric(y):
        xs = [row.get(x) for row in table.rows]
        return "line" if len(set(xs)) < len(xs) or xs == sorted(xs, key=lambda v: (v is None, v)) else "point"
    return "point"


def field_name(column: str) -> str:
    """A column's name as Vega-Lite reads a field: its dots and brackets escaped (else they reach into objects)."""
    return column.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[").replace("]", "\\]")


def _field(table: Table, column: str, *, ordinal: bool = False) -> dict[str, Any]:
    kind = "ordinal" if ordinal else ("quantitative" if table.numeric(column) else "nominal")
    return {"field": field_name(column), "type": kind, "title": column}


def plot_spec(table: Table, x: str, y: str | None = None, color: str | None = None) -> dict[str, Any]:
    """The Vega-Lite spec that plots `table`'s columns: its data inline, one mark per row but for a histogram.

    Raises:
        InvalidArgument: a column the table does not have.
    """
    for column in (x, y, color):
        if column and column not in table.columns:
            raise InvalidArgument(f"the table has no column {column!r}; its columns: {', '.join(table.columns)}")
    kind = plot_kind(table, x, y)
    spec: dict[str, Any] = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": 640,
        "height": 400,
        "data": {"values": table.rows},
        "usermeta": {"kind": kind, "rows": len(table.rows)},
    }
    if kind == "histogram":
        binned = table.numeric(x)
        spec["mark"] = {"type": "bar", "tooltip": True}
        spec["encoding"] = {
            "x": {**_field(table, x), **({"bin": {"maxbins": 40}} if binned else {})},
            "y": {"aggregate": "count", "title": "rows"},
        }
        return spec
    if kind == "heatmap":
        assert y is not None
        shade = color or _shade(table, x, y)
        spec["mark"] = {"type": "rect", "tooltip": True}
        spec["encoding"] = {
            "x": _field(table, x, ordinal=True),
            "y": {**_field(table, y, ordinal=True), "sort": "descending"},
            **({"color": {**_field(table, shade), "scale": {"scheme": "viridis"}}} if shade is not None else {}),
        }
        return spec
    assert y is not None
    encoding: dict[str, Any] = {"x": _field(table, x), "y": _field(table, y)}
    if color:
        encoding["color"] = _field(table, color)
    spec["mark"] = {"type": kind, "tooltip": True, **({"point": True} if kind == "line" else {})}
    spec["encoding"] = encoding
    return spec


def scatter_spec(rows: list[dict[str, Any]], x: str, y: str) -> dict[str, Any]:
    """Points of a summary (`y`) against a setting (`x`), one per run, its id in the tooltip."""
    table = Table(["run", x, y], rows)
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": 560,
        "height": 320,
        "data": {"values": rows},
        "mark": {"type": "point", "filled": True, "size": 80, "tooltip": True},
        "encoding": {
            "x": _field(table, x),
            "y": _field(table, y),
            "tooltip": [{"field": "run"}, {"field": field_name(x), "title": x}, {"field": field_name(y), "title": y}],
        },
        "usermeta": {"kind": "scatter", "rows": len(rows)},
    }


def parallel_spec(rows: list[dict[str, Any]], columns: list[str]) -> dict[str, Any]:
    """Parallel coordinates of runs over several numeric columns (settings and summaries), a line per run, each
    axis scaled to its own range."""
    axes = {column: column.replace(".", "/") for column in columns}  # fold reads a dot as a path
    values = [{"run": row["run"], **{axes[c]: row[c] for c in columns if row.get(c) is not None}} for row in rows]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": 640,
        "height": 320,
        "data": {"values": values},
        "transform": [
            {"fold": list(axes.values())},
            {
                "joinaggregate": [
                    {"op": "min", "field": "value", "as": "low"},
                    {"op": "max", "field": "value", "as": "high"},
                ],
                "groupby": ["key"],
            },
            {
                "calculate": "datum.high == datum.low ? 0.5 : (datum.value - datum.low) / (datum.high - datum.low)",
                "as": "scaled",
            },
        ],
        "layer": [
            {"mark": {"type": "rule", "color": "#bbb"}, "encoding": {"x": {"field": "key", "type": "nominal"}}},
            {
                "mark": {"type": "line", "point": True, "tooltip": True},
                "encoding": {
                    "x": {"field": "key", "type": "nominal", "title": None, "sort": list(axes.values())},
                    "y": {"field": "scaled", "type": "quantitative", "axis": None},
                    "color": {"field": "run", "type": "nominal"},
                    "detail": {"field": "run"},
                    "tooltip": [{"field": "run"}, {"field": "key"}, {"field": "value"}],
                },
            },
        ],
        "usermeta": {"kind": "parallel", "rows": len(values)},
    }
