"""A correct fix of codebook_oob written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

from cases import codebook_oob as codebook_case


def codebook_oob(x):
    """Special ids masked to -inf before the argmax (the last layer keeps end-of-audio), not sliced away."""
    masked = x.logits.clone()
    masked[:, :, codebook_case.AUDIO_VOCAB :] = float("-inf")
    masked[:, -1, codebook_case.AUDIO_VOCAB : codebook_case.EOA + 1] = x.logits[:, -1, codebook_case.AUDIO_VOCAB : codebook_case.EOA + 1]
    codes = masked.argmax(-1)
    return codebook_case.decode(x, codes[: codebook_case.stream_length(codes)])
