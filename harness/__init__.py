"""A reproducible benchmark and regression harness for real PyTorch failures."""
