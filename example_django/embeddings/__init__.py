"""The example's one app: the embedding endpoints."""
