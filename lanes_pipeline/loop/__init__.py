"""The loop's orchestration: the jobs a day runs (`jobs.py`), the schedule (`schedules.py`), the probes that
open each run (`lane_probes.py`) and the dependencies declared across days (`lineage.py`)."""
