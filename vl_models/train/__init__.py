"""The trainer: optimizer and schedule, checkpoints, distributed setup, the loop."""
