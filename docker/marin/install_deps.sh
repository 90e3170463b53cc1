#!/bin/sh
# How the cluster image installs Python packages: the one definition, run by Dockerfile.cluster
# and, for real, by lib/marin/tests/test_cluster_image.py.
#
#   install_deps.sh deps [UV OPTIONS]      the locked third-party dependencies only (a layer that changes with uv.lock)
#   install_deps.sh project [UV OPTIONS]   then the workspace packages themselves (zephyr, marin), not editable
#   install_deps.sh list [UV OPTIONS]      print what `deps` installs, as pinned requirements (`uv export`), installing nothing
#
# Run it in a directory holding pyproject.toml, uv.lock and lib/*/pyproject.toml (and lib/*/src for
# `project`). It installs into $UV_PROJECT_ENVIRONMENT. `--frozen` installs exactly what uv.lock
# pins and never re-resolves. `--extra tpu` adds marin's JAX stack, `--extra tpu-runtime` the TPU
# runtime (libtpu, through jax[tpu]), which only the image installs; dev tools stay out. Extra uv
# options go last (the install test passes `--no-install-package libtpu` to skip its 200 MB wheel).
set -eu
selection="--frozen --no-dev --all-packages --extra tpu --extra tpu-runtime"
step="${1:-}"
[ $# -gt 0 ] && shift
case "$step" in
    deps) exec uv sync $selection --no-install-workspace "$@" ;;
    project) exec uv sync $selection --no-editable "$@" ;;
    list) exec uv export $selection --no-emit-workspace --no-hashes --no-header --no-annotate "$@" ;;
    *) echo "usage: $0 deps|project|list [uv options]" >&2; exit 2 ;;
esac
