"""Cluster tooling: the cluster table and generated configs, cluster commands, token auth.

- `config`: the table of clusters and `infra/marin-<name>.yaml` generation;
- `commands`: every external command line (`ray up/down`, `gcloud`, `ssh`), built in one place;
- `local`: the `local` cluster, a token-auth Ray head on this machine;
- `target`, `jobs`: reaching a cluster's job API with its token; job operations;
- `image`, `registry`, `housekeeping`: the cluster image, the registry cleanup policy, the token
  secret, the ssh key and preempted TPU VMs (their subcommands are registered by `maintenance`);
- `cli`: `marin cluster ...` (also `scripts/ray/cluster.py`; the Makefile's targets call it).
"""
