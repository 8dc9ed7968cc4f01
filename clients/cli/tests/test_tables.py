"""The CLI's tables drawn without rich: widths, rules, folding, wide characters, bars."""

from __future__ import annotations

import click
from hypothesis import given
from hypothesis import strategies as st
from simrun_cli.tables import BAR_WIDTH, Column, _fold, bar, cell_width, table

TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Mn", "Me", "Cf")), max_size=30)


def plain(lines: list[str]) -> list[str]:
    """The lines as a pipe shows them (click.echo takes the styles off)."""
    return [click.unstyle(line) for line in lines]


def test_columns_are_padded_to_their_widest_cell_and_right_justified_where_asked() -> None:
    lines = table([Column("task"), Column("units", right=True)], [["estimate", "16/16"], ["r", "-"]])
    assert plain(lines) == ["task      units", "estimate  16/16", "r             -"]
    assert lines[0] == f"{click.style('task', bold=True)}      {click.style('units', bold=True)}"


def test_a_folding_column_is_narrowed_to_the_width_and_its_cells_folded() -> None:
    columns = [Column("task"), Column("type", fold=True), Column("state")]
    lines = plain(table(columns, [["estimate", "montecarlo.tasks:EstimatePi", "succeeded"]], width=40))
    assert lines == [
        "task      type                 state",
        "estimate  montecarlo.tasks:Es  succeeded",
        "          timatePi",
    ]


def test_wide_characters_take_two_cells() -> None:
    assert cell_width("円周率") == 6 and cell_width("e\u0301") == 1
    lines = plain(table([Column("key"), Column("value")], [["円周率", "3.14"], ["pi", "3.14"]]))
    assert lines == ["key     value", "円周率  3.14", "pi      3.14"]


@given(text=TEXT, width=st.integers(min_value=2, max_value=40))
def test_folding_keeps_the_text_in_pieces_within_the_width(text: str, width: int) -> None:
    pieces = _fold(text, width)
    assert "".join(pieces) == text
    assert all(cell_width(piece) <= width for piece in pieces)


@given(
    rows=st.lists(st.tuples(TEXT, TEXT, TEXT), min_size=1, max_size=6),
    width=st.integers(min_value=40, max_value=120),
)
def test_a_table_keeps_to_the_width_where_its_folding_column_can_narrow(
    rows: list[tuple[str, str, str]], width: int
) -> None:
    columns = [Column("a"), Column("b", fold=True), Column("c")]
    lines = plain(table(columns, [list(row) for row in rows], width=width))
    fixed = sum(max(cell_width(c) for c in [name, *(row[i] for row in rows)]) for i, name in ((0, "a"), (2, "c")))
    if fixed + 8 + 4 <= width:
        assert all(cell_width(line) <= width for line in lines), lines
    assert len(lines) >= len(rows) + 1 and all(line == line.rstrip() for line in lines)


def test_a_bar_fills_a_cell_per_twentieth_and_is_green_when_full() -> None:
    assert bar(0, 16).text == " " * BAR_WIDTH
    assert bar(8, 16).text == "━" * 10 + " " * 10
    assert bar(1, 40).text == "╸" + " " * 19
    assert bar(16, 16).text == "━" * 20 and bar(16, 16).style == {"fg": "green"}
    assert bar(99, 16).text == "━" * 20 and bar(3, 0).text == " " * 20
