import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

import os  # noqa: E402

# Tests never write the CLI's persistent compilation cache into the user's home.
os.environ.setdefault("POLARIZE_NO_CACHE", "1")
# pytest-xdist already keeps every core busy with one worker each: flows and sweeps run
# their chunks in one thread here (tests/solve/test_fastpaths.py checks the threaded path
# against this one bit for bit).
os.environ.setdefault("POLARIZE_THREADS", "1")
