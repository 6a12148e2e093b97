"""One pod boot of a vLLM engine, as one pipeline (the vLLM plugin's)."""
