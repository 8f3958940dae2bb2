"""muster beside the real peer schedulers: the same scenario files on the same dev cluster, compared (issue 32)."""
