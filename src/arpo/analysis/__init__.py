"""Analyses and figures of runs and rollout dumps (entropy after tool results, metric curves)."""
