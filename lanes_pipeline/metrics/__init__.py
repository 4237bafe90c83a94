"""What the lanes' servers count: `prometheus.py` parses `/metrics` of llama-server and vLLM into one set
of names; `bandwidth.py` shares the memory bus between the lanes from those readings. Neither lane is
imported here, so both can use it."""
