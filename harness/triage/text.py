"""A log cleaned for triage, the way pytorch/test-infra's log classifier and Sentry's grouping do: ANSI codes, timestamps,
`[rank1]:` prefixes, pids, addresses, line numbers and absolute paths taken out, one cleaned line per line."""

from __future__ import annotations

import re

MAX_LINE_CHARS = 2000  # longer lines are cut, which bounds every regex's work per line


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


# Line prefixes, applied in order, each at most once: a timestamp, a pid in brackets, a rank, a glog header.
_PREFIXES = (
    re.compile(r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?(?: -)? ?"),
    re.compile(r"^\[\d+\] "),
    re.compile(r"^(?:\[(?:default)?rank ?\d+\]:|\[\d+,\d+\]<std(?:out|err)>:|\(\w+ pid=\d+(?:, ip=[\d.]+)?\)) ?"),
    re.compile(r"^\[?[IWEF]\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? [^\]\n]*\] ?"),
)


_PATH = re.compile(r"(?<![\w.<])(?:[A-Za-z]:)?(?:~|\.\.?)?[\\/]?(?:[\w.~+@-]+[\\/])+[\w.~+@-]+")


# (pattern, replacement, literals of which every match holds one: skipped where the log has none of them)
_SUBSTITUTIONS = (
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>", ()),
    (re.compile(r"\b0x[0-9a-fA-F]{4,}\b"), "0x<addr>", ("0x",)),
    (re.compile(r"\b(pid|PID|Pid)(:? ?=?\(?s?\)?:? ?)\d+"), r"\1\2<pid>", ("pid", "PID", "Pid")),
    (re.compile(r"\bblock: \[\d+, ?\d+, ?\d+\], thread: \[\d+, ?\d+, ?\d+\]"), "block: [<n>], thread: [<n>]", ("block: [",)),
    (re.compile(r"\b(line |\.(?:py|cu|cpp|cuh|h)[:(])\d+"), r"\1<n>", ()),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?"), "<host>", ()),
    (re.compile(r"(?<=<host>\]):\d+"), "", ("<host>]",)),
    (re.compile(r"/c[a-z0-9]{50,}(?=\.)"), "/<inductor-kernel>", ("/c",)),  # torch.compile's cache: torchinductor_<user>/qt/cqtj2c...
    (re.compile(r"tmp\d+\b"), "tmp<n>", ("tmp",)),  # inductor's temporaries in a generated kernel's bounds check: tmp3, tmp12
)


# Chinese, Japanese or Korean written against an ASCII word ("Lora报错", "loss为nan") leaves no word boundary for a
# sign's \b: a space goes between them. Most logs have no such text, and one search says so.
_CJK = "\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff"
_ANY_CJK = re.compile(f"[{_CJK}]")
_ASCII_BESIDE_CJK = re.compile(f"(?<=[A-Za-z0-9_])(?=[{_CJK}])|(?<=[{_CJK}])(?=[A-Za-z0-9_])")


def _spaced(text: str) -> str:
    return _ASCII_BESIDE_CJK.sub(" ", text) if _ANY_CJK.search(text) else text


def _short_path(match: re.Match) -> str:
    """An installed file by its package path (torch/nn/functional.py), any other absolute path by its last two parts."""
    path = match.group(0).replace("\\", "/")
    for packages in ("site-packages/", "dist-packages/"):
        if packages in path:
            return path.rsplit(packages, 1)[1]
    if path.startswith(("/", "~", "./", "../")) or path[1:3] == ":/":
        return "/".join(path.rsplit("/", 2)[-2:])
    return path


def normalise(text: str) -> list[str]:
    """One cleaned line per input line (same count, same order), so evidence can point back at the original."""
    return _normalise_text(_raw_lines(text)).split("\n")


def _normalise_text(raw: list[str]) -> str:
    """The cleaned lines joined by newlines: the prefixes, anchored at a line's start, are matched line by line; each
    substitution runs once over the whole text, not once per line (no pattern crosses a newline), and not at all where
    none of its literals is in the log, which is what keeps a 10,000-line log fast. tests/test_triage.py checks that
    it equals `_normalise_line` applied line by line."""
    text = _ANSI.sub("", "\n".join(line[:MAX_LINE_CHARS] for line in raw))
    text = "\n".join(_without_prefixes(line) for line in text.split("\n"))
    text = _PATH.sub(_short_path, text)
    for pattern, replacement, literals in _SUBSTITUTIONS:
        if not literals or any(literal in text for literal in literals):
            text = pattern.sub(replacement, text)
    return "\n".join(line.strip() for line in _spaced(text).split("\n"))


def _raw_lines(text: str) -> list[str]:
    # A carriage return inside a line is a progress bar redrawing itself: keep what was drawn last.
    return [line.rsplit("\r", 1)[-1] if "\r" in line else line for line in text.split("\n")]


def _without_prefixes(line: str) -> str:
    """The line without the launchers' and loggers' prefixes at its start (each anchored there: a match, not a search)."""
    for prefix in _PREFIXES:
        found = prefix.match(line)
        if found:
            line = line[found.end() :]
    return line


def _normalise_line(line: str) -> str:
    line = _without_prefixes(_ANSI.sub("", line[:MAX_LINE_CHARS]))
    line = _PATH.sub(_short_path, line)
    for pattern, replacement, _ in _SUBSTITUTIONS:
        line = pattern.sub(replacement, line)
    return _spaced(line).strip()
