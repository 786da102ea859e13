"""The docs site builds strictly (a broken link, or a page left out of mkdocs.yml's nav, fails it), and every file the
README links to exists. `.ci/run` runs the same build."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cases import ROOT

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def _mkdocs() -> list[str]:
    beside = Path(sys.executable).with_name("mkdocs")
    if beside.exists():
        return [str(beside)]
    if shutil.which("mkdocs"):
        return [shutil.which("mkdocs")]
    pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")


def test_the_site_builds_strictly(tmp_path):
    build = subprocess.run(
        [*_mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "cases" / "index.html").exists(), "docs/cases/README.md is the gallery's index"
    case_page = (tmp_path / "site" / "cases" / "loss_broadcast" / "index.html").read_text()
    assert case_page.index("<blockquote>") < case_page.index('id="story"'), "the box above the story (harness/teach)"
    assert "css/extra.css" in case_page
    style = (tmp_path / "site" / "css" / "extra.css").read_text()
    assert re.search(r"blockquote \{[^}]*border:", style), "the site draws the blockquote as a box"


def test_every_relative_link_of_the_readme_exists():
    readme = (ROOT / "README.md").read_text()
    targets = [target for target in LINK.findall(readme) if not re.match(r"^[a-z]+:", target)]
    assert targets, "the README links to the docs"
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert missing == []


def test_the_readme_stays_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "mkdocs serve" in readme


def test_ci_builds_the_site_strictly():
    assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()
