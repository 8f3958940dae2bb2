"""Project-wide code every service shares: the event contract, quantities, policy, runtimes."""
