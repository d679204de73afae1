"""Per-rank memory of one EAGLE-3 training step as the loop runs it, from shapes alone (pure
functions: sizes in, bytes out), and the verdict against a device's memory.

What the loop keeps (`train/loop.py`, `models/eagle3.py`, `models/features.py`):

- the frozen target, whole on every rank (it stays outside the wrapped module, so FSDP does not
  shard it), in the target dtype; the drafter in float32 (its frozen embedding included), its
  gradients and AdamW's two float32 states for every trained parameter; DDP adds gradient buckets
  of the same size, FSDP shards weights, gradients and states over the ranks and gathers the full
  weights for the step;
- online, the target's forward under no_grad keeps the hidden states the drafter reads
  (`models/target_states.extract_features`) beside one layer's working set; then those states
  and the target's logits over the draft vocabulary after the trained positions live through the
  step (the full-vocabulary head runs in chunks of `HEAD_CHUNK` rows for its argmax); with
  `train.overlap_target` a thread does both for the next batch beside the step, so its larger
  part (the forward's working set or those features and logits) adds to the step's;
- per training-time-test step j (T = max length, B = batch): the decoder layer's saved tensors on
  its rows (every real token at step 0, whose keys later steps read; then the positions trained
  at step j or later: the collate's `ttt_row_plan`), the keys/values of every step so far
  concatenated to (j+1)T in the padded layout, the attention kernel's saved tensors, and the
  draft head's float32 log-probabilities and teacher probabilities on the rows it trains.

The decoder layer's and the heads' rows and the teacher logits are sized here at every position:
an upper bound, reached when every token of the batch is real and trained (on chat data about
60-75% of the real tokens are trained).

Attention: the training-time test attends through `models/ttt_attention.py` (causal SDPA without
a mask plus the diagonal blocks, merged by a sink key), which the fused kernels take on every
device and which keeps only a log-sum-exp row (`blockwise`, the default). `math` is what a dense
bool mask with GQA costs on a GPU (SDPA's math path keeps float32 (B, heads, T, (j+1)T)
probabilities per step), the code before that kernel.

Sizes are upper bounds for a batch of B sequences at max length. Grouped KV heads are read in
place by the attention (SDPA's `enable_gqa`), so no key or value is repeated per query head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from draftsmith.models.features import HEAD_CHUNK
from draftsmith.plan.shapes import ModelShapes

F32 = 4
# not in torch's allocator: the CUDA context (an allowance, not measured here); on a CPU the Python
# process with torch, transformers and accelerate loaded (0.45 GB measured on a 2-core AMD EPYC
# Zen 4 with torch 2.13) plus the tokenizer
RUNTIME_BYTES = {"cuda": 1_000_000_000, "cpu": 500_000_000}
FITS_BELOW = 0.9  # of the device's memory: the rest is the allocator's fragmentation margin


@dataclass(frozen=True)
class Settings:
    """The recipe's run settings a plan depends on.

    Attributes:
        batch: sequences per rank per micro-step (train.batch_size).
        length: tokens per sequence (train.max_length).
        target_bytes: bytes per target weight and activation (2 bf16/fp16, 4 float32).
        act_bytes: bytes per drafter activation (2 under bf16/fp16 autocast, else 4).
        processes: ranks.
        sharding: `ddp` or `fsdp` (`none` for one process).
        online: the target runs inside each step (train.features=online).
        cache_bytes: bytes per cached hidden-state value (offline features).
        checkpointing: the decoder layer is recomputed in backward (train.gradient_checkpointing).
        device: `cuda` or `cpu`.
        attention: `math` (dense scores kept) or `blockwise`.
        overlap: the next batch's target forward runs beside the step
            (`train.overlap_target`): the two phases are held at once.
    """

    batch: int
    length: int
    target_bytes: int
    act_bytes: int
    processes: int = 1
    sharding: str = "none"
    online: bool = True
    cache_bytes: int = 2
    checkpointing: bool = False
    device: str = "cuda"
    attention: str = "math"
    overlap: bool = False


@dataclass(frozen=True)
class Term:
    """One line of a plan: `bytes` per rank and the `phase` that holds it (the target's forward
    and the drafter's step happen one after the other; static terms are held throughout)."""

    name: str
    bytes: int
    phase: str  # "static", "forward" (target forward) or "step" (drafter forward + backward)


def default_attention(device: str) -> str:
    """The attention path the current code gets on `device` (see the module docstring)."""
    del device  # the TTT kernel takes the fused path on every device
    return "blockwise"


def static_terms(s: ModelShapes, cfg: Settings) -> list[Term]:
    """Weights, gradients, optimizer states and the runtime: held for the whole run."""
    n = cfg.processes
    drafter = (s.drafter_trainable + s.drafter_frozen) * F32 + s.drafter_buffer_bytes
    trained = s.drafter_trainable * F32
    sharded = cfg.sharding == "fsdp" and n > 1  # FSDP2 shards the frozen target too
    terms = [Term(f"target weights (1/{n} shard)" if sharded else "target weights (whole, every "
                  "rank)", s.target_params * cfg.target_bytes // (n if sharded else 1), "static")]
    if cfg.sharding == "fsdp" and n > 1:
        terms += [
            Term(f"drafter weights fp32 (1/{n} shard)", drafter // n, "static"),
            Term("drafter weights gathered for the step",
                 (s.drafter_trainable + s.drafter_frozen) * cfg.act_bytes, "step"),
            Term(f"drafter gradients fp32 (1/{n} shard)", trained // n, "static"),
            Term(f"AdamW states fp32 (1/{n} shard)", 2 * trained // n, "static"),
        ]
    else:
        terms += [
            Term("drafter weights fp32 (frozen embedding included)", drafter, "static"),
            Term("drafter gradients fp32", trained, "static"),
            Term("AdamW states fp32 (exp_avg, exp_avg_sq)", 2 * trained, "static"),
        ]
        if cfg.sharding == "ddp" and n > 1:
            terms.append(Term("DDP gradient buckets", trained, "static"))
    runtime = "CUDA context" if cfg.device == "cuda" else "Python, torch, transformers"
    terms.append(Term(f"runtime ({runtime})", RUNTIME_BYTES[cfg.device], "static"))
    return terms


def target_forward_bytes(s: ModelShapes, cfg: Settings) -> int:
    """Online: the hidden states kept, one layer's input and output, and its MLP's working set."""
    tokens = cfg.batch * cfg.length
    return tokens * ((s.hidden_indices + 2) * s.hidden + 3 * s.intermediate) * cfg.target_bytes


def feature_bytes(s: ModelShapes, cfg: Settings) -> int:
    """The hidden states the drafter reads and the teacher logits, live through the step."""
    tokens = cfg.batch * cfg.length
    states = s.hidden_indices * tokens * s.hidden * cfg.target_bytes
    if cfg.online:  # draft-vocabulary slice (every position: a bound); one chunk's full product
        logits = (tokens * s.draft_vocab + min(tokens, HEAD_CHUNK) * s.vocab) * cfg.target_bytes
    else:  # the cache's argmax: only the draft vocabulary's rows of the head are applied
        states += s.hidden_indices * tokens * s.hidden * cfg.cache_bytes
        logits = (tokens + s.hidden) * s.draft_vocab * cfg.target_bytes
    return states + logits


def layer_row_bytes(s: ModelShapes, cfg: Settings) -> int:
    """Saved tensors of the decoder layer per row it computes (projections, norms, MLP)."""
    a, h, q = cfg.act_bytes, s.hidden, s.heads * s.head_dim
    kv = 2 * s.kv_heads * s.head_dim
    norms = 3 * h * (F32 + a)  # two input norms and the post-attention norm (float32 inside)
    return (norms + 2 * h * a + (q + kv) * a  # 2H attention input, q/k/v before scattering
            + q * a + h * a  # o_proj input, residual sum
            + 4 * s.drafter_intermediate * a + h * a)  # MLP: gate, silu, up, product; input


def attention_step_bytes(s: ModelShapes, cfg: Settings, j: int) -> tuple[int, int]:
    """(saved, transient) bytes of TTT step j's attention over (j+1)T keys."""
    b, t, a = cfg.batch, cfg.length, cfg.act_bytes
    keys = (j + 1) * t
    padded = b * t * (2 * s.heads + 2 * s.kv_heads) * s.head_dim * a  # q, out; new k, v
    concat = 2 * b * s.kv_heads * keys * s.head_dim * a  # [cache..., new] keys and values
    mask = b * t * keys  # bool
    if cfg.attention == "math":  # float32: q, K/V expanded to every head, probabilities
        scores = b * s.heads * t * keys * F32
        kept = b * s.heads * (t + 2 * keys) * s.head_dim * F32 + scores
        return padded + concat + mask + kept, 2 * scores  # backward: probs' and scores' grads
    return padded + concat + mask + b * s.heads * t * F32, 0


def head_row_bytes(s: ModelShapes, cfg: Settings) -> int:
    """Per row and step: final norm, head input, float32 log-probs and teacher probs."""
    return s.hidden * (F32 + 2 * cfg.act_bytes) + 2 * s.draft_vocab * F32


def step_terms(s: ModelShapes, cfg: Settings) -> list[Term]:
    """What the drafter's forward keeps for backward, summed over the TTT steps, and the largest
    temporary on top of it."""
    tokens = cfg.batch * cfg.length
    rows = [tokens] * s.ttt_steps  # every position of every step: an upper bound
    layer = [r * layer_row_bytes(s, cfg) for r in rows]
    attention = [attention_step_bytes(s, cfg, j) for j in range(s.ttt_steps)]
    head = tokens * head_row_bytes(s, cfg)
    fuse = tokens * 3 * s.hidden * cfg.act_bytes  # fc input
    transient = max(max(t for _, t in attention),
                    tokens * s.draft_vocab * (cfg.act_bytes + 2 * F32))  # logits, float copy
    if cfg.checkpointing:  # each step keeps its inputs and its K/V; one step is recomputed
        kv = [2 * cfg.batch * s.kv_heads * cfg.length * s.head_dim * cfg.act_bytes] * s.ttt_steps
        kept_layer = sum(r * s.hidden * cfg.act_bytes * 2 for r in rows) + sum(kv)
        recompute = max(lay + att for lay, (att, _) in zip(layer, attention, strict=True))
        terms = [Term("decoder layer (checkpointed: step inputs, keys/values)", kept_layer, "step"),
                 Term("one step recomputed in backward", recompute, "step")]
    else:
        terms = [Term(f"decoder layer activations ({s.ttt_steps} TTT steps)", sum(layer), "step"),
                 Term(f"TTT attention ({cfg.attention}, {s.ttt_steps} steps)",
                      sum(a for a, _ in attention), "step")]
    return [
        Term("fused features (fc input)", fuse, "step"),
        *terms,
        Term(f"draft head log-probs + teacher probs fp32 ({s.ttt_steps} steps)",
             head * s.ttt_steps, "step"),
        Term("largest temporary (attention scores' gradients or the head's logits)",
             transient, "step"),
    ]


@dataclass(frozen=True)
class Plan:
    """A plan's terms and its peak (static + the larger of the two phases, or both when the
    target's forward overlaps the step)."""

    terms: list[Term]
    settings: Settings

    def phase(self, name: str) -> int:
        return sum(t.bytes for t in self.terms if t.phase == name)

    @property
    def peak(self) -> int:
        both = (self.phase("forward"), self.phase("step"))
        return self.phase("static") + (sum(both) if self.settings.overlap else max(both))


def plan_memory(s: ModelShapes, cfg: Settings) -> Plan:
    """Every term of one rank's memory for `cfg`."""
    terms = static_terms(s, cfg)
    if cfg.online:
        forward = target_forward_bytes(s, cfg)
        terms.append(Term("target forward (states read, one layer working)", forward, "forward"))
        if cfg.overlap:  # the thread also computes the next batch's teacher logits (warm_teacher)
            terms.append(Term("next batch's teacher logits, beyond the forward's working set",
                              max(0, feature_bytes(s, cfg) - forward), "forward"))
    terms.append(Term("target features + teacher logits" + (" (online)" if cfg.online else
                                                           " (from the cache)"),
                      feature_bytes(s, cfg), "step"))
    terms += step_terms(s, cfg)
    return Plan(terms, cfg)


def verdict(peak: int, memory: int) -> str:
    """`fits`, `tight` (above FITS_BELOW of the memory: fragmentation may break it) or
    `does not fit`."""
    if peak <= FITS_BELOW * memory:
        return "fits"
    return "tight" if peak <= memory else "does not fit"


@dataclass(frozen=True)
class Change:
    """A recipe change and the peak it gives."""

    what: str
    settings: Settings
    peak: int


def largest_batch_that_fits(cfg: Settings, fits) -> int | None:
    """The largest batch below `cfg.batch` for which `fits(settings)` is not None, or None.

    The peak grows with the batch, so a bisection finds it in log2(batch) plans (a linear search
    down from `train.batch_size=1000000000` ran for hours).
    """
    if cfg.batch <= 1 or fits(replace(cfg, batch=1)) is None:
        return None
    good, bad = 1, cfg.batch  # fits(good), and cfg.batch is the size being replaced
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(replace(cfg, batch=middle)) is None:
            bad = middle
        else:
            good = middle
    return good


def changes_that_fit(s: ModelShapes, cfg: Settings, memory: int, accum: int) -> list[Change]:
    """Single changes to the recipe after which the plan fits, smallest step first: a smaller
    batch (grad_accum raised to keep the global batch), gradient checkpointing, FSDP sharding of
    the drafter, a block-wise attention kernel, a shorter max length. Empty when it already fits
    or nothing single does."""
    def fits(new: Settings) -> int | None:
        peak = plan_memory(s, new).peak
        return peak if verdict(peak, memory) == "fits" else None

    found: list[Change] = []
    batch = largest_batch_that_fits(cfg, fits)
    if batch is not None:
        global_batch = cfg.batch * accum
        new_accum = -(-global_batch // batch)
        found.append(Change(f"train.batch_size={batch} train.grad_accum={new_accum} (same "
                            f"{global_batch} sequences per rank per step)",
                            replace(cfg, batch=batch), fits(replace(cfg, batch=batch))))
    options = [
        ("train.gradient_checkpointing=true", replace(cfg, checkpointing=True),
         not cfg.checkpointing),
        ("FSDP (recipes/accelerate/fsdp.yaml): the drafter's weights, gradients and AdamW "
         "states sharded over the ranks", replace(cfg, sharding="fsdp"),
         cfg.processes > 1 and cfg.sharding != "fsdp"),
        ("a block-wise TTT attention kernel (no dense scores)", replace(cfg, attention="blockwise"),
         cfg.attention == "math"),
    ]
    for what, new, applies in options:
        peak = fits(new) if applies else None
        if peak is not None:
            found.append(Change(what, new, peak))
    for length in (cfg.length * 3 // 4, cfg.length // 2, cfg.length // 4):
        peak = fits(replace(cfg, length=length)) if length > 0 else None
        if peak is not None:
            found.append(Change(f"train.max_length={length}", replace(cfg, length=length), peak))
            break
    return found


def cache_bytes_per_token(s: ModelShapes, value_bytes: float) -> float:
    """Offline cache bytes per token: the hidden states read (`value_bytes` each), input id
    (int32), loss mask (uint8) and the target's argmax (int32), as `data/cache.py` writes."""
    return s.hidden_indices * s.hidden * value_bytes + 4 + 1 + 4
