"""Run llama.cpp's OpenAI-compatible server on loopback until SIGTERM or SIGINT.

A standalone script, run by the engine environment's own Python (see `server.py`), which has
`xllamacpp` (llama.cpp's native C++ server in a prebuilt PyPI wheel) and nothing of draftsmith.
It prints `listening <url>` once the model is loaded, and exits on SIGTERM/SIGINT or when the
process that started it is gone. With `--draft-model` the server decodes
speculatively with that draft (`--spec-type`, e.g. `draft-eagle3`, as llama-server's flag of that
name) and `--draft-max` tokens per step; `--n-gpu-layers` puts layers of both on a GPU (`-ngl`).
"""

import argparse
import os
import signal

import xllamacpp


def set_draft(params: "xllamacpp.CommonParams", args: argparse.Namespace) -> None:
    """Speculative decoding with the draft in `args.draft_model` (method from `--spec-type`)."""
    name = "COMMON_SPECULATIVE_TYPE_" + args.spec_type.upper().replace("-", "_")
    if not hasattr(xllamacpp.common_speculative_type, name):
        known = [t.removeprefix("COMMON_SPECULATIVE_TYPE_").lower().replace("_", "-")
                 for t in xllamacpp.common_speculative_type.__members__]
        raise SystemExit(f"unknown --spec-type {args.spec_type!r}; this build knows {known}")
    spec = params.speculative
    spec.types = [getattr(xllamacpp.common_speculative_type, name)]
    spec.draft.mparams.path = args.draft_model
    spec.draft.n_max, spec.draft.n_min, spec.draft.p_min = args.draft_max, args.draft_min, \
        args.draft_p_min
    spec.draft.cpuparams.n_threads = args.threads
    spec.draft.cpuparams_batch.n_threads = args.threads
    spec.draft.n_gpu_layers = args.n_gpu_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the target's .gguf file")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parallel", type=int, default=16, help="server slots (requests at once)")
    parser.add_argument("--ctx-per-slot", type=int, default=2048, help="tokens of context a slot holds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-gpu-layers", type=int, default=0,
                        help="layers of the model (and of the draft) on the GPU, as llama-server's "
                        "-ngl: 0 on a CPU, 999 for all (a CUDA build of xllamacpp)")
    parser.add_argument("--alias", default=None, help="the model name the server answers to")
    parser.add_argument("--draft-model", help="a draft .gguf: decode speculatively with it")
    parser.add_argument("--spec-type", default="draft-eagle3",
                        help="speculative method, as llama-server's --spec-type (draft-eagle3 ...)")
    parser.add_argument("--draft-max", type=int, default=3, help="draft tokens per step at most")
    parser.add_argument("--draft-min", type=int, default=0, help="draft tokens per step at least")
    parser.add_argument("--draft-p-min", type=float, default=0.0,
                        help="stop drafting below this draft probability (0: always draft-max)")
    parser.add_argument("--metrics", action="store_true", help="serve Prometheus /metrics")
    args = parser.parse_args()
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_per_slot * args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_gpu_layers = args.n_gpu_layers
    params.warmup = False
    if args.alias:
        params.model_alias = {args.alias}
    params.endpoint_metrics = args.metrics
    if args.draft_model:
        set_draft(params, args)
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # the server's threads inherit the mask
    parent = os.getppid()
    server = xllamacpp.Server(params)
    print(f"listening {server.listening_address}", flush=True)
    # until told to stop, or until the process that started it is gone (killed without cleanup)
    while signal.sigtimedwait(signals, 1.0) is None and os.getppid() == parent:
        pass


if __name__ == "__main__":
    main()
