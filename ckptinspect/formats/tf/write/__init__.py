"""Writing TF bundles: without TensorFlow (``bundle``, ``tensors``, ``plan``, ``shards``,
``combine``) and through TensorFlow (``through_tf``)."""
