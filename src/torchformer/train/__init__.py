"""Experiment support: checkpoints, schedules, logging, metrics, FLOPs, evaluation and attention maps."""
