"""A case's notebook: set up, watch the failure, read the error, apply the fix, check it, time it.

Generated from the case module (harness.teach writes it to docs/cases/<name>.ipynb) and
committed without outputs, with fixed cell ids, so the same case always gives the same file.
The notebook calls the case's own functions and the harness's own phases: it picks CUDA when
present, and runs the case code in child processes, as the harness does: on CUDA the buggy code
poisons the context of its process, and a kernel cannot host torch elastic's ranks reliably
(a forked rank fails to redirect the kernel's stdout now and then).
"""

from __future__ import annotations

import nbformat
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from harness.cases import CASE_CONFIG_DIR, CaseText, case_text, load_case
from harness.teach.source import buggy_to_fixed_diff, functions_used, section_markdown, source_of
from harness.teach.summary import summary

KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}

SET_UP = """\
# Set up. From a clone: python3 -m venv .venv && .venv/bin/pip install torch -e '.[teach]', then open this
# notebook with that environment's Jupyter. On a hosted notebook (Colab and the like): clone the repository,
# `pip install -e '.[teach]'` in it, and open docs/cases/CASE_NAME.ipynb from the clone.
import sys
from pathlib import Path

ROOT = next((folder for folder in [Path.cwd(), *Path.cwd().parents] if (folder / "harness" / "cases.py").is_file()), None)
if ROOT is None:
    raise SystemExit("run this notebook from inside a clone of torch-error-cases (docs/cases/ or below the clone)")
sys.path.insert(0, str(ROOT))

import torch
from omegaconf import OmegaConf

from harness.cases import load_case
from harness.phases import RunSpec, start_children

START_CHILDREN
case = load_case("CASE_NAME")
cfg = OmegaConf.load(ROOT / "conf" / "case" / "CASE_NAME.yaml")  # sizes, tolerance and speed budget of the case
device = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU you see the device-side assert for real
spec = RunSpec(case="CASE_NAME", device=device, timeout_s=300, case_cfg=cfg)  # what a phase runs on
print(f"torch {torch.__version__}, running on {device}")
"""

START_CHILDREN = {  # section 6 compiles live, or reads the records
    True: "start_children(compiling=True)  # the phases' children fork from a server that imported torch, the cases and the compiler",
    False: "start_children()  # the phases' children fork from a server that imported torch and the cases",
}

FAILURE = """\
from harness.phases import reproduce

seen = reproduce(case, spec)  # runs `case.buggy` in a child process, with a time limit
print(f"{seen.status}: {seen.message}")
for key in ("raised_at", "output_line", "unrelated_op_after_error"):
    if seen.figures.get(key):
        print(f"  {key.replace('_', ' ')}: {seen.figures[key]}")
printed = seen.output_tail.strip().splitlines()
if printed:
    print(f"\\nwhat the child printed (last {min(len(printed), 25)} of {len(printed)} lines):")
    print("\\n".join(line[:300] for line in printed[-25:]))
"""

TRACEBACK = """\
import traceback

inputs = case.make_inputs(cfg, device)
if device == "cpu":
    try:
        case.buggy(inputs)
    except Exception:
        traceback.print_exc(limit=-4)  # the innermost frames: where the error was raised
    else:
        where = {"wrong_result": "what it returned", "warned": "what it warned", "slow": "its time, against the fix's"}.get(seen.status)
        print(f"the buggy code ran without error on torch {torch.__version__}" + (f": its failure is in {where} (above)" if where else ""))
else:
    # Here the kernel would report asynchronously and poison this process: read the record above instead.
    print("raised at:", seen.figures.get("raised_at"), "| device assertion:", seen.figures.get("output_line"))
"""

FIX = """\
from harness.phases import fix

ran = fix(case, spec)  # `case.fixed` on the same inputs, in a child process like the buggy code
print(f"{ran.status}: {ran.message}")
"""

CHECK = """\
from harness.phases import bad_fix, correct

checked = correct(case, spec)  # `case.fixed` against `case.reference`, in a child process
print(f"fix vs reference: {'match' if checked.ok else 'MISMATCH'}, {checked.message}")
assert checked.ok, checked.message

for name in case.bad_fixes:  # each in a child process: on CUDA a bad fix may trip a device-side assert
    verdict = bad_fix(name, case, spec)
    print(f"bad fix {name}: {verdict.status}, {verdict.message[:200]}")
"""

COMPILED = """\
import dataclasses

from harness.compiled import case_config

# the harness hands every phase the mode in its spec, and each child the mode in the case config
compiled = dataclasses.replace(spec, compile="inductor", case_cfg=case_config(cfg, "inductor"))
seen_compiled = reproduce(case, compiled)  # the buggy code under torch.compile, in a child: it may die natively
print(f"eager:    {seen.status}: {seen.message}")
print(f"inductor: {seen_compiled.status}: {seen_compiled.message}")
for line in seen_compiled.figures.get("native_message", []):
    print("   ", line)
ran_compiled = fix(case, compiled)
print(f"the fix compiled: {ran_compiled.status}, one graph: {ran_compiled.figures.get('fullgraph')}, compile {ran_compiled.figures.get('compile_s')} s")
"""

RECORDED_COMPILED = """\
import json

# Compiling this case's unit cold takes over 45 s (the case yaml's `notebook.compiled` says how long and why), more than a
# notebook cell should: this cell reads the harness's recorded inductor run instead. Run it live with
#     python -m harness case=CASE_NAME compile=inductor
records = sorted(ROOT.glob("results/matrix/cpu/torch-*/inductor/CASE_NAME/*.json"))
mine = [path for path in records if f"torch-{torch.__version__.split('+')[0]}/" in str(path)]
if not records:
    print("no recorded inductor run of this case in results/matrix; run the command above")
else:
    path = (mine or records)[-1]
    record = json.loads(path.read_text())
    print(f"recorded: {path.relative_to(ROOT)}")
    for phase in record["phases"]:
        print(f"  {phase['phase']}: {phase['status']}: {' '.join(phase['message'].split())[:160]}")
"""

TIMING = """\
import torch.utils.benchmark as benchmark

from harness.phases import speed_config

speed_inputs = case.make_inputs(speed_config(cfg, device), device)  # the sizes the budget is set for, on this device
candidate = getattr(case, "speed_candidate", case.fixed)
medians = {}
for label, function in (("fix", candidate), ("baseline", case.speed_baseline)):
    timer = benchmark.Timer(stmt="function(inputs)", globals={"function": function, "inputs": speed_inputs})  # 1 thread, synchronises CUDA
    medians[label] = timer.blocked_autorange(min_run_time=0.3).median
ratio = medians["fix"] / medians["baseline"]
budget = OmegaConf.select(cfg, f"speed.budget.{device}")
budget_text = f"{budget}x" if budget is not None else "none"
print(f"fix {medians['fix'] * 1e3:.3f} ms, baseline {medians['baseline'] * 1e3:.3f} ms: {ratio:.2f}x "
      f"(the case's budget on {device}: {budget_text}; a few runs here are a glimpse, the harness's speed phase is the verdict)")
"""


def notebook(name: str) -> str:
    """The notebook of case `name`, as the JSON text to write."""
    case = load_case(name)
    text = case_text(case)
    story = _story(name, text)
    live = _compiles_in_a_cell(name)
    cells = [
        new_markdown_cell("\n".join(story)),
        new_code_cell(SET_UP.replace("CASE_NAME", name).replace("START_CHILDREN", START_CHILDREN[live])),
        new_markdown_cell(
            "## 1. The failure\n\nThe buggy code, as upstream wrote it:\n\n```python\n"
            + source_of(case, functions_used(case, "buggy"))
            + "```\n\nIt runs in a child process, as the harness's reproduce phase runs it: on CUDA a device-side assert "
            "poisons the CUDA context of the whole process, and this kernel must survive to run the fix."
        ),
        new_code_cell(FAILURE),
        new_markdown_cell(
            "## 2. Read the error\n\nWhat upstream saw on CUDA:\n\n"
            + section_markdown(text.sections["Symptom on CUDA"])
            + "\n\nOn CPU:\n\n"
            + section_markdown(text.sections["Symptom on CPU"])
            + "\n\nOn CPU the error is raised where it happens; the traceback's last frames point at the line:"
        ),
        new_code_cell(TRACEBACK),
        new_markdown_cell("**Cause:** " + section_markdown(text.sections["Cause"])),
        new_markdown_cell(
            "## 3. The fix\n\n" + section_markdown(text.sections["Fix"]) + "\n\n```diff\n" + buggy_to_fixed_diff(case) + "```"
        ),
        new_code_cell(FIX),
        new_markdown_cell(
            "## 4. The check\n\nThe fix must equal a reference computed independently of it (integers exactly, floats within "
            "the case's tolerance), and every wrong fix the case lists (from the threads, or a generic attempt) must be rejected."
        ),
        new_code_cell(CHECK),
        new_markdown_cell(
            "## 5. The timing\n\nThe fix against its baseline, a few runs each with `torch.utils.benchmark` (no verdict here)."
        ),
        new_code_cell(TIMING),
        new_markdown_cell(
            "## 6. Under torch.compile\n\nMost training code runs compiled, and compiled code fails differently: a generated kernel "
            f"may abort the process where eager raises, or return garbage. What a user compiles here: {case.compiled_unit}. "
            + (
                "The first run compiles (under 45 s cold on two cores); the kernels are cached for the next."
                if live
                else "Compiling this unit cold takes 45 s or more, so the cell below reads the harness's recorded inductor run."
            )
        ),
        new_code_cell(COMPILED if live else RECORDED_COMPILED.replace("CASE_NAME", name)),
    ]
    for index, cell in enumerate(cells):
        cell["id"] = f"{name.replace('_', '-')}-{index}"  # fixed ids: nbformat would draw random ones
    book = new_notebook(cells=cells, metadata={"kernelspec": KERNEL, "language_info": {"name": "python"}})
    nbformat.validate(book)
    return nbformat.writes(book) + "\n"


def _story(name: str, text: CaseText) -> list[str]:
    """The notebook's first cell: the title, what a user sees, why and the fix, and where the case comes from."""
    short = summary(name, yaml.safe_load((CASE_CONFIG_DIR / f"{name}.yaml").read_text()))
    story = [
        f"# {name}: {short.title}",
        "",
        f"Generated by `python -m harness.teach` from `cases/{name}.py` and its yaml: edit those, not this notebook. "
        f"The page [{name}.md]({name}.md) has the records and figures.",
        "",
    ]
    story += [f"> **You see:** {short.see}", ">", f"> **Why:** {short.why}", ">", f"> **Fix:** {short.fix}", ""]
    story += [
        "**Upstream:** " + section_markdown(text.sections["Upstream"]),
        "",
        "**Fidelity:** " + section_markdown(text.sections["Fidelity"]),
    ]
    return story


def _compiles_in_a_cell(name: str) -> bool:
    """Whether section 6 compiles live: not where the case yaml says `notebook: {compiled: records}` (a unit whose
    compile cold takes over 45 s), where the cell reads the recorded inductor run instead."""
    settings = yaml.safe_load((CASE_CONFIG_DIR / f"{name}.yaml").read_text()).get("notebook") or {}
    return settings.get("compiled", "live") != "records"
