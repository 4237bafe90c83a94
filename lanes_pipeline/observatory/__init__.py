"""The lane observatory: the measurements users make by hand (TTFT, prompt and generation tokens/s, p95,
prefix-cache hits, KV use, tokens/s per billion active parameters, interference between the lanes), made by
the pipeline: a daily asset, `lanes bench lanes`, and named trials of server configurations compared side
by side."""
