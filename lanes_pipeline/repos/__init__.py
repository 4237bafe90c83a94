"""Reading the user's repositories: what a day's snapshot holds (`snapshot.py`: the chosen files at the
day's commit, their outlines, the repository map) and their symbols (`symbols.py`: functions, classes and
methods with their context; `scan.py`: every symbol of a commit, and the ones the pipeline cannot handle).
The CPU lane asks about them, the dataset holds symbols out of training, the GPU lane is judged on them."""
