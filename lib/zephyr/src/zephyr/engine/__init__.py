"""The engine inside a task: blocks of rows as Polars frames, and the kernels that work on them.

Ray schedules tasks across machines; inside a task, a loader and the column ops after it run
on frames (`frame`): JSON lines parsed exactly into typed Polars columns beside each row's line
(`scan`), expressions translated to Polars wherever it provably gives Python's result
(`translate`), rows written as the lines they were read or encoded natively (`lines`), Parquet
row groups written from typed columns (`parquet`). The stage's ops are applied to frames by
`zephyr.execution.engine_ops`; a shuffle takes a frame's key column and lines as they are
(`zephyr.shuffle.frame_keys`). Where a user's Python function starts, the frame becomes records.
"""
