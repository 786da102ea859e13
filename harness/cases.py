"""What a case is, and how the harness finds them.

A case is one module in `cases/` plus one yaml in `conf/case/` with the same
name. The module provides plain names, no base class:

    symptoms         {"cpu": Symptom(...), "cuda": Symptom(...)}: the failure expected per device
    make_inputs      (cfg, device) -> inputs, deterministic from cfg.seed
    buggy            inputs -> output: the upstream code, which fails
    fixed            inputs -> output: the fix
    reference        inputs -> output: the intended result, computed independently of `fixed`
    bad_fixes        {name: inputs -> output}: plausible fixes that the harness must reject
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
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:  # an annotation only: the case contract does not depend on the process layer
    from harness.process.isolate import Failure

ROOT = Path(__file__).resolve().parent.parent
CASES_DIR = ROOT / "cases"
CASE_CONFIG_DIR = ROOT / "conf" / "case"
DEVICES = ("cpu", "cuda")
REQUIRED_NAMES = ("symptoms", "triage_signs", "compiled_unit", "make_inputs", "buggy", "fixed", "reference", "bad_fixes", "speed_baseline")
REQUIRED_SECTIONS = ("Upstream", "Fidelity", "Symptom on CUDA", "Symptom on CPU", "Cause", "Fix")
_SECTION_START = re.compile(r"^([A-Z][A-Za-z ]*?):(?:\s+|$)(.*)$")


def _between(appears_in: str | None, fixed_in: str | None, torch_version: str) -> bool:
    from torch.torch_version import TorchVersion  # here, not at the top: `python -m harness` imports this module before torch

    version = TorchVersion(torch_version)
    return (appears_in is None or version >= appears_in) and (fixed_in is None or version < fixed_in)


def _range_text(appears_in: str | None, fixed_in: str | None) -> str:
    if appears_in and fixed_in:
        return f"from torch {appears_in} until {fixed_in}"
    return f"from torch {appears_in} on" if appears_in else (f"before torch {fixed_in}" if fixed_in else "on every torch")


class _Ranged:
    """A symptom holds from torch `appears_in` (a release whose change made this code fail) until `fixed_in` (one
    that made it valid again), and under the compile modes in `modes` (None: every mode; ("off",): eager only, where
    compiling makes the code valid, e.g. dynamo rewriting a reentrant checkpoint); elsewhere the buggy code is
    expected to run clean. Each found by running it."""

    appears_in: str | None
    fixed_in: str | None
    modes: tuple[str, ...] | None

    def expected_on(self, torch_version: str) -> bool:
        """Whether the buggy code is expected to fail this way on this torch version."""
        return _between(self.appears_in, self.fixed_in, torch_version)

    def holds(self, torch_version: str, mode: str) -> bool:
        """Whether the failure is expected on this torch version under this compile mode."""
        return self.expected_on(torch_version) and (self.modes is None or mode in self.modes)

    def range_text(self) -> str:
        return _range_text(self.appears_in, self.fixed_in)

    def clean_status(self, torch_version: str) -> str:
        """The reproduce status of a clean run outside the range: `clean_before` the failure appears, `fixed_upstream` after."""
        from torch.torch_version import TorchVersion

        return "clean_before" if self.appears_in and TorchVersion(torch_version) < self.appears_in else "fixed_upstream"

    def clean_status_under(self, torch_version: str, mode: str) -> str:
        """As `clean_status`, or `clean_compiled` where the torch version holds the failure and the compile mode does not."""
        return (
            "clean_compiled"
            if self.expected_on(torch_version) and not self.holds(torch_version, mode)
            else self.clean_status(torch_version)
        )


@dataclass(frozen=True)
class Symptom(_Ranged):
    """How a failure looks on one device.

    `exception` is a class name that must appear in the raised exception's MRO
    (so "RuntimeError" also accepts torch's newer AcceleratorError); `message` is
    a regex searched in the exception text; `output`, when set, is a regex
    searched in what the process printed (CUDA prints device-side assertions
    there, not in the exception). `fixed_in` and `appears_in` as `_Ranged` says.
    """

    exception: str
    message: str
    output: str | None = None
    fixed_in: str | None = None  # torch version from which this code no longer fails (found by running it)
    appears_in: str | None = None  # torch version from which it fails
    modes: tuple[str, ...] | None = None  # compile modes it shows under (None: all)

    def mismatches(self, failure: Failure, output: str) -> list[str]:
        """Why `failure` is not this symptom; empty when it is."""
        problems = []
        if self.exception not in failure.types:
            problems.append(f"expected {self.exception}, got {failure.types[0]}")
        if not re.search(self.message, failure.message):
            problems.append(f"message does not match /{self.message}/")
        if self.output and not re.search(self.output, output):
            problems.append(f"output does not match /{self.output}/")
        return problems


@dataclass(frozen=True)
class Growth(_Ranged):
    """A failure that is memory growing step after step until the device runs out (no error where it is measured).

    The reproduce phase runs `buggy` for `memory.steps` steps on one inputs object (harness/measure/footprint.py) and
    expects the lower bound of its retained memory's slope to be at least `at_least` x the baseline's peak
    per step. `oom` is the text a real run ends with on that device (e.g. "CUDA out of memory"), for the
    record and triage: the growth is measured, an OOM is never waited for. `fixed_in` as for `Symptom`.
    """

    at_least: float
    oom: str | None = None
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class WrongResult(_Ranged):
    """A failure that raises nothing: `buggy` returns, and its output (values, gradients, parameters after a step, a
    loaded state dict: harness/measure/compare.py's `training_outputs`) differs from `reference` beyond the case's tolerance.

    `warning`, when set, is a regex searched in the warnings the buggy call issued ("Category: message", as
    `warnings` formats them): the one sign a user sees (`Using a target size ... that is different to the input
    size`); the reproduce record keeps every warning verbatim either way.
    """

    warning: str | None = None
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Warns(_Ranged):
    """The buggy code runs and its result is right, but torch warns of what a later release will refuse (a
    FutureWarning before the default changes): `warning` is a regex searched in "Category: message"."""

    warning: str
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Slow(_Ranged):
    """A failure that is time: `buggy` returns the reference's output (within the case's tolerance) and takes more
    than `at_least` x the time of `baseline` (a case function, `fixed` by default) on the speed inputs, judged as the
    speed phase judges a fix: reproduced when the ratio's interval lies above `at_least`, never on a point ratio.
    `log`, when set, is a regex searched in what torch warned or logged during the buggy call ("torch._dynamo hit
    config.recompile_limit"); the record keeps those lines verbatim and the graphs dynamo compiled. `calls`: how many
    calls the reproduce child makes on one inputs object (the first one's output is compared with the reference),
    where what explains the time shows only after several (the limit is hit at the ninth new shape)."""

    at_least: float
    log: str | None = None
    baseline: str = "fixed"
    calls: int = 1
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


AnySymptom = Symptom | Growth | WrongResult | Warns | Slow


class Versions:
    """A failure that changes across torch releases: each symptom holds over its own range (`appears_in`,
    `fixed_in`), e.g. silence, then a FutureWarning from 2.4, then an error from 2.6. Outside every range
    the buggy code is expected to run clean; `on` picks the symptom for a torch version."""

    def __init__(self, *symptoms: AnySymptom) -> None:
        if not symptoms:
            raise ValueError("Versions needs at least one symptom")
        self.symptoms = symptoms

    def on(self, torch_version: str) -> AnySymptom | None:
        return next((symptom for symptom in self.symptoms if symptom.expected_on(torch_version)), None)

    def expected_on(self, torch_version: str) -> bool:
        return self.on(torch_version) is not None

    def range_text(self) -> str:
        return "; ".join(f"{type(symptom).__name__} {symptom.range_text()}" for symptom in self.symptoms)

    def __repr__(self) -> str:
        return f"Versions{self.symptoms!r}"


def symptom_on(symptom: AnySymptom | Versions, torch_version: str) -> AnySymptom:
    """The symptom to judge a run on this torch version by: a `Versions`' member for it, else (none applies,
    so a clean run is expected) the member nearest in time, whose `expected_on` then says False."""
    if not isinstance(symptom, Versions):
        return symptom
    chosen = symptom.on(torch_version)
    if chosen is not None:
        return chosen
    from torch.torch_version import TorchVersion

    before = [s for s in symptom.symptoms if s.appears_in and TorchVersion(torch_version) < s.appears_in]
    return min(before, key=lambda s: TorchVersion(s.appears_in)) if before else symptom.symptoms[-1]


@dataclass(frozen=True)
class CaseText:
    title: str
    sections: dict[str, str]


def case_names() -> list[str]:
    return sorted(path.stem for path in CASES_DIR.glob("*.py") if not path.name.startswith("_"))


def fork_server_modules(compiling: bool = False) -> list[str]:
    """What the fork server imports before its first child: the phases, every case, for a run that compiles the
    compiler (`harness.preload_compiler`), then each case's `preload`."""
    compiler = ["harness.preload_compiler"] if compiling else []
    return ["harness.phases", *(f"cases.{name}" for name in case_names()), *compiler, "harness.preload"]


def config_names() -> list[str]:
    return sorted(path.stem for path in CASE_CONFIG_DIR.glob("*.yaml"))


def load_case(name: str) -> ModuleType:
    if name not in case_names():
        raise LookupError(f"no case named {name!r}; cases: {', '.join(case_names())}")
    return importlib.import_module(f"cases.{name}")


def contract_problems(case: ModuleType) -> list[str]:
    """What `case` lacks of the contract above; empty when it is complete."""
    problems = [f"missing `{name}`" for name in REQUIRED_NAMES if not hasattr(case, name)]
    symptoms = getattr(case, "symptoms", {})
    problems += [f"no symptom for {device}" for device in DEVICES if device not in symptoms]
    if not getattr(case, "bad_fixes", None):
        problems.append("`bad_fixes` is empty")
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
