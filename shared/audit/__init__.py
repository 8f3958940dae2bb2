"""The audit commands: the event log taken out, its decisions re-derived, another policy tried on
it, any wait explained, a report drawn — all from the log, through the pure cores and the fold
(``shared.kernel.projection``), never a second copy of a rule.

    errors.py    what can be wrong with a log, and the exit code for each
    header.py    the header line of an exported log: muster and schema version, the policy
    logfile.py   the exported file's layout, and every place a log comes from (file, store, Kafka)
    kafka.py     reading a log off Kafka: the log topic, in an order that keeps every inbox's own
    export.py    ``muster log export`` / ``import``
    replay.py    re-deriving decisions from a log (``muster replay --verify``), and the replay hook
    chain.py     the causes of an envelope, back to the watch event (for a divergence)
    derive.py    a scenario from a log: nodes over time, objects as applied, observed run times
    whatif.py    ``muster replay --what-if``: the derived scenario under two policies, compared
    metrics.py   waits, preemptions, GPU-hours, finished jobs: folded from a log
    explain.py   ``muster explain``: why a workload waits (or was preempted), with numbers
    report.py    ``muster report``: one self-contained HTML page of charts
"""
