"""What every day's asset shares: the daily partitions and the replay window's mapping (`partitions.py`),
the retry policy (`policies.py`) and the store and settings resources (`resources.py`)."""
