"""Marin: the experiment executor, job submission, cluster tooling and TPU adapter."""
