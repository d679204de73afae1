"""Run llama.cpp's OpenAI-compatible server on loopback until SIGTERM or SIGINT.

A standalone script, run by the engine environment's own Python (see `llama_cpp.py`), which has
`xllamacpp` (llama.cpp's native C++ server in a prebuilt PyPI wheel) and nothing of draftsmith.
It prints `listening <url>` once the model is loaded.
"""

import argparse
import signal

import xllamacpp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the target's .gguf file")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parallel", type=int, default=16, help="server slots (requests at once)")
    parser.add_argument("--ctx-per-slot", type=int, default=2048, help="tokens of context a slot holds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alias", default=None, help="the model name the server answers to")
    args = parser.parse_args()
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_per_slot * args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.warmup = False
    if args.alias:
        params.model_alias = {args.alias}
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # the server's threads inherit the mask
    server = xllamacpp.Server(params)
    print(f"listening {server.listening_address}", flush=True)
    signal.sigwait(signals)


if __name__ == "__main__":
    main()
