"""`draftsmith bench`: every drafter kind trained under the same CPU budget on one shared data
preparation, evaluated side by side with the baselines, written up in BENCHMARKS.md."""
