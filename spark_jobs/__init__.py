"""Spark jobs that score through the node-local hetserve daemon, and their executor-side code."""
