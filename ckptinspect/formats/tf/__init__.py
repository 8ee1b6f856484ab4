"""The TensorFlow family: bundles (index, variables, data files, object graph), checkpoint
directories, V1 tables, object-graph editing, and the writers (``write``)."""
