"""MkDocs hook (mkdocs.yml `hooks:`): the case gallery's navigation, and repository files that the docs link to as pages.

The navigation's "Cases" section lists the index (cases/README.md), then every generated case page in docs/cases/,
found by scanning the folder: a new case costs no edit of mkdocs.yml.

A page in docs/ may link to a file of the repository outside docs/ by its relative path, as GitHub renders it:
the generated case pages link `../../cases/embedding_oob.py` and `../../conf/case/embedding_oob.yaml`, the
reference pages the harness's modules. MkDocs only knows docs/, so for each such link this hook adds a page,
`source/<path>.md`, that shows the file (kept out of the navigation), and points the link there. A link to a
repository file that does not exist is left as it is: `mkdocs build --strict` fails on it, as on any broken link.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "source"  # where the pages showing repository files go, in the site
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")  # an inline link or image: ](target#anchor)
LANGUAGES = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".sh": "bash", ".toml": "toml", ".json": "json", ".cfg": "ini"}


def repository_file(page_uri: str, target: str) -> str | None:
    """The repository path `target` names from the page at `page_uri` (relative to docs/), where it is a file outside docs/."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("/"):
        return None  # a URL, or absolute
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), target))
    if not resolved.startswith("../") or resolved.startswith("../../"):
        return None  # inside docs/ (MkDocs checks it), or outside the repository
    path = resolved[len("../") :]
    return path if (ROOT / path).is_file() else None


def source_page(path: str) -> str:
    """The page that shows the repository file at `path`."""
    text = (ROOT / path).read_text(errors="replace")
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    language = LANGUAGES.get(Path(path).suffix, "")
    return f"# {path}\n\nThe file `{path}` of the repository, as the site was built.\n\n{fence}{language}\n{text.rstrip()}\n{fence}\n"


GALLERY = "Cases"


def on_config(config):
    pages = sorted(path.stem for path in (ROOT / "docs" / "cases").glob("*.md") if path.name != "README.md")
    for section in config["nav"] or []:
        if isinstance(section, dict) and GALLERY in section:
            section[GALLERY] = [{"All cases": "cases/README.md"}, *({name: f"cases/{name}.md"} for name in pages)]
    return config


def on_files(files, config):
    wanted = set()
    for file in files.documentation_pages():
        for link in LINK.finditer(file.content_string):
            path = repository_file(file.src_uri, link.group("target"))
            if path:
                wanted.add(path)
    for path in sorted(wanted):
        files.append(File.generated(config, f"{SOURCE}/{path}.md", content=source_page(path), inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri) or "."

    def to_source_page(link: re.Match) -> str:
        path = repository_file(page.file.src_uri, link.group("target"))
        if path is None:
            return link.group(0)
        return f"]({posixpath.relpath(f'{SOURCE}/{path}.md', here)})"  # a source page has no anchors: the anchor goes

    return LINK.sub(to_source_page, markdown)
