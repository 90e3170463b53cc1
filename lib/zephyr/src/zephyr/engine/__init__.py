"""The engine inside a task: column-expression ops on Polars frames.

Ray schedules tasks across machines; inside a task, a loader and the column ops after it run
here (`steps`): JSON lines parsed exactly into frames of typed Polars columns (`scan`, `frame`),
expressions computed by Polars wherever it provably gives Python's result (`translate`), rows
written as the lines they were read from or encoded natively (`lines`), shuffle keys made from
columns (`keys`). Where a user's Python function starts, the frame becomes records.
"""
