"""`zephyr ray status` and `zephyr ray stop`: the local Rays that `zephyr --backend=ray` runs leave
for reuse (`zephyr.backends.ray_head`), one per interpreter under `$ZEPHYR_RAY_DIR`.

    zephyr ray status    print each running one: address, age, runs connected, when it stops
    zephyr ray stop      stop them all (their every process, their temp dirs)

Neither touches a Ray started with `ray start` (`ray stop` stops that one).
"""

from __future__ import annotations

import argparse

from zephyr.backends.ray_head import HeadState, age_text, base_dir, head_dirs, leases, running_head, stop_head

__all__ = ["ray_main"]


def ray_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="zephyr ray", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("status", "stop"))
    args = parser.parse_args(argv)
    return _status() if args.action == "status" else _stop()


def _status() -> int:
    found = 0
    for directory in head_dirs():
        state = running_head(directory)
        if state is None:
            continue
        found += 1
        live, _ = leases(directory)
        print(f"local Ray at {state.gcs_address}: up {age_text(state.started_at)}, {len(live)} run(s) "
              f"connected, stops after {state.idle_s / 60:g} min unused; {_whose(state)}")
    if not found:
        print(f"no local Ray of zephyr's runs is running ({base_dir()})")
    return 0


def _stop() -> int:
    stopped = 0
    for directory in head_dirs():
        users = len(leases(directory)[0])
        state = stop_head(directory)
        if state is not None:
            stopped += 1
            note = f"; {users} run(s) using it lost their Ray" if users else ""
            print(f"stopped the local Ray at {state.gcs_address} ({_whose(state)}){note}")
    if not stopped:
        print(f"no local Ray of zephyr's runs was running ({base_dir()})")
    return 0


def _whose(state: HeadState) -> str:
    return f"python {state.python}, Ray {state.ray_version}, supervisor pid {state.supervisor_pid}, logs {state.session_dir}/logs"
