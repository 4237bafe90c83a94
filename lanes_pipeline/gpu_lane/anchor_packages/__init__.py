"""The anchor set's vendored sdists (byte-identical to PyPI's) and their manifest, anchors.json: data, read by
gpu_lane/anchor_set.py; a package only so that setuptools installs them (pyproject's package-data)."""
