"""Running the loop on a machine: the Dagster instance and its storage (`instance.py`,
`instance_storage.py`, `postgres.py`), and the daemon, UI and lanes as services (`service_units.py`,
`supervisor.py`)."""
