"""Partition-friendly applications: every batch's work stays on the partition owning its keys."""
