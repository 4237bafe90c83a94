"""Assets, one file per stage. `definitions.py` collects them with `load_assets_from_modules`."""
