"""The configuration's models (`models.py`, one per file in configs/; `endpoints.py`, the CPU lane's servers;
`base.py`, the frozen base of every row and result). `lanes_pipeline.settings` loads the files into them."""
