"""codebook_oob: the model solution submitted as is (its `fixed` calls no helper the bug lacks)."""

from cases.codebook_oob import fixed as fix  # noqa: F401
