"""Conversations, chat templates and loss masks, regeneration by the target, hidden-state caches."""
