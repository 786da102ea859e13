"""A case's page at a glance: a short title and three lines (what you see, why, the fix), from its yaml.

    title: "MSELoss silently broadcasts (N,) predictions against (N, 1) labels"  # at most 12 words, one line
    summary:  # the box above the story, a short line each
      see: "No error, only a UserWarning ..."
      why: "`logits.squeeze()` makes ..."
      fix: "Do not squeeze ..."

The docstring's first line stays the case's full title (the records and the task cards carry it); this one is what a
learner reads first: the page's heading, the gallery's "what goes wrong" column and the notebook's heading.
tests/test_teach.py holds every page to these limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TITLE_WORDS = 12  # the most words of a title, the case's name not counted
LINE_WORDS = 30  # the most words of a line of the box (most are under 25)
BOX_KEYS = ("see", "why", "fix")


@dataclass(frozen=True)
class Summary:
    title: str
    see: str
    why: str
    fix: str


def summary(name: str, config: dict[str, Any]) -> Summary:
    """The title and the box of case `name` from its yaml (`config`, loaded); ValueError naming the file when one is missing."""
    box = config.get("summary") or {}
    missing = [key for key in ("title",) if not config.get(key)] + [f"summary.{key}" for key in BOX_KEYS if not box.get(key)]
    if missing:
        raise ValueError(f"conf/case/{name}.yaml lacks {', '.join(missing)}: the page's title and box (harness/teach/summary.py)")
    return Summary(str(config["title"]).strip(), *(str(box[key]).strip() for key in BOX_KEYS))


def problems(short: Summary) -> list[str]:
    """What breaks the limits: a title over TITLE_WORDS words or on more than one line, a line of the box likewise."""
    found = []
    if "\n" in short.title or len(short.title.split()) > TITLE_WORDS:
        found.append(f"title has {len(short.title.split())} words (at most {TITLE_WORDS}, one line): {short.title!r}")
    for key in BOX_KEYS:
        line = getattr(short, key)
        if "\n" in line or len(line.split()) > LINE_WORDS:
            found.append(f"summary.{key} has {len(line.split())} words (at most {LINE_WORDS}, one line): {line!r}")
    return found
