"""Feeding the step: the next batches read ahead on a background thread (cache shards read, rows
collated while the step computes), copied to the device without blocking (pinned on CUDA), and
float8 cache rows dequantised there rather than on the host."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

import torch

from draftsmith.data.cache_reader import dequantize_rows, scale_key

_DONE = object()


def read_ahead(batches: Iterable[dict], depth: int = 2) -> Iterator[dict]:
    """`batches` in order, up to `depth` of them read ahead by a background thread (pinned when
    CUDA is present). An error while reading is raised here, at the batch it stopped at;
    leaving the loop early stops the thread."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    pin = torch.cuda.is_available()

    def offer(item) -> bool:  # False once the consumer has left
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not offer({k: v.pin_memory() if isinstance(v, torch.Tensor) else v
                              for k, v in batch.items()} if pin else batch):
                    return
            offer(_DONE)
        except BaseException as err:  # handed to the consumer, raised in its thread
            offer(err)

    worker = threading.Thread(target=produce, name="draftsmith-read-ahead", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


def to_device(batch: dict, device) -> dict:
    """A batch on `device` (non-blocking copies), float8 hidden states with their row scales
    (`hidden_states.i` and `hidden_states.i.scale`) dequantised to bfloat16 there. A value that
    is not a tensor (a kind's host-side counts, registry `collate_rows`) stays as it is."""
    moved = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
             for k, v in batch.items()}
    for key in [k for k in moved if scale_key(k) in moved]:
        moved[key] = dequantize_rows(moved[key], moved.pop(scale_key(key)))
    return moved


def device_batches(batches: Iterable[dict], device, depth: int = 2) -> Iterator[dict]:
    """`batches` read ahead (`read_ahead`) and on `device`, the next one's copy issued before
    the current one is handed out, so it overlaps the step."""
    source = read_ahead(batches, depth)
    try:
        upcoming = next(source, None)
        upcoming = None if upcoming is None else to_device(upcoming, device)
        while upcoming is not None:
            current, upcoming = upcoming, next(source, None)
            upcoming = None if upcoming is None else to_device(upcoming, device)
            yield current
    finally:
        source.close()
