"""Hardware cards: one accelerator's peak dense bf16 FLOP/s, HBM bandwidth and size, rental price.

Datasheet peaks, not achieved rates: the timing model applies MFU (compute-bound phases) and
MBU (bandwidth-bound decode) to them. `HardwareCard.custom` builds a card for a machine
measured on the spot (e.g. from a timed matmul), the way the empirical validation needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.cost.catalogue import look_up
from loraplex.errors import user_error


@dataclass(frozen=True)
class HardwareCard:
    """One accelerator model.

    Attributes:
        name: catalogue key (``h100_sxm``, ...).
        peak_flops: dense bf16 FLOP/s (no 2:4 sparsity).
        hbm_bandwidth: bytes/s.
        hbm_bytes: memory per device, bytes.
        usd_per_hour: default rental price per device-hour (override per setup).
        node_size: devices per node; self-hosted GPU counts round up to whole nodes.
        source: where the numbers come from.
    """

    name: str
    peak_flops: float
    hbm_bandwidth: float
    hbm_bytes: float
    usd_per_hour: float
    node_size: int = 8
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("peak_flops", "hbm_bandwidth", "hbm_bytes"):
            if not getattr(self, field) > 0:
                raise user_error(f"hardware.{field}", f"must be > 0, got {getattr(self, field)}")
        if self.usd_per_hour < 0:
            raise user_error("hardware.usd_per_hour", "must be ≥ 0")
        if self.node_size < 1:
            raise user_error("hardware.node_size", "must be ≥ 1")

    @staticmethod
    def custom(name: str, peak_flops: float, hbm_bandwidth: float, hbm_bytes: float,
               usd_per_hour: float = 0.0, node_size: int = 1) -> HardwareCard:
        """A card for a machine measured here: pass the achieved matmul FLOP/s and copy
        bandwidth as the "peaks" and use MFU = MBU = 1 to predict with measured rates."""
        return HardwareCard(name, peak_flops, hbm_bandwidth, hbm_bytes, usd_per_hour, node_size,
                            source="custom (measured)")


# RunPod's per-GPU-hour list prices; deploybase keeps a dated copy of the table (2026-03-10).
_RUNPOD_2026_03 = ("https://www.runpod.io/pricing; 2026-03 table at "
                   "https://deploybase.ai/articles/runpod-gpu-pricing")

HARDWARE_CARDS: dict[str, HardwareCard] = {card.name: card for card in (
    HardwareCard(
        "h100_sxm", peak_flops=989e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9, usd_per_hour=2.69,
        source="NVIDIA H100 SXM datasheet (989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB); "
               "price: RunPod Community Cloud on-demand (https://www.runpod.io/pricing), checked "
               "2026-09-25"),
    HardwareCard(
        "h200", peak_flops=989e12, hbm_bandwidth=4.8e12, hbm_bytes=141e9, usd_per_hour=3.59,
        source="NVIDIA H200 SXM datasheet (989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, 141 GB); "
               f"price: RunPod's H200 rate ({_RUNPOD_2026_03})"),
    HardwareCard(
        "b200", peak_flops=2.25e15, hbm_bandwidth=8.0e12, hbm_bytes=180e9, usd_per_hour=5.99,
        source="NVIDIA HGX B200 datasheet (2.25 PFLOP/s dense bf16, 8 TB/s HBM3e, 180 GB "
               f"usable); price: RunPod's B200 rate ({_RUNPOD_2026_03}, which lists $5.98)"),
    HardwareCard(
        "a100_80gb", peak_flops=312e12, hbm_bandwidth=2.039e12, hbm_bytes=80e9,
        usd_per_hour=1.39,
        source="NVIDIA A100 80GB SXM datasheet (312 TFLOP/s dense bf16, 2,039 GB/s HBM2e); "
               f"price: RunPod's A100 SXM 80GB rate ({_RUNPOD_2026_03})"),
)}


def get_hardware_card(name: str) -> HardwareCard:
    """The catalogued card for ``name``.

    Raises:
        UserError: unknown name; the message lists the known ones.
    """
    return look_up(HARDWARE_CARDS, name, "hardware", "hardware")
