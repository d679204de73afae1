"""draftsmith: train, export and evaluate speculative-decoding drafters for frozen LLM targets."""

__version__ = "0.1.0"
