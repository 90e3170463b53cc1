"""Data-processing steps built on zephyr pipelines (near-duplicate removal)."""
