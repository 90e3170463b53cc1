"""Job submission: `python -m marin.run.ray_run [options] -- <command>`."""
