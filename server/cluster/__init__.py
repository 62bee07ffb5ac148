"""Cluster mode: several hosts applying one replicated input log (NATS JetStream) in the same order."""
