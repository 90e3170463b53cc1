"""Near-duplicate removal: MinHash signatures (`minhash`), LSH buckets and connected components
as zephyr shuffles (`components`), and the pipeline that chains them (`fuzzy`)."""
