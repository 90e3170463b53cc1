"""The shuffle: everything from scatter to merge, for group_by, deduplicate, reshard, sort and joins.

- `scatter`: the map side: records partitioned by key hash, sorted, written as runs.
- `columnar`: records <-> Arrow columns for the runs, exactly or not at all.
- `runs`, `run_index`: the run files and the index that plans reduce inputs (skew splitting).
- `keys`: key bytes and hashing, equal by type and value.
- `slices`: the reduce side's merge of sorted columnar runs, a hash-range slice at a time.
- `merge`: sort order, chunks and the group modes over them; the batch-per-round merge (fallback).
- `reduce`: the reduce side's reader and group modes (groups, first per key, concatenate).
- `join`: the streaming sorted-merge join of two sides' shards.

Imports only the core modules and `io`; the planner and the runner build on it.
"""
