"""A run's tasks laid out as their graph: columns by depth, an edge per task read."""

from __future__ import annotations

from simrun_web.dag import MAX_NAME, layout


def test_a_chain_and_a_branch_stand_in_columns_by_their_depth() -> None:
    graph = layout(
        [
            ("scan", "running", {}),
            ("data", "succeeded", {}),
            ("fit", "queued", {"values": "scan.values", "table": "data.table"}),
            ("report", "queued", {"fits": "fit.fits", "raw": "scan.values"}),
        ]
    )
    x = {box.task_id: box.x for box in graph.boxes}
    assert x["scan"] == x["data"] < x["fit"] < x["report"]
    assert sorted((e.source, e.target) for e in graph.edges) == [
        ("data", "fit"),
        ("fit", "report"),
        ("scan", "fit"),
        ("scan", "report"),
    ]
    right = max(box.x + box.width for box in graph.boxes)
    assert graph.width >= right and graph.height >= max(box.y + box.height for box in graph.boxes)


def test_an_input_of_no_task_draws_no_edge_and_a_long_name_is_cut() -> None:
    long = "t" * (MAX_NAME + 10)
    graph = layout([(long, "succeeded", {"data": "snapshot-data.files"}), ("b", "pending", {"x": f"{long}.out"})])
    assert [(e.source, e.target) for e in graph.edges] == [(long, "b")]
    (first, _) = graph.boxes
    assert first.task_id == long and first.label.endswith("…") and len(first.label) == MAX_NAME


def test_no_tasks_is_an_empty_graph() -> None:
    graph = layout([])
    assert (graph.boxes, graph.edges, graph.width) == ([], [], 0.0)


def test_a_chain_of_thousands_of_tasks_is_laid_out_without_recursion() -> None:
    chain = [("t0", "succeeded", {})] + [(f"t{i}", "queued", {"in": f"t{i - 1}.out"}) for i in range(1, 5000)]
    graph = layout(chain)
    assert len(graph.edges) == 4999 and graph.boxes[-1].x > graph.boxes[-2].x
