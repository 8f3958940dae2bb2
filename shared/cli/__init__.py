"""The ``muster`` command line (``main.app``; the entry point is ``shared.cli.main:main``)."""
