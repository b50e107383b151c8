"""Hardware cards: datasheet numbers of the catalogue, and custom cards for measured machines."""

from __future__ import annotations

import pytest

from loraplex.cost.cards.hardware import HARDWARE_CARDS, HardwareCard, get_hardware_card
from loraplex.errors import UserError


def test_h100_sxm_is_the_published_comparisons_gpu() -> None:
    h100 = get_hardware_card("h100_sxm")
    assert (h100.peak_flops, h100.hbm_bandwidth, h100.hbm_bytes) == (989e12, 3.35e12, 80e9)
    assert h100.usd_per_hour == 2.69 and h100.node_size == 8


def test_catalogue_has_the_four_accelerators_with_plausible_ordering() -> None:
    assert {"h100_sxm", "h200", "b200", "a100_80gb"} <= set(HARDWARE_CARDS)
    a100, h100, h200, b200 = (HARDWARE_CARDS[n] for n in ("a100_80gb", "h100_sxm", "h200",
                                                          "b200"))
    assert a100.peak_flops < h100.peak_flops == h200.peak_flops < b200.peak_flops
    assert a100.hbm_bandwidth < h100.hbm_bandwidth < h200.hbm_bandwidth < b200.hbm_bandwidth
    assert h200.hbm_bytes == 141e9


def test_custom_card_for_a_measured_machine() -> None:
    card = HardwareCard.custom("this-box", peak_flops=1.5e11, hbm_bandwidth=2e10,
                               hbm_bytes=24e9)
    assert card.node_size == 1 and card.usd_per_hour == 0.0 and "measured" in card.source


@pytest.mark.parametrize("field", ["peak_flops", "hbm_bandwidth", "hbm_bytes"])
def test_non_positive_rates_are_refused(field: str) -> None:
    values = {"peak_flops": 1.0, "hbm_bandwidth": 1.0, "hbm_bytes": 1.0, field: 0.0}
    with pytest.raises(UserError, match=field):
        HardwareCard.custom("x", values["peak_flops"], values["hbm_bandwidth"],
                            values["hbm_bytes"])


def test_unknown_hardware_lists_known_names() -> None:
    with pytest.raises(UserError, match="h100_sxm"):
        get_hardware_card("tpu")
