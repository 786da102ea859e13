"""Which cases a log's words resemble: a lead for the logs no sign decides, never a verdict.

A report in words ("the loss is higher with more accumulation steps", "RAM grows until the worker is killed") often
holds no line a sign can read, yet its words are the words of one case's module: its docstrings, its code and its
signs' reasons. Each case's module source is a document; a log is compared with every one by the cosine of their
TF-IDF vectors (words of three letters or more, the parts of snake_case names, and pairs of adjacent words). The cases
a log resembles most fill the ranked candidates up to RANKED, after the cases whose signs matched and before the ones
a veto ruled out, so that the right case is among the first three even where no verdict is given. Their score is
kept below UNCLAIMED_CEILING: resembling a case's words never names it.
"""

from __future__ import annotations

import collections
import functools
import math
import re
from pathlib import Path

RANKED = 3  # the candidates a reader sees first: resemblance fills the list up to this many live ones


SIMILARITY_FLOOR = 0.03  # a log whose words resemble no case more than this gets no lead from them


SHARED_TERMS = 3  # nor one sharing fewer weighted words with the case than this


HEAD_LINES, TAIL_LINES = 1_000, 3_000  # of a longer log, the distinct lines read: a report's words are at its start, a failure's at its end


_WORD = re.compile(r"[a-z][a-z0-9_]{2,}")


_STOP = frozenset(
    "the and for with that this are was not but you from have has its can when what which into than then there their "
    "they them been also only each where would will does did any all one two use used using our out per via".split()
)


def terms(text: str) -> list[str]:
    """The words of `text` (lower case, without stop words), the parts of each snake_case name, and each adjacent pair."""
    words = [word for word in _WORD.findall(text.lower()) if word not in _STOP]
    parts = [part for word in words if "_" in word for part in word.split("_") if len(part) > 2]
    return words + parts + [f"{first} {second}" for first, second in zip(words, words[1:])]


@functools.lru_cache(maxsize=8)
def case_vectors(cases_dir: Path, versions: tuple[tuple[str, int, int], ...]) -> tuple[dict, dict]:
    """Each case's unit TF-IDF vector over its module's source, and the IDF of every term; parsed once per version
    of the folder (`versions`, as load_signs keys it)."""
    counts = {Path(name).stem: collections.Counter(terms((cases_dir / name).read_text())) for name, _, _ in versions}
    seen_in = collections.Counter(term for count in counts.values() for term in count)
    idf = {term: math.log((1 + len(counts)) / (1 + n)) + 1 for term, n in seen_in.items()}
    return {case: _unit(count, idf) for case, count in counts.items()}, idf


def _unit(count: collections.Counter, idf: dict) -> dict[str, float]:
    weights = {term: (1 + math.log(n)) * idf[term] for term, n in count.items() if term in idf}
    norm = math.sqrt(sum(weight * weight for weight in weights.values())) or 1.0
    return {term: weight / norm for term, weight in weights.items()}


def line_terms(lines: list[str]) -> dict[str, collections.Counter]:
    """The terms of each distinct line, counted: a repeated progress line is read once, and of a log with more distinct
    lines than HEAD_LINES + TAIL_LINES only its first and last ones are read."""
    distinct = list(dict.fromkeys(lines))
    if len(distinct) > HEAD_LINES + TAIL_LINES:
        distinct = distinct[:HEAD_LINES] + distinct[-TAIL_LINES:]
    return {line: collections.Counter(terms(line)) for line in distinct}


def resemblance(per_line: dict[str, collections.Counter], vectors: dict, idf: dict) -> list[tuple[str, float, list[str]]]:
    """(case, similarity, the shared terms that weigh most) for every case past both floors, most similar first."""
    total: collections.Counter = collections.Counter()
    for count in per_line.values():
        total.update(count)
    query = _unit(total, idf)
    found = []
    for case, vector in vectors.items():
        shared = sorted(((weight * vector[term], term) for term, weight in query.items() if term in vector), reverse=True)
        similarity = sum(product for product, _ in shared)
        if similarity >= SIMILARITY_FLOOR and len(shared) >= SHARED_TERMS:
            found.append((case, similarity, [term for _, term in shared[:5]]))
    return sorted(found, key=lambda item: (-item[1], item[0]))


def lines_holding(lines: list[str], per_line: dict[str, collections.Counter], shared: list[str], most: int = 2) -> list[int]:
    """The indices of the (at most `most`) lines holding the most of the shared terms, in the log's order."""
    wanted = set(shared)
    held = {}
    for index, line in enumerate(lines):
        count = len(wanted.intersection(per_line.get(line, ())))
        if count and line not in held:
            held[line] = (count, index)
    best = sorted(held.values(), key=lambda item: (-item[0], item[1]))[:most]
    return sorted(index for _, index in best)
