"""The plan: what a pipeline means, before anything runs.

- `dataset`: the lazy `Dataset` builder users chain (public at `zephyr.dataset` too).
- `ops`, `shuffle_ops`: the op records a chain is made of (data, not behaviour).
- `sources`: where a pipeline's input shards come from (files, lists, Parquet row-group slices).
- `compile`: the planner: fuses ops into stages, cut at each shuffle; `Plan`, `Stage`.
- `rounds`: the rounds of a `GroupByRounds`, which the runner adds as stages while a run goes.
- `pushdown`: the one optimizer rule: projections and filters folded into the loaders.
- `overlap`: a pipeline's outputs must not be among its own inputs (checked when planning).
- `fingerprint`: the identity of a stage's code and inputs, which resume and provenance key on;
  `code_reach` adds the code a stage can reach beyond the names it spells (user modules' source),
  `code_origin` tells library code from the user's and what identifies it (versions, RECORD).

Imports only the layers below (core modules, `io`, `expr`, `shuffle`, `dedup`); nothing here
starts a task.
"""
