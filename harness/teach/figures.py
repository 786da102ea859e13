"""The figures of a case's teaching page, as PNG bytes, from its result records.

Same records and same matplotlib -> the same pixels. The PNG keeps matplotlib's own `Software`
tag ("Matplotlib version3.x.y, ...") and nothing else that varies (no date): `same_figure` compares
pixels when both files come from the same matplotlib, and only the image size otherwise, since
another matplotlib (or its freetype) may place the same text a pixel apart. The data behind each
figure is also printed in the page as a table, so the page's exact sync covers it.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from packaging.version import Version  # noqa: E402

from harness.statuses import Speed

WIDTH_IN, DPI = 8.0, 100  # 800 px: GitHub shows it at about its natural size in a page
DEVICE_COLOURS = {"cpu": "#1f77b4", "cuda": "#d95f02"}
STATUS_MARKERS = {Speed.WITHIN_BUDGET: "o", Speed.MEASURED: "o", Speed.OVER_BUDGET: "X", Speed.INCONCLUSIVE: "s"}


@dataclass(frozen=True)
class SpeedPoint:
    device: str
    torch: str
    status: str
    ratio: float
    ratio_low: float | None  # the interval, when the speed verdict has one
    ratio_high: float | None
    budget: float | None
    level: float | None = None  # of the interval, e.g. 0.95


@dataclass(frozen=True)
class BadFixError:
    name: str
    relative_error: float
    snr_db: float | None


def speed_figure(case: str, points: list[SpeedPoint], budgets: dict[str, float]) -> bytes:
    """The fix's time over its baseline's per torch version and device, against each device's budget."""
    versions = sorted({point.torch for point in points}, key=Version)
    devices = sorted({point.device for point in points})
    offsets = {device: (index - (len(devices) - 1) / 2) * 0.12 for index, device in enumerate(devices)}
    with plt.style.context("default"):
        figure, axes = plt.subplots(figsize=(WIDTH_IN, 4.4), dpi=DPI)
        for device in devices:
            mine = [point for point in points if point.device == device]
            colour = DEVICE_COLOURS.get(device, "black")
            for status in sorted({point.status for point in mine}):
                chosen = [point for point in mine if point.status == status]
                xs = [versions.index(point.torch) + offsets[device] for point in chosen]
                ys = [point.ratio for point in chosen]
                label = f"{device.upper()}, {status.replace('_', ' ')}"
                axes.scatter(xs, ys, color=colour, marker=STATUS_MARKERS.get(status, "D"), s=55, zorder=3, label=label)
                for x, point in zip(xs, chosen):
                    axes.annotate(
                        f"{point.ratio:.2f}x", (x, point.ratio), textcoords="offset points", xytext=(7, 4), fontsize=9, color=colour
                    )
            with_interval = [point for point in mine if point.ratio_low is not None and point.ratio_high is not None]
            if with_interval:
                xs = [versions.index(point.torch) + offsets[device] for point in with_interval]
                ys = [point.ratio for point in with_interval]
                spread = [
                    [point.ratio - point.ratio_low for point in with_interval],
                    [point.ratio_high - point.ratio for point in with_interval],
                ]
                label = f"{device.upper()}, confidence interval"
                axes.errorbar(xs, ys, yerr=spread, fmt="none", ecolor=colour, elinewidth=1.5, capsize=4, zorder=2, label=label)
            if device in budgets:
                axes.axhline(
                    budgets[device], color=colour, linestyle="--", linewidth=1.3, label=f"{device.upper()} budget {budgets[device]:g}x"
                )
        axes.axhline(1.0, color="grey", linewidth=0.8, linestyle=":", label="as fast as the baseline (1x)")
        top = max(
            [point.ratio_high or point.ratio for point in points] + [budgets[device] for device in devices if device in budgets] + [1.0]
        )
        axes.set_ylim(0, top * 1.18)
        axes.set_xlim(-0.6, max(len(versions), 1) - 0.4)
        axes.set_xticks(range(len(versions)), versions, fontsize=10)
        missing = [device.upper() for device in ("cpu", "cuda") if device not in devices]
        axes.set_xlabel("torch version" + (f"  ({', '.join(missing)}: not yet run)" if missing else ""))
        axes.set_ylabel("fix time / baseline time (x)")
        axes.set_title(f"{case}: time of the fix over its baseline (lower is faster)", fontsize=11)
        axes.grid(axis="y", alpha=0.3)
        axes.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
        return _png(figure)


@dataclass(frozen=True)
class MemorySeries:
    label: str  # "buggy", "fixed", "baseline", or "memory control <name>"
    retained: list[float]  # bytes above the level before the first measured step, after each step
    peak: list[float]  # the highest during each step, above the same level
    slope: float  # bytes per step (least squares)


MEMORY_COLOURS = {"buggy": "#d62728", "fixed": "#2ca02c", "baseline": "#7f7f7f"}


def memory_figure(case: str, series: list[MemorySeries], where: str) -> bytes:
    """Memory per step: retained after each step (solid) and the peak during it (dashed), buggy / fixed / controls."""
    mib = float(1 << 20)
    controls = iter(["#9467bd", "#8c564b", "#e377c2", "#17becf"])
    with plt.style.context("default"):
        figure, axes = plt.subplots(figsize=(WIDTH_IN, 4.4), dpi=DPI)
        for one in series:
            colour = MEMORY_COLOURS.get(one.label) or next(controls, "black")
            steps = range(1, len(one.retained) + 1)
            width, layer = (4.0, 2) if one.label == "buggy" else (1.4, 3)  # buggy wide and behind: a control on its line still shows it
            axes.plot(
                steps,
                [value / mib for value in one.retained],
                color=colour,
                marker="o",
                markersize=4,
                linewidth=width,
                zorder=layer,
                label=f"{one.label}: retained, {one.slope / mib:+.2f} MiB/step",
            )
            axes.plot(steps, [value / mib for value in one.peak], color=colour, linestyle="--", linewidth=1.0, label=f"{one.label}: peak")
        axes.set_xlabel("step (calls on one inputs object)")
        axes.set_ylabel("MiB above the level before step 1")
        axes.set_title(f"{case}: memory per step ({where})", fontsize=11)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        return _png(figure)


def bad_fix_figure(case: str, errors: list[BadFixError], where: str) -> bytes:
    """How far each bad fix that returns moves the output from the reference (relative error); an infinite one (NaN or
    inf in the output) is drawn hatched past the finite ones and labelled inf."""
    with plt.style.context("default"):
        figure, axes = plt.subplots(figsize=(WIDTH_IN, 0.9 + 0.55 * len(errors)), dpi=DPI)
        names = [error.name for error in errors]
        top = max((error.relative_error for error in errors if np.isfinite(error.relative_error)), default=1.0) or 1.0
        values = [error.relative_error if np.isfinite(error.relative_error) else top * 1.3 for error in errors]
        hatches = [None if np.isfinite(error.relative_error) else "//" for error in errors]
        axes.barh(range(len(errors)), values, color="#7570b3", height=0.55, hatch=hatches)
        for index, error in enumerate(errors):
            snr = f", SNR {error.snr_db:.1f} dB" if error.snr_db is not None and np.isfinite(error.snr_db) else ""
            axes.annotate(
                f"{error.relative_error:.3g}{snr}" if np.isfinite(error.relative_error) else "inf (NaN or inf in the output)",
                (values[index], index),
                textcoords="offset points",
                xytext=(5, 0),
                va="center",
                fontsize=9,
            )
        axes.set_yticks(range(len(errors)), names, fontsize=9)
        axes.invert_yaxis()
        axes.set_xlim(0, (max(values) or 1.0) * 1.45)  # every error 0: a bar-less axis, not a singular one
        axes.set_xlabel("relative error: ||bad fix - reference|| / ||reference||  (1 = as large as the output)")
        axes.set_title(f"{case}: how far each bad fix moves the output ({where})", fontsize=11)
        axes.grid(axis="x", alpha=0.3)
        return _png(figure)


def _png(figure) -> bytes:
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)  # matplotlib writes no date into a PNG; Software names its version
    plt.close(figure)
    return buffer.getvalue()


def same_figure(committed: bytes, generated: bytes) -> tuple[bool, str]:
    """Whether a committed PNG is still the generated one, and how that was judged."""
    if committed == generated:
        return True, "identical bytes"
    if _software(committed) != _software(generated):
        same = _size(committed) == _size(generated)
        return same, f"made by {_software(committed)!r}, here {_software(generated)!r}: compared the image size only"
    same = np.array_equal(matplotlib.image.imread(io.BytesIO(committed)), matplotlib.image.imread(io.BytesIO(generated)))
    return same, "compared the pixels"


def _software(png: bytes) -> str | None:
    """The PNG's tEXt "Software" entry: which matplotlib drew it."""
    position = 8  # past the signature; then chunks of length, type, data, CRC
    while position + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[position : position + 8])
        data = png[position + 8 : position + 8 + length]
        if kind == b"tEXt" and data.startswith(b"Software\x00"):
            return data.split(b"\x00", 1)[1].decode("latin-1")
        if kind == b"IEND":
            break
        position += 12 + length
    return None


def _size(png: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which a PNG puts first."""
    return struct.unpack(">II", png[16:24])
