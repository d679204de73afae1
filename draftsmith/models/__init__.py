"""Drafter nn.Modules and their pure losses (no accelerate, wandb or datasets imports here)."""
