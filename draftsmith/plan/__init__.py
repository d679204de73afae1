"""`draftsmith plan`: whether a training recipe fits a GPU before anything is loaded, from the
recipe's shapes on the meta device (`shapes.py`), a per-rank memory model of the training loop as
it runs (`memory.py`), GPU memory sizes by name (`gpus.py`) and the report (`report.py`)."""
