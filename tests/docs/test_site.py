"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing anchor or
a page left out of the tree fails the build, and so this test. A copy of the docs with one broken
link shows the strict build can fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_site_builds_strict(tmp_path: Path) -> None:
    proc = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kv_cache_blocks" in (tmp_path / "site" / "reference" / "index.html").read_text()
    assert (tmp_path / "site" / "results" / "load.json").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)  # follows the results/ and contributing.md links
    with (docs / "limits.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["plugins"] = ["search"]  # the API reference needs the package path; not under test
    config["nav"] = [entry for entry in config["nav"] if "Development" not in entry]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    proc = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stdout + proc.stderr
