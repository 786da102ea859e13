"""codebook_oob has no upstream fix: https://github.com/gpt-omni/mini-omni/issues/97 was closed with no maintainer fix
released and mini-omni's code unchanged after it. The stored copy of #97 read here holds the report and its
traceback, and no suggested fix. The suggestions on record are those of the article the case was seeded from (the
project's shared/CASES.md: "clamping out-of-range codes or replacing them with 0"), each graded here as a
submission; both are among the case's bad fixes. tests/test_upstream_fixes.py grades them;
docs/history/upstream_fixes.md has the verdicts.
"""

from cases.codebook_oob import AUDIO_VOCAB, decode, stream_length


def seed_article_clamp(x):
    """The seed article's first suggestion (no upstream URL: https://github.com/gpt-omni/mini-omni/issues/97 holds
    none): mini-omni's greedy pick over all 4160 ids and its stop rule as they are, the codes clamped into SNAC's
    4096-row codebook before `snac.decode`."""
    codes = x.logits.argmax(-1)
    codes = codes[: stream_length(codes)]
    return decode(x, codes.clamp(0, AUDIO_VOCAB - 1))


def seed_article_replace_with_zero(x):
    """The seed article's second suggestion (no upstream URL, as above): every code >= 4096 replaced by code 0 before
    `snac.decode`."""
    codes = x.logits.argmax(-1)
    codes = codes[: stream_length(codes)]
    return decode(x, codes.masked_fill(codes >= AUDIO_VOCAB, 0))
