"""Benchmark (pytest-benchmark): triage of a 10,000-line log. Goal: under a second; judged from the saved
results, never by a timed assert."""

from harness.cases import ROOT
from harness.triage import triage

LINES = 10_000


def _long_log() -> str:
    """10,000 lines: training noise with ANSI codes, rank prefixes and timestamps, a 100 kB line of one
    character (what a regex that backtracks would choke on), and an embedding failure near the end."""
    noise = [
        f"\x1b[32m[rank{i % 8}]:\x1b[0m 2024-05-0{i % 9 + 1} 12:00:{i % 60:02d},123 INFO step {i} loss={1 / (i + 1):.4f} lr=3e-4 "
        f"/home/user/envs/x/lib/python3.10/site-packages/torch/nn/modules/module.py pid {4000 + i} 0x7f{i:010x}"
        for i in range(LINES - 20)
    ]
    noise[LINES // 2] = "a" * 100_000
    failure = (ROOT / "tests" / "triage_logs" / "embedding_oob" / "keqa_cpu_traceback.log").read_text().splitlines()
    failure = [line.replace(" #=MATCH=#", "") for line in failure if not line.startswith("#=")]
    lines = noise + failure
    return "\n".join(lines + ["done"] * (LINES - len(lines)))


def test_triage_of_a_10000_line_log(benchmark):
    log = _long_log()
    assert log.count("\n") + 1 == LINES
    verdict = benchmark.pedantic(triage, args=(log,), rounds=5, iterations=1, warmup_rounds=1)
    assert verdict.case == "embedding_oob"
    benchmark.extra_info.update(lines=LINES, goal_s=1.0)
    if benchmark.stats:
        print(f"\ntriage of {LINES} lines: median {benchmark.stats.stats.median * 1e3:.0f} ms (goal < 1000 ms)")
