"""First matches of the signs' patterns in one cleaned log, fast on long logs: each pattern searched once, skipped where
a literal every match needs is absent, and searched line by line where it cannot cross a line."""

from __future__ import annotations

import bisect
import functools
import re

try:  # the regex parser the `re` module compiles with: read to find the literals a pattern needs (`_needed`)
    from re import _parser as _sre_parser  # Python >= 3.11
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parser  # type: ignore[no-redef]


def _first_match(pattern: str, cleaned: str) -> int | None:
    found = re.search(pattern, cleaned, re.MULTILINE)
    return found.start() if found else None


class _Search:
    """First matches in one cleaned log: each distinct pattern searched once (cases share signs), and skipped
    without running the regex when one of the sets of literals that every match must hold (`_needed`) has none in
    the log: most of a long log is noise that holds none of them. Each literal is looked for once per log. A pattern
    that cannot match across a line is searched only in the lines that hold one of its rarest set's literals."""

    def __init__(self, cleaned: str):
        self.cleaned, self.lowered = cleaned, cleaned.lower()
        self.found: dict[str, int | None] = {}
        self.present: dict[str, bool] = {}
        self.lines_with: dict[str, list[int]] = {}
        self.match_lines: dict[str, list[int]] = {}
        self._lines: list[str] | None = None
        self._starts: list[int] | None = None
        self._lowered_starts: list[int] | None = None
        self._distinct_words: str | None = None

    def _has(self, literal: str) -> bool:
        if literal not in self.present:
            pieces = literal.split()
            if len(pieces) == 1 and pieces[0] == literal:
                self.present[literal] = literal in self._words()
            else:  # each piece is in one word, where the literal is in the log: the whole text only when they all are
                self.present[literal] = all(piece in self._words() for piece in pieces) and literal in self.lowered
        return self.present[literal]

    def _words(self) -> str:
        """The log's distinct whitespace-separated words, once each: a literal without whitespace is in the log exactly
        when it is in one of its words, and a long log repeats most of them (a few percent of its size to search)."""
        if self._distinct_words is None:
            self._distinct_words = " ".join(set(self.lowered.split()))
        return self._distinct_words

    def first(self, pattern_as_given: str) -> int | None:
        if pattern_as_given not in self.found:
            pattern = self._possible(pattern_as_given)
            if pattern is None:
                self.found[pattern_as_given] = None
                return None
            needed = _needed(pattern)
            if any(not any(self._has(literal) for literal in literals) for literals in needed):
                self.found[pattern] = None
            elif needed and _one_line(pattern):
                self.found[pattern] = self._first_in_lines(pattern, needed)
            else:
                self.found[pattern] = _first_match(pattern, self.cleaned)
            self.found[pattern_as_given] = self.found[pattern]
        return self.found[pattern_as_given]

    def _possible(self, pattern: str) -> str | None:
        """`pattern` without the top-level branches that cannot match here (a set of literals each of their matches
        needs is absent from the log), or None where none can: the first match, and every line with a match, are the
        same. One costly alternative of a sign (a class, a line-crossing gap) is then searched only where it may match."""
        branches = _branches(pattern)
        if branches is None:
            return pattern
        flags, alternatives = branches
        kept = [branch for branch in alternatives if self._may_match(flags + branch)]
        if not kept:
            return None
        return pattern if len(kept) == len(alternatives) else flags + "|".join(kept)

    def _may_match(self, pattern: str) -> bool:
        return all(any(self._has(literal) for literal in literals) for literals in _needed(pattern))

    def first_near(self, pattern: str, near: tuple[str, ...], lines: int) -> list[int] | None:
        """The lines of the first match of `pattern` whose line has a match of every pattern in `near` at most `lines`
        lines away, before or after it, and of those matches (the nearest of each): the concepts of a report written in
        prose, in any order and wording around them. None where there is no such match."""
        if self.first(pattern) is None or any(self.first(other) is None for other in near):
            return None
        others = [self._match_lines(other) for other in near]
        for line in self._match_lines(pattern):
            found = [_nearest(other, line, lines) for other in others]
            if all(at is not None for at in found):
                return [line] + [at for at in found if at != line]
        return None

    def _match_lines(self, pattern_as_given: str) -> list[int]:
        """Every line holding a match of `pattern` (of one that may cross lines: the line its match starts on)."""
        if pattern_as_given not in self.match_lines:
            pattern = self._possible(pattern_as_given)
            if pattern is None:
                self.match_lines[pattern_as_given] = []
                return []
            lines, starts = self._cleaned_lines()
            needed = _needed(pattern)
            if _one_line(pattern):
                holding = self._rarest_lines(needed) if needed else range(len(lines))
                found = [line for line in holding if re.search(pattern, lines[line])]
            else:
                found = sorted({_line_of(match.start(), starts) for match in re.finditer(pattern, self.cleaned, re.MULTILINE)})
            self.match_lines[pattern_as_given] = found
        return self.match_lines[pattern_as_given]

    def _cleaned_lines(self) -> tuple[list[str], list[int]]:
        """The cleaned log's lines and where each starts, split once."""
        if self._lines is None:
            self._lines, self._starts = self.cleaned.split("\n"), _line_starts(self.cleaned)
        return self._lines, self._starts

    def _rarest_lines(self, needed: tuple[tuple[str, ...], ...]) -> list[int]:
        """The fewest lines that hold every match: those holding one literal of the rarest of the `needed` sets."""
        return min((sorted(set().union(*(self._line_indices(literal) for literal in literals))) for literals in needed), key=len)

    def _line_indices(self, literal: str) -> list[int]:
        """The lines whose lower-cased text holds `literal` (positions in the lowered text, whose lines are the same)."""
        if literal not in self.lines_with:
            if self._lowered_starts is None:
                self._lowered_starts = _line_starts(self.lowered)
            found, at = [], self.lowered.find(literal)
            while at >= 0:
                line = _line_of(at, self._lowered_starts)
                found.append(line)
                at = self.lowered.find(
                    literal, self._lowered_starts[line + 1] if line + 1 < len(self._lowered_starts) else len(self.lowered)
                )
            self.lines_with[literal] = found
        return self.lines_with[literal]

    def _first_in_lines(self, pattern: str, needed: tuple[tuple[str, ...], ...]) -> int | None:
        every_match_holds = self._rarest_lines(needed)
        lines, starts = self._cleaned_lines()
        if len(every_match_holds) * 4 > len(lines):
            return _first_match(pattern, self.cleaned)
        for line in every_match_holds:  # in order: the first line with a match holds the log's first match
            found = re.search(pattern, lines[line], re.MULTILINE)
            if found:
                return starts[line] + found.start()
        return None


def _nearest(lines: list[int], line: int, distance: int) -> int | None:
    """The one of the sorted `lines` nearest to `line`, where it is at most `distance` away."""
    at = bisect.bisect_left(lines, line)
    around = [lines[index] for index in (at - 1, at) if 0 <= index < len(lines)]
    best = min(around, key=lambda other: abs(other - line), default=None)
    return best if best is not None and abs(best - line) <= distance else None


# What lets a match span lines: a whitespace or non-word class, a negated set, a newline, dot-matches-all.
_CROSSES_LINES = re.compile(r"\\[snWDAZ]|\[\^|\(\?[a-zA-Z]*s|\n")


@functools.lru_cache(maxsize=None)
def _one_line(pattern: str) -> bool:
    return not _CROSSES_LINES.search(pattern)


_LEADING_FLAGS = re.compile(r"\(\?[aiLmsux]+\)")
_BACKREFERENCE = re.compile(r"\\[1-9]|\(\?P=")


@functools.lru_cache(maxsize=None)
def _branches(pattern: str) -> tuple[str, list[str]] | None:
    """(the leading inline flags, the top-level alternatives) of a pattern with more than one; None for one without,
    with a backreference (whose group numbers a removed branch would shift), or verbose (a comment may hold a "|")."""
    flags = _LEADING_FLAGS.match(pattern)
    prefix = flags.group(0) if flags else ""
    if _BACKREFERENCE.search(pattern) or "x" in prefix:
        return None
    alternatives, depth, class_from, escaped, start = [], 0, -1, False, len(prefix)
    for at in range(len(prefix), len(pattern)):
        char = pattern[at]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif class_from >= 0:  # a "]" first in a class (after its "^") is a member, not the end
            first = class_from + (2 if pattern[class_from + 1 : class_from + 2] == "^" else 1)
            class_from = class_from if char != "]" or at == first else -1
        elif char == "[":
            class_from = at
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            alternatives.append(pattern[start:at])
            start = at + 1
    alternatives.append(pattern[start:])
    return (prefix, alternatives) if len(alternatives) > 1 else None


_GATES = 2  # sets of literals checked per pattern, the most telling first


@functools.lru_cache(maxsize=None)
def _needed(pattern: str) -> tuple[tuple[str, ...], ...]:
    """Sets of lower-case literals, each such that every match of `pattern` holds at least one of its literals; none
    where the pattern has no such set (a class or a wildcard at every turn). Read from the parsed pattern: a run of
    literals in a sequence, what a group or a repeat of at least one needs, or one set from each branch of an
    alternation. The longest literals first: they are the rarest in a log's noise."""
    try:
        parsed = _sre_parser.parse(pattern, re.MULTILINE)
    except Exception:  # noqa: BLE001 - any pattern the parser refuses is simply searched
        return ()
    found = _needed_in(list(parsed))
    return tuple(tuple(sorted(needed)) for needed in sorted(found, key=lambda needed: -min(map(len, needed)))[:_GATES])


def _telling(literal: str) -> bool:
    """Long enough to be rare in noise: 3 characters, or 2 where one is not a letter or a digit (`+=`, `内存`)."""
    return len(literal) >= 3 or (len(literal) == 2 and (not literal.isascii() or not literal.isalnum()))


_SPELLINGS = 16  # the most spellings a run of literals is followed through (a class or an alternation of literals)


def _needed_in(items: list) -> list[frozenset[str]]:
    """Every set found in this sequence (each one necessary on its own). A run of literals is one set: of one string,
    or of its spellings where a small class or an alternation of literals sits in the run (`[\"']module`,
    `Module(?:List|Dict)`); a zero-width assertion (`\\b`) does not end it."""
    found: list[frozenset[str]] = []
    run = {""}

    def keep(candidates: list[frozenset[str]]) -> None:
        found.extend(needed for needed in candidates if needed and all(map(_telling, needed)))

    def end_run() -> None:
        nonlocal run
        keep([frozenset(run)] if run != {""} else [])
        run = {""}

    for op, value in items:
        name = str(op)
        spellings = _spellings(name, value)
        if spellings is not None and len(run) * len(spellings) <= _SPELLINGS:
            run = {before + after for before in run for after in spellings}
            continue
        if name == "AT":
            continue
        end_run()
        if name == "SUBPATTERN":
            keep(_needed_in(list(value[-1])))
        elif name == "BRANCH":
            branches = [_needed_in(list(branch)) for branch in value[1]]
            if all(branches):  # one set per branch, its most telling: together they make a set for the alternation
                keep([frozenset().union(*(max(sets, key=lambda needed: min(map(len, needed))) for sets in branches))])
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and value[0] >= 1:
            keep(_needed_in(list(value[2])))
    end_run()
    return found


def _spellings(name: str, value) -> set[str] | None:
    """The strings one item of a parsed pattern matches, where it is a literal, a class of a few literals, or an
    alternation of plain literal runs (a group of them, not captured or captured); None for anything else."""
    if name == "LITERAL":
        return {chr(value).lower()}
    if name == "IN" and len(value) <= 4 and all(str(op) == "LITERAL" for op, _ in value):
        return {chr(char).lower() for _, char in value}
    if name == "SUBPATTERN" and len(value[-1]) == 1:
        (inner_op, inner_value), *_ = value[-1]
        return _spellings(str(inner_op), inner_value) if str(inner_op) in ("BRANCH", "IN") else None
    if name == "BRANCH":
        branches = value[1]
        if len(branches) <= _SPELLINGS and all(all(str(op) == "LITERAL" for op, _ in branch) for branch in branches):
            return {"".join(chr(char) for _, char in branch).lower() for branch in branches}
    return None


def _line_starts(cleaned: str) -> list[int]:
    return [0] + [match.end() for match in re.finditer("\n", cleaned)]


def _line_of(position: int, starts: list[int]) -> int:
    low, high = 0, len(starts) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if starts[middle] <= position:
            low = middle
        else:
            high = middle - 1
    return low
