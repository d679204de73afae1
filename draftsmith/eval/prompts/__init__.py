"""The prompts `eval`, `bench` and `serve-check` decode, in one place (they are evaluation's, not
training data: `draftsmith.data` prepares what drafters train on).

    sets.py            the built-in sets (MT-bench, HumanEval, GSM8K from offline data wheels;
                       `sharegpt_long`), `BenchPrompt`, and which sets a run decodes
    sharegpt_long.py   the rule that picks long held-out ShareGPT documents for `sharegpt_long`
    files.py           the user's own prompt files (`--prompts FILE`) and `gather_prompts`, which
                       joins both into one list
"""
