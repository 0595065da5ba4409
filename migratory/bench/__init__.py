"""``migratory bench``: the load generator for capacity planning (docs/benchmarks.md).

Raw sockets in a few forked processes, stamps counted rather than messages
decoded, 0.1 ms latency histograms; one module per piece (``wsraw``,
``mqttraw``, ``sse``, ``publisher``, ``subscriber``, ``latency``, ...) and per
pattern (``fanout`` for fan-out / many subjects / publish-with-ack, ``idle``).
"""
