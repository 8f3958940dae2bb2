"""The four muster services. Each has a pure ``core`` and thin wiring beside it."""
