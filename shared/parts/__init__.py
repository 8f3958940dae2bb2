"""The real parts muster is tested against: pinned versions, the cache, and starting each one."""
