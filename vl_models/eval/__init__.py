"""Evaluation during and after pretraining."""
