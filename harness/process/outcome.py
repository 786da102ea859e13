"""What a child sends back, and how the parent reads it: `ChildResult`, and `Failure` for an exception raised there.

The child may run code nobody reviewed (a fix submitted for grading), which could write any pickle
to the result file: the parent unpickles only plain data (`PLAIN_GLOBALS`: no class but `Failure`,
so no `__reduce__` runs code in the parent). Tensors travel as `torch.save` bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

PLAIN_GLOBALS = {
    ("harness.process.outcome", "Failure"),
    ("builtins", "complex"),
    ("torch.torch_version", "TorchVersion"),
}  # TorchVersion: a str  # besides None, bool, int, float, complex, str, bytes, tuple, list, dict, set


@dataclass(frozen=True)
class Failure:
    """An exception raised in the child, described in plain data so it survives pickling."""

    types: tuple[str, ...]  # the exception's class then its bases, e.g. ("AcceleratorError", "RuntimeError", ...)
    message: str
    where: str  # innermost frame: "file.py:123 in function"
    traceback: str
    figures: dict[str, Any] = field(default_factory=dict)  # an exception's own `figures` dict, if it carries one
    modules: tuple[str, ...] = ()  # the module of each of `types`: tells the compiler's own errors apart (harness/compiled.py)

    @classmethod
    def from_exception(cls, error: BaseException) -> Failure:
        frames = traceback.extract_tb(error.__traceback__)
        where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        return cls(
            types=tuple(t.__name__ for t in type(error).__mro__ if t is not object),
            message=str(error),
            where=where,
            traceback="".join(traceback.format_exception(error)),
            figures=_plain(getattr(error, "figures", None)),
            modules=tuple(t.__module__ for t in type(error).__mro__ if t is not object),
        )

    @property
    def headline(self) -> str:
        """The class and the first line of the message that says something (not a blank or a row of '=')."""
        first_line = next((line.strip() for line in self.message.splitlines() if any(c.isalnum() for c in line)), "")
        return f"{self.types[0]}: {first_line}"


@dataclass
class ChildResult:
    status: Literal["returned", "raised", "signalled", "exited", "timeout", "limit"]
    seconds: float
    value: Any = None
    failure: Failure | None = None
    signal: str | None = None  # e.g. "SIGSEGV" when status == "signalled"
    exit_code: int | None = None  # when status == "exited" (the child left without a result)
    output: str = field(default="", repr=False)  # tail of the child's stdout and stderr
    talk: Any = None  # what the parent's side of a conversation with the child returned (`run_isolated(talk=...)`)
    left_behind: list[str] = field(default_factory=list)  # processes the child left running, killed after it
    refused_writes: list[str] = field(
        default_factory=list
    )  # what a confined child was refused: writes outside its scratch directory, signals to processes not its own
    confinement: str | None = None  # how a confined child was held ("landlock ABI 7; limits ..."), as it reported
    limit: str | None = None  # the limit a confined child broke, when status == "limit"
    lost_server: str | None = None  # "killed" or "stopped": what the child did to its parent, the fork server

    @property
    def summary(self) -> str:
        if self.status == "returned":
            return "returned"
        if self.status == "raised":
            return f"raised {self.failure.headline}"
        if self.status == "signalled":
            return f"killed by {self.signal}"
        if self.status == "timeout":
            return f"timed out after {self.seconds:.1f} s"
        if self.status == "limit":
            return f"killed: {self.limit}"
        if self.lost_server:
            return f"{self.lost_server} its parent process, the harness's fork server"
        return f"exited with code {self.exit_code} without a result"


class NotPlainData(pickle.UnpicklingError):
    """A child's result named a class or function: refused unread."""


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in PLAIN_GLOBALS:
            return super().find_class(module, name)
        raise NotPlainData(f"the child's result holds {module}.{name}, not plain data (return plain values; tensors as torch.save bytes)")


def _plain(figures: Any) -> dict[str, Any]:
    """Keep only what pickles and serialises as JSON: an exception may carry anything."""
    if not isinstance(figures, dict):
        return {}
    try:
        return json.loads(json.dumps(figures, default=str))
    except (TypeError, ValueError):
        return {}
