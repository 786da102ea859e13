"""Benchmarks of triage: its speed on a 10,000-line log (pytest-benchmark; goal under 0.5 s, judged from the saved
results, never by a timed assert), and its figures per family on the logs kept apart for issue 49."""

import pytest

from harness.cases import ROOT
from harness.triage import LOOKALIKES, _first_match, _normalise_text, _raw_lines, _Search, load_signs, triage
from tests.test_triage import (
    KEPT_APART,
    KEPT_APART_2,
    KEPT_APART_3,
    KEPT_APART_4,
    KEPT_APART_5,
    KEPT_APART_6,
    KEPT_APART_7,
    KEPT_APART_8,
    KEPT_APART_9,
    _figures,
)

LINES = 10_000
# The goals of issue 49 on the kept-apart logs: family verdict right, right case in the top 3, negatives claimed.
GOAL_RIGHT, GOAL_TOP3, GOAL_CLAIMED = 0.85, 0.97, 0.05


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
    load_signs()  # every case's signs are parsed once, before the timed rounds, and reused by each
    verdict = benchmark.pedantic(triage, args=(log,), rounds=5, iterations=1, warmup_rounds=1)
    assert verdict.case == "embedding_oob"
    benchmark.extra_info.update(lines=LINES, goal_s=0.5)
    if benchmark.stats:
        print(f"\ntriage of {LINES} lines: median {benchmark.stats.stats.median * 1e3:.0f} ms (goal < 500 ms)")


@pytest.mark.untimed
@pytest.mark.slow  # every sign's regex over 10,000 lines twice: 7.5 s
def test_the_line_by_line_search_of_a_long_log_finds_what_the_whole_text_search_finds():
    """A pattern that cannot cross a line is searched only in the lines holding its rarest literals: on the 10,000
    lines it finds the same first match as the regex over the whole text, for every sign of every case."""
    patterns = {sign.pattern for signs in load_signs().values() for sign in signs.signs} | {sign.pattern for sign in LOOKALIKES}
    cleaned = _normalise_text(_raw_lines(_long_log()))
    search = _Search(cleaned)
    assert [search.first(pattern) for pattern in sorted(patterns)] == [_first_match(pattern, cleaned) for pattern in sorted(patterns)]


def _printed_figures(folder) -> tuple[int, int, int, int, int]:
    """A kept-apart set's figures printed per family, then their totals: (positives, right, top 3, negatives, claimed)."""
    figures = _figures(folder)
    print(f"\n{'family':30} {'right':>7} {'top 3':>7} {'claimed':>9}")
    for family, (positives, right, top3, _, negatives, claimed) in figures.items():
        print(f"{family:30} {right:>3}/{positives:<3} {top3:>3}/{positives:<3} {claimed:>4}/{negatives:<4}")
    positives, right, top3, _, negatives, claimed = (sum(column) for column in zip(*figures.values()))
    print(f"{'all':30} {right:>3}/{positives:<3} {top3:>3}/{positives:<3} {claimed:>4}/{negatives:<4}")
    return positives, right, top3, negatives, claimed


def test_figures_per_family_on_the_kept_apart_logs():
    """Prints, per family, the figures of issue 49 on tests/triage_logs_keptapart/ (split by repository from every
    log the signs were tuned on), and holds the three goals on the totals."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART)
    # Measured first (issue 49, 2026-11-26): 56 of 64 right, 61 of 64 in the top 3, 1 of 39 claimed. On 2026-11-27
    # four misses here led to four signs of their families (a retold "unscale fp16 gradients", torch.compile's
    # OptimizedModule as the model loaded into, "Cuda Out of Memory" in any case and GPU memory growing in Chinese,
    # and clip_before_unscale no longer reading the fix's own comment as the bug): 58, 64 and 1 since, figures no
    # longer kept apart for those four families. On 2026-11-28 the new zero_grad_set_to_none claimed one near-miss here
    # (SparseLLM's leaf-in-place error, whose log shows `s_batch.grad.zero_()`): its veto of autograd's own refusals
    # was written after seeing it, so this set no longer keeps that family apart either.
    assert right >= GOAL_RIGHT * positives and claimed <= GOAL_CLAIMED * negatives
    assert top3 >= GOAL_TOP3 * positives, f"top 3: {top3} of {positives} (goal {GOAL_TOP3:.0%})"


def test_figures_per_family_on_the_second_kept_apart_set():
    """The second kept-apart set (tests/triage_logs_keptapart2/, 65 logs from 62 repositories absent from every other
    set). Measured once, before any sign was changed for it: 27 of 41 right, 38 of 41 in the top 3, 1 of 24 claimed.
    Eleven of the 14 misses were prose reports or fix descriptions with the right case the only or first candidate
    and no verdict; seven families gained a sign for such prose (a dropout named as the cause of outputs that change,
    memory that grows only with num_workers > 0, modules in a list not seen as parameters, tied embeddings whose head
    is a copy, micro-batches whose token counts change the gradient, losses kept with their graph shown by the fix,
    codebook indices past the codebook). Since: 36, 39 and 1; no longer kept apart for those seven families. The floor
    below holds what is reached, so that a later change of signs cannot lose it unseen."""
    figures = _figures(KEPT_APART_2)
    positives, right, top3, _, negatives, claimed = (sum(column) for column in zip(*figures.values()))
    print(f"\nsecond kept-apart set: right {right}/{positives}, top 3 {top3}/{positives}, claimed {claimed}/{negatives}")
    assert (positives, negatives) == (41, 24)
    # top 3: 39 -> 40 once resemblance in words (harness/triage/resemble.py, 2026-11-29) fills the first three
    assert right >= 36 and top3 >= 40 and claimed <= 1, (right, top3, claimed)


def test_figures_per_family_on_the_third_kept_apart_set():
    """The third kept-apart set (tests/triage_logs_keptapart3/, collected 2026-11-28 from repositories absent from every
    other set and from the project; its README says how), 74 logs. Measured once, before any sign was changed for it:
    32 of 51 right (63%), 44 of 51 in the top 3 (86%), 1 of 23 claimed (4%), short of the goals of issue 49 on the first
    two. The 19 misses are mostly prose and fix descriptions (lr_scheduler_verbose's PRs, params_not_registered,
    attention_fully_masked_rows, codebook_oob) and families wider than their case (multigpu_segfault: one process on
    three GPUs). Then (2026-11-28) its misses were read and signs added for the families' reports in words, in 11 cases
    (a fourth set, collected apart by helpers who never saw the signs, measures them): 47 of 51 right, 48 of 51 in the
    top 3, 2 of 23 claimed. The second claim is detectron2's near-miss, whose reporter describes modules kept in a list
    instead of a ModuleList (this family) before finding DataParallel's replicas the cause. The floor below holds what was measured, so that a
    later change of signs cannot lose it unseen; this set is no longer kept apart."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART_3)
    assert (positives, negatives) == (51, 23)
    # top 3: 48 -> 51 once resemblance in words (harness/triage/resemble.py, 2026-11-29) fills the first three
    assert right >= 47 and top3 >= 51 and claimed <= 2, (right, top3, claimed)


def test_figures_per_family_on_the_fourth_kept_apart_set():
    """The fourth kept-apart set (tests/triage_logs_keptapart4/, collected 2026-11-28 by helpers that never saw the
    signs, while the third set's misses were being read; its README says how), 73 logs. Measured once, with the signs
    written for the third set's misses: 28 of 44 right (64%), 40 of 44 in the top 3 (91%), 2 of 29 claimed (7%),
    short of all three goals of issue 49. The third set measured 63%, 86% and 4% before its own misses were read: the
    signs written for reports in words lift the set they were read from, and barely the next. Then (2026-11-28) its
    misses were read: a report in words is concepts found together, in any order (`Sign.near`, within NEAR_LINES
    lines), not one sentence spelled out; 12 cases gained such a sign from their family's own description (memory that
    grows over iterations, predictions of one input that differ, the sampler's order the same each epoch, ...), kept
    only where no near-miss of the other sets was claimed: 40 of 44 right, 42 of 44 in the top 3, 2 of 29 claimed. This
    set is no longer kept apart (a fifth measures it); the floor holds what is reached."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART_4)
    assert (positives, negatives) == (44, 29)
    # 41 and 43 from 2026-11-29, with "DataLoader worker killed" in words
    # top 3: 43 -> 44 once resemblance in words (harness/triage/resemble.py, 2026-11-29) fills the first three
    assert right >= 41 and top3 >= 44 and claimed <= 2, (right, top3, claimed)


def test_figures_per_family_on_the_fifth_kept_apart_set():
    """The fifth kept-apart set (tests/triage_logs_keptapart5/, collected 2026-11-28 by helpers that never saw the
    signs, while those of the fourth set's misses were being written; its README says how), 51 logs over 18 families.
    Measured once, on the signs of 4728ebf: 16 of 31 right (52%), 26 of 31 in the top 3 (84%), 2 of 20 claimed (10%),
    short of all three goals of issue 49. The signs before 4728ebf give 15, 26 and 1 on the same logs: the prose
    concepts (`Sign.near`) written from the fourth set's misses lifted it from 28 to 40 of 44, and this set by one
    log (and one claim). Of the 15 misses, 10 have the right case among the candidates, held back as too little to
    decide: reports in words of families that have no concept sign yet (workers copying a dataset's dicts, workers
    repeating augmentations, a codebook overflow told in words), and logs cut before their error line. The floor holds
    what was measured, so that a later change of signs cannot lose it unseen. Then (2026-11-29, with the sixth set's
    misses) its misses were read, and the signs widened for their families, not their sentences: older and newer
    wordings (TH's `index out of range at ...THTensorEvenMoreMath.cpp`), copy-on-access named beside memory and workers,
    numpy's generator not reseeded per worker, `.eval()` forgotten on the line after the sentence, a codec handed ids
    past its range, an ASCII word written against Chinese (cleaning now spaces them, so `\\b` holds), the reducer's
    per-parameter line of TORCH_DISTRIBUTED_DEBUG, an in-place error told in words beside a GAN, state reused across
    backward passes: 30 of 31 right, 30 of 31 in the top 3, 2 of 20 claimed, and of every other set's logs one more
    right (the fourth's) and none lost. This set is no longer kept apart (a seventh measures it)."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART_5)
    assert (positives, negatives) == (31, 20)
    # top 3: 30 -> 31 once resemblance in words (harness/triage/resemble.py, 2026-11-29) fills the first three
    assert right >= 30 and top3 >= 31 and claimed <= 2, (right, top3, claimed)


def test_figures_per_family_on_the_sixth_kept_apart_set():
    """The sixth kept-apart set (tests/triage_logs_keptapart6/, collected 2026-11-29 by two helpers that never saw the
    signs; its README says how), 25 logs over the 10 families the fifth set lacks. Measured once (on ffaf7b0 and
    e0d2013, nothing tuned on it): 11 of 15 right (73%), 15 of 15 in the top 3, 2 of 10 claimed (20%). The misses:
    two tied_weights_meta_init reports in Chinese prose (top candidate, 0.448), params_not_registered's LSTM cells
    kept in a list (0.45), state_dict_prefix's `_orig_mod.` told in a pull request's words (0.05); the claims: a
    shape mismatch on an old checkpoint (state_dict_prefix's family line) and a scratch trainer's zero_grad. The floor
    holds what was measured, so that a later change of signs cannot lose it unseen. Then (2026-11-29) its misses were
    read: a Sequential built from the list named as the cure, `_orig_mod.` / `module.` written with its dot before
    "prefix", tied weights found two objects or stale after materialising (in any language): 15 of 15 right, 2 of 10
    claimed (the claims stand: a shape mismatch under the family's own line, and a scratch trainer's `.grad`). This
    set is no longer kept apart (a seventh measures it)."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART_6)
    assert (positives, negatives) == (15, 10)
    assert right >= 15 and top3 >= 15 and claimed <= 2, (right, top3, claimed)


def test_figures_per_family_on_the_seventh_kept_apart_set():
    """The seventh kept-apart set (tests/triage_logs_keptapart7/, collected 2026-11-29 by three helpers that never saw
    the signs; its README says how), 63 logs: 41 positives over 26 families, 22 near-misses. Measured once, on 648513e:
    24 of 41 right (59%), 34 of 41 in the top 3 (83%), 2 of 22 claimed (9%), short of all three goals of issue 49, and
    the same figures, family by family, as the signs of 6e029b5 give: the signs written from the fifth and sixth sets'
    misses lifted those sets and not this one. Then its misses were read and the signs widened for their families
    (older kernel wordings, causes in words): 35 of 41 right, 40 of 41 in the top 3, 2 of 22 claimed. The floor holds
    that; an eighth set would say whether any of it carries."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART_7)
    assert (positives, negatives) == (41, 22)
    assert right >= 35 and top3 >= 40 and claimed <= 2, (right, top3, claimed)


def test_figures_per_family_on_the_eighth_kept_apart_set():
    """The eighth kept-apart set (tests/triage_logs_keptapart8/, collected 2026-11-29 by three helpers that never saw
    the signs; its README says how), 59 logs. Measured once, on dc982c4, as the helpers labelled it: 21 of 38 right
    (55%), 29 of 38 in the top 3 (76%), 6 of 21 near-misses claimed (29%); seven of their near-misses show their
    family's own line with another cause, positives of the family by this project's convention (docs/guides/triage.md),
    and so labelled now: 26 of 44 right (59%), 34 of 44 in the top 3 (77%), 0 of 15 claimed, short of two goals of
    issue 49: the signs written from the seventh set's misses did not carry to this one. Then one sign was added for
    multigpu_segfault's own abort (gloo's exception thrown past `terminate` in a rank): 29, 37 and 0. Then the cases
    a log's words resemble (harness/triage/resemble.py, each case's module source against the log) filled the first
    three where fewer than three signs matched: 29, 43 and 0. Seven logs came into the first three by their words (a
    worker killed after 15 hours, DDP's unused student layers, predictions that differ for one image, a scheduler's
    traceback cut before its error, a label 255 behind a device-side assert, NaN gradients in English and in Chinese);
    one left them: open-unmix's identical worker seeds, whose case a veto rules out, listed now after the leads. The
    floor holds that."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART_8)
    assert (positives, negatives) == (44, 15)
    assert right >= 29 and top3 >= 43 and claimed <= 0, (right, top3, claimed)


def test_figures_per_family_on_the_ninth_kept_apart_set():
    """The ninth kept-apart set (tests/triage_logs_keptapart9/, collected 2026-11-29 by three helpers that never saw
    the signs; its README says how), 86 logs. Measured once, on 412cb50, as the helpers labelled it: 37 of 56 right
    (66%), 55 of 56 in the top 3 (98%), 2 of 30 claimed; the signs alone (aa521b2) put 52 of 56 in the top 3: the
    cases resembled in words carried to a set they were not written from. One near-miss shows class_weight_index's
    family line (a gather's `index 18864 is out of bounds for dimension 1 with size 18864`) and is its positive by the
    convention: 38 of 57, 56 of 57, 1 of 29. The claim left, a TypeError on `verbose` from a class that is no
    scheduler, was read: `verbose=` in the call weighs less, and the bare TypeError needs a scheduler beside it: 0 of
    29, no log of another set changed. Short of issue 49's 85% right: 18 of the 19 misses have no verdict, 17 of them
    with the right case in the first three, reports in words again. The floor holds what is reached."""
    positives, right, top3, negatives, claimed = _printed_figures(KEPT_APART_9)
    assert (positives, negatives) == (57, 29)
    assert right >= 38 and top3 >= 56 and claimed <= 0, (right, top3, claimed)
