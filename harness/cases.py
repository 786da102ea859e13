"""What a case is, and how the harness finds them.

A case is one module in `cases/` plus one yaml in `conf/case/` with the same
name. The module provides plain names, no base class:

    symptoms         {"cpu": Symptom(...), "cuda": Symptom(...)}: the failure expected per device
    make_inputs      (cfg, device) -> inputs, deterministic from cfg.seed
    buggy            inputs -> output: the upstream code, which fails
    fixed            inputs -> output: the fix
    reference        inputs -> output: the intended result, computed independently of `fixed`
    bad_fixes        {name: inputs -> output}: plausible fixes that the harness must reject
    bad_fixes_right_on  (optional) {name: torch version specifier}: the releases where that bad fix happens to be
                     right (a version check that misreads only later releases); there a bad fix that matches the
                     reference is `not_wrong_here`, elsewhere `accepted` as any other
    speed_baseline   inputs -> output: what the fix is timed against
    speed_candidate  (optional) inputs -> output: the part of the fix to time, default `fixed`
    slow_fixes       {name: inputs -> output}: controls, fixes that are correct but clearly slower, as a
                     careless fix would be; each stands in for `speed_candidate` (default `fixed`), and the
                     speed verdict must flag it. Required where the yaml sets a speed budget for any device
    speed_reference  inputs -> output: the intended output of `speed_candidate`, computed independently;
                     required with `slow_fixes` where the case times only part of the fix
    compiled_unit    str: what a user of this code would `torch.compile` (the model step, the loss, the decode), and
                     why not where compiling does not apply; with compile=<backend> (harness/compiled.py) the
                     harness compiles `buggy`, `fixed` and each timed, slow or bad fix whole, never `reference`
    compiles_itself  (optional) True: the harness cannot compile the unit from outside (a launcher's ranks); the
                     case compiles it where it runs, reading the backend from `cfg.compile`
    memory_baseline  (optional) inputs -> output: what the memory phase compares the fix with, default `speed_baseline`
    memory_fixes     {name: inputs -> output}: memory controls, wrong fixes that keep every step's memory (e.g.
                     `retain_graph=True`); the memory verdict must flag each. Required where the yaml sets a
                     memory budget for any device; not judged on correctness by the memory phase
    carries_state    (optional) True: each call is a training step that advances the state in its inputs (the memory
                     contract), so a grade checks a timed output against the reference taken after the model
                     solution has replayed the calls before it on fresh inputs; `reference` then reads that state
                     without advancing it (the judge goes on replaying from there)
    preload          (optional) () -> None: slow imports every child needs (an upstream package); the fork
                     server calls it once (harness/preload.py), so neither the children nor the harness's
                     own process pay for them
    triage_signs     TriageSigns(signs=(Sign(kind, pattern, weight, why), ...)): how `python -m harness.triage`
                     recognises this failure's family in a pasted log; placed right after `symptoms`,
                     literal data only (triage reads it from the source, without importing the case)

The memory phase calls a function `memory.steps` times on one inputs object (harness/measure/footprint.py): a case whose
failure grows with steps writes `buggy`, `fixed`, its controls and baselines as one training step on `inputs`
(model, optimizer, carried state in `inputs`) that may be called again and again. Its symptom on a device
where nothing raises is `Growth(at_least=...)`: memory retained per step, measured. A failure that raises nothing
is `WrongResult` (the output differs from `reference`) or `Warns`; one that is only slow is `Slow` (timed against
the fix); `Versions` chains symptoms over torch releases.

An exception raised by `buggy` may carry a `figures` dict of plain values (e.g.
how long teardown took); the reproduce record keeps them.

and a docstring whose first line is its title, followed by the sections in
`REQUIRED_SECTIONS`, each starting at the beginning of a line ("Cause: ..."),
continued on lines indented by 4; lines indented by 8 are verbatim text (error
messages as they were printed). `Upstream:` cites a https://github.com/ thread; `Fidelity:` says what is
faithful and what is synthetic.

A case still being written fails the contract loudly, never passes quietly: `python -m harness new <name>`
(harness/scaffold.py) writes every part as a placeholder, and `contract_problems` names each one left: a
docstring title or section, `compiled_unit` or a line of the yaml that still says `TODO`, a function that still
raises `NotImplementedError`, empty `symptoms`, `bad_fixes` or `triage_signs` (no failure sign).
"""

from __future__ import annotations

import dis
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FunctionType, ModuleType

import yaml

from harness.symptoms import (  # noqa: F401 - the contract's symptom types: cases import them from here
    AnySymptom,
    Growth,
    Slow,
    Symptom,
    Versions,
    Warns,
    WrongResult,
    symptom_on,
)

ROOT = Path(__file__).resolve().parent.parent
CASES_DIR = ROOT / "cases"
CASE_CONFIG_DIR = ROOT / "conf" / "case"
DEVICES = ("cpu", "cuda")
REQUIRED_NAMES = ("symptoms", "triage_signs", "compiled_unit", "make_inputs", "buggy", "fixed", "reference", "bad_fixes", "speed_baseline")
REQUIRED_SECTIONS = ("Upstream", "Fidelity", "Symptom on CUDA", "Symptom on CPU", "Cause", "Fix")
_SECTION_START = re.compile(r"^([A-Z][A-Za-z ]*?):(?:\s+|$)(.*)$")


@dataclass(frozen=True)
class CaseText:
    title: str
    sections: dict[str, str]


def case_names() -> list[str]:
    return sorted(path.stem for path in CASES_DIR.glob("*.py") if not path.name.startswith("_"))


def fork_server_modules(compiling: bool = False) -> list[str]:
    """What the fork server imports before its first child: the phases, for a run that compiles the compiler
    (`harness.preload_compiler`), then every case that imports on this torch and its `preload` (`harness.preload`)."""
    compiler = ["harness.preload_compiler"] if compiling else []
    return ["harness.phases", *compiler, "harness.preload"]


def config_names() -> list[str]:
    return sorted(path.stem for path in CASE_CONFIG_DIR.glob("*.yaml"))


def load_case(name: str) -> ModuleType:
    if name not in case_names():
        raise LookupError(f"no case named {name!r}; cases: {', '.join(case_names())}")
    return importlib.import_module(f"cases.{name}")


def _right_on_problems(case: ModuleType) -> list[str]:
    """`bad_fixes_right_on` naming a bad fix the case lacks, or a torch range that does not parse."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    problems = []
    for name, releases in getattr(case, "bad_fixes_right_on", {}).items():
        if name not in getattr(case, "bad_fixes", {}):
            problems.append(f"`bad_fixes_right_on` names {name!r}, which is not in `bad_fixes`")
        try:
            SpecifierSet(releases)
        except InvalidSpecifier:
            problems.append(f"`bad_fixes_right_on[{name!r}]` is no torch version range: {releases!r}")
    return problems


def contract_problems(case: ModuleType) -> list[str]:
    """What `case` lacks of the contract above; empty when it is complete."""
    problems = [f"missing `{name}`" for name in REQUIRED_NAMES if not hasattr(case, name)]
    symptoms = getattr(case, "symptoms", {})
    problems += [f"no symptom for {device}" for device in DEVICES if device not in symptoms]
    if not getattr(case, "bad_fixes", None):
        problems.append("`bad_fixes` is empty")
    problems += _right_on_problems(case)
    budgets = _speed_budgets(case)
    if budgets and not getattr(case, "slow_fixes", None):
        problems.append(
            f"the yaml sets a speed budget ({', '.join(budgets)}) but `slow_fixes` is empty: nothing shows the speed verdict can fail"
        )
    memory_budgets = _budgets(case, "memory")
    if memory_budgets and not getattr(case, "memory_fixes", None):
        problems.append(
            f"the yaml sets a memory budget ({', '.join(memory_budgets)}) but `memory_fixes` is empty: nothing shows the memory verdict can fail"
        )
    if getattr(case, "slow_fixes", None) and hasattr(case, "speed_candidate") and not hasattr(case, "speed_reference"):
        problems.append("`slow_fixes` stand in for `speed_candidate`, so the case needs `speed_reference`")
    signs = getattr(case, "triage_signs", None)
    if signs is not None and not any(getattr(sign, "kind", None) == "failure" for sign in getattr(signs, "signs", ())):
        problems.append("`triage_signs` has no failure sign: `python -m harness.triage` cannot recognise the failure")
    if TODO in str(getattr(case, "compiled_unit", "")):
        problems.append("`compiled_unit` still says TODO: what a user of this code would torch.compile")
    problems += [f"`{name}` still raises NotImplementedError: write it" for name in _placeholder_functions(case)]
    problems += _yaml_placeholders(case)
    try:
        text = case_text(case)
    except ValueError as error:
        return problems + [str(error)]
    if TODO in text.title:
        problems.append("docstring title still says TODO: what goes wrong, in one line")
    problems += [f"docstring lacks section {section!r}" for section in REQUIRED_SECTIONS if section not in text.sections]
    problems += [
        f"docstring section {section!r} still says TODO" for section in REQUIRED_SECTIONS if TODO in text.sections.get(section, "")
    ]
    upstream, fidelity = text.sections.get("Upstream"), text.sections.get("Fidelity")
    if upstream is not None and "https://github.com/" not in upstream:
        problems.append("docstring section 'Upstream' cites no https://github.com/ thread")
    if fidelity is not None and not any(word in fidelity.lower() for word in ("faithful", "synthetic")):
        problems.append("docstring section 'Fidelity' says neither what is faithful nor what is synthetic")
    return problems


TODO = "TODO"  # the scaffold's placeholder (harness/scaffold.py): a case that still says it is unfinished
_CASE_FUNCTIONS = (
    "make_inputs",
    "buggy",
    "fixed",
    "reference",
    "speed_baseline",
    "speed_candidate",
    "speed_reference",
    "memory_baseline",
    "preload",
)
_CONTROLS = ("bad_fixes", "slow_fixes", "memory_fixes")


def _placeholder_functions(case: ModuleType) -> list[str]:
    """The case's functions (and its controls', as `bad_fixes[name]`) whose code raises NotImplementedError."""
    named = [(name, getattr(case, name)) for name in _CASE_FUNCTIONS if callable(getattr(case, name, None))]
    for controls in _CONTROLS:
        value = getattr(case, controls, None)
        if isinstance(value, dict):
            named += [(f"{controls}[{key!r}]", function) for key, function in value.items() if callable(function)]
    return [
        name for name, function in named if isinstance(function, FunctionType) and "NotImplementedError" in global_names(function.__code__)
    ]


def _yaml_placeholders(case: ModuleType) -> list[str]:
    """The lines of the case's yaml that still say TODO."""
    path = CASE_CONFIG_DIR / f"{case.__name__.rpartition('.')[2]}.yaml"
    if not path.exists():
        return []
    return [
        f"conf/case/{path.name} line {number} still says TODO: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if TODO in line
    ]


def _speed_budgets(case: ModuleType) -> list[str]:
    """The devices the case's yaml sets a speed budget for."""
    return _budgets(case, "speed")


def _budgets(case: ModuleType, section: str) -> list[str]:
    """The devices the case's yaml sets a budget for in `section` (speed, memory)."""
    path = CASE_CONFIG_DIR / f"{case.__name__.rpartition('.')[2]}.yaml"
    if not path.exists():
        return []
    budget = (yaml.safe_load(path.read_text()).get(section) or {}).get("budget") or {}
    return sorted(device for device, value in budget.items() if value is not None)


def case_text(case: ModuleType) -> CaseText:
    """The title and the named sections of a case's docstring."""
    doc = (case.__doc__ or "").strip()
    if not doc:
        raise ValueError(f"{case.__name__} has no docstring")
    title, _, body = doc.partition("\n")
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in body.splitlines():
        start = _SECTION_START.match(line)
        if start:
            current = sections.setdefault(start.group(1), [])
            if start.group(2):
                current.append(start.group(2))
        elif current is not None:
            current.append(line)
    return CaseText(title.strip(), {name: _paragraphs(lines) for name, lines in sections.items()})


def _paragraphs(lines: list[str]) -> str:
    """Join wrapped prose into one line per paragraph; lines indented 8 or more are verbatim."""
    out: list[str] = []
    prose: list[str] = []
    for line in lines + [""]:
        if line.startswith(" " * 8) or not line.strip():
            if prose:
                out.append(" ".join(prose))
                prose = []
            if line.strip():
                out.append("    " + line.strip())
        else:
            prose.append(line.strip())
    return "\n".join(out)


def reachable(case: ModuleType, roots: list[FunctionType], through_classes: bool = False) -> set[FunctionType]:
    """`roots` and the functions of `case` they call by global name, transitively; `through_classes`: through the
    methods of the case's classes they name too (what running them may call)."""
    seen: set[FunctionType] = set()
    todo = list(roots)
    while todo:
        function = todo.pop()
        if function in seen:
            continue
        seen.add(function)
        for name in global_names(function.__code__):
            value = vars(case).get(name)
            if isinstance(value, FunctionType) and value.__module__ == case.__name__:
                todo.append(value)
            elif through_classes and isinstance(value, type) and value.__module__ == case.__name__:
                todo += _methods(value, case)
    return seen


def _methods(cls: type, case: ModuleType) -> list[FunctionType]:
    """The functions a class of the case defines, its bases' from the case too (a Dataset whose __getitem__ calls a
    helper: code that uses the class uses the helper)."""
    found = []
    for klass in cls.__mro__:
        if klass.__module__ != case.__name__:
            continue
        for member in vars(klass).values():
            member = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(member, FunctionType):
                found.append(member)
    return found


def global_names(code: CodeType) -> list[str]:
    """Global names a function's code reads, nested lambdas and comprehensions included, in order."""
    names: list[str] = []
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and instruction.argval not in names:
            names.append(instruction.argval)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names += [name for name in global_names(constant) if name not in names]
    return names
