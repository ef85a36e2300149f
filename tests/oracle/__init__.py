"""Oracles for model tests: reference implementations we compare against (transformers)."""
