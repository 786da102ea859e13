"""Which known case is this error log? Names the case a pasted log belongs to, with the evidence.

    python -m harness.triage [PATH|-] [--json]

Every answer has two levels. The FAMILY is the kind of failure the log shows, which a case teaches (a backward
through a freed graph, an index past a table): a log whose failure line is the case's own error text gets the
family verdict even when nothing around it is the case's. The CAUSE says whether the case's own cause is
`evidenced` (the lines around the failure place it in the case), `not evidenced` (the family's line alone: the
answer says what would confirm the cause and what else prints the same line) or `contradicted` (a line shows
another cause of the same failure: a GAN's second backward, keys that differ by more than a prefix).

Reads a log from PATH, or from stdin with `-` (the default), cleans it the way pytorch/test-infra's
log classifier and Sentry's grouping do (ANSI codes, timestamps, `[rank1]:` prefixes, pids,
addresses, block and thread numbers, line numbers, absolute paths), then scores every case by the
signs its module declares (`triage_signs` in cases/<name>.py, read from the source, so triage
imports neither torch nor the cases). The verdict is the best case whose score reaches
`VERDICT_SCORE`, or none: "not one of the known cases", with what the log looks like instead
where a known look-alike matches (a class past num_classes in F.one_hot, an NCCL timeout, ...).

Scoring. A sign is a regex searched in the cleaned log, one line at a time:
    failure  what broke: a kernel's assertion, the exception text, the launcher's signal report
    context  where: frames by file basename and function, names in the code shown
    support  adds weight and nothing else (`CUDA error: device-side assert triggered` is the same
             for every device-side assert)
    veto     a near-miss that rules the case out (an NCCL timeout for a rank killed by SIGABRT)
    against  another cause of the same failure: the family stays, the case's cause is contradicted
A sign with `near` patterns matches only where each of them matches within NEAR_LINES lines of its own line: a
report in prose ("two predictions of the same input differ", "the gradients scale with the accumulation steps") is
concepts found together, in any order and wording, not one sentence spelled out.
A failure sign with `family=True` is the family's own text: alone it names the family (score at least
VERDICT_SCORE, cause not evidenced), where without it the case would be held back as too little to decide.
The score combines the weights of the signs that matched, 1 - prod(1 - weight), each sign once.
A case without a failure sign, or one whose `needs_context` has no context sign, scores at
most UNCLAIMED_CEILING; a vetoed case scores 0. Candidates are every case with a matched sign,
best first. A candidate below VERDICT_SCORE says why in the words "too little to decide": a log
cut before its error line, a failure line common to other bugs with nothing around it, or a weak
failure (a later op's cuBLAS error) without enough context. It stays a candidate, never a verdict.
Where fewer than three cases have a live sign, the cases the log's words resemble most (each case's module source
against the log, by TF-IDF; harness/triage/resemble.py) follow them as candidates "resembling the case in words",
scored below UNCLAIMED_CEILING, before the cases a veto ruled out: a report in words that no sign reads still has
its case among the first three. Resemblance is a lead, never a verdict: near-misses resemble their look-alike case
as much as its reports do.
`confidence` is the rate at which answers of the same level (cause evidenced, not evidenced, contradicted,
or no verdict) were right on the fixtures (CONFIDENCE; tests/test_triage.py checks it against them).

The package: `records` holds the signs, candidates and verdicts, `text` cleans a log, `search` finds the signs' first
matches, `resemble` compares a log's words with each case's, `lookalikes` names the failures that belong to no case,
this module scores the cases and makes the verdict, `cli` reads a log and prints it (its exit status is there).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from harness.triage import resemble
from harness.triage.lookalikes import LOOKALIKES
from harness.triage.records import (
    CONFIDENCE,
    CONTRADICTED,
    EVIDENCE_CHARS,
    EVIDENCED,
    FAMILY_LINE,
    NEAR_LINES,
    NOT_EVIDENCED,
    NOT_KNOWN,
    RESEMBLES,
    TOO_LITTLE,
    UNCLAIMED_CEILING,
    VERDICT_SCORE,
    Candidate,
    Sign,
    TriageSigns,
    Verdict,
)
from harness.triage.search import _first_match, _line_of, _line_starts, _Search
from harness.triage.text import _ANSI, MAX_LINE_CHARS, _normalise_line, _normalise_text, _raw_lines, normalise

__all__ = [  # what the cases (Sign, TriageSigns), the matrix (normalise) and the tests use; `cli` has main and render
    "CONFIDENCE",
    "CONTRADICTED",
    "EVIDENCED",
    "FAMILY_LINE",
    "LOOKALIKES",
    "MAX_LINE_CHARS",
    "NEAR_LINES",
    "NOT_EVIDENCED",
    "NOT_KNOWN",
    "RESEMBLES",
    "TOO_LITTLE",
    "UNCLAIMED_CEILING",
    "VERDICT_SCORE",
    "Candidate",
    "Sign",
    "TriageSigns",
    "Verdict",
    "_Search",
    "_first_match",
    "_normalise_line",
    "_normalise_text",
    "_raw_lines",
    "load_signs",
    "normalise",
    "triage",
]

CASES_DIR = Path(__file__).resolve().parents[2] / "cases"


RULES_NAME = "triage_signs"


def load_signs(cases_dir: Path = CASES_DIR) -> dict[str, TriageSigns]:
    """Every case's `triage_signs`, read from its module's source without importing it.

    Parsed once per version of the folder (each file's name, size and modification time): parsing every case takes
    longer than scoring a log, and a caller that triages many logs would otherwise pay it for each."""
    return dict(_parsed_signs(cases_dir, _versions(cases_dir)))


def _versions(cases_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """Each case module's name, size and modification time: what the parsed signs and word vectors are cached by."""
    paths = tuple(path for path in sorted(cases_dir.glob("*.py")) if not path.name.startswith("_"))
    return tuple((path.name, stat.st_size, stat.st_mtime_ns) for path, stat in ((path, path.stat()) for path in paths))


@functools.lru_cache(maxsize=8)
def _parsed_signs(cases_dir: Path, versions: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, TriageSigns], ...]:
    rules = {}
    for name, _, _ in versions:
        path = cases_dir / name
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == RULES_NAME for t in node.targets):
                rules[path.stem] = _literal(node.value, path)
    return tuple(rules.items())


_RECORDS = {"TriageSigns": TriageSigns, "Sign": Sign}


def _literal(node: ast.AST, path: Path):
    """Literal data with `Sign(...)` and `TriageSigns(...)` calls; anything else is refused."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RECORDS:
        args = [_literal(arg, path) for arg in node.args]
        kwargs = {kw.arg: _literal(kw.value, path) for kw in node.keywords}
        return _RECORDS[node.func.id](*args, **kwargs)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(element, path) for element in node.elts)
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"{path.name}: {RULES_NAME} must be literal data and Sign/TriageSigns calls (line {node.lineno})") from None


def triage(text: str, rules: dict[str, TriageSigns] | None = None) -> Verdict:
    rules = load_signs() if rules is None else rules
    raw = _raw_lines(text)
    cleaned = _normalise_text(raw)
    starts = _line_starts(cleaned)
    search = _Search(cleaned)
    candidates = [c for c in (_score(case, signs, search, starts, raw) for case, signs in rules.items()) if c is not None]
    candidates.sort(key=lambda c: (-c.score, -len(c.evidence), c.case))
    top = candidates[0] if candidates and candidates[0].score >= VERDICT_SCORE else None
    candidates = _with_resemblance(candidates, cleaned, raw, set(rules))
    if top is None:
        looks_like = [sign.why for sign in LOOKALIKES if search.first(sign.pattern) is not None]
        return Verdict(None, candidates, looks_like)
    signs = rules[top.case]
    family = {"case": top.case, "name": signs.family or top.case}
    cause = {
        "status": top.cause,
        "cause": signs.cause or f"the cause of case {top.case}",
        "evidence": list(top.against) if top.cause == CONTRADICTED else top.evidence[1:] if top.cause == EVIDENCED else [],
        "confirm": signs.confirm or f"run the case (python -m harness case={top.case}) and compare its report with your code",
        "also": signs.also,
    }
    return Verdict(top.case, candidates, [], family, cause, CONFIDENCE[top.cause])


def _with_resemblance(candidates: list[Candidate], cleaned: str, raw: list[str], cases: set[str]) -> list[Candidate]:
    """The candidates whose signs matched, then the cases the log's words resemble most (up to `resemble.RANKED` live
    candidates in all; harness/triage/resemble.py), then the cases a veto ruled out."""
    live = [c for c in candidates if c.score > 0]
    ruled_out = [c for c in candidates if c.score == 0]
    room = resemble.RANKED - len(live)
    if room <= 0:
        return candidates
    lines = cleaned.split("\n")
    per_line = resemble.line_terms(lines)
    vectors, idf = resemble.case_vectors(CASES_DIR, _versions(CASES_DIR))
    named = {c.case for c in candidates}
    leads = [item for item in resemble.resemblance(per_line, vectors, idf) if item[0] in cases and item[0] not in named]
    resembling = [
        Candidate(
            case,
            round(min(similarity, UNCLAIMED_CEILING), 3),
            [_evidence(raw, line) for line in resemble.lines_holding(lines, per_line, shared)],
            f"{RESEMBLES}: no sign of the case matched, but the log's words are its words ({', '.join(shared)}; "
            f"similarity {similarity:.2f}): a lead to read, never a verdict",
        )
        for case, similarity, shared in leads[:room]
    ]
    return live + resembling + ruled_out


def _score(case: str, rules: TriageSigns, search: "_Search", starts: list[int], raw: list[str]) -> Candidate | None:
    matched: list[tuple[Sign, int]] = []
    concepts: list[int] = []  # the lines of a prose sign's other concepts (`Sign.near`): evidence beside its own line
    for sign in rules.signs:
        if sign.near:
            found = search.first_near(sign.pattern, sign.near, NEAR_LINES)
            if found is not None:
                matched.append((sign, found[0]))
                concepts += found[1:]
            continue
        position = search.first(sign.pattern)
        if position is not None:
            matched.append((sign, _line_of(position, starts)))
    if not matched:
        return None
    vetoes = [(sign, line) for sign, line in matched if sign.kind == "veto"]
    if vetoes:
        return Candidate(case, 0.0, [_evidence(raw, line) for _, line in vetoes], "ruled out: " + "; ".join(sign.why for sign, _ in vetoes))
    against = [(sign, line) for sign, line in matched if sign.kind == "against"]
    matched = [(sign, line) for sign, line in matched if sign.kind != "against"]
    if not matched:
        return None
    kinds = {sign.kind for sign, _ in matched}
    family_line = any(sign.family for sign, _ in matched if sign.kind == "failure")
    miss = 1.0
    for sign, _ in matched:
        miss *= 1.0 - sign.weight
    score = 1.0 - miss
    why = "; ".join(sign.why for sign, _ in matched)
    held = ""
    if "failure" not in kinds:
        held = f"{TOO_LITTLE}: no line says what failed, only where ({why}); paste the error's own lines"
    elif rules.needs_context and "context" not in kinds:
        held = f"{TOO_LITTLE}: the failure line is common to other bugs and nothing here places it in this case ({why})"
    elif score < VERDICT_SCORE:
        held = f"{TOO_LITTLE}: {why}"
    if held and "failure" not in kinds:
        score = min(score, UNCLAIMED_CEILING)
    elif held and rules.needs_context and "context" not in kinds:
        score = min(score, UNCLAIMED_CEILING)
    # The cause is evidenced by a context sign, or by a failure line that is the cause's own (not only the family's).
    cause_shown = any(sign.kind == "context" or (sign.kind == "failure" and not sign.family) for sign, _ in matched)
    if family_line and (held or against or not cause_shown):
        # The family's own line: the family is named, the case's cause is not evidenced (or contradicted).
        cause = CONTRADICTED if against else NOT_EVIDENCED
        score, why = max(score, VERDICT_SCORE), f"{FAMILY_LINE}, the case's cause {cause} ({why})"
    elif held:
        why, cause = held, None
    else:
        cause = CONTRADICTED if against else EVIDENCED
    evidence = list(dict.fromkeys(_evidence(raw, line) for line in [line for _, line in matched] + concepts))
    contra = tuple(f"{_evidence(raw, line)}  ({sign.why})" for sign, line in against)
    return Candidate(case, round(score, 3), evidence, why, cause, contra)


def _evidence(raw: list[str], line: int) -> str:
    text = _ANSI.sub("", raw[line]).strip()
    return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 3] + "..."
