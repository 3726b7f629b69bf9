"""Pretraining tasks: loss functions per objective (`losses.py`)."""
