"""Every `EngineWorker` protocol method returns a domain error as a `Raised` value, so it
crosses the Ray boundary as the error itself, not as a ``RayTaskError`` the server would log and
report as a server bug (8 of the 13 methods used to let it escape)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from loraplex.cluster.worker import EngineWorker, Raised
from loraplex.errors import UserError, user_error

#: protocol method → arguments (values the fake engine never looks at).
CALLS: dict[str, tuple[Any, ...]] = {
    "create_adapter": ("a", None), "delete_adapter": ("a",), "has_adapter": ("a",),
    "forward_backward": ([],), "optim_step": ([],), "adapter_share": ("a", True),
    "save_adapter": (None,), "read_checkpoint": (None,), "snapshot_adapter": ("a", "b"),
    "sample_step": ([], 4), "num_running_samples": (), "release_memory": (),
    "adapter_memory": (),
}


class RefusingEngine:
    """An engine whose every call raises the same user error."""

    def __getattr__(self, name: str) -> Any:
        def refuse(*_: Any) -> Any:
            raise user_error("field", f"{name} refused")
        return refuse


@pytest.mark.parametrize("method", list(CALLS))
def test_a_domain_error_comes_back_as_a_value(method: str) -> None:
    worker = EngineWorker.__new__(EngineWorker)
    worker._engine = RefusingEngine()  # type: ignore[assignment]
    worker._prepared = {}
    worker._lock = threading.Lock()
    out = getattr(worker, method)(*CALLS[method])
    assert isinstance(out, Raised), f"{method} let the error escape"
    assert isinstance(out.error, UserError) and str(out.error).endswith(f"{method} refused")
