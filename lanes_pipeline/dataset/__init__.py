"""The contract between the lanes: what the CPU lane's verified work becomes and what the GPU lane trains
and is judged on. `contract.py` declares a row (task kinds, features, the one content hash); `writer.py`
shapes accepted results into a day's dataset; `window.py` reads the replay window; `holdout_rules.py` and
`held_out_tasks.py` decide which symbols never train and turn them into the evaluation's repository tasks."""
