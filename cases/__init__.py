"""One documented PyTorch failure per module; the harness finds them by scanning this folder."""
