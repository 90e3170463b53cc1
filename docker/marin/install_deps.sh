#!/bin/sh
# How the cluster image installs Python packages: the one definition, run by Dockerfile.cluster
# and, for real, by lib/marin/tests/test_cluster_image.py.
#
#   install_deps.sh deps      the locked third-party dependencies only (a layer that changes with uv.lock)
#   install_deps.sh project   then the workspace packages themselves (zephyr, marin), not editable
#
# Run it in a directory holding pyproject.toml, uv.lock and lib/*/pyproject.toml (and lib/*/src for
# `project`). It installs into $UV_PROJECT_ENVIRONMENT. `--frozen` installs exactly what uv.lock
# pins and never re-resolves; `--extra tpu` adds marin's JAX stack; dev tools stay out.
set -eu
common="--frozen --no-dev --all-packages --extra tpu"
case "${1:-}" in
    deps) exec uv sync $common --no-install-workspace ;;
    project) exec uv sync $common --no-editable ;;
    *) echo "usage: $0 deps|project" >&2; exit 2 ;;
esac
