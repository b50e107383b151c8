"""`RayHead`: this server's connection to the Ray runtime, watched, and made again when the
head is lost.

Ray's driver (this process) ends itself when it cannot reach the head's GCS for
``gcs_rpc_server_reconnect_timeout_s`` (60 s): the whole API went down with the head. So the
driver's timeout is set out of reach (`DRIVER_ENV`, before ``ray.init``), and a thread probes the
GCS port instead (a TCP connect every ``probe_interval_s``). After ``probe_misses`` misses in a
row the head is *lost*: every worker call fails at once with a `WorkerLostError` naming the
cause (the lanes then move their runs, see `loraplex.scheduler.lanes`), health reports it, and
the connection is made again: a server that started its own runtime (``--workers``) shuts the
dead one down and starts a fresh one; a server that joined one (``--ray-address``) waits until
that address answers and joins it again. Replacement workers start once it is back
(`wait_up`); the runs are restored from their latest ``save_state``. Each connection has a
generation: an actor of an earlier one is never called (its handle means nothing to the new
runtime).

Binding: a runtime this server starts listens on loopback only when the API does (Ray's own
switch for that, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, makes its node address 127.0.0.1, and
then its GCS, raylet and workers bind 127.0.0.1); otherwise on ``cluster.ray_host``, or the
interfaces Ray picks.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from loraplex.errors import WorkerLostError

log = logging.getLogger("loraplex.cluster")
DRIVER_ENV = {"RAY_gcs_rpc_server_reconnect_timeout_s": str(10**9)}
"""The driver never ends itself over an unreachable head (the probe below decides instead)."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WAIT_SLICE_S = 0.5  # a worker call in flight checks the head this often


class RayHead:
    """The Ray connection of one server.

    Args:
        address: the cluster to join (None: start a local runtime).
        host: the interface a local runtime listens on (loopback: loopback only).
        probe_interval_s, probe_misses: how the head's GCS port is watched.
    """

    def __init__(self, address: str | None, host: str, probe_interval_s: float = 1.0,
                 probe_misses: int = 3) -> None:
        self.address = address
        self.host = host
        self.probe_interval_s = probe_interval_s
        self.probe_misses = probe_misses
        self.generation = 0
        self._lost: str | None = None
        self._gcs: tuple[str, int] | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- connection --------------------------------------------------------------------------

    def connect(self) -> None:
        """Start or join the runtime (unless this process already has one: tests share it)."""
        os.environ.update(DRIVER_ENV)
        if not ray.is_initialized():
            if self.address:
                self._join_cluster()
            else:
                # "local": a runtime of its own, never one `ray start` left on this host
                ray.init(address="local", include_dashboard=False, log_to_driver=False,
                         **self._bind())
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        self._gcs = (host.strip("[]"), int(port))
        with self._cond:
            self.generation += 1
            self._lost = None
            self._cond.notify_all()
        log.info("ray: head at %s:%d, %s", *self._gcs, ray.cluster_resources())

    def _join_cluster(self) -> None:
        """Join ``address``; one on loopback on loopback (Ray would swap in this node's IP)."""
        assert self.address
        host = self.address.rpartition(":")[0].strip("[]")
        try:
            ray.init(address=self.address, log_to_driver=False,
                     **(self._loopback() if host in LOOPBACK else {}))
        except ConnectionError as err:
            if "RAY_AUTH_MODE" in os.environ:
                raise
            raise ConnectionError(f"{err}. A head from `ray start` checks a token when it has "
                                  "one, and Ray sends none to an explicit address: set "
                                  "RAY_AUTH_MODE=token (the token is read from RAY_AUTH_TOKEN, "
                                  "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)") from err

    def _loopback(self) -> dict[str, Any]:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's child processes
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already
        return {"_node_ip_address": "127.0.0.1"}

    def _bind(self) -> dict[str, Any]:
        if self.host in LOOPBACK:
            return self._loopback()
        if self.host not in ("0.0.0.0", "::", ""):
            return {"_node_ip_address": self.host}
        return {}

    def start(self) -> None:
        """Watch the head from a daemon thread."""
        self._thread = threading.Thread(target=self._watch, name="loraplex-ray-head",
                                        daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if ray.is_initialized() and not self.address:
            ray.shutdown()

    # ---- what the workers' calls ask ---------------------------------------------------------

    @property
    def problem(self) -> str | None:
        """Why the head is unusable now (None: it is up)."""
        return self._lost

    def is_current(self, generation: int) -> bool:
        """Whether ``generation``'s runtime is the one up now (its actors and placement
        groups can be called and removed; an earlier runtime's went with it)."""
        return generation == self.generation and self._lost is None

    def check(self, generation: int) -> None:
        """Raise the `WorkerLostError` a call of a ``generation`` actor gets now, if any."""
        lost = self._lost
        if lost is not None:
            raise WorkerLostError(f"{lost}; the engine workers are restarted when it is back, "
                                  "retry")
        if generation != self.generation:
            raise WorkerLostError("the engine worker belonged to an earlier Ray runtime")

    def get(self, ref: Any, generation: int) -> Any:
        """``ray.get(ref)``, given up with a `WorkerLostError` when the head is lost."""
        while True:
            self.check(generation)
            try:  # one call into Ray per slice (a wait, then a get, cost a round trip more)
                return ray.get(ref, timeout=WAIT_SLICE_S)
            except GetTimeoutError:
                continue

    def wait_up(self) -> int:
        """Block until the head is up; its generation."""
        with self._cond:
            while self._lost is not None:
                self._cond.wait()
            return self.generation

    # ---- the watcher ---------------------------------------------------------------------------

    def _watch(self) -> None:
        misses = 0
        while not self._stop.wait(self.probe_interval_s):
            misses = 0 if self._reachable() else misses + 1
            if misses >= self.probe_misses:
                self._lose(f"the Ray head (GCS at {self._where()}) is unreachable")
                self._reconnect()
                misses = 0

    def _reachable(self) -> bool:
        if self._gcs is None:
            return True
        try:
            with socket.create_connection(self._gcs, timeout=self.probe_interval_s):
                return True
        except OSError:
            return False

    def _where(self) -> str:
        return "?" if self._gcs is None else f"{self._gcs[0]}:{self._gcs[1]}"

    def _lose(self, cause: str) -> None:
        with self._cond:
            self._lost = cause
        log.error("%s: engine workers lost; %s", cause,
                  f"rejoining {self.address}" if self.address else
                  "starting a new local Ray runtime")

    def _reconnect(self) -> None:
        """Shut the dead connection down and connect again, until it works."""
        time.sleep(2 * WAIT_SLICE_S)  # calls in flight see the loss before Ray goes away
        delay = self.probe_interval_s
        while not self._stop.is_set():
            if self.address and not self._reachable():
                self._stop.wait(delay)
                continue
            try:
                _bounded(ray.shutdown, 60.0)
                self.connect()
            except Exception as exc:
                log.error("reconnecting to Ray failed (%s); trying again in %.0f s", exc, delay)
                self._stop.wait(delay)
                delay = min(2 * delay, 30.0)
                continue
            log.info("ray: connected again (runtime %d)", self.generation)
            return


def _bounded(call: Callable[[], None], timeout_s: float) -> None:
    """Run ``call`` on a thread, waiting at most ``timeout_s`` (Ray's shutdown of a runtime
    whose head is gone can hang)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{getattr(call, '__name__', 'call')} did not return in "
                           f"{timeout_s:g} s")
