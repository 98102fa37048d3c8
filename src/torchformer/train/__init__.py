"""Experiment support: a run's checkpoints, schedules, logs, metrics, several processes (DDP, FSDP2).

Also loading a model from its file, FLOPs, evaluation and attention maps. The model itself needs none of it.
"""
