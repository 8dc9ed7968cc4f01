"""The model's own test, run from the repository's root as research code is (`python -m pytest`)."""

from pkscan.model import exposure


def test_a_higher_clearance_lowers_the_exposure() -> None:
    low, high = exposure(100, 3.0), exposure(100, 6.0)
    assert high["auc_mg_h_per_l"] < low["auc_mg_h_per_l"] and 0 < high["tmax_h"] <= low["tmax_h"]
