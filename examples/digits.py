"""The digits data set that scikit-learn ships (1,797 images of 8x8
pixels), read from scikit-learn's own copy without importing it.

Importing scikit-learn costs about two seconds of CPU, which every
attempt of every task of an array would pay again; this reads the same
file `sklearn.datasets.load_digits()` reads, the same way, and returns the
same arrays (`data`, `target`).
"""

import gzip
import importlib.util
import os

import numpy as np


def load():
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the examples use the digits data set that scikit-learn ships: pip install scikit-learn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    with gzip.open(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",")
    return rows[:, :-1], rows[:, -1].astype(int)
