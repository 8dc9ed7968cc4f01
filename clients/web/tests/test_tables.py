"""Output tables read for plotting, and the plot their columns call for."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from simrun_core.errors import InvalidArgument
from simrun_web.tables import Table, first_axes, parse_table, plot_kind, plot_spec


def test_a_csv_grid_is_a_heatmap_with_a_mark_per_row() -> None:
    rows = "\n".join(f"{x},{y},{x * y}" for x in range(5) for y in range(4))
    table = parse_table("scan/grid.csv", f"x,y,auc\n{rows}\n".encode())
    assert table.columns == ["x", "y", "auc"] and len(table.rows) == 20
    assert table.rows[0] == {"x": 0, "y": 0, "auc": 0}
    spec = plot_spec(table, "x", "y")
    assert spec["mark"]["type"] == "rect" and spec["encoding"]["color"]["field"] == "auc"
    assert len(spec["data"]["values"]) == 20


def test_an_ordered_axis_is_lines_one_column_a_histogram_and_the_rest_points() -> None:
    table = Table(["t", "v", "who"], [{"t": i, "v": i * i, "who": "a" if i % 2 else "b"} for i in range(10)])
    assert plot_kind(table, "t", "v") == "line"
    assert plot_kind(table, "v", None) == "histogram"
    shuffled = Table(["a", "b"], [{"a": v, "b": v % 3} for v in (5, 1, 9, 3)])
    assert plot_kind(shuffled, "a", "b") == "point"
    histogram = plot_spec(table, "v")
    assert histogram["encoding"]["y"]["aggregate"] == "count" and histogram["encoding"]["x"]["bin"]


def test_a_table_is_first_plotted_as_its_scanned_grid_else_its_numbers() -> None:
    # A scan's table as models write them: an index and a label first, its two settings, then what it measured.
    scan = [
        {"unit": i, "label": f"p{i}", "rate": r, "dose": d, "auc": r * d, "s": 0.1}
        for i, (r, d) in enumerate((r, d) for r in (0.1, 0.2, 0.5) for d in (1, 2, 4, 8))
    ]
    table = Table(["unit", "label", "rate", "dose", "auc", "s"], scan)
    assert first_axes(table) == ("rate", "dose", "auc") and plot_kind(table, "rate", "dose") == "heatmap"
    curve = Table(["name", "t", "v"], [{"name": "a", "t": t, "v": t * t} for t in range(6)])
    assert first_axes(curve) == ("t", "v", "")
    words = Table(["w", "n"], [{"w": "x", "n": "y"}])
    assert first_axes(words) == ("w", "n", "")
    assert first_axes(Table(["v"], [{"v": 1}, {"v": 2}])) == ("v", "", "")
    assert first_axes(Table([], [])) == ("", "", "")


def test_json_lines_and_a_json_array_are_tables_and_nested_values_become_text() -> None:
    lines = b'{"a": 1, "b": "x"}\n{"a": 2, "c": [1, 2]}\n'
    table = parse_table("t.jsonl", lines)
    assert table.columns == ["a", "b", "c"] and table.rows[1]["c"] == "[1, 2]"
    assert parse_table("t.json", json.dumps([{"a": 1}]).encode()).rows == [{"a": 1}]


@pytest.mark.parametrize(
    ("path", "data", "says"),
    [
        ("t.json", b'{"a": 1}', "not a table"),
        ("t.jsonl", b"{oops\n", "not JSON"),
        ("t.csv", b"\xff\xfe\x00", "not UTF-8"),
    ],
)
def test_what_is_not_a_table_is_refused_in_a_line(path: str, data: bytes, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        parse_table(path, data)


def test_a_column_the_table_lacks_is_refused_with_its_columns() -> None:
    with pytest.raises(InvalidArgument, match="no column 'z'; its columns: x, y"):
        plot_spec(Table(["x", "y"], [{"x": 1, "y": 2}]), "x", "z")


def test_a_column_with_dots_or_brackets_is_escaped_for_vega_lite() -> None:
    spec = plot_spec(Table(["a.b", "c[0]"], [{"a.b": 1, "c[0]": 2}, {"a.b": 2, "c[0]": 3}]), "a.b", "c[0]")
    assert spec["encoding"]["x"]["field"] == "a\\.b" and spec["encoding"]["y"]["field"] == "c\\[0\\]"
    assert spec["encoding"]["x"]["title"] == "a.b"


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=49, unique=True))
def test_a_heatmap_is_chosen_only_where_each_pair_is_once(pairs: list[tuple[int, int]]) -> None:
    table = Table(["x", "y", "v"], [{"x": x, "y": y, "v": x + y} for x, y in pairs])
    kind = plot_kind(table, "x", "y")
    xs, ys = {x for x, _ in pairs}, {y for _, y in pairs}
    assert (kind == "heatmap") == (len(xs) > 1 and len(ys) > 1 and len(xs) * len(ys) <= 2 * len(pairs))
    doubled = Table(["x", "y", "v"], table.rows + table.rows)
    assert plot_kind(doubled, "x", "y") != "heatmap"


def test_parallel_coordinates_fold_every_column_and_keep_a_line_per_run() -> None:
    from simrun_web.tables import parallel_spec

    rows = [{"run": "a", "fit.rate": 1.0, "fit.auc": 3.0}, {"run": "b", "fit.rate": 2.0, "fit.auc": None}]
    spec = parallel_spec(rows, ["fit.rate", "fit.auc"])
    assert spec["transform"][0] == {"fold": ["fit/rate", "fit/auc"]}
    assert spec["data"]["values"] == [{"run": "a", "fit/rate": 1.0, "fit/auc": 3.0}, {"run": "b", "fit/rate": 2.0}]


def test_a_parquet_table_is_read_with_its_types_and_plotted_like_the_others() -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "x": [x for x in range(5) for _ in range(4)],
            "y": [y * 0.5 for _ in range(5) for y in range(4)],
            "auc": [float("nan")] + [float(i) for i in range(19)],
            "label": ["<script>alert(1)</script>"] * 20,
            "tags": [[1, 2]] * 20,
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out)
    parsed = parse_table("scan/grid.parquet", out.getvalue())
    assert parsed.columns == ["x", "y", "auc", "label", "tags"] and len(parsed.rows) == 20
    assert parsed.rows[0] == {"x": 0, "y": 0.0, "auc": None, "label": "<script>alert(1)</script>", "tags": "[1, 2]"}
    assert parsed.numeric("x") and parsed.numeric("auc") and not parsed.numeric("label")
    spec = plot_spec(parsed, "x", "y")
    assert spec["mark"]["type"] == "rect" and len(spec["data"]["values"]) == 20


def test_a_file_named_parquet_that_is_not_is_refused_in_a_line() -> None:
    with pytest.raises(InvalidArgument, match=r"^t\.parquet is not a Parquet table: "):
        parse_table("t.parquet", b"x,y\n1,2\n")
