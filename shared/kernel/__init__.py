"""The contract and pure helpers: events, model, quantities, policy, routes, the result fold.

Imports nothing of muster outside ``shared.kernel`` (the layers contract in pyproject.toml).
"""
