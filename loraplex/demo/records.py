"""What a demo run leaves under --out: metrics.jsonl, manifest.json, summary.json, curves.png."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunRecords:
    """Accumulates rows and the manifest, writes them as the run goes.

    Attributes:
        out_dir: destination folder (created).
        rows: one dict per SFT or RL step (`phase`, `step`, `loss`, `pass_rate`, ...).
        manifest: model, LoRA, renderer, loss, optimizer and per-step checkpoint/trajectory data.
    """

    out_dir: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "metrics.jsonl").write_text("")

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with (self.out_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    def write_json(self, name: str, payload: Any) -> Path:
        path = self.out_dir / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2))
        tmp.replace(path)
        return path

    def plot_curves(self) -> Path:
        """SFT loss per step and RL pass rate per step, side by side."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sft = [r for r in self.rows if r["phase"] == "sft"]
        rl = [r for r in self.rows if r["phase"] == "rl"]
        fig, (ax_sft, ax_rl) = plt.subplots(1, 2, figsize=(10, 4))
        ax_sft.plot([r["step"] for r in sft], [r["loss"] for r in sft], marker=".")
        ax_sft.set(title="SFT warm start", xlabel="step", ylabel="loss (mean NLL per token)")
        if not sft:
            ax_sft.text(0.5, 0.5, "no warm start: GRPO from the base model",
                        ha="center", va="center", transform=ax_sft.transAxes)
        ax_rl.plot([r["step"] for r in rl], [r["pass_rate"] for r in rl], marker="o")
        ax_rl.set(title="GRPO", xlabel="step", ylabel="pass rate (reward)", ylim=(-0.02, 1.02))
        ax_rl.grid(alpha=0.3)
        fig.tight_layout()
        path = self.out_dir / "curves.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path
