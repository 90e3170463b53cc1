"""Zephyr."""
