"""What every step of a data run on rank 0 reads (`pipeline.run_data_recipe`): the recipe, the
loaded target with its chat template and identity, and how the run reports and stops."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.data.config import DataConfig, DataRecipe
from draftsmith.data.identity import TargetIdentity
from draftsmith.data.ranks import Ranks
from draftsmith.target.load import Target


@dataclass(frozen=True)
class DataRun:
    """One run of a data recipe, once its target is loaded.

    Attributes:
        recipe: the validated recipe.
        target: the loaded target.
        template: the chat template that renders (and regenerates) the conversations.
        identity: the target's identity, stored with every sharded step's output.
        ranks: the processes of the run (`data/ranks.py`).
        stop_after_shards: stop each sharded step after this many new shards.
        progress: show progress bars.
        log: where one-line reports go.
    """

    recipe: DataRecipe
    target: Target
    template: str
    identity: TargetIdentity
    ranks: Ranks
    stop_after_shards: int | None
    progress: bool
    log: Callable[[str], None]

    @property
    def data(self) -> DataConfig:
        return self.recipe.data

    @property
    def out_dir(self) -> Path:
        return Path(self.recipe.data.out_dir)

    @property
    def tokenized(self) -> Path:
        """The rendered samples, one JSON line each (what online training and the other ranks
        read)."""
        return self.out_dir / "tokenized.jsonl"
