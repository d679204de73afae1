"""A decoding method as a value (`Method`): the name users write (`plain`,
`drafter_dynamic@eagle1`, `hf_assisted`) parsed once into its base and its drafter's label, and
the tables naming draftsmith's own methods. The one module that takes a method name apart: the
evaluation harness, the benchmark and its reports, and the export's model card (a layer below the
harness, hence this module's place beside the proposers) read a Method's fields."""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.registry import get_spec

OUR_METHODS = {
    "plain": "plain decoding through draftsmith's loop (the speedup baseline)",
    "prompt_lookup": "n-gram prompt lookup, chain",
    "lookahead": "lookahead decoding: Jacobi window + n-gram pool (W, N, G), tree",
    "rest": "REST: retrieval from a datastore, tree of frequent continuations (needs --datastore)",
    "draft_model": "classic draft model, chain (needs --draft-model)",
    "draft_model_tree": "classic draft model, EAGLE-2 dynamic tree (needs --draft-model)",
    "drafter": "trained drafter with its kind's default tree (needs --drafter)",
    "drafter_chain": "trained drafter, chain of top-1 drafts",
    "drafter_static": "trained drafter, static tree (Medusa / EAGLE-1)",
    "drafter_dynamic": "trained drafter, dynamic tree (EAGLE-2 / EAGLE-3; DDTree for DFlash)",
    "drafter_lookup": "trained drafter with its kind's default tree, prompt lookup's chain instead "
                      "on a match of >= --hybrid-min-ngram tokens",
}
DISPLAY_NAMES = {"plain": "plain decoding", "prompt_lookup": "prompt lookup",
                 "lookahead": "lookahead decoding", "rest": "REST",
                 "draft_model": "draft model (chain)", "draft_model_tree": "draft model (tree)",
                 "hf_generate": "HF generate", "hf_assisted": "HF assisted generation",
                 "hf_prompt_lookup": "HF prompt lookup"}
NEEDS_DRAFT = {"draft_model", "draft_model_tree", "hf_assisted"}
NEEDS_DRAFTER = {m for m in OUR_METHODS if m.startswith("drafter")}


@dataclass(frozen=True)
class Method:
    """A decoding method as a value, parsed once from the name users write (`plain`,
    `drafter_dynamic@eagle1`, `hf_assisted`): its `base` (one of `eval.methods.ALL_METHODS`)
    and, for a trained drafter's methods, the `label` of the run's drafter it uses ("" for a single
    unlabelled `--drafter DIR`). Everything past the parse reads its fields, never the string."""

    base: str
    label: str = ""

    @classmethod
    def parse(cls, name: str | Method) -> Method:
        """`drafter_dynamic@eagle1` -> Method("drafter_dynamic", "eagle1"); a Method passes."""
        if isinstance(name, Method):
            return name
        base, _, label = str(name).partition("@")
        return cls(base, label)

    def __str__(self) -> str:
        return f"{self.base}@{self.label}" if self.label else self.base

    @property
    def uses_drafter(self) -> bool:
        """A trained drafter's method (`drafter`, `drafter_chain`, ..., `drafter_lookup`)."""
        return self.base in NEEDS_DRAFTER

    @property
    def with_lookup(self) -> bool:
        """The hybrid: the drafter, and prompt lookup's chain where it matches."""
        return self.base == "drafter_lookup"

    @property
    def shape(self) -> str | None:
        """A drafter method's tree shape: `chain`, `static`, `dynamic`, or `default` (its
        kind's own, `drafter` and the hybrid); None for the other methods."""
        if not self.uses_drafter:
            return None
        return "default" if self.base in ("drafter", "drafter_lookup") else \
            self.base.split("_", 1)[1]

    @property
    def needs_draft_model(self) -> bool:
        return self.base in NEEDS_DRAFT

    def tree_shape(self, kind: str) -> str:
        """The tree shape this drafter method decodes with for a drafter of `kind`."""
        return get_spec(kind).default_tree if self.shape == "default" else self.shape

    def display_name(self, kind: str | None = None) -> str:
        """The name tables and plots show, as BENCHMARKS.md writes it: `plain decoding`, `prompt
        lookup`, `EAGLE-3 (dynamic tree)`, `EAGLE-3 + prompt lookup`; a drafter's label, when
        the run names several, in brackets. `kind`: the drafter's kind (None: generic)."""
        if not self.uses_drafter:
            return DISPLAY_NAMES.get(self.base, self.base)
        title = get_spec(kind).title if kind else "drafter"
        shape = self.tree_shape(kind) if kind else self.shape
        name = f"{title} + prompt lookup" if self.with_lookup else \
            f"{title} (chain)" if shape == "chain" else f"{title} ({shape} tree)"
        return f"{name} [{self.label}]" if self.label else name
