import os
import sys

# Tests import their helpers by name, also from spawned scenario processes.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
